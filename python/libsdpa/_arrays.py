"""Arrays as sdpa_tensor views, without copies: numpy arrays (byte strides
turned into element strides; bf16 through ml_dtypes), PyTorch tensors
(CPU and CUDA) and any object with __dlpack__ (versioned or legacy
capsule, byte_offset honoured, NULL strides read as compact). Every view
keeps the object it describes alive until the call returns.
"""
import ctypes
import sys

import numpy as np

from . import _capi as C

_NP_CODES = {np.dtype(np.float32): C.F32, np.dtype(np.float16): C.F16}
_NAMES = {C.F32: "float32", C.F16: "float16", C.BF16: "bfloat16"}


def _np_code(dtype, name):
    dtype = np.dtype(dtype)
    if dtype in _NP_CODES:
        return _NP_CODES[dtype]
    if dtype.name == "bfloat16":  # ml_dtypes
        return C.BF16
    raise C.InvalidArgumentError(f"{name} has dtype {dtype}, expected float32, float16 or "
                                 "bfloat16 (ml_dtypes)")


def _torch():
    return sys.modules.get("torch")


def is_torch(x):
    t = _torch()
    return t is not None and isinstance(x, t.Tensor)


def _torch_code(dtype, name):
    t = _torch()
    codes = {t.float32: C.F32, t.float16: C.F16, t.bfloat16: C.BF16}
    if dtype not in codes:
        raise C.InvalidArgumentError(f"{name} has dtype {dtype}, expected torch.float32, "
                                     "torch.float16 or torch.bfloat16")
    return codes[dtype]


class View:
    """One array as the C library sees it. sizes/strides are [B, S, H, D]."""

    def __init__(self, data, code, device, sizes, strides, keep, kind):
        self.data, self.code, self.device = data, code, device
        self.sizes, self.strides = tuple(sizes), tuple(strides)
        self.keep, self.kind = keep, kind  # the object that owns the memory

    def tensor(self):
        t = C.Tensor()  # slice assignment: the cheapest way to fill a ctypes struct
        t.data, t.dtype = self.data, self.code
        t.device.kind, t.device.ordinal = self.device
        t.size[:], t.stride[:] = self.sizes, self.strides
        return t


def _four(shape, strides, layout, name):
    if len(shape) != 4:
        raise C.InvalidArgumentError(
            f"{name} has {len(shape)} dimensions, expected 4 "
            f"({'[B, S, H, D]' if layout == 'bshd' else '[B, H, S, D]'} for layout '{layout}')")
    if layout == "bhsd":  # logical [B, S, H, D] of a [B, H, S, D] array
        shape = (shape[0], shape[2], shape[1], shape[3])
        strides = (strides[0], strides[2], strides[1], strides[3])
    return shape, strides


def view(x, name, layout, writable=False):
    """The View of x (numpy, torch or __dlpack__), or InvalidArgumentError."""
    if layout != "bshd" and layout != "bhsd":
        raise C.InvalidArgumentError(f"layout is {layout!r}, expected 'bshd' or 'bhsd'")
    if not isinstance(x, np.ndarray) and is_torch(x):
        t = _torch()
        if type(x) is not t.Tensor and type(x) is not t.nn.Parameter:
            x = _plain_tensor(x, name)
        code = _torch_code(x.dtype, name)
        dev = x.device
        device = (C.DEVICE_CPU, 0) if dev.type == "cpu" else (
            (C.DEVICE_CUDA, dev.index if dev.index is not None else 0) if dev.type == "cuda"
            else None)
        if device is None:
            raise C.InvalidArgumentError(f"{name} is on device {dev}, expected cpu or cuda")
        sizes, strides = _four(tuple(x.shape), tuple(x.stride()), layout, name)
        return View(x.data_ptr(), code, device, sizes, strides, x, "torch")
    if isinstance(x, np.ndarray):
        code = _NP_CODES.get(x.dtype)
        if code is None:
            code = _np_code(x.dtype, name)
        if writable and not x.flags.writeable:
            raise C.InvalidArgumentError(f"{name} is a read-only array, expected a writable one")
        item, st = x.itemsize, x.strides
        strides = tuple(s // item for s in st)
        if len(st) == 4 and (strides[0] * item, strides[1] * item, strides[2] * item,
                             strides[3] * item) != st:
            raise C.InvalidArgumentError(
                f"{name} has byte strides {st}, not multiples of its {item}-byte "
                "elements: no element strides describe it (copy it with np.ascontiguousarray)")
        sizes, strides = _four(x.shape, strides, layout, name)
        return View(x.ctypes.data, code, (C.DEVICE_CPU, 0), sizes, strides, x, "numpy")
    if hasattr(x, "__dlpack__"):
        return _dlpack_view(x, name, layout)
    raise C.InvalidArgumentError(f"{name} is a {type(x).__name__}, expected a numpy array, a "
                                 "torch tensor or an object with __dlpack__")


def _plain_tensor(x, name):
    """A tensor subclass as a tensor with memory of its own: the result of a
    functional collective (AsyncCollectiveTensor, which diffusers' context
    parallelism hands to attention backends) once waited for; any other
    subclass as it is, if it has a storage. A wrapper subclass without one
    (DTensor, FakeTensor) is refused: its data_ptr() is not its data (an
    AsyncCollectiveTensor's said 0 or 16, and the C library crashed)."""
    if type(x).__name__ == "AsyncCollectiveTensor" and callable(getattr(x, "wait", None)):
        x = x.wait()
    try:
        x.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError) as e:
        raise C.InvalidArgumentError(
            f"{name} is a {type(x).__name__} (a tensor subclass) without memory of its own "
            f"({e}); pass a plain tensor (for a DTensor, its to_local())") from None
    return x


# ---- DLPack (dlpack.h 1.x and the legacy 0.x struct)

class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


class _DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("version", _DLPackVersion), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p), ("flags", ctypes.c_uint64),
                ("dl_tensor", _DLTensor)]


_capsule_get = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_get.restype, _capsule_get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
_capsule_name = ctypes.pythonapi.PyCapsule_GetName
_capsule_name.restype, _capsule_name.argtypes = ctypes.c_char_p, [ctypes.py_object]

_KDL_CPU, _KDL_CUDA, _KDL_CUDA_HOST = 1, 2, 3
_KDL_FLOAT, _KDL_BFLOAT = 2, 4


def _dlpack_view(x, name, layout):
    """Borrows the tensor: the capsule stays unconsumed (so its producer's
    destructor frees it) and referenced by the View until the call ends."""
    try:
        capsule = x.__dlpack__(max_version=(1, 0))
    except TypeError:  # a producer that predates the versioned protocol
        capsule = x.__dlpack__()
    cname = _capsule_name(capsule)
    if cname == b"dltensor_versioned":
        m = _DLManagedTensorVersioned.from_address(_capsule_get(capsule, cname))
        if m.version.major != 1:
            raise C.InvalidArgumentError(f"{name}: DLPack major version {m.version.major}, "
                                         "expected 1")
        t = m.dl_tensor
    elif cname == b"dltensor":
        t = _DLManagedTensor.from_address(_capsule_get(capsule, cname)).dl_tensor
    else:
        raise C.InvalidArgumentError(f"{name}: a DLPack capsule named {cname!r}, expected "
                                     "'dltensor' or 'dltensor_versioned' (already consumed?)")
    codes = {(_KDL_FLOAT, 32): C.F32, (_KDL_FLOAT, 16): C.F16, (_KDL_BFLOAT, 16): C.BF16}
    code = codes.get((t.dtype.code, t.dtype.bits))
    if code is None or t.dtype.lanes != 1:
        raise C.InvalidArgumentError(f"{name}: DLPack dtype code {t.dtype.code} bits "
                                     f"{t.dtype.bits} lanes {t.dtype.lanes}, expected float32, "
                                     "float16 or bfloat16")
    if t.device.device_type in (_KDL_CPU, _KDL_CUDA_HOST):
        device = (C.DEVICE_CPU, 0)
    elif t.device.device_type == _KDL_CUDA:
        device = (C.DEVICE_CUDA, t.device.device_id)
    else:
        raise C.InvalidArgumentError(f"{name}: DLPack device type {t.device.device_type}, "
                                     "expected CPU or CUDA")
    shape = tuple(t.shape[i] for i in range(t.ndim))
    if t.strides:
        strides = tuple(t.strides[i] for i in range(t.ndim))
    else:  # NULL: compact row-major
        strides, acc = [], 1
        for n in reversed(shape):
            strides.insert(0, acc)
            acc *= n
        strides = tuple(strides)
    sizes, strides = _four(shape, strides, layout, name)
    data = (t.data or 0) + t.byte_offset
    return View(data, code, device, sizes, strides, (x, capsule), "dlpack")


# ---- masks

def _host_int32(x, name, n):
    a = np.ascontiguousarray(np.asarray(x), dtype=np.int32)  # a copy of B numbers at most
    if a.shape != (n,):
        raise C.InvalidArgumentError(f"{name} has shape {a.shape}, expected ({n},) (one length "
                                     "per batch entry)")
    return a, a.ctypes.data


def _device_int32(x, name, n, device):
    t = _torch()
    if t is None or not isinstance(x, t.Tensor):
        x = t.as_tensor(np.asarray(x))
    x = x.to(device=device, dtype=t.int32).contiguous()
    if tuple(x.shape) != (n,):
        raise C.InvalidArgumentError(f"{name} has shape {tuple(x.shape)}, expected ({n},) (one "
                                     "length per batch entry)")
    return x, x.data_ptr()


def build_mask(q, B, Hq, Sq, Skv, attn_mask, seq_len_q, seq_len_kv, key_mask):
    """An sdpa_mask (or None) and the objects it points into. attn_mask has
    torch's meaning: boolean (True attends) or additive, broadcastable to
    [B, Hq, Sq, Skv]. A boolean mask that varies only over (B, Skv) is
    passed as a key mask, which more backends take and which skips hidden
    keys."""
    if attn_mask is None and seq_len_q is None and seq_len_kv is None and key_mask is None:
        return None, ()
    m, keep = C.Mask(), []
    cuda = q.device[0] == C.DEVICE_CUDA
    torch_device = q.keep.device if q.kind == "torch" else None
    for attr, x in (("seq_len_q", seq_len_q), ("seq_len_kv", seq_len_kv)):
        if x is not None:
            obj, ptr = (_device_int32(x, attr, B, torch_device) if cuda
                        else _host_int32(x, attr, B))
            keep.append(obj)
            setattr(m, attr, ptr)
    general = attn_mask
    if key_mask is not None:
        obj, ptr, strides = _bool_matrix(key_mask, "key_mask", (B, Skv))
        keep.append(obj)
        m.key, m.key_stride[0], m.key_stride[1] = ptr, strides[0], strides[1]
    if general is not None:
        obj, ptr, strides, code = _general(general, (B, Hq, Sq, Skv), q.code)
        keep.append(obj)
        if code is None and strides[1] == 0 and strides[2] == 0 and m.key is None:
            m.key, m.key_stride[0], m.key_stride[1] = ptr, strides[0], strides[3]
        else:
            m.general = ptr
            m.general_type = C.MASK_BOOL if code is None else C.MASK_ADDITIVE
            m.general_dtype = C.F32 if code is None else code
            for i in range(4):
                m.general_stride[i] = strides[i]
    return m, keep


def _bool_matrix(x, name, shape):
    if is_torch(x):
        t = _torch()
        if x.dtype not in (t.bool, t.uint8):
            raise C.InvalidArgumentError(f"{name} has dtype {x.dtype}, expected torch.bool")
        x = x.expand(*shape)
        return x, x.data_ptr(), x.stride()
    a = np.asarray(x)
    if a.dtype not in (np.bool_, np.uint8):
        raise C.InvalidArgumentError(f"{name} has dtype {a.dtype}, expected bool")
    try:
        a = np.broadcast_to(a, shape)
    except ValueError:
        raise C.InvalidArgumentError(f"{name} has shape {np.shape(x)}, expected one that "
                                     f"broadcasts to {shape}") from None
    return a, a.ctypes.data, a.strides  # 1-byte elements: bytes are elements


def _general(x, shape, input_code):
    """(owner, pointer, element strides, None for boolean or the additive dtype code)."""
    if is_torch(x):
        t = _torch()
        try:
            e = x.expand(*shape)
        except RuntimeError:
            raise C.InvalidArgumentError(f"attn_mask has shape {tuple(x.shape)}, expected one "
                                         f"that broadcasts to {shape}") from None
        if x.dtype == t.bool:
            return e, e.data_ptr(), e.stride(), None
        code = _torch_code(x.dtype, "attn_mask")
    else:
        a = np.asarray(x)
        try:
            e = np.broadcast_to(a, shape)
        except ValueError:
            raise C.InvalidArgumentError(f"attn_mask has shape {a.shape}, expected one that "
                                         f"broadcasts to {shape}") from None
        if a.dtype == np.bool_:
            return e, e.ctypes.data, e.strides, None
        code = _np_code(a.dtype, "attn_mask")
        strides = tuple(s // e.itemsize for s in e.strides)
        if code not in (C.F32, input_code):
            raise C.InvalidArgumentError(f"attn_mask has dtype {a.dtype}, expected bool, "
                                         f"float32 or the inputs' {_NAMES[input_code]}")
        return e, e.ctypes.data, strides, code
    if code not in (C.F32, input_code):
        raise C.InvalidArgumentError(f"attn_mask has dtype {x.dtype}, expected torch.bool, "
                                     f"torch.float32 or the inputs' {_NAMES[input_code]}")
    return e, e.data_ptr(), e.stride(), code
