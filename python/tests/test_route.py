"""libsdpa.route_torch_sdpa(): torch.nn.functional.scaled_dot_product_attention
calls go to libsdpa with torch's exact semantics, or back to torch,
counted with their reason: layout [B, H, S, D] and [B, S, D], boolean and
additive masks broadcast as torch broadcasts them, is_causal top-left with
Sq != Skv, scale, enable_gqa, autograd; dropout, float64, mask with
is_causal, GQA without enable_gqa handed back (torch's own result or
error); enable()/disable(); an SDXL UNet and an SD3 transformer built
small from their configs run through the routing and match native."""
import warnings

import pytest

torch = pytest.importorskip("torch")

import libsdpa  # noqa: E402
from libsdpa import torch_route  # noqa: E402

F = torch.nn.functional
torch.manual_seed(int.from_bytes(__import__("os").urandom(4), "little"))


@pytest.fixture(autouse=True)
def fresh_counts():
    torch_route.reset_stats()
    yield
    torch_route.disable()


def routed(*args, **kw):
    with libsdpa.route_torch_sdpa():
        return F.scaled_dot_product_attention(*args, **kw)


def f64(*args, **kw):
    """torch's SDPA in float64 on the same tensors (float masks too): the
    reference, so that the bound does not also carry torch's f32 rounding
    (against torch's f32 output a 2e-6 bound failed by chance, 2.5e-6)."""
    def up(x):
        return x.double() if torch.is_tensor(x) and x.is_floating_point() else x
    return F.scaled_dot_product_attention(*[up(a) for a in args],
                                          **{key: up(x) for key, x in kw.items()})


def close(got, want64):
    """f32 attention over D = 64 and 50 keys: within 1e-5 of the float64
    result's magnitude (f32's 2^-23 over about 100 terms), far below what a
    wrong mask, scale or broadcast gives (1e-2 and more)."""
    return (got.double() - want64).abs().max().item() <= 1e-5 * max(1.0, want64.abs().max().item())


def test_taken_with_torchs_semantics():
    B, H, Sq, Skv, D = 2, 4, 33, 50, 64
    q, k, v = torch.randn(B, H, Sq, D), torch.randn(B, H, Skv, D), torch.randn(B, H, Skv, D)
    masks = [torch.rand(Sq, Skv) > 0.3, torch.rand(B, 1, Sq, Skv) > 0.3,
             torch.rand(B, H, Sq, Skv) > 0.3, torch.rand(1, 1, 1, Skv) > 0.3,
             torch.randn(Sq, Skv), torch.randn(B, H, Sq, Skv), torch.randn(B, 1, 1, Skv)]
    cases = [dict(), dict(is_causal=True), dict(scale=0.17)] + [dict(attn_mask=m) for m in masks]
    for kw in cases:
        want = F.scaled_dot_product_attention(q, k, v, **kw)
        got = routed(q, k, v, **kw)
        assert got.shape == want.shape and got.dtype == want.dtype
        assert close(got, f64(q, k, v, **kw)), kw
    kv = torch.randn(B, 2, Skv, D)  # grouped-query with enable_gqa
    assert close(routed(q, kv, kv, enable_gqa=True), f64(q, kv, kv, enable_gqa=True))
    q3, k3 = torch.randn(B, Sq, D), torch.randn(B, Skv, D)  # [B, S, D]
    m3 = torch.rand(B, Sq, Skv) > 0.2
    assert close(routed(q3, k3, k3, attn_mask=m3), f64(q3, k3, k3, attn_mask=m3))
    bf = [x.to(torch.bfloat16) for x in (q, k, v)]
    want = F.scaled_dot_product_attention(*[x.double() for x in bf], is_causal=True)
    got = routed(*bf, is_causal=True)
    assert got.dtype == torch.bfloat16
    assert (got.double() - want).abs().max().item() <= 2e-2
    s = torch_route.stats()
    assert s["taken"] == len(cases) + 3 and s["handed_back"] == 0, s


def test_handed_back_counted_once_reported():
    q = torch.randn(1, 2, 16, 32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.manual_seed(0)
        got = routed(q, q, q, dropout_p=0.5)
        torch.manual_seed(0)
        assert torch.equal(got, F.scaled_dot_product_attention(q, q, q, dropout_p=0.5))
        routed(q, q, q, dropout_p=0.5)
        d = q.double()
        assert torch.equal(routed(d, d, d), F.scaled_dot_product_attention(d, d, d))
        kv = torch.randn(1, 1, 16, 32)  # torch broadcasts the one KV head: torch's result
        assert torch.equal(routed(q, kv, kv), F.scaled_dot_product_attention(q, kv, kv))
        with pytest.raises(RuntimeError):  # torch's own error, not libsdpa's
            routed(q, q, q, attn_mask=torch.ones(16, 16, dtype=torch.bool), is_causal=True)
    s = torch_route.stats()
    assert s["taken"] == 0 and s["handed_back"] == 5, s
    assert s["reasons"]["dropout_p > 0 (libsdpa has no dropout)"] == 2
    mine = [w for w in caught if issubclass(w.category, torch_route.RoutingWarning)]
    assert len(mine) == 4, [str(w.message) for w in mine]  # one per reason
    assert "handed back to torch: 5" in torch_route.explain()


def test_autograd_through_the_routing():
    q, k, v = (torch.randn(2, 3, 40, 32, requires_grad=True) for _ in range(3))
    dout = torch.randn(2, 3, 40, 32)
    routed(q, k, v, is_causal=True).backward(dout)
    got = [x.grad.clone() for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(dout)
    for g, x in zip(got, (q, k, v)):
        assert (g - x.grad).abs().max().item() <= 1e-5 * x.grad.abs().max().item()
    bias = torch.randn(40, 40, requires_grad=True)  # a learned mask: torch's
    routed(q, k, v, attn_mask=bias).sum().backward()
    assert bias.grad is not None
    assert torch_route.stats()["handed_back"] == 1


def test_enable_disable_reaches_F_callers():
    q = torch.randn(1, 2, 8, 16)
    torch_route.enable()
    assert torch_route.enabled()
    F.scaled_dot_product_attention(q, q, q)
    torch_route.disable()
    F.scaled_dot_product_attention(q, q, q)
    assert torch_route.stats()["taken"] == 1


diffusers = pytest.importorskip("diffusers")


def _compare(model, inputs, tol):
    with torch.no_grad():
        native = model(**inputs).sample
        with libsdpa.route_torch_sdpa():
            ours = model(**inputs).sample
    s = torch_route.stats()
    assert s["taken"] > 0 and s["handed_back"] == 0, s
    scale = native.abs().max().item()
    assert (ours - native).abs().max().item() <= tol * max(1.0, scale)
    return s["taken"]


def test_sdxl_unet_from_config_matches_native():
    model = diffusers.UNet2DConditionModel(
        sample_size=16, in_channels=4, out_channels=4, layers_per_block=1,
        block_out_channels=(32, 64), down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), cross_attention_dim=32,
        attention_head_dim=(2, 4), transformer_layers_per_block=(1, 1), norm_num_groups=8,
        use_linear_projection=True, addition_embed_type="text_time",
        addition_time_embed_dim=8, projection_class_embeddings_input_dim=48).eval()
    inputs = dict(sample=torch.randn(2, 4, 16, 16), timestep=torch.tensor([10, 500]),
                  encoder_hidden_states=torch.randn(2, 77, 32),
                  added_cond_kwargs=dict(text_embeds=torch.randn(2, 32),
                                         time_ids=torch.randn(2, 2)))
    assert _compare(model, inputs, 1e-5) >= 6  # self and cross attention of 3 blocks


def test_sd3_transformer_from_config_matches_native():
    model = diffusers.SD3Transformer2DModel(
        sample_size=16, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=32, caption_projection_dim=32,
        pooled_projection_dim=32, out_channels=4).eval()
    inputs = dict(hidden_states=torch.randn(2, 4, 16, 16),
                  encoder_hidden_states=torch.randn(2, 12, 32),
                  pooled_projections=torch.randn(2, 32), timestep=torch.tensor([1, 900]))
    assert _compare(model, inputs, 1e-5) >= 2


# ---- FlexAttention: flex_attention calls with a BlockMask and no score_mod

flex = pytest.importorskip("torch.nn.attention.flex_attention")


def _sliding(b, h, q, kv):
    return (q - kv).abs() <= 70


def _causal(b, h, q, kv):
    return q >= kv


@pytest.mark.parametrize("mask_mod,H,Hkv", [(_sliding, 2, 2), (_causal, 4, 2), (None, 2, 1)])
def test_flex_attention_taken_with_torchs_result(mask_mod, H, Hkv):
    S, D = 300, 32
    q, k, v = torch.randn(2, H, S, D), torch.randn(2, Hkv, S, D), torch.randn(2, Hkv, S, D)
    bm = None if mask_mod is None else flex.create_block_mask(mask_mod, None, None, S, S,
                                                              device="cpu", BLOCK_SIZE=128)
    gqa = H != Hkv
    want, want_lse = flex.flex_attention(q, k, v, block_mask=bm, enable_gqa=gqa, return_lse=True)
    with libsdpa.route_torch_sdpa():
        # called as diffusers' "flex" backend calls it: through the module,
        # with torch's kernel tiles in kernel_options
        got = flex.flex_attention(q, k, v, block_mask=bm, enable_gqa=gqa,
                                  kernel_options={"BLOCK_M": 64})
        got2, lse = flex.flex_attention(q, k, v, block_mask=bm, enable_gqa=gqa, return_lse=True)
    assert flex.flex_attention is torch_route._FLEX_ORIGINAL  # the wrapper left with the context
    s = torch_route.stats()
    assert s["taken"] == 2 and s["handed_back"] == 0, s
    assert (got - want).abs().max().item() <= 2e-5 * max(1.0, want.abs().max().item())
    assert torch.equal(got, got2)
    assert (lse - want_lse).abs().max().item() <= 2e-5 * max(1.0, want_lse.abs().max().item())


def test_flex_attention_handed_back_and_threads():
    S = 256
    q = torch.randn(1, 2, S, 32)
    bm = flex.create_block_mask(_causal, None, None, S, S, device="cpu")

    def bias(score, b, h, i, j):
        return score + (i - j) * 0.01

    want = flex.flex_attention(q, q, q, score_mod=bias)
    with libsdpa.route_torch_sdpa():
        got = flex.flex_attention(q, q, q, score_mod=bias)  # torch's own, counted
    assert torch.equal(got, want)
    s = torch_route.stats()
    assert s["taken"] == 0 and s["handed_back"] == 1 and "score_mod" in next(iter(s["reasons"]))
    # another thread outside any context keeps torch's function even while
    # this thread's context is open
    import threading
    seen = {}
    with libsdpa.route_torch_sdpa():
        t = threading.Thread(target=lambda: seen.update(out=flex.flex_attention(q, q, q,
                                                                                block_mask=bm)))
        t.start()
        t.join()
    assert torch_route.stats()["taken"] == 0
    torch_route.enable()  # every thread
    try:
        flex.flex_attention(q, q, q, block_mask=bm)
    finally:
        torch_route.disable()
    assert torch_route.stats()["taken"] == 1
    assert flex.flex_attention is torch_route._FLEX_ORIGINAL


def test_diffusers_flex_backend_reaches_libsdpa():
    """diffusers' own "flex" attention backend, with a BlockMask as the
    attention mask, computes through libsdpa under the routing."""
    from diffusers.models.attention_dispatch import dispatch_attention_fn
    B, S, H, D = 1, 256, 2, 32
    q, k, v = (torch.randn(B, S, H, D) for _ in range(3))  # diffusers' [B, S, H, D]
    bm = flex.create_block_mask(_sliding, None, None, S, S, device="cpu", BLOCK_SIZE=128)
    want = dispatch_attention_fn(q, k, v, attn_mask=bm, backend="flex")
    with libsdpa.route_torch_sdpa():
        got = dispatch_attention_fn(q, k, v, attn_mask=bm, backend="flex")
    s = torch_route.stats()
    assert s["taken"] == 1 and s["handed_back"] == 0, s
    assert (got - want).abs().max().item() <= 2e-5 * max(1.0, want.abs().max().item())
