#!/usr/bin/env bash
# The `mpi` backend under a real MPI launcher:
#   1. builds oxccl-conformance and the oxccl CLI with `--features mpi` (release);
#   2. runs the conformance suite (the same one every backend runs) under
#      `mpirun -np 2`, `-np 3` and `-np 4` with OXCCL_BACKEND=mpi, and checks that each
#      ends with `conformance: N passed, 0 failed`;
#   2b. the quick matrix at -np 2 with every buffer staged (OXCCL_MPI_FORCE_STAGING=1);
#   3. a rank that skips a collective and ranks that call different ones (the failure probe,
#      mpirun -np 3 and 2): every rank dumps its flight recorder and `oxccl trace analyze` names
#      the rank and the collective;
#   4. runs `oxccl bench --backend mpi` under `mpirun -np 2`;
#   5. compares the `cpu` and `mpi` backends on the same sizes in one run (bus bandwidth
#      side by side, out-of-place, per size).
# Prints SKIP and exits 0 where `mpirun` is missing.
#
# Environment: OXCCL_MPI_NP4_QUICK=1 runs the reduced matrix at -np 4;
# OXCCL_MPI_BENCH_MAX (default 16M) is the largest benchmark size. CI runs it.
#
# Usage: scripts/ci/mpi_conformance.sh   (from anywhere)
set -euo pipefail
cd "$(dirname "$0")/../.."

if ! command -v mpirun >/dev/null 2>&1; then
    echo "SKIP: mpirun not found (apt-get install openmpi-bin libopenmpi-dev libclang-dev clang)"
    exit 0
fi

cargo build --release --locked -p oxccl-conformance -p oxccl-cli --features mpi

CONF="${CARGO_TARGET_DIR:-target}/release/oxccl-conformance"
OXCCL="${CARGO_TARGET_DIR:-target}/release/oxccl"
MPIRUN=(mpirun)
if mpirun --version 2>&1 | grep -q "Open MPI"; then
    MPIRUN+=(--allow-run-as-root --oversubscribe -x OXCCL_BACKEND -x OXCCL_CONFORMANCE_QUICK)
fi
export OXCCL_BACKEND=mpi
fail=0
# The suite's error cases fail operations on purpose and the flight recorder dumps every
# failure, one file per rank: into a directory of this run, removed at the end, not /tmp
# (about a thousand files per run piled up there).
OXCCL_FR_DIR=$(mktemp -d)
export OXCCL_FR_DIR
trap 'rm -rf "$OXCCL_FR_DIR"' EXIT
if [ "${#MPIRUN[@]}" -gt 1 ]; then
    MPIRUN+=(-x OXCCL_FR_DIR)
fi

for np in 2 3 4; do
    export OXCCL_CONFORMANCE_QUICK=0
    if [ "$np" = 4 ] && [ "${OXCCL_MPI_NP4_QUICK:-0}" = 1 ]; then
        export OXCCL_CONFORMANCE_QUICK=1
    fi
    start=$(date +%s)
    out=$(timeout 300 "${MPIRUN[@]}" -np "$np" "$CONF" 2>&1) || true
    line=$(grep '^conformance:' <<<"$out" | tail -n 1 || true)
    echo "mpi conformance -np $np: ${line:-no result} ($(($(date +%s) - start))s)"
    if ! grep -Eq '^conformance: [0-9]+ passed, 0 failed' <<<"$line"; then
        echo "$out" | tail -n 60
        fail=1
    fi
done
unset OXCCL_CONFORMANCE_QUICK

# Device buffers staged through pinned host temporaries (staging/whole.rs), forced on host
# buffers: the quick matrix at -np 2.
start=$(date +%s)
out=$(OXCCL_MPI_FORCE_STAGING=1 OXCCL_CONFORMANCE_QUICK=1 timeout 300 "${MPIRUN[@]}" -x OXCCL_MPI_FORCE_STAGING -np 2 "$CONF" 2>&1) || true
line=$(grep '^conformance:' <<<"$out" | tail -n 1 || true)
echo "mpi conformance -np 2, every buffer staged: ${line:-no result} ($(($(date +%s) - start))s)"
if ! grep -Eq '^conformance: [0-9]+ passed, 0 failed' <<<"$line"; then
    echo "$out" | tail -n 60
    fail=1
fi

# The flight recorder on the mpi backend: ranks that disagree write their dumps and
# `oxccl trace analyze` names the rank and the collective.
PROBE="${CARGO_TARGET_DIR:-target}/release/oxccl-failure-probe"
flight_recorder_case() { # scenario, ranks, text the analysis must show
    local dir out
    dir=$(mktemp -d)
    # A failed rank lingers 3 s before it exits (mpirun then stops the job): the others find
    # the failure in that time.
    OXCCL_FR_DIR="$dir" PROBE_BACKEND=mpi PROBE_LINGER_MS=3000 OXCCL_TIMEOUT=10s timeout 120 "${MPIRUN[@]}" \
        -x OXCCL_FR_DIR -x PROBE_BACKEND -x PROBE_LINGER_MS -x OXCCL_TIMEOUT -np "$2" "$PROBE" "$1" >/dev/null 2>&1 || true
    out=$("$OXCCL" trace analyze "$dir" 2>&1) && { echo "$out"; echo "FAIL: no problem found in the $1 dumps"; fail=1; }
    if grep -qF "$3" <<<"$out"; then
        echo "mpi flight recorder, $1 on $2 ranks: $(grep -F "$3" <<<"$out" | head -n 1)"
    else
        echo "$out"
        echo "FAIL: the analysis of the $1 dumps does not say: $3"
        fail=1
    fi
    rm -rf "$dir"
}
echo
echo "== flight recorder dumps and their analysis on the mpi backend"
flight_recorder_case skip 3 "rank 1 called barrier(u8 × 0) (seq 2)"
flight_recorder_case mismatch 2 "rank 1 called all_gather"

MAX=${OXCCL_MPI_BENCH_MAX:-16M}
echo
echo "== oxccl bench --backend mpi (mpirun -np 2)"
timeout 300 "${MPIRUN[@]}" -np 2 "$OXCCL" bench --backend mpi -b 8 -e "$MAX" -f 8 all_reduce all_gather || fail=1

# Comparing backends: the same sizes on `cpu` and `mpi`, one after the other in this run.
echo
echo "== cpu vs mpi: all_reduce busbw (GB/s, out-of-place), 2 ranks under mpirun, same sizes"
bench_rows() {
    timeout 300 "${MPIRUN[@]}" -np 2 "$OXCCL" bench --backend "$1" -b 8 -e "$MAX" -f 8 all_reduce 2>/dev/null |
        awk '$1 ~ /^[0-9]+$/ && NF >= 9 { print $1, $8 }'
}
cpu_rows=$(bench_rows cpu) || fail=1
mpi_rows=$(bench_rows mpi) || fail=1
join <(sort -k1,1 <<<"$cpu_rows") <(sort -k1,1 <<<"$mpi_rows") | sort -n |
    awk 'BEGIN { printf "%12s %10s %10s %10s\n", "size(B)", "cpu", "mpi", "mpi/cpu" }
         { r = ($2 > 0) ? $3 / $2 : 0; printf "%12s %10s %10s %10.2f\n", $1, $2, $3, r }'

if [ "$fail" != 0 ]; then
    echo "mpi_conformance: FAILED"
    exit 1
fi
echo "mpi_conformance: OK"
