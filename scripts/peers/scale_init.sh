#!/usr/bin/env bash
# init time at several world sizes, oxccl beside gloo (torch.distributed) and Open MPI, in
# one run on this machine (issue 38). Each library's ranks print when their init began and
# ended (oxccl: oxccl::init, crates/oxccl/examples/scale_rank.rs; Open MPI: MPI_Init and a
# barrier, scripts/peers/mpi_init_time.c; gloo: init_process_group and a barrier, torch
# imported first, scripts/peers/gloo_init_time.py), and scripts/bench/scale_summary.awk prints a
# row per library and world: init_max_ms is the slowest rank's own init, wall_ms from the
# first rank's start to the last rank's end.
#
# oxccl ranks run 8 per emulated host (OXCCL_HOST_ID), like the others' ranks all on this
# one machine; gloo runs up to GLOO_MAX ranks (default 64: each rank is a Python process
# with torch loaded, ~250 MB), Open MPI up to OMPI_MAX (default 1024).
#
# usage: scripts/peers/scale_init.sh [WORLDS=64,256,1024]   (PY: a python with torch,
#        default target/py-venv/bin/python)
set -euo pipefail
cd "$(dirname "$0")/../.."
worlds=${1:-64,256,1024}
py=${PY:-${CARGO_TARGET_DIR:-target}/py-venv/bin/python}
gloo_max=${GLOO_MAX:-64}
ompi_max=${OMPI_MAX:-1024}
cargo build --release -q -p oxccl --example scale_rank
bin="${CARGO_TARGET_DIR:-target}/release/examples/scale_rank"
mpi_bin=""
if command -v mpicc >/dev/null 2>&1 && command -v mpirun >/dev/null 2>&1; then
  mpi_bin=$(mktemp -d)/mpi_init_time
  mpicc -O2 -o "$mpi_bin" scripts/peers/mpi_init_time.c
fi
have_torch=""
if [ -x "$py" ] && "$py" -c 'import torch.distributed' 2>/dev/null; then have_torch=1; fi
secret=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')

# Starts `n` ranks of command "$@" with torchrun-style variables (and oxccl's emulated
# hosts), waits for them, and prints their summary row labelled $label.
launch() {
  local label=$1 n=$2 k=$3
  shift 3
  local dir port r
  dir=$(mktemp -d)
  port=$((20000 + RANDOM % 12000))
  local pids=()
  for ((r = 0; r < n; r++)); do
    (
      ulimit -Sn 1024
      RANK=$r WORLD_SIZE=$n LOCAL_RANK=$((r % k)) LOCAL_WORLD_SIZE=$k MASTER_ADDR=127.0.0.1 \
        MASTER_PORT=$port OXCCL_SECRET=$secret OXCCL_HOST_ID="host$((r / k))" \
        OXCCL_TIMEOUT=600s exec "$@" >"$dir/$r.out" 2>"$dir/$r.err"
    ) &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || true; done
  cat "$dir"/*.out | awk -v n="$n" -v k="$k" -v label="$label" -f scripts/bench/scale_summary.awk
  rm -rf "$dir"
}

printf '%-6s %6s %6s %5s %12s %12s %9s %10s %11s %7s\n' lib ranks hosts ok init_max_ms init_p50_ms wall_ms ops_max_ms threads_max fds_max
for n in ${worlds//,/ }; do
  launch oxccl "$n" 8 "$bin"
  if [ -n "$have_torch" ] && [ "$n" -le "$gloo_max" ]; then
    launch gloo "$n" "$n" "$py" scripts/peers/gloo_init_time.py
  else
    echo "gloo   $n: skipped (torch missing, or above GLOO_MAX=$gloo_max)"
  fi
  if [ -n "$mpi_bin" ] && [ "$n" -le "$ompi_max" ]; then
    dir=$(mktemp -d)
    # No descriptor limit here: mpirun holds every local child's stdio (at 256 ranks under
    # `ulimit -Sn 1024` it failed to start them); its ranks inherit the machine's default.
    (OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
      timeout 900 mpirun --oversubscribe -n "$n" "$mpi_bin" >"$dir/out" 2>"$dir/err") || true
    pkill -f "$mpi_bin" 2>/dev/null || true # ranks a failed launch left behind
    awk -v n="$n" -v k="$n" -v label=ompi -f scripts/bench/scale_summary.awk "$dir/out"
    rm -rf "$dir"
  else
    echo "ompi   $n: skipped (mpicc/mpirun missing, or above OMPI_MAX=$ompi_max)"
  fi
done
