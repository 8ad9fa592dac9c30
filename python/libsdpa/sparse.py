"""Block-sparse attention: maps of key blocks per query block (sdpa.h's
sdpa_block_map), from PyTorch FlexAttention's BlockMask or built for 3-D
neighbourhoods, and flex_attention() with FlexAttention's calling
convention, so that code written for torch's flex_attention runs on libsdpa.

    from torch.nn.attention.flex_attention import create_block_mask
    bm = create_block_mask(mask_mod, B, H, S, S)
    out = libsdpa.sparse.flex_attention(q, k, v, block_mask=bm)   # [B, H, S, D]

    m = libsdpa.BlockMap.neighborhood_3d((21, 30, 52), (5, 9, 13), prefix=256)
    out = libsdpa.attention(q, k, v, block_mask=m)                 # [B, S, H, D]

A torch BlockMask's mask_mod is evaluated once per PARTIAL block into bits
(the first call with that BlockMask; the result is kept on it), FULL
blocks are taken as they are; no score_mod.
"""
import ctypes

import numpy as np

from . import _capi as C

_KEEP_ATTR = "_libsdpa_block_map"  # the converted map, kept on a torch BlockMask


class BlockMap:
    """A block map in FlexAttention's layout: per (batch, head, query block)
    the FULL and PARTIAL key blocks, and for partial ones optional bits
    (row r of the block sees key c when bit r * block_kv + c is set).

    counts are int32 [batch, heads, q_blocks] (batch and heads 1 broadcast),
    indices int32 [batch, heads, q_blocks, stride] (ascending in their first
    count entries), partial_bits uint64 [batch, heads, q_blocks, stride,
    block_q * block_kv / 64] or None (the call's causal or window decides
    inside partial blocks). Validated by the library on each call."""

    def __init__(self, *, block_q=128, block_kv=128, q_blocks, kv_blocks, full_count=None,
                 full_index=None, partial_count=None, partial_index=None, partial_bits=None):
        arrays = {}
        shape = None
        for name, x in (("full_count", full_count), ("full_index", full_index),
                        ("partial_count", partial_count), ("partial_index", partial_index)):
            if x is None:
                continue
            a = np.ascontiguousarray(np.asarray(x), dtype=np.int32)
            want = 3 if name.endswith("count") else 4
            if a.ndim != want:
                raise C.InvalidArgumentError(f"{name} has {a.ndim} dimensions, expected {want}")
            if name.endswith("count"):
                shape = shape or a.shape
                if a.shape != shape:
                    raise C.InvalidArgumentError(f"{name} has shape {a.shape}, expected {shape}")
            arrays[name] = a
        if shape is None:
            raise C.InvalidArgumentError("a block map needs full_count or partial_count")
        strides = {a.shape[3] for n, a in arrays.items() if n.endswith("index")}
        if len(strides) != 1:
            raise C.InvalidArgumentError("full_index and partial_index must have the same last "
                                         "dimension (entries per row)")
        stride = strides.pop()
        self._arrays = arrays
        self._bits = None
        if partial_bits is not None:
            words = block_q * block_kv // 64
            b = np.ascontiguousarray(np.asarray(partial_bits), dtype=np.uint64)
            if b.shape != shape + (stride, words):
                raise C.InvalidArgumentError(f"partial_bits has shape {b.shape}, expected "
                                             f"{shape + (stride, words)}")
            self._bits = b
        c = C.BlockMap()
        c.block_q, c.block_kv = block_q, block_kv
        c.batch, c.heads, c.q_blocks, c.kv_blocks = shape[0], shape[1], q_blocks, kv_blocks
        c.index_stride = stride
        for name, a in arrays.items():
            setattr(c, name, a.ctypes.data)
        if self._bits is not None:
            c.partial_bits = self._bits.ctypes.data
        self._c, self._owned = c, None

    @classmethod
    def _wrap(cls, ptr):
        """A map the library built (freed with it)."""
        self = cls.__new__(cls)
        self._arrays, self._bits, self._c, self._owned = {}, None, ptr.contents, ptr
        return self

    def __del__(self):
        if getattr(self, "_owned", None) is not None:
            C.lib.sdpa_block_map_free(self._owned)
            self._owned = None

    @property
    def c_struct(self):
        return self._c

    def density(self, Sq, Skv):
        """Share of the (query, key) pairs inside listed blocks: 1 - sparsity."""
        return C.lib.sdpa_block_map_density(ctypes.byref(self._c), int(Sq), int(Skv))

    def slice(self, Sq, Skv, q_first, q_count, kv_first, kv_count, head_first=0, head_count=1):
        """The piece of this map (for a call of Sq queries and Skv keys) that
        query rows [q_first, q_first + q_count), keys [kv_first, kv_first +
        kv_count) and query heads [head_first, head_first + head_count) see,
        as a map for a call on that piece alone (sdpa_block_map_slice: what a
        sequence-parallel rank hands its local attention). A map that
        broadcasts one head stays broadcast."""
        out = ctypes.POINTER(C.BlockMap)()
        C.check(C.lib.sdpa_block_map_slice(ctypes.byref(self._c), int(Sq), int(Skv),
                                           int(q_first), int(q_count), int(kv_first),
                                           int(kv_count), int(head_first), int(head_count),
                                           ctypes.byref(out)), "BlockMap.slice")
        return BlockMap._wrap(out)

    @classmethod
    def neighborhood_3d(cls, grid, windows, *, tile=None, prefix=0, suffix=0,
                        causal_time=False, block=128):
        """A 3-D neighbourhood over a T x H x W token grid (sdpa_block_map_3d):
        windows per axis (a triple, or one triple per head), in tokens, or in
        tiles with tile=(tt, th, tw) (tile-major order: Sliding Tile
        Attention); prefix dense text tokens first and suffix after the grid
        (joint attention with the text last: sdpa_block_map_3d_joint);
        causal_time for world models."""
        w = np.ascontiguousarray(np.asarray(windows, dtype=np.int64).reshape(-1, 3))
        nb = C.Neighborhood3d()
        for a in range(3):
            nb.grid[a] = int(grid[a])
            nb.tile[a] = int(tile[a]) if tile is not None else 0
        nb.windows, nb.heads = w.ctypes.data, w.shape[0]
        nb.prefix, nb.causal_time = int(prefix), int(bool(causal_time))
        out = ctypes.POINTER(C.BlockMap)()
        C.check(C.lib.sdpa_block_map_3d_joint(ctypes.byref(nb), int(suffix), int(block),
                                              ctypes.byref(out)), "neighborhood_3d")
        return cls._wrap(out)

    @classmethod
    def from_torch(cls, block_mask):
        """A torch.nn.attention.flex_attention.BlockMask as a map: its FULL
        lists as they are, its partial lists with mask_mod evaluated once
        per partial block into bits (kept on the BlockMask for later calls)."""
        kept = getattr(block_mask, _KEEP_ATTR, None)
        if kept is not None:
            return kept
        import torch
        bq, bkv = block_mask.BLOCK_SIZE
        Sq, Skv = block_mask.seq_lengths
        if bq not in (64, 128) or bkv not in (64, 128):
            raise C.InvalidArgumentError(f"BlockMask.BLOCK_SIZE is {(bq, bkv)}, expected 64 or "
                                         "128 each")

        def rows(counts, index):
            c = counts.to(torch.int32).cpu().numpy()
            i = index.to(torch.int32).cpu().numpy().copy()
            for idx in np.ndindex(*c.shape):  # ascending, as sdpa.h asks
                n = c[idx]
                i[idx][:n] = np.sort(i[idx][:n])
            return c, i

        pc, pi = rows(block_mask.kv_num_blocks, block_mask.kv_indices)
        fc = fi = None
        if block_mask.full_kv_num_blocks is not None:
            fc, fi = rows(block_mask.full_kv_num_blocks, block_mask.full_kv_indices)
        q_blocks, kv_blocks = pc.shape[2], -(-Skv // bkv)
        bits = None
        mask_mod = block_mask.mask_mod
        if mask_mod is not None and pc.sum() > 0:
            bits = _partial_bits(mask_mod, pc, pi, bq, bkv, Sq, Skv)
        m = cls(block_q=bq, block_kv=bkv, q_blocks=q_blocks, kv_blocks=kv_blocks,
                full_count=fc, full_index=fi, partial_count=pc, partial_index=pi,
                partial_bits=bits)
        try:
            setattr(block_mask, _KEEP_ATTR, m)
        except AttributeError:
            pass
        return m


def _partial_bits(mask_mod, counts, index, bq, bkv, Sq, Skv, chunk=512):
    """mask_mod over every partial block, as sdpa.h's bits: [B, H, nQ,
    stride, bq * bkv / 64] uint64 (entries past a row's count zero)."""
    import torch
    Bm, Hm, nq, stride = index.shape
    words = bq * bkv // 64
    bits = np.zeros((Bm, Hm, nq, stride, words), dtype=np.uint64)
    where = [(b, h, q, e) for b in range(Bm) for h in range(Hm) for q in range(nq)
             for e in range(counts[b, h, q])]
    r = torch.arange(bq).view(1, bq, 1)
    c = torch.arange(bkv).view(1, 1, bkv)
    for s in range(0, len(where), chunk):
        part = where[s:s + chunk]
        bb = torch.tensor([w[0] for w in part]).view(-1, 1, 1)
        hh = torch.tensor([w[1] for w in part]).view(-1, 1, 1)
        q0 = torch.tensor([w[2] * bq for w in part]).view(-1, 1, 1)
        k0 = torch.tensor([int(index[w[0], w[1], w[2], w[3]]) * bkv for w in part]).view(-1, 1, 1)
        qi, ki = q0 + r, k0 + c
        valid = (qi < Sq) & (ki < Skv)
        seen = mask_mod(bb, hh, qi.clamp(max=Sq - 1), ki.clamp(max=Skv - 1))
        seen = torch.broadcast_to(seen, valid.shape) & valid
        packed = np.packbits(seen.reshape(len(part), -1).numpy(), axis=1, bitorder="little")
        packed = packed.view(np.uint64)  # little-endian words: bit i of word w is 64 w + i
        for n, w in enumerate(part):
            bits[w] = packed[n]
    return bits


def as_block_map(x):
    """A BlockMap from a BlockMap or a torch BlockMask."""
    if x is None or isinstance(x, BlockMap):
        return x
    if type(x).__name__ == "BlockMask":
        return BlockMap.from_torch(x)
    raise C.InvalidArgumentError(f"block_mask is a {type(x).__name__}, expected a "
                                 "libsdpa.BlockMap or a torch BlockMask")


def flex_attention(query, key, value, score_mod=None, block_mask=None, scale=None,
                   enable_gqa=False, return_lse=False, **kwargs):
    """torch's flex_attention calling convention ([B, H, S, D] tensors) on
    libsdpa: block_mask (a BlockMask) decides which keys each query sees;
    score_mod is not taken (libsdpa has no score modification)."""
    if score_mod is not None:
        raise C.UnsupportedError("flex_attention: score_mod is not supported by libsdpa "
                                 "(block_mask and mask_mod are)")
    if kwargs.get("kernel_options"):
        raise C.UnsupportedError("flex_attention: kernel_options are torch's own")
    from . import attention
    return attention(query, key, value, layout="bhsd", scale=scale,
                     enable_gqa=bool(enable_gqa), return_lse=return_lse,
                     block_mask=block_mask)
