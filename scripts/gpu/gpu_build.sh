#!/usr/bin/env bash
# Run HERE (a machine with Rust, no GPU needed): builds the release binaries the GPU check
# runs and puts them in gpu-bin/ (git-ignored), which the device tool carries to the GPU
# machine: `run` with carry ["gpu-bin"] and command `scripts/gpu/gpu_check.sh first`, then the same
# with `scripts/gpu/gpu_check.sh second` (two calls of under 6 minutes each: timeout_s 360).
# `--mpi` builds them with the mpi backend (linked against this machine's Open MPI,
# libmpi.so.40, which the GPU machine's Open MPI 4.1 also provides), as
# scripts/gpu/gpu_staged_check.sh needs.
#
# Usage: scripts/gpu/gpu_build.sh [--mpi]   (from anywhere)
set -euo pipefail
cd "$(dirname "$0")/../.."
features=()
[ "${1:-}" = --mpi ] && features=(--features oxccl-cli/mpi,oxccl-conformance/mpi)
cargo build --release -p oxccl-cli -p oxccl-conformance --bins "${features[@]}"
rel="${CARGO_TARGET_DIR:-target}/release"
mkdir -p gpu-bin
for b in oxccl oxccl-conformance oxccl-failure-probe; do
  cp "$rel/$b" gpu-bin/
  strip gpu-bin/$b 2>/dev/null || true
done
if [ "${1:-}" = --mpi ]; then
  # Open MPI's C reference of scripts/peers (scripts/gpu/gpu_staged_check.sh's `cpu16` step).
  mpicc -O2 -o gpu-bin/ompi_bench scripts/peers/ompi_bench.c
fi
# The core-to-core latency between CPUs 0 and 1 (scripts/gpu/cpu16_check.sh notes it around each
# sweep: a host whose placement of CPUs changes moves the selector's crossovers).
${CC:-cc} -O2 -pthread -o gpu-bin/c2c_latency scripts/peers/c2c_latency.c
du -ch gpu-bin/* | tail -n 4
echo "carry limit: 64 MiB in all"
