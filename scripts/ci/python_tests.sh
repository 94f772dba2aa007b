#!/usr/bin/env bash
# The Python package's tests: a venv (${PY_VENV:-target/py-venv}) with maturin, numpy,
# pytest and torch, `pip install ./python` into it (builds the pyo3 extension), then pytest on
# python/tests (1-4 processes per test). Run from anywhere; installs what is missing. CI runs it.
#
# Usage: scripts/ci/python_tests.sh [PYTEST ARGS]
#        PY_WHEEL=$(echo target/wheelhouse/oxccl-*.whl) scripts/ci/python_tests.sh   (that wheel)
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
VENV=${PY_VENV:-${CARGO_TARGET_DIR:-$ROOT/target}/py-venv}
if [ ! -x "$VENV/bin/python" ]; then
  if ! python3 -m venv "$VENV" 2>/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      apt-get update -qq >/dev/null 2>&1 || true
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null 2>&1 || true
    fi
    rm -rf "$VENV"
    python3 -m venv "$VENV"
  fi
fi
"$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
"$VENV/bin/python" -m pip install -q maturin numpy pytest
# torch for the torch.distributed backend's tests (PyPI's Linux wheel: the CUDA build, a few
# GB, about a minute; it runs without a GPU). Without it those tests are skipped, said below.
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  "$VENV/bin/python" -m pip install -q torch || echo "note: could not install torch; the torch backend tests will be skipped"
fi
# torchft (PyPI), for oxccl.torchft's tests: its process group contract and its DDP example
# with a replica killed and restarted. Without it those tests are skipped, said below.
if "$VENV/bin/python" -c "import torch" 2>/dev/null && ! "$VENV/bin/python" -c "import torchft" 2>/dev/null; then
  "$VENV/bin/python" -m pip install -q "torchft>=0.2,<0.3" || echo "note: could not install torchft; the torchft tests will be skipped"
fi
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
