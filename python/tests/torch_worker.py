"""One rank of a torch test scenario (see launch.py): the ``oxccl`` torch.distributed backend
against a sequential reference, and against gloo on the same data."""

import sys
import threading

import torch
import torch.distributed as dist

import oxccl
import oxccl.torch  # noqa: F401  (registers the backend)

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int32, torch.int64, torch.uint8]


def inputs(n, count, dtype, salt=0):
    return [((torch.arange(count) * 7 + r * 3 + salt) % 5 + 1).to(dtype) for r in range(n)]


def same(got, want, what):
    if not torch.equal(got, want.to(got.dtype)):
        raise AssertionError(f"{what}: got {got[:8].tolist()} want {want[:8].tolist()}")


def ops():
    dist.init_process_group("oxccl")
    n, me = dist.get_world_size(), dist.get_rank()
    assert dist.get_backend() == "oxccl"
    for dtype in DTYPES:
        for count in (1, 7, 300):
            xs = inputs(n, count, dtype)
            stack = torch.stack([x.double() for x in xs])
            for op, ref in [(dist.ReduceOp.SUM, stack.sum(0)), (dist.ReduceOp.MAX, stack.max(0).values),
                            (dist.ReduceOp.MIN, stack.min(0).values)]:
                t = xs[me].clone()
                dist.all_reduce(t, op)
                same(t, ref, f"all_reduce {dtype} {op}")
            if dtype.is_floating_point:
                t = xs[me].clone()
                dist.all_reduce(t, dist.ReduceOp.AVG)
                same(t, stack.mean(0), f"all_reduce avg {dtype}")
            t = xs[me].clone()
            dist.broadcast(t, src=n - 1)
            same(t, xs[n - 1].double(), "broadcast")
            t = xs[me].clone()
            dist.reduce(t, dst=0)
            if me == 0:
                same(t, stack.sum(0), "reduce")
            out = torch.empty(n * count, dtype=dtype)
            dist.all_gather_into_tensor(out, xs[me])
            same(out, torch.cat(xs).double(), "all_gather_into_tensor")
            lst = [torch.empty(count, dtype=dtype) for _ in range(n)]
            dist.all_gather(lst, xs[me])
            same(torch.cat(lst), torch.cat(xs).double(), "all_gather")
            blocks = inputs(n, n * count, dtype, salt=1)
            bstack = torch.stack([b.double() for b in blocks])
            mine = torch.empty(count, dtype=dtype)
            dist.reduce_scatter_tensor(mine, blocks[me])
            same(mine, bstack.sum(0)[me * count:(me + 1) * count], "reduce_scatter_tensor")
            mine = torch.empty(count, dtype=dtype)
            dist.reduce_scatter(mine, list(blocks[me].chunk(n)))
            same(mine, bstack.sum(0)[me * count:(me + 1) * count], "reduce_scatter")
            a2a = torch.empty(n * count, dtype=dtype)
            dist.all_to_all_single(a2a, blocks[me])
            same(a2a, torch.cat([blocks[q][me * count:(me + 1) * count] for q in range(n)]).double(), "all_to_all")
            g = [torch.empty(count, dtype=dtype) for _ in range(n)] if me == 0 else None
            dist.gather(xs[me], g, dst=0)
            if me == 0:
                same(torch.cat(g), torch.cat(xs).double(), "gather")
            s = torch.empty(count, dtype=dtype)
            dist.scatter(s, list(blocks[0].chunk(n)) if me == 0 else None, src=0)
            same(s, blocks[0][me * count:(me + 1) * count].double(), "scatter")
    if n > 1:
        got = torch.empty(4)
        if me == 0:
            dist.send(torch.full((4,), 7.0), dst=1)
        elif me == 1:
            dist.recv(got, src=0)
            same(got, torch.full((4,), 7.0), "send/recv")
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.full((2,), float(me)), (me + 1) % n),
                                       dist.P2POp(dist.irecv, got[:2], (me + n - 1) % n)])
        for q in reqs:
            q.wait()
        same(got[:2], torch.full((2,), float((me + n - 1) % n)), "batch_isend_irecv")
    # all_to_all_single with uneven splits (rows of dim 0): rank i sends j + 1 rows to rank j.
    inp = torch.cat([torch.full((j + 1, 2), float(me * 10 + j)) for j in range(n)])
    out = torch.empty(n * (me + 1), 2)
    dist.all_to_all_single(out, inp, output_split_sizes=[me + 1] * n, input_split_sizes=[j + 1 for j in range(n)])
    same(out, torch.cat([torch.full((me + 1, 2), float(i * 10 + me)) for i in range(n)]), "uneven all_to_all_single")
    w = dist.all_reduce(torch.ones(3), async_op=True)
    w.wait()
    assert w.is_completed() and w.get_future().value()[0].tolist() == [float(n)] * 3
    # Several async operations in flight (what DDP and FSDP2 issue), waited in reverse order.
    a = torch.full((1000,), float(me + 1))
    gin, gout = torch.full((5,), float(me)), torch.empty(5 * n)
    rin, rout = torch.arange(3 * n, dtype=torch.float64), torch.empty(3, dtype=torch.float64)
    b = torch.full((4,), float(me), dtype=torch.bfloat16)
    works = [dist.all_reduce(a, async_op=True), dist.all_gather_into_tensor(gout, gin, async_op=True),
             dist.reduce_scatter_tensor(rout, rin, async_op=True), dist.broadcast(b, src=0, async_op=True)]
    for w in reversed(works):
        w.wait()
    same(a, torch.full((1000,), float(n * (n + 1) / 2)), "async all_reduce")
    same(gout, torch.arange(n).repeat_interleave(5).double(), "async all_gather_into_tensor")
    same(rout, (torch.arange(3) + 3 * me).double() * n, "async reduce_scatter_tensor")
    same(b, torch.zeros(4), "async broadcast")
    # Subgroups: every rank calls new_group; only members get one.
    evens = dist.new_group(list(range(0, n, 2)), backend="oxccl")
    if me % 2 == 0:
        t = torch.ones(2)
        dist.all_reduce(t, group=evens)
        same(t, torch.full((2,), float(len(range(0, n, 2)))), "subgroup")
    dist.barrier()
    dist.destroy_process_group()
    # The groups' helper threads for async operations end with them (a daemon thread still
    # completing a future at interpreter exit aborts the process).
    left = [t.name for t in threading.enumerate() if t.name == "oxccl-torch-completer"]
    assert not left, left
    print("ops ok")


def ddp():
    """The same model trained with DistributedDataParallel on oxccl and on gloo, same seed
    and data: the parameters agree."""
    dist.init_process_group("oxccl")
    me = dist.get_rank()
    gloo = dist.new_group(backend="gloo")
    params = []
    for group in (None, gloo):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
        ddp_model = torch.nn.parallel.DistributedDataParallel(model, process_group=group)
        opt = torch.optim.SGD(ddp_model.parameters(), lr=0.05)
        g = torch.Generator().manual_seed(100 + me)
        for _ in range(20):
            x = torch.randn(32, 8, generator=g)
            y = x.sum(1, keepdim=True)
            opt.zero_grad()
            torch.nn.functional.mse_loss(ddp_model(x), y).backward()
            opt.step()
        params.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    diff = (params[0] - params[1]).abs().max().item()
    assert diff < 1e-5, f"oxccl and gloo DDP differ by {diff}"
    dist.destroy_process_group()
    print("ddp ok", diff)


def reinit():
    # The default group created three times while every earlier one is still held (as a
    # model or a device mesh keeps its group): each must meet its own ranks, not the keys an
    # earlier one left in the store (before: a missing shared-memory segment, or a hang).
    held = []
    for round_ in range(3):
        dist.init_process_group("oxccl")
        me, n = dist.get_rank(), dist.get_world_size()
        held.append(dist.group.WORLD._get_backend(torch.device("cpu")))
        t = inputs(n, 10, torch.float32, salt=round_)
        got = t[me].clone()
        dist.all_reduce(got)
        same(got, torch.stack(t).sum(0), f"all_reduce after {round_} re-creations")
        dist.destroy_process_group()
    print("reinit ok")


def p2p():
    # What gloo users rely on beyond the collectives: receives from any source, receives
    # posted before the sends they wait for, monitored_barrier naming the absent ranks,
    # sparse all_reduce, coalesced all_gather, and the group's backend found per device.
    from datetime import timedelta

    dist.init_process_group("oxccl")
    n, me = dist.get_world_size(), dist.get_rank()
    assert dist.group.WORLD._get_backend(torch.device("cpu")).getBackendName() == "oxccl"
    # Every rank sends rank 0 its rank twice; rank 0 learns the senders from recv/irecv.
    if me == 0:
        senders = []
        for _ in range(n - 1):
            t = torch.full((3,), -1.0)
            senders.append(dist.recv(t))
            same(t, torch.full((3,), float(senders[-1])), "recv from any source")
            w = dist.irecv(t)
            w.wait()
            senders.append(w._source_rank())
            same(t, torch.full((3,), float(senders[-1])), "irecv from any source")
        assert sorted(senders) == sorted(list(range(1, n)) * 2), senders
    else:
        for _ in range(2):
            dist.send(torch.full((3,), float(me)), 0)
    # Receives first, from every rank (itself included), then the sends, with two tags.
    ops, got = [], []
    for q in range(n):
        for tag in (1, 2):
            t = torch.zeros(q + tag, dtype=torch.int64)
            got.append((q, tag, t))
            ops.append(dist.P2POp(dist.irecv, t, q, tag=tag))
    for q in range(n):
        for tag in (2, 1):
            ops.append(dist.P2POp(dist.isend, torch.full((me + tag,), 10 * me + tag), q, tag=tag))
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    for q, tag, t in got:
        same(t, torch.full((q + tag,), 10 * q + tag), f"batch_isend_irecv from {q} tag {tag}")
    # all_gather_coalesced: two tensors of different shapes (and complex ones).
    for dtype in (torch.float32, torch.complex64):
        a, b = torch.full((2, 2), me + 1, dtype=dtype), torch.full((3,), -me, dtype=dtype)
        outs = [[torch.empty_like(a), torch.empty_like(b)] for _ in range(n)]
        dist.all_gather_coalesced(outs, [a, b])
        for r in range(n):
            same(outs[r][0], torch.full((2, 2), r + 1, dtype=dtype), f"all_gather_coalesced {dtype} a")
            same(outs[r][1], torch.full((3,), -r, dtype=dtype), f"all_gather_coalesced {dtype} b")
    # Sparse all_reduce: rank r sets entries r and r+1 of a 2-row matrix.
    idx = torch.tensor([[0, 1], [me, (me + 1) % (n + 1)]])
    sp = torch.sparse_coo_tensor(idx, torch.tensor([1.0, 2.0]), (2, n + 1))
    dist.all_reduce(sp)
    want = torch.zeros(2, n + 1)
    for r in range(n):
        want[0, r] += 1.0
        want[1, (r + 1) % (n + 1)] += 2.0
    assert sp.is_sparse and sp.is_coalesced(), "sparse all_reduce: the result is a coalesced sparse tensor"
    same(sp.to_dense(), want, "sparse all_reduce")
    # Bad input is refused with an error that says what is wrong (on every rank alike).
    for call, words in [(lambda: dist.all_reduce(sp, dist.ReduceOp.MAX), "supports SUM only"),
                        (lambda: dist.all_gather_coalesced([[torch.empty(3)]] * n, [torch.ones(2)]),
                         "does not match the inputs' sizes")]:
        try:
            call()
            raise AssertionError(f"no error: {words}")
        except oxccl.InvalidArgumentError as e:
            assert words in str(e), e
    # monitored_barrier: all ranks pass; then the last rank stays away and rank 0 names it.
    dist.monitored_barrier(timeout=timedelta(seconds=10), wait_all_ranks=True)
    if n > 1:
        if me == 0:
            try:
                dist.monitored_barrier(timeout=timedelta(seconds=1), wait_all_ranks=True)
                raise AssertionError("monitored_barrier passed with a rank away")
            except RuntimeError as e:
                assert f"Ranks {n - 1} failed to pass monitoredBarrier" in str(e), e
        elif me != n - 1:
            try:
                dist.monitored_barrier(timeout=timedelta(seconds=5))
                raise AssertionError("monitored_barrier passed with a rank away")
            except RuntimeError as e:
                assert "received errors while waiting for send/recv from rank 0" in str(e), e
        dist.barrier()
    # A barrier's own timeout overrides the group's (30 minutes): rank 0 alone in one.
    if n > 1:
        import time

        g = dist.new_group()
        if me == 0:
            t0 = time.monotonic()
            try:
                dist.barrier(g, timeout=timedelta(seconds=1))
                raise AssertionError("a barrier that one rank entered passed")
            except oxccl.TimeoutError:
                assert time.monotonic() - t0 < 15, time.monotonic() - t0
        dist.barrier()
    # Works answer on every operation, and an async operation's failure reaches its waiter:
    # mismatched calls (rank 0 all_reduce, rank 1 broadcast) fail wait(), exception(),
    # is_success() and the future alike (the group is unusable afterwards). Two ranks only:
    # from three on, these two calls wait for each other's data, which never moves, so the
    # mismatch is found only at the deadline.
    t = torch.ones(4)
    w = dist.all_reduce(t, async_op=True)
    w.wait()
    assert w.is_completed() and w.is_success() and w.exception() is None and w.result() == [t]
    assert w.get_future().wait() == [t]
    if n == 2:
        w = dist.all_reduce(t, async_op=True) if me == 0 else dist.broadcast(t, 0, async_op=True)
        try:
            w.wait()
            raise AssertionError("an async mismatch passed wait()")
        except oxccl.MismatchError:
            pass
        assert w.is_completed() and not w.is_success() and isinstance(w.exception(), oxccl.MismatchError)
        try:
            w.get_future().wait()
            raise AssertionError("an async mismatch passed the future")
        except oxccl.MismatchError:
            pass
    dist.destroy_process_group()
    print("p2p ok")


if __name__ == "__main__":
    globals()[sys.argv[1]]()
