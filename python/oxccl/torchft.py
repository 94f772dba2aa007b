"""An oxccl process group for torchft (PyPI ``torchft``): per-step fault tolerance for PyTorch
on replica groups that come and go.

    from oxccl.torchft import ProcessGroupOxccl
    manager = torchft.Manager(pg=ProcessGroupOxccl(), ...)

torchft's ``Manager`` reconfigures its process group at every quorum change: ``configure``
gets a store address with a prefix no quorum used before (``host:port/torchft/<quorum>/<rank>``),
this replica's rank and the quorum's world size. This group then aborts the communicator of
the last quorum (its pending operations fail at once with ``AbortedError``) and makes a new
one whose ranks meet through that store, as ``oxccl.torch`` groups do: the store is the only
thing a quorum's members share, and a quorum can differ from the last one in any way
(replicas gone, replicas new, ranks renumbered), so nothing of the old communicator is kept.

Errors reach torchft as it expects them: a collective that loses a replica fails its work
with ``PeerLostError`` (at once, not at a timeout), which the Manager reports and answers by
not committing the step and reconfiguring at the next quorum; ``errored()`` returns the first
error of an async operation since the last ``configure`` (torchft asks before it commits);
``abort()`` ends the current communicator. Collectives run as in ``oxccl.torch``: CPU tensors
on the cpu backend, CUDA tensors on an nccl communicator made at their first collective.

Needs ``torchft`` (``pip install torchft``); importing this module without it raises
``ImportError`` naming it.
"""

from datetime import timedelta

try:
    from torchft.process_group import ProcessGroupWrapper as _Wrapper
except ImportError as e:  # pragma: no cover - said to the user
    raise ImportError(
        "oxccl.torchft needs torchft (pip install torchft); it could not be imported: " + str(e)) from e

from .torch import _create

BACKEND = "torchft-oxccl"


class ProcessGroupOxccl(_Wrapper):
    """A torchft ``ProcessGroup`` on oxccl, remade at every quorum (see the module text).

    ``timeout``: how long making the communicator, and each collective of it, may take
    before it fails with ``TimeoutError`` (torchft's own timeout for its store too)."""

    def __init__(self, timeout: timedelta = timedelta(seconds=60)):
        super().__init__(timeout=timeout)
        self._quorums = 0

    def _create_pg(self, store, rank, world_size):
        # The prefix torchft gives is new for every quorum, so the group's keys are its own.
        self._quorums += 1
        return _create(store, rank, world_size, self._timeout)

    def getBackendName(self):
        return BACKEND

    def errored(self):
        """The first error an async operation of the current communicator failed with."""
        pg = self._pg
        return pg.errored() if pg is not None else None

    @property
    def comm(self):
        """The current quorum's oxccl communicator (``oxccl.Communicator``), or None before
        the first ``configure`` and after ``abort``."""
        pg = self._pg
        return pg.comm if pg is not None else None

    @property
    def quorums(self):
        """How many communicators this group has made (one per ``configure``)."""
        return self._quorums

    def __repr__(self):
        pg = self._pg
        where = f"rank={pg.rank()}, size={pg.size()}" if pg is not None else "not configured"
        return f"oxccl.torchft.ProcessGroupOxccl({where})"


__all__ = ["ProcessGroupOxccl", "BACKEND"]
