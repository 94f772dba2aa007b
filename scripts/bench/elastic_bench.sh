#!/usr/bin/env bash
# Issue 39's elastic targets through the launcher: `oxccl run -n RANKS --max-restarts 1` of
# `oxccl-failure-probe elastic` (a training loop: all_reduce + agree per step, 20 ms apart),
# a random victim (rank 0 included) SIGKILLing itself at a random step. Per trial: the
# survivors' recovery (failed step to working shrunk communicator, the slowest survivor), the
# replacement's join (from the start of its main to the members' state in hand: target under
# 2 s) and the members' grow (agree saying it waits to the grown communicator). Prints each
# trial, then min / p50 / p99 / max of each; a trial fails when the job does not succeed or a
# rank does not end at the first size with every step done.
#
# usage: scripts/bench/elastic_bench.sh [TRIALS=20] [RANKS=4] [TRANSPORT=shm|tcp]
set -euo pipefail
cd "$(dirname "$0")/../.."
trials=${1:-20}
n=${2:-4}
transport=${3:-shm}
cargo build --release -q -p oxccl-cli -p oxccl-conformance --bins
dir_bin="${CARGO_TARGET_DIR:-target}/release"
out=$(mktemp -d)
bad=0
rec=() joins=() grows=()
for ((t = 1; t <= trials; t++)); do
  victim=$((RANDOM % n))
  die_at=$((3 + RANDOM % 20))
  log="$out/$t.log"
  if ! PROBE_VICTIM=$victim PROBE_DIE_AT=$die_at PROBE_STEPS=30 PROBE_SECONDS=60 OXCCL_TRANSPORT=$transport \
    OXCCL_TIMEOUT=30s OXCCL_FR_SIZE=0 timeout 120 "$dir_bin/oxccl" run -n "$n" --max-restarts 1 -- \
    "$dir_bin/oxccl-failure-probe" elastic >"$log" 2>&1; then
    echo "trial $t: the job failed (victim $victim at step $die_at); log $log"
    bad=$((bad + 1))
    continue
  fi
  ends=$(grep -c "PROBE-ELASTIC rank=[0-9]* size=$n steps=30" "$log" || true)
  if [ "$ends" != "$n" ]; then
    echo "trial $t: $ends of $n ranks ended at size $n after 30 steps; log $log"
    bad=$((bad + 1))
    continue
  fi
  r=$(grep -o 'PROBE-SHRUNK [^]]*recovery_ms=[0-9]*' "$log" | sed 's/.*recovery_ms=//' | sort -n | tail -n 1)
  j=$(grep -o 'join_ms=[0-9]*' "$log" | sed 's/join_ms=//' | head -n 1)
  g=$(grep -o 'grow_ms=[0-9]*' "$log" | sed 's/grow_ms=//' | sort -n | tail -n 1)
  echo "trial $t: victim $victim at step $die_at: recovery ${r} ms, join ${j} ms, grow ${g} ms"
  rec+=("$r") joins+=("$j") grows+=("$g")
done
stats() {
  printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {if (NR == 0) {print "no trials"; exit}
    i50 = int((NR - 1) * 0.50) + 1; i99 = int((NR - 1) * 0.99) + 1
    printf "min %d, p50 %d, p99 %d, max %d ms (%d trials)\n", a[1], a[i50], a[i99], a[NR], NR}'
}
echo "$((trials - bad)) of $trials trials ok ($n ranks over $transport)"
echo "recovery (survivors, failed step to shrunk): $(stats "${rec[@]}")"
echo "join (replacement, start of main to members' state): $(stats "${joins[@]}")"
echo "grow (members): $(stats "${grows[@]}")"
[ "$bad" = 0 ]
