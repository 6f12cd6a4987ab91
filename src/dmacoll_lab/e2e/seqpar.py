"""Sequence-parallel prefill: the residual stream sharded by tokens between the blocks (layout and calls in
calls.py), every all-gather -> GEMM and GEMM -> reduce-scatter cut into ``pieces`` so that piece i's
communication runs under a neighbouring piece's GEMM (async tensor parallelism; FiCCO's patterns inside a
forward pass). One generator for ``Schedule.run``: it starts its pieces ahead and waits for them when it needs
them; the norms, residual adds and MoE run on this rank's shard only.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .calls import piece_rows
from .collectives import Collectives
from .model import Bufs, KVCache, Model, expert_mix, rms_norm, route
from .steps import Call, Wait, collective


def seqpar_prefill(m: Model, coll: Collectives, tokens: torch.Tensor, cache: KVCache, first_seq: int,
                   pieces: int):
    b, S = tokens.shape
    T, w, r, H, eps = b * S, m.world, m.rank, m.spec.hidden, m.spec.rms_eps
    P = piece_rows(T, w, pieces)
    Tp = pieces * w * P
    bufs = Bufs(coll, 0)
    gathered, partial = bufs("sp_gather", Tp, H), bufs("sp_partial", Tp, H)
    xs, out = bufs("sp_in", pieces * P, H), bufs("sp_out", pieces * P, H)

    def piece(t: torch.Tensor, i: int) -> torch.Tensor:  # piece i of a full [Tp, ...] tensor
        return t[i * w * P:(i + 1) * w * P]

    def mine(i: int) -> slice:  # piece i of this rank's shard
        return slice(i * P, (i + 1) * P)

    def scatter(site: str, gemm):
        """``gemm(i, dst)`` fills piece i of the partial sums; its reduce-scatter runs under gemm(i + 1)."""
        started = []
        for i in range(pieces):
            gemm(i, piece(partial, i))
            started.append((yield Call("reduce_scatter", site, out[mine(i)], piece(partial, i))))
        for handle in started:
            yield Wait(handle)
        return out

    def gather(site: str, x: torch.Tensor, use, scatter_site: str = ""):
        """The normed shard ``x`` all-gathered piece by piece: per piece i, wait for it, start piece i+1's
        all-gather (it runs under this piece's GEMMs), ``use(i, rows)``; with ``scatter_site``, ``use`` fills
        piece i of the partial sums and its reduce-scatter starts at once (it runs under piece i+1's GEMMs).
        Returns the reduce-scattered shard (``scatter_site``) once every piece is back."""
        xs.copy_(x)
        started = []
        nxt = yield Call("all_gather", site, piece(gathered, 0), xs[mine(0)])
        for i in range(pieces):
            rows_i = yield Wait(nxt)
            if i + 1 < pieces:
                nxt = yield Call("all_gather", site, piece(gathered, i + 1), xs[mine(i + 1)])
            use(i, rows_i)
            if scatter_site:
                started.append((yield Call("reduce_scatter", scatter_site, out[mine(i)], piece(partial, i))))
        for handle in started:
            yield Wait(handle)
        return out

    # embedding: partial rows (padding rows have id -1: zero), reduce-scattered into the shard
    ids = F.pad(tokens.reshape(-1), (0, Tp - T), value=-1)
    m.embed_partial(ids, partial)
    h = (yield from scatter("embed", lambda i, dst: None)).clone()
    cos, sin = m.rope_table(S)
    pos = torch.arange(S, device=m.device).repeat(b)
    rope = cos[pos].unsqueeze(1), sin[pos].unsqueeze(1)
    sh, d = m.sh, m.spec.head_dim
    rows = slice(first_seq, first_seq + b)
    for li, lw in enumerate(m.layers):
        # attention: QKV per gathered piece, attention over the whole prompts, output projection per piece
        qkv = torch.empty(Tp, (sh.heads + 2 * sh.kv_heads) * d, dtype=m.dtype, device=m.device)
        yield from gather(f"attn{li}.in", rms_norm(h, lw["attn_norm"], eps),
                          lambda i, rows_i: torch.matmul(rows_i, lw["wqkv"].t(), out=piece(qkv, i)))
        q, k, v = m.qkv(qkv[:T], rope)
        q, k, v = (t.reshape(b, S, t.shape[1], d).transpose(1, 2) for t in (q, k, v))
        cache.k[li][rows, :, :S] = k
        cache.v[li][rows, :, :S] = v
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).transpose(1, 2).reshape(T, -1)
        o = o if Tp == T else F.pad(o, (0, 0, 0, Tp - T))
        h = h + (yield from scatter(f"attn{li}", lambda i, dst: torch.matmul(piece(o, i), lw["wo"].t(), out=dst)))
        x = rms_norm(h, lw["mlp_norm"], eps)
        if m.spec.moe:
            h = h + (yield from _moe_on_shard(m, bufs, li, x, lw))
            continue
        # MLP: gather piece i+1 and reduce-scatter piece i-1 under piece i's GEMMs
        h = h + (yield from gather(f"mlp{li}.in", x, lambda i, rows_i: m.swiglu(rows_i, lw, piece(partial, i)),
                                   f"mlp{li}"))
    # LM head: each sequence's last row from the rank holding it (zeros elsewhere), summed, then as serial
    head = bufs("sp_head", b, H)
    head.zero_()
    last = [q * S + S - 1 for q in range(b)]
    own = [(q, g // (w * P) * P + g % P) for q, g in enumerate(last) if g % (w * P) // P == r]
    if own:
        seqs, shard_rows = (torch.tensor(c, device=m.device) for c in zip(*own))
        head.index_copy_(0, seqs, h.index_select(0, shard_rows))
    got = yield from collective("all_reduce", "head", head)
    return (yield from m.logits(bufs, got))


def _moe_on_shard(m: Model, bufs: Bufs, i: int, x: torch.Tensor, lw: dict):
    """Expert parallel on this rank's shard (already a 1/world share of the tokens): no slice, no all-gather."""
    gates = route(x, lw["router"], m.spec.top_k)
    if m.world == 1:
        return expert_mix(x, gates, lw["w13"], lw["w2"], m.moe_dense_now())
    return (yield from m.expert_parallel(bufs, i, x, gates, lw, uneven=True))  # seqpar is a prefill
