#!/usr/bin/env bash
# The GPU check of the nccl backend, run ON the GPU machine from the repository root with the
# binaries of scripts/gpu_build.sh in gpu-bin/ (see ../shared/GPU.md). Several ranks share the
# one GPU through NCCL_HOSTID (scripts/gpu/per_rank_env.sh). Every step runs even when an
# earlier one failed; each prints PASS or FAIL, and the script exits 1 if any failed.
# Everything is logged under $OUT (default ./gpu-check-out).
#
# Usage: scripts/gpu_check.sh [machine] [reference] [conformance] [failures] [speed]
# (default: all; the device tool allows 10 minutes per command, so a later session may run
# `machine reference conformance` in one call and `machine reference failures speed` in the next).
#
#   1. the machine: nvidia-smi, the NCCL library
#   2. the raw reference: scripts/gpu/nccl_allreduce.cu built with nvcc against libnccl
#   3. the conformance suite on OXCCL_BACKEND=nccl, 1, 2 and 4 ranks (host data staged
#      through the GPU, fingerprints on)
#   4. failures: a rank killed with SIGKILL mid-loop (the others must fail within 10 s), a
#      mismatched collective with the fingerprint check (Mismatch on both ranks) and without
#      it (NCCL cannot tell: the job must still end, by Timeout at OXCCL_TIMEOUT or by
#      completing, instead of hanging)
#   5. speed: oxccl bench --backend nccl against the C program and PyTorch, 1, 2 and 4 ranks,
#      all_reduce float sum in place, 8 B to 64 MiB; a table of the ratios
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
OUT="${OUT:-$PWD/gpu-check-out}"
mkdir -p "$OUT"
BIN="${GPU_BIN:-$PWD/gpu-bin}"
WRAP="$PWD/scripts/gpu/per_rank_env.sh"
PY="${PYTHON:-/opt/torch/.venv/bin/python3}"
export PATH="/usr/local/cuda/bin:$PATH"
failed=0
want="${*:-machine reference conformance failures speed}"
wanted() { [[ " $want " == *" $1 "* ]]; }
step() { echo; echo "== $*"; }
verdict() { if [ "$1" = 0 ]; then echo "PASS $2"; else echo "FAIL $2"; failed=1; fi; }

# A port P such that P and P+1 (the store's) are free.
free_port() {
  python3 -c '
import random, socket
while True:
    p = random.randint(20000, 40000)
    try:
        for q in (p, p + 1):
            with socket.socket() as s:
                s.bind(("0.0.0.0", q))
        print(p)
        break
    except OSError:
        pass
'
}

# Starts N ranks of a command as torchrun would (each with its NCCL_HOSTID), waits for all.
ranks() {
  local n=$1; shift
  local port pids=() rc=0
  port=$(free_port)
  for ((r = 0; r < n; r++)); do
    RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      TORCHELASTIC_RUN_ID="gpu-check-$$-$port" "$WRAP" "$@" > "$OUT/rank$r.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  return $rc
}

if wanted machine; then
step "1. the machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/machine.txt"
ls -l /usr/lib/x86_64-linux-gnu/libnccl.so* 2>&1 | tee -a "$OUT/machine.txt"
for b in oxccl oxccl-conformance oxccl-failure-probe; do
  [ -x "$BIN/$b" ] || { echo "missing $BIN/$b: run scripts/gpu_build.sh first and carry gpu-bin"; exit 2; }
done

fi

if wanted reference; then
step "2. the raw reference program"
nvcc -O2 -o "$OUT/nccl_allreduce" scripts/gpu/nccl_allreduce.cu -lnccl > "$OUT/nvcc.log" 2>&1
verdict $? "nvcc nccl_allreduce.cu"
fi

if wanted conformance; then
step "3. conformance on nccl"
for n in 1 2 4; do
  OXCCL_BACKEND=nccl OXCCL_GPU_HOST_BUFFERS=stage OXCCL_GPU_FINGERPRINT=1 OXCCL_CONFORMANCE_QUICK=1 \
    OXCCL_TIMEOUT=60s timeout 420 bash -c "$(declare -f ranks free_port); WRAP=$WRAP OUT=$OUT; ranks $n $BIN/oxccl-conformance"
  rc=$?
  cp "$OUT/rank0.log" "$OUT/conformance-$n.log"
  tail -n 3 "$OUT/conformance-$n.log"
  verdict $rc "conformance, $n rank(s)"
done
fi

if wanted failures; then
step "4. failures"
# A rank killed mid-loop: rank 0 must report an error within 10 s (OXCCL_TIMEOUT is 60 s).
(
  export OXCCL_BACKEND=nccl OXCCL_GPU_HOST_BUFFERS=stage OXCCL_TIMEOUT=60s PROBE_SECONDS=60
  ranks 3 "$BIN/oxccl-failure-probe" loop
) &
job=$!
for _ in $(seq 1 600); do grep -q PROBE-READY "$OUT/rank1.log" 2>/dev/null && break; sleep 0.1; done
victim=$(for p in $(pgrep -f "oxccl-failure-probe loop"); do tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx RANK=1 && echo $p; done | head -n 1)
[ -n "$victim" ] && kill -9 "$victim"
wait $job
for r in 0 2; do cp "$OUT/rank$r.log" "$OUT/kill-rank$r.log"; done
line=$(grep -h PROBE-ERROR "$OUT/kill-rank0.log" | head -n 1)
echo "killed rank 1 (pid ${victim:-none}); rank 0: ${line:-no error reported}"
ms=$(echo "$line" | sed -n 's/.*elapsed_ms=\([0-9]*\).*/\1/p')
[ -n "$victim" ] && [ -n "$ms" ] && [ "$ms" -lt 10000 ]
verdict $? "kill -9: the survivors fail within 10 s (${ms:-?} ms)"
# Mismatched collectives: with the fingerprint check, Mismatch; without, Timeout at the deadline.
rm -f "$OUT"/rank*.log
OXCCL_BACKEND=nccl OXCCL_GPU_HOST_BUFFERS=stage OXCCL_GPU_FINGERPRINT=1 OXCCL_TIMEOUT=20s ranks 2 "$BIN/oxccl-failure-probe" mismatch
grep -h PROBE-ERROR "$OUT"/rank*.log | tee "$OUT/mismatch-checked.log"
[ "$(grep -c 'kind=Mismatch' "$OUT/mismatch-checked.log")" = 2 ]
verdict $? "mismatch with OXCCL_GPU_FINGERPRINT=1: both ranks get Mismatch"
start=$(date +%s)
rm -f "$OUT"/rank*.log
OXCCL_BACKEND=nccl OXCCL_GPU_HOST_BUFFERS=stage OXCCL_TIMEOUT=10s timeout 120 bash -c "$(declare -f ranks free_port); WRAP=$WRAP OUT=$OUT; ranks 2 $BIN/oxccl-failure-probe mismatch"
took=$(( $(date +%s) - start ))
grep -h "PROBE-" "$OUT"/rank*.log | tee "$OUT/mismatch-unchecked.log"
# NCCL cannot see the mismatch: it hangs (then oxccl's deadline ends it with Timeout) or
# completes with meaningless data. Either way the job must end, not hang.
[ "$took" -lt 60 ]
verdict $? "mismatch without the check: the job ends (${took}s) instead of hanging"
rm -f "$OUT"/rank*.log
fi

if wanted speed; then
step "5. speed: oxccl vs NCCL from C vs PyTorch (all_reduce, float sum, in place)"
for n in 1 2 4; do
  ITERS=50 NCCL_ID_FILE="$OUT/nccl-id-$n" ranks $n "$OUT/nccl_allreduce"; rc=$?
  cp "$OUT/rank0.log" "$OUT/c-$n.txt"; rm -f "$OUT/nccl-id-$n"
  verdict $rc "C reference, $n rank(s)"
  OXCCL_BACKEND=nccl ranks $n "$BIN/oxccl" bench all_reduce --backend nccl -b 8 -e 64M -f 8 -n 50 -w 5 -c 0 \
    --json "$OUT/oxccl-$n.json"; rc=$?
  cp "$OUT/rank0.log" "$OUT/oxccl-$n.txt"
  verdict $rc "oxccl bench --backend nccl, $n rank(s)"
  ITERS=50 timeout 600 "$PY" -m torch.distributed.run --nproc-per-node "$n" --master-port "$(free_port)" \
    scripts/gpu/torch_allreduce.py > "$OUT/torch-$n.txt" 2>&1; rc=$?
  verdict $rc "PyTorch dist.all_reduce, $n rank(s)"
done
"$PY" scripts/gpu/summary.py "$OUT" | tee "$OUT/summary.txt"
fi

echo
if [ "$failed" = 0 ]; then echo "GPU CHECK PASSED"; else echo "GPU CHECK FAILED (see above)"; fi
exit $failed
