"""Block-sparse attention from Python: torch's own FlexAttention BlockMask
(create_block_mask with mask_mods: causal, sliding window, document
masks, a 3-D neighbourhood) run by libsdpa against torch's flex_attention
and against SDPA with the same mask materialised; BlockMap.neighborhood_3d;
window=; autograd through a block map against torch's gradients; bad maps
refused with the field named."""
import numpy as np
import pytest

import libsdpa

torch = pytest.importorskip("torch")
flex = pytest.importorskip("torch.nn.attention.flex_attention")

torch.manual_seed(int.from_bytes(__import__("os").urandom(4), "little"))
CLAIMING = {b["name"]: b["dtypes"] for b in libsdpa.info()["backends"]
            if b["device"] == "cpu" and b["present"] and "blocks" in b.get("masks", [])}
DT = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}


def dense_sdpa(q, k, v, mask, scale=None):
    """torch's SDPA in float64 over BHSD with a boolean [B|1, H|1, Sq, Skv]
    mask; rows that see nothing give zeros (sdpa.h), not NaN."""
    q, k, v = (x.double() for x in (q, k, v))
    s = (q @ k.transpose(-1, -2)) * (scale if scale is not None else q.shape[-1] ** -0.5)
    s = s.masked_fill(~mask, float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    lse = torch.logsumexp(s, dim=-1)
    return p @ v, lse


def materialise(mask_mod, B, H, Sq, Skv):
    b = torch.arange(B).view(B, 1, 1, 1)
    h = torch.arange(H).view(1, H, 1, 1)
    i = torch.arange(Sq).view(1, 1, Sq, 1)
    j = torch.arange(Skv).view(1, 1, 1, Skv)
    return torch.broadcast_to(mask_mod(b, h, i, j), (B, H, Sq, Skv))


def causal(b, h, q, kv):
    return q >= kv


def sliding(b, h, q, kv):
    return (q - kv).abs() <= 100


def documents(b, h, q, kv):  # three documents of different lengths, per batch entry
    doc_q = (q >= 97).int() + (q >= 230 + 11 * b).int()
    doc_k = (kv >= 97).int() + (kv >= 230 + 11 * b).int()
    return doc_q == doc_k


def per_head(b, h, q, kv):  # a different window per head
    return (q - kv).abs() <= 40 * (h + 1)


@pytest.mark.parametrize("mask_mod,B,H,S,block", [
    (causal, 1, 2, 300, 128), (sliding, 2, 1, 333, 64), (documents, 2, 1, 300, 128),
    (per_head, 1, 3, 260, 64)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_torch_block_mask(mask_mod, B, H, S, block, dtype):
    bm = flex.create_block_mask(mask_mod, B if mask_mod is documents else None,
                                H if mask_mod is per_head else None, S, S, device="cpu",
                                BLOCK_SIZE=block)
    q, k, v = (torch.randn(B, H, S, 64, dtype=dtype) for _ in range(3))
    dense = materialise(mask_mod, B, H, S, S)
    want, want_lse = dense_sdpa(q, k, v, dense)
    tol = 3e-5 if dtype == torch.float32 else 3e-2
    assert CLAIMING, "no backend takes block maps"
    for backend in (b for b, dts in CLAIMING.items() if DT[dtype] in dts):
        out, lse = libsdpa.attention(q, k, v, layout="bhsd", block_mask=bm, return_lse=True,
                                     backend=backend)
        assert (out.double() - want).abs().max() < tol, backend
        fin = torch.isfinite(want_lse)
        assert torch.equal(torch.isfinite(lse), fin)
        assert (lse.double()[fin] - want_lse[fin]).abs().max() < 1e-3 + tol, backend
    # flex_attention's calling convention, the dispatcher's choice
    out = libsdpa.sparse.flex_attention(q, k, v, block_mask=bm)
    assert (out.double() - want).abs().max() < tol
    # and torch's own (uncompiled) flex_attention agrees where rows see keys
    if dtype == torch.float32:
        ref = flex.flex_attention(q, k, v, block_mask=bm)
        seen = dense.any(-1, keepdim=True).expand_as(ref)
        assert (out - ref)[seen].abs().max() < 1e-4


@pytest.mark.parametrize("prefix,suffix", [(20, 0), (7, 13)])
def test_neighborhood_3d_and_window(prefix, suffix):
    grid, win = (3, 6, 10), (3, 3, 5)
    S = prefix + 3 * 6 * 10 + suffix
    m = libsdpa.BlockMap.neighborhood_3d(grid, win, prefix=prefix, suffix=suffix, block=64)
    assert 0 < m.density(S, S) <= 1
    q, k, v = (torch.randn(1, S, 2, 32) for _ in range(3))
    # the neighbourhood by coordinates, as a dense mask
    pos = [(t, y, x) for t in range(3) for y in range(6) for x in range(10)]

    def start(p, n, w):
        return min(max(p - w // 2, 0), n - w)
    dense = torch.ones(S, S, dtype=torch.bool)
    for i, (t, y, x) in enumerate(pos):
        for j, (t2, y2, x2) in enumerate(pos):
            ok = all(start(p, n, w) <= p2 < start(p, n, w) + w
                     for p, p2, n, w in ((t, t2, 3, 3), (y, y2, 6, 3), (x, x2, 10, 5)))
            dense[prefix + i, prefix + j] = ok
    want, _ = dense_sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), dense)
    out = libsdpa.attention(q, k, v, block_mask=m)
    assert (out.double() - want.transpose(1, 2)).abs().max() < 3e-5
    # a 1-D window, bottom-right aligned as FlashAttention's
    Sq, Skv = 100, 180
    q, k, v = (torch.randn(1, n, 1, 32) for n in (Sq, Skv, Skv))
    i = torch.arange(Sq).view(-1, 1) + (Skv - Sq)
    j = torch.arange(Skv).view(1, -1)
    dense = (j >= i - 30) & (j <= i + 5)
    want, _ = dense_sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), dense)
    out = libsdpa.attention(q, k, v, window=(30, 5))
    assert (out.double() - want.transpose(1, 2)).abs().max() < 3e-5


def test_autograd_through_block_mask():
    S, H = 200, 2
    bm = flex.create_block_mask(sliding, None, None, S, S, device="cpu", BLOCK_SIZE=64)
    q, k, v = (torch.randn(1, H, S, 32, requires_grad=True) for _ in range(3))
    out = libsdpa.attention(q, k, v, layout="bhsd", block_mask=bm)
    g = torch.randn_like(out)
    out.backward(g)
    grads = [x.grad.clone() for x in (q, k, v)]
    q2, k2, v2 = (x.detach().double().requires_grad_() for x in (q, k, v))
    dense = materialise(sliding, 1, H, S, S)
    s = (q2 @ k2.transpose(-1, -2)) * 32 ** -0.5
    o2 = torch.softmax(s.masked_fill(~dense, float("-inf")), -1) @ v2
    o2.backward(g.double())
    for got, want in zip(grads, (q2.grad, k2.grad, v2.grad)):
        assert (got.double() - want).abs().max() < 1e-4


def test_bad_map_named():
    counts = np.array([[[1, 1]]], dtype=np.int32)
    index = np.array([[[[0, 5], [3, 0]]]], dtype=np.int32)  # block 3 of 2
    m = libsdpa.BlockMap(block_q=128, block_kv=128, q_blocks=2, kv_blocks=2, full_count=counts,
                         full_index=index)
    q = np.random.rand(1, 200, 1, 16).astype(np.float32)
    with pytest.raises(libsdpa.InvalidArgumentError, match=r"full_index\[b=0, h=0, qb=1\]\[0\] is 3"):
        libsdpa.attention(q, q, q, block_mask=m)
    with pytest.raises(libsdpa.InvalidArgumentError, match="window"):
        libsdpa.attention(q, q, q, window=(-3, 0))
