"""libsdpa on CUDA tensors: every present cuda.* backend and the dispatcher's
choice against PyTorch's SDPA in float64 on the CPU, bf16 and f16, GQA,
cross, both causal alignments, the LSE, and the output staying on the
device. Skipped, saying why, where torch has no CUDA device (every machine
but a GPU one: scripts/gpu-check.sh runs the suite there)."""
import pytest

torch = pytest.importorskip("torch")

import libsdpa  # noqa: E402

if not torch.cuda.is_available():
    pytest.skip("no CUDA device for torch here", allow_module_level=True)

CUDA_BACKENDS = [b["name"] for b in libsdpa.info()["backends"]
                 if b["device"] == "cuda" and b["present"]]
if not CUDA_BACKENDS:
    pytest.skip("torch sees a CUDA device but libsdpa's plugin presents no cuda.* backend: "
                + next((b.get("why_absent", "") for b in libsdpa.info()["backends"]
                        if b["device"] == "cuda"), ""), allow_module_level=True)

CASES = [(1, 128, 128, 4, 4, 64, None), (2, 77, 300, 8, 2, 128, None),
         (1, 256, 256, 4, 4, 128, "top-left"), (1, 100, 300, 4, 1, 64, "bottom-right")]


def reference(q, k, v, causal):
    q, k, v = (x.double().cpu().transpose(1, 2) for x in (q, k, v))
    mask = None
    if causal == "bottom-right":
        Sq, Skv = q.shape[2], k.shape[2]
        mask = torch.ones(Sq, Skv, dtype=torch.bool).tril(diagonal=Skv - Sq)
    scores = (q @ k.repeat_interleave(q.shape[1] // k.shape[1], 1).transpose(-1, -2)) \
        / q.shape[-1] ** 0.5
    if causal == "top-left":
        scores = scores.masked_fill(~torch.ones_like(scores, dtype=torch.bool).tril(), -float("inf"))
    elif mask is not None:
        scores = scores.masked_fill(~mask, -float("inf"))
    lse = torch.logsumexp(scores, -1)
    out = torch.softmax(scores, -1) @ v.repeat_interleave(q.shape[1] // v.shape[1], 1)
    return out.transpose(1, 2), lse


@pytest.mark.parametrize("backend", CUDA_BACKENDS + [None])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
def test_against_float64(backend, dtype):
    for B, Sq, Skv, Hq, Hkv, D, causal in CASES:
        q = torch.randn(B, Sq, Hq, D, device="cuda").to(dtype)
        k, v = (torch.randn(B, Skv, Hkv, D, device="cuda").to(dtype) for _ in range(2))
        try:
            out, lse = libsdpa.attention(q, k, v, is_causal=causal or False,
                                         enable_gqa=Hq != Hkv, backend=backend, return_lse=True)
        except libsdpa.UnsupportedError as e:  # a backend may refuse a case it does not claim
            pytest.skip(f"{backend} refused {B, Sq, Skv, Hq, Hkv, D, causal}: {e}")
        torch.cuda.synchronize()
        assert out.device.type == "cuda" and out.dtype == dtype and out.shape == q.shape
        want, want_lse = reference(q, k, v, causal)
        err = (out.double().cpu() - want).abs().max().item()
        assert err <= (1.6e-2 if dtype == torch.bfloat16 else 2e-3), \
            (backend, libsdpa.last_backend(), B, Sq, Skv, Hq, Hkv, D, causal, err)
        finite = torch.isfinite(want_lse)
        lse_err = (lse.double().cpu()[finite] - want_lse[finite]).abs().max().item()
        assert lse_err <= 1e-2, (backend, causal, lse_err)


def test_dispatcher_runs_a_cuda_backend():
    q = torch.randn(1, 256, 8, 128, device="cuda", dtype=torch.bfloat16)
    out = libsdpa.attention(q, q, q)
    torch.cuda.synchronize()
    assert out.device.type == "cuda"
    assert libsdpa.last_backend() in CUDA_BACKENDS
