#!/usr/bin/env bash
# The scale check of issue 38: N rank processes on this machine, spread over emulated hosts
# of K ranks (OXCCL_HOST_ID: shared memory inside a host, TCP between hosts), each under the
# default descriptor limit (ulimit -Sn 1024), running init, all_reduce, broadcast from the
# last rank, reduce_scatter and barrier (crates/oxccl/examples/scale_rank.rs checks every
# result). Prints one line per world:
#
#   lib ranks hosts ok  init_max_ms init_p50_ms  wall_ms  ops_max_ms  threads_max fds_max
#
# init_* is each rank's own oxccl::init call; wall is from the first rank's init start to
# the last rank's init end (it includes starting the processes). Rank 0 hosts the store.
#
# usage: scripts/bench/scale_check.sh [WORLDS=64,256,1024] [RANKS_PER_HOST=8]
set -euo pipefail
cd "$(dirname "$0")/../.."
worlds=${1:-64,256,1024}
per_host=${2:-8}
cargo build --release -q -p oxccl --example scale_rank
bin="${CARGO_TARGET_DIR:-target}/release/examples/scale_rank"
secret=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')

printf '%-6s %6s %6s %5s %12s %12s %9s %10s %11s %7s\n' lib ranks hosts ok init_max_ms init_p50_ms wall_ms ops_max_ms threads_max fds_max
for n in ${worlds//,/ }; do
  dir=$(mktemp -d)
  port=$((20000 + RANDOM % 12000))
  pids=()
  for ((r = 0; r < n; r++)); do
    (
      ulimit -Sn 1024
      RANK=$r WORLD_SIZE=$n LOCAL_RANK=$((r % per_host)) LOCAL_WORLD_SIZE=$per_host \
        MASTER_ADDR=127.0.0.1 MASTER_PORT=$port OXCCL_SECRET=$secret \
        OXCCL_HOST_ID="host$((r / per_host))" OXCCL_TIMEOUT=${OXCCL_TIMEOUT:-600s} \
        exec "$bin" >"$dir/$r.out" 2>"$dir/$r.err"
    ) &
    pids+=($!)
  done
  failed=0
  for p in "${pids[@]}"; do wait "$p" || failed=$((failed + 1)); done
  cat "$dir"/*.out | awk -v n="$n" -v k="$per_host" -v label=oxccl -f scripts/bench/scale_summary.awk
  if [ "$failed" -gt 0 ]; then
    echo "  $failed of $n ranks failed; first errors:" >&2
    cat "$dir"/*.err | grep -v '^$' | head -5 >&2
  fi
  rm -rf "$dir"
done
