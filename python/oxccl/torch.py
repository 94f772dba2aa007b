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
"""

import queue
import secrets
import threading
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future
from torch.futures import Future

from . import Communicator, _describe
from ._oxccl import configured_backend as _configured_backend
from ._oxccl import init_store as _init_store
from .errors import BackendUnavailableError, InvalidArgumentError

BACKEND = "oxccl"

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


def _done(result):
    fut = Future()
    fut.set_result(result)
    return _create_work_from_future(fut)


def _async(opts):
    """Whether torch asked for an async operation (its option objects say asyncOp)."""
    return bool(getattr(opts, "asyncOp", False))


class _Completer:
    """A daemon thread that waits for a group's async operations in the order they started
    and completes their torch futures (with the tensors, or the operation's error)."""

    def __init__(self):
        self._queue = queue.SimpleQueue()
        self._thread = None
        self._lock = threading.Lock()

    def submit(self, work, result):
        """Completes the returned work's future with ``result`` once ``work`` (one operation,
        or a list of them, waited for in order) has completed."""
        fut = Future()
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="oxccl-torch-completer", daemon=True)
                self._thread.start()
        self._queue.put((work, fut, result))
        return _create_work_from_future(fut)

    def close(self):
        """Completes what was submitted, then stops the thread and waits for it. A daemon
        thread still completing a future while the interpreter exits is stopped inside torch's
        C++ code, which aborts the process ("terminate called without an active exception")."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join()

    def _run(self):
        while True:
            item = self._queue.get()
            if item is None:
                return
            work, fut, result = item
            try:
                for w in work if isinstance(work, list) else (work,):
                    w.wait()
            except BaseException as e:  # the operation's error goes to its waiter
                fut.set_exception(e)
            else:
                fut.set_result(result)


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
        self._completer = _Completer()
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
        if _async(opts) and len(tensors) == 1:
            d, keep = _describe(tensors[0], True, "tensor")
            return self._completer.submit(self._on(tensors[0]).start_all_reduce(d, op, keep), tensors)
        for t in tensors:
            d, keep = _describe(t, True, "tensor")
            self._on(t).all_reduce(d, op)
        return _done(tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

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

    def recv_anysource(self, tensors, tag=0):
        raise InvalidArgumentError("the oxccl backend receives from a named rank; pass src to recv")

    def barrier(self, opts=None):
        self._c.barrier()
        return _done([])

    def send(self, tensors, dst_rank, tag=0):
        for t in tensors:
            d, keep = _describe(_flat(t), False, "tensor")
            self._c.send(d, dst_rank, tag)
        return _done(tensors)

    def recv(self, tensors, src_rank, tag=0):
        for t in tensors:
            d, keep = _describe(_flat(t), True, "tensor")
            self._c.recv(d, src_rank, tag)
        return _done(tensors)

    def abort(self):
        why = "torch.distributed aborted the process group"
        if self._cuda is not None and self._cuda[0] is not None:
            self._cuda[0].abort(why)
        self._c.abort(why)

    def shutdown(self):
        """torch's destroy_process_group: the async operations already started complete,
        and the helper thread that completes them ends."""
        self._completer.close()


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
