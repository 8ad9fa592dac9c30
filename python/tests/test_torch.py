"""libsdpa against PyTorch's own SDPA, the outside oracle: f32, f16, bf16;
odd S; D 64, 72, 128; GQA with enable_gqa; cross; causal top-left (torch's
is_causal) and bottom-right (an explicit tril mask); custom scale; peaked
logits; LSE against aten::_scaled_dot_product_flash_attention_for_cpu;
every present CPU backend; views of torch tensors without copies; the
custom op under torch.compile(fullgraph=True)."""
import os

import pytest

torch = pytest.importorskip("torch")

import libsdpa  # noqa: E402
import libsdpa.torch_ops  # noqa: E402,F401
from libsdpa import _arrays  # noqa: E402

torch.manual_seed(int.from_bytes(__import__("os").urandom(4), "little"))
CPU_BACKENDS = [b["name"] for b in libsdpa.info()["backends"]
                if b["device"] == "cpu" and b["present"]]
DT = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}


def takes(backend, dtype):
    if backend is None:
        return True
    return DT[dtype] in next(b for b in libsdpa.info()["backends"] if b["name"] == backend)["dtypes"]


def torch_sdpa(q, k, v, causal=None, scale=None, gqa=False):
    """torch's SDPA of BSHD tensors, in float64 (BHSD inside)."""
    q, k, v = (x.double().transpose(1, 2) for x in (q, k, v))
    mask = None
    if causal == "bottom-right":
        Sq, Skv = q.shape[2], k.shape[2]
        mask = torch.ones(Sq, Skv, dtype=torch.bool).tril(diagonal=Skv - Sq)
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=causal == "top-left", scale=scale, enable_gqa=gqa)
    return out.transpose(1, 2)


def bound(dtype, backend):
    base = {torch.float32: 2e-5, torch.float16: 1.5e-3, torch.bfloat16: 1.6e-2}[dtype]
    return base + (2 * 2 ** -8 if backend in ("cpu.avx512bf16", "cpu.amx") else 0)


CASES = [(1, 37, 37, 2, 2, 64, None), (2, 65, 77, 8, 2, 128, None),
         (1, 33, 90, 4, 2, 72, "top-left"), (1, 90, 33, 2, 1, 64, "bottom-right"),
         (1, 129, 257, 2, 2, 128, "bottom-right")]


@pytest.mark.parametrize("backend", CPU_BACKENDS + [None])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16],
                         ids=["f32", "f16", "bf16"])
def test_against_torch_sdpa(backend, dtype):
    if not takes(backend, dtype):
        pytest.skip(f"{backend} does not take {dtype}")
    for B, Sq, Skv, Hq, Hkv, D, causal in CASES:
        for peaked in (False, True):
            q = torch.rand(B, Sq, Hq, D) * 2 - 1
            q = (q * 8 if peaked else q).to(dtype)
            k, v = (torch.rand(B, Skv, Hkv, D).mul(2).sub(1).to(dtype) for _ in range(2))
            scale = 1.0 if peaked else (0.3 if causal == "top-left" else None)
            out = libsdpa.attention(q, k, v, is_causal=causal or False, scale=scale,
                                    enable_gqa=Hq != Hkv, backend=backend)
            assert out.dtype == dtype and out.shape == q.shape  # torch's behaviour
            ref_in = (q, k, v)
            if backend in ("cpu.avx512bf16", "cpu.amx") and dtype == torch.float16:
                ref_in = tuple(x.to(torch.bfloat16) for x in ref_in)  # what they compute from
            want = torch_sdpa(*ref_in, causal, scale, Hq != Hkv)
            err = (out.double() - want).abs().max().item()
            assert err <= bound(dtype, backend) * (8 if peaked else 1), \
                (backend, dtype, B, Sq, Skv, D, causal, peaked, err)


def test_lse_against_torch_flash_for_cpu():
    B, S, H, D = 2, 65, 4, 64
    q, k, v = (torch.randn(B, S, H, D) for _ in range(3))
    out, lse = libsdpa.attention(q, k, v, return_lse=True, backend="cpu.portable")
    res = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    ref_out, ref_lse = res[0].transpose(1, 2), res[1]
    assert lse.shape == (B, H, S) and lse.dtype == torch.float32
    assert (lse - ref_lse).abs().max().item() <= 1e-4
    assert (out - ref_out).abs().max().item() <= 2e-5


def test_views_are_not_copied():
    B, S, H, D = 2, 48, 4, 64
    qkv = torch.randn(B, S, 3, H, D)
    q, k, v = qkv.unbind(2)  # slices of packed QKV
    for x in (q, k, v):
        assert _arrays.view(x, "x", "bshd").data == x.data_ptr()
    out = libsdpa.attention(q, k, v)
    assert (out - torch_sdpa(q, k, v)).abs().max().item() <= 2e-5
    qb = q.transpose(1, 2)  # [B, H, S, D] view of BSHD memory
    assert not qb.is_contiguous()
    assert _arrays.view(qb, "q", "bhsd").data == qb.data_ptr()
    ob = libsdpa.attention(qb, k.transpose(1, 2), v.transpose(1, 2), layout="bhsd")
    assert ob.shape == (B, H, S, D)
    assert (ob.transpose(1, 2) - out).abs().max().item() == 0
    o = torch.empty(B, S, H, D)
    assert libsdpa.attention(q, k, v, out=o) is o and (o - out).abs().max().item() == 0


def test_grad_goes_through_autograd_and_dtype_errors():
    q = torch.randn(1, 8, 2, 16, requires_grad=True)
    assert libsdpa.attention(q, q, q).grad_fn is not None
    with torch.no_grad():
        assert libsdpa.attention(q, q, q).grad_fn is None
        libsdpa.attention(q, q, q)  # now a prepared call of this signature exists
    assert libsdpa.attention(q, q, q).grad_fn is not None  # autograd still sees it
    with pytest.raises(libsdpa.InvalidArgumentError, match="torch.float64"):
        libsdpa.attention(q.detach().double(), q.detach(), q.detach())


@pytest.mark.parametrize("path", ["C", "Python"])
def test_prepared_calls_repeat_correctly(path, monkeypatch):
    """Repeated calls of one signature (libsdpa._Plan) read each call's
    tensors and return a fresh output each time, for attention and a Layer,
    with and without the LSE; other dtypes of k are refused, not misread.
    Both hit paths: C (_fastcall, in every wheel) and Python (a source tree)."""
    if path == "C":
        if libsdpa._fastcall is None:
            assert os.environ.get("SDPA_LIBRARY"), "the installed package lacks _fastcall"
            pytest.skip("a source tree without the built _fastcall module")
    else:
        monkeypatch.setattr(libsdpa, "_fastcall", None)
        monkeypatch.setattr(libsdpa, "_fast_tensor_type", None)
    layer = libsdpa.Layer("prepared.torch")
    for dtype in (torch.float32, torch.bfloat16):
        tol = 2e-5 if dtype == torch.float32 else 2e-2
        outs = []
        for _ in range(3):
            q, k, v = (torch.randn(2, 4, 33, 64).to(dtype) for _ in range(3))
            want = torch_sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
            for call in (libsdpa.attention, layer):
                out = call(q, k, v, layout="bhsd")
                assert out.dtype == dtype and out.shape == q.shape
                assert (out.float() - want.transpose(1, 2).float()).abs().max().item() <= tol
                o2, lse = call(q, k, v, layout="bhsd", return_lse=True)
                assert lse.shape == (2, 4, 33) and (o2.float() - out.float()).abs().max() == 0
                outs.append(out)
        assert len({o.data_ptr() for o in outs}) == len(outs)  # never one buffer handed out twice
    q = torch.randn(1, 5, 2, 16)
    libsdpa.attention(q, q, q)
    with pytest.raises(libsdpa.InvalidArgumentError, match="dtype"):
        libsdpa.attention(q, q.to(torch.bfloat16), q)
    # a scoped override reaches a prepared call (C never caches one), and a failing status
    # from C comes back as the exception with the library's message
    with libsdpa.backend("ref"):
        libsdpa.attention(q, q, q)
        assert libsdpa.last_backend() == "ref"
    with libsdpa.backend("cuda.unfused"):
        with pytest.raises(libsdpa.Error, match="cuda.unfused"):
            libsdpa.attention(q, q, q)
    threads = torch.get_num_threads()  # the context follows torch's thread count, either path
    torch.set_num_threads(1)
    try:
        libsdpa.attention(q, q, q)
        libsdpa.attention(q, q, q)
        assert libsdpa.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
    libsdpa.attention(q, q, q)
    assert libsdpa.get_num_threads() == max(1, threads)
    q.requires_grad_(True)  # after plans exist: autograd sees it, on either path
    assert libsdpa.attention(q, q, q).grad_fn is not None


def test_dlpack_producer():
    q = torch.randn(1, 20, 2, 32)

    class Legacy:  # only the legacy protocol: __dlpack__() without max_version
        def __init__(self, t):
            self.t = t

        def __dlpack__(self, stream=None):
            return self.t.__dlpack__()

    class Versioned(Legacy):  # passes max_version on: torch exports DLPack 1.x
        def __dlpack__(self, **kw):
            return self.t.__dlpack__(**kw)

    for producer in (Legacy, Versioned):
        out = libsdpa.attention(producer(q), producer(q), producer(q))
        assert (torch.from_numpy(out) - torch_sdpa(q, q, q)).abs().max().item() <= 2e-5
        view = _arrays.view(producer(q[:, 3:].transpose(1, 2)), "q", "bhsd")
        assert view.data == q[:, 3:].data_ptr()  # the slice itself, offset included
        assert view.strides == tuple(q.stride())


def test_custom_op_and_compile():
    q, k, v = (torch.randn(1, 64, 4, 64) for _ in range(3))
    out = torch.ops.libsdpa.attention(q, k, v, 1, 0.0, "")
    assert (out - torch_sdpa(q, k, v, "top-left")).abs().max().item() <= 2e-5
    o2, lse = torch.ops.libsdpa.attention_lse(q, k, v, 0, 0.0, "cpu.portable")
    assert lse.shape == (1, 4, 64)

    class Block(torch.nn.Module):
        def forward(self, q, k, v):
            return torch.ops.libsdpa.attention(q, k, v, 0, 0.0, "") * 2 + 1

    compiled = torch.compile(Block(), fullgraph=True)  # a graph break would raise
    got = compiled(q, k, v)
    assert (got - (torch.ops.libsdpa.attention(q, k, v) * 2 + 1)).abs().max().item() == 0


def test_torch_threads():
    """With torch imported and its runtime OpenMP (its Linux wheels), calls
    run on torch's OpenMP team (sdpa_openmp_host): the same bits as on
    libsdpa's own workers; use_torch_threads(False) goes back to those."""
    if "OpenMP" not in torch.__config__.parallel_info().split("ATen parallel backend:")[-1]:
        pytest.skip("torch's parallel backend here is not OpenMP")
    q, k, v = torch.randn(1, 300, 4, 64), torch.randn(1, 700, 2, 64), torch.randn(1, 700, 2, 64)
    try:
        libsdpa.use_torch_threads(True)
        on_team = libsdpa.attention(q, k, v, enable_gqa=True)
        if torch.get_num_threads() > 0:
            assert libsdpa.thread_pool() == "openmp"
        libsdpa.use_torch_threads(False)
        own = libsdpa.attention(q, k, v, enable_gqa=True)
        assert libsdpa.thread_pool() == "libsdpa"
        assert torch.equal(on_team, own)
        with pytest.raises(libsdpa.InvalidArgumentError, match="expected True or False"):
            libsdpa.use_torch_threads(1)
    finally:
        libsdpa.use_torch_threads(os.environ.get("SDPA_TORCH_THREADS", "1") != "0")
