"""PyTorch's dist.all_reduce on NCCL in the loop `oxccl bench` runs (float32 sum, in place,
each call waited for), printing the same columns as nccl_allreduce.cu.

Run: python3 -m torch.distributed.run --nproc-per-node N scripts/gpu/torch_allreduce.py
(scripts/gpu/gpu_check.sh starts the ranks itself, with RANK, WORLD_SIZE, MASTER_ADDR/PORT as
torchrun sets them and NCCL_HOSTID per rank so several ranks share one GPU; ITERS and WARMUP
set the iterations.)
"""
import os
import time

import torch
import torch.distributed as dist


def main() -> None:
    iters = int(os.environ.get("ITERS", "50"))
    warmup = int(os.environ.get("WARMUP", "5"))
    max_bytes = int(os.environ.get("MAX_MB", "64")) << 20
    rank = int(os.environ["RANK"])
    os.environ.setdefault("NCCL_HOSTID", f"host{rank}")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
    n = dist.get_world_size()
    buf = torch.zeros(max_bytes // 4, dtype=torch.float32, device="cuda")
    if rank == 0:
        print(f"{'size(B)':>12} {'count':>12} {'time_sync(us)':>14} {'time_queued(us)':>16} {'algbw(GB/s)':>12} {'busbw(GB/s)':>12}")
    size = 8
    while size <= max_bytes:
        t = buf[: size // 4]
        for _ in range(warmup):
            dist.all_reduce(t)
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
            torch.cuda.synchronize()
        sync_us = (time.perf_counter() - t0) * 1e6 / iters
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
        torch.cuda.synchronize()
        queued_us = (time.perf_counter() - t0) * 1e6 / iters
        algbw = size / sync_us / 1e3
        busbw = algbw * (2 * (n - 1) / n if n > 1 else 1)
        if rank == 0:
            print(f"{size:>12} {size // 4:>12} {sync_us:>14.2f} {queued_us:>16.2f} {algbw:>12.3f} {busbw:>12.3f}")
        size *= 8
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
