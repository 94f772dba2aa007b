"""Recovery without restart against torchrun's restart, side by side in one run.

    python python/benchmarks/recovery_vs_torchrun.py [--trials 5] [--ranks 4] [--backend gloo]

The same data-parallel training loop (an MLP of about 2 million parameters, its gradients
all-reduced as one tensor per step) runs two ways, one after the other in every trial with
the same victim and the same step:

- ``oxccl``: under ``oxccl run --max-restarts 1``, on an oxccl communicator. When the victim
  kills itself (SIGKILL) the survivors' step fails, they ``agree`` and ``shrink``, and redo
  the step; a replacement joins later (``grow``), which is not timed.
- ``torchrun``: under ``torchrun --max-restarts 1`` on ``torch.distributed`` (``--backend``,
  gloo by default), with a checkpoint (model and optimizer, ``torch.save``) written by rank 0
  after every step. When the victim dies torchrun stops every worker and starts them all
  again; they load the checkpoint and redo the step. (Each attempt's group meets under a
  store prefix of its own: torchrun 2.15 gives every attempt the same store and no prefix,
  and a restarted gloo group read the first attempt's addresses.)

Timed: from the victim's SIGKILL (the time it prints just before) to the first step any rank
completes after it. Prints every trial, then min / median / max per way and the ratio of the
medians (issue 39's target: oxccl at least 10x faster). Needs torch, the oxccl package and
``oxccl`` (the launcher; ``cargo build --release -p oxccl-cli``; ``--oxccl`` says where).
"""

import argparse
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

WIDTH = 1024


def build(torch):
    torch.manual_seed(0)
    nn = torch.nn
    model = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, 1))
    return model, torch.optim.SGD(model.parameters(), lr=1e-4)


def gradient(torch, model, step, member, size):
    """This member's shard of the step's batch (sample s goes to member s % size)."""
    g = torch.Generator().manual_seed(step)
    x = torch.randn(64, WIDTH, generator=g)[member::size]
    y = x.sum(1, keepdim=True)
    model.zero_grad()
    torch.nn.functional.mse_loss(model(x), y, reduction="sum").backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def apply(torch, model, opt, flat, size):
    at = 0
    for p in model.parameters():
        n = p.numel()
        p.grad.copy_(flat[at:at + n].view_as(p.grad)).div_(size)
        at += n
    opt.step()


def say(*words):
    print(*words, flush=True)


def die(step):
    say("KILL", f"{time.time():.6f}", step)
    os.kill(os.getpid(), signal.SIGKILL)


def run_oxccl(args):
    import torch

    import oxccl

    joined = os.environ.get("OXCCL_JOIN") == "1"
    comm = oxccl.init()
    first_size, first_rank = comm.world_size, comm.rank
    model, opt = build(torch)
    params = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
    state = torch.zeros(1 + params.numel())  # [step, parameters...]: what a newcomer learns
    if joined:
        comm.broadcast(state, 0)
        torch.nn.utils.vector_to_parameters(state[1:], model.parameters())
    step = int(state[0])
    waited = None
    while step < args.steps or comm.world_size < first_size:
        if step >= args.steps:  # every step done: wait for the replacement to join
            waited = waited or time.monotonic()
            if time.monotonic() - waited > 60:
                sys.exit("no replacement joined within 60 s")
            time.sleep(0.01)
            a = comm.agree(1)
        else:
            if not joined and first_rank == args.victim and step == args.kill_step:
                die(step)
            flat = gradient(torch, model, step, comm.rank, comm.world_size)
            try:
                comm.all_reduce(flat)
                ok = 1
            except (oxccl.PeerLostError, oxccl.AbortedError, oxccl.RevokedError, oxccl.TimeoutError):
                ok = 0
            a = comm.agree(ok)  # did every member finish the step?
            if a.flag == 0 or a.failed:
                comm = comm.shrink()
                continue
            apply(torch, model, opt, flat, comm.world_size)
            step += 1
            say("STEP", step, f"{time.time():.6f}", comm.world_size)
        if a.joiners:
            comm = comm.grow(a.joiners)
            state[0] = step
            state[1:] = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
            comm.broadcast(state, 0)


def run_torchrun(args):
    import torch
    import torch.distributed as dist

    if args.backend == "oxccl":
        import oxccl.torch  # noqa: F401
    # torchrun (2.15) hands every attempt the same store and no prefix of its own, so a
    # restarted gloo group would read the last attempt's addresses ("Connection refused"):
    # each attempt meets under a prefix of its own.
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
    dist.init_process_group(args.backend, store=dist.PrefixStore(f"attempt/{attempt}", store), rank=rank,
                            world_size=size)
    first_attempt = attempt == "0"
    model, opt = build(torch)
    ckpt = os.path.join(args.dir, "checkpoint.pt")
    step = 0
    if os.path.exists(ckpt):
        saved = torch.load(ckpt)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optim"])
        step = saved["step"]
    while step < args.steps:
        if first_attempt and rank == args.victim and step == args.kill_step:
            die(step)
        flat = gradient(torch, model, step, rank, size)
        dist.all_reduce(flat)
        apply(torch, model, opt, flat, size)
        step += 1
        if rank == 0:
            torch.save({"model": model.state_dict(), "optim": opt.state_dict(), "step": step}, ckpt + ".tmp")
            os.replace(ckpt + ".tmp", ckpt)
        say("STEP", step, f"{time.time():.6f}", size)
    dist.barrier()
    dist.destroy_process_group()


def measure(out):
    """Seconds from the kill to the first completion of the step the victim died in (a rank
    prints ``STEP n`` when it has done n steps), or None."""
    kill = re.search(r"KILL (\d+\.\d+) (\d+)", out)
    if not kill:
        return None
    t, step = float(kill.group(1)), int(kill.group(2))
    after = [float(m.group(2)) for m in re.finditer(r"STEP (\d+) (\d+\.\d+)", out) if int(m.group(1)) > step]
    return min(after) - t if after else None


def trial(args, way, victim, kill_step):
    work = tempfile.mkdtemp(prefix="recovery-vs-torchrun-")
    me = [sys.executable, os.path.abspath(__file__), "--worker", way, "--steps", str(args.steps), "--victim",
          str(victim), "--kill-step", str(kill_step), "--dir", work, "--backend", args.backend]
    if way == "oxccl":
        cmd = [args.oxccl, "run", "-n", str(args.ranks), "--max-restarts", "1", "--"] + me
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(args.ranks),
               "--max-restarts", "1", "--monitor-interval", "0.1"] + me[1:]
    env = {k: v for k, v in os.environ.items() if not k.startswith("OXCCL_")}
    env.update(OXCCL_TIMEOUT="30s", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    started = time.monotonic()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    shutil.rmtree(work, ignore_errors=True)
    out = done.stdout + done.stderr
    took = measure(out)
    if done.returncode != 0 or took is None:
        tail = "\n".join(line for line in out.splitlines() if "rank" in line or "Error" in line)[-8000:]
        raise SystemExit(f"{way} trial failed (exit {done.returncode}, victim {victim}, step {kill_step}):\n{tail}")
    return took, time.monotonic() - started


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--backend", default="gloo", help="torch.distributed backend under torchrun (gloo or oxccl)")
    p.add_argument("--oxccl", default=shutil.which("oxccl") or os.path.join(
        os.path.dirname(__file__), "..", "..", "target", "release", "oxccl"))
    p.add_argument("--seed", type=int, default=int(time.time()))
    p.add_argument("--worker", choices=["oxccl", "torchrun"], help=argparse.SUPPRESS)
    p.add_argument("--victim", type=int, help=argparse.SUPPRESS)
    p.add_argument("--kill-step", type=int, help=argparse.SUPPRESS)
    p.add_argument("--dir", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker == "oxccl":
        return run_oxccl(args)
    if args.worker == "torchrun":
        return run_torchrun(args)
    rng = random.Random(args.seed)
    times = {"oxccl": [], "torchrun": []}
    print(f"{args.ranks} ranks, {args.steps} steps, MLP of {2 * WIDTH * WIDTH + 3 * WIDTH + 1} parameters; "
          f"torchrun on {args.backend} with a checkpoint every step; seed {args.seed}", flush=True)
    for t in range(1, args.trials + 1):
        victim, kill_step = rng.randrange(args.ranks), rng.randrange(3, args.steps - 3)
        row = []
        for way in ("oxccl", "torchrun"):
            took, whole = trial(args, way, victim, kill_step)
            times[way].append(took)
            row.append(f"{way} {took * 1000:8.1f} ms (job {whole:5.1f} s)")
        print(f"trial {t}: victim {victim} at step {kill_step}: " + "; ".join(row), flush=True)
    for way, xs in times.items():
        print(f"{way:9s} kill -> next step: min {min(xs) * 1000:.1f} ms, median {statistics.median(xs) * 1000:.1f} ms, "
              f"max {max(xs) * 1000:.1f} ms")
    ratio = statistics.median(times["torchrun"]) / statistics.median(times["oxccl"])
    print(f"torchrun / oxccl (medians): {ratio:.1f}x (target: at least 10x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
