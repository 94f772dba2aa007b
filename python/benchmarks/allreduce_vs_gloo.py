"""dist.all_reduce (float32 sum, in place) through the ``oxccl`` backend and through gloo,
side by side in one run, interleaved size by size (each measurement: the loop mean of one
call, the maximum over ranks; the median of REPS rounds). Python's per-call overhead is part
of both. Run under torchrun:

    python -m torch.distributed.run --nproc-per-node 2 python/benchmarks/allreduce_vs_gloo.py

Environment: SIZES (bytes, comma-separated; default 8 B to 64 MiB by 8x), REPS (default 3),
TIME_MS (per measurement, default 200).
"""

import os
import statistics
import time

import torch
import torch.distributed as dist

import oxccl.torch  # noqa: F401  (registers the backend)


def timed(t, group, time_ms):
    """Loop-mean µs of one all_reduce of ``t`` on ``group`` (max over ranks)."""
    for _ in range(3):
        dist.all_reduce(t, group=group)
    # Agree on an iteration count from a probe of fixed length, so every rank runs the
    # same loop.
    probe = 5
    t0 = time.perf_counter()
    for _ in range(probe):
        dist.all_reduce(t, group=group)
    est = torch.tensor([(time.perf_counter() - t0) / probe])
    dist.all_reduce(est, op=dist.ReduceOp.MAX, group=group)
    iters = max(3, min(100000, int(time_ms / 1000 / est.item())))
    dist.barrier(group=group)
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(t, group=group)
    us = torch.tensor([(time.perf_counter() - t0) * 1e6 / iters])
    dist.all_reduce(us, op=dist.ReduceOp.MAX, group=group)
    return us.item()


def main():
    dist.init_process_group("oxccl")
    gloo = dist.new_group(backend="gloo")
    n, me = dist.get_world_size(), dist.get_rank()
    sizes = [int(s) for s in os.environ.get("SIZES", ",".join(str(8 << (3 * k)) for k in range(9))).split(",")]
    reps, time_ms = int(os.environ.get("REPS", "3")), float(os.environ.get("TIME_MS", "200"))
    if me == 0:
        print(f"# dist.all_reduce float32 sum in place, {n} ranks, µs per call (loop mean, max over ranks, "
              f"median of {reps})")
        print(f"{'size(B)':>10} {'oxccl':>10} {'gloo':>10} {'gloo/oxccl':>11}")
    # Start-up (thread starts, page faults, the first connections) belongs to no row.
    warm = torch.zeros(1024)
    for group in (None, gloo):
        for _ in range(200):
            dist.all_reduce(warm, group=group)
    for size in sizes:
        t = torch.zeros(max(1, size // 4))
        ox, gl = [], []
        for _ in range(reps):
            ox.append(timed(t, None, time_ms))
            gl.append(timed(t, gloo, time_ms))
        o, g = statistics.median(ox), statistics.median(gl)
        if me == 0:
            print(f"{size:>10} {o:>10.2f} {g:>10.2f} {g / o:>11.1f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
