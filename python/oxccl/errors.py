"""The exceptions oxccl raises: one class per kind of ``oxccl::Error``, all under
:class:`OxcclError`, each also deriving from the built-in exception users already catch
(``TimeoutError``, ``ValueError``, ``ConnectionError``, ``OSError``, ``RuntimeError``)."""

import builtins


class OxcclError(Exception):
    """Any error of oxccl."""


class InvalidArgumentError(OxcclError, ValueError):
    """A root, peer, length, count, dtype or group the call cannot use; the communicator is
    still usable."""


class MismatchError(OxcclError):
    """This rank and a peer ran different collectives (or the same with different
    arguments); make every rank issue the same calls in the same order."""


class TimeoutError(OxcclError, builtins.TimeoutError):
    """A wait passed its deadline; the message names the operation and the peer waited on."""


class PeerLostError(OxcclError, ConnectionError):
    """A peer died or dropped its communicator; restart the job or rebuild the
    communicator."""


class AbortedError(OxcclError):
    """The communicator was aborted (by this rank or a peer)."""


class RevokedError(OxcclError):
    """The communicator was revoked (by ``rank``, on this process or another): every call
    on it fails, but it can still be shrunk."""

    rank = None


class BackendUnavailableError(OxcclError, RuntimeError):
    """The backend asked for cannot run here; the message says why. ``backend`` names it."""

    backend = None


class StoreError(OxcclError, ConnectionError):
    """The rendezvous store failed or refused (a wrong secret, an unreachable address)."""


class OxcclIOError(OxcclError, OSError):
    """An operating-system error (shared memory, sockets)."""


class BackendError(OxcclError, RuntimeError):
    """An error of the library underneath (MPI, NCCL); ``code`` is its code."""

    code = None


class ConfigError(OxcclError, ValueError):
    """An ``OXCCL_*`` setting has a bad value; the message names the variable."""


class InternalError(OxcclError, RuntimeError):
    """A bug in oxccl; please report it."""


__all__ = [
    "OxcclError",
    "InvalidArgumentError",
    "MismatchError",
    "TimeoutError",
    "PeerLostError",
    "AbortedError",
    "RevokedError",
    "BackendUnavailableError",
    "StoreError",
    "OxcclIOError",
    "BackendError",
    "ConfigError",
    "InternalError",
]
