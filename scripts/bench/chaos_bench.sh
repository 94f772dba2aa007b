#!/usr/bin/env bash
# Issue 39's randomized trials: N rank processes of `oxccl-failure-probe chaos` (a training
# loop: gather the members, all_reduce 1 MiB checked against them, agree; shrink and redo on
# a failure). Per trial, at random: one or two victims (rank 0, the store's host, included),
# the step, and where they die (between calls, inside the all_reduce, inside agree, or, with
# two victims, the second inside the shrink that follows the first's death), with a random
# delay into the call. A trial passes when every survivor ends (none past the deadline: a
# hang), every survivor reports the same members (no disagreement) and those are exactly the
# ranks that were not killed, and no result was wrong (the probe checks every sum).
#
# usage: scripts/bench/chaos_bench.sh [TRIALS=200] [RANKS=6] [TRANSPORT=shm|tcp] [SEED]
#   TCP: every rank on an emulated host of its own (OXCCL_HOST_ID), so all traffic is TCP.
set -euo pipefail
cd "$(dirname "$0")/../.."
trials=${1:-200}
n=${2:-6}
transport=${3:-shm}
RANDOM=${4:-$$}
deadline=${CHAOS_DEADLINE:-60}
cargo build --release -q -p oxccl-conformance --bin oxccl-failure-probe
bin="${CARGO_TARGET_DIR:-target}/release/oxccl-failure-probe"
secret=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
wheres=(between collective agree shrink)
bad=0
declare -A seen
for ((t = 1; t <= trials; t++)); do
  dir=$(mktemp -d)
  port=$((20000 + RANDOM % 12000))
  at=${wheres[$((RANDOM % 4))]}
  count=$((1 + RANDOM % 2))
  [ "$at" = shrink ] && count=2
  first=$((RANDOM % n))
  victims=$first
  if [ "$count" = 2 ]; then
    second=$(((first + 1 + RANDOM % (n - 1)) % n))
    victims="$first,$second"
  fi
  die_at=$((1 + RANDOM % 5))
  delay=$((RANDOM % 3000))
  pids=()
  for ((r = 0; r < n; r++)); do
    host=host0
    [ "$transport" = tcp ] && host="host$r"
    RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      OXCCL_SECRET=$secret OXCCL_HOST_ID=$host OXCCL_TIMEOUT=30s OXCCL_FR_SIZE=0 \
      PROBE_VICTIMS=$victims PROBE_KILL_WHERE=$at PROBE_DIE_AT=$die_at PROBE_KILL_DELAY_US=$delay \
      PROBE_STEPS=8 timeout -s KILL "$deadline" "$bin" chaos >"$dir/$r.out" 2>"$dir/$r.err" &
    pids+=($!)
  done
  codes=()
  for p in "${pids[@]}"; do
    code=0
    wait "$p" 2>/dev/null || code=$?
    codes+=("$code")
  done
  want=$(for ((r = 0; r < n; r++)); do [[ ",$victims," == *",$r,"* ]] || echo -n "$r,"; done)
  want=${want%,}
  why=""
  lists=""
  for ((r = 0; r < n; r++)); do
    if [[ ",$victims," == *",$r,"* ]]; then
      # 137: SIGKILL (the victim's own, as planned); 124/137 from timeout would be a hang,
      # but a victim is always killed by itself first.
      [ "${codes[$r]}" = 137 ] || why+="victim $r exited ${codes[$r]}; "
      continue
    fi
    line=$(grep PROBE-CHAOS "$dir/$r.out" || true)
    if [ -z "$line" ]; then
      [ "${codes[$r]}" = 137 ] && why+="rank $r hung (killed at the ${deadline} s deadline); " ||
        why+="rank $r: $(grep -h PROBE-ERROR "$dir/$r.out" | head -1 | cut -c1-300) (exit ${codes[$r]}); "
      continue
    fi
    got=$(sed -n 's/.* members=\([0-9,]*\).*/\1/p' <<<"$line")
    lists+="$got "
    [ "$got" = "$want" ] || why+="rank $r ends with members $got, not $want; "
  done
  key="$at/$count"
  seen[$key]=$((${seen[$key]:-0} + 1))
  if [ -z "$why" ]; then
    echo "trial $t: $n ranks over $transport, victims $victims at step $die_at ($at, +${delay} us): ok, survivors agree on $want"
  else
    bad=$((bad + 1))
    echo "trial $t: $n ranks over $transport, victims $victims at step $die_at ($at, +${delay} us): FAILED: $why"
    echo "  logs kept in $dir"
    continue
  fi
  rm -rf "$dir"
done
mix=$(for k in "${!seen[@]}"; do echo -n "$k=${seen[$k]} "; done)
echo "$transport, $n ranks: $((trials - bad)) of $trials trials ok, $bad failed (hangs, disagreements, wrong results); where/victims: $mix"
[ "$bad" = 0 ]
