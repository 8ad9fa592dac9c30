"""libsdpa from Python: scaled-dot-product attention on the fastest correct
kernel for the machine and the shape, with the choice explained.

    import numpy as np, libsdpa
    q = k = v = np.random.rand(1, 256, 8, 64).astype(np.float32)  # [B, S, H, D]
    out = libsdpa.attention(q, k, v, is_causal=True)
    print(libsdpa.explain(q, k, v)["candidates"])

Inputs are numpy arrays, PyTorch tensors (CPU, or CUDA for the plugin's
backends) or any object with __dlpack__, in layout "bshd" ([B, S, H, D],
diffusers' and FlashAttention's) or "bhsd" (torch's SDPA). Nothing is
copied when the strides can be described to the C library (transposes and
slices of packed QKV included). The output is float32 for numpy and DLPack
inputs, and the inputs' dtype for torch tensors (as torch's SDPA), in the
inputs' layout; `out=` writes in place instead. The LSE (return_lse=True)
is float32 [B, Hq, Sq], natural log.

Errors are exceptions carrying the C library's message:
InvalidArgumentError (a ValueError), UnsupportedError, OutOfMemoryError (a
MemoryError), DeviceError, NotAvailableError, InternalError.
"""
import contextlib
import ctypes
import json
import os
import sys
import threading

import numpy as np

from . import _arrays as A
from . import _capi as C
from .sparse import BlockMap  # noqa: E402  (block-sparse maps)
from ._capi import (DeviceError, Error, InternalError, InvalidArgumentError,  # noqa: F401
                    NotAvailableError, OutOfMemoryError, UnsupportedError)

__version__ = C.lib.sdpa_version().decode()
__all__ = ["attention", "backward", "merge", "explain", "info", "backend", "Layer", "set_component_backend",
           "load_policy", "set_num_threads", "get_num_threads", "use_torch_threads", "thread_pool", "last_backend", "Error",
           "InvalidArgumentError", "UnsupportedError", "OutOfMemoryError", "DeviceError",
           "NotAvailableError", "InternalError"]


class _Context:
    """An sdpa_context, destroyed when the last Python reference goes.
    With torch imported and its OpenMP runtime in the process, its calls
    run on torch's OpenMP team (sdpa_openmp_host) unless
    use_torch_threads(False): torch's workers spin for a while after each
    of its operations, and libsdpa's own pool beside them shared the cores
    with threads that only waited."""

    def __init__(self, threads):
        opts = C.ContextOptions()
        opts.log_level = -1
        opts.threads = threads
        self.pool = "libsdpa"
        if _torch_threads and threads > 0 and "torch" in sys.modules:
            fn, user = ctypes.c_void_p(), ctypes.c_void_p()
            if C.lib.sdpa_openmp_host(threads, ctypes.byref(fn), ctypes.byref(user)) == 0:
                opts.parallel_for, opts.parallel_for_user = fn, user
                self.pool = "openmp"
        handle = ctypes.c_void_p()
        C.check(C.lib.sdpa_context_create(ctypes.byref(opts), ctypes.byref(handle)),
                "context")
        self.handle, self.requested, self.torch_threads = handle, threads, _torch_threads

    def __del__(self):
        if getattr(self, "handle", None) and C is not None and C.lib is not None:
            C.lib.sdpa_context_destroy(self.handle)
            self.handle = None


_lock = threading.Lock()
_ctx = None
_threads_set = None  # set_num_threads(n); None: follow torch, else the C default
_torch_threads = os.environ.get("SDPA_TORCH_THREADS", "1") != "0"  # use_torch_threads()


def _wanted_threads():
    if _threads_set is not None:
        return _threads_set
    torch = sys.modules.get("torch")
    if torch is not None:  # torch's OpenMP pool size: do not start a second, larger one
        return max(1, torch.get_num_threads())
    return 0  # the C default: the CPUs this process may run on (affinity, cgroup quota)


def _context():
    global _ctx
    want = _wanted_threads()
    ctx = _ctx
    if ctx is None or ctx.requested != want or ctx.torch_threads != _torch_threads:
        with _lock:
            if _ctx is None or _ctx.requested != want or _ctx.torch_threads != _torch_threads:
                _ctx = _Context(want)  # the old one lives on while calls or layers hold it
            ctx = _ctx
    return ctx


def set_num_threads(n):
    """CPU threads for libsdpa's calls (0: one per CPU this process may run
    on, its affinity mask and cgroup CPU quota allowing; None: follow
    torch.get_num_threads() when torch is imported, else 0)."""
    global _threads_set
    if n is not None and (not isinstance(n, int) or n < 0):
        raise InvalidArgumentError(f"set_num_threads: n is {n!r}, expected an int >= 0 or None")
    _threads_set = n


def get_num_threads():
    """The threads the current context runs with."""
    return C.lib.sdpa_context_threads(_context().handle)


def use_torch_threads(on=True):
    """Whether libsdpa's calls run on torch's OpenMP team when torch is
    imported (the default; SDPA_TORCH_THREADS=0 starts with it off) or on
    libsdpa's own workers. Takes effect from the next call."""
    global _torch_threads
    if not isinstance(on, bool):
        raise InvalidArgumentError(f"use_torch_threads: on is {on!r}, expected True or False")
    _torch_threads = on


def thread_pool():
    """Where the current context's calls run: "openmp" (the OpenMP team of
    the process, torch's) or "libsdpa" (its own workers)."""
    return _context().pool


def _causal(is_causal):
    if is_causal is False or is_causal is None or is_causal == "none":
        return C.CAUSAL_NONE
    if is_causal is True or is_causal == "top-left":
        return C.CAUSAL_TOP_LEFT
    if is_causal == "bottom-right":
        return C.CAUSAL_BOTTOM_RIGHT
    raise InvalidArgumentError(f"is_causal is {is_causal!r}, expected False, True, 'top-left' "
                               "or 'bottom-right'")


class _Call:
    """One attention call prepared: views, output, LSE, params, mask."""

    def __init__(self, q, k, v, layout, is_causal, scale, enable_gqa, return_lse, out, backend,
                 quant, component, attn_mask, seq_len_q, seq_len_kv, key_mask, allocate=True,
                 block_mask=None, window=None):
        self.q = A.view(q, "q", layout)
        self.k = A.view(k, "k", layout)
        self.v = A.view(v, "v", layout)
        B, Sq, Hq, D = self.q.sizes
        Skv, Hkv = self.k.sizes[1], self.k.sizes[2]
        if enable_gqa is False and Hq != Hkv:
            raise InvalidArgumentError(f"q has {Hq} heads and k {Hkv}: grouped-query attention "
                                       "needs enable_gqa=True (or None)")
        self.shape = (B, Sq, Skv, Hq, Hkv, D)
        self.layout, self.return_lse = layout, return_lse
        self.params = C.Params()
        self.params.causal = _causal(is_causal)
        if scale is not None:
            if not isinstance(scale, (int, float)) or scale == 0 or scale != scale:
                raise InvalidArgumentError(f"scale is {scale!r}, expected a finite non-zero "
                                           "number or None (1/sqrt(D))")
            self.params.scale = float(scale)
        self._strings = [C.cstr(backend), C.cstr(quant), C.cstr(component)]
        self.params.backend, self.params.quant, self.params.component = self._strings
        self.mask, self._mask_keep = A.build_mask(self.q, B, Hq, Sq, Skv, attn_mask, seq_len_q,
                                                  seq_len_kv, key_mask)
        if block_mask is not None or window is not None:
            self._sparse(block_mask, window)
        if self.mask is not None:
            self.params.mask = ctypes.pointer(self.mask)
        self.torch = A.is_torch(q)
        if self.torch and self.q.device[0] == C.DEVICE_CUDA:  # torch's current stream
            self.params.stream = sys.modules["torch"].cuda.current_stream(q.device).cuda_stream
        if not allocate:
            return
        shape = (B, Sq, Hq, D) if layout == "bshd" else (B, Hq, Sq, D)
        if out is None:  # torch: q's strides where q is dense (as _prepared allocates)
            out = (sys.modules["torch"].empty_like(self.q.keep) if self.torch else
                   self._empty(q, shape, None))
        elif tuple(out.shape) != shape:
            raise InvalidArgumentError(f"out has shape {tuple(out.shape)}, expected {shape}")
        self.out_obj = out
        self.out = A.view(out, "out", layout, writable=True)
        self.lse_obj = self._empty(q, (B, Hq, Sq), "float32") if return_lse else None
        self.lse_ptr = (None if self.lse_obj is None else
                        (self.lse_obj.data_ptr() if self.torch else self.lse_obj.ctypes.data))

    def _sparse(self, block_mask, window):
        """The block map and the 1-D window (sdpa.h) on the call's mask."""
        from . import sparse
        if self.mask is None:
            self.mask, self._mask_keep = C.Mask(), ()
        keep = list(self._mask_keep)
        if block_mask is not None:
            m = sparse.as_block_map(block_mask)
            keep.append(m)
            self.mask.blocks = ctypes.pointer(m.c_struct)
        if window is not None:
            try:
                left, right = (int(x) for x in window)
            except (TypeError, ValueError):
                raise InvalidArgumentError(f"window is {window!r}, expected (left, right) key "
                                           "counts, -1 for unbounded") from None
            w = C.Window(left, right)
            keep.append(w)
            self.mask.window = ctypes.pointer(w)
        self._mask_keep = tuple(keep)

    def _empty(self, q, shape, dtype):
        if self.torch:
            torch = sys.modules["torch"]
            return torch.empty(shape, dtype=torch.float32 if dtype else q.dtype, device=q.device)
        if self.q.device[0] != C.DEVICE_CPU:
            raise InvalidArgumentError("q is a DLPack tensor on a GPU: pass out= (and use "
                                       "torch tensors for return_lse)")
        return np.empty(shape, dtype=np.float32)

    def run(self, fn, handle):
        tq, tk, tv, to = (x.tensor() for x in (self.q, self.k, self.v, self.out))
        st = fn(handle, ctypes.byref(tq), ctypes.byref(tk), ctypes.byref(tv), ctypes.byref(to),
                self.lse_ptr, ctypes.byref(self.params))
        C.check(st)
        return (self.out_obj, self.lse_obj) if self.return_lse else self.out_obj


def attention(q, k, v, *, layout="bshd", is_causal=False, scale=None, enable_gqa=None,
              return_lse=False, out=None, backend=None, layer=None, quant=None, component=None,
              attn_mask=None, seq_len_q=None, seq_len_kv=None, key_mask=None, block_mask=None,
              window=None):
    """Scaled-dot-product attention of q [B, Sq, Hq, D] with k, v [B, Skv, Hkv, D]
    (layout "bshd"; "bhsd" for [B, H, S, D] arrays).

    is_causal: False, True (= "top-left", torch's), "top-left" or "bottom-right".
    scale: None for 1/sqrt(D). enable_gqa: None or True allows Hq != Hkv
    (Hq % Hkv == 0); False refuses it, as torch does. backend: run exactly
    this backend ("cpu.avx512"), or fail with its reason; layer: a Layer
    whose latch and choice to use. attn_mask: torch's meaning, boolean
    (True attends) or additive, broadcastable to [B, Hq, Sq, Skv];
    seq_len_q / seq_len_kv: real lengths per batch entry (padding);
    key_mask: boolean [B, Skv]. block_mask: a libsdpa.BlockMap or a torch
    FlexAttention BlockMask (only its listed key blocks are computed);
    window: (left, right) keys around the diagonal, FlashAttention's
    sliding window (-1 unbounded). Returns out, or (out, lse) with
    return_lse.
    """
    if block_mask is not None or window is not None:
        return _sparse_attention(q, k, v, layout, is_causal, scale, enable_gqa, return_lse, out,
                                 backend, quant, component, attn_mask, seq_len_q, seq_len_kv,
                                 key_mask, block_mask, window)
    if (type(q) is _fast_tensor_type and layer is None and out is None and attn_mask is None and
            seq_len_q is None and seq_len_kv is None and key_mask is None and
            _threads_set is None and _PREPARED):  # the hit path in C (_fastcall.c), first
        try:
            state = _tls.state
        except AttributeError:  # this thread's first call
            state = None
        if state is not None and state[0] is _ctx:
            r = _fastcall.call(state[2], state[3], q, k, v, layout, is_causal, scale, enable_gqa,
                               return_lse, backend, quant, component)
            if r is not None:
                if type(r) is int:
                    C.check(r)
                return r
    if layer is not None:
        return layer(q, k, v, layout=layout, is_causal=is_causal, scale=scale,
                     enable_gqa=enable_gqa, return_lse=return_lse, out=out, backend=backend,
                     attn_mask=attn_mask, seq_len_q=seq_len_q, seq_len_kv=seq_len_kv,
                     key_mask=key_mask)
    ctx = _context()
    if (out is None and attn_mask is None and seq_len_q is None and seq_len_kv is None and
            key_mask is None and _PREPARED):  # its prepared structs, if seen before
        r = _prepared(_tls, ctx, C.lib.sdpa_forward, ctx.handle, ctx, q, k, v, layout,
                      is_causal, scale, enable_gqa, return_lse, backend, quant, component)
        if r is not _GENERAL:
            return r
    if _wants_grad(q, k, v):  # autograd: torch.ops.libsdpa.sdpa, whose backward is libsdpa's
        return _autograd_attention(q, k, v, layout, is_causal, scale, enable_gqa, return_lse,
                                   out, backend, quant, component, attn_mask, seq_len_q,
                                   seq_len_kv, key_mask)
    return _forward(q, k, v, layout=layout, is_causal=is_causal, scale=scale,
                    enable_gqa=enable_gqa, return_lse=return_lse, out=out, backend=backend,
                    quant=quant, component=component, attn_mask=attn_mask, seq_len_q=seq_len_q,
                    seq_len_kv=seq_len_kv, key_mask=key_mask)


def _forward(q, k, v, *, layout="bshd", is_causal=False, scale=None, enable_gqa=None,
             return_lse=False, out=None, backend=None, quant=None, component=None,
             attn_mask=None, seq_len_q=None, seq_len_kv=None, key_mask=None, block_mask=None,
             window=None):
    """attention()'s general path, without autograd: what torch.ops.libsdpa's
    operators run (inside them autograd is the operator's own business)."""
    call = _Call(q, k, v, layout, is_causal, scale, enable_gqa, return_lse, out, backend, quant,
                 component, attn_mask, seq_len_q, seq_len_kv, key_mask, block_mask=block_mask,
                 window=window)
    return call.run(C.lib.sdpa_forward, _context().handle)


def _lse_arg(x, name, B, Hq, Sq, writable=False, device="cpu"):
    """(object, address) of a contiguous float32 [B, Hq, Sq] on `device`
    ("cpu" or "cuda": a torch tensor there, or on the CPU a numpy array
    too), or InvalidArgumentError naming `name`."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        ok = x.dtype == torch.float32 and x.is_contiguous() and x.device.type == device
        ptr = x.data_ptr()
    else:
        x = np.asarray(x)
        ok = (device == "cpu" and x.dtype == np.float32 and x.flags.c_contiguous and
              (x.flags.writeable or not writable))
        ptr = x.ctypes.data
    if not ok or tuple(x.shape) != (B, Hq, Sq):
        where = "the CPU" if device == "cpu" else "the inputs' device"
        raise InvalidArgumentError(f"{name} has shape {tuple(x.shape)} and dtype {x.dtype}, "
                                   f"expected a contiguous float32 [B, Hq, Sq] = {(B, Hq, Sq)} "
                                   f"on {where}")
    return x, ptr


def backward(q, k, v, out, lse, dout, *, layout="bshd", is_causal=False, scale=None,
             enable_gqa=None, dlse=None, backend=None, layer=None, quant=None, component=None,
             attn_mask=None, seq_len_q=None, seq_len_kv=None, key_mask=None, block_mask=None,
             window=None):
    """The gradients (dq, dk, dv) of out = attention(q, k, v, ...) for the
    output's gradient dout (sdpa_backward): q, k, v and the keywords as
    the forward call had them, out and lse (return_lse=True) as it returned
    them; dlse, the LSE's own gradient [B, Hq, Sq] float32, when the LSE
    was used (None: zero). Masks carry no gradient. The gradients have
    q's, k's and v's shapes and layout: for torch tensors their dtype (as
    torch's autograd), for numpy float32. This is what autograd runs for
    attention() on torch tensors that require grad; call it directly to
    drive a backward pass by hand (numpy, or torch without autograd)."""
    call = _Call(q, k, v, layout, is_causal, scale, enable_gqa, False, None, backend, quant,
                 component, attn_mask, seq_len_q, seq_len_kv, key_mask, allocate=False,
                 block_mask=block_mask, window=window)
    B, Sq, Skv, Hq, Hkv, D = call.shape
    vo, vd = A.view(out, "out", layout), A.view(dout, "dout", layout)
    where = "cpu" if call.q.device[0] == C.DEVICE_CPU else "cuda"
    lse_obj, lse_ptr = _lse_arg(lse, "lse", B, Hq, Sq, device=where)
    dlse_obj, dlse_ptr = ((None, None) if dlse is None else
                          _lse_arg(dlse, "dlse", B, Hq, Sq, device=where))
    if call.torch:
        torch = sys.modules["torch"]
        grads = tuple(torch.empty_like(x) for x in (call.q.keep, call.k.keep, call.v.keep))
    else:
        if call.q.device[0] != C.DEVICE_CPU:
            raise InvalidArgumentError("q is a DLPack tensor on a GPU: use torch tensors for "
                                       "backward")
        grads = tuple(np.empty(tuple(x.shape), dtype=np.float32) for x in (q, k, v))
    views = [A.view(g, n, layout, writable=True) for g, n in zip(grads, ("dq", "dk", "dv"))]
    ts = [x.tensor() for x in (call.q, call.k, call.v, vo, vd, *views)]
    if layer is not None:
        fn, handle = C.lib.sdpa_layer_backward, layer.handle
    else:
        fn, handle = C.lib.sdpa_backward, _context().handle
    st = fn(handle, *(ctypes.byref(t) for t in ts[:4]), lse_ptr, ctypes.byref(ts[4]), dlse_ptr,
            *(ctypes.byref(t) for t in ts[5:]), ctypes.byref(call.params))
    del lse_obj, dlse_obj
    C.check(st, "backward")
    return grads


def _sparse_attention(q, k, v, layout, is_causal, scale, enable_gqa, return_lse, out, backend,
                      quant, component, attn_mask, seq_len_q, seq_len_kv, key_mask, block_mask,
                      window):
    """attention() with a block map or a window: the general path, and under
    autograd a torch.autograd.Function whose backward is sdpa_backward with
    the same map (a map is not a tensor, so torch.ops.libsdpa cannot carry it)."""
    from . import sparse
    block_mask = sparse.as_block_map(block_mask)  # a BlockMask converts once, here
    kw = dict(layout=layout, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa,
              backend=backend, quant=quant, component=component, attn_mask=attn_mask,
              seq_len_q=seq_len_q, seq_len_kv=seq_len_kv, key_mask=key_mask,
              block_mask=block_mask, window=window)
    if not _wants_grad(q, k, v):
        return _forward(q, k, v, return_lse=return_lse, out=out, **kw)
    if out is not None:
        raise InvalidArgumentError("out= with inputs that require grad: autograd cannot see a "
                                   "result written in place (drop out=, or run under "
                                   "torch.no_grad())")
    torch = sys.modules["torch"]

    class _Sparse(torch.autograd.Function):
        @staticmethod
        def forward(fctx, q, k, v):
            o, lse = _forward(q.detach(), k.detach(), v.detach(), return_lse=True, **kw)
            fctx.save_for_backward(q, k, v, o, lse)
            fctx.mark_non_differentiable(lse)
            return o, lse

        @staticmethod
        def backward(fctx, do, dlse):
            q, k, v, o, lse = fctx.saved_tensors
            return backward(q.detach(), k.detach(), v.detach(), o, lse, do.contiguous(),
                            dlse=None if dlse is None else dlse.contiguous(), **kw)

    o, lse = _Sparse.apply(q, k, v)
    return (o, lse) if return_lse else o


def _wants_grad(*xs):
    """Whether autograd must see this call: grad mode on and an input that
    requires grad (torch tensors only)."""
    torch = sys.modules.get("torch")
    return (torch is not None and torch.is_grad_enabled() and
            any(isinstance(x, torch.Tensor) and x.requires_grad for x in xs))


def _autograd_attention(q, k, v, layout, is_causal, scale, enable_gqa, return_lse, out, backend,
                        quant, component, attn_mask, seq_len_q, seq_len_kv, key_mask):
    """attention() under autograd: torch.ops.libsdpa.sdpa (torch_ops.py), a
    custom operator whose registered backward is sdpa_backward, so the call
    is one node of the graph, under torch.compile too."""
    torch = sys.modules["torch"]
    from . import torch_ops
    if out is not None:
        raise InvalidArgumentError("out= with inputs that require grad: autograd cannot see a "
                                   "result written in place (drop out=, or run under "
                                   "torch.no_grad())")
    if attn_mask is not None and isinstance(attn_mask, torch.Tensor) and attn_mask.requires_grad:
        raise InvalidArgumentError("attn_mask requires grad: libsdpa's backward gives no "
                                   "gradient for a mask (detach it, or use torch's SDPA)")
    if layout not in ("bshd", "bhsd"):
        raise InvalidArgumentError(f"layout is {layout!r}, expected 'bshd' or 'bhsd'")
    if layout == "bhsd":
        q, k, v = (x.transpose(1, 2) if isinstance(x, torch.Tensor) and x.dim() == 4 else x
                   for x in (q, k, v))
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor) or x.dim() != 4:
            raise InvalidArgumentError(f"{name} must be a 4-dimensional torch tensor with "
                                       "autograd")
    if enable_gqa is False and q.shape[2] != k.shape[2]:
        raise InvalidArgumentError(f"q has {q.shape[2]} heads and k {k.shape[2]}: grouped-query "
                                   "attention needs enable_gqa=True (or None)")
    lens = [None if x is None else torch.as_tensor(np.asarray(x) if not isinstance(
        x, torch.Tensor) else x, dtype=torch.int32) for x in (seq_len_q, seq_len_kv)]
    if key_mask is not None and not isinstance(key_mask, torch.Tensor):
        key_mask = torch.as_tensor(np.asarray(key_mask))
    if attn_mask is not None and not isinstance(attn_mask, torch.Tensor):
        attn_mask = torch.as_tensor(np.asarray(attn_mask))
    o, lse = torch_ops.sdpa(q, k, v, attn_mask, lens[0], lens[1], key_mask, _causal(is_causal),
                            0.0 if scale is None else float(scale), backend or "",
                            component or "", quant or "")
    if layout == "bhsd":
        o = o.transpose(1, 2)
    return (o, lse) if return_lse else o


# ---- prepared calls: the per-call cost of a repeated call
#
# A call's C structs (four sdpa_tensor, sdpa_params) depend only on its
# signature: the inputs' type, dtype, device, shape and strides and the
# keyword arguments. The first call of a signature builds them through
# _Call (every check, every error); later calls find them in a small
# per-thread table (structs are written per call, so never shared between
# threads) and only set the four data pointers, allocate the output and
# call C. Calls with masks, out= or CUDA tensors always take the general
# path. bench/python_calls.py measures both against torch's SDPA.

_PLAN_LIMIT = 64  # signatures kept per thread (and per Layer); the table is cleared when full
_PREPARED = True  # False: every call takes the general path (the benchmark's "before" arm)
_tls = threading.local()
# sdpa_forward and sdpa_layer_forward without argtypes, for _prepared's Python hit path
_UNTYPED = {f.__name__: ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.cast(f, ctypes.c_void_p).value)
            for f in (C.lib.sdpa_forward, C.lib.sdpa_layer_forward)}


def _prepared(holder, ctx, fn, handle, owner, q, k, v, layout, is_causal, scale, enable_gqa,
              return_lse, backend, quant, component):
    """The call through this thread's prepared structs for its signature
    (made now, by the general path, on the signature's first call), or
    _GENERAL where the call must take the general path: CUDA or mixed
    devices, inputs that require grad, other array types, and keyword
    values of other types than the documented ones (so is_causal=1, equal
    to True as a key, still gets its error). Written for speed: one
    function, identity tests first, no helper calls on the way."""
    if not ((is_causal is False or is_causal is True or type(is_causal) is str) and
            (enable_gqa is None or enable_gqa is True or enable_gqa is False) and
            (scale is None or type(scale) is float or type(scale) is int) and
            (return_lse is False or return_lse is True) and
            (backend is None or type(backend) is str) and
            (quant is None or type(quant) is str) and
            (component is None or type(component) is str)):
        return _GENERAL
    tq = type(q)
    if tq is np.ndarray:
        if type(k) is not tq or type(v) is not tq:
            return _GENERAL
        key = (q.dtype, k.dtype, v.dtype, q.shape, q.strides, k.shape, k.strides, v.shape,
               v.strides, layout, is_causal, scale, enable_gqa, return_lse, backend, quant,
               component)
    else:
        torch = sys.modules.get("torch")
        if torch is None or tq is not torch.Tensor or type(k) is not tq or type(v) is not tq:
            return _GENERAL
        if not (q.is_cpu and k.is_cpu and v.is_cpu):
            return _GENERAL  # a CUDA call takes torch's current stream, per call
        if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
            return _GENERAL  # the general path refuses it, with the reason
        # torch.Size and tuple hash alike; torch's dtypes keep the two kinds of key apart
        key = (q.dtype, k.dtype, v.dtype, q.shape, q.stride(), k.shape, k.stride(), v.shape,
               v.stride(), layout, is_causal, scale, enable_gqa, return_lse, backend, quant,
               component)
    try:  # (context, plans, their C form, the context's thread count): one attribute read
        owner_ctx, plans, cplans, _ = holder.state
    except AttributeError:  # this thread's first call
        owner_ctx = None
    if owner_ctx is not ctx:  # new thread, or a new context (set_num_threads): new tables
        plans, cplans = {}, {}
        holder.state = (ctx, plans, cplans, ctx.requested)
    plan = plans.get(key)
    if plan is None:
        call = _Call(q, k, v, layout, is_causal, scale, enable_gqa, return_lse, None, backend,
                     quant, component, None, None, None, None)
        result = call.run(fn, handle)
        if call.q.device[0] == C.DEVICE_CPU:
            if len(plans) >= _PLAN_LIMIT:
                plans.clear()
                cplans.clear()
            plans[key] = plan = _Plan(call, fn, handle, owner)
            if call.torch and _fastcall is not None:  # the same structs, for the C hit path
                _fast_setup()
                cplans[key] = plan.addresses(fn)
        return result
    tq, tk, tv, to, rq, rk, rv, ro, rp, cfn, h, is_torch, shape, lse_shape = plan.parts
    if is_torch:  # out as the first call's: torch.empty_like(q) (see _Call)
        tq.data, tk.data, tv.data = q.data_ptr(), k.data_ptr(), v.data_ptr()
        out = torch.empty_like(q)
        to.data = out.data_ptr()
        if return_lse:
            lse = torch.empty(lse_shape, dtype=torch.float32)
            lse_ptr = ctypes.c_void_p(lse.data_ptr())
    else:
        tq.data, tk.data, tv.data = _np_address(q), _np_address(k), _np_address(v)
        out = np.empty(shape, dtype=np.float32)
        to.data = _np_address(out)
        if return_lse:
            lse = np.empty(lse_shape, dtype=np.float32)
            lse_ptr = ctypes.c_void_p(_np_address(lse))
    st = cfn(h, rq, rk, rv, ro, lse_ptr if return_lse else None, rp)
    if st:
        C.check(st)
    return (out, lse) if return_lse else out


def _np_address(x):
    """The data address of a numpy array: through the buffer protocol
    (0.7 us) where the array allows it, else numpy's .ctypes (2.2 us)."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(x))
    except (TypeError, ValueError, BufferError):  # read-only, or not contiguous
        return x.ctypes.data


class _Plan:
    """One signature's C structs, filled by its first call; _prepared sets
    the data pointers and calls C (through an untyped function pointer:
    every argument is already a ctypes object, and ctypes' per-argument
    type checks cost about 1 us a call)."""

    __slots__ = ("parts", "keep")

    def __init__(self, call, fn, handle, owner):
        structs = [x.tensor() for x in (call.q, call.k, call.v, call.out)]
        refs = [ctypes.byref(x) for x in structs + [call.params]]
        # one tuple, unpacked once per call: cheaper than a dozen attribute reads
        self.parts = (*structs, *refs, _UNTYPED[fn.__name__], ctypes.c_void_p(handle.value),
                      call.torch, tuple(call.out_obj.shape),
                      None if call.lse_obj is None else tuple(call.lse_obj.shape))
        # the params' strings and the owner of the handle (context or Layer) live as long as this
        self.keep = (call.params, call._strings, owner)

    def addresses(self, fn):
        """The plan as _fastcall.call reads it: (function, handle, the four
        tensor structs, the params, the LSE's shape or None), as integers;
        valid while this plan lives (the tables drop both together)."""
        tq, tk, tv, to, _, _, _, _, _, _, h, _, _, lse_shape = self.parts
        return (ctypes.cast(fn, ctypes.c_void_p).value, h.value, ctypes.addressof(tq),
                ctypes.addressof(tk), ctypes.addressof(tv), ctypes.addressof(to),
                ctypes.addressof(self.keep[0]), lse_shape)


_GENERAL = object()  # _prepared's answer: take the general path

try:  # the hit path in C, built into the wheel (a source tree without it uses Python's)
    from . import _fastcall
except ImportError:
    _fastcall = None
_fast_tensor_type = None  # torch.Tensor once _fastcall knows torch


def _fast_setup():
    global _fast_tensor_type
    if _fast_tensor_type is None:
        torch = sys.modules["torch"]
        _fastcall.setup(torch.Tensor, torch.is_grad_enabled, torch.empty_like, torch.empty,
                        torch.float32, torch.get_num_threads)
        _fast_tensor_type = torch.Tensor


def merge(out_a, lse_a, out_b, lse_b, *, layout="bshd", out=None, lse=None):
    """Two partial results of one attention call over disjoint sets of keys
    (sdpa_merge): (out_a, lse_a) and (out_b, lse_b) -> (out, lse), as if
    the call had seen both. out_* are [B, Sq, Hq, D] (layout "bshd") or
    [B, Hq, Sq, D] ("bhsd") in any dtype, lse_* float32 [B, Hq, Sq]; numpy
    or CPU torch. A side whose LSE is -inf saw no key and is not read. out=
    and lse= (which may be out_a and lse_a: a running accumulation) receive
    the result; else new float32 arrays. Returns (out, lse)."""
    va, vb = A.view(out_a, "out_a", layout), A.view(out_b, "out_b", layout)
    if va.device[0] != C.DEVICE_CPU or vb.device[0] != C.DEVICE_CPU:
        raise InvalidArgumentError("merge: out_a and out_b must be CPU memory (sdpa_merge "
                                   "runs on the CPU)")
    B, Sq, Hq, _ = va.sizes
    torch = sys.modules.get("torch") if A.is_torch(out_a) else None

    la, pa = _lse_arg(lse_a, "merge: lse_a", B, Hq, Sq)
    lb, pb = _lse_arg(lse_b, "merge: lse_b", B, Hq, Sq)
    if out is None:
        shape = tuple(out_a.shape)
        out = (torch.empty(shape, dtype=torch.float32) if torch is not None else
               np.empty(shape, dtype=np.float32))
    if lse is None:
        lse = (torch.empty((B, Hq, Sq), dtype=torch.float32) if torch is not None else
               np.empty((B, Hq, Sq), dtype=np.float32))
    vo = A.view(out, "out", layout, writable=True)
    lo, po = _lse_arg(lse, "merge: lse", B, Hq, Sq, writable=True)
    ta, tb, to = va.tensor(), vb.tensor(), vo.tensor()
    C.check(C.lib.sdpa_merge(ctypes.byref(ta), pa, ctypes.byref(tb), pb, ctypes.byref(to), po),
            "merge")
    return out, lse


def last_backend():
    """The backend that ran the calling thread's last successful call."""
    name = C.lib.sdpa_last_backend()
    return name.decode() if name else None


class Layer:
    """A C layer: its own backend choice, cached decision and latch (a
    backend that turns out not to support the layer's shape is latched off
    for it, with one warning). Callable like attention()."""

    def __init__(self, name=None, component=None, backend=None, quant=None):
        self._ctx = _context()
        self._strings = [C.cstr(name), C.cstr(component), C.cstr(backend), C.cstr(quant)]
        desc = C.LayerDesc(*self._strings)
        handle = ctypes.c_void_p()
        C.check(C.lib.sdpa_layer_create(self._ctx.handle, ctypes.byref(desc),
                                        ctypes.byref(handle)), "Layer")
        self.handle, self.name, self.component = handle, name, component
        self._tls = threading.local()  # prepared calls, per thread (see _Plan)

    def __call__(self, q, k, v, *, layout="bshd", is_causal=False, scale=None, enable_gqa=None,
                 return_lse=False, out=None, backend=None, attn_mask=None, seq_len_q=None,
                 seq_len_kv=None, key_mask=None):
        if (out is None and attn_mask is None and seq_len_q is None and seq_len_kv is None and
                key_mask is None and _PREPARED):  # as attention(): prepared structs
            if type(q) is _fast_tensor_type:  # the hit path in C, as attention()
                try:
                    owner_ctx, _, cplans, _ = self._tls.state
                except AttributeError:
                    owner_ctx = None
                if owner_ctx is self._ctx:  # a Layer keeps its context: no thread check
                    r = _fastcall.call(cplans, None, q, k, v, layout, is_causal, scale,
                                       enable_gqa, return_lse, backend, None, None)
                    if r is not None:
                        if type(r) is int:
                            C.check(r)
                        return r
            r = _prepared(self._tls, self._ctx, C.lib.sdpa_layer_forward, self.handle, None, q,
                          k, v, layout, is_causal, scale, enable_gqa, return_lse, backend, None,
                          None)
            if r is not _GENERAL:
                return r
        kw = dict(layout=layout, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa,
                  backend=backend, attn_mask=attn_mask, seq_len_q=seq_len_q,
                  seq_len_kv=seq_len_kv, key_mask=key_mask)
        if _wants_grad(q, k, v):  # autograd through the layer's forward and backward
            if out is not None:
                raise InvalidArgumentError("out= with inputs that require grad: autograd "
                                           "cannot see a result written in place")
            from . import torch_ops
            return torch_ops.layer_attention(self, q, k, v, return_lse, kw)
        call = _Call(q, k, v, layout, is_causal, scale, enable_gqa, return_lse, out, backend,
                     None, None, attn_mask, seq_len_q, seq_len_kv, key_mask)
        return call.run(C.lib.sdpa_layer_forward, self.handle)

    def is_latched(self, backend):
        """Whether this layer has latched `backend` off."""
        return bool(C.lib.sdpa_layer_is_latched(self.handle, C.cstr(backend)))

    def __del__(self):
        if getattr(self, "handle", None) and C is not None and C.lib is not None:
            C.lib.sdpa_layer_destroy(self.handle)
            self.handle = None


def explain(q, k, v, *, layout="bshd", is_causal=False, scale=None, enable_gqa=None,
            return_lse=False, out=None, backend=None, layer=None, quant=None, component=None,
            attn_mask=None, seq_len_q=None, seq_len_kv=None, key_mask=None):
    """The dispatcher's decision for this call as a dict (sdpa_explain's
    JSON: platform, call, source, rule, evidence, candidates, present,
    rejected), without running anything. Takes attention()'s keywords."""
    call = _Call(q, k, v, layout, is_causal, scale, enable_gqa, return_lse, out, backend, quant,
                 component, attn_mask, seq_len_q, seq_len_kv, key_mask, allocate=False)
    B, Sq, Skv, Hq, Hkv, D = call.shape
    kinds = 0
    if call.mask is not None:
        m = call.mask
        kinds = ((C.MASK_KIND_SEQ_LEN if (m.seq_len_q or m.seq_len_kv) else 0) |
                 (C.MASK_KIND_KEY if m.key else 0) | (C.MASK_KIND_GENERAL if m.general else 0))
    desc = C.CallDesc(call.q.device[0], call.q.code, B, Sq, Skv, Hq, Hkv, D,
                      call.params.causal, 1 if return_lse else 0, 0, C.cstr(backend),
                      C.cstr(component), C.cstr(quant), kinds)
    text = ctypes.c_void_p()
    ctx = layer._ctx if layer is not None else _context()
    C.check(C.lib.sdpa_explain(ctx.handle, ctypes.byref(desc), 1, ctypes.byref(text)), "explain")
    return json.loads(C.take_text(text))


def info():
    """What libsdpa sees here (sdpa_info's JSON): version, cpu, cuda, the
    kernel for a plain call, and every backend with why it is absent."""
    text = ctypes.c_void_p()
    C.check(C.lib.sdpa_info(_context().handle, 1, ctypes.byref(text)), "info")
    return json.loads(C.take_text(text))


def info_text():
    """`sdpa info`'s text."""
    text = ctypes.c_void_p()
    C.check(C.lib.sdpa_info(_context().handle, 0, ctypes.byref(text)), "info")
    return C.take_text(text)


@contextlib.contextmanager
def backend(name):
    """with libsdpa.backend("cpu.avx512bf16"): ... — the C scoped override:
    this thread's calls run that backend (or fail with its reason); nests."""
    C.check(C.lib.sdpa_override_push(C.cstr(name)), "backend")
    try:
        yield
    finally:
        C.lib.sdpa_override_pop()


def set_component_backend(component, backend):
    """Every call or Layer of `component` ("transformer", "text_encoder")
    runs `backend` (None clears it), on the current context."""
    C.check(C.lib.sdpa_context_set_component_backend(_context().handle, C.cstr(component),
                                                     C.cstr(backend)), "set_component_backend")


def measure_ceiling(what="fp32"):
    """This machine's arithmetic ceiling in GFLOP/s over the context's threads
    ("fp32" FMA peak, "avx512bf16", "amx-bf16"), measured now (~0.2 s), and
    the ISA probed; NotAvailableError where the CPU cannot run it."""
    g, isa = ctypes.c_double(), ctypes.c_char_p()
    C.check(C.lib.sdpa_measure_ceiling(_context().handle, C.cstr(what), ctypes.byref(g),
                                       ctypes.byref(isa)), "measure_ceiling")
    return g.value, (isa.value or b"").decode()


def load_policy(path):
    """Rules from a file, tried before the built-in ones (sdpa_context_load_policy)."""
    C.check(C.lib.sdpa_context_load_policy(_context().handle, C.cstr(os.fspath(path))),
            "load_policy")


# The submodules that need torch or diffusers load on first use, so that
# `import libsdpa` needs numpy only and `libsdpa.diffusers.enable()` works
# without importing the submodule by hand (PEP 562).
_LAZY_SUBMODULES = ("diffusers", "torch_ops", "bench", "distributed", "torch_route")


def __getattr__(name):
    if name in _LAZY_SUBMODULES:
        import importlib
        return importlib.import_module(f"{__name__}.{name}")
    if name == "route_torch_sdpa":  # torch_route's context manager, also on first use
        from .torch_route import route_torch_sdpa
        return route_torch_sdpa
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
