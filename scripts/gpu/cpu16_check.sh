#!/usr/bin/env bash
# Issue 10 on a many-core machine (the GPU machine's 16 cores; see docs/gpu.md): the cpu
# backend with host buffers beside Open MPI's C API, and the algorithm selector's sweep, ranks
# up to the core count. Run ON that machine from the repository root, with the binaries that
# `scripts/gpu/cpu16_check.sh --build` puts in gpu-bin/ here (carry ["gpu-bin"]). Every step has a
# time limit so that the whole check ends within 8 minutes (the default steps and tcp took 7
# on 2026-11-28). Results go to a few files under $OUT: machine.txt, tune.txt, compare.txt
# (the tables), compare.jsonl, sweep.txt, sweep-tcp.txt and scatter.txt (the device tool
# brings back at most 8 files, so a log of the run written there makes 8). The exit status
# is non-zero when a comparison with Open MPI failed. The sweeps replay through the cost
# model here, offline (see crates/oxccl/src/cpu/selector/replay.rs): REPLAY_PROFILE=tune.txt
# REPLAY_SWEEPS=sweep.txt REPLAY_CPUS=16 cargo test -p oxccl --lib replay -- --ignored
# --nocapture (absolute paths: the test runs in crates/oxccl).
#
#   scripts/gpu/cpu16_check.sh --build       here: scripts/gpu/gpu_build.sh --mpi (gpu-bin/oxccl, ompi_bench...)
#   scripts/gpu/cpu16_check.sh --build --exp REF [--exp REF]...   the same, and the oxccl of each git
#                                        REF (an experiment's branch) as gpu-bin/oxccl-exp-NAME
#                                        (NAME: the ref's last path part), for the `ab` step
#   scripts/gpu/cpu16_check.sh [STEP...]     there (default: all steps, in this order):
#     tune     oxccl tune into tune.txt, the profile (OXCCL_TUNE_FILE) every later step's auto uses
#     steady   all_reduce, 2 and 16 ranks, 8 B to 16 MiB, iterations adapted to the size
#     first    the same with 20 iterations (5 warm-up): the first operations after start-up
#     busy     16 ranks, small sizes, quiet and with one busy-looping process beside them
#     ops      all_gather, reduce_scatter, broadcast, all_to_all at 16 MiB, 2, 4 and 16 ranks
#     sweep    oxccl bench --algo all, every rooted and symmetric op, 3, 8 and 16 ranks (shm)
#     worlds   all_reduce at 4 and 8 ranks beside Open MPI
#   and, only when named (about 2 more minutes each):
#     tcp      the selector's sweep over TCP (OXCCL_TRANSPORT=tcp), 3 and 8 ranks, into sweep-tcp.txt,
#              and the TCP segments per call of a 3-rank all_gather with the ring and with Bruck
#     scatter  scatter's algorithms at 3, 8 and 16 ranks, 8 KiB to 8 MiB by factors of 2, with
#              single copy on and off (OXCCL_SHM_SINGLE_COPY), into scatter.txt
#     rooted   two more passes of the sweep's rooted operations (broadcast, reduce, gather,
#              scatter) at 3 and 8 ranks, into sweep.txt (about 80 s): which misses repeat
#     fresh    ten fresh 16-rank all_reduce benches of 20 iterations (8 B, 512 B, 32 KiB) and
#              compare.py's first 20 iterations at 16 ranks, 7 repetitions, into compare.txt
#              (about 40 s): how often the first operations after start-up are slow
#     ab       gpu-bin/oxccl against each gpu-bin/oxccl-exp-NAME in alternating runs: 2-rank
#              all_reduce of 8 and 64 B (6 pairs), 16-rank broadcast, reduce, gather and
#              scatter of 64 B (4 B a rank in gather and scatter), 1 KiB and 64 KiB (2 pairs),
#              then the experiment beside Open MPI,
#              into compare.txt (about 2 minutes per experiment)
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
if [ "${1:-}" = --build ]; then
  shift
  while [ "${1:-}" = --exp ]; do
    # Each experiment first, in a worktree of REF, with the features gpu_build.sh --mpi
    # gives this tree's oxccl (the A/B compares the change, not the build). Its own target
    # directory: cargo names a workspace member's artifacts without its path, so a build of
    # the worktree in this tree's target directory overwrote this tree's oxccl, and the
    # build below, finding it newer than this tree's sources, kept it (gpu-bin/oxccl was
    # the experiment). The experiments share theirs: each worktree's sources are new.
    ref="${2:?--exp needs a git ref}"
    shift 2
    target="${CARGO_TARGET_DIR:-$PWD/target}/experiments"
    wt=$(mktemp -d)
    git worktree add -q --detach "$wt" "$ref" || exit 2
    (cd "$wt" && CARGO_TARGET_DIR="$target" cargo build --release -p oxccl-cli --features oxccl-cli/mpi)
    rc=$?
    git worktree remove --force "$wt"
    [ "$rc" = 0 ] || exit "$rc"
    mkdir -p gpu-bin
    exp="gpu-bin/oxccl-exp-${ref##*/}"
    cp "$target/release/oxccl" "$exp" && strip "$exp" 2>/dev/null
    echo "$exp: oxccl at $(git rev-parse --short "$ref") ($ref)"
  done
  # The GPU checks' one build: oxccl and Open MPI's C benchmark among its binaries.
  exec scripts/gpu/gpu_build.sh --mpi
fi
OUT="${OUT:-$PWD/gpu-check-out}"
mkdir -p "$OUT"
BIN="${GPU_BIN:-$PWD/gpu-bin}"
for b in oxccl ompi_bench; do
  [ -x "$BIN/$b" ] || { echo "missing $BIN/$b: run scripts/gpu/cpu16_check.sh --build here first and carry gpu-bin"; exit 2; }
done
want="${*:-tune steady first busy ops sweep worlds}"
wanted() { [[ " $want " == *" $1 "* ]]; }
step() { echo; echo "== $* ($(date +%T))"; }
# The last row of an `oxccl bench` table on stdin (the comment lines start with #).
last_row() { grep -v "^#" | tail -n 1; }
LOG="$OUT/compare.txt"
# The operations of the selector's sweeps.
SWEEP_OPS="all_reduce all_gather reduce_scatter broadcast reduce gather scatter"
failed=0
TMPD=$(mktemp -d)
trap 'rm -rf "$TMPD"' EXIT
n=0
# compare LIMIT ARGS...: one compare.py run, its tables appended to compare.txt and printed.
compare() {
  local limit=$1; shift
  n=$((n + 1))
  echo "## compare.py $*" >> "$LOG"
  timeout "$limit" python3 scripts/peers/compare.py --peers oxccl,ompi-c --oxccl "${OXCCL_UNDER_TEST:-$BIN/oxccl}" \
    --ompi-bench "$BIN/ompi_bench" --mpirun "$(command -v mpirun)" --timeout 60 \
    --json "$TMPD/compare-$n.jsonl" "$@" 2>&1 | tee -a "$LOG" | grep -v "^#  \|^  \["
  local rc=${PIPESTATUS[0]}
  echo "exit $rc" | tee -a "$LOG"
  [ "$rc" = 0 ] || failed=1
  cat "$TMPD/compare-$n.jsonl" >> "$OUT/compare.jsonl" 2>/dev/null
}
# c2c: the one-way core-to-core latency between CPUs 0 and 1 in ns, "-" without the probe.
c2c() {
  [ -x "$BIN/c2c_latency" ] || { echo -; return; }
  timeout 10 "$BIN/c2c_latency" 2>/dev/null | tail -n 1 | sed -n 's/.*"oneway_ns_median": *\([0-9.]*\).*/\1/p'
}
# bench_into FILE LIMIT TITLE [NAME=VALUE...] -- ARGS...: one `oxccl bench ARGS --algo all`
# (with those settings) appended to FILE under "## TITLE", then its exit status and the
# core-to-core latency before and after it (a change between passes explains a flipped pick).
bench_into() {
  local file="$OUT/$1" limit=$2 title=$3 vars=() before
  shift 3
  while [ "$1" != -- ]; do vars+=("$1"); shift; done
  shift
  echo "## $title ($(date +%T))" >> "$file"
  before=$(c2c)
  env "${vars[@]}" timeout "$limit" "$BIN/oxccl" bench "$@" --algo all 2>&1 | grep -v "^\[rank" >> "$file"
  echo "exit ${PIPESTATUS[0]}" >> "$file"
  echo "# c2c one-way ns, CPUs 0 and 1: $before before, $(c2c) after" >> "$file"
}
{ nproc; lscpu | grep -E "Model name|^CPU\(s\)|Thread|NUMA node\(s\)"; mpirun --version | head -n 1; } > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
if wanted tune; then
  step tune
  timeout 60 "$BIN/oxccl" tune --ranks 2 -o "$OUT/tune.txt" && cat "$OUT/tune.txt"
fi
[ -s "$OUT/tune.txt" ] && export OXCCL_TUNE_FILE="$OUT/tune.txt"
if wanted steady; then
  step "all_reduce, 2 and 16 ranks, steady state"
  compare 110 --ops all_reduce --ranks 2,16 --sizes 8,1K,32K,1M,16M --reps 3
fi
if wanted first; then
  step "all_reduce, 2 and 16 ranks, 20 iterations after 5 warm-up (start-up)"
  compare 80 --ops all_reduce --ranks 2,16 --sizes 8,1K,32K,1M,16M --reps 3 --iters 20
fi
if wanted busy; then
  step "16 ranks with one busy process beside them"
  compare 60 --ops all_reduce --ranks 16 --sizes 8,1K,32K --reps 3 --busy 1
fi
if wanted ops; then
  step "other ops at 16 MiB"
  compare 80 --ops all_gather,reduce_scatter,broadcast,all_to_all --ranks 2,4,16 --sizes 16M --reps 2
fi
if wanted sweep; then
  step "selector sweep (shm)"
  for r in 3 8 16; do
    bench_into sweep.txt $((r < 16 ? 50 : 70)) "sweep $r ranks" -- $SWEEP_OPS --ranks "$r" -b 8 -e 4M -f 8
  done
  grep -E "^## |^# [a-z_]+ on|^exit" "$OUT/sweep.txt"
fi
if wanted worlds; then
  step "all_reduce, 4 and 8 ranks"
  compare 60 --ops all_reduce --ranks 4,8 --sizes 8,32K,1M,16M --reps 2
fi
if wanted tcp; then
  step "selector sweep (TCP)"
  for r in 3 8; do
    bench_into sweep-tcp.txt 60 "sweep tcp $r ranks" OXCCL_TRANSPORT=tcp -- $SWEEP_OPS --ranks "$r" -b 8 -e 4M -f 8
  done
  # TCP segments per call (the whole host's OutSegs), 3 ranks, 60 B, ring against Bruck:
  # the ring's connections carry nothing back and cost a separate acknowledgement each
  # (the cost model's `ack`). On the 2-CPU VM: 12.0 against 9.4, the bench's own included.
  segs() { awk '/^Tcp:/ { if (seen) print $12; seen = 1 }' /proc/net/snmp; }
  iters=5000 warmup=100
  calls=$((2 * (iters + warmup))) # out of place and in place
  for algo in ring bruck; do
    before=$(segs)
    line=$(OXCCL_TRANSPORT=tcp OXCCL_ALGO=all_gather:$algo timeout 30 "$BIN/oxccl" bench all_gather --ranks 3 \
      -b 60 -e 60 -n "$iters" -w "$warmup" -c 0 2>&1 | last_row)
    tenths=$(( ($(segs) - before) * 10 / calls ))
    echo "segments per call, all_gather 60 B on 3 ranks, $algo: $((tenths / 10)).$((tenths % 10)) | $line" |
      tee -a "$OUT/sweep-tcp.txt"
  done
  grep -E "^## |^# [a-z_]+ on|^exit" "$OUT/sweep-tcp.txt"
fi
if wanted scatter; then
  step "scatter with and without single copy"
  for r in 3 8 16; do
    for sc in 1 0; do
      bench_into scatter.txt 45 "scatter $r ranks, OXCCL_SHM_SINGLE_COPY=$sc" OXCCL_SHM_SINGLE_COPY=$sc -- \
        scatter --ranks "$r" -b 8K -e 8M -f 2
    done
  done
  grep -E "^## |^exit" "$OUT/scatter.txt"
fi
if wanted rooted; then
  step "rooted operations, two more passes"
  for pass in 1 2; do
    for r in 3 8; do
      bench_into sweep.txt 40 "pass $pass sweep $r ranks" -- broadcast reduce gather scatter --ranks "$r" -b 8 -e 4M -f 8
    done
  done
  grep -E "^## pass|^exit" "$OUT/sweep.txt"
fi
if wanted fresh; then
  step "16 ranks, 20 iterations, ten fresh starts"
  for i in $(seq 10); do
    timeout 20 "$BIN/oxccl" bench all_reduce --ranks 16 -b 8 -e 32K -f 64 -n 20 -w 5 -c 0 2>&1 | grep -v "^#" |
      sed "s/^/fresh $i /" | tee -a "$LOG"
  done
  compare 90 --ops all_reduce --ranks 16 --sizes 8,1K,32K --reps 7 --iters 20
fi
if wanted ab; then
  # ab_pairs PAIRS EXP ARGS...: `oxccl bench ARGS` with gpu-bin/oxccl and EXP in alternating
  # runs, the order swapped every pair (a drift of the machine falls on both); each line is
  # the bench's last row: out-of-place then in-place time.
  ab_pairs() {
    local pairs=$1 exp=$2 pair b order
    shift 2
    for pair in $(seq "$pairs"); do
      order="$BIN/oxccl $exp"
      [ $((pair % 2)) = 0 ] && order="$exp $BIN/oxccl"
      for b in $order; do
        echo "ab $* pair $pair ${b##*/}: $(timeout 30 "$b" bench "$@" -c 0 2>&1 | last_row)" | tee -a "$LOG"
      done
    done
  }
  exps=("$BIN"/oxccl-exp-*)
  [ -x "${exps[0]}" ] || echo "no $BIN/oxccl-exp-*: build them with scripts/gpu/cpu16_check.sh --build --exp REF" | tee -a "$LOG"
  for exp in "${exps[@]}"; do
    [ -x "$exp" ] || continue
    step "A/B: gpu-bin/oxccl against ${exp##*/}"
    for size in 8 64; do
      ab_pairs 6 "$exp" all_reduce --ranks 2 -b "$size" -e "$size" -n 200000 -w 1000
    done
    for op in broadcast reduce gather scatter; do
      for size in 64 1K 64K; do
        ab_pairs 2 "$exp" "$op" --ranks 16 -b "$size" -e "$size" -n 2000 -w 100
      done
    done
    OXCCL_UNDER_TEST="$exp" compare 60 --ops all_reduce --ranks 2 --sizes 8,64 --reps 5
  done
fi
step done
# Non-zero when a comparison failed (the sweeps record their own exit status).
exit $failed
