#!/usr/bin/env bash
# A short diagnosis of a hang on the nccl backend, run ON the GPU machine (one rank, ~70 s):
# the bench (collectives only), then one filtered conformance case with NCCL's and oxccl's
# debug logs, whose threads' stacks gdb prints when it is still running after 15 s.
# Usage: scripts/gpu/diagnose.sh [conformance filter]   (logs under $OUT)
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
OUT="${OUT:-$PWD/gpu-diag-out}"
mkdir -p "$OUT"
BIN="${GPU_BIN:-$PWD/gpu-bin}"
export RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1
export NCCL_HOSTID=host0 NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 OXCCL_BACKEND=nccl
echo "== bench, 1 rank"
MASTER_PORT=29611 TORCHELASTIC_RUN_ID=diag-bench NCCL_DEBUG=WARN timeout -k 2 25 \
  "$BIN/oxccl" bench all_reduce --backend nccl -b 8 -e 1M -f 32 -n 5 -w 1 -c 1 > "$OUT/bench.log" 2>&1
echo "bench exit $?"; tail -n 15 "$OUT/bench.log"
echo "== conformance case: ${1:-all_reduce/f32/sum}"
MASTER_PORT=29621 TORCHELASTIC_RUN_ID=diag-conf NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,COLL \
  OXCCL_LOG=oxccl=debug OXCCL_CONFORMANCE_FILTER="${1:-all_reduce/f32/sum}" OXCCL_CONFORMANCE_QUICK=1 \
  OXCCL_TIMEOUT=10s OXCCL_CONFORMANCE_TIMEOUT=10s \
  timeout -k 2 40 "$BIN/oxccl-conformance" > "$OUT/conf.log" 2>&1 &
pid=$!
for _ in $(seq 15); do kill -0 $pid 2>/dev/null || break; sleep 1; done
if kill -0 $pid 2>/dev/null; then
  child=$(pgrep -P $pid | head -n 1)
  echo "still running after 15 s: stacks of $child"
  if command -v gdb > /dev/null; then
    timeout 20 gdb -p "$child" -batch -ex "thread apply all bt 25" > "$OUT/stacks.txt" 2>&1
  else
    for t in /proc/"$child"/task/*; do echo "$t $(cat "$t/comm") $(cat "$t/wchan")"; done > "$OUT/stacks.txt"
  fi
  grep -E "^Thread|^#[0-9]+ .* in (oxccl|nccl|nccl[A-Z]|cuda|std::thread)" "$OUT/stacks.txt" | head -n 80
fi
wait $pid; echo "conformance exit $?"
grep -v "NCCL INFO" "$OUT/conf.log" | tail -n 20
grep "NCCL INFO" "$OUT/conf.log" | tail -n 25
