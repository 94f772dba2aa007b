"""The torch backend ``oxccl`` on CUDA tensors, both ways: on the group's nccl communicator
(the default) and staged through pinned host memory by the cpu backend (a group made while
OXCCL_BACKEND=cpu), each checked against the expected values (work queued on the default
stream and on a side stream included), then timed beside gloo on the same CUDA tensors in the
same run: dist.all_reduce float32 sum in place, loop mean per call.

Run (on a GPU machine, several ranks sharing GPU 0 under MPS):
    python -m torch.distributed.run --nproc-per-node 2 scripts/gpu/torch_oxccl_cuda.py
"""

import os
import time

import torch
import torch.distributed as dist

import oxccl.torch  # noqa: F401


def check(group, label):
    r, n = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", 0)
    x = torch.full((1000,), float(r + 1), device=dev)
    dist.all_reduce(x, group=group)
    assert torch.all(x == n * (n + 1) / 2), x[:4]
    b = torch.full((7,), r, dtype=torch.bfloat16, device=dev)
    out = torch.empty(7 * n, dtype=torch.bfloat16, device=dev)
    dist.all_gather_into_tensor(out, b, group=group)
    assert torch.equal(out.cpu(), torch.arange(n).repeat_interleave(7).to(torch.bfloat16)), out
    big = torch.full((16 << 20,), float(r), device=dev)  # 64 MiB: the pipelined path
    dist.all_reduce(big, group=group)
    assert torch.all(big == n * (n - 1) / 2)
    rs_in = torch.arange(4 * n, dtype=torch.float64, device=dev)
    rs_out = torch.empty(4, dtype=torch.float64, device=dev)
    dist.reduce_scatter_tensor(rs_out, rs_in, group=group)
    assert torch.equal(rs_out.cpu(), (torch.arange(4) + 4 * r).double() * n), rs_out
    bc = torch.full((3,), float(r), device=dev)
    dist.broadcast(bc, src=n - 1, group=group)
    assert torch.all(bc == n - 1)
    # Work queued on the default stream before the call is seen by it.
    y = torch.zeros(1 << 20, device=dev)
    y += r + 1
    dist.all_reduce(y, group=group)
    assert torch.all(y == n * (n + 1) / 2)
    # ... and so is work queued on torch's current stream when that is a side stream.
    side = torch.cuda.Stream(device=dev)
    with torch.cuda.stream(side):
        z = torch.zeros(1 << 22, device=dev)
        z += r + 1
        dist.all_reduce(z, group=group)
        assert torch.all(z == n * (n + 1) / 2)
    w = dist.all_reduce(torch.ones(5, device=dev), async_op=True, group=group)
    w.wait()
    backend = group._cuda[0].backend if group._cuda[0] is not None else "cpu (staged)"
    if r == 0:
        print(f"cuda tensors on oxccl, {label}: checks passed (CUDA tensors on {backend})", flush=True)


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
    # Several ranks on one GPU: NCCL accepts them only as if on separate hosts (socket
    # transport over loopback, so its timings prove behaviour, not NVLink speed).
    os.environ.setdefault("NCCL_HOSTID", f"host{os.environ.get('RANK', '0')}")
    os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    os.environ.setdefault("NCCL_IB_DISABLE", "1")
    torch.cuda.set_device(0)
    dist.init_process_group("oxccl")
    default = dist.distributed_c10d._get_default_group()
    check(default, "default (nccl)")
    staged = dist.new_group(backend="oxccl")
    os.environ["OXCCL_BACKEND"] = "cpu"  # read at the group's first CUDA collective
    check(staged, "OXCCL_BACKEND=cpu (staged)")
    del os.environ["OXCCL_BACKEND"]
    gloo = dist.new_group(backend="gloo")
    if dist.get_rank() == 0:
        print(f"{'size(B)':>10} {'nccl (us)':>10} {'staged (us)':>12} {'gloo (us)':>10} {'gloo/nccl':>10}", flush=True)
    for size, iters in [(8, 500), (4096, 500), (1 << 20, 50), (64 << 20, 8)]:
        t = torch.zeros(size // 4, device="cuda:0")
        o, st, g = timed(t, None, iters), timed(t, staged, iters), timed(t, gloo, iters)
        if dist.get_rank() == 0:
            print(f"{size:>10} {o:>10.1f} {st:>12.1f} {g:>10.1f} {g / o:>10.2f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
