"""The C library through ctypes: loading it, the public structs of sdpa.h
mirrored (and checked against the library's own sizes), the prototypes,
and C statuses turned into exceptions.

ctypes.CDLL releases the GIL around every foreign call, so calls from
several Python threads run in parallel; the library is thread-safe, and
sdpa_last_error() is per thread, read right after the failing call on the
same thread.
"""
import ctypes
import os
import pathlib

_HERE = pathlib.Path(__file__).resolve().parent


class Error(Exception):
    """A libsdpa call failed; the message is the C library's."""

    status = None


class InvalidArgumentError(Error, ValueError):
    """The caller's input is wrong (nothing was written)."""


class UnsupportedError(Error):
    """The chosen backend cannot run this exact call."""


class OutOfMemoryError(Error, MemoryError):
    """A host or device allocation failed."""


class DeviceError(Error):
    """The device failed while running."""


class NotAvailableError(Error):
    """The backend is not built or not usable on this machine."""


class InternalError(Error):
    """A libsdpa bug: please report it."""


_BY_STATUS = {1: InvalidArgumentError, 2: UnsupportedError, 3: OutOfMemoryError,
              4: DeviceError, 5: NotAvailableError, 6: InternalError}
for _code, _cls in _BY_STATUS.items():
    _cls.status = _code

# sdpa.h enums
F32, F16, BF16 = 0, 1, 2
DEVICE_CPU, DEVICE_CUDA = 0, 1
CAUSAL_NONE, CAUSAL_TOP_LEFT, CAUSAL_BOTTOM_RIGHT = 0, 1, 2
MASK_BOOL, MASK_ADDITIVE = 0, 1
MASK_KIND_SEQ_LEN, MASK_KIND_KEY, MASK_KIND_GENERAL = 1, 2, 4

_i64x4 = ctypes.c_int64 * 4
_p = ctypes.c_void_p
_s = ctypes.c_char_p


class Device(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int), ("ordinal", ctypes.c_int)]


class Tensor(ctypes.Structure):
    _fields_ = [("data", _p), ("dtype", ctypes.c_int), ("device", Device),
                ("size", _i64x4), ("stride", _i64x4)]


class Window(ctypes.Structure):
    _fields_ = [("left", ctypes.c_int64), ("right", ctypes.c_int64)]


class BlockMap(ctypes.Structure):
    _fields_ = [("block_q", ctypes.c_int32), ("block_kv", ctypes.c_int32),
                ("batch", ctypes.c_int64), ("heads", ctypes.c_int64),
                ("q_blocks", ctypes.c_int64), ("kv_blocks", ctypes.c_int64),
                ("index_stride", ctypes.c_int64),
                ("full_count", _p), ("full_index", _p), ("partial_count", _p),
                ("partial_index", _p), ("partial_bits", _p)]


class Neighborhood3d(ctypes.Structure):
    _fields_ = [("grid", ctypes.c_int64 * 3), ("tile", ctypes.c_int64 * 3), ("windows", _p),
                ("heads", ctypes.c_int64), ("prefix", ctypes.c_int64),
                ("causal_time", ctypes.c_int)]


class _Grows(ctypes.Structure):
    """A struct that grows by addition (sdpa.h): its first member, size, is
    set to the sizeof this package mirrors, as sdpa.h's _DEFAULT macros do;
    positional arguments fill the fields after it."""

    def __init__(self, *args, **kw):
        kw.update(zip([f[0] for f in self._fields_[1:]], args))
        super().__init__(**kw)
        self.size = ctypes.sizeof(self)


class Mask(_Grows):
    _fields_ = [("size", ctypes.c_size_t), ("seq_len_q", _p), ("seq_len_kv", _p), ("key", _p),
                ("key_stride", ctypes.c_int64 * 2), ("general", _p),
                ("general_type", ctypes.c_int), ("general_dtype", ctypes.c_int),
                ("general_stride", _i64x4), ("window", ctypes.POINTER(Window)),
                ("blocks", ctypes.POINTER(BlockMap))]


class Params(_Grows):
    _fields_ = [("size", ctypes.c_size_t), ("scale", ctypes.c_double), ("causal", ctypes.c_int),
                ("deterministic", ctypes.c_int), ("backend", _s), ("layer_name", _s),
                ("component", _s), ("quant", _s), ("stream", _p), ("mask", ctypes.POINTER(Mask))]


class CallDesc(_Grows):
    _fields_ = [("size", ctypes.c_size_t), ("device", ctypes.c_int), ("dtype", ctypes.c_int),
                ("B", ctypes.c_int64), ("Sq", ctypes.c_int64), ("Skv", ctypes.c_int64),
                ("Hq", ctypes.c_int64), ("Hkv", ctypes.c_int64), ("D", ctypes.c_int64),
                ("causal", ctypes.c_int), ("want_lse", ctypes.c_int),
                ("deterministic", ctypes.c_int), ("backend", _s), ("component", _s),
                ("quant", _s), ("mask", ctypes.c_uint), ("backward", ctypes.c_int),
                ("kv_dtype", ctypes.c_int), ("shares", ctypes.c_int)]


class LayerDesc(_Grows):
    _fields_ = [("size", ctypes.c_size_t), ("name", _s), ("component", _s), ("backend", _s), ("quant", _s)]


class ContextOptions(_Grows):
    _fields_ = [("size", ctypes.c_size_t), ("platform", _p), ("log", _p), ("log_user", _p), ("log_level", ctypes.c_int),
                ("threads", ctypes.c_int), ("policy_file", _s), ("ignore_env", ctypes.c_int),
                ("foreign_policy", ctypes.c_int), ("share_pool", ctypes.c_int),
                ("parallel_for", _p), ("parallel_for_user", _p)]


def _find_library():
    """SDPA_LIBRARY (a path: a development build), else the copy installed
    inside this package by pip."""
    path = os.environ.get("SDPA_LIBRARY")
    if path:
        return path
    here = _HERE / "libsdpa.so"
    if here.exists():
        return str(here)
    raise ImportError(f"libsdpa: no libsdpa.so in {_HERE} (install the package with "
                      "`pip install .` from the repository, or set SDPA_LIBRARY to a built "
                      "libsdpa.so)")


lib = ctypes.CDLL(_find_library())

_PROTOTYPES = {
    "sdpa_version": (_s, []),
    "sdpa_status_string": (_s, [ctypes.c_int]),
    "sdpa_last_error": (_s, []),
    "sdpa_last_backend": (_s, []),
    "sdpa_free": (None, [_p]),
    "sdpa_struct_size": (ctypes.c_size_t, [_s]),
    "sdpa_context_create": (ctypes.c_int, [ctypes.POINTER(ContextOptions), ctypes.POINTER(_p)]),
    "sdpa_context_destroy": (None, [_p]),
    "sdpa_context_threads": (ctypes.c_int, [_p]),
    "sdpa_openmp_host": (ctypes.c_int, [ctypes.c_int, ctypes.POINTER(_p), ctypes.POINTER(_p)]),
    "sdpa_context_load_policy": (ctypes.c_int, [_p, _s]),
    "sdpa_context_set_component_backend": (ctypes.c_int, [_p, _s, _s]),
    "sdpa_override_push": (ctypes.c_int, [_s]),
    "sdpa_override_pop": (ctypes.c_int, []),
    "sdpa_override_current": (_s, []),
    "sdpa_forward": (ctypes.c_int, [_p, ctypes.POINTER(Tensor), ctypes.POINTER(Tensor),
                                    ctypes.POINTER(Tensor), ctypes.POINTER(Tensor), _p,
                                    ctypes.POINTER(Params)]),
    # ctx, q, k, v, out, lse, dout, dlse, dq, dk, dv, params
    "sdpa_backward": (ctypes.c_int, [_p] + [ctypes.POINTER(Tensor)] * 4 +
                      [_p, ctypes.POINTER(Tensor), _p] + [ctypes.POINTER(Tensor)] * 3 +
                      [ctypes.POINTER(Params)]),
    "sdpa_layer_backward": (ctypes.c_int, [_p] + [ctypes.POINTER(Tensor)] * 4 +
                            [_p, ctypes.POINTER(Tensor), _p] + [ctypes.POINTER(Tensor)] * 3 +
                            [ctypes.POINTER(Params)]),
    "sdpa_merge": (ctypes.c_int, [ctypes.POINTER(Tensor), _p, ctypes.POINTER(Tensor), _p,
                                  ctypes.POINTER(Tensor), _p]),
    "sdpa_layer_create": (ctypes.c_int, [_p, ctypes.POINTER(LayerDesc), ctypes.POINTER(_p)]),
    "sdpa_layer_destroy": (None, [_p]),
    "sdpa_layer_forward": (ctypes.c_int, [_p, ctypes.POINTER(Tensor), ctypes.POINTER(Tensor),
                                          ctypes.POINTER(Tensor), ctypes.POINTER(Tensor), _p,
                                          ctypes.POINTER(Params)]),
    "sdpa_layer_is_latched": (ctypes.c_int, [_p, _s]),
    "sdpa_explain": (ctypes.c_int, [_p, ctypes.POINTER(CallDesc), ctypes.c_int,
                                    ctypes.POINTER(_p)]),
    "sdpa_info": (ctypes.c_int, [_p, ctypes.c_int, ctypes.POINTER(_p)]),
    "sdpa_block_map_3d": (ctypes.c_int, [ctypes.POINTER(Neighborhood3d), ctypes.c_int32,
                                         ctypes.POINTER(ctypes.POINTER(BlockMap))]),
    "sdpa_block_map_3d_joint": (ctypes.c_int, [ctypes.POINTER(Neighborhood3d), ctypes.c_int64,
                                               ctypes.c_int32,
                                               ctypes.POINTER(ctypes.POINTER(BlockMap))]),
    "sdpa_block_map_free": (None, [ctypes.POINTER(BlockMap)]),
    "sdpa_block_map_density": (ctypes.c_double, [ctypes.POINTER(BlockMap), ctypes.c_int64,
                                                 ctypes.c_int64]),
    "sdpa_block_map_slice": (ctypes.c_int, [ctypes.POINTER(BlockMap)] + [ctypes.c_int64] * 8 +
                             [ctypes.POINTER(ctypes.POINTER(BlockMap))]),
    "sdpa_measure_ceiling": (ctypes.c_int, [_p, _s, ctypes.POINTER(ctypes.c_double),
                                            ctypes.POINTER(_s)]),
}
for _name, (_res, _args) in _PROTOTYPES.items():
    _f = getattr(lib, _name)
    _f.restype, _f.argtypes = _res, _args

# The mirrored structs must be the library's: a mismatch would pass garbage.
for _cname, _py in (("sdpa_tensor", Tensor), ("sdpa_params", Params), ("sdpa_mask", Mask),
                    ("sdpa_window", Window), ("sdpa_block_map", BlockMap),
                    ("sdpa_neighborhood_3d", Neighborhood3d),
                    ("sdpa_call_desc", CallDesc), ("sdpa_layer_desc", LayerDesc),
                    ("sdpa_context_options", ContextOptions)):
    _want = lib.sdpa_struct_size(_cname.encode())
    if _want != ctypes.sizeof(_py):
        raise ImportError(f"libsdpa: {_cname} is {_want} bytes in {lib._name} but "
                          f"{ctypes.sizeof(_py)} in this package: the library and the package "
                          "are from different versions")


def check(status, what=None):
    """Raises the exception for a non-zero sdpa_status, with the C message."""
    if status == 0:
        return
    message = (lib.sdpa_last_error() or b"").decode(errors="replace")
    if not message:
        message = lib.sdpa_status_string(status).decode()
    raise _BY_STATUS.get(status, Error)(f"{what}: {message}" if what else message)


def take_text(ptr):
    """A char* the library allocated, as str, released with sdpa_free."""
    try:
        return ctypes.string_at(ptr.value).decode(errors="replace")
    finally:
        lib.sdpa_free(ptr)


def cstr(s):
    return None if s is None else str(s).encode()
