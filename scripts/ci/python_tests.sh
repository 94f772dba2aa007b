#!/usr/bin/env bash
# The Python package's tests: a venv (${PY_VENV:-target/py-venv}; scripts/ci/py_venv.sh --all
# makes it: maturin, numpy, pytest, torch, torchft), `pip install ./python` into it (builds the
# pyo3 extension), then pytest on python/tests (1-4 processes per test). Run from anywhere;
# installs what is missing. CI runs it.
#
# Usage: scripts/ci/python_tests.sh [PYTEST ARGS]
#        PY_WHEEL=$(echo target/wheelhouse/oxccl-*.whl) scripts/ci/python_tests.sh   (that wheel)
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
VENV=${PY_VENV:-${CARGO_TARGET_DIR:-$ROOT/target}/py-venv}
# The venv, with torch for the torch.distributed backend's tests and torchft for
# oxccl.torchft's (py_venv.sh --all; without them those tests are skipped, said below).
PY_VENV="$VENV" scripts/ci/py_venv.sh --all >/dev/null
# The extension builds in its own target directory (python/target, or $CARGO_TARGET_DIR); or,
# with PY_WHEEL=FILE, that wheel is installed instead (scripts/ci/wheel_check.sh builds and
# checks one; CI passes it, so the extension is built once).
if [ -n "${PY_WHEEL:-}" ]; then
  if [ ! -f "$PY_WHEEL" ]; then
    echo "PY_WHEEL=$PY_WHEEL is not a file: run scripts/ci/wheel_check.sh first, or leave PY_WHEEL unset to build ./python" >&2
    exit 1
  fi
  "$VENV/bin/python" -m pip install -q --force-reinstall --no-deps "$PY_WHEEL"
else
  "$VENV/bin/python" -m pip install -q "$ROOT/python"
fi
# From outside the checkout, so `import oxccl` is the installed package, not python/oxccl.
cd /tmp
# The error cases' flight-recorder dumps go beside the build, not into /tmp (unless the
# caller chose a place).
export OXCCL_FR_DIR=${OXCCL_FR_DIR:-${CARGO_TARGET_DIR:-$ROOT/target}/flight-records}
"$VENV/bin/python" -m pytest -q "$ROOT/python/tests" "$@"
