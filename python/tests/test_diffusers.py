"""libsdpa as diffusers' "libsdpa" attention backend: a small Flux
transformer (random weights from a config, no download) gives the same
output with diffusers' native backend and with libsdpa, and the same loss
and parameter gradients in a training step (also with gradient
checkpointing); masks reach libsdpa and are honoured (against native on
the same mask); what libsdpa cannot honour raises; an untested diffusers
version is refused."""
import pytest

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")

import libsdpa  # noqa: E402
import libsdpa.diffusers  # noqa: E402
from diffusers.models import attention_dispatch as ad  # noqa: E402

torch.manual_seed(int.from_bytes(__import__("os").urandom(4), "little"))


@pytest.fixture(scope="module", autouse=True)
def enabled():
    if tuple(int(x) for x in diffusers.__version__.split(".")[:2]) not in \
            libsdpa.diffusers.TESTED_DIFFUSERS:
        pytest.skip(f"diffusers {diffusers.__version__} is not a tested version")
    return libsdpa.diffusers.enable()


def flux_inputs(B=1, side=8, T=8):
    S = side * side
    ids = torch.zeros(S, 3)
    ids[:, 1], ids[:, 2] = torch.arange(S) // side, torch.arange(S) % side
    return dict(hidden_states=torch.randn(B, S, 16), encoder_hidden_states=torch.randn(B, T, 32),
                pooled_projections=torch.randn(B, 32), timestep=torch.tensor([0.5] * B),
                img_ids=ids, txt_ids=torch.zeros(T, 3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_flux_transformer_native_vs_libsdpa(dtype):
    model = diffusers.FluxTransformer2DModel(
        patch_size=1, in_channels=16, num_layers=2, num_single_layers=2, attention_head_dim=32,
        num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32,
        axes_dims_rope=(8, 12, 12)).eval().to(dtype)
    inputs = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in flux_inputs().items()}
    with torch.no_grad():
        model.set_attention_backend("native")
        native = model(**inputs).sample
        model.set_attention_backend("libsdpa")
        ours = model(**inputs).sample
        assert libsdpa.last_backend() is not None
        model.set_attention_backend("native")
    scale = native.float().abs().max().item()
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    assert (ours.float() - native.float()).abs().max().item() <= tol * max(1.0, scale)


def small_flux():
    return diffusers.FluxTransformer2DModel(
        patch_size=1, in_channels=16, num_layers=2, num_single_layers=2, attention_head_dim=32,
        num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32,
        axes_dims_rope=(8, 12, 12))


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointing"])
def test_training_step_native_vs_libsdpa(checkpointing):
    """Loss and every parameter's gradient of one training step (MSE to a
    random target), native against libsdpa: the backward goes through
    libsdpa's sdpa_backward (counted), and matches to f32 rounding."""
    model = small_flux().train()
    if checkpointing:
        model.enable_gradient_checkpointing()
    inputs, target = flux_inputs(B=2), torch.randn(2, 64, 16)
    results = {}
    for backend in ("native", "libsdpa"):
        model.set_attention_backend(backend)
        model.zero_grad()
        loss = torch.nn.functional.mse_loss(model(**inputs).sample, target)
        loss.backward()
        results[backend] = (loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()
                                          if p.grad is not None})
    model.set_attention_backend("native")
    (l0, g0), (l1, g1) = results["native"], results["libsdpa"]
    assert abs(l1 - l0) <= 1e-5 * abs(l0)
    assert g0.keys() == g1.keys() and len(g0) > 20
    worst = max((g1[n] - g0[n]).abs().max().item() / max(g0[n].abs().max().item(), 1e-12)
                for n in g0 if g0[n].abs().max().item() > 0)
    assert worst <= 2e-5, worst  # seen: 0.7-1.7e-6


def test_masks_reach_libsdpa_and_are_honoured():
    B, Sq, Skv, H, D = 2, 40, 24, 2, 32
    q, k, v = torch.randn(B, Sq, H, D), torch.randn(B, Skv, H, D), torch.randn(B, Skv, H, D)
    keep = torch.rand(B, Skv) < 0.6
    keep[:, 0] = True
    for mask in (keep, keep[:, None, None, :], torch.randn(B, 1, Sq, Skv)):  # [B, Skv] key mask too
        with torch.no_grad():
            native = ad.dispatch_attention_fn(q, k, v, attn_mask=mask, backend="native")
            ours = ad.dispatch_attention_fn(q, k, v, attn_mask=mask, backend="libsdpa")
        assert (ours - native).abs().max().item() <= 2e-5
    # unmasked would differ: the mask was not dropped on the way
    with torch.no_grad():
        unmasked = ad.dispatch_attention_fn(q, k, v, backend="libsdpa")
    assert (unmasked - ours).abs().max().item() > 1e-3


def test_what_libsdpa_cannot_honour_raises():
    q = torch.randn(1, 16, 2, 32)
    with pytest.raises(libsdpa.InvalidArgumentError, match="dropout_p"):
        libsdpa.diffusers.attention(q, q, q, dropout_p=0.1)
    qg = q.clone().requires_grad_()  # gradients flow (the training test checks their values)
    libsdpa.diffusers.attention(qg, qg, qg).sum().backward()
    assert qg.grad is not None and qg.grad.abs().sum().item() > 0
    out, lse = libsdpa.diffusers.attention(q, q, q, return_lse=True)
    assert lse.shape == (1, 16, 2)  # diffusers' [B, S, H]


def test_untested_version_is_refused(monkeypatch):
    monkeypatch.setattr(diffusers, "__version__", "9.1.0")
    with pytest.raises(RuntimeError, match="not a tested version"):
        libsdpa.diffusers.enable()
