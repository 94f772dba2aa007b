"""A ``torch.distributed`` backend named ``oxccl``: ``import oxccl.torch`` registers it, then

    dist.init_process_group("oxccl")          # under torchrun

and every group, subgroup and DeviceMesh dimension made with ``backend="oxccl"`` (or inheriting
the default) runs on an oxccl communicator. CPU tensors of every dtype oxccl has (bf16 and
f16 included), contiguous.

Bootstrap: each group's ranks meet through the store torch hands the backend (the group's
prefix store): group rank 0 draws a random secret and publishes it there, and the ranks then
exchange their addresses through the same store (``Config::init_rendezvous``). So nothing
beyond torch's own rendezvous (MASTER_ADDR/MASTER_PORT) is needed.

With ``async_op=True`` (what DDP's gradient hooks and FSDP ask for), all_reduce, broadcast,
reduce, all_gather into one tensor, reduce_scatter of one tensor and all_to_all_single start
and return at once: a helper thread per group waits for each in order and completes its
future, so communication overlaps the caller's computation. Blocking calls, and the other
operations, run to completion before they return.

CUDA tensors: a group's collectives on CUDA tensors run on an oxccl ``nccl`` communicator
(``rccl`` under a ROCm build of torch), made through the same store at the group's first
collective on a CUDA tensor (every member makes it there, on its tensor's device, as torch's
own NCCL group does), and ordered after the work queued on torch's current stream. Where NCCL
cannot be loaded, or ``OXCCL_BACKEND`` names a host backend (``cpu``), CUDA tensors are staged through pinned
host memory by the cpu communicator instead (copies ordered after the default stream's work,
pipelined for large ones), with one warning. Point-to-point and barrier always run on the cpu
communicator: a pair of ranks cannot make a group-wide communicator on its own.

The group is a ``torch.distributed.ProcessGroup`` subclass, so torch's functions call its
methods and get its works directly (a Python ``Backend``'s works reach the caller through
torch's C++ ``PyWorkHolder``, which answers only ``wait()`` and ``get_future()``: no
``is_completed()``, ``result()``, ``exception()`` or sender). It
also registers, for ``cpu`` and ``cuda``, a Backend that forwards to it, so that every path
that looks a group's backend up by device (``_device_types``, ``monitored_barrier``'s check,
C++ code asking for the device's backend) finds it, in subgroups too.

Works: every operation returns a ``torch.distributed.Work`` of this module's own, whose
``wait()`` raises the operation's error (a work made by torch from a future only waits, so an
async operation's failure would go unseen) and whose receives know their sender.

Point-to-point: ``isend``/``irecv`` start at once and complete independently of the
collectives (receives complete in the order posted), so ``batch_isend_irecv`` may post
receives before sends. ``recv``/``irecv`` without ``src`` receive from any rank; the work's
``_source_rank()`` says which.

``monitored_barrier``: rank 0 waits for every rank's check-in until the timeout and names the
ranks that did not come ("Rank 1 failed to pass monitoredBarrier ...", all of them with
``wait_all_ranks``); the others wait for rank 0's answer and fail if it reports a failure or
does not come. Its messages use tags from ``MONITORED_BARRIER_TAG`` up, which user
point-to-point should not use.

Sparse (COO) tensors: ``all_reduce`` with SUM gathers every rank's indices and values and sums
duplicates, as gloo does; the result replaces the tensor's contents (coalesced).
"""

import queue
import secrets
import threading
import time
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Backend as _C10dBackend
from torch.futures import Future

from . import Communicator, _describe
from ._oxccl import configured_backend as _configured_backend
from ._oxccl import init_store as _init_store
from .errors import BackendUnavailableError, InvalidArgumentError, OxcclError

BACKEND = "oxccl"

# The tags of monitored_barrier's messages: this one plus the call's number (mod 2^16).
MONITORED_BARRIER_TAG = 0xFFFF0000

_OPS = {
    dist.ReduceOp.SUM: "sum",
    dist.ReduceOp.PRODUCT: "prod",
    dist.ReduceOp.MIN: "min",
    dist.ReduceOp.MAX: "max",
    dist.ReduceOp.AVG: "avg",
}


def _op(opts):
    op = getattr(opts, "reduceOp", opts)
    for k, v in _OPS.items():
        if op == k:
            return v
    raise InvalidArgumentError(f"the oxccl backend does not support reduce op {op}; use SUM, PRODUCT, MIN, MAX or AVG")


class _Work(dist.Work):
    """The work of every operation: ``wait()`` raises the operation's error (torch's works
    made from a future only wait), ``is_completed()``, ``is_success()``, ``exception()``,
    ``result()`` and ``get_future()`` answer, and a receive knows its sender
    (``_source_rank()``, a group rank)."""

    def __init__(self, fut, result):
        super().__init__()
        self._fut, self._result = fut, result
        self._error = None
        self._source = -1
        self._settled = threading.Event()
        fut.add_done_callback(lambda _: self._settled.set())

    def _fail(self, e):
        self._error = e
        self._fut.set_exception(e)

    def wait(self, timeout=None):
        seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else None
        if seconds is not None and seconds > 0 and not self._settled.wait(seconds):
            raise RuntimeError(f"the oxccl operation did not complete within {seconds} s")
        self._fut.wait()  # raises the operation's error
        return True

    def is_completed(self):
        return self._fut.done()

    def is_success(self):
        return self._fut.done() and self._error is None

    def exception(self):
        return self._error

    def result(self):
        self.wait()
        return self._result

    def get_future(self):
        return self._fut

    def _source_rank(self):
        self.wait()
        if self._source < 0:
            raise RuntimeError("this work is not a receive: it has no source rank")
        return self._source

    source_rank = _source_rank


def _done(result):
    fut = Future()
    fut.set_result(result)
    return _Work(fut, result)


def _async(opts):
    """Whether torch asked for an async operation (its option objects say asyncOp)."""
    return bool(getattr(opts, "asyncOp", False))


class _Completer:
    """A daemon thread that waits for a group's async operations in the order they started
    and completes their torch futures (with the tensors, or the operation's error)."""

    def __init__(self, on_error=None):
        self._queue = queue.SimpleQueue()
        self._thread = None
        self._lock = threading.Lock()
        self._on_error = on_error

    def submit(self, work, result):
        """Completes the returned work's future with ``result`` once ``work`` (one operation,
        or a list of them, waited for in order) has completed."""
        done = _Work(Future(), result)
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="oxccl-torch-completer", daemon=True)
                self._thread.start()
        self._queue.put((work, done))
        return done

    def stop(self):
        """Stops the thread once it has completed what was submitted, without waiting for
        it (from any thread, a completion callback's included); returns the thread."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
        return thread

    def close(self):
        """Completes what was submitted, then stops the thread and waits for it. A daemon
        thread still completing a future while the interpreter exits is stopped inside torch's
        C++ code, which aborts the process ("terminate called without an active exception")."""
        thread = self.stop()
        if thread is not None:
            thread.join()

    def _run(self):
        while True:
            item = self._queue.get()
            if item is None:
                return
            work, done = item
            try:
                for w in work if isinstance(work, list) else (work,):
                    got = w.wait()
                    if got is not None:  # a receive: (source, count)
                        done._source = got[0]
            except BaseException as e:  # the operation's error goes to its waiter
                if self._on_error is not None:
                    self._on_error(e)
                done._fail(e)
            else:
                done._fut.set_result(done._result)


def _empty(n, like):
    """An uninitialised 1-D tensor of ``n`` elements, of ``like``'s dtype and device."""
    return torch.empty(n, dtype=like.dtype, device=like.device)


def _flat(t):
    """A 1-D view of a contiguous tensor (no copy)."""
    if not t.is_contiguous():
        raise InvalidArgumentError("the oxccl backend needs contiguous tensors; pass .contiguous() of it")
    return t.view(-1)


class ProcessGroupOxccl(dist.ProcessGroup):
    """A torch ProcessGroup whose collectives run on an oxccl communicator."""

    def __init__(self, comm: Communicator, bootstrap=None):
        super().__init__(comm.rank, comm.world_size)
        self._comm = comm
        self._c = comm._c
        self._name = None
        self._desc = "undefined"
        # The group's backend for each device, as torch's own groups have them.
        self._device_backend = _DeviceBackend(self)
        custom = dist.ProcessGroup.BackendType.CUSTOM
        self._set_default_backend(custom)
        for device in ("cpu", "cuda"):
            self._register_backend(torch.device(device), custom, self._device_backend)
        # The first error an async operation met, for errored().
        self._error = None
        self._completer = _Completer(self._note_error)
        # Point-to-point completes apart from the collectives (a receive waits for its peer).
        self._p2p_completer = _Completer(self._note_error)
        self._monitored = 0
        self._bootstrap = bootstrap
        # CUDA tensors' communicator, once made: (raw communicator or None for staging,
        # its device), and its views ordered after each torch stream met.
        self._cuda = None
        self._by_stream = {}

    # --- which communicator a tensor's collective runs on ---------------------------
    def _on(self, t):
        """The raw communicator for a collective on tensor ``t`` (see the module text)."""
        if t.device.type != "cuda":
            return self._c
        if self._cuda is None:
            self._cuda = (self._make_cuda(t.device), t.device)
        raw, device = self._cuda
        if raw is None:
            return self._c
        if t.device != device:
            raise InvalidArgumentError(
                f"this group's CUDA communicator is on {device}, the tensor is on {t.device}: "
                "keep each rank's CUDA tensors of a group on one device (torch.cuda.set_device)")
        stream = torch.cuda.current_stream(device).cuda_stream
        view = self._by_stream.get(stream)
        if view is None:
            if len(self._by_stream) >= 64:
                self._by_stream.clear()
            view = self._by_stream[stream] = raw.after_stream(stream)
        return view

    def _make_cuda(self, device):
        """The group's GPU communicator on ``device`` (collective), or None to stage."""
        configured = _configured_backend(None)
        backend = _cuda_backend(configured, torch.version.hip is not None)
        why = f"OXCCL_BACKEND={configured} asks for it"
        if backend is not None and self._bootstrap is not None:
            try:
                return self._bootstrap.make("cuda/", {"OXCCL_BACKEND": backend, "OXCCL_GPU_DEVICE": str(device.index)})
            except BackendUnavailableError as e:
                why = str(e)
        elif self._bootstrap is None:
            why = "this group was not made by torch.distributed"
        warnings.warn(f"oxccl: CUDA tensors are staged through host memory by the cpu backend ({why})")
        return None

    # --- identity -------------------------------------------------------------------
    def getBackendName(self):
        return BACKEND

    # torch names groups through these (DeviceMesh, the registry of groups); a Python group
    # has no C++ backend to hold them.
    def _set_group_name(self, name):
        self._name = name

    @property
    def group_name(self):
        if self._name is None:
            raise RuntimeError("this oxccl process group has not been named by torch.distributed yet")
        return self._name

    def _set_group_desc(self, desc):
        self._desc = desc

    @property
    def group_desc(self):
        return self._desc

    @property
    def comm(self):
        """The oxccl communicator underneath."""
        return self._comm

    def __repr__(self):
        return f"ProcessGroupOxccl(rank={self.rank()}, size={self.size()})"

    # --- collectives ----------------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        op = _op(opts) if opts is not None else "sum"
        if any(t.is_sparse for t in tensors):
            for t in tensors:
                self._sparse_all_reduce(t, op)
            return _done(tensors)
        if _async(opts) and len(tensors) == 1:
            d, keep = _describe(tensors[0], True, "tensor")
            return self._completer.submit(self._on(tensors[0]).start_all_reduce(d, op, keep), tensors)
        for t in tensors:
            d, keep = _describe(t, True, "tensor")
            self._on(t).all_reduce(d, op)
        return _done(tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    def _sparse_all_reduce(self, t, op):
        """All-reduce (SUM) of a sparse COO tensor, as gloo does it: every rank's indices
        and values are gathered (padded to the largest count), summed where they repeat,
        and the result replaces ``t``'s contents."""
        if op != "sum":
            raise InvalidArgumentError(f"all_reduce of a sparse tensor supports SUM only, not {op}")
        if t.layout != torch.sparse_coo:
            raise InvalidArgumentError(f"all_reduce of sparse tensors supports the COO layout, not {t.layout}")
        mine = t.coalesce()
        indices, values = mine.indices().contiguous(), mine.values().contiguous()
        n = self.size()
        nnz = torch.tensor([indices.shape[1]], dtype=torch.int64)
        counts = torch.empty(n, dtype=torch.int64)
        self._allgather_flat(nnz, counts)
        top = int(counts.max())
        idx = torch.zeros((indices.shape[0], top), dtype=torch.int64)
        idx[:, : indices.shape[1]] = indices
        val = torch.zeros((top,) + tuple(values.shape[1:]), dtype=values.dtype)
        val[: values.shape[0]] = values
        all_idx = torch.empty((n,) + tuple(idx.shape), dtype=torch.int64)
        all_val = torch.empty((n,) + tuple(val.shape), dtype=values.dtype)
        self._allgather_flat(idx, all_idx)
        self._allgather_flat(val, all_val)
        parts_i = [all_idx[r][:, : int(counts[r])] for r in range(n)]
        parts_v = [all_val[r][: int(counts[r])] for r in range(n)]
        total = torch.sparse_coo_tensor(torch.cat(parts_i, 1), torch.cat(parts_v, 0), t.shape).coalesce()
        t.copy_(total)

    def _allgather_flat(self, inp, out):
        """All-gather of contiguous host tensors (``out`` holds every rank's ``inp``)."""
        i, k1 = _describe(_flat(inp), False, "input")
        o, k2 = _describe(_flat(out), True, "output")
        self._c.all_gather(i, o)

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        """``all_gather_coalesced``: rank r's i-th input lands in ``output_lists[r][i]``.
        The inputs go as one flat all-gather (one dtype, as gloo requires)."""
        n = self.size()
        if len(output_lists) != n:
            raise InvalidArgumentError(f"all_gather_coalesced: {len(output_lists)} output lists for {n} ranks")
        dtypes = {t.dtype for t in input_list}
        if len(dtypes) > 1:
            raise InvalidArgumentError(f"all_gather_coalesced: the inputs have several dtypes {sorted(map(str, dtypes))}")
        for r, outs in enumerate(output_lists):
            if len(outs) != len(input_list) or any(o.numel() != i.numel() for o, i in zip(outs, input_list)):
                raise InvalidArgumentError(f"all_gather_coalesced: output list {r} does not match the inputs' sizes")
        if not input_list:
            return _done(output_lists)
        real = [torch.view_as_real(t) if t.is_complex() else t for t in input_list]
        flat = torch.cat([t.reshape(-1) for t in real])
        out = _empty(n * flat.numel(), flat)
        i, k1 = _describe(flat, False, "input")
        o, k2 = _describe(out, True, "output")
        self._on(flat).all_gather(i, o)
        for r, outs in enumerate(output_lists):
            at = r * flat.numel()
            for o, t in zip(outs, real):
                block = out[at : at + t.numel()].view_as(t)
                o.copy_(torch.view_as_complex(block) if o.is_complex() else block)
                at += t.numel()
        return _done(output_lists)

    def reduce(self, tensors, opts):
        op, root = _op(opts), opts.rootRank
        if _async(opts) and len(tensors) == 1:
            d, keep = _describe(tensors[0], True, "tensor")
            return self._completer.submit(self._on(tensors[0]).start_reduce(d, op, root, keep), tensors)
        for t in tensors:
            d, keep = _describe(t, True, "tensor")
            self._on(t).reduce(d, op, root)
        return _done(tensors)

    def broadcast(self, tensors, opts):
        root = opts.rootRank
        if _async(opts) and len(tensors) == 1:
            d, keep = _describe(tensors[0], True, "tensor")
            return self._completer.submit(self._on(tensors[0]).start_broadcast(d, root, keep), tensors)
        for t in tensors:
            d, keep = _describe(t, True, "tensor")
            self._on(t).broadcast(d, root)
        return _done(tensors)

    def allgather(self, output_tensors, input_tensors, opts=None):
        for outs, inp in zip(output_tensors, input_tensors):
            flat = _empty(len(outs) * inp.numel(), inp)
            i, k1 = _describe(inp, False, "input")
            o, k2 = _describe(flat, True, "output")
            self._on(inp).all_gather(i, o)
            for r, out in enumerate(outs):
                out.copy_(flat[r * inp.numel():(r + 1) * inp.numel()].view_as(out))
        return _done(output_tensors)

    def _allgather_base(self, output, input, opts=None):
        i, k1 = _describe(_flat(input), False, "input")
        o, k2 = _describe(_flat(output), True, "output")
        if _async(opts):
            return self._completer.submit(self._on(input).start_all_gather(i, o, (k1, k2)), [output])
        self._on(input).all_gather(i, o)
        return _done([output])

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        if _async(opts):
            works = []
            for out, inp in zip(outputs, inputs):
                i, k1 = _describe(_flat(inp), False, "input")
                o, k2 = _describe(_flat(out), True, "output")
                works.append(self._on(inp).start_all_gather(i, o, (k1, k2)))
            return self._completer.submit(works, outputs)
        for out, inp in zip(outputs, inputs):
            self._allgather_base(out, inp, None)
        return _done(outputs)

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        op = _op(opts) if opts is not None else "sum"
        for out, ins in zip(output_tensors, input_tensors):
            flat = torch.cat([_flat(t) for t in ins])
            i, k1 = _describe(flat, False, "input")
            o, k2 = _describe(_flat(out), True, "output")
            self._on(flat).reduce_scatter(i, o, op)
        return _done(output_tensors)

    def _reduce_scatter_base(self, output, input, opts=None):
        op = _op(opts) if opts is not None else "sum"
        i, k1 = _describe(_flat(input), False, "input")
        o, k2 = _describe(_flat(output), True, "output")
        if _async(opts):
            return self._completer.submit(self._on(input).start_reduce_scatter(i, o, op, (k1, k2)), [output])
        self._on(input).reduce_scatter(i, o, op)
        return _done([output])

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        op = _op(opts) if opts is not None else "sum"
        works = []
        for out, inp in zip(outputs, inputs):
            i, k1 = _describe(_flat(inp), False, "input")
            o, k2 = _describe(_flat(out), True, "output")
            if _async(opts):
                works.append(self._on(inp).start_reduce_scatter(i, o, op, (k1, k2)))
            else:
                self._on(inp).reduce_scatter(i, o, op)
        return self._completer.submit(works, outputs) if works else _done(outputs)

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        n = self.size()
        if not output_split_sizes and not input_split_sizes:
            if input.numel() % n or output.numel() != input.numel():
                raise InvalidArgumentError(
                    f"all_to_all_single: input and output need the same number of elements, a multiple of {n}")
            i, k1 = _describe(_flat(input), False, "input")
            o, k2 = _describe(_flat(output), True, "output")
            if _async(opts):
                return self._completer.submit(self._on(input).start_all_to_all(i, o, (k1, k2)), [output])
            self._on(input).all_to_all(i, o)
            return _done([output])
        # Splits are rows of dimension 0 (an empty list: equal splits).
        def counts(t, splits):
            rows = t.shape[0] if t.dim() else 1
            row = t.numel() // rows if rows else 0
            if not splits:
                if rows % n:
                    raise InvalidArgumentError(f"all_to_all_single: {rows} rows do not split evenly over {n} ranks")
                splits = [rows // n] * n
            if len(splits) != n or sum(splits) != rows:
                raise InvalidArgumentError(
                    f"all_to_all_single: splits {list(splits)} do not give {rows} rows to {n} ranks")
            return [s * row for s in splits]
        send, recv = counts(input, input_split_sizes), counts(output, output_split_sizes)
        i, k1 = _describe(_flat(input), False, "input")
        o, k2 = _describe(_flat(output), True, "output")
        self._on(input).all_to_all_v(i, send, o, recv)
        return _done([output])

    def alltoall(self, output_tensors, input_tensors, opts=None):
        inp = torch.cat([_flat(t) for t in input_tensors])
        out = torch.empty_like(inp)
        self.alltoall_base(out, inp, [], [], opts)
        at = 0
        for t in output_tensors:
            t.copy_(out[at:at + t.numel()].view_as(t))
            at += t.numel()
        return _done(output_tensors)

    def gather(self, output_tensors, input_tensors, opts):
        root, n = opts.rootRank, self.size()
        inp = input_tensors[0]
        flat = _empty(n * inp.numel(), inp) if self.rank() == root else None
        i, k1 = _describe(_flat(inp), False, "input")
        o, k2 = (None, None) if flat is None else _describe(flat, True, "output")
        self._on(inp).gather(i, o, root)
        if flat is not None:
            for r, out in enumerate(output_tensors[0]):
                out.copy_(flat[r * inp.numel():(r + 1) * inp.numel()].view_as(out))
        return _done(output_tensors)

    def scatter(self, output_tensors, input_tensors, opts):
        root = opts.rootRank
        out = output_tensors[0]
        flat = torch.cat([_flat(t) for t in input_tensors[0]]) if self.rank() == root else None
        i, k1 = (None, None) if flat is None else _describe(flat, False, "input")
        o, k2 = _describe(_flat(out), True, "output")
        self._on(out).scatter(i, o, root)
        return _done(output_tensors)

    def gather_single(self, output, input, opts):
        root = opts.rootRank
        i, k1 = _describe(_flat(input), False, "input")
        o, k2 = _describe(_flat(output), True, "output") if self.rank() == root else (None, None)
        self._on(input).gather(i, o, root)
        return _done([output])

    # The names torch 2.10 and later call (and the older ones above, for older torch).
    all_gather_single = _allgather_base
    all_gather_single_coalesced = allgather_into_tensor_coalesced
    reduce_scatter_single = _reduce_scatter_base
    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced
    all_to_all_single = alltoall_base

    def _get_backend(self, device=None):
        # torch asks a group for its backend per device (batch_isend_irecv, ...): this group
        # is its own backend.
        return self

    supports_coalescing = False

    def _start_coalescing(self, device=None):
        # Operations run as they are called; a coalesced batch is their sequence.
        pass

    def _end_coalescing(self, device=None):
        return _done([])

    # --- point-to-point: started at once, completed apart from the collectives -------
    def _p2p(self, tensors, start):
        """Starts ``start(desc, keep)`` on every tensor; the work completes with them all."""
        works = []
        for t in tensors:
            d, keep = _describe(_flat(t), True, "tensor")
            works.append(start(d, keep))
        return works

    def send(self, tensors, dst_rank, tag=0):
        works = self._p2p(tensors, lambda d, keep: self._c.start_send(d, dst_rank, tag, keep))
        return self._p2p_completer.submit(works, tensors)

    def recv(self, tensors, src_rank, tag=0):
        works = self._p2p(tensors, lambda d, keep: self._c.start_recv(d, src_rank, tag, keep))
        return self._p2p_completer.submit(works, tensors)

    def recv_anysource(self, tensors, tag=0):
        if len(tensors) != 1:
            raise InvalidArgumentError(f"a receive from any source takes one tensor, not {len(tensors)}")
        works = self._p2p(tensors, lambda d, keep: self._c.start_recv_any(d, tag, keep))
        return self._p2p_completer.submit(works, tensors)

    def barrier(self, opts=None):
        # A timeout given to this call (BarrierOptions.timeout; torch's "unset" is negative)
        # overrides the group's.
        timeout = getattr(opts, "timeout", None)
        seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else -1.0
        (self._c.with_timeout(seconds) if seconds > 0 else self._c).barrier()
        return _done([])

    def monitored_barrier(self, opts=None, wait_all_ranks=False):
        """gloo's monitored barrier (see the module text): rank 0 names the ranks that did not
        check in before the timeout (``opts``: a timedelta, as torch's function passes it, or
        BarrierOptions, as its C++ layer does)."""
        timeout = opts if isinstance(opts, timedelta) else getattr(opts, "timeout", None)
        seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else self._comm.timeout
        if seconds < 0:
            seconds = self._comm.timeout
        tag = MONITORED_BARRIER_TAG + (self._monitored % 0x10000)
        self._monitored += 1
        _monitored_barrier(self._c, self.rank(), self.size(), tag, seconds, wait_all_ranks)
        return _done([])

    def _note_error(self, e):
        if self._error is None:
            self._error = e

    def errored(self):
        """The first error an async operation of this group failed with, or None (torchft's
        question before it commits a step: an error nobody waited for still counts)."""
        return self._error

    def abort(self):
        """Ends every pending and later operation of the group with ``AbortedError`` at once
        (on this rank), and lets the helper threads end once they have failed them."""
        why = "torch.distributed aborted the process group"
        if self._cuda is not None and self._cuda[0] is not None:
            self._cuda[0].abort(why)
        self._c.abort(why)
        self._completer.stop()
        self._p2p_completer.stop()

    def shutdown(self):
        """torch's destroy_process_group: the async operations already started complete,
        and the helper threads that complete them end."""
        self._completer.close()
        self._p2p_completer.close()


class _DeviceBackend(_C10dBackend):
    """The Backend a ProcessGroupOxccl registers for its devices: every operation goes to
    the group's own method (for torch code that reaches a group's work through the device's
    backend)."""

    def __init__(self, pg):
        super().__init__(pg.rank(), pg.size())
        self._pg = pg

    def getBackendName(self):
        return BACKEND


for _name in ("allreduce", "allreduce_coalesced", "reduce", "broadcast", "allgather", "_allgather_base",
              "allgather_coalesced", "allgather_into_tensor_coalesced", "reduce_scatter", "_reduce_scatter_base",
              "reduce_scatter_tensor_coalesced", "alltoall_base", "alltoall", "gather", "scatter", "send", "recv",
              "recv_anysource", "barrier", "monitored_barrier", "abort", "shutdown"):
    setattr(_DeviceBackend, _name, lambda self, *a, _n=_name, **k: getattr(self._pg, _n)(*a, **k))


def _poll(seconds, ready):
    """Calls ``ready()`` until it is true or ``seconds`` have passed; whether it became true."""
    deadline = time.monotonic() + seconds
    pause = 0.0001
    while True:
        if ready():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
        pause = min(pause * 2, 0.01)


def _has(c, peer, tag):
    """Whether ``peer``'s message with ``tag`` has arrived; a rank that is gone has not."""
    try:
        return c.probe(peer, tag) is not None
    except OxcclError:
        return False


def _monitored_barrier(c, rank, n, tag, seconds, wait_all_ranks):
    """The monitored barrier's protocol on raw communicator ``c``: every rank checks in with
    rank 0 (a 1-element message), rank 0 waits for them until ``seconds`` have passed (by
    probing, which fails nothing: a late rank's message stays unread under this call's tag)
    and answers each rank that came with 1 (every rank passed) or 0 (some did not)."""
    ms = int(seconds * 1000)
    if rank != 0:
        one = torch.ones(1, dtype=torch.int32)
        answer = torch.zeros(1, dtype=torch.int32)
        try:
            d, keep = _describe(one, False, "check-in")
            c.send(d, 0, tag)
            came = _poll(seconds, lambda: _has(c, 0, tag))
            if came:
                d, keep = _describe(answer, True, "answer")
                c.recv(d, 0, tag)
            why = "it did not answer in time" if not came else "it reported ranks that did not arrive"
        except OxcclError as e:
            came, why = False, str(e)
        if not came or int(answer[0]) != 1:
            raise RuntimeError(
                f"Rank {rank} successfully reached monitoredBarrier, but received errors while waiting for "
                f"send/recv from rank 0 ({why}). Please check rank 0 logs for faulty rank.")
        return
    start = time.monotonic()
    arrived, missing, error = set(), [], None
    for r in range(1, n):
        left = seconds - (time.monotonic() - start)
        if left <= 0 and not wait_all_ranks and not _has(c, r, tag):
            done = ", ".join(map(str, sorted(arrived))) or "none"
            error = (f"Rank {rank} timed out in monitoredBarrier after {ms} ms. Ranks that arrived: {done}; "
                     f"rank {r} and the ranks after it were not waited for")
            break
        if _poll(max(left, 0.0), lambda: _has(c, r, tag)):
            arrived.add(r)
        elif wait_all_ranks:
            missing.append(r)
        else:
            error = f"Rank {r} failed to pass monitoredBarrier in {ms} ms"
            break
    if missing:
        error = f"Ranks {', '.join(map(str, missing))} failed to pass monitoredBarrier in {ms} ms"
    # Every rank that has checked in by now hears the verdict at once.
    arrived |= {r for r in range(1, n) if r not in arrived and _has(c, r, tag)}
    answer = torch.tensor([0 if error else 1], dtype=torch.int32)
    for r in sorted(arrived):
        got = torch.zeros(1, dtype=torch.int32)
        d, keep = _describe(got, True, "check-in")
        c.recv(d, r, tag)
        d, keep = _describe(answer, False, "answer")
        c.send(d, r, tag)
    if error:
        raise RuntimeError(error)


def _cuda_backend(configured, rocm):
    """The oxccl backend for CUDA tensors given ``OXCCL_BACKEND`` (``configured``) and whether
    torch is a ROCm build: a GPU backend named there, ``None`` (stage through the cpu
    communicator) for ``cpu``, else the vendor's."""
    if configured == "auto":
        return "rccl" if rocm else "nccl"
    return configured if configured in ("nccl", "rccl") else None


class _Bootstrap:
    """How a group's ranks make communicators: through the group's store, with its secret."""

    def __init__(self, store, rank, world_size, timeout):
        self._store, self.rank, self.world_size = store, rank, world_size
        # Every creation of a group on this store gets keys of its own: torch gives a group
        # created again (init_process_group after destroy_process_group, while something
        # still holds the old group and with it the store) the same store prefix, where the
        # old group's keys remain, and a rank reading them would join the old group's
        # segments or take its secret. Each rank counts itself in once per creation, and no
        # rank counts itself into the next before every rank counted into this one (the
        # group's set-up needs them all).
        generation = (store.add("oxccl/creations", 1) - 1) // world_size
        self._ns = f"oxccl/{generation}/"
        key = f"{self._ns}secret"
        if rank == 0:
            store.set(key, secrets.token_hex(16))
        self._secret = store.get(key).decode()
        self._opts = {"OXCCL_TIMEOUT": f"{timeout.total_seconds()}s"} if isinstance(timeout, timedelta) else {}

    def make(self, prefix, options):
        """A raw communicator of the group whose ranks meet under ``prefix`` in the store."""
        store = self._store

        ns = self._ns

        def put(k, v):
            store.set(f"{ns}{prefix}{k}", v)

        def get(k, seconds):
            store.wait([f"{ns}{prefix}{k}"], timedelta(seconds=seconds))
            return store.get(f"{ns}{prefix}{k}")

        return _init_store(self.rank, self.world_size, put, get, self._secret, {**self._opts, **options})


def _create(store, rank, world_size, timeout):
    """torch's constructor hook: a group's ranks meet through its prefix store."""
    boot = _Bootstrap(store, rank, world_size, timeout)
    # CPU tensors run on the cpu backend, whatever OXCCL_BACKEND says for CUDA tensors.
    return ProcessGroupOxccl(Communicator(boot.make("", {"OXCCL_BACKEND": "cpu"})), boot)


dist.Backend.register_backend(BACKEND, _create, devices=["cpu", "cuda"])

__all__ = ["ProcessGroupOxccl", "BACKEND"]
