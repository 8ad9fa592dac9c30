"""libsdpa with numpy alone: every present CPU backend against a float64
reference written here (fresh random inputs, never zeros; peaked logits;
odd sizes; D 64, 72, 128; GQA; cross; both causal alignments; masks),
zero-copy views, errors, selection, threads."""
import gc
import os
import tempfile
import threading

import numpy as np
import pytest

import libsdpa
from libsdpa import _arrays

try:
    import ml_dtypes
    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # the package works without it; bf16 cases skip
    BF16 = None

RNG = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
CPU_BACKENDS = [b["name"] for b in libsdpa.info()["backends"]
                if b["device"] == "cpu" and b["present"]]


def reference(q, k, v, causal=None, scale=None, allowed=None):
    """float64 attention of BSHD arrays; allowed: bool [B, H, Sq, Skv] or None."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    B, Sq, Hq, D = q.shape
    Skv, Hkv = k.shape[1], k.shape[2]
    g = Hq // Hkv
    k = np.repeat(k, g, axis=2)
    v = np.repeat(v, g, axis=2)
    s = np.einsum("bihd,bjhd->bhij", q, k) * (1 / np.sqrt(D) if scale is None else scale)
    vis = np.ones((B, Hq, Sq, Skv), dtype=bool)
    i, j = np.arange(Sq)[:, None], np.arange(Skv)[None, :]
    if causal == "top-left":
        vis &= j <= i
    elif causal == "bottom-right":
        vis &= j <= i + (Skv - Sq)
    if allowed is not None:
        vis &= allowed
    s = np.where(vis, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    seen = np.isfinite(m)
    p = np.where(vis, np.exp(s - np.where(seen, m, 0)), 0)
    l = p.sum(axis=-1, keepdims=True)
    o = np.einsum("bhij,bjhd->bihd", p / np.where(l > 0, l, 1), v)
    lse = np.where(seen[..., 0], (m + np.log(np.where(l > 0, l, 1)))[..., 0], -np.inf)
    return o, lse


def rand(shape, dtype, peaked=False):
    x = RNG.uniform(-1, 1, size=shape).astype(np.float32)
    if peaked:
        x *= 8
    return x.astype(dtype)


def tolerance(dtype, backend):
    bf16_products = backend in ("cpu.avx512bf16", "cpu.amx")
    base = {np.dtype(np.float32): 2e-5, np.dtype(np.float16): 1e-3}.get(np.dtype(dtype), 8e-3)
    return base + (2 * 2 ** -8 if bf16_products else 0)


def takes(backend, dtype):
    names = {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16"}
    code = names.get(np.dtype(dtype), "bf16")
    info = next(b for b in libsdpa.info()["backends"] if b["name"] == backend)
    return code in info["dtypes"]


DTYPES = [np.float32, np.float16] + ([BF16] if BF16 is not None else [])
CASES = [  # B, Sq, Skv, Hq, Hkv, D, causal
    (1, 37, 37, 2, 2, 64, None),
    (2, 65, 77, 4, 1, 128, None),
    (1, 33, 90, 4, 2, 72, "top-left"),
    (1, 90, 33, 2, 2, 64, "bottom-right"),
    (1, 129, 129, 2, 2, 128, "bottom-right"),
]


@pytest.mark.parametrize("backend", CPU_BACKENDS + [None])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_against_float64(backend, dtype):
    if backend and not takes(backend, dtype):
        pytest.skip(f"{backend} does not take {np.dtype(dtype).name}")
    for B, Sq, Skv, Hq, Hkv, D, causal in CASES:
        for peaked in (False, True):
            q, k, v = rand((B, Sq, Hq, D), dtype, peaked), rand((B, Skv, Hkv, D), dtype), \
                rand((B, Skv, Hkv, D), dtype)
            scale = 1.0 if peaked else None
            out, lse = libsdpa.attention(q, k, v, is_causal=causal or False, scale=scale,
                                         return_lse=True, backend=backend)
            ref_in = (q, k, v)
            if backend in ("cpu.avx512bf16", "cpu.amx") and np.dtype(dtype) == np.float16:
                if BF16 is None:
                    pytest.skip("f16 into bf16 products: the reference needs ml_dtypes")
                ref_in = tuple(x.astype(BF16) for x in ref_in)  # what those kernels compute from
            want, want_lse = reference(*ref_in, causal, scale)
            assert out.dtype == np.float32 and out.shape == q.shape
            bound = tolerance(dtype, backend) * (8 if peaked else 1)
            assert np.max(np.abs(out - want)) <= bound, (backend, B, Sq, Skv, D, causal, peaked)
            fin = np.isfinite(want_lse)
            assert np.array_equal(np.isfinite(lse), fin)
            assert np.max(np.abs(lse[fin] - want_lse[fin]), initial=0) <= 1e-3 * (8 if peaked else 1)


def test_mixed_dtypes():
    """f32 queries over f16 keys and values: the output in f32, against
    float64 on the same values, on every backend that converts each input
    while packing; the others refuse with the reason."""
    mixed = [b["name"] for b in libsdpa.info()["backends"]
             if b["device"] == "cpu" and b["present"] and b.get("mixed_dtypes")
             and "f32" in b["dtypes"] and "f16" in b["dtypes"]]
    assert "ref" in mixed
    for backend in mixed + [None]:
        for B, Sq, Skv, Hq, Hkv, D, causal in CASES[:4]:
            q = rand((B, Sq, Hq, D), np.float32)
            k, v = rand((B, Skv, Hkv, D), np.float16), rand((B, Skv, Hkv, D), np.float16)
            out = libsdpa.attention(q, k, v, is_causal=causal or False, backend=backend)
            want, _ = reference(q, k, v, causal)
            assert out.dtype == np.float32
            assert np.max(np.abs(out - want)) <= 2e-5, (backend, B, Sq, Skv, D, causal)
    if "cpu.blas" in CPU_BACKENDS:
        with pytest.raises(libsdpa.UnsupportedError, match="mixed dtypes not supported"):
            libsdpa.attention(q, k, v, backend="cpu.blas")


def test_layouts_and_views_are_not_copied():
    B, S, H, D = 2, 50, 4, 64
    qkv = rand((B, S, 3, H, D), np.float32)  # packed QKV
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    for x in (q, k, v):
        assert _arrays.view(x, "x", "bshd").data == x.ctypes.data  # the slice itself
    out = libsdpa.attention(q, k, v)
    np.testing.assert_allclose(out, reference(q, k, v)[0], atol=2e-5)
    # a [B, H, S, D] transpose of BSHD memory, read as layout "bhsd"
    qt = np.ascontiguousarray(q).transpose(0, 2, 1, 3)
    assert _arrays.view(qt, "q", "bhsd").strides == (S * H * D, H * D, D, 1)
    out_t = libsdpa.attention(qt, qt, qt, layout="bhsd")
    assert out_t.shape == (B, H, S, D)
    np.testing.assert_allclose(out_t.transpose(0, 2, 1, 3), reference(q, q, q)[0], atol=2e-5)


def test_out_in_place_and_its_errors():
    q = rand((1, 20, 2, 32), np.float32)
    out = np.full((1, 20, 2, 32), 7.0, dtype=np.float32)
    got = libsdpa.attention(q, q, q, out=out)
    assert got is out
    np.testing.assert_allclose(out, reference(q, q, q)[0], atol=2e-5)
    with pytest.raises(libsdpa.InvalidArgumentError, match="out has shape"):
        libsdpa.attention(q, q, q, out=np.empty((1, 20, 2, 31), np.float32))
    ro = np.empty_like(out)
    ro.flags.writeable = False
    with pytest.raises(libsdpa.InvalidArgumentError, match="read-only"):
        libsdpa.attention(q, q, q, out=ro)


def test_masks():
    B, Sq, Skv, H, D = 3, 40, 70, 2, 32
    q, k, v = rand((B, Sq, H, D), np.float32), rand((B, Skv, H, D), np.float32), \
        rand((B, Skv, H, D), np.float32)
    lens = np.array([70, 0, 33], dtype=np.int32)
    allowed = np.arange(Skv)[None, None, None, :] < lens[:, None, None, None]
    for backend in CPU_BACKENDS:
        if not takes(backend, np.float32):
            continue
        out = libsdpa.attention(q, k, v, seq_len_kv=lens, backend=backend)
        want, _ = reference(q, k, v, allowed=np.broadcast_to(allowed, (B, H, Sq, Skv)))
        np.testing.assert_allclose(out, want, atol=2e-5, err_msg=backend)
        assert np.all(out[1] == 0)  # a batch entry that sees no key: zeros
    keep = RNG.random((B, Skv)) < 0.7
    out = libsdpa.attention(q, k, v, key_mask=keep)
    np.testing.assert_allclose(
        out, reference(q, k, v, allowed=np.broadcast_to(keep[:, None, None], (B, H, Sq, Skv)))[0],
        atol=2e-5)
    # torch's attn_mask: boolean [B, 1, 1, Skv] (passed as a key mask) and additive broadcast
    out2 = libsdpa.attention(q, k, v, attn_mask=keep[:, None, None, :])
    np.testing.assert_array_equal(out, out2)
    bias = RNG.uniform(-2, 2, size=(1, H, Sq, Skv)).astype(np.float32)
    bias[0, 0, 3] = -np.inf  # a row that sees nothing
    q64, k64 = (np.asarray(x, np.float64) for x in (q, k))
    s = np.einsum("bihd,bjhd->bhij", q64, k64) / np.sqrt(D) + bias
    p = np.exp(s - s.max(-1, keepdims=True, where=np.isfinite(s), initial=-1e300))
    p = np.where(np.isfinite(s), p, 0)
    l = p.sum(-1, keepdims=True)
    want = np.einsum("bhij,bjhd->bihd", p / np.where(l > 0, l, 1), np.asarray(v, np.float64))
    out = libsdpa.attention(q, k, v, attn_mask=bias)
    np.testing.assert_allclose(out, want, atol=2e-5)
    assert np.all(out[:, 3, 0] == 0)
    ex = libsdpa.explain(q, k, v, attn_mask=bias)
    assert ex["call"]["mask"] == "general", ex["call"]
    with pytest.raises(libsdpa.InvalidArgumentError, match="seq_len_kv has shape"):
        libsdpa.attention(q, k, v, seq_len_kv=[1, 2])
    with pytest.raises(libsdpa.InvalidArgumentError, match="mask->seq_len_kv"):
        libsdpa.attention(q, k, v, seq_len_kv=[1, 2, 71])
    with pytest.raises(libsdpa.InvalidArgumentError, match="attn_mask has shape"):
        libsdpa.attention(q, k, v, attn_mask=np.ones((5, Skv), bool))


def test_errors_carry_the_library_message():
    q = rand((1, 8, 2, 16), np.float32)
    with pytest.raises(libsdpa.InvalidArgumentError, match="4"):
        libsdpa.attention(q[0], q, q)
    with pytest.raises(ValueError, match="float64"):
        libsdpa.attention(q.astype(np.float64), q, q)
    with pytest.raises(libsdpa.InvalidArgumentError, match="cpu.nonesuch.*unknown; known: ref"):
        libsdpa.attention(q, q, q, backend="cpu.nonesuch")
    if "cpu.blas" in CPU_BACKENDS and BF16 is not None:
        qb = q.astype(BF16)
        with pytest.raises(libsdpa.UnsupportedError, match="cpu.blas"):
            libsdpa.attention(qb, qb, qb, backend="cpu.blas")
    with pytest.raises(libsdpa.InvalidArgumentError, match="enable_gqa"):
        libsdpa.attention(rand((1, 8, 4, 16), np.float32), q, q, enable_gqa=False)
    with pytest.raises(libsdpa.InvalidArgumentError, match="is_causal"):
        libsdpa.attention(q, q, q, is_causal="diagonal")
    with pytest.raises(libsdpa.InvalidArgumentError, match="layout"):
        libsdpa.attention(q, q, q, layout="sbhd")
    assert issubclass(libsdpa.OutOfMemoryError, MemoryError)


def test_selection_explain_info_policy():
    q = rand((1, 64, 2, 64), np.float32)
    ex = libsdpa.explain(q, q, q)
    assert ex["candidates"] and ex["candidates"][0] in CPU_BACKENDS
    with libsdpa.backend("cpu.portable"):
        with libsdpa.backend("ref"):  # nests
            libsdpa.attention(q, q, q)
            assert libsdpa.last_backend() == "ref"
        libsdpa.attention(q, q, q)
        assert libsdpa.last_backend() == "cpu.portable"
        seen = []
        t = threading.Thread(target=lambda: (libsdpa.attention(q, q, q),
                                             seen.append(libsdpa.last_backend())))
        t.start(), t.join()
        assert seen == [ex["candidates"][0]]  # the override is this thread's only
    info = libsdpa.info()
    assert info["version"] == libsdpa.__version__ and info["backends"]
    libsdpa.set_component_backend("text_encoder", "ref")
    try:
        libsdpa.attention(q, q, q, component="text_encoder")
        assert libsdpa.last_backend() == "ref"
    finally:
        libsdpa.set_component_backend("text_encoder", None)
    with tempfile.NamedTemporaryFile("w", suffix=".rules", delete=False) as f:
        f.write("rule py-test\ndevice cpu\nD 64\ntry cpu.portable\nevidence test\n")
    try:
        libsdpa.load_policy(f.name)
        assert libsdpa.explain(q, q, q)["rule"]["name"] == "py-test"
    finally:
        os.unlink(f.name)
        libsdpa.set_num_threads(libsdpa.get_num_threads() + 1)  # a fresh context: rules gone
        libsdpa.set_num_threads(None)


def test_layer_threads_and_buffer_lifetime():
    layer = libsdpa.Layer("blocks.0.attn", component="transformer")
    q = rand((2, 96, 4, 64), np.float32)
    want = reference(q, q, q)[0]
    errors = []

    def work():
        try:
            for _ in range(5):
                np.testing.assert_allclose(layer(q, q, q), want, atol=2e-5)
        except Exception as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(8)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert not errors, errors
    # the caller drops every reference while another thread's call runs
    box = {}
    big = [rand((1, 512, 4, 64), np.float32) for _ in range(3)]
    want_big = reference(*big)[0]
    t = threading.Thread(target=lambda: box.setdefault("out", libsdpa.attention(*box.pop("in"))))
    box["in"] = big
    del big
    t.start()
    gc.collect()
    t.join()
    np.testing.assert_allclose(box["out"], want_big, atol=2e-5)


def test_submodules_are_attributes_loaded_on_first_use():
    import subprocess
    import sys
    # a fresh interpreter: importing libsdpa loads neither torch nor the submodules
    code = ("import sys, libsdpa; "
            "print('torch' in sys.modules, 'libsdpa.diffusers' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "False"], r.stdout
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        libsdpa.nope  # noqa: B018
    try:
        import torch  # noqa: F401
    except ImportError:
        return  # the submodules need torch: the rest runs where it is installed
    assert libsdpa.torch_ops.__name__ == "libsdpa.torch_ops"
    assert callable(libsdpa.distributed.attention)
    try:
        import diffusers  # noqa: F401
    except ImportError:
        return
    assert callable(libsdpa.diffusers.enable)


def test_prepared_calls_repeat_correctly():
    """The second and later calls of a signature reuse the first call's C
    structs (libsdpa._Plan): every call must still read its own arrays and
    fill its own output, signatures must not be confused, threads must not
    share structs, and what the general path refuses it still refuses."""
    layer = libsdpa.Layer("prepared")
    shapes = [(1, 1, 1, 32), (2, 17, 3, 64), (1, 17, 3, 64)]  # the last two differ in B only
    for _ in range(3):
        for shape in shapes:
            q, k, v = (rand(shape, np.float32) for _ in range(3))
            want, want_lse = reference(q, k, v, "top-left")
            for call in (libsdpa.attention, layer):
                out, lse = call(q, k, v, is_causal=True, return_lse=True)
                np.testing.assert_allclose(out, want, atol=2e-5)
                np.testing.assert_allclose(lse, want_lse, atol=1e-4)
                np.testing.assert_allclose(call(q, k, v), reference(q, k, v)[0], atol=2e-5)
    # strides are part of the signature: the same shape as a transposed view
    q = rand((1, 9, 2, 16), np.float32)
    qt = np.ascontiguousarray(q.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
    for x in (q, qt, q, qt):
        np.testing.assert_allclose(libsdpa.attention(x, q, q), reference(q, q, q)[0], atol=2e-5)
    # read-only and non-contiguous arrays (numpy's own pointer, not the buffer protocol)
    ro = q.copy()
    ro.flags.writeable = False
    sliced = rand((1, 9, 4, 16), np.float32)[:, :, ::2]
    for _ in range(2):
        np.testing.assert_allclose(libsdpa.attention(ro, ro, ro), reference(q, q, q)[0],
                                   atol=2e-5)
        np.testing.assert_allclose(libsdpa.attention(sliced, sliced, sliced),
                                   reference(sliced, sliced, sliced)[0], atol=2e-5)
    # a value only the general path takes, after a plan for its equal exists
    libsdpa.attention(q, q, q, is_causal=True)
    with pytest.raises(libsdpa.InvalidArgumentError, match="is_causal is 1"):
        libsdpa.attention(q, q, q, is_causal=1)
    # another dtype for k than the plan's: refused, not read as the plan's dtype
    with pytest.raises(libsdpa.InvalidArgumentError, match="dtype"):
        libsdpa.attention(q, q.astype(np.float16), q)
    # threads: the same signature at once, each with its own data
    errors = []

    def work(seed):
        r = np.random.default_rng(seed)
        try:
            for _ in range(20):
                x = r.uniform(-1, 1, (1, 5, 2, 32)).astype(np.float32)
                np.testing.assert_allclose(libsdpa.attention(x, x, x), reference(x, x, x)[0],
                                           atol=2e-5)
                np.testing.assert_allclose(layer(x, x, x), reference(x, x, x)[0], atol=2e-5)
        except Exception as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert not errors, errors
    # a new thread count makes a new context: prepared calls follow it
    libsdpa.set_num_threads(1)
    try:
        np.testing.assert_allclose(libsdpa.attention(q, q, q), reference(q, q, q)[0], atol=2e-5)
        assert libsdpa.get_num_threads() == 1
    finally:
        libsdpa.set_num_threads(None)


def test_merge_of_two_key_blocks():
    """libsdpa.merge (sdpa_merge): attention over two disjoint key blocks,
    merged, equals attention over all the keys; in place as a running
    accumulation; a block that saw no key (LSE -inf) is not read."""
    q = rand((2, 9, 3, 32), np.float32)
    k, v = rand((2, 30, 3, 32), np.float32), rand((2, 30, 3, 32), np.float32)
    want, want_lse = reference(q, k, v)
    oa, la = libsdpa.attention(q, k[:, :11], v[:, :11], return_lse=True)
    ob, lb = libsdpa.attention(q, k[:, 11:], v[:, 11:], return_lse=True)
    out, lse = libsdpa.merge(oa, la, ob, lb)
    np.testing.assert_allclose(out, want, atol=2e-5)
    np.testing.assert_allclose(lse, want_lse, atol=1e-4)
    acc, lacc = oa.copy(), la.copy()
    assert libsdpa.merge(acc, lacc, ob, lb, out=acc, lse=lacc)[0] is acc
    np.testing.assert_allclose(acc, want, atol=2e-5)
    empty = np.full_like(la, -np.inf)
    nan = np.full_like(oa, np.nan)  # never read: its LSE says it saw nothing
    out, lse = libsdpa.merge(nan, empty, ob, lb)
    np.testing.assert_array_equal(out, ob)
    np.testing.assert_array_equal(lse, lb)
    with pytest.raises(libsdpa.InvalidArgumentError, match="lse_b"):
        libsdpa.merge(oa, la, ob, lb[:, :, :4])
