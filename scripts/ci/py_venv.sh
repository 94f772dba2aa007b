#!/usr/bin/env bash
# The Python venv of CI's Python steps (${PY_VENV:-$CARGO_TARGET_DIR/py-venv}, default
# target/py-venv): made where missing (python3-venv from apt where the first try fails, as
# root), then filled with what is missing of:
#   the build tools   maturin, ziglang, auditwheel (scripts/ci/wheel_check.sh)
#   the test tools    numpy, pytest (scripts/ci/python_tests.sh)
#   with --all        torch (PyPI's Linux wheel: the CUDA build, a few GB; it runs without a
#                     GPU), torchft (0.2.x) and expecttest (scripts/ci/torch_suite.sh)
# A package that cannot be installed is said on stderr; the steps that need it say what they
# skip. Idempotent: what imports already is not installed again.
#
# Usage: scripts/ci/py_venv.sh [--all]     (from anywhere; prints the venv's path last)
# .ci/run starts `--all` in the background at the start, so that the downloads overlap the
# Rust builds, and waits for it before the Python steps.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
all=0
case "${1:-}" in
  --all) all=1 ;;
  "") ;;
  *) echo "usage: $0 [--all]" >&2; exit 2 ;;
esac
VENV=${PY_VENV:-${CARGO_TARGET_DIR:-$ROOT/target}/py-venv}
mkdir -p "$(dirname "$VENV")"
if [ ! -x "$VENV/bin/python" ]; then
  if ! python3 -m venv "$VENV" 2>/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      apt-get update -qq >/dev/null 2>&1 || true
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null 2>&1 || true
    fi
    rm -rf "$VENV"
    python3 -m venv "$VENV" || { echo "py_venv: python3 -m venv does not work: install python3-venv" >&2; exit 1; }
  fi
  "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
fi
PY="$VENV/bin/python"
# need MODULE PIP-SPEC: installs PIP-SPEC unless MODULE imports.
need() {
  "$PY" -c "import $1" 2>/dev/null && return 0
  "$PY" -m pip install -q --disable-pip-version-check "$2" >&2 || { echo "py_venv: could not install $2" >&2; return 1; }
}
failed=0
need maturin maturin || failed=1
need ziglang ziglang || failed=1
command -v "$VENV/bin/auditwheel" >/dev/null 2>&1 || need auditwheel auditwheel || failed=1
need numpy numpy || failed=1
need pytest pytest || failed=1
if [ "$all" = 1 ]; then
  if need torch torch; then
    need torchft "torchft>=0.2,<0.3" || true
    need expecttest expecttest || true
  fi
fi
echo "$VENV"
exit "$failed"
