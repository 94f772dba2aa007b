"""One rank of a test scenario (see launch.py): checks its results against a sequential
reference of every rank's inputs and exits 1 with a message on any difference."""

import array
import os
import sys
import time

import numpy as np

import oxccl

DTYPES = [np.int8, np.uint8, np.int32, np.uint32, np.int64, np.uint64, np.float16, np.float32, np.float64]


def inputs(n, count, dtype, salt=0):
    """Every rank's input: small values, so sums and products stay exact in every dtype."""
    return [((np.arange(count) * 7 + r * 3 + salt) % 5 + 1).astype(dtype) for r in range(n)]


def reference(xs, op):
    stack = np.stack([x.astype(np.float64) for x in xs])
    r = {"sum": stack.sum(0), "prod": stack.prod(0), "min": stack.min(0), "max": stack.max(0),
         "avg": stack.mean(0)}[op]
    return r


def close(got, want, what):
    got64 = got.astype(np.float64)
    tol = 1e-2 if got.dtype == np.float16 else 1e-6
    if np.issubdtype(got.dtype, np.integer):
        want = np.trunc(want)  # integer avg truncates
        ok = np.array_equal(got64, want.astype(got.dtype).astype(np.float64))
    else:
        ok = np.allclose(got64, want, rtol=tol, atol=tol)
    if not ok:
        raise AssertionError(f"{what}: got {got[:8]} want {want[:8]}")


def every_op(comm):
    n, me = comm.world_size, comm.rank
    for dtype in DTYPES:
        for count in (0, 1, 7, 1000):
            xs = inputs(n, count, dtype)
            ops = ["sum", "min", "max", "avg"] + (["prod"] if n <= 3 else [])
            for op in ops:
                if op == "avg" and np.issubdtype(dtype, np.unsignedinteger):
                    continue
                buf = xs[me].copy()
                comm.all_reduce(buf, op)
                close(buf, reference(xs, op), f"all_reduce {dtype.__name__} {op} {count}")
            out = np.zeros(count, dtype)
            comm.all_reduce_into(xs[me], out, oxccl.ReduceOp.MAX)
            close(out, reference(xs, "max"), "all_reduce_into")
            root = n - 1
            buf = xs[me].copy()
            comm.reduce(buf, root)
            close(buf, reference(xs, "sum") if me == root else xs[me].astype(np.float64), "reduce")
            out = np.zeros(count, dtype) if me == root else None
            comm.reduce_into(xs[me], out, root, "min")
            if me == root:
                close(out, reference(xs, "min"), "reduce_into")
            buf = xs[me].copy()
            comm.broadcast(buf, root)
            close(buf, xs[root].astype(np.float64), "broadcast")
            allg = np.zeros(n * count, dtype)
            comm.all_gather(xs[me], allg)
            close(allg, np.concatenate(xs).astype(np.float64), "all_gather")
            inplace = np.zeros(n * count, dtype)
            inplace[me * count:(me + 1) * count] = xs[me]
            comm.all_gather_in_place(inplace)
            close(inplace, np.concatenate(xs).astype(np.float64), "all_gather_in_place")
            blocks = inputs(n, n * count, dtype, salt=1)
            mine = np.zeros(count, dtype)
            comm.reduce_scatter(blocks[me], mine)
            close(mine, reference(blocks, "sum")[me * count:(me + 1) * count], "reduce_scatter")
            a2a = np.zeros(n * count, dtype)
            comm.all_to_all(blocks[me], a2a)
            want = np.concatenate([blocks[q][me * count:(me + 1) * count] for q in range(n)])
            close(a2a, want.astype(np.float64), "all_to_all")
            g = np.zeros(n * count, dtype) if me == 0 else None
            comm.gather(xs[me], g, 0)
            if me == 0:
                close(g, np.concatenate(xs).astype(np.float64), "gather")
            s = np.zeros(count, dtype)
            comm.scatter(blocks[0] if me == 0 else None, s, 0)
            close(s, blocks[0][me * count:(me + 1) * count].astype(np.float64), "scatter")
    # all_to_all_v: rank i sends j + 1 elements (all i * 10 + j) to rank j.
    send = np.concatenate([np.full(j + 1, me * 10 + j, np.int32) for j in range(n)])
    recv = np.zeros(n * (me + 1), np.int32)
    comm.all_to_all_v(send, [j + 1 for j in range(n)], recv, [me + 1] * n)
    want = np.concatenate([np.full(me + 1, i * 10 + me, np.int32) for i in range(n)])
    assert np.array_equal(recv, want), (recv, want)
    if n > 1:
        # A ring of send-then-receive (sends return once on their way).
        got = np.zeros(5, np.float64)
        comm.send(np.full(3, me, np.float64), (me + 1) % n, tag=3)
        k = comm.recv(got, (me + n - 1) % n, tag=3)
        assert k == 3 and list(got[:3]) == [(me + n - 1) % n] * 3, (k, got)
    comm.barrier()
    print("every_op ok")


def buffers(comm):
    n, me = comm.world_size, comm.rank
    # Buffer-protocol objects: array.array and bytearray, used in place.
    a = array.array("i", [me + 1] * 4)
    comm.all_reduce(a)
    assert list(a) == [n * (n + 1) // 2] * 4, a
    b = bytearray([me] * 3)
    comm.all_reduce(b, "max")
    assert list(b) == [n - 1] * 3, b
    # DLPack exporters (here one that offers nothing else): used in place too.
    arr = np.full(6, me + 1, np.float64)
    comm.all_reduce(DLPackOnly(arr))
    assert list(arr) == [n * (n + 1) / 2] * 6, arr
    h = np.full(3, me, np.float16)
    comm.all_reduce(DLPackOnly(h), "max")
    assert list(h) == [n - 1] * 3, h
    # Refused clearly: non-contiguous, read-only outputs, unknown dtypes, mixed dtypes.
    for bad, words in [
        (lambda: comm.all_reduce(np.zeros(8, np.float32)[::2]), "not contiguous"),
        (lambda: comm.all_reduce(np.zeros(2, np.float32).view().setflags(write=False) or _ro()), "read-only"),
        (lambda: comm.all_reduce(np.zeros(2, np.complex64)), "complex64"),
        (lambda: comm.all_reduce(b"abc"), "read-only"),
        (lambda: comm.all_reduce([1, 2]), "not a buffer"),
        (lambda: comm.all_gather(np.zeros(2, np.float32), np.zeros(2 * n, np.float64)), "dtypes differ"),
        (lambda: comm.all_reduce(np.zeros(2, np.float32), "median"), "median"),
        (lambda: comm.all_reduce(DLPackOnly(np.zeros((4, 4), np.float32)[:, 1])), "not contiguous"),
        (lambda: comm.all_reduce(DLPackOnly(np.zeros(2, np.bool_))), "type code"),
    ]:
        try:
            bad()
        except (oxccl.InvalidArgumentError, ValueError) as e:
            assert words in str(e), (words, str(e))
        else:
            raise AssertionError(f"not refused: {words}")
    # Device memory (a torch CUDA tensor says "@cuda:N") needs the GPU runtime: without one,
    # the error says what is missing.
    if not os.path.exists("/dev/nvidia0"):
        try:
            comm._c.all_reduce((a.buffer_info()[0], 1, "i32@cuda:0"), "sum")
        except oxccl.OxcclError as e:
            assert "CUDA" in str(e) or "cuda" in str(e), e
        else:
            raise AssertionError("device memory without a GPU runtime was not refused")
    # Wrong lengths are the library's InvalidArgumentError, a ValueError too.
    try:
        comm.all_gather(np.zeros(2, np.float32), np.zeros(2 * n + 1, np.float32))
    except oxccl.InvalidArgumentError as e:
        assert isinstance(e, ValueError) and isinstance(e, oxccl.OxcclError)
    else:
        raise AssertionError("a wrong all_gather length was not refused")
    comm.barrier()
    print("buffers ok")


class DLPackOnly:
    """An object that exports its memory through DLPack only."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, **kw):
        return self.a.__dlpack__()

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


def _ro():
    x = np.zeros(2, np.float32)
    x.setflags(write=False)
    return x


def async_ops(comm):
    n, me = comm.world_size, comm.rank
    a = np.full(1000, me + 1, np.float32)
    b = np.full(7, me, np.int64)
    g_in, g_out = np.full(3, me, np.uint8), np.zeros(3 * n, np.uint8)
    blocks, mine = np.arange(4 * n, dtype=np.float64), np.zeros(4)
    wa = comm.all_reduce(a, async_op=True)
    wb = comm.all_reduce(b, "max", async_op=True)
    wg = comm.all_gather(g_in, g_out, async_op=True)
    wr = comm.reduce_scatter(blocks, mine, async_op=True)
    wc = comm.broadcast(np.full(2, me, np.int32), n - 1, async_op=True)  # the Work keeps it alive
    for w in (wg, wb, wr, wa, wc):  # out of order
        assert isinstance(w, oxccl.Work)
        w.wait()
        assert w.is_completed()
        w.wait()  # again: returns at once
    assert list(a[:3]) == [n * (n + 1) / 2] * 3 and list(b) == [n - 1] * 7, (a[:3], b)
    assert list(g_out) == [q for q in range(n) for _ in range(3)], g_out
    assert list(mine) == [n * (4 * me + i) for i in range(4)], mine
    # A dropped, unwaited Work waits for its operation before letting the buffer go.
    w = comm.all_reduce(np.ones(1 << 16, np.float32), async_op=True)
    del w
    # An async mismatch raises on wait (or at the start), not a hang.
    try:
        if me == 0:
            comm.all_reduce(np.zeros(4, np.float32), async_op=True).wait()
        else:
            comm.all_gather(np.zeros(2, np.float32), np.zeros(2 * n, np.float32), async_op=True).wait()
    except oxccl.MismatchError:
        pass
    else:
        if n > 1:
            raise AssertionError("no MismatchError from an async mismatch")
    print("async ok")


def p2p(comm):
    n, me = comm.world_size, comm.rank
    # Receives posted before their sends, from every rank (itself included) and from any
    # source; each wait says who sent what.
    named = [(q, np.zeros(q + 2, np.int32)) for q in range(n)]
    works = [comm.recv(buf, q, tag=1, async_op=True) for q, buf in named]
    anybuf = np.zeros(4, np.float64)
    wany = comm.recv(anybuf, tag=2, async_op=True)
    sends = [comm.send(np.full(me + 2, 10 * me + q, np.int32), q, tag=1, async_op=True) for q in range(n)]
    sends.append(comm.send(np.full(3, me, np.float64), (me + 1) % n, tag=2, async_op=True))
    for (q, buf), w in zip(named, works):
        assert w.wait() == (q, q + 2), (q, w.wait())
        assert list(buf) == [10 * q + me] * (q + 2), (q, buf)
    prev = (me + n - 1) % n
    assert wany.wait() == (prev, 3) and list(anybuf[:3]) == [prev] * 3, (wany.wait(), anybuf)
    for w in sends:
        assert w.wait() is None
    # Blocking receive from any source: every rank sends rank 0 one message.
    comm.send(np.full(2, me, np.int64), 0, tag=3)
    if me == 0:
        seen = []
        for _ in range(n):
            buf = np.zeros(2, np.int64)
            src, count = comm.recv(buf, tag=3)
            assert count == 2 and list(buf) == [src, src], (src, count, buf)
            seen.append(src)
        assert sorted(seen) == list(range(n)), seen
        assert comm.probe(0, 3) is None
    comm.barrier()
    print("p2p ok")


def groups(comm):
    n, me = comm.world_size, comm.rank
    sub = comm.split(me % 2, key=-me)
    assert sub.world_size == len(range(me % 2, n, 2)), sub
    x = np.array([me], np.int64)
    sub.all_reduce(x)
    assert x[0] == sum(range(me % 2, n, 2)), x
    g = comm.new_group([0, n - 1])
    if me in (0, n - 1):
        y = np.array([1.0], np.float32)
        g.all_reduce(y)
        assert y[0] == len({0, n - 1}), y
    else:
        assert g is None
    none = comm.split(None if me == 0 else 1)
    assert (none is None) == (me == 0)
    print("groups ok")


def mismatch(comm):
    me = comm.rank
    try:
        if me == 0:
            comm.all_reduce(np.zeros(4, np.float32))
        else:
            comm.all_gather(np.zeros(2, np.float32), np.zeros(4, np.float32))
    except oxccl.MismatchError as e:
        print("MismatchError", e)
        return
    raise AssertionError("no MismatchError")


def timeout(comm):
    if comm.rank == 1:
        time.sleep(3)
        return
    t = time.monotonic()
    try:
        comm.with_timeout(0.5).all_reduce(np.zeros(4, np.float32))
    except TimeoutError as e:
        assert isinstance(e, oxccl.TimeoutError) and time.monotonic() - t < 2.5, e
        print("TimeoutError", e)
        return
    raise AssertionError("no TimeoutError")


def peer_lost(comm):
    if comm.rank == 1:
        import os
        os._exit(3)
    try:
        comm.all_reduce(np.zeros(4, np.float32))
    except (oxccl.PeerLostError, oxccl.AbortedError) as e:
        print("PeerLost", type(e).__name__, e)
        return
    raise AssertionError("no PeerLostError")


def recovery(comm):
    """The last rank dies; the others revoke, shrink, agree and compute on."""
    n, me = comm.world_size, comm.rank
    if me == n - 1:
        import os
        os._exit(3)
    try:
        comm.all_reduce(np.zeros(1 << 16, np.float32))
        raise AssertionError("the dead rank's all_reduce succeeded")
    except (oxccl.PeerLostError, oxccl.AbortedError, oxccl.RevokedError):
        pass
    comm.revoke("rank %d found a peer dead" % me)
    try:
        comm.barrier()
        raise AssertionError("a revoked communicator's barrier succeeded")
    except oxccl.RevokedError as e:
        assert e.rank in range(n - 1), e.rank
    small = comm.shrink()
    assert (small.world_size, small.rank) == (n - 1, me), small
    x = np.array([me + 1], np.int64)
    small.all_reduce(x)
    assert x[0] == sum(range(1, n)), x
    a = comm.agree(0b11 if me == 0 else 0b01)
    assert (a.flag, a.failed, a.joiners) == (0b01, [n - 1], 0), a
    print("recovery ok")


def elastic(comm):
    """Rank 1 dies at step 3 unless it is the replacement (OXCCL_JOIN=1, started by
    `oxccl run --max-restarts 1`); the survivors shrink, grow by the newcomers `agree`
    reports, and every rank ends at the first size with the right sums."""
    import os
    import time
    joined = os.environ.get("OXCCL_JOIN") == "1"
    state = np.array([0, comm.world_size], np.int64)
    if joined:
        comm.broadcast(state, 0)
    else:
        first = comm.rank
    while state[0] < 8 or comm.world_size < state[1]:
        if not joined and first == 1 and state[0] == 3:
            os._exit(9)
        x = np.array([1], np.int64)
        try:
            comm.all_reduce(x)
            ok = 1
        except (oxccl.PeerLostError, oxccl.AbortedError, oxccl.RevokedError):
            ok = 0
        a = comm.agree(ok)
        if a.flag == 0 or a.failed:
            comm = comm.shrink()
            continue
        assert x[0] == comm.world_size, (x, comm)
        state[0] = min(state[0] + 1, 8)
        if a.joiners:
            comm = comm.grow(a.joiners)
            comm.broadcast(state, 0)
        time.sleep(0.02)
    print("elastic ok rank %d of %d joined=%d" % (comm.rank, comm.world_size, joined))


def config(comm):
    try:
        oxccl.init(spin_us="a lot")
    except oxccl.ConfigError as e:
        assert "OXCCL_SPIN_US" in str(e) and isinstance(e, ValueError), e
        print("ConfigError", e)
        return
    raise AssertionError("no ConfigError")


if __name__ == "__main__":
    scenario = sys.argv[1]
    comm = oxccl.init()
    globals()[scenario](comm)
