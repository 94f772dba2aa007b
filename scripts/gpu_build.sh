#!/usr/bin/env bash
# Run HERE (a machine with Rust, no GPU needed): builds the release binaries the GPU check
# runs and puts them in gpu-bin/ (git-ignored), which the device tool carries to the GPU
# machine: `run` with carry ["gpu-bin"] and command `scripts/gpu_check.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p oxccl-cli -p oxccl-conformance --bins
rel="${CARGO_TARGET_DIR:-target}/release"
mkdir -p gpu-bin
for b in oxccl oxccl-conformance oxccl-failure-probe; do
  cp "$rel/$b" gpu-bin/
  strip gpu-bin/$b 2>/dev/null || true
done
du -ch gpu-bin/* | tail -n 4
echo "carry limit: 64 MiB in all"
