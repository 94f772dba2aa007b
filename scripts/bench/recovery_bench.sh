#!/usr/bin/env bash
# Issue 39's first target: from a SIGKILL to the survivors holding a working shrunk
# communicator. N rank processes of `oxccl-failure-probe shrink` (an all_reduce loop of
# PROBE_BYTES; on the first error each survivor shrinks and runs one all_reduce on the shrunk
# communicator), a random victim (rank 0, the store's host, included) killed once every rank
# is in the loop; the time is from just before the kill to the last survivor's working shrunk
# communicator (PROBE-SHRUNK done_unix_ms). Prints each trial, then min / p50 / p99 / max.
#
# usage: scripts/bench/recovery_bench.sh [TRIALS=50] [RANKS=8] [TRANSPORT=shm|tcp]
#   KEEP_SLOW_MS=M keeps the ranks' output of every trial that took M ms or more.
#   TCP: every rank on an emulated host of its own (OXCCL_HOST_ID), so all traffic is TCP.
set -euo pipefail
cd "$(dirname "$0")/../.."
trials=${1:-50}
n=${2:-8}
transport=${3:-shm}
cargo build --release -q -p oxccl-conformance --bin oxccl-failure-probe
bin="${CARGO_TARGET_DIR:-target}/release/oxccl-failure-probe"
secret=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
now_ms() { date +%s%3N; }

results=()
bad=0
for ((t = 1; t <= trials; t++)); do
  dir=$(mktemp -d)
  port=$((20000 + RANDOM % 12000))
  victim=$((RANDOM % n))
  pids=()
  for ((r = 0; r < n; r++)); do
    host=host0
    [ "$transport" = tcp ] && host="host$r"
    RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      OXCCL_SECRET=$secret OXCCL_HOST_ID=$host OXCCL_TIMEOUT=60s PROBE_BYTES=${PROBE_BYTES:-262144} \
      PROBE_SECONDS=60 OXCCL_FR_SIZE=0 "$bin" shrink >"$dir/$r.out" 2>"$dir/$r.err" &
    pids+=($!)
  done
  # Every rank in the loop: the victim has done 20 all_reduces (the others at most one behind).
  for _ in $(seq 1 600); do
    grep -q PROBE-READY "$dir/$victim.out" 2>/dev/null && break
    sleep 0.05
  done
  killed=$(now_ms)
  kill -9 "${pids[$victim]}"
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  last=0
  ok=0
  for ((r = 0; r < n; r++)); do
    [ "$r" = "$victim" ] && continue
    line=$(grep PROBE-SHRUNK "$dir/$r.out" || true)
    size=$(sed -n 's/.* size=\([0-9]*\).*/\1/p' <<<"$line")
    done_ms=$(sed -n 's/.*done_unix_ms=\([0-9]*\).*/\1/p' <<<"$line")
    if [ "$size" = "$((n - 1))" ] && [ -n "$done_ms" ]; then
      ok=$((ok + 1))
      [ "$done_ms" -gt "$last" ] && last=$done_ms
    fi
  done
  if [ "$ok" = "$((n - 1))" ]; then
    ms=$((last - killed))
    results+=("$ms")
    echo "trial $t: killed rank $victim of $n over $transport; all $ok survivors shrunk in ${ms} ms"
  else
    bad=$((bad + 1))
    echo "trial $t: killed rank $victim of $n over $transport; only $ok of $((n - 1)) survivors shrunk:"
    cat "$dir"/*.out | grep -v PROBE-READY | head -5
  fi
  if [ -n "${KEEP_SLOW_MS:-}" ] && [ "${ms:-0}" -ge "$KEEP_SLOW_MS" ]; then
    echo "trial $t: logs kept in $dir"
  else
    rm -rf "$dir"
  fi
  ms=0
done
if [ "${#results[@]}" -gt 0 ]; then
  printf '%s\n' "${results[@]}" | sort -n | awk -v bad="$bad" -v n="$n" -v tr="$transport" '
    { v[NR] = $1 }
    END {
      # Nearest rank: the smallest value with at least p of the trials at or below it.
      i50 = int(NR * 0.50); if (i50 < NR * 0.50) i50++
      i99 = int(NR * 0.99); if (i99 < NR * 0.99) i99++
      p50 = v[i50]; p99 = v[i99]
      printf "%s, %d ranks: %d trials ok, %d failed; kill to shrunk communicator: min %d ms, p50 %d ms, p99 %d ms, max %d ms\n", tr, n, NR, bad, v[1], p50, p99, v[NR]
    }'
fi
[ "$bad" = 0 ]
