"""Trains a small model with DistributedDataParallel over the ``oxccl`` backend, then again
over gloo from the same seed and data, and checks that both end with the same parameters.
Run under torchrun:

    python -m torch.distributed.run --nproc-per-node 2 python/examples/ddp_train.py
"""

import torch
import torch.distributed as dist

import oxccl.torch  # noqa: F401  (registers the backend)


def train(backend, steps=30):
    dist.init_process_group(backend)
    me = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(100 + me)
    for _ in range(steps):
        x = torch.randn(16, 8, generator=g)
        y = torch.sin(x.sum(1, keepdim=True))
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    dist.destroy_process_group()
    return params, loss.item()


def main():
    a, loss_a = train("oxccl")
    b, loss_b = train("gloo")
    diff = (a - b).abs().max().item()
    print(f"ddp: oxccl loss {loss_a:.6f}, gloo loss {loss_b:.6f}, max parameter difference {diff:.2e}")
    assert diff < 1e-5, diff


if __name__ == "__main__":
    main()
