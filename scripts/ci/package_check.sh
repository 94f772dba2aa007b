#!/usr/bin/env bash
# The crates as crates.io would get them: `cargo package` of oxccl and oxccl-cli (the published
# crates; oxccl-conformance and the Python extension are publish = false), verified: each
# .crate is unpacked and built on its own, oxccl-cli against the packaged oxccl (cargo's
# local overlay for crates packaged together), so a file the build needs and the package
# lacks fails here. Then, for each crate:
#   - LICENSE-MIT, LICENSE-APACHE and README.md are in `cargo package --list` and in the
#     .crate file itself;
#   - the manifest has what crates.io shows: description, license, repository, readme,
#     1 to 5 keywords, categories;
# and the copies of the license texts (crates/oxccl/, crates/oxccl-cli/, python/: a package
# holds only files below its folder, and symlinks do not survive every checkout) equal the
# repository's LICENSE-MIT and LICENSE-APACHE.
#
# Usage: scripts/ci/package_check.sh          (run from anywhere)
#
# Needs: cargo and crates.io's index (the packaged crates resolve their dependencies anew;
# nothing is published). Reads CARGO_TARGET_DIR (default target/): the .crate files go to its
# package/ folder, the verifying builds (the dev profile: nothing else in CI builds it, so they
# start cold; oxccl is built twice, on its own and as oxccl-cli's dependency) to its debug/.
# PACKAGE_VERIFY=0 packs and lists without building (--no-verify): seconds instead of minutes.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
CRATES=(oxccl oxccl-cli)
fail() { echo "package_check: FAILED: $*" >&2; exit 1; }
step() { echo "-- package_check: $* [${SECONDS}s]"; }

step "the license copies equal the repository's"
for dir in crates/oxccl crates/oxccl-cli python; do
  for f in LICENSE-MIT LICENSE-APACHE; do
    cmp -s "$f" "$dir/$f" || fail "$dir/$f is missing or differs from ./$f: cp $f $dir/$f"
  done
done

step "crates.io metadata in the manifests"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cargo metadata --no-deps --format-version 1 >"$tmp/metadata.json"
python3 - "$tmp/metadata.json" "${CRATES[@]}" <<'EOF' || fail "the manifests lack crates.io metadata (above): add it to crates/<crate>/Cargo.toml"
import json, sys
want = sys.argv[2:]
bad = []
for p in json.load(open(sys.argv[1]))["packages"]:
    name = p["name"]
    if name not in want:
        continue
    want.remove(name)
    if p["publish"] == []:
        bad.append(f"{name}: publish = false, yet this check packages it")
    bad += [f"{name}: no {key}" for key in ("description", "license", "repository", "readme") if not p.get(key)]
    if not 1 <= len(p["keywords"]) <= 5:
        bad.append(f"{name}: {len(p['keywords'])} keywords (crates.io takes 1 to 5)")
    if not p["categories"]:
        bad.append(f"{name}: no categories")
bad += [f"{name}: not a package of the workspace" for name in want]
sys.exit("\n".join(bad) or None)
EOF

step "cargo package ${CRATES[*]/#/-p } (packs, then builds each package from its .crate)"
pkg_args=()
for c in "${CRATES[@]}"; do pkg_args+=(-p "$c"); done
# --allow-dirty: CI may run on a tree with uncommitted changes; what is packaged is checked below.
# The tests and examples a package leaves out are expected (see `include` in the manifests).
if [ "${PACKAGE_VERIFY:-1}" = 0 ]; then pkg_args+=(--no-verify); fi
cargo package --locked --allow-dirty "${pkg_args[@]}" 2>&1 \
  | { grep -v -E '^warning: ignoring (test|example|bench) `.*` as `.*` is not included in the published package$' || true; } \
  || fail "cargo package failed (above): a file the build needs is outside the package (\`include\` in the crate's Cargo.toml), or the crate does not build on its own"

for c in "${CRATES[@]}"; do
  step "$c: the files of the package"
  list=$(cargo package --list --allow-dirty -p "$c") || fail "cargo package --list -p $c failed"
  version=$(cargo pkgid -p "$c" | sed 's/.*[@#]//')
  crate_file="$TARGET/package/$c-$version.crate"
  [ -f "$crate_file" ] || fail "$crate_file was not written by cargo package"
  in_crate=$(tar -tzf "$crate_file" | sed "s|^$c-$version/||")
  for f in LICENSE-MIT LICENSE-APACHE README.md Cargo.toml; do
    grep -qx "$f" <<<"$list" || fail "$c: $f is not in cargo package --list: add it to \`include\` in its Cargo.toml"
    grep -qx "$f" <<<"$in_crate" || fail "$c: $f is not in $crate_file"
  done
  echo "$c $version: $(wc -l <<<"$in_crate") files, $(du -h "$crate_file" | cut -f1), with LICENSE-MIT, LICENSE-APACHE, README.md"
done
echo "package_check passed in ${SECONDS}s"
