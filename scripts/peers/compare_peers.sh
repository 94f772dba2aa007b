#!/usr/bin/env bash
# oxccl and its peers side by side, from one run on this host, interleaved size by size:
#   oxccl    `oxccl bench` (cpu backend), built here if missing
#   ompi-c   Open MPI through its C API (scripts/peers/ompi_bench.c)
#   ompi-py  Open MPI through mpi4py (scripts/peers/mpi4py_bench.py)
#   gloo     torch.distributed with gloo (scripts/peers/gloo_bench.py)
# and one table per (op, ranks): size, place, the µs per op of each peer, oxccl/ompi-c.
#
#   scripts/peers/compare_peers.sh [--ops all_reduce,all_gather,reduce_scatter,broadcast,all_to_all]
#       [--ranks 2,4] [--sizes 8,1K,64K,1M,16M] [--reps K] [--stat median|best]
#       [--peers oxccl,ompi-c,ompi-py,gloo] [--no-gloo] [--extra "ARGS for oxccl bench"]
#       [--json FILE] [--iters N] [--timeout SECS] [--mpi-bind auto|none|core|core:overload-allowed]
#       [--busy N]
#       [--build] [--no-install] [--install-only]
#
# It installs what is missing, idempotently: Open MPI (apt: openmpi-bin libopenmpi-dev), a
# venv at ${PEERS_VENV:-target/peers-venv} with numpy, mpi4py built against Open MPI, and
# torch (PyPI's wheel, a large download; PEERS_TORCH_PIP overrides what pip is given, e.g. a
# CPU-only index). A peer that cannot be installed is skipped with a note in the output.
# --busy N measures every peer twice per point, quiet and with N busy-looping processes beside
# it (columns P+busy; ratios busy/quiet from the same run).
# --mpi-bind is given to mpirun's --bind-to (default auto: core where the ranks fit the CPUs,
# else none, as `oxccl bench --ranks N` binds by default; gloo sets no affinity; core needs
# :overload-allowed beyond one rank per core). --build rebuilds oxccl (otherwise
# only a missing binary is built); --no-install installs nothing (peers whose tools are
# missing are skipped); --install-only stops after installing.
# Measurement: scripts/peers/compare.py (the same iterations for every peer, loop mean per
# op, max over ranks; JSON lines in --json FILE or target/peers/compare-DATE.jsonl).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
ROOT=$(pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
VENV=${PEERS_VENV:-target/peers-venv}
case "$VENV" in /*) ;; *) VENV="$ROOT/$VENV" ;; esac
WORK="$TARGET/peers"
LOG="$WORK/install.log"
mkdir -p "$WORK"

usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }

PEERS="oxccl,ompi-c,ompi-py,gloo"
INSTALL=1 INSTALL_ONLY=0 BUILD=0
FWD=()
while [ $# -gt 0 ]; do
    case "$1" in
    -h | --help) usage; exit 0 ;;
    --peers) PEERS=${2:?--peers needs a value}; shift 2 ;;
    --peers=*) PEERS=${1#*=}; shift ;;
    --no-gloo) NO_GLOO=1; shift ;;
    --no-install) INSTALL=0; shift ;;
    --install-only) INSTALL_ONLY=1; shift ;;
    --build) BUILD=1; shift ;;
    --ops | --ranks | --sizes | --reps | --stat | --extra | --json | --iters | --timeout | --mpi-bind | --busy)
        [ $# -ge 2 ] || { echo "compare_peers: $1 needs a value" >&2; exit 2; }
        FWD+=("$1" "$2"); shift 2 ;;
    --ops=* | --ranks=* | --sizes=* | --reps=* | --stat=* | --extra=* | --json=* | --iters=* | --timeout=* | --mpi-bind=* | --busy=*)
        FWD+=("$1"); shift ;;
    *) echo "compare_peers: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
NOTES=()
if [ "${NO_GLOO:-0}" = 1 ] && [[ ",$PEERS," == *",gloo,"* ]]; then
    PEERS=$(tr ',' '\n' <<<"$PEERS" | grep -vx gloo | paste -sd, -)
    NOTES+=("gloo not run (--no-gloo)")
fi
for p in ${PEERS//,/ }; do
    case "$p" in oxccl | ompi-c | ompi-py | gloo) ;; *) echo "compare_peers: unknown peer $p (oxccl, ompi-c, ompi-py, gloo)" >&2; exit 2 ;; esac
done
OPS=all_reduce
for ((i = 0; i < ${#FWD[@]}; i++)); do
    case "${FWD[i]}" in --ops) OPS=${FWD[i + 1]} ;; --ops=*) OPS=${FWD[i]#*=} ;; esac
done
for o in ${OPS//,/ }; do
    case "$o" in all_reduce | all_gather | reduce_scatter | broadcast | all_to_all) ;;
    *) echo "compare_peers: unknown op $o (all_reduce, all_gather, reduce_scatter, broadcast, all_to_all)" >&2; exit 2 ;;
    esac
done
want() { [[ ",$PEERS," == *",$1,"* ]]; }
skip() { # skip PEER REASON
    if want "$1"; then
        PEERS=$(tr ',' '\n' <<<"$PEERS" | grep -vx "$1" | paste -sd, -)
        NOTES+=("$1 skipped: $2")
        echo "compare_peers: $1 skipped: $2" >&2
    fi
}
say() { echo "compare_peers: $*" >&2; }
PY="$VENV/bin/python"
# shellcheck source=scripts/peers/install.sh
. scripts/peers/install.sh

# --- Open MPI: mpirun and mpicc of Open MPI (Debian's .openmpi names first, as MPICH may own the plain ones).
find_ompi() {
    MPIRUN="" MPICC=""
    for r in mpirun.openmpi mpirun; do
        if command -v "$r" >/dev/null && "$r" --version 2>&1 | grep -q "Open MPI"; then MPIRUN=$(command -v "$r"); break; fi
    done
    for c in mpicc.openmpi mpicc; do
        if command -v "$c" >/dev/null && "$c" --showme:version 2>&1 | grep -q "Open MPI"; then MPICC=$(command -v "$c"); break; fi
    done
    [ -n "$MPIRUN" ] && [ -n "$MPICC" ]
}
if want ompi-c || want ompi-py; then
    if ! find_ompi; then
        apt_install openmpi-bin libopenmpi-dev || true
        if ! find_ompi; then
            if [ "$INSTALL" = 1 ]; then why="could not be installed (apt-get install openmpi-bin libopenmpi-dev; see $LOG)"; else why="--no-install"; fi
            skip ompi-c "no Open MPI mpirun and mpicc ($why)"
            skip ompi-py "no Open MPI mpirun and mpicc ($why)"
        fi
    fi
fi

# --- The C harness and the core-to-core probe.
OMPI_BENCH="$WORK/ompi_bench"
if want ompi-c; then
    if [ ! -x "$OMPI_BENCH" ] || [ scripts/peers/ompi_bench.c -nt "$OMPI_BENCH" ]; then
        "$MPICC" -O2 -o "$OMPI_BENCH" scripts/peers/ompi_bench.c >>"$LOG" 2>&1 ||
            skip ompi-c "$MPICC could not build scripts/peers/ompi_bench.c (see $LOG)"
    fi
fi
C2C="$WORK/c2c_latency"
if [ ! -x "$C2C" ] || [ scripts/peers/c2c_latency.c -nt "$C2C" ]; then
    ${CC:-cc} -O2 -pthread -o "$C2C" scripts/peers/c2c_latency.c >>"$LOG" 2>&1 || C2C=""
fi
[ "$(nproc)" -ge 2 ] || C2C=""

# --- The venv: numpy and mpi4py (built against Open MPI) for ompi-py, torch for gloo.
MPI4PY_CHECK='import mpi4py; mpi4py.rc.initialize = False
from mpi4py import MPI; import numpy; assert "Open MPI" in MPI.Get_library_version()'
GLOO_CHECK='import torch.distributed as d; assert d.is_available() and d.is_gloo_available()'
if want ompi-py || want gloo; then
    if ! ensure_venv; then
        if [ "$INSTALL" = 1 ]; then why="python3 -m venv failed; see $LOG"; else why="--no-install"; fi
        skip ompi-py "no venv at $VENV ($why)"
        skip gloo "no venv at $VENV"
    fi
fi
if want ompi-py && ! vpy "$MPI4PY_CHECK"; then
    if [ "$INSTALL" = 1 ]; then
        vpy "import numpy" || pip_install numpy
        # Built from source against this Open MPI (a wheel may carry another MPI).
        if ! vpy "import sysconfig, os; assert os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h'))"; then
            apt_install python3-dev || true
        fi
        MPICC="$MPICC" pip_install --no-binary mpi4py --no-cache-dir --force-reinstall mpi4py
    fi
    vpy "$MPI4PY_CHECK" || skip ompi-py "mpi4py built against Open MPI (and numpy) could not be installed in $VENV (see $LOG)"
fi
if want gloo && ! vpy "$GLOO_CHECK"; then
    if [ "$INSTALL" = 1 ]; then
        vpy "import numpy" || pip_install numpy
        say "installing torch for gloo: PyPI's wheel for this platform, gigabytes with its CUDA libraries; --no-gloo skips it"
        # shellcheck disable=SC2086 # PEERS_TORCH_PIP is a list of pip arguments
        pip_install ${PEERS_TORCH_PIP:-torch}
    fi
    vpy "$GLOO_CHECK" || skip gloo "torch with gloo could not be installed in $VENV (pip install ${PEERS_TORCH_PIP:-torch}; see $LOG)"
fi

# --- oxccl.
OXCCL="$TARGET/release/oxccl"
if want oxccl; then
    if [ ! -x "$OXCCL" ] || [ "$BUILD" = 1 ]; then
        say "building oxccl (cargo build --release -p oxccl-cli)"
        cargo build --release -p oxccl-cli >>"$LOG" 2>&1 || skip oxccl "cargo build --release -p oxccl-cli failed (see $LOG)"
    fi
    [ -x "$OXCCL" ] || skip oxccl "no $OXCCL"
fi

if [ "$INSTALL_ONLY" = 1 ]; then
    say "installed; peers ready: ${PEERS:-none}"
    for n in "${NOTES[@]}"; do say "note: $n"; done
    exit 0
fi
if [ -z "$PEERS" ]; then
    say "no peer left to run"
    exit 1
fi

ARGS=(--peers "$PEERS")
want oxccl && ARGS+=(--oxccl "$OXCCL")
if want ompi-c || want ompi-py; then ARGS+=(--mpirun "$MPIRUN"); fi
want ompi-c && ARGS+=(--ompi-bench "$OMPI_BENCH" --mpicc-version "$("$MPICC" --showme:version 2>&1 | head -n 1)")
if want ompi-py || want gloo; then ARGS+=(--python "$PY"); fi
[ -n "$C2C" ] && ARGS+=(--c2c "$C2C")
for n in "${NOTES[@]}"; do ARGS+=(--note "$n"); done
CARGO_TARGET_DIR="$TARGET" exec python3 scripts/peers/compare.py "${ARGS[@]}" "${FWD[@]}"
