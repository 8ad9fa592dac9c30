"""libsdpa.distributed: sequence-parallel attention over a torch.distributed
process group, with libsdpa's kernels doing the local work and partial
results merged with sdpa_merge's rules (float32, stable, a block that saw no
key not read). The same scheme as libsdpa_mpi (include/sdpa_mpi.h), for
people whose processes talk through torch.distributed:

    out = libsdpa.distributed.attention(q, k, v, ulysses=2)   # every rank of the group

q [B, Sq_local, Hq, D], k and v [B, Skv_local, Hkv, D] (BSHD, torch tensors):
this rank's rows of the global sequence. The group's ranks form a grid of
`ulysses` x R (R = size / ulysses); rank i is member i % ulysses of ring
group i // ulysses. Without zigzag the global sequence is the ranks' rows
one after the other in rank order (any split, empty shards included); with
zigzag=True (causal load balance) it is cut into 2R chunks, ring group r
holds chunks r and 2R-1-r, each split among its members in ceil blocks
(ranges() says which rows; shard() takes them from a whole tensor).

  1. Ulysses (ulysses > 1): an all_to_all in the ring group turns its
     members' rows into all its rows for Hq/ulysses query heads (KV heads
     split, or replicated when ulysses % Hkv == 0).
  2. Ring (R > 1): the groups' K/V blocks travel around the R ring groups;
     each step posts the next block's isend/irecv before computing the
     visiting one, and merges the block's result into a float32
     accumulator. Causal is decided per block from global positions
     (skipped, unmasked, top-left, bottom-right, or the block's own mask);
     a block map (block_mask=, over the global positions) gives each
     block its piece, and a piece that lists nothing is skipped.
  3. Joint keys (k_joint, v_joint: [B, T, Hkv, D], replicated on every rank,
     as FLUX's text tokens): attended once per rank, merged, never sent.
  4. Ulysses back: an all_to_all returns each rank its rows of all heads.

CPU tensors go over gloo, CUDA tensors over NCCL (the local attention on
the plugin's CUDA backends; written, not yet run on a GPU). Every argument
is checked on every rank and the verdict agreed by one all_gather before
any data moves: ranks that disagree all raise InvalidArgumentError, naming
the difference, instead of leaving one rank waiting. A local failure later
(a refused call, out of memory) is agreed before the next collective, and
every rank raises. Forward only (no autograd).
"""
import struct

import torch
import torch.distributed as dist

import libsdpa
from libsdpa import sparse

_CAUSAL = {False: 0, None: 0, "none": 0, True: 1, "top-left": 1, "bottom-right": 2}
_DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


def _ceil_split(first, n, parts):
    """n rows from `first` cut into `parts` ceil blocks: [(first, count)]."""
    c = -(-n // parts) if n else 0
    return [(first + min(p * c, n), min((p + 1) * c, n) - min(p * c, n)) for p in range(parts)]


def ranges(S, size, ulysses=1, zigzag=False, counts=None):
    """Each rank's row ranges of a global sequence of S rows: a list, per
    rank, of (first, count) pairs (one pair, or two under zigzag). counts:
    the rows each rank holds (no zigzag); default ceil blocks."""
    if zigzag:
        R = size // ulysses
        cs = -(-S // (2 * R))
        out = [[] for _ in range(size)]
        for r in range(R):
            for c in (r, 2 * R - 1 - r):
                a, b = min(c * cs, S), min((c + 1) * cs, S)
                for u, rg in enumerate(_ceil_split(a, b - a, ulysses)):
                    out[r * ulysses + u].append(rg)
        return out
    if counts is None:
        return [[rg] for rg in _ceil_split(0, S, size)]
    at, out = 0, []
    for n in counts:
        out.append([(at, n)])
        at += n
    return out


def shard(x, group=None, ulysses=1, zigzag=False, dim=1):
    """This rank's rows of a whole tensor x (rows along `dim`), as ranges()
    splits them with ceil blocks (or zigzag)."""
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    parts = [x.narrow(dim, f, n) for f, n in ranges(x.shape[dim], size, ulysses, zigzag)[rank]]
    return torch.cat(parts, dim).contiguous() if len(parts) > 1 else parts[0].contiguous()


class _Grid:
    """The group as a ulysses x ring grid, its Ulysses subgroups made once
    (new_group is collective over the whole world)."""

    _cache = {}

    def __init__(self, group, U):
        self.group = group
        self.size, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.U, self.R = U, self.size // U
        self.u, self.r = self.rank % U, self.rank // U
        self.world = dist.get_process_group_ranks(group) if group is not None else list(
            range(self.size))
        self.ulysses_group = None
        if U > 1 and self.R > 1:
            key = (tuple(self.world), U)
            if key not in _Grid._cache:
                _Grid._cache[key] = [dist.new_group([self.world[r * U + u] for u in range(U)])
                                     for r in range(self.R)]
            self.ulysses_group = _Grid._cache[key][self.r]
        elif U > 1:
            self.ulysses_group = group

    def global_rank(self, rank_in_group):
        return self.world[rank_in_group]


def _fail(msg):
    raise libsdpa.InvalidArgumentError(f"libsdpa.distributed.attention: {msg}")


def _describe(q, k, v, k_joint, U, causal, zigzag, scale, return_lse, block_map=None):
    """This rank's view of the call as integers (for the agreement) and its
    own error, if any."""
    err = None
    if not all(isinstance(x, torch.Tensor) for x in (q, k, v)):
        err = "q, k and v must be torch tensors"
    elif q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        err = f"q, k, v have {q.dim()}, {k.dim()}, {v.dim()} dimensions, expected 4 ([B, S, H, D])"
    elif k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        err = (f"shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not agree "
               "(B and D alike, k and v the same)")
    elif q.dtype not in _DTYPES or q.dtype != k.dtype or q.dtype != v.dtype:
        err = f"dtypes {q.dtype}, {k.dtype}, {v.dtype}: one of float32, float16, bfloat16 for all"
    elif q.device != k.device or q.device != v.device:
        err = f"q, k, v are on {q.device}, {k.device}, {v.device}: one device for all"
    elif torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        err = "inputs require grad with autograd on: forward only (use torch.no_grad())"
    if err is None and block_map is not None:
        c = block_map.c_struct
        if c.batch not in (1, q.shape[0]) or c.heads not in (1, q.shape[2]):
            err = (f"block_mask has batch {c.batch} and heads {c.heads}, expected 1 (broadcast) "
                   f"or B = {q.shape[0]}, and 1 or Hq = {q.shape[2]}")
    T = 0
    if err is None and k_joint is not None:
        T = k_joint.shape[1] if k_joint.dim() == 4 else -1
    ok4 = err is None
    B, Sq, Hq, D = tuple(q.shape) if ok4 else (0, 0, 0, 0)
    Skv, Hkv = (k.shape[1], k.shape[2]) if ok4 else (0, 0)
    desc = [0 if err is None else 1, B, Hq, Hkv, D, _DTYPES.get(q.dtype, -1) if ok4 else -1,
            causal, int(bool(zigzag)), U, T, int(bool(return_lse)),
            -1 if scale is None else struct.unpack("<q", struct.pack("<d", float(scale)))[0],
            int(q.device.type == "cuda") if ok4 else 0, int(block_map is not None), Sq, Skv]
    return desc, err


_SHARED = ("error", "B", "Hq", "Hkv", "D", "dtype", "causal", "zigzag", "ulysses", "joint keys T",
           "return_lse", "scale", "device kind", "block_mask given")


def attention(q, k, v, *, group=None, ulysses=1, is_causal=False, zigzag=False, scale=None,
              k_joint=None, v_joint=None, return_lse=False, backend=None, block_mask=None):
    """This rank's rows of the sequence-parallel attention (see the module).
    Returns out [B, Sq_local, Hq, D] in q's dtype, or (out, lse) with lse
    float32 [B, Hq, Sq_local].

    block_mask: a libsdpa.BlockMap or torch BlockMask over the global
    positions (the whole call's Sq x Skv), the same on every rank; each
    visiting block gets its piece (BlockMap.slice) and a piece that lists
    nothing is not computed. With k_joint, the map covers the sequence
    only: the joint keys are seen by every query."""
    if not dist.is_available() or not dist.is_initialized():
        _fail("torch.distributed is not initialised (call init_process_group first)")
    if is_causal not in _CAUSAL:
        _fail(f"is_causal is {is_causal!r}, expected False, True, 'top-left' or 'bottom-right'")
    causal = _CAUSAL[is_causal]
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    U = ulysses if isinstance(ulysses, int) and not isinstance(ulysses, bool) else -1
    block_map, err = None, None
    try:
        block_map = sparse.as_block_map(block_mask)
    except libsdpa.Error as e:  # agreed below like every local refusal
        err = str(e)
    desc, err_desc = _describe(q, k, v, k_joint, U, causal, zigzag, scale, return_lse,
                               block_map)
    err = err or err_desc
    if err is None and (U < 1 or size % U):
        err = f"ulysses is {ulysses!r}, expected a divisor of the group's size {size}"
    if err is None:
        Hq, Hkv = q.shape[2], k.shape[2]
        if Hq % Hkv or Hq % U or (Hkv % U and U % Hkv):
            ok = [d for d in range(1, size + 1) if size % d == 0 and Hq % d == 0 and
                  (Hkv % d == 0 or d % Hkv == 0)]
            err = (f"Hq {Hq} and Hkv {Hkv} with ulysses {U}: the degree must divide Hq and "
                   f"divide Hkv or be a multiple of it (Hq % Hkv == 0); degrees that work with "
                   f"{size} ranks: {ok}")
    if err is None and (k_joint is None) != (v_joint is None):
        err = "k_joint and v_joint come together (one is None)"
    if err is None and k_joint is not None:
        want = (q.shape[0], k_joint.shape[1] if k_joint.dim() == 4 else -1, k.shape[2],
                q.shape[3])
        if (k_joint.dim() != 4 or tuple(k_joint.shape) != want or k_joint.shape != v_joint.shape
                or want[1] < 1 or k_joint.dtype != q.dtype or v_joint.dtype != q.dtype or
                k_joint.device != q.device or v_joint.device != q.device):
            err = (f"k_joint {tuple(k_joint.shape)} and v_joint {tuple(v_joint.shape)} must be "
                   f"[B, T >= 1, Hkv, D] = [{want[0]}, T, {want[2]}, {want[3]}] in q's dtype "
                   "and device")
    if err is not None:
        desc[0] = 1
    # the agreement: every rank's description, before any data moves
    mine = torch.tensor(desc, dtype=torch.int64)
    if desc[12]:  # NCCL moves CUDA tensors only
        mine = mine.to(q.device)
    every = [torch.empty_like(mine) for _ in range(size)]
    dist.all_gather(every, mine, group=group)
    every = [x.cpu().tolist() for x in every]
    bad = [i for i, d in enumerate(every) if d[0]]
    if bad:
        _fail(err if rank in bad else f"rank {bad[0]} refused the call (its error says why)")
    for j, name in enumerate(_SHARED):
        vals = {d[j] for d in every}
        if len(vals) > 1:
            _fail(f"ranks disagree on {name} (values {sorted(vals)}); every rank must make the "
                  "same call")
    Sq_all, Skv_all = [d[14] for d in every], [d[15] for d in every]
    if zigzag:
        Sq, Skv = sum(Sq_all), sum(Skv_all)
        rq, rk = ranges(Sq, size, U, True), ranges(Skv, size, U, True)
        for i in range(size):
            if sum(n for _, n in rq[i]) != Sq_all[i] or sum(n for _, n in rk[i]) != Skv_all[i]:
                _fail(f"zigzag: rank {i} holds {Sq_all[i]} query and {Skv_all[i]} key rows, "
                      f"the split gives it {sum(n for _, n in rq[i])} and "
                      f"{sum(n for _, n in rk[i])} (take them with shard())")
    else:
        rq, rk = ranges(0, size, counts=Sq_all), ranges(0, size, counts=Skv_all)
        Sq, Skv = sum(Sq_all), sum(Skv_all)
    grid = _Grid(group, U)
    return _run(grid, q, k, v, k_joint, v_joint, causal, Sq, Skv, rq, rk, scale, return_lse,
                backend, block_map)


def _group_ranges(grid, rr, r):
    """Ring group r's row ranges, range-major: its members' part of range 0
    one after the other, then of range 1: (first global row, rows) per range."""
    U = grid.U
    nseg = len(rr[r * U])
    segs = []
    for g in range(nseg):
        first = rr[r * U][g][0]
        n = sum(rr[r * U + u][g][1] for u in range(U))
        segs.append((first, n))
    return segs


def _heads_for(member, U, H, replicated):
    """The heads member `member` gets of H (query heads split; KV heads
    split, or one each when replicated)."""
    if replicated:
        h = member * H // U
        return h, 1
    return member * (H // U), H // U


def _gather_group(grid, x, rr, heads_of):
    """All of this ring group's rows of x for this member's heads, range-major
    (Ulysses' first all_to_all; a copy when ulysses is 1)."""
    U, r = grid.U, grid.r
    B, _, _, D = x.shape
    if U == 1:
        return x.contiguous()
    nseg = len(rr[grid.rank])
    pieces = []
    for m in range(U):  # to member m: my rows of m's heads, range by range
        h0, nh = heads_of(m)
        pieces.append(x[:, :, h0:h0 + nh].contiguous().reshape(-1))
    h0, nh = heads_of(grid.u)
    recv_counts = [sum(n for _, n in rr[r * U + m]) * B * nh * D for m in range(U)]
    recv = x.new_empty(sum(recv_counts))
    dist.all_to_all_single(recv, torch.cat(pieces), output_split_sizes=recv_counts,
                           input_split_sizes=[p.numel() for p in pieces], group=grid.ulysses_group)
    parts = recv.split(recv_counts)
    out = []
    for g in range(nseg):  # range g: every member's part, in member order
        for m in range(U):
            n_m = [n for _, n in rr[r * U + m]]
            piece = parts[m].view(B, sum(n_m), nh, D)
            at = sum(n_m[:g])
            out.append(piece[:, at:at + n_m[g]])
    return torch.cat(out, 1).contiguous()


def _block_attention(q, k, v, d, causal, scale, backend, piece=None):
    """One visiting block: (out float32, lse) or None when no query sees any
    key. d: key j of the block is visible to query i when j <= i + d.
    piece: the block's own piece of the call's block map, or None."""
    nq, nk = q.shape[1], k.shape[1]
    kw = dict(return_lse=True, scale=scale, backend=backend)
    if piece is not None:
        if piece.density(nq, nk) <= 0:  # lists nothing: shows nothing
            return None
        kw["block_mask"] = piece
    if causal:
        if nq - 1 + d < 0:
            return None
        if d < nk - 1:
            if d == 0:
                kw["is_causal"] = "top-left"
            elif d == nk - nq:
                kw["is_causal"] = "bottom-right"
            else:
                i = torch.arange(nq, device=q.device)[:, None]
                j = torch.arange(nk, device=q.device)[None, :]
                kw["attn_mask"] = j <= i + d
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    return libsdpa.attention(q, k, v, out=out, **kw)


def _merge_into(acc, lacc, o, lo):
    """(acc, lacc) <- merge((acc, lacc), (o, lo)): sdpa_merge on the CPU; on
    a GPU the same rules in torch (symmetric; a -inf side not read)."""
    if acc.device.type == "cpu":
        libsdpa.merge(acc, lacc, o, lo, out=acc, lse=lacc)
        return
    m = torch.maximum(lacc, lo)
    fin = torch.isfinite(m)
    ms = torch.where(fin, m, torch.zeros_like(m))
    wa, wb = torch.exp(lacc - ms), torch.exp(lo - ms)
    tot = wa + wb
    l_new = torch.where(fin, ms + torch.log(tot), m)
    sa = torch.where(fin, wa / tot, torch.zeros_like(tot)).transpose(1, 2).unsqueeze(-1)
    sb = torch.where(fin, wb / tot, torch.zeros_like(tot)).transpose(1, 2).unsqueeze(-1)
    acc.copy_(torch.where(sa > 0, acc * sa, 0) + torch.where(sb > 0, o * sb, 0))
    lacc.copy_(l_new)


def _run(grid, q, k, v, k_joint, v_joint, causal, Sq, Skv, rq, rk, scale, return_lse, backend,
         block_map=None):
    U, R, r = grid.U, grid.R, grid.r
    B, _, Hq, D = q.shape
    Hkv = k.shape[2]
    replicated = Hkv % U != 0
    hq, hk = Hq // U, (1 if replicated else Hkv // U)
    q_heads = lambda m: _heads_for(m, U, Hq, False)  # noqa: E731
    kv_heads = lambda m: _heads_for(m, U, Hkv, replicated)  # noqa: E731
    gq = _gather_group(grid, q, rq, q_heads)
    gk = _gather_group(grid, k, rk, kv_heads)
    gv = _gather_group(grid, v, rk, kv_heads)
    qsegs = _group_ranges(grid, rq, r)
    off = 0 if causal != 2 else Skv - Sq  # the global diagonal
    # a float32 accumulator per range of the group's queries (contiguous, as sdpa_merge's LSE
    # must be), and the group's queries of that range
    accs, qs, at = [], [], 0
    for _, qn in qsegs:
        accs.append((torch.zeros((B, qn, hq, D), dtype=torch.float32, device=q.device),
                     torch.full((B, hq, qn), float("-inf"), dtype=torch.float32,
                                device=q.device)))
        qs.append(gq[:, at:at + qn])
        at += qn
    failure = None

    def visit(kv, j):
        """The group's queries with ring group j's keys and values."""
        nonlocal failure
        if failure is not None:
            return
        kb, vb = kv[0], kv[1]
        try:
            for (qf, qn), qr, (acc, lacc) in zip(qsegs, qs, accs):
                ka = 0
                for kf, kn in _group_ranges(grid, rk, j):
                    if qn and kn:
                        piece = None if block_map is None else block_map.slice(
                            Sq, Skv, qf, qn, kf, kn, grid.u * hq, hq)
                        res = _block_attention(qr, kb[:, ka:ka + kn], vb[:, ka:ka + kn],
                                               qf + off - kf, causal, scale, backend, piece)
                        if res is not None:
                            _merge_into(acc, lacc, *res)
                    ka += kn
        except Exception as e:  # agreed below: the ring keeps turning
            failure = e

    cur = torch.stack([gk, gv]) if R > 1 else None
    if R == 1:
        visit((gk, gv), r)
    else:
        rows = [sum(n for _, n in _group_ranges(grid, rk, j)) for j in range(R)]
        nxt_rank = grid.global_rank(((r + 1) % R) * U + grid.u)
        prv_rank = grid.global_rank(((r - 1) % R) * U + grid.u)
        for step in range(R):
            j = (r - step) % R
            reqs = []
            if step < R - 1:
                jn = (j - 1) % R
                nxt = cur.new_empty((2, B, rows[jn], hk, D))
                # one batch: NCCL needs a ring's send and receive posted together
                reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, cur, nxt_rank),
                                               dist.P2POp(dist.irecv, nxt, prv_rank)])
            visit(cur, j)
            for req in reqs:
                req.wait()
            if step < R - 1:
                cur = nxt
    if k_joint is not None and failure is None:  # the replicated keys, once, my heads
        h0, nh = kv_heads(grid.u)
        kj, vj = k_joint[:, :, h0:h0 + nh], v_joint[:, :, h0:h0 + nh]
        try:
            for qr, (acc, lacc) in zip(qs, accs):
                if qr.shape[1]:
                    _merge_into(acc, lacc, *_block_attention(qr, kj, vj, 0, 0, scale, backend))
        except Exception as e:
            failure = e
    _agree(grid, failure, q.device)
    return _scatter_back(grid, accs, rq, q.dtype, return_lse)


def _agree(grid, failure, device):
    """Every rank raises if any rank's local work failed."""
    flag = torch.tensor([0 if failure is None else 1 + grid.rank], dtype=torch.int64,
                        device=device if device.type == "cuda" else "cpu")
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=grid.group)
    if failure is not None:
        raise failure
    if flag.item():
        raise libsdpa.Error(f"libsdpa.distributed.attention: rank {flag.item() - 1} failed in its "
                            "local attention (its error says why)")


def _scatter_back(grid, accs, rq, dtype, return_lse):
    """Each rank's rows of all heads, from the group's accumulators (one per
    query range)."""
    U, r = grid.U, grid.r
    B, _, hq, D = accs[0][0].shape
    if U == 1:  # the group's rows are this rank's
        out = torch.cat([a for a, _ in accs], 1).to(dtype)
        lse = torch.cat([lz for _, lz in accs], 2)
        return (out, lse) if return_lse else out
    mine = sum(n for _, n in rq[grid.rank])
    # to member m: its rows, range by range, of my heads; out and lse as D + 1 floats a row
    rows = [torch.cat([a, lz.transpose(1, 2).unsqueeze(-1)], -1) for a, lz in accs]
    pieces = []
    for m in range(U):
        parts = []
        for g, x in enumerate(rows):
            n_g = [rq[r * U + mm][g][1] for mm in range(U)]
            at = sum(n_g[:m])
            parts.append(x[:, at:at + n_g[m]])
        pieces.append(torch.cat(parts, 1).contiguous().reshape(-1))
    recv_counts = [B * mine * hq * (D + 1)] * U
    recv = rows[0].new_empty(sum(recv_counts))
    dist.all_to_all_single(recv, torch.cat(pieces), output_split_sizes=recv_counts,
                           input_split_sizes=[p.numel() for p in pieces], group=grid.ulysses_group)
    full = torch.cat([p.view(B, mine, hq, D + 1) for p in recv.split(recv_counts)], 2)
    out = full[..., :D].to(dtype).contiguous()
    if return_lse:
        return out, full[..., D].transpose(1, 2).contiguous()
    return out
