"""Elastic data-parallel training that survives a SIGKILL without a restart.

    oxccl run -n 4 --max-restarts 1 -- python python/examples/elastic_ddp.py

A linear model learns integer weights in fixed point (int64), so gradient sums are exact
and the run is deterministic whatever the membership. Each step's global batch is sharded
by membership (sample ``s`` goes to member ``s % size``); the members all_reduce their
gradients and ``agree`` that every member's step succeeded before applying it. One rank
kills itself (SIGKILL) at a random step (``ELASTIC_KILL_RANK``, ``ELASTIC_KILL_STEP`` fix
them; ``ELASTIC_KILL_RANK=none`` kills no one): the survivors shrink and redo the step;
``oxccl run`` starts a replacement, whose ``oxccl.init()`` joins (``OXCCL_JOIN=1``);
``agree`` tells the members how many newcomers wait, they ``grow``, and rank 0 broadcasts
the step and the weights. At the end rank 0 replays the membership schedule sequentially
and checks that the final weights are equal, element for element.
"""

import os
import random
import signal
import sys
import time

import numpy as np

import oxccl

DIM, BATCH, STEPS, SCALE = 8, 64, 40, 1 << 20
TRUTH = np.array([(i * 7 % 11) - 5 for i in range(DIM)], np.int64)


def features(step, samples):
    """Deterministic small integers for (step, sample, feature)."""
    rng = np.random.default_rng([step, 12345])
    x = rng.integers(-3, 4, size=(BATCH, DIM), dtype=np.int64)
    return x[samples]


def shard_gradient(w, step, member, size):
    samples = np.arange(member, BATCH, size)
    x = features(step, samples)
    err = x @ w - (x @ TRUTH) * SCALE
    return (err[:, None] * x).sum(axis=0)


def apply(w, g):
    """One step's update: integer division rounding toward zero (as the Rust example's),
    exact and the same everywhere."""
    q = np.abs(g) // (BATCH * 16)
    w -= np.where(g < 0, -q, q)


def reference(schedule):
    w = np.zeros(DIM, np.int64)
    for step in range(STEPS):
        size = [n for s, n in schedule if s <= step][-1]
        g = sum(shard_gradient(w, step, m, size) for m in range(size))
        apply(w, g)
    return w


def main():
    joined = os.environ.get("OXCCL_JOIN") == "1"
    comm = oxccl.init()
    first_size, first_rank = comm.world_size, comm.rank
    rng = random.Random(os.environ.get("OXCCL_SECRET", "elastic"))
    victim = os.environ.get("ELASTIC_KILL_RANK", str(rng.randrange(first_size)))
    victim = None if victim == "none" else int(victim)
    kill_step = int(os.environ.get("ELASTIC_KILL_STEP", rng.randrange(5, STEPS - 10)))

    # [step, size to return to, weights...]: what a newcomer learns from rank 0.
    state = np.zeros(2 + DIM, np.int64)
    state[1] = first_size
    if joined:
        comm.broadcast(state, 0)
    schedule = [(int(state[0]), comm.world_size)]
    short_since = None
    while state[0] < STEPS or comm.world_size < state[1]:
        step = int(state[0])
        if not joined and first_rank == victim and step == kill_step and first_size > 1:
            print(f"rank {first_rank}: killing myself (SIGKILL) at step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        g = shard_gradient(state[2:], step, comm.rank, comm.world_size)
        try:
            comm.all_reduce(g)
            ok = 1
        except (oxccl.PeerLostError, oxccl.AbortedError, oxccl.RevokedError, oxccl.TimeoutError):
            ok = 0
        # Did every member finish the step? The same answer on every survivor.
        a = comm.agree(ok)
        if a.flag == 0 or a.failed:
            comm = comm.shrink()
            schedule.append((step, comm.world_size))
            if comm.rank == 0:
                print(f"step {step}: a member failed; {comm.world_size} survivors redo the step", flush=True)
            continue
        if step < STEPS:
            apply(state[2:], g)
            state[0] += 1
        if a.joiners:
            comm = comm.grow(a.joiners)
            comm.broadcast(state, 0)
            schedule.append((int(state[0]), comm.world_size))
            if comm.rank == 0:
                print(f"step {state[0]}: {a.joiners} newcomer(s) joined; {comm.world_size} members", flush=True)
        if state[0] >= STEPS and comm.world_size < state[1]:
            short_since = short_since or time.monotonic()
            if time.monotonic() - short_since > 60:
                sys.exit("no replacement joined within 60 s (run under `oxccl run --max-restarts 1`)")
            time.sleep(0.01)
    if comm.rank == 0:
        print("membership: " + ", ".join(f"step {s} size {n}" for s, n in schedule), flush=True)
        want = reference(schedule)
        if not np.array_equal(want, state[2:]):
            sys.exit(f"final weights {state[2:]} differ from the sequential reference {want}")
        print("learned", np.round(state[2:] / SCALE, 2).tolist())
        print(f"final weights match the sequential reference ({STEPS} steps, {DIM} weights)", flush=True)
    check = state[2:].copy()
    comm.broadcast(check, 0)
    assert np.array_equal(check, state[2:]), f"rank {comm.rank} holds other weights than rank 0"


if __name__ == "__main__":
    main()
