"""Run by test_torchrun.py under torchrun (gloo, CPU): every rank checks
its rows of libsdpa.distributed.attention against libsdpa.attention on the
whole tensors (the single-process call), for every grid the world size
allows (ring, Ulysses, USP), then the refusals. Prints its counts and exits
non-zero on any failure."""
import os
import sys

import numpy as np
import torch
import torch.distributed as dist

import libsdpa
import libsdpa.distributed as ld

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from workerlib import Checks  # noqa: E402

check = Checks()
rank, size = check.rank, check.size
seed = int(os.environ.get("SDPA_TEST_SEED", "0")) or int.from_bytes(os.urandom(4), "little")
box = torch.tensor([seed], dtype=torch.int64)
dist.broadcast(box, 0)
seed = int(box.item())
if rank == 0:
    print(f"seed {seed} (repeat with SDPA_TEST_SEED={seed}), {size} ranks")


def rows(x, rr):
    """This rank's rows of a whole [B, S, H, D] tensor (its ranges)."""
    return torch.cat([x[:, f:f + n] for f, n in rr], 1)


def random_map(g, B, Hq, Sq, Skv, with_bits):
    """A random 64 x 64 block map: half the key blocks hidden, the rest FULL or
    PARTIAL (bits or not), per batch entry and head with bits, broadcast
    without."""
    Bm, Hm = (B, Hq) if with_bits else (1, 1)
    nq, nk = -(-Sq // 64), -(-Skv // 64)
    cls = torch.randint(0, 4, (Bm, Hm, nq, nk), generator=g)  # 0, 1 hidden, 2 full, 3 partial

    def lists(c):
        counts = (cls == c).sum(-1).to(torch.int32)
        index = torch.zeros(Bm, Hm, nq, nk, dtype=torch.int32)
        for idx in np.ndindex(Bm, Hm, nq):
            kb = torch.nonzero(cls[idx] == c).flatten()
            index[idx][:len(kb)] = kb
        return counts.numpy(), index.numpy()

    fc, fi = lists(2)
    pc, pi = lists(3)
    bits = None
    if with_bits:
        bits = torch.randint(0, 2**62, (Bm, Hm, nq, nk, 64), generator=g).numpy().astype(np.uint64)
    return libsdpa.BlockMap(block_q=64, block_kv=64, q_blocks=nq, kv_blocks=nk, full_count=fc,
                            full_index=fi, partial_count=pc, partial_index=pi, partial_bits=bits)


def case(U, B, Sq, Skv, Hq, Hkv, D, dtype, causal=False, zigzag=False, T=0, counts=None,
         block_map=None):
    what = (f"P={size} U={U} B={B} Sq={Sq} Skv={Skv} Hq={Hq} Hkv={Hkv} {dtype} causal={causal} "
            f"zigzag={zigzag} T={T} counts={counts} map={block_map}")
    g = torch.Generator().manual_seed(seed + Sq * 131 + Skv + U)
    bm = None if block_map is None else random_map(g, B, Hq, Sq, Skv, block_map == "bits")
    q = (torch.rand(B, Sq, Hq, D, generator=g) * 2 - 1).to(dtype)
    k = (torch.rand(B, Skv, Hkv, D, generator=g) * 2 - 1).to(dtype)
    v = (torch.rand(B, Skv, Hkv, D, generator=g) * 2 - 1).to(dtype)
    kj = (torch.rand(B, T, Hkv, D, generator=g) * 2 - 1).to(dtype) if T else None
    vj = (torch.rand(B, T, Hkv, D, generator=g) * 2 - 1).to(dtype) if T else None
    kk, vv = (torch.cat([kj, k], 1), torch.cat([vj, v], 1)) if T else (k, v)
    if causal and T:  # text keys are seen by every query: a mask over [text; image]
        i = torch.arange(Sq)[:, None]
        j = torch.arange(T + Skv)[None, :]
        off = 0 if causal == "top-left" else Skv - Sq
        want, want_lse = libsdpa.attention(q, kk, vv, attn_mask=(j < T) | (j - T <= i + off),
                                           return_lse=True)
    else:
        want, want_lse = libsdpa.attention(q, kk, vv, is_causal=causal, return_lse=True,
                                           block_mask=bm, backend="ref" if bm else None)
    rq = ld.ranges(Sq, size, U, zigzag, counts=counts)[rank]
    if counts:  # keys split in the same proportion; the last rank takes what is left
        kc = [Skv * c // Sq for c in counts]
        kc[-1] += Skv - sum(kc)
        rk = ld.ranges(Skv, size, counts=kc)[rank]
    else:
        rk = ld.ranges(Skv, size, U, zigzag)[rank]
    out, lse = ld.attention(rows(q, rq), rows(k, rk), rows(v, rk), ulysses=U, is_causal=causal,
                            zigzag=zigzag, k_joint=kj, v_joint=vj, return_lse=True,
                            block_mask=bm)
    w, wl = rows(want, rq), torch.cat([want_lse[:, :, f:f + n] for f, n in rq], 2)
    tol = 2e-5 if dtype == torch.float32 else 2e-2
    err = (out.float() - w.float()).abs().max().item() if out.numel() else 0.0
    fin = torch.isfinite(wl)
    lerr = (lse[fin] - wl[fin]).abs().max().item() if fin.any() else 0.0
    check(out.dtype == dtype and out.shape == w.shape and err <= tol and lerr <= 1e-3 and
          torch.equal(torch.isfinite(lse), fin), f"{what}: |out - one process| {err:.3g}, "
          f"|lse - one process| {lerr:.3g}")


grids = [(1, size)] + ([(size, 1)] if size > 1 else []) + ([(2, 2)] if size == 4 else [])
torch.set_grad_enabled(False)
for U, R in grids:
    hkv = 2 if U != 3 else 3
    for dtype in (torch.float32, torch.bfloat16):
        case(U, 2, 37, 37, 12, hkv, 32, dtype)  # uneven ceil blocks, GQA
    for causal in ("top-left", "bottom-right"):
        case(U, 1, 29, 41, 12, hkv, 16, torch.float32, causal=causal)  # cross, causal
        case(U, 1, 41, 29, 12, hkv, 16, torch.float32, causal=causal)  # rows that see nothing
        case(U, 2, 45, 45, 12, hkv, 16, torch.float32, causal=causal, zigzag=True)
    case(U, 1, 33, 33, 12, hkv, 16, torch.float32, T=5)  # joint text keys
    case(U, 1, 33, 33, 12, hkv, 16, torch.float32, causal="top-left", T=5, zigzag=True)
    # block maps over the global positions: shard edges inside and on the map's blocks
    case(U, 2, 101, 101, 12, hkv, 16, torch.float32, block_map="plain")
    case(U, 1, 128 * size, 128 * size, 12, hkv, 16, torch.float32, causal="top-left",
         block_map="bits")
    case(U, 1, 90, 150, 12, hkv, 16, torch.float32, causal="bottom-right", zigzag=True,
         block_map="bits")
    if U == 1 and size > 1:  # an explicit split with an empty shard
        counts = [0] * size
        counts[0], counts[-1] = 20, 17
        case(U, 1, 37, 37, 4, 2, 16, torch.float32, counts=counts)

# refusals: every rank raises, none is left waiting
q = torch.rand(1, 8, 4 if rank else 2, 16)
try:
    ld.attention(q, q, q)
    check(size == 1, "disagreeing heads were accepted")
except libsdpa.InvalidArgumentError as e:
    check(size > 1 and "disagree on Hq" in str(e), f"disagreeing heads: {e}")
q = torch.rand(1, 8, 3, 16)
if size > 1 and 3 % size:
    try:
        ld.attention(q, q, q, ulysses=size)
        check(False, "a degree that does not divide the heads was accepted")
    except libsdpa.InvalidArgumentError as e:
        check("degrees that work" in str(e), f"bad degree: {e}")
q = torch.rand(1, 8, 4, 16) if rank != size - 1 else torch.rand(1, 8, 4, 16).double()
try:
    ld.attention(q, q, q)
    check(False, "float64 on one rank was accepted")
except libsdpa.InvalidArgumentError as e:
    check(("float32" in str(e)) if rank == size - 1 else (f"rank {size - 1} refused" in str(e)),
          f"one rank's bad dtype: {e}")
q = torch.rand(1, 8, 4, 16)
try:  # a map on one rank only: every rank raises
    m = libsdpa.BlockMap(block_q=64, block_kv=64, q_blocks=1, kv_blocks=1,
                         full_count=np.ones((1, 1, 1)), full_index=np.zeros((1, 1, 1, 1)))
    ld.attention(q, q, q, block_mask=m if rank == 0 else None)
    check(size == 1, "a map on one rank was accepted")
except libsdpa.InvalidArgumentError as e:
    check(size > 1 and "disagree on block_mask given" in str(e), f"a map on one rank: {e}")
try:  # a map with 3 heads for 4
    m = libsdpa.BlockMap(block_q=64, block_kv=64, q_blocks=1, kv_blocks=1,
                         full_count=np.ones((1, 3, 1)), full_index=np.zeros((1, 3, 1, 1)))
    ld.attention(q, q, q, block_mask=m)
    check(False, "a map with 3 heads was accepted")
except libsdpa.InvalidArgumentError as e:
    check("block_mask has batch 1 and heads 3" in str(e), f"a map with 3 heads: {e}")
try:  # a local failure inside the ring (a backend that refuses): every rank raises
    ld.attention(q, q, q, backend="cpu.nonexistent" if rank == 0 else None)
    check(False, "an unknown backend on rank 0 was accepted")
except libsdpa.Error as e:
    check(("cpu.nonexistent" in str(e)) if rank == 0 else ("rank 0 failed" in str(e)),
          f"a local failure: {e}")

check.finish()
