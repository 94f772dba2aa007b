"""One rank of a torchft test scenario (see launch.py): oxccl's torchft process group
reconfigured as torchft's Manager does it, quorum after quorum, against sequential
references."""

import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import AllgatherOptions, AllreduceOptions, ReduceOp

import oxccl
from oxccl.torchft import ProcessGroupOxccl


def allreduce(pg, t, op=ReduceOp.SUM):
    opts = AllreduceOptions()
    opts.reduceOp = op
    return pg.allreduce([t], opts)


def expect(got, want, what):
    if not torch.equal(got, want):
        raise AssertionError(f"{what}: got {got.tolist()} want {want.tolist()}")


def quorums():
    """Three ranks; a quorum of all, then rank 1 dies inside a collective (SIGKILL), the
    survivors see the error, reconfigure as a quorum of two with new numbers and agree on
    results; then an abort in between, and a quorum in reverse order."""
    me, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    # The job's store, as the replica group's rank 0 hosts it under torchft.
    store = dist.TCPStore(host, port, n, is_master=me == 0, wait_for_workers=False,
                          timeout=timedelta(seconds=30))
    pg = ProcessGroupOxccl(timeout=timedelta(seconds=20))
    assert pg.getBackendName() == "torchft-oxccl" and pg.comm is None

    pg.configure(f"{host}:{port}/torchft/1/0", f"replica{me}", me, n, 1, 0, 1, list(range(n)))
    assert pg.size() == n and pg.comm.rank == me
    t = torch.full((7,), float(me + 1))
    allreduce(pg, t).wait()
    expect(t, torch.full((7,), float(sum(range(1, n + 1)))), "quorum 1 sum")
    x = torch.arange(5, dtype=torch.int64) * (me + 1)
    allreduce(pg, x, ReduceOp.MAX).wait()
    expect(x, torch.arange(5, dtype=torch.int64) * n, "quorum 1 max")
    store.set(f"q1/{me}", "done")
    store.wait([f"q1/{r}" for r in range(n)])

    # Quorum 1, one more step: rank 1 dies in the middle of it.
    big = torch.ones(1 << 20)
    if me == 1:
        time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGKILL)
    work = allreduce(pg, big)
    started = time.monotonic()
    try:
        work.wait()
    except (oxccl.PeerLostError, oxccl.AbortedError) as e:
        # PeerLostError where this rank saw the death, AbortedError naming it where a peer
        # saw it first and told this rank.
        assert "lost rank 1" in str(e), str(e)
        print(f"rank {me}: the step failed in {time.monotonic() - started:.3f} s: {e!r}")
    else:
        raise AssertionError("an all_reduce with a dead member completed")
    err = pg.errored()
    assert isinstance(err, (oxccl.PeerLostError, oxccl.AbortedError)), f"errored() said {err!r}"

    # Quorum 2: the survivors, renumbered (0 stays 0, 2 becomes 1), through a new prefix.
    survivors = [r for r in range(n) if r != 1]
    rank2 = survivors.index(me)
    pg.configure(f"{host}:{port}/torchft/2/0", f"replica{me}", rank2, len(survivors), 2, 0, 1, survivors)
    assert pg.errored() is None and pg.size() == len(survivors) and pg.quorums == 2
    t = torch.full((3,), float(me + 1))
    allreduce(pg, t).wait()
    expect(t, torch.full((3,), float(sum(r + 1 for r in survivors))), "quorum 2 sum")
    out = torch.zeros(2 * len(survivors), dtype=torch.int32)
    pg.allgather_into_tensor_coalesced([out], [torch.tensor([me, rank2], dtype=torch.int32)],
                                       AllgatherOptions()).wait()
    expect(out, torch.tensor([v for r in survivors for v in (r, survivors.index(r))], dtype=torch.int32),
           "quorum 2 all_gather")

    # An abort ends the communicator here; a configure after it makes a new one.
    pg.abort()
    assert pg.comm is None
    rank3 = len(survivors) - 1 - rank2
    pg.configure(f"{host}:{port}/torchft/3/0", f"replica{me}", rank3, len(survivors), 3, 0, 1, survivors[::-1])
    t = torch.full((4,), float(10 ** rank3))
    allreduce(pg, t).wait()
    expect(t, torch.full((4,), float(sum(10 ** r for r in range(len(survivors))))), "quorum 3 sum")
    # An abort while a collective waits for a peer that never comes fails it at once.
    if rank3 == 0:
        lonely = allreduce(pg, torch.ones(3))
        time.sleep(0.2)
        pg._pg.abort()
        try:
            lonely.wait()
        except oxccl.AbortedError:
            pass
        else:
            raise AssertionError("an aborted all_reduce completed")
    store.set(f"q3/{me}", "done")
    store.wait([f"q3/{r}" for r in survivors])
    pg.shutdown()
    print(f"rank {me}: ok")


if __name__ == "__main__":
    {"quorums": quorums}[sys.argv[1]]()
