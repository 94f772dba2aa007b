#!/usr/bin/env bash
# The Python package as users get it: a manylinux wheel that installs and runs without Rust.
#
#   1. builds python/ into a manylinux_2_28 wheel with maturin (`--zig`: zig links against
#      glibc 2.28's symbols, since this host's glibc is newer; no container needed);
#   2. checks the wheel's platform tag is manylinux_2_N_<arch>, and `auditwheel show` that its
#      symbols need no newer glibc than the tag says; that it holds the extension and the
#      license texts;
#   3. makes a fresh venv and installs the wheel into it (pip --no-index --no-deps, from the
#      file only) under a PATH of symlinks to that venv's python3 and pip alone, after
#      asserting cargo, rustc, cc, gcc, c++ and clang are not found on it;
#   4. runs there a 2-process all_reduce with oxccl's own API on array.array buffers
#      (scripts/ci/wheel_smoke.py core: nothing but the wheel installed);
#   5. installs the same wheel, the same way, into the venv of scripts/ci/python_tests.sh (which
#      has torch; installed here as there when missing) and runs a 2-process all_reduce through
#      the `oxccl` torch.distributed backend (wheel_smoke.py torch).
#
# Usage: scripts/ci/wheel_check.sh        (run from anywhere; installs what is missing)
#
# Needs: Rust (cargo), python3 with venv (python3-venv, installed by apt where possible) and
# PyPI (maturin, ziglang, auditwheel, torch; nothing else is downloaded). Reads
# CARGO_TARGET_DIR (default target/): the build goes to its x86_64-unknown-linux-gnu/ (or
# your architecture's) folder, the wheel to ${WHEEL_DIR:-$CARGO_TARGET_DIR/wheelhouse}
# (its earlier oxccl wheels are removed first), the fresh venv to $CARGO_TARGET_DIR/wheel-venv.
# PY_VENV: the torch venv (default $CARGO_TARGET_DIR/py-venv, as python_tests.sh).
# CARGO_PROFILE_RELEASE_LTO and _CODEGEN_UNITS default to false and 16 as .ci/run sets them (CI
# checks behaviour); for the wheel you publish, set CARGO_PROFILE_RELEASE_LTO=thin (what
# python/Cargo.toml asks for) and WHEEL_CHECK_TORCH as you like.
# WHEEL_CHECK_TORCH=0 skips step 5.
#
# The wheel it leaves serves scripts/ci/python_tests.sh too (PY_WHEEL=<the wheel>), so CI
# builds the extension once.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
mkdir -p "$TARGET"
TARGET=$(cd "$TARGET" && pwd)
VENV=${PY_VENV:-$TARGET/py-venv}
OUT=${WHEEL_DIR:-$TARGET/wheelhouse}
FRESH=$TARGET/wheel-venv
export CARGO_PROFILE_RELEASE_LTO=${CARGO_PROFILE_RELEASE_LTO:-false}
export CARGO_PROFILE_RELEASE_CODEGEN_UNITS=${CARGO_PROFILE_RELEASE_CODEGEN_UNITS:-16}
export OXCCL_FR_DIR=${OXCCL_FR_DIR:-$TARGET/flight-records}
arch=$(uname -m)
step() { echo "-- wheel_check: $* [${SECONDS}s]"; }
fail() { echo "wheel_check: FAILED: $*" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The build tools' venv, python_tests.sh's too (py_venv.sh makes it and fills what is missing).
step "maturin, ziglang and auditwheel in $VENV"
PY_VENV="$VENV" "$ROOT/scripts/ci/py_venv.sh" >/dev/null \
  || fail "could not make $VENV with maturin, ziglang and auditwheel (above): is PyPI reachable?"

step "1. maturin build --release --zig --compatibility manylinux_2_28"
mkdir -p "$OUT"
rm -f "$OUT"/oxccl-*.whl
# maturin finds zig through the venv's python (python -m ziglang): the venv first on PATH.
PATH="$VENV/bin:$PATH" "$VENV/bin/maturin" build --release --zig --compatibility manylinux_2_28 \
  -m "$ROOT/python/Cargo.toml" -o "$OUT" \
  || fail "maturin could not build the wheel (its error is above); to see it alone: PATH=$VENV/bin:\$PATH maturin build --release --zig --compatibility manylinux_2_28 -m python/Cargo.toml"
wheels=("$OUT"/oxccl-*.whl)
[ "${#wheels[@]}" = 1 ] && [ -f "${wheels[0]}" ] || fail "expected one oxccl wheel in $OUT, found: ${wheels[*]}"
wheel=${wheels[0]}
name=$(basename "$wheel")

step "2. the platform tag of $name"
# name-version-python-abi-platform.whl (PEP 427); the platform must be manylinux_2_N_<arch>.
plat=${name%.whl}
plat=${plat##*-}
[[ "$plat" =~ ^manylinux_2_([0-9]+)_${arch}$ ]] \
  || fail "$name: platform tag $plat is not manylinux_2_N_$arch: PyPI does not take it, nor pip on other Linux hosts. Build with --compatibility manylinux_2_28 (and --zig on a glibc newer than 2.28)"
tag_glibc=${BASH_REMATCH[1]}
files=$("$VENV/bin/python" -m zipfile -l "$wheel")
for f in 'oxccl/_oxccl\.abi3\.so' 'dist-info/licenses/LICENSE-MIT' 'dist-info/licenses/LICENSE-APACHE'; do
  grep -q "$f" <<<"$files" \
    || fail "$name holds no $f (the extension: module-name in python/pyproject.toml; the licenses: copies in python/)"
done
show=$("$VENV/bin/auditwheel" show "$wheel" 2>&1) || fail "auditwheel show $name failed: $show"
# "... is consistent with the following platform tag: "manylinux_2_N_<arch>"." (wrapped lines)
need=$(tr '\n' ' ' <<<"$show" | grep -o 'platform tag: *"[a-z0-9_]*"' | head -1 | grep -o 'manylinux_2_[0-9]*_'"$arch" || true)
[[ "$need" =~ ^manylinux_2_([0-9]+)_ ]] && [ "${BASH_REMATCH[1]}" -le "$tag_glibc" ] \
  || fail "auditwheel says $name needs ${need:-an unknown platform}, above its tag $plat:
$show"
echo "$name: tag $plat; auditwheel: consistent with $need"

# A PATH that holds a venv's python3 and pip and nothing else; an environment without the
# caller's variables (no CARGO_*, RUSTUP_*, CC, PYTHONPATH); HOME a temporary folder.
no_rust() { # no_rust VENV COMMAND...
  local v=$1 bin="$tmp/bin-$(basename "$1")"
  shift
  mkdir -p "$bin" "$tmp/home"
  ln -sf "$v/bin/python" "$bin/python3"
  ln -sf "$v/bin/pip" "$bin/pip"
  env -i PATH="$bin" HOME="$tmp/home" LANG=C.UTF-8 TMPDIR="${TMPDIR:-/tmp}" OXCCL_FR_DIR="$OXCCL_FR_DIR" "$@"
}
assert_no_rust() { # assert_no_rust VENV
  no_rust "$1" /bin/bash -c 'for t in cargo rustc rustup cc gcc c++ clang; do
      if p=$(command -v "$t"); then echo "$t is on the PATH ($p)"; exit 1; fi; done
      command -v python3 >/dev/null && command -v pip >/dev/null' \
    || fail "the PATH for the install is not free of Rust and C compilers (above), or lacks python3/pip"
}
install_wheel() { # install_wheel VENV: from the file only, no index, no build
  assert_no_rust "$1"
  no_rust "$1" "$1/bin/python" -m pip install -q --no-index --no-deps --only-binary :all: \
    --force-reinstall --disable-pip-version-check "$wheel" \
    || fail "pip could not install $name into $1 without Rust (its error is above)"
}
cp "$ROOT/scripts/ci/wheel_smoke.py" "$tmp/"
cd "$tmp"  # outside the checkout: `import oxccl` must find the installed package

step "3. a fresh venv ($FRESH), the wheel installed under a PATH without cargo, rustc or a C compiler"
rm -rf "$FRESH"
no_rust "$VENV" "$("$VENV/bin/python" -c 'import sys; print(sys._base_executable)')" -m venv "$FRESH" \
  || fail "could not make the venv $FRESH"
install_wheel "$FRESH"
extra=$(no_rust "$FRESH" "$FRESH/bin/python" -m pip list --format=freeze --disable-pip-version-check \
  | grep -v -i -E '^(oxccl|pip|setuptools)==' || true)
[ -z "$extra" ] || fail "the fresh venv holds more than the wheel: $extra"

step "4. 2 processes, all_reduce with oxccl's API, from the fresh venv"
no_rust "$FRESH" "$FRESH/bin/python" -I wheel_smoke.py core \
  || fail "the installed wheel's all_reduce failed (the ranks' output is above); rerun: scripts/ci/wheel_check.sh"

if [ "${WHEEL_CHECK_TORCH:-1}" = 0 ]; then
  echo "wheel_check: step 5 (the torch backend) skipped: WHEEL_CHECK_TORCH=0"
else
  step "5. the torch.distributed backend: the wheel in $VENV (torch's venv), 2 processes"
  if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    # As python_tests.sh: PyPI's Linux wheel (the CUDA build, a few GB; it runs without a GPU).
    "$VENV/bin/python" -m pip install -q torch \
      || fail "could not pip install torch into $VENV (a few GB from PyPI); WHEEL_CHECK_TORCH=0 skips this step"
  fi
  install_wheel "$VENV"
  no_rust "$VENV" "$VENV/bin/python" -I wheel_smoke.py torch \
    || fail "the installed wheel's torch backend failed (the ranks' output is above)"
fi
echo "wheel_check passed in ${SECONDS}s: $wheel"
