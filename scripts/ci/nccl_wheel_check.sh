#!/usr/bin/env bash
# The NCCL loader against a real libnccl.so.2, which needs no GPU: the library of the PyPI
# wheel nvidia-nccl-cu12 (downloaded once into ${NCCL_WHEEL_DIR:-target/nccl-wheel}, only the
# library is unpacked). Loads it, checks its version and optional functions, and makes a
# unique id (xccl::library::tests::real_libnccl_*). Skipped with a note when the wheel cannot
# be downloaded (no pip, no network); a failing test fails the script.
#
# Usage: scripts/ci/nccl_wheel_check.sh          (from anywhere) fetches, then runs the tests
#        scripts/ci/nccl_wheel_check.sh --path   fetches, then prints the library's path alone
#                                                (nothing when it cannot be fetched)
# CI takes the path and sets OXCCL_TEST_LIBNCCL for the workspace's tests, so that the tests
# run in `cargo test --workspace` instead of a build of their own.
set -euo pipefail
cd "$(dirname "$0")/../.."
path_only=""
case "${1:-}" in
  --path) path_only=1 ;;
  "") ;;
  *) echo "usage: $0 [--path]" >&2; exit 2 ;;
esac
note() { echo "$*" >&2; }
dir="${NCCL_WHEEL_DIR:-${CARGO_TARGET_DIR:-target}/nccl-wheel}"
mkdir -p "$dir"
# Absolute: cargo runs the test from the crate's own directory, where a relative path is wrong.
dir=$(cd "$dir" && pwd)
lib=$(find "$dir" -name libnccl.so.2 2>/dev/null | head -n 1)
if [ -z "$lib" ]; then
  if ! python3 -m pip download --no-deps --quiet nvidia-nccl-cu12 -d "$dir" >&2 2>"$dir/pip.log"; then
    note "note: could not download nvidia-nccl-cu12 ($(tail -n 1 "$dir/pip.log")); the real-library loader test is skipped"
    exit 0
  fi
  wheel=$(ls "$dir"/nvidia_nccl_cu12-*.whl | head -n 1)
  python3 - "$wheel" "$dir" <<'PY'
import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
z.extract(next(n for n in z.namelist() if n.endswith("libnccl.so.2")), sys.argv[2])
PY
  rm -f "$wheel"
  lib=$(find "$dir" -name libnccl.so.2 | head -n 1)
fi
if [ -n "$path_only" ]; then
  echo "$lib"
  exit 0
fi
echo "libnccl.so.2 of the wheel: $lib"
OXCCL_TEST_LIBNCCL="$lib" cargo test -p oxccl --lib real_libnccl -- --nocapture
