"""PyTorch's gloo with CUDA tensors (it stages them through host memory), the reference of
issue 11's speed figures: float32 sum all_reduce in place (or all_gather, OP=all_gather),
each call waited for, at the sizes SIZES lists (bytes, comma-separated; default 8 B to 16 MiB by 8x), printing the columns of
scripts/gpu/torch_allreduce.py (time_sync is the loop mean of one call).

Run: python3 -m torch.distributed.run --nproc-per-node N scripts/gpu/torch_gloo.py
"""
import os
import time

import torch
import torch.distributed as dist


def main() -> None:
    iters = int(os.environ.get("ITERS", "20"))
    warmup = int(os.environ.get("WARMUP", "3"))
    sizes = [int(x) for x in os.environ.get("SIZES", ",".join(str(8 << (3 * k)) for k in range(8))).split(",")]
    max_bytes = max(sizes)
    op = os.environ.get("OP", "all_reduce")
    rank = int(os.environ["RANK"])
    torch.cuda.set_device(0)
    dist.init_process_group("gloo")
    n = dist.get_world_size()
    buf = torch.zeros(max_bytes // 4, dtype=torch.float32, device="cuda")
    out = torch.zeros(n * (max_bytes // 4), dtype=torch.float32, device="cuda") if op == "all_gather" else None
    if rank == 0:
        print(f"# torch gloo {op}, CUDA tensors, {n} ranks, float32")
        print(f"{'size(B)':>12} {'count':>12} {'time_sync(us)':>14} {'algbw(GB/s)':>12} {'busbw(GB/s)':>12}")

    def call(t: torch.Tensor) -> None:
        if op == "all_gather":
            dist.all_gather_into_tensor(out[: n * t.numel()], t)
        else:
            dist.all_reduce(t)

    for size in sizes:
        t = buf[: size // 4]
        for _ in range(warmup):
            call(t)
            torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            call(t)
            torch.cuda.synchronize()
        us = (time.perf_counter() - t0) * 1e6 / iters
        algbw = size / us / 1e3
        factor = (2 * (n - 1) / n if op == "all_reduce" else (n - 1) / n) if n > 1 else 1
        if rank == 0:
            print(f"{size:>12} {size // 4:>12} {us:>14.2f} {algbw:>12.3f} {algbw * factor:>12.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
