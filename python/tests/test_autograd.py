"""Gradients: libsdpa.attention under autograd against torch's SDPA
backward (float64 as the oracle; torch's own float32/bfloat16 backward as
the yardstick for rounding): f32 within 1e-5 of the gradients' scale,
bf16 within a small multiple of torch's own bf16 error; grouped-query
(dk, dv summed over query heads), cross, causal top-left and bottom-right,
a custom scale, boolean and additive masks, key masks, sequence lengths,
the bhsd layout, the LSE's own gradient, every CPU backend with a backward
pass, Layers; torch.ops.libsdpa under torch.compile(fullgraph=True) with a
backward; libsdpa.backward on numpy; what autograd cannot do raises."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import libsdpa  # noqa: E402
import libsdpa.torch_ops  # noqa: E402,F401

torch.manual_seed(int.from_bytes(__import__("os").urandom(4), "little"))
BACKWARD = [b["name"] for b in libsdpa.info()["backends"]
            if b["device"] == "cpu" and b["present"] and b.get("backward") and
            "f32" in b["dtypes"]]  # cpu.amx (bf16 products) meets the low-precision test


def torch_grads(q, k, v, dout, *, causal=None, scale=None, mask=None, lse_grad=None,
                dtype=torch.float64):
    """torch's SDPA forward and backward in `dtype` on BSHD tensors (BHSD
    inside); with lse_grad, the LSE (logsumexp of the masked, scaled
    scores) joins the loss."""
    q, k, v = (x.detach().to(dtype).transpose(1, 2).requires_grad_() for x in (q, k, v))
    Sq, Skv = q.shape[2], k.shape[2]
    m = mask
    if causal == "bottom-right":
        m = torch.ones(Sq, Skv, dtype=torch.bool).tril(diagonal=Skv - Sq)
    elif causal == "top-left" and lse_grad is not None:
        m = torch.ones(Sq, Skv, dtype=torch.bool).tril()
    if m is not None and m.dtype != torch.bool:
        m = m.to(dtype)
    gqa = q.shape[1] != k.shape[1]
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=m, is_causal=causal == "top-left" and m is None, scale=scale,
        enable_gqa=gqa)
    loss = (out * dout.to(dtype).transpose(1, 2)).sum()
    if lse_grad is not None:
        kk = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        s = q @ kk.transpose(-1, -2) * (scale if scale else q.shape[-1] ** -0.5)
        if m is not None:
            s = s.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else s + m
        loss = loss + (torch.logsumexp(s, -1) * lse_grad.to(dtype)).sum()
    loss.backward()
    return [x.grad.transpose(1, 2) for x in (q, k, v)]


def rel(got, want):
    scale = max(w.abs().max().item() for w in want)
    return max((g.double() - w.double()).abs().max().item() for g, w in zip(got, want)) / scale


CASES = [  # B, Sq, Skv, Hq, Hkv, D, causal
    (1, 37, 37, 2, 2, 64, None), (2, 65, 77, 8, 2, 128, None), (1, 33, 90, 4, 2, 72, "top-left"),
    (1, 90, 33, 2, 1, 64, "bottom-right"), (2, 130, 130, 4, 4, 64, "top-left"),
    (1, 40, 300, 2, 1, 80, None)]


@pytest.mark.parametrize("backend", BACKWARD + [None])
def test_grads_against_torch_f32(backend):
    for B, Sq, Skv, Hq, Hkv, D, causal in CASES:
        q = torch.randn(B, Sq, Hq, D, requires_grad=True)
        k, v = (torch.randn(B, Skv, Hkv, D, requires_grad=True) for _ in range(2))
        dout = torch.randn(B, Sq, Hq, D)
        scale = 0.3 if D == 72 else None
        out = libsdpa.attention(q, k, v, is_causal=causal or False, scale=scale,
                                enable_gqa=Hq != Hkv, backend=backend)
        out.backward(dout)
        want = torch_grads(q, k, v, dout, causal=causal, scale=scale)
        err = rel([q.grad, k.grad, v.grad], want)
        assert err <= 1e-5, (backend, B, Sq, Skv, Hq, Hkv, D, causal, err)
        assert all(x.grad.dtype == torch.float32 and x.grad.shape == x.shape for x in (q, k, v))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
def test_grads_against_torch_low_precision(dtype):
    """Within rounding: no worse than 4x torch's own backward in that dtype
    (both against float64), plus a floor of one unit in the last place."""
    eps = {torch.bfloat16: 2 ** -8, torch.float16: 2 ** -11}[dtype]
    for B, Sq, Skv, Hq, Hkv, D, causal in CASES[:4]:
        q = torch.randn(B, Sq, Hq, D).to(dtype).requires_grad_()
        k, v = (torch.randn(B, Skv, Hkv, D).to(dtype).requires_grad_() for _ in range(2))
        dout = torch.randn(B, Sq, Hq, D).to(dtype)
        libsdpa.attention(q, k, v, is_causal=causal or False, enable_gqa=True).backward(dout)
        assert q.grad.dtype == dtype
        want = torch_grads(q, k, v, dout, causal=causal)
        theirs = torch_grads(q, k, v, dout, causal=causal, dtype=dtype)
        ours, yardstick = rel([q.grad, k.grad, v.grad], want), rel(theirs, want)
        assert ours <= 4 * yardstick + eps, (dtype, B, Sq, Skv, causal, ours, yardstick)


@pytest.mark.parametrize("kv_dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
def test_mixed_dtypes_forward_and_grads(kv_dtype):
    """q in float32 with k and v in f16 or bf16 (stable-diffusion.cpp's
    call): the output in q's dtype, each gradient in its input's dtype, all
    against float64 on the same (rounded) values; the torch op and
    torch.compile take it too."""
    eps = {torch.bfloat16: 2 ** -8, torch.float16: 2 ** -11}[kv_dtype]
    for B, Sq, Skv, Hq, Hkv, D, causal in CASES[:4]:
        q = torch.randn(B, Sq, Hq, D, requires_grad=True)
        k, v = (torch.randn(B, Skv, Hkv, D).to(kv_dtype).requires_grad_() for _ in range(2))
        dout = torch.randn(B, Sq, Hq, D)
        out = libsdpa.attention(q, k, v, is_causal=causal or False, enable_gqa=True)
        assert out.dtype == torch.float32
        out.backward(dout)
        assert q.grad.dtype == torch.float32 and k.grad.dtype == v.grad.dtype == kv_dtype
        want = torch_grads(q, k, v, dout, causal=causal)
        # dq exact to f32; dk, dv within their own dtype's rounding
        assert rel([q.grad], want[:1]) <= 1e-5, (kv_dtype, B, Sq, Skv, causal)
        assert rel([k.grad, v.grad], want[1:]) <= 2 * eps, (kv_dtype, B, Sq, Skv, causal)
    q = torch.randn(1, 40, 2, 64)
    k, v = (torch.randn(1, 77, 2, 64).to(kv_dtype) for _ in range(2))
    ref = torch.nn.functional.scaled_dot_product_attention(
        *(x.double().transpose(1, 2) for x in (q, k, v))).transpose(1, 2)
    op = torch.ops.libsdpa.attention(q, k, v, 0, 0.0, "")
    compiled = torch.compile(lambda a, b, c: torch.ops.libsdpa.attention(a, b, c, 0, 0.0, ""),
                             fullgraph=True)(q, k, v)
    for got in (op, compiled):
        assert got.dtype == torch.float32 and (got.double() - ref).abs().max().item() < 1e-5


def test_grads_with_masks_scale_layout_and_lse():
    B, Sq, Skv, Hq, Hkv, D = 2, 50, 70, 4, 2, 32
    base = [torch.randn(B, Sq, Hq, D), torch.randn(B, Skv, Hkv, D), torch.randn(B, Skv, Hkv, D)]
    dout = torch.randn(B, Sq, Hq, D)
    keep = torch.rand(B, Skv) < 0.7
    keep[:, 0] = True
    general = torch.rand(B, Hq, Sq, Skv) < 0.8
    general[..., 0] = True
    additive = torch.randn(B, 1, Sq, Skv)
    cases = [dict(attn_mask=general), dict(attn_mask=additive), dict(key_mask=keep),
             dict(attn_mask=keep[:, None, None, :])]
    for kw in cases:
        q, k, v = (x.clone().requires_grad_() for x in base)
        libsdpa.attention(q, k, v, scale=0.2, **kw).backward(dout)
        mask = kw.get("attn_mask", keep[:, None, None, :] if "key_mask" in kw else None)
        want = torch_grads(q, k, v, dout, scale=0.2, mask=mask)
        assert rel([q.grad, k.grad, v.grad], want) <= 1e-5, list(kw)
    # sequence lengths: the padding rows' and keys' gradients are zero
    q, k, v = (x.clone().requires_grad_() for x in base)
    lq, lkv = [50, 20], [60, 33]
    libsdpa.attention(q, k, v, seq_len_q=lq, seq_len_kv=lkv).backward(dout)
    for b in range(B):
        want = torch_grads(q[b:b + 1, :lq[b]], k[b:b + 1, :lkv[b]], v[b:b + 1, :lkv[b]],
                           dout[b:b + 1, :lq[b]])
        got = [q.grad[b:b + 1, :lq[b]], k.grad[b:b + 1, :lkv[b]], v.grad[b:b + 1, :lkv[b]]]
        assert rel(got, want) <= 1e-5
        assert q.grad[b, lq[b]:].abs().sum().item() == 0
        assert k.grad[b, lkv[b]:].abs().sum().item() == 0
        assert v.grad[b, lkv[b]:].abs().sum().item() == 0
    # bhsd layout, and the LSE's own gradient
    q, k, v = (x.clone().transpose(1, 2).contiguous().requires_grad_() for x in base)
    dlse = torch.randn(B, Hq, Sq)
    out, lse = libsdpa.attention(q, k, v, layout="bhsd", is_causal=True, return_lse=True)
    assert out.shape == q.shape
    ((out * dout.transpose(1, 2)).sum() + (lse * dlse).sum()).backward()
    want = torch_grads(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), dout,
                       causal="top-left", lse_grad=dlse)
    assert rel([q.grad.transpose(1, 2), k.grad.transpose(1, 2), v.grad.transpose(1, 2)],
               want) <= 1e-5


def test_layer_and_explicit_ops():
    B, S, H, D = 1, 40, 2, 32
    q, k, v = (torch.randn(B, S, H, D, requires_grad=True) for _ in range(3))
    dout = torch.randn(B, S, H, D)
    want = torch_grads(q, k, v, dout)
    layer = libsdpa.Layer(name="blocks.0.attn")
    layer(q, k, v).backward(dout)
    assert rel([q.grad, k.grad, v.grad], want) <= 1e-5
    for x in (q, k, v):
        x.grad = None
    torch.ops.libsdpa.attention(q, k, v, 0, 0.0, "").backward(dout)  # recomputes the LSE
    assert rel([q.grad, k.grad, v.grad], want) <= 1e-5
    for x in (q, k, v):
        x.grad = None
    out, lse = torch.ops.libsdpa.attention_lse(q, k, v, 0, 0.0, "")
    out.backward(dout)
    assert rel([q.grad, k.grad, v.grad], want) <= 1e-5


def test_compile_fullgraph_with_backward():
    class Attn(torch.nn.Module):
        def forward(self, q, k, v):
            out, _ = torch.ops.libsdpa.sdpa(q, k, v, None, None, None, None, 1, 0.0, "", "", "")
            return out.sin()

    B, S, H, D = 1, 48, 2, 32
    base = [torch.randn(B, S, H, D) for _ in range(3)]
    grads = []
    for fn in (Attn(), torch.compile(Attn(), fullgraph=True)):
        q, k, v = (x.clone().requires_grad_() for x in base)
        fn(q, k, v).sum().backward()
        grads.append([q.grad, k.grad, v.grad])
    assert rel(grads[1], grads[0]) <= 1e-6


def test_backward_on_numpy():
    B, S, H, D = 1, 20, 2, 16
    q, k, v, dout = (np.random.rand(B, S, H, D).astype(np.float32) - 0.5 for _ in range(4))
    out, lse = libsdpa.attention(q, k, v, return_lse=True)
    dq, dk, dv = libsdpa.backward(q, k, v, out, lse, dout)
    assert dq.dtype == np.float32 and dq.shape == q.shape and dk.shape == k.shape
    want = torch_grads(*(torch.from_numpy(x) for x in (q, k, v)), torch.from_numpy(dout))
    assert rel([torch.from_numpy(x) for x in (dq, dk, dv)], want) <= 1e-5
    with pytest.raises(libsdpa.InvalidArgumentError, match="lse"):
        libsdpa.backward(q, k, v, out, lse[:, :1], dout)


def test_what_autograd_cannot_do_raises():
    q = torch.randn(1, 8, 2, 16, requires_grad=True)
    with pytest.raises(libsdpa.InvalidArgumentError, match="out="):
        libsdpa.attention(q, q, q, out=torch.empty(1, 8, 2, 16))
    bias = torch.randn(1, 1, 8, 8, requires_grad=True)
    with pytest.raises(libsdpa.InvalidArgumentError, match="attn_mask requires grad"):
        libsdpa.attention(q, q, q, attn_mask=bias)
    with torch.no_grad():  # without autograd, nothing to refuse
        libsdpa.attention(q, q, q, attn_mask=bias)
