"""Buffers from Python objects: ``(address, element count, dtype name)`` descriptions of the
memory of numpy arrays, torch tensors, DLPack exporters and writable buffer-protocol objects,
used in place (never copied). Non-contiguous or read-only memory where it would be written is
refused with an :class:`~oxccl.errors.InvalidArgumentError` that says what to pass instead.

The caller keeps the object referenced for the whole call; the extension trusts these
descriptions, so everything here checks before it describes."""

import ctypes

from .errors import InvalidArgumentError

# numpy's typestr (byte order stripped) -> oxccl's dtype name.
_TYPESTR = {
    "i1": "i8", "u1": "u8", "i4": "i32", "u4": "u32", "i8": "i64", "u8": "u64",
    "f2": "f16", "f4": "f32", "f8": "f64",
}
# torch dtype names -> oxccl's.
_TORCH = {
    "torch.int8": "i8", "torch.uint8": "u8", "torch.int32": "i32", "torch.uint32": "u32",
    "torch.int64": "i64", "torch.uint64": "u64", "torch.float16": "f16",
    "torch.bfloat16": "bf16", "torch.float32": "f32", "torch.float64": "f64",
}
# struct format characters of the buffer protocol -> oxccl's dtype name (native sizes on
# the platforms oxccl runs on: LP64 Linux).
_FORMAT = {
    "b": "i8", "B": "u8", "i": "i32", "I": "u32", "l": "i64", "L": "u64", "q": "i64",
    "Q": "u64", "e": "f16", "f": "f32", "d": "f64",
}


def _numpy(obj, writable, what):
    ai = obj.__array_interface__
    if ai.get("strides") is not None and not obj.flags["C_CONTIGUOUS"]:
        raise InvalidArgumentError(f"{what} is not contiguous; pass numpy.ascontiguousarray(...) of it")
    addr, readonly = ai["data"]
    if writable and readonly:
        raise InvalidArgumentError(f"{what} is read-only and would be written; pass a writable array")
    ts = ai["typestr"]
    if ts[0] == ">":
        raise InvalidArgumentError(f"{what} is big-endian ({ts}); pass a native-endian array")
    dtype = _TYPESTR.get(ts[1:])
    if dtype is None:
        raise InvalidArgumentError(f"{what} has dtype {obj.dtype}, which oxccl does not reduce or move; "
                                   "use one of int8 uint8 int32 uint32 int64 uint64 float16 float32 float64")
    return addr, obj.size, dtype


def _torch(obj, writable, what):
    if obj.device.type != "cpu" and obj.device.type != "cuda":
        raise InvalidArgumentError(f"{what} is on {obj.device}; oxccl takes CPU and CUDA tensors")
    if not obj.is_contiguous():
        raise InvalidArgumentError(f"{what} is not contiguous; pass .contiguous() of it")
    dtype = _TORCH.get(str(obj.dtype))
    if dtype is None:
        raise InvalidArgumentError(f"{what} has dtype {obj.dtype}, which oxccl does not reduce or move")
    if writable and obj.requires_grad and obj.is_leaf:
        raise InvalidArgumentError(f"{what} is a leaf that requires grad; pass .detach() of it")
    if obj.device.type == "cuda":
        # Device memory: the host backends stage it through pinned host memory, ordered
        # after the work queued on the legacy default stream (PyTorch's default).
        dtype = f"{dtype}@cuda:{obj.device.index or 0}"
    return obj.data_ptr(), obj.numel(), dtype


def _memoryview(obj, writable, what):
    try:
        mv = memoryview(obj)
    except TypeError:
        raise InvalidArgumentError(
            f"{what} ({type(obj).__name__}) is not a buffer: pass a numpy array, a torch tensor, "
            "a DLPack exporter or a writable buffer (bytearray, array.array)") from None
    if not mv.c_contiguous:
        raise InvalidArgumentError(f"{what} is not contiguous")
    dtype = _FORMAT.get(mv.format.lstrip("@=<"))
    if dtype is None:
        raise InvalidArgumentError(f"{what} has format {mv.format!r}, which oxccl does not reduce or move")
    if mv.readonly:
        raise InvalidArgumentError(f"{what} is a read-only buffer; pass a writable one (bytearray, numpy array)")
    count = mv.nbytes // mv.itemsize
    addr = ctypes.addressof(ctypes.c_char.from_buffer(mv)) if count else 0
    return addr, count, dtype, mv


def _dlpack(obj, what):
    from ._oxccl import dlpack_desc

    try:
        capsule = obj.__dlpack__()
        return dlpack_desc(capsule), capsule
    except ValueError as e:
        raise InvalidArgumentError(f"{what}: {e}") from None


def describe(obj, writable, what="the buffer"):
    """``(address, count, dtype)`` of ``obj``'s memory and the object that must stay
    referenced during the call (``obj`` itself, a DLPack capsule, or a memoryview pinning
    it). DLPack (0.x) carries no read-only flag: such memory is taken as writable."""
    if hasattr(obj, "__array_interface__"):
        return _numpy(obj, writable, what), obj
    if hasattr(obj, "data_ptr") and hasattr(obj, "is_contiguous"):
        return _torch(obj, writable, what), obj
    if hasattr(obj, "__dlpack__"):
        d, capsule = _dlpack(obj, what)
        return d, (obj, capsule)
    addr, count, dtype, mv = _memoryview(obj, writable, what)
    return (addr, count, dtype), mv
