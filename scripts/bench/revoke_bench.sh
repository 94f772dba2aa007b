#!/usr/bin/env bash
# Issue 39's revoke target: `revoke` during a 64 MiB all_reduce ends it on every rank within
# 100 ms over shared memory and within 1 s over TCP. Per trial, `oxccl run -n RANKS` of
# `oxccl-failure-probe revoke` (every rank loops over 64 MiB all_reduces; rank 1 revokes from
# another thread after a random 150-650 ms, while its own all_reduce runs): the time from the
# revoke call to the last rank's `Revoked` (ranks share one host's clock). Prints each trial,
# then min / p50 / p99 / max.
#
# usage: scripts/bench/revoke_bench.sh [TRIALS=20] [RANKS=4] [TRANSPORT=shm|tcp]
set -euo pipefail
cd "$(dirname "$0")/../.."
trials=${1:-20}
n=${2:-4}
transport=${3:-shm}
cargo build --release -q -p oxccl-cli -p oxccl-conformance --bins
bin="${CARGO_TARGET_DIR:-target}/release"
lat=()
bad=0
for ((t = 1; t <= trials; t++)); do
  after=$((150 + RANDOM % 500))
  log=$(mktemp)
  if ! PROBE_REVOKE_AFTER_MS=$after OXCCL_TRANSPORT=$transport OXCCL_FR_SIZE=0 OXCCL_TIMEOUT=60s \
    timeout 120 "$bin/oxccl" run -n "$n" -- "$bin/oxccl-failure-probe" revoke >"$log" 2>&1; then
    echo "trial $t: the job failed; log $log"
    bad=$((bad + 1))
    continue
  fi
  at=$(grep -o 'PROBE-REVOKED-AT unix_us=[0-9]*' "$log" | sed 's/.*=//')
  seen=$(grep -c 'PROBE-REVOKE-SEEN' "$log" || true)
  last=$(grep -o 'PROBE-REVOKE-SEEN rank=[0-9]* unix_us=[0-9]*' "$log" | sed 's/.*unix_us=//' | sort -n | tail -n 1)
  if [ "$seen" != "$n" ] || [ -z "$at" ]; then
    echo "trial $t: $seen of $n ranks saw the revoke; log $log"
    bad=$((bad + 1))
    continue
  fi
  ms=$(((last - at) / 1000))
  echo "trial $t: revoke after $after ms: last rank ended ${ms} ms later"
  lat+=("$ms")
  rm -f "$log"
done
echo "$((trials - bad)) of $trials trials ok ($n ranks over $transport, 64 MiB all_reduce)"
printf '%s\n' "${lat[@]}" | sort -n | awk '{a[NR]=$1} END {if (NR == 0) {print "no trials"; exit}
  i50 = int((NR - 1) * 0.50) + 1; i99 = int((NR - 1) * 0.99) + 1
  printf "revoke to the last Revoked: min %d, p50 %d, p99 %d, max %d ms\n", a[1], a[i50], a[i99], a[NR]}'
[ "$bad" = 0 ]
