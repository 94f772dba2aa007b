#!/usr/bin/env bash
# PyTorch's own distributed test suite (DistributedTest._DistTestBase, shipped in the torch
# wheel) on gloo and on oxccl standing in for gloo, side by side from one run.
#
#   scripts/ci/torch_suite.sh [-w "2 3 4"] [-k PYTEST_EXPR] [-o OUT_DIR] [--spawn] [--file-init] [--ci]
#
# For each world size it runs scripts/ci/torch_suite/suite.py twice under pytest (BACKEND=gloo;
# the second time with OXCCL_STAND_IN=1, which makes every group torch would make on gloo on
# oxccl), writes OUT_DIR/ws{N}-{gloo,oxccl}.xml and .log, and prints, test by test, both
# outcomes, the totals, and each test that passes on gloo and not on oxccl
# (scripts/ci/torch_suite/compare.py). Exits non-zero when such a test is not one that only
# compares the backend's name.
#
# Ranks are forked from the pytest process (about 1.5 s a test on a 2-core machine); --spawn
# starts them as torch's test_distributed_spawn.py does (a fresh interpreter per rank, about
# 14 s a test). The whole suite is about 285 tests per world size and backend (2-core VM:
# gloo 90-170 s, oxccl about the same, per world size).
#
# --file-init: the tests that create groups anew meet through a fresh file (INIT_METHOD=file://,
# as torch's CI also runs the suite; the timeout tests need it), else env:// (the default).
#
# --ci: what .ci/run runs (about 2 minutes): world size 3, the tests that once failed on oxccl
# and a sample of the rest (collectives, groups, point-to-point, barriers, DDP).
#
# The venv is the Python tests' (scripts/ci/python_tests.sh makes it: torch, the oxccl package);
# PY_VENV overrides it. expecttest (torch's test utilities import it) is installed if missing.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
VENV=${PY_VENV:-${CARGO_TARGET_DIR:-$ROOT/target}/py-venv}
PY="$VENV/bin/python"
sizes="2 3 4"
expr=""
out="${CARGO_TARGET_DIR:-$ROOT/target}/torch-suite"
start=fork
file_init=0
while [ $# -gt 0 ]; do
  case "$1" in
    -w) sizes="$2"; shift 2 ;;
    -k) expr="$2"; shift 2 ;;
    -o) out="$2"; shift 2 ;;
    --spawn) start=spawn; shift ;;
    --file-init) file_init=1; shift ;;
    --ci)
      sizes="3"
      expr="coalesced or any_source or batch_isend_irecv or monitored_barrier or sparse or get_backend"
      expr="$expr or test_all_reduce_sum or test_broadcast or test_all_gather or test_reduce_scatter"
      expr="$expr or test_barrier or test_send_recv or test_irecv or test_isend or test_new_group"
      expr="$expr or test_ddp_comm_hook or test_all_to_all"
      shift ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) echo "torch_suite.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
ci=0
[ "$sizes" = 3 ] && [ -n "$expr" ] && [[ "$expr" == coalesced* ]] && ci=1
if ! "$PY" -c "import torch, oxccl.torch" 2>/dev/null; then
  echo "torch_suite.sh: $PY lacks torch or oxccl; run scripts/ci/python_tests.sh first (it makes the venv)" >&2
  # In CI, where python_tests.sh could not install torch (and said so), nothing to compare.
  [ "$ci" = 1 ] && { echo "SKIP: no torch"; exit 0; }
  exit 2
fi
"$PY" -c "import expecttest" 2>/dev/null || "$PY" -m pip install -q expecttest
mkdir -p "$out"
rm -f "$out"/ws*-*.xml "$out"/ws*-*.log
suite="$ROOT/scripts/ci/torch_suite/suite.py"
for ws in $sizes; do
  for backend in gloo oxccl; do
    stand_in=0
    [ "$backend" = oxccl ] && stand_in=1
    tmp=$(mktemp -d)
    echo "== world size $ws, $backend"
    t0=$(date +%s)
    shm_before=$(ls /dev/shm 2>/dev/null | grep '^oxccl' | sort || true)
    # pytest's own exit status is the comparison's business, not this loop's.
    init=env://
    [ "$file_init" = 1 ] && init="file://$tmp/init_file"
    (cd "$tmp" && INIT_METHOD=$init BACKEND=gloo WORLD_SIZE=$ws TEMP_DIR="$tmp" OXCCL_STAND_IN=$stand_in \
      TORCH_SUITE_START=$start "$PY" -m pytest -q -p no:cacheprovider "$suite" \
      ${expr:+-k "$expr"} --junitxml="$out/ws$ws-$backend.xml" >"$out/ws$ws-$backend.log" 2>&1) || true
    echo "   $(tail -1 "$out/ws$ws-$backend.log") ($(( $(date +%s) - t0 )) s)"
    # Shared-memory segments that this run's ranks left (torch's harness ends ranks with
    # os._exit and terminates the others when one fails, which can catch a rank inside a
    # group's set-up, between creating its segment and unlinking it): named, then removed.
    left=$(comm -13 <(echo "$shm_before") <(ls /dev/shm 2>/dev/null | grep '^oxccl' | sort) || true)
    if [ -n "$left" ]; then
      echo "   note: this run's ranks left in /dev/shm (removed now): $(echo $left)"
      for f in $left; do rm -f "/dev/shm/$f"; done
    fi
    rm -rf "$tmp"
  done
done
"$PY" "$ROOT/scripts/ci/torch_suite/compare.py" "$out"
