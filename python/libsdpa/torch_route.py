"""Routing torch.nn.functional.scaled_dot_product_attention to libsdpa, for
the models that call torch's SDPA themselves rather than through
diffusers' attention dispatcher (SDXL's UNet processors, SD3's joint
processors, CogVideoX, PixArt, Sana, Lumina2, Mochi, ...):

    with libsdpa.route_torch_sdpa():        # this thread, any caller
        image = pipe(prompt).images[0]

    libsdpa.torch_route.enable()            # every thread, calls through F.
    libsdpa.torch_route.disable()
    print(libsdpa.torch_route.explain())     # taken, handed back, why

A call is taken when libsdpa computes exactly what torch would: torch's
layout [B, H, S, D] (or [B, S, D]), attn_mask boolean (True attends) or
additive in the inputs' dtype or float32, broadcast to [B, H, Sq, Skv] as
torch broadcasts it, is_causal top-left (torch's alignment for Sq != Skv),
scale, enable_gqa. Under autograd the call is libsdpa's custom operator
with libsdpa's backward. Everything else is handed back to torch's own
SDPA, unchanged, counted by reason and reported once per reason (a
warning): dropout_p > 0, other dtypes (float64) or devices (CUDA: the
plugin has not run on a GPU yet), a value head dim different from the
query's, mask and is_causal together (torch's own error then), an
attn_mask that requires grad, GQA without enable_gqa, batch dims torch
would broadcast, tensor subclasses and nested tensors, and any call
libsdpa refuses (its reason is the count's key). Out-of-memory and device
errors are raised, never handed back.

The context manager is a torch function mode: it sees every call on its
thread, however the caller reached the function. enable() replaces the
attribute torch.nn.functional.scaled_dot_product_attention, so it reaches
every thread but only callers that look the function up there at call
time (F.scaled_dot_product_attention, as diffusers' processors do), not
one imported by name beforehand.

FlexAttention too: torch.nn.attention.flex_attention.flex_attention calls
with a BlockMask (or none) and no score_mod are taken, the BlockMask's
mask_mod evaluated once per partial block into libsdpa's map (see
libsdpa.attention's block_mask); return_lse gives libsdpa's LSE (natural
log, as torch's); kernel_options are torch's kernel tiles and do not
change the result. Handed back: a score_mod, return_aux, the same tensor
conditions as above. flex_attention takes no torch function mode, so it
is reached through its module attribute (how diffusers' "flex" backend
calls it): while a route_torch_sdpa() context is open on any thread, or
after enable(), that attribute is libsdpa's wrapper, which routes the
calls of threads inside a context (or every thread after enable()) and
passes the others to torch's function unchanged.
"""
import collections
import threading
import warnings

import torch
from torch.overrides import TorchFunctionMode

import libsdpa
import libsdpa.sparse

_ORIGINAL = torch.nn.functional.scaled_dot_product_attention
try:
    import torch.nn.attention.flex_attention as _flex_module
    _FLEX_ORIGINAL = _flex_module.flex_attention
except ImportError:  # a torch without FlexAttention
    _flex_module = _FLEX_ORIGINAL = None
_lock = threading.Lock()
_thread = threading.local()  # .depth: route_torch_sdpa() contexts open on this thread
_open_contexts = 0           # on every thread
_flex_everywhere = False     # enable()
_taken = collections.Counter()      # backend -> calls
_handed_back = collections.Counter()  # reason -> calls
_warned = set()


class RoutingWarning(UserWarning):
    """A call handed back to torch, once per reason."""


def _hand_back(reason, frames=0):  # frames: calls between the router and this
    with _lock:
        _handed_back[reason] += 1
        first = reason not in _warned
        _warned.add(reason)
    if first:
        warnings.warn(f"libsdpa.route_torch_sdpa: a call went to torch's own SDPA: {reason} "
                      "(counted in libsdpa.torch_route.stats(); this reason is not reported "
                      "again)", RoutingWarning, stacklevel=4 + frames)
    return None


_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _plain(x):
    return type(x) is torch.Tensor or type(x) is torch.nn.Parameter


def _kind_reason(q, k, v):
    """Why q, k, v are not plain dense tensors, or None."""
    if not (_plain(q) and _plain(k) and _plain(v)):
        return "q, k or v is not a plain tensor (a subclass, or not a tensor)"
    if q.is_nested or k.is_nested or v.is_nested:
        return "nested tensors"
    return None


def _place_reason(q, k, v):
    """Why libsdpa does not take q, k, v's device or dtypes, or None."""
    if q.device.type != "cpu" or k.device.type != "cpu" or v.device.type != "cpu":
        return (f"tensors on {q.device.type} (libsdpa routes CPU tensors; its CUDA plugin has "
                "not run on a GPU)")
    if q.dtype not in _DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        return (f"dtype {q.dtype}/{k.dtype}/{v.dtype} (libsdpa takes one of float32, float16, "
                "bfloat16 for all three)")
    return None


def _take(call):
    """libsdpa's result of call(), counted as taken by the backend that ran
    it; None (handed back, counted) when libsdpa refuses; out-of-memory and
    device errors raised."""
    try:
        out = call()
    except (libsdpa.OutOfMemoryError, libsdpa.DeviceError):
        raise
    except libsdpa.Error as e:
        return _hand_back(f"libsdpa refused it: {type(e).__name__}: {e}", frames=1)
    with _lock:
        _taken[libsdpa.last_backend() or "?"] += 1
    return out


def _route(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
           enable_gqa=False):
    """libsdpa's result for torch's call, or None (handed back, counted)."""
    reason = _kind_reason(q, k, v)
    if reason:
        return _hand_back(reason)
    if dropout_p:
        return _hand_back("dropout_p > 0 (libsdpa has no dropout)")
    reason = _place_reason(q, k, v)
    if reason:
        return _hand_back(reason)
    if not (q.dim() == k.dim() == v.dim() and q.dim() in (3, 4)):
        return _hand_back(f"{q.dim()}-dimensional inputs (libsdpa routes [B, H, S, D] and "
                          "[B, S, D])")
    if min(q.shape) == 0 or min(k.shape) == 0 or min(v.shape) == 0:
        return _hand_back("an empty tensor")
    if v.shape[-1] != q.shape[-1] or k.shape[-1] != q.shape[-1]:
        return _hand_back("value head dim differs from the query's")
    if attn_mask is not None and is_causal:
        return _hand_back("attn_mask and is_causal together (torch raises)")
    three = q.dim() == 3
    if three:  # [B, S, D]: one head
        q, k, v = q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1)
    if q.shape[0] != k.shape[0] or k.shape[:2] != v.shape[:2] or k.shape[2] != v.shape[2]:
        return _hand_back("batch or key shapes that torch broadcasts or refuses")
    Hq, Hkv = q.shape[1], k.shape[1]
    if Hq != Hkv and (not enable_gqa or Hq % Hkv):
        return _hand_back("different head counts without enable_gqa (torch decides)")
    mask = attn_mask
    if mask is not None:
        if not _plain(mask) or mask.device.type != "cpu":
            return _hand_back("attn_mask is not a plain CPU tensor")
        if mask.requires_grad and torch.is_grad_enabled():
            return _hand_back("attn_mask requires grad (libsdpa gives masks no gradient)")
        if mask.dtype != torch.bool and mask.dtype not in (torch.float32, q.dtype):
            return _hand_back(f"attn_mask of dtype {mask.dtype} (libsdpa takes bool, float32 or "
                              "the inputs' dtype)")
        if three and mask.dim() == 3:
            mask = mask.unsqueeze(1)
        if mask.dim() > 4:
            return _hand_back("attn_mask with more than 4 dimensions")
        try:
            torch.broadcast_shapes(mask.shape, (q.shape[0], Hq, q.shape[2], k.shape[2]))
        except RuntimeError:
            return _hand_back("attn_mask that does not broadcast to [B, H, Sq, Skv]")
    out = _take(lambda: libsdpa.attention(q, k, v, layout="bhsd", is_causal=bool(is_causal),
                                          scale=scale, enable_gqa=True if Hq != Hkv else None,
                                          attn_mask=mask))
    if out is None:
        return None
    return out.squeeze(1) if three else out


def _route_flex(q, k, v, score_mod=None, block_mask=None, scale=None, enable_gqa=False,
                return_lse=False, kernel_options=None, return_aux=None):
    """libsdpa's result for torch's flex_attention call, or None (handed back)."""
    if score_mod is not None:
        return _hand_back("flex_attention with a score_mod (libsdpa has no score modification; "
                          "block_mask and its mask_mod are taken)")
    if return_aux is not None:
        return _hand_back("flex_attention with return_aux")
    reason = _kind_reason(q, k, v) or _place_reason(q, k, v)
    if reason:
        return _hand_back(reason)
    if not (q.dim() == k.dim() == v.dim() == 4) or min(q.shape) == 0 or min(k.shape) == 0:
        return _hand_back("flex_attention inputs that are not non-empty [B, H, S, D]")
    if v.shape[-1] != q.shape[-1] or k.shape[-1] != q.shape[-1]:
        return _hand_back("value head dim differs from the query's")
    if q.shape[0] != k.shape[0] or k.shape[:3] != v.shape[:3]:
        return _hand_back("batch or key shapes that torch broadcasts or refuses")
    if q.shape[1] != k.shape[1] and (not enable_gqa or q.shape[1] % k.shape[1]):
        return _hand_back("different head counts without enable_gqa (torch decides)")
    if block_mask is not None and not isinstance(block_mask, _flex_module.BlockMask):
        return _hand_back(f"block_mask of type {type(block_mask).__name__}")
    out = _take(lambda: libsdpa.sparse.flex_attention(q, k, v, block_mask=block_mask,
                                                      scale=scale, enable_gqa=bool(enable_gqa),
                                                      return_lse=bool(return_lse)))
    if out is None:
        return None
    return tuple(out) if return_lse else out


def _flex(query, key, value, score_mod=None, block_mask=None, scale=None, enable_gqa=False,
          return_lse=False, kernel_options=None, **kwargs):
    """torch's flex_attention signature: what the module attribute is while
    routing may apply; routes this thread's calls inside a context, every
    thread's after enable(), and passes the rest to torch unchanged."""
    if _flex_everywhere or getattr(_thread, "depth", 0):
        out = _route_flex(query, key, value, score_mod, block_mask, scale, enable_gqa,
                          return_lse, kernel_options, kwargs.get("return_aux"))
        if out is not None:
            return out
    return _FLEX_ORIGINAL(query, key, value, score_mod=score_mod, block_mask=block_mask,
                          scale=scale, enable_gqa=enable_gqa, return_lse=return_lse,
                          kernel_options=kernel_options, **kwargs)


def _flex_install():
    """The wrapper in place while any context is open or enable() holds
    (called with _lock held)."""
    if _flex_module is not None:
        _flex_module.flex_attention = (_flex if _open_contexts or _flex_everywhere
                                       else _FLEX_ORIGINAL)


def _sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
          enable_gqa=False):
    """torch's signature; what enable() installs."""
    out = _route(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    if out is None:
        return _ORIGINAL(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                         is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
    return out


class _Mode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is _ORIGINAL or func is _sdpa:
            out = _route(*args, **kwargs)
            if out is not None:
                return out
            return _ORIGINAL(*args, **kwargs)
        return func(*args, **kwargs)


class route_torch_sdpa:
    """with libsdpa.route_torch_sdpa(): every torch SDPA call on this thread
    goes to libsdpa where libsdpa computes exactly what torch would (see the
    module's docstring); the rest to torch, counted. Nests."""

    def __enter__(self):
        global _open_contexts
        self._mode = _Mode()
        self._mode.__enter__()
        _thread.depth = getattr(_thread, "depth", 0) + 1
        with _lock:
            _open_contexts += 1
            _flex_install()
        return self

    def __exit__(self, *exc):
        global _open_contexts
        _thread.depth -= 1
        with _lock:
            _open_contexts -= 1
            _flex_install()
        return self._mode.__exit__(*exc)


def enable():
    """Route every call through torch.nn.functional.scaled_dot_product_attention
    and torch.nn.attention.flex_attention.flex_attention (all threads), until
    disable()."""
    global _flex_everywhere
    torch.nn.functional.scaled_dot_product_attention = _sdpa
    with _lock:
        _flex_everywhere = True
        _flex_install()


def disable():
    global _flex_everywhere
    torch.nn.functional.scaled_dot_product_attention = _ORIGINAL
    with _lock:
        _flex_everywhere = False
        _flex_install()


def enabled():
    return torch.nn.functional.scaled_dot_product_attention is _sdpa


def stats():
    """{"taken": n, "by_backend": {backend: n}, "handed_back": n,
    "reasons": {reason: n}} for this process so far."""
    with _lock:
        return {"taken": sum(_taken.values()), "by_backend": dict(_taken),
                "handed_back": sum(_handed_back.values()), "reasons": dict(_handed_back)}


def reset_stats():
    """Counts back to zero, and every reason is reported again when it next
    occurs."""
    with _lock:
        _taken.clear()
        _handed_back.clear()
        _warned.clear()


def explain():
    """The counts as text: how many torch SDPA calls libsdpa took (by
    backend) and how many it handed back to torch, and why."""
    s = stats()
    lines = [f"torch SDPA calls taken by libsdpa: {s['taken']}"]
    lines += [f"  {n:8d}  {b}" for b, n in sorted(s["by_backend"].items(), key=lambda x: -x[1])]
    lines.append(f"handed back to torch: {s['handed_back']}")
    lines += [f"  {n:8d}  {r}" for r, n in sorted(s["reasons"].items(), key=lambda x: -x[1])]
    return "\n".join(lines)
