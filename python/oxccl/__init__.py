"""oxccl: collective communications across processes and hosts.

    import numpy as np, oxccl
    comm = oxccl.init()                 # under oxccl run, torchrun, mpirun or Slurm
    x = np.full(4, comm.rank, dtype=np.float32)
    comm.all_reduce(x)                  # in place: every rank now holds the sum

Buffers are numpy arrays, torch CPU tensors, DLPack exporters or writable buffer-protocol
objects, used in place without copies; they must be contiguous. Every call blocks until this
rank's part is done (the GIL released meanwhile), or, with ``async_op=True`` (all_reduce,
all_reduce_into, reduce, broadcast, all_gather, reduce_scatter, all_to_all), returns a
:class:`Work` at once whose ``wait()`` blocks and ``is_completed()`` does not. Errors are the classes of :mod:`oxccl.errors`.
"""

import collections as _collections
import enum as _enum

from . import errors
from ._buffers import describe as _describe
from ._oxccl import Communicator as _RawCommunicator  # noqa: F401
from ._oxccl import Work
from ._oxccl import __version__
from ._oxccl import dtypes as _dtypes
from ._oxccl import init as _init
from ._oxccl import join as _join
from .errors import *  # noqa: F401,F403  (the exception classes, at the top level too)


class ReduceOp(str, _enum.Enum):
    """How values combine. Plain strings (``"sum"``, ...) work too."""

    SUM = "sum"
    PROD = "prod"
    MIN = "min"
    MAX = "max"
    AVG = "avg"


def _op(op):
    return op.value if isinstance(op, ReduceOp) else op


class Communicator:
    """A group of ranks that run collectives together (from :func:`init`, :meth:`split`
    or :meth:`new_group`). Every rank of it must issue the same collectives in the same
    order."""

    __slots__ = ("_c",)

    def __init__(self, raw):
        self._c = raw

    @property
    def rank(self):
        """This process's rank in the communicator."""
        return self._c.rank

    @property
    def world_size(self):
        """Number of ranks."""
        return self._c.world_size

    @property
    def backend(self):
        """The backend's name (``cpu``, ``mpi``, ...)."""
        return self._c.backend

    @property
    def timeout(self):
        """Each operation's deadline, in seconds."""
        return self._c.timeout

    def with_timeout(self, seconds):
        """This communicator with another deadline for its operations."""
        return Communicator(self._c.with_timeout(seconds))

    def all_reduce(self, buf, op=ReduceOp.SUM, async_op=False):
        """Every rank's ``buf`` becomes the element-wise reduction of all ranks' ``buf``.
        With ``async_op=True`` returns a :class:`Work` at once (don't touch ``buf`` until its
        ``wait()`` returns)."""
        d, keep = _describe(buf, True, "buf")
        if async_op:
            return self._c.start_all_reduce(d, _op(op), keep)
        self._c.all_reduce(d, _op(op))

    def all_reduce_into(self, input, output, op=ReduceOp.SUM, async_op=False):
        """``output`` becomes the reduction of all ranks' ``input`` (same length)."""
        i, k1 = _describe(input, False, "input")
        o, k2 = _describe(output, True, "output")
        if async_op:
            return self._c.start_all_reduce_into(i, o, _op(op), (k1, k2))
        self._c.all_reduce_into(i, o, _op(op))

    def reduce(self, buf, root, op=ReduceOp.SUM, async_op=False):
        """The root's ``buf`` becomes the reduction of all ranks' ``buf``; the others' stay."""
        d, keep = _describe(buf, True, "buf")
        if async_op:
            return self._c.start_reduce(d, _op(op), root, keep)
        self._c.reduce(d, _op(op), root)

    def reduce_into(self, input, output, root, op=ReduceOp.SUM):
        """The root's ``output`` becomes the reduction of all ranks' ``input``; ``output`` is
        ignored (may be None) off the root."""
        i, k1 = _describe(input, False, "input")
        o, k2 = (None, None) if output is None else _describe(output, True, "output")
        self._c.reduce_into(i, o, _op(op), root)

    def broadcast(self, buf, root, async_op=False):
        """Every rank's ``buf`` becomes the root's."""
        d, keep = _describe(buf, True, "buf")
        if async_op:
            return self._c.start_broadcast(d, root, keep)
        self._c.broadcast(d, root)

    def all_gather(self, input, output, async_op=False):
        """``output`` (world_size blocks of ``len(input)``) becomes every rank's ``input``,
        in rank order."""
        i, k1 = _describe(input, False, "input")
        o, k2 = _describe(output, True, "output")
        if async_op:
            return self._c.start_all_gather(i, o, (k1, k2))
        self._c.all_gather(i, o)

    def all_gather_in_place(self, buf):
        """Block ``rank`` of ``buf`` is this rank's input; every block becomes its rank's."""
        d, keep = _describe(buf, True, "buf")
        self._c.all_gather_in_place(d)

    def reduce_scatter(self, input, output, op=ReduceOp.SUM, async_op=False):
        """``input`` is world_size blocks of ``len(output)``; ``output`` becomes block
        ``rank`` of their reduction over all ranks."""
        i, k1 = _describe(input, False, "input")
        o, k2 = _describe(output, True, "output")
        if async_op:
            return self._c.start_reduce_scatter(i, o, _op(op), (k1, k2))
        self._c.reduce_scatter(i, o, _op(op))

    def all_to_all(self, input, output, async_op=False):
        """Block j of rank i's ``input`` becomes block i of rank j's ``output``."""
        i, k1 = _describe(input, False, "input")
        o, k2 = _describe(output, True, "output")
        if async_op:
            return self._c.start_all_to_all(i, o, (k1, k2))
        self._c.all_to_all(i, o)

    def all_to_all_v(self, input, send_counts, output, recv_counts):
        """``send_counts[j]`` elements of ``input`` (blocks in rank order) go to rank j;
        ``recv_counts[i]`` elements come from rank i into ``output``. Rank j's
        ``recv_counts[i]`` must equal rank i's ``send_counts[j]``."""
        i, k1 = _describe(input, False, "input")
        o, k2 = _describe(output, True, "output")
        self._c.all_to_all_v(i, list(send_counts), o, list(recv_counts))

    def gather(self, input, output, root):
        """The root's ``output`` (world_size blocks) becomes every rank's ``input``;
        ``output`` is ignored (may be None) off the root."""
        i, k1 = _describe(input, False, "input")
        o, k2 = (None, None) if output is None else _describe(output, True, "output")
        self._c.gather(i, o, root)

    def scatter(self, input, output, root):
        """Block r of the root's ``input`` becomes rank r's ``output``; ``input`` is ignored
        (may be None) off the root."""
        i, k1 = (None, None) if input is None else _describe(input, False, "input")
        o, k2 = _describe(output, True, "output")
        self._c.scatter(i, o, root)

    def barrier(self):
        """Returns once every rank has entered it."""
        self._c.barrier()

    def send(self, buf, peer, tag=0, async_op=False):
        """Sends ``buf`` to ``peer`` (returns once it is on its way). With ``async_op=True``
        returns a :class:`Work` (don't change ``buf`` until it completes)."""
        d, keep = _describe(buf, False, "buf")
        if async_op:
            return self._c.start_send(d, peer, tag, keep)
        self._c.send(d, peer, tag)

    def recv(self, buf, peer=None, tag=0, async_op=False):
        """Receives a message from ``peer`` with ``tag`` into ``buf``; returns its length in
        elements (at most ``len(buf)``). Without ``peer``, from whichever rank sends one
        first, and returns ``(source, count)``. With ``async_op=True`` returns a
        :class:`Work` at once, whose ``wait()`` returns ``(source, count)``. Receives
        complete in the order they were posted; messages from one rank with one tag arrive
        in the order they were sent."""
        d, keep = _describe(buf, True, "buf")
        if async_op:
            if peer is None:
                return self._c.start_recv_any(d, tag, keep)
            return self._c.start_recv(d, peer, tag, keep)
        if peer is None:
            return self._c.recv_any(d, tag)
        return self._c.recv(d, peer, tag)

    def probe(self, peer, tag=0):
        """The first message from ``peer`` with ``tag`` not yet received, if one has
        arrived: ``(dtype name, element count)``; None otherwise. Never blocks."""
        return self._c.probe(peer, tag)

    def split(self, color, key=0):
        """The communicator of the ranks that pass the same ``color`` (None: not a member,
        returns None), ordered by ``key`` then rank. Every rank calls it."""
        c = self._c.split(color, key)
        return None if c is None else Communicator(c)

    def new_group(self, ranks):
        """The communicator of ``ranks`` (every rank calls it; None off the group)."""
        c = self._c.new_group(list(ranks))
        return None if c is None else Communicator(c)

    def abort(self, reason="aborted by the application"):
        """Fails this communicator's pending and future operations, and tells the peers."""
        self._c.abort(reason)

    def revoke(self, reason="revoked by the application"):
        """Revokes the communicator, from any thread: every pending and later call on it, on
        every rank, raises :class:`RevokedError`; unlike an aborted one it can still be shrunk
        (``cpu`` and ``local`` backends)."""
        self._c.revoke(reason)

    def agree(self, flag):
        """Fault-tolerant agreement: every survivor gets the same :class:`Agreement`
        ``(flag, failed, joiners)``: the bitwise AND of the live ranks' flags, the ranks found
        dead, even when ranks die during the call, and how many newcomers wait to join (grow
        by that many). Works on a failed communicator; every rank calls it in the same order
        as its other agreements and shrinks."""
        return Agreement(*self._c.agree(flag))

    def grow(self, joiners):
        """A communicator of the members and ``joiners`` newcomers that called
        :func:`join` (the members keep their ranks; newcomers follow in the order they
        reached the store). Every member calls it with the same number; this communicator
        stays usable (``cpu`` backend, on a communicator made by :func:`init`, or shrunk or
        grown from one)."""
        return Communicator(self._c.grow(joiners))

    def shrink(self):
        """After a failure: a communicator of the survivors (agreed, so every survivor gets
        the same one), in the old rank order. Every live rank calls it."""
        c = self._c.shrink_excluding([])
        return Communicator(c)

    def shrink_excluding(self, ranks):
        """A communicator without ``ranks`` (and without the ranks found dead); every rank
        passes the same list, and those listed get None."""
        c = self._c.shrink_excluding(list(ranks))
        return None if c is None else Communicator(c)

    def __repr__(self):
        return repr(self._c)


class Agreement(_collections.namedtuple("Agreement", ["flag", "failed", "joiners"])):
    """What :meth:`Communicator.agree` decided, the same on every survivor: ``flag`` (the
    AND of the live ranks' flags), ``failed`` (the ranks found dead) and ``joiners`` (the
    newcomers waiting to join: :meth:`Communicator.grow` by that many)."""

    __slots__ = ()


def join(**settings):
    """Joins a running job as a newcomer (a replacement for a dead rank, or extra capacity):
    through the job's store (as :func:`init` finds it), waits until the members admit it
    with :meth:`Communicator.grow`, and returns its communicator in the grown world. Under
    ``oxccl run --max-restarts``, a replacement's :func:`init` does this by itself
    (``OXCCL_JOIN=1``). Keyword arguments as :func:`init`'s."""
    return Communicator(_join(_options(settings)))


def _options(settings):
    opts = {}
    for k, v in settings.items():
        name = k.upper()
        opts[name if name.startswith("OXCCL_") else "OXCCL_" + name] = str(v)
    return opts


def init(**settings):
    """Joins the job this process belongs to (the environment ``oxccl run``, torchrun,
    mpirun or Slurm sets) and returns the world communicator. Keyword arguments are
    ``OXCCL_*`` settings on top of the environment's, by name with or without the prefix
    (``init(backend="cpu", timeout="30s")``)."""
    return Communicator(_init(_options(settings)))


def dtypes():
    """The dtype names oxccl knows (``f32``, ``bf16``, ...)."""
    return list(_dtypes())


__all__ = ["init", "Communicator", "Work", "ReduceOp", "errors", "dtypes", "__version__"] + errors.__all__
