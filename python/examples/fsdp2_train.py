"""Trains a small model with FSDP2 (``fully_shard``) on a CPU device mesh over the ``oxccl``
backend, then again over gloo from the same seed and data, and checks that both end with the
same parameters. Run under torchrun:

    python -m torch.distributed.run --nproc-per-node 2 python/examples/fsdp2_train.py
"""

import gc

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import oxccl.torch  # noqa: F401  (registers the backend)


def train(backend, steps=10):
    dist.init_process_group(backend)
    me, n = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (n,))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1000 + me)
    for _ in range(steps):
        x = torch.randn(8, 16, generator=g)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    full = torch.cat([p.full_tensor().detach().flatten() for p in model.parameters()])
    last = loss.item()
    # Free the sharded model (its parameters, gradients and the collectives' handles) while
    # the interpreter runs: left to the garbage collection at exit, a group's worker thread
    # (gloo's) may release a Python object after finalization began, and Python ends that
    # thread in a way C++ cannot unwind (`terminate called without an active exception`).
    del model, opt, loss, x
    gc.collect()
    dist.destroy_process_group()
    return full, last


def main():
    a, loss_a = train("oxccl")
    b, loss_b = train("gloo")
    diff = (a - b).abs().max().item()
    print(f"fsdp2: oxccl loss {loss_a:.6f}, gloo loss {loss_b:.6f}, max parameter difference {diff:.2e}")
    assert diff < 1e-5, diff


if __name__ == "__main__":
    main()
