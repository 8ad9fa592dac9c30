"""torch.ops.libsdpa.attention: libsdpa as a PyTorch custom op with a fake
(meta) implementation, so torch.compile(fullgraph=True) keeps a module
that calls it whole (no graph break). Imported by `import libsdpa.torch_ops`
(torch required); libsdpa itself needs only numpy.

    out = torch.ops.libsdpa.attention(q, k, v, causal, scale, backend)
    out, lse = torch.ops.libsdpa.attention_lse(q, k, v, causal, scale, backend)

q [B, Sq, Hq, D], k and v [B, Skv, Hkv, D] (BSHD, diffusers' layout); causal
0 none, 1 top-left, 2 bottom-right; scale 0.0 for 1/sqrt(D); backend "" for
the dispatcher's choice. out has q's dtype and shape; lse is float32
[B, Hq, Sq].
"""
from typing import Tuple

import torch

import libsdpa

_CAUSAL = {0: False, 1: "top-left", 2: "bottom-right"}


def _kw(causal, scale, backend):
    if causal not in _CAUSAL:
        raise libsdpa.InvalidArgumentError(f"causal is {causal}, expected 0, 1 or 2")
    return dict(is_causal=_CAUSAL[causal], scale=scale if scale else None,
                backend=backend or None)


@torch.library.custom_op("libsdpa::attention", mutates_args=())
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: int = 0,
              scale: float = 0.0, backend: str = "") -> torch.Tensor:
    return libsdpa.attention(q, k, v, **_kw(causal, scale, backend))


@attention.register_fake
def _(q, k, v, causal=0, scale=0.0, backend=""):
    return torch.empty_like(q, memory_format=torch.contiguous_format)


@torch.library.custom_op("libsdpa::attention_lse", mutates_args=())
def attention_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: int = 0,
                  scale: float = 0.0, backend: str = "") -> Tuple[torch.Tensor, torch.Tensor]:
    return libsdpa.attention(q, k, v, return_lse=True, **_kw(causal, scale, backend))


@attention_lse.register_fake
def _(q, k, v, causal=0, scale=0.0, backend=""):
    B, Sq, Hq, _ = q.shape
    return (torch.empty_like(q, memory_format=torch.contiguous_format),
            q.new_empty((B, Hq, Sq), dtype=torch.float32))
