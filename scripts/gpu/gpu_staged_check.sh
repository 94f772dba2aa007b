#!/usr/bin/env bash
# The GPU check of issue 11 (device buffers on the host backends), run ON the GPU machine
# from the repository root with the binaries of `scripts/gpu/gpu_build.sh --mpi` in gpu-bin/
# (see docs/gpu.md). Every step runs even when an earlier one failed; each prints PASS
# or FAIL, and the script exits 1 if any failed. Everything is logged under $OUT.
#
# Usage: [GPU_MPS=1] scripts/gpu/gpu_staged_check.sh [info] [conformance] [mpi] [speed] [cpu16]
#        (default: all steps). GPU_MPS=1 runs everything under NVIDIA MPS (the daemon is
#        started first and stopped at the end): the ranks share the GPU instead of taking turns,
#        which is what several ranks on one GPU want (docs/gpu.md has the figures).
#
#   info         oxccl info (human and --json), also under mpirun with CUDA support on
#   conformance  the conformance suite with every buffer on cuda:0 (OXCCL_CONFORMANCE_DEVICE)
#                over the cpu backend: 2, 4 and 8 ranks sharing the GPU
#   mpi          the same over the mpi backend, 2 ranks, staged (OXCCL_MPI_CUDA_AWARE=no);
#                what Open MPI says of its CUDA support (ompi_info, its own benchmark with
#                opal_cuda_support 1): the CUDA-aware path needs an Open MPI built with CUDA
#   speed        all_reduce float sum on cuda:0 vs host buffers (same backend, same run) vs
#                PyTorch gloo with CUDA tensors, 2 ranks (and 4 at 64 MiB); 1 rank and 2
#                threads of one process on cuda:0; the mpi backend staged and on host;
#                scripts/gpu/staged_summary.py prints the ratios
#   ops          every pipelined collective (all_reduce, reduce, broadcast, all_gather,
#                reduce_scatter) at 16 and 64 MiB on cuda:0 vs host, results checked, 2 ranks;
#                gloo's all_gather on CUDA tensors at 64 MiB
#   cpu16        issue 10 on 16 cores: the cpu backend (host buffers) beside Open MPI's C
#                API, all_reduce at 2 and 16 ranks, steady and in the first 20 iterations
#                (the `steady first` steps of scripts/gpu/cpu16_check.sh, the whole check of issue 10)
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
OUT="${OUT:-$PWD/gpu-check-out}"
mkdir -p "$OUT"
BIN="${GPU_BIN:-$PWD/gpu-bin}"
PY="${PYTHON:-/opt/torch/.venv/bin/python3}"
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --bind-to none)
failed=0
want="${*:-info conformance mpi speed ops cpu16}"
wanted() { [[ " $want " == *" $1 "* ]]; }
step() { echo; echo "== $* ($(date +%T))"; }
verdict() { if [ "$1" = 0 ]; then echo "PASS $2"; else echo "FAIL $2"; failed=1; fi; }
for b in oxccl oxccl-conformance; do
  [ -x "$BIN/$b" ] || { echo "missing $BIN/$b: run scripts/gpu/gpu_build.sh --mpi first and carry gpu-bin"; exit 2; }
done
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/machine.txt"
if [ "${GPU_MPS:-0}" = 1 ]; then
  if nvidia-cuda-mps-control -d; then
    trap 'echo quit | nvidia-cuda-mps-control' EXIT
    sleep 1
    echo "NVIDIA MPS started" | tee -a "$OUT/machine.txt"
  else
    echo "FAIL could not start NVIDIA MPS"; failed=1
  fi
fi

if wanted info; then
  step "info"
  "$BIN/oxccl" info > "$OUT/info.txt" 2>&1; verdict $? "oxccl info"
  cat "$OUT/info.txt"
  "$BIN/oxccl" info --json > "$OUT/info.json" 2>&1; verdict $? "oxccl info --json"
  timeout 60 "${MPIRUN[@]}" -np 1 --mca opal_cuda_support 1 "$BIN/oxccl" info > "$OUT/info-mpirun.txt" 2>&1
  verdict $? "oxccl info under mpirun (opal_cuda_support 1)"
  grep -i -A3 "mpi" "$OUT/info-mpirun.txt" | head -n 20
fi

# The last line of each rank-0 summary, and the verdict of a conformance run.
conf() {
  local name=$1; shift
  timeout 100 "$@" > "$OUT/conf-$name.log" 2>&1; local rc=$?
  grep -E "passed|failed|cases" "$OUT/conf-$name.log" | tail -n 3
  [ $rc = 0 ] || tail -n 30 "$OUT/conf-$name.log"
  verdict $rc "conformance on cuda:0, $name"
}

if wanted conformance; then
  step "conformance, cpu backend, buffers on cuda:0"
  for n in 2 4 8; do
    OXCCL_BACKEND=cpu OXCCL_CONFORMANCE_DEVICE=cuda:0 OXCCL_CONFORMANCE_QUICK=1 \
      conf "cpu-$n" "$BIN/oxccl" run -n "$n" --timeout 90 -- "$BIN/oxccl-conformance"
  done
fi

if wanted mpi; then
  step "conformance, mpi backend, buffers on cuda:0"
  # Is this Open MPI CUDA-aware? Its own answer, and its own C benchmark with CUDA support
  # asked for (a CUDA-aware run of oxccl needs an Open MPI that passes this).
  { command -v ompi_info && ompi_info | grep -i -E "cuda|MCA btl: smcuda|extensions"; } > "$OUT/ompi-cuda.txt" 2>&1
  timeout 60 "${MPIRUN[@]}" -np 2 --mca opal_cuda_support 1 "$BIN/ompi_bench" all_reduce 8 10 2 >> "$OUT/ompi-cuda.txt" 2>&1
  echo "ompi_bench with opal_cuda_support 1: exit $?" >> "$OUT/ompi-cuda.txt"
  grep -v "^-*$" "$OUT/ompi-cuda.txt" | head -n 30
  conf "mpi-staged" "${MPIRUN[@]}" -np 2 -x OXCCL_BACKEND=mpi -x OXCCL_MPI_CUDA_AWARE=no \
    -x OXCCL_CONFORMANCE_DEVICE=cuda:0 -x OXCCL_CONFORMANCE_QUICK=1 -x OXCCL_LOG=info "$BIN/oxccl-conformance"
  grep -i -m 3 "cuda" "$OUT/conf-mpi-staged.log"
fi

# oxccl bench NAME [launcher...] -- [bench args...]: all_reduce float sum, small sizes (8 B to
# 32 KiB, 200 iterations) into NAME-small.json and large ones (1 to 64 MiB, 10) into
# NAME-large.json; prints both tables.
obench() {
  local name=$1; shift
  local launch=()
  while [ "$1" != -- ]; do launch+=("$1"); shift; done; shift
  local part rc=0
  for part in small large; do
    local sz=(-b 8 -e 32K -f 8 -n 200 -w 20)
    [ $part = large ] && sz=(-b 1M -e 64M -f 4 -n 10 -w 2)
    timeout 120 "${launch[@]}" "$BIN/oxccl" bench all_reduce "${sz[@]}" "$@" --json "$OUT/$name-$part.json" \
      > "$OUT/$name-$part.txt" 2>&1 || rc=1
    grep -a -v "^#  \|^\[rank [1-9]" "$OUT/$name-$part.txt" | grep -a -E "^ *[0-9]|rror" | head -n 20
  done
  verdict $rc "bench $name"
}

if wanted speed; then
  step "speed: all_reduce float sum on the cpu backend: buffers on cuda:0 vs host"
  obench cpu-cuda-2 -- --ranks 2 --device cuda:0
  obench cpu-host-2 -- --ranks 2 --device cpu
  obench cpu-cuda-1 -- --ranks 1 --device cuda:0
  # Two ranks as threads of one process: one CUDA context, no time-slicing between processes.
  obench local-cuda-2 -- --ranks 2 --backend local --device cuda:0
  for dev in cuda:0 cpu; do
    timeout 120 "$BIN/oxccl" bench --ranks 4 all_reduce -b 64M -e 64M -n 10 -w 2 --device "$dev" \
      --json "$OUT/cpu-${dev%:0}-4-large.json" > "$OUT/cpu-$dev-4.txt" 2>&1; verdict $? "oxccl bench --device $dev, 4 ranks"
  done
  step "speed: PyTorch gloo, CUDA tensors"
  for n in 2 4; do
    sizes=8,64,512,4096,32768,1048576,4194304,16777216,67108864; [ $n = 4 ] && sizes=8,67108864
    ITERS=10 SIZES=$sizes timeout 180 "$PY" -m torch.distributed.run --nproc-per-node $n \
      --master-port $((29500 + n)) scripts/gpu/torch_gloo.py > "$OUT/gloo-$n.txt" 2>&1; rc=$?
    grep -v "^W\|^\*" "$OUT/gloo-$n.txt" | tail -n 10; verdict $rc "torch gloo, $n ranks"
  done
  step "speed: mpi backend, buffers on cuda:0, 2 ranks (staged: this Open MPI is not CUDA-aware)"
  obench mpi-staged-2 "${MPIRUN[@]}" -np 2 -x OXCCL_MPI_CUDA_AWARE=no -- --backend mpi --device cuda:0
  obench mpi-host-2 "${MPIRUN[@]}" -np 2 -- --backend mpi --device cpu
  python3 scripts/gpu/staged_summary.py "$OUT" | tee "$OUT/summary.txt"
fi

if wanted ops; then
  step "every pipelined collective, 2 ranks, cuda:0 vs host"
  for dev in cuda:0 cpu; do
    timeout 120 "$BIN/oxccl" bench --ranks 2 all_reduce reduce broadcast all_gather reduce_scatter -b 16M -e 64M \
      -n 8 -w 2 --device "$dev" --json "$OUT/ops-${dev%:0}-2.json" > "$OUT/ops-${dev%:0}-2.txt" 2>&1; rc=$?
    grep -a -E "^# [a-z_]+$|^ +[0-9]|Out of bounds|rror" "$OUT/ops-${dev%:0}-2.txt"; verdict $rc "all ops --device $dev"
  done
  OP=all_gather ITERS=5 SIZES=16777216,67108864 timeout 120 "$PY" -m torch.distributed.run --nproc-per-node 2 \
    --master-port 29544 scripts/gpu/torch_gloo.py > "$OUT/gloo-ag-2.txt" 2>&1; rc=$?
  grep -E "^ +[0-9]|rror" "$OUT/gloo-ag-2.txt"; verdict $rc "torch gloo all_gather"
fi

if wanted cpu16; then
  step "cpu backend vs Open MPI (C), 16 cores"
  # scripts/gpu/cpu16_check.sh's all_reduce steps: steady state and the first 20 iterations.
  OUT="$OUT/cpu16" GPU_BIN="$BIN" timeout 240 scripts/gpu/cpu16_check.sh steady first
  verdict $? "compare with Open MPI, steady and first 20 iterations"
fi

echo
if [ "$failed" = 0 ]; then echo "GPU STAGED CHECK PASSED"; else echo "GPU STAGED CHECK FAILED (see above)"; fi
exit $failed
