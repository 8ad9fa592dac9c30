"""torch.ops.libsdpa: libsdpa as PyTorch custom operators with fake (meta)
implementations and autograd, so torch.compile(fullgraph=True) keeps a
module that calls them whole (no graph break), forward and backward.
Imported by `import libsdpa.torch_ops` (torch required); libsdpa itself
needs only numpy.

    out = torch.ops.libsdpa.attention(q, k, v, causal, scale, backend)
    out, lse = torch.ops.libsdpa.attention_lse(q, k, v, causal, scale, backend)
    out, lse = torch.ops.libsdpa.sdpa(q, k, v, attn_mask, seq_len_q, seq_len_kv, key_mask,
                                      causal, scale, backend, component, quant)
    dq, dk, dv = torch.ops.libsdpa.sdpa_backward(dout, dlse, q, k, v, out, lse, attn_mask,
                                                 seq_len_q, seq_len_kv, key_mask, causal,
                                                 scale, backend, component, quant)

q [B, Sq, Hq, D], k and v [B, Skv, Hkv, D] (BSHD, diffusers' layout; any
strides); causal 0 none, 1 top-left, 2 bottom-right; scale 0.0 for
1/sqrt(D); backend "" for the dispatcher's choice; the masks optional as in
libsdpa.attention (attn_mask boolean or additive, broadcastable to
[B, Hq, Sq, Skv]; seq_len_* int32 [B]; key_mask bool [B, Skv]). out has
q's dtype, shape and (for dense q) strides; lse is float32 [B, Hq, Sq].

Autograd: every forward operator has a registered backward, sdpa_backward
(libsdpa's own, dispatched like the forward: `sdpa explain --backward`).
sdpa and attention_lse keep the LSE for it; attention, which returns out
alone, recomputes the LSE with one more forward call in its backward (a
forward costs about 0.4 of a backward): prefer sdpa when training. The
LSE's own gradient is honoured. Masks get no gradient: an attn_mask that
requires grad is refused by libsdpa.attention.
"""
from typing import Optional, Tuple

import torch

import libsdpa

_CAUSAL = {0: False, 1: "top-left", 2: "bottom-right"}


def _kw(causal, scale, backend, component="", quant=""):
    if causal not in _CAUSAL:
        raise libsdpa.InvalidArgumentError(f"causal is {causal}, expected 0, 1 or 2")
    return dict(is_causal=_CAUSAL[causal], scale=scale if scale else None,
                backend=backend or None, component=component or None, quant=quant or None)


@torch.library.custom_op("libsdpa::attention", mutates_args=())
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: int = 0,
              scale: float = 0.0, backend: str = "") -> torch.Tensor:
    return libsdpa._forward(q, k, v, **_kw(causal, scale, backend))


@attention.register_fake
def _(q, k, v, causal=0, scale=0.0, backend=""):
    return torch.empty_like(q, memory_format=torch.contiguous_format)


@torch.library.custom_op("libsdpa::attention_lse", mutates_args=())
def attention_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: int = 0,
                  scale: float = 0.0, backend: str = "") -> Tuple[torch.Tensor, torch.Tensor]:
    return libsdpa._forward(q, k, v, return_lse=True, **_kw(causal, scale, backend))


@attention_lse.register_fake
def _(q, k, v, causal=0, scale=0.0, backend=""):
    B, Sq, Hq, _ = q.shape
    return (torch.empty_like(q, memory_format=torch.contiguous_format),
            q.new_empty((B, Hq, Sq), dtype=torch.float32))


def _masks(attn_mask, seq_len_q, seq_len_kv, key_mask):
    return dict(attn_mask=attn_mask, seq_len_q=seq_len_q, seq_len_kv=seq_len_kv,
                key_mask=key_mask)


@torch.library.custom_op("libsdpa::sdpa", mutates_args=())
def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: Optional[torch.Tensor],
         seq_len_q: Optional[torch.Tensor], seq_len_kv: Optional[torch.Tensor],
         key_mask: Optional[torch.Tensor], causal: int = 0, scale: float = 0.0,
         backend: str = "", component: str = "", quant: str = ""
         ) -> Tuple[torch.Tensor, torch.Tensor]:
    return libsdpa._forward(q, k, v, return_lse=True,
                            **_masks(attn_mask, seq_len_q, seq_len_kv, key_mask),
                            **_kw(causal, scale, backend, component, quant))


@sdpa.register_fake
def _(q, k, v, attn_mask, seq_len_q, seq_len_kv, key_mask, causal=0, scale=0.0, backend="",
      component="", quant=""):
    B, Sq, Hq, _ = q.shape
    return torch.empty_like(q), q.new_empty((B, Hq, Sq), dtype=torch.float32)


@torch.library.custom_op("libsdpa::sdpa_backward", mutates_args=())
def sdpa_backward(dout: torch.Tensor, dlse: Optional[torch.Tensor], q: torch.Tensor,
                  k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                  attn_mask: Optional[torch.Tensor], seq_len_q: Optional[torch.Tensor],
                  seq_len_kv: Optional[torch.Tensor], key_mask: Optional[torch.Tensor],
                  causal: int = 0, scale: float = 0.0, backend: str = "", component: str = "",
                  quant: str = "") -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if dlse is not None:
        dlse = dlse.to(torch.float32).contiguous()
    return libsdpa.backward(q, k, v, out, lse.contiguous(), dout, dlse=dlse,
                            **_masks(attn_mask, seq_len_q, seq_len_kv, key_mask),
                            **_kw(causal, scale, backend, component, quant))


@sdpa_backward.register_fake
def _(dout, dlse, q, k, v, out, lse, attn_mask, seq_len_q, seq_len_kv, key_mask, causal=0,
      scale=0.0, backend="", component="", quant=""):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _save(ctx, q, k, v, out, lse, masks, causal, scale, backend, component="", quant=""):
    ctx.save_for_backward(q, k, v, out, lse, *masks)
    ctx.args = (causal, scale, backend, component, quant)


def _grads(ctx, dout, dlse):
    q, k, v, out, lse, *masks = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(out)
    return sdpa_backward(dout, dlse, q, k, v, out, lse, *masks, *ctx.args)


def _sdpa_setup(ctx, inputs, output):
    q, k, v, attn_mask, seq_len_q, seq_len_kv, key_mask, *args = inputs
    _save(ctx, q, k, v, output[0], output[1], (attn_mask, seq_len_q, seq_len_kv, key_mask), *args)


def _sdpa_grad(ctx, dout, dlse):
    return (*_grads(ctx, dout, dlse), None, None, None, None, None, None, None, None, None)


sdpa.register_autograd(_sdpa_grad, setup_context=_sdpa_setup)


def _lse_setup(ctx, inputs, output):
    q, k, v, *args = inputs
    _save(ctx, q, k, v, output[0], output[1], (None, None, None, None), *args)


def _lse_grad(ctx, dout, dlse):
    return (*_grads(ctx, dout, dlse), None, None, None)


attention_lse.register_autograd(_lse_grad, setup_context=_lse_setup)


def _out_setup(ctx, inputs, output):
    q, k, v, *args = inputs
    ctx.save_for_backward(q, k, v, output)
    ctx.args = args


def _out_grad(ctx, dout):
    """attention() kept no LSE: one forward call finds it again."""
    q, k, v, out = ctx.saved_tensors
    causal, scale, backend = ctx.args
    _, lse = attention_lse(q, k, v, causal, scale, backend)
    return (*sdpa_backward(dout, None, q, k, v, out, lse, None, None, None, None, causal, scale,
                           backend), None, None, None)


attention.register_autograd(_out_grad, setup_context=_out_setup)


class _LayerFunction(torch.autograd.Function):
    """A Layer's call under autograd: its forward (with the LSE) and its
    sdpa_layer_backward, so the layer's choice and latch hold for both
    passes. An autograd.Function, not an operator: a Layer is a Python
    object, which operator schemas cannot carry (torch.compile breaks the
    graph here; libsdpa.attention and the operators above do not)."""

    @staticmethod
    def forward(ctx, q, k, v, layer, return_lse, kw):
        out, lse = layer(q, k, v, return_lse=True, **kw)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.layer, ctx.kw, ctx.return_lse = layer, kw, return_lse
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        if not ctx.return_lse:
            dlse = None  # not returned to the caller: no gradient reaches it
        elif dlse is not None:
            dlse = dlse.to(torch.float32).contiguous()
        dq, dk, dv = libsdpa.backward(q, k, v, out, lse, dout, dlse=dlse, layer=ctx.layer,
                                      **ctx.kw)
        return dq, dk, dv, None, None, None


def layer_attention(layer, q, k, v, return_lse, kw):
    """Layer.__call__ under autograd (see _LayerFunction)."""
    out, lse = _LayerFunction.apply(q, k, v, layer, return_lse, kw)
    return (out, lse) if return_lse else out
