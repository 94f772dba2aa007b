"""The torch backend ``oxccl`` on CUDA tensors (staged through pinned host memory by the
cpu backend), checked against the expected values, then timed beside gloo on the same CUDA
tensors in the same run: dist.all_reduce float32 sum in place, loop mean per call.

Run (on a GPU machine, several ranks sharing GPU 0 under MPS):
    python -m torch.distributed.run --nproc-per-node 2 scripts/gpu/torch_oxccl_cuda.py
"""

import time

import torch
import torch.distributed as dist

import oxccl.torch  # noqa: F401


def check():
    r, n = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", 0)
    x = torch.full((1000,), float(r + 1), device=dev)
    dist.all_reduce(x)
    assert torch.all(x == n * (n + 1) / 2), x[:4]
    b = torch.full((7,), r, dtype=torch.bfloat16, device=dev)
    out = torch.empty(7 * n, dtype=torch.bfloat16, device=dev)
    dist.all_gather_into_tensor(out, b)
    assert torch.equal(out.cpu(), torch.arange(n).repeat_interleave(7).to(torch.bfloat16)), out
    big = torch.full((16 << 20,), float(r), device=dev)  # 64 MiB: the pipelined path
    dist.all_reduce(big)
    assert torch.all(big == n * (n - 1) / 2)
    rs_in = torch.arange(4 * n, dtype=torch.float64, device=dev)
    rs_out = torch.empty(4, dtype=torch.float64, device=dev)
    dist.reduce_scatter_tensor(rs_out, rs_in)
    assert torch.equal(rs_out.cpu(), (torch.arange(4) + 4 * r).double() * n), rs_out
    bc = torch.full((3,), float(r), device=dev)
    dist.broadcast(bc, src=n - 1)
    assert torch.all(bc == n - 1)
    # Work queued on the default stream before the call is seen by it.
    y = torch.zeros(1 << 20, device=dev)
    y += r + 1
    dist.all_reduce(y)
    assert torch.all(y == n * (n + 1) / 2)
    w = dist.all_reduce(torch.ones(5, device=dev), async_op=True)
    w.wait()
    if r == 0:
        print("cuda tensors on oxccl: checks passed", flush=True)


def timed(t, group, iters):
    for _ in range(3):
        dist.all_reduce(t, group=group)
    torch.cuda.synchronize()
    dist.barrier(group=group)
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(t, group=group)
    torch.cuda.synchronize()
    us = torch.tensor([(time.perf_counter() - t0) * 1e6 / iters])
    dist.all_reduce(us, op=dist.ReduceOp.MAX)
    return us.item()


def main():
    dist.init_process_group("oxccl")
    check()
    gloo = dist.new_group(backend="gloo")
    if dist.get_rank() == 0:
        print(f"{'size(B)':>10} {'oxccl cuda (us)':>16} {'gloo cuda (us)':>15} {'gloo/oxccl':>11}", flush=True)
    for size, iters in [(8, 500), (4096, 500), (1 << 20, 50), (64 << 20, 8)]:
        t = torch.zeros(size // 4, device="cuda:0")
        o, g = timed(t, None, iters), timed(t, gloo, iters)
        if dist.get_rank() == 0:
            print(f"{size:>10} {o:>16.1f} {g:>15.1f} {g / o:>11.2f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
