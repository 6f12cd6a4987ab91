"""A Llama / Mixtral decoder stack in plain torch, sharded over the ranks of a ``Collectives`` (see config.py for
the parallel layout): RMSNorm, RoPE (with Llama 3's frequency scaling), grouped-query attention, a KV cache,
prefill and decode. Random weights, drawn per full tensor from a seed and then sliced, so any world size holds
the same model as world 1 (the unsharded reference in the tests).

Activations are 2-D ``[tokens, hidden]``. Decode attends over the whole cache with a mask built from a position
held on the device, so a decode step has fixed shapes and no host synchronisation: it can be captured in a
CUDA graph and replayed, each replay advancing the position by one.

A forward is a generator per micro-batch that yields its collectives (schedule.py drives it: in line, or
interleaved with another micro-batch on a communication stream); its buffers are that micro-batch's (``Bufs``).
"""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .calls import Part, suffix
from .collectives import Collectives
from .config import ModelSpec
from .steps import Forward, collective


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """One fused kernel on CUDA (accumulated in float32, rounded once)."""
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None) -> torch.Tensor:
    """Rotary frequencies; Llama 3.1 stretches the low frequencies (long wavelengths) by ``factor``."""
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    if scaling:
        factor, lo, hi = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        orig = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        smooth = (orig / wavelen - lo) / (hi - lo)
        mid = (1 - smooth) * inv / factor + smooth * inv
        inv = torch.where(wavelen > orig / lo, inv / factor, torch.where(wavelen < orig / hi, inv, mid))
    return inv.float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [tokens, heads, head_dim] (Llama's rotate-half layout); cos = [c, c], sin = [-s, s] per position,
    [tokens or 1, 1, head_dim]: x * cos + swap_halves(x) * sin, in float32, rounded once."""
    xf = x.float()
    return torch.addcmul(xf * cos, xf.roll(x.shape[-1] // 2, -1), sin).to(x.dtype)


def route(x: torch.Tensor, router: torch.Tensor, top_k: int) -> torch.Tensor:
    """Mixtral's router: softmax over experts, top-k, renormalised; [tokens, experts] gates, zero elsewhere."""
    probs = torch.softmax((x @ router.t()).float(), dim=-1)
    weights, idx = torch.topk(probs, top_k, dim=-1)
    weights = weights / weights.sum(-1, keepdim=True)
    return torch.zeros_like(probs).scatter_(1, idx, weights).to(x.dtype)


def expert_mix(x: torch.Tensor, gates: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
               dense: bool) -> torch.Tensor:
    """sum_e gates[:, e] * SwiGLU_e(x) over the experts held here, accumulated in float32.

    ``dense``: every expert on every row, zero gates included (fixed shapes: CUDA-graph capturable);
    otherwise only the rows routed to each expert (a host sync per expert to learn how many)."""
    out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float32, device=x.device)
    inter = w2.shape[2]
    for e in range(w13.shape[0]):
        if dense:
            rows, g = x, gates[:, e:e + 1]
        else:
            idx = gates[:, e].nonzero().squeeze(1)
            if idx.numel() == 0:
                continue
            rows, g = x.index_select(0, idx), gates.index_select(0, idx)[:, e:e + 1]
        h = rows @ w13[e].t()
        y = (F.silu(h[:, :inter]) * h[:, inter:]) @ w2[e].t()
        if dense:
            out += g.float() * y.float()
        else:
            out.index_add_(0, idx, g.float() * y.float())
    return out.to(x.dtype)


class WeightGen:
    """Full tensors, normal(0, std), each from its own seed (name + run seed): identical for every world size."""

    def __init__(self, seed: int, device: torch.device, dtype: torch.dtype):
        self.seed, self.device, self.dtype = seed, device, dtype

    def __call__(self, name: str, shape: tuple[int, ...], std: float) -> torch.Tensor:
        g = torch.Generator(device=self.device).manual_seed(zlib.crc32(name.encode()) * 1009 + self.seed)
        return (torch.randn(shape, generator=g, device=self.device, dtype=torch.float32) * std).to(self.dtype)


@dataclass
class KVCache:
    k: list[torch.Tensor]  # per layer [batch, kv_heads_local, length, head_dim]
    v: list[torch.Tensor]

    @property
    def length(self) -> int:
        return self.k[0].shape[2]


class Model:
    def __init__(self, spec: ModelSpec, rank: int, world: int, device, dtype: torch.dtype = torch.bfloat16,
                 seed: int = 0):
        self.spec, self.rank, self.world = spec, rank, world
        self.device, self.dtype = torch.device(device), dtype
        self.sh = sh = spec.shards(world)
        h, d = spec.hidden, spec.head_dim
        gen = WeightGen(seed, self.device, dtype)

        def rows(t: torch.Tensor, per_rank: int) -> torch.Tensor:  # column-parallel: output features
            return t[rank * per_rank:(rank + 1) * per_rank].contiguous()

        def cols(t: torch.Tensor, per_rank: int) -> torch.Tensor:  # row-parallel: input features
            return t[:, rank * per_rank:(rank + 1) * per_rank].contiguous()

        self.embed = rows(gen("embed", (spec.vocab, h), 1.0), sh.vocab)
        self.lm_head = rows(gen("lm_head", (spec.vocab, h), h ** -0.5), sh.vocab)
        self.final_norm = torch.ones(h, dtype=dtype, device=self.device)
        self.layers = []
        for i in range(spec.layers):
            p = f"layer{i}."
            q = rows(gen(p + "q", (spec.heads * d, h), h ** -0.5), sh.heads * d)
            k = rows(gen(p + "k", (spec.kv_heads * d, h), h ** -0.5), sh.kv_heads * d)
            v = rows(gen(p + "v", (spec.kv_heads * d, h), h ** -0.5), sh.kv_heads * d)
            layer = {"attn_norm": torch.ones(h, dtype=dtype, device=self.device),
                     "mlp_norm": torch.ones(h, dtype=dtype, device=self.device),
                     "wqkv": torch.cat([q, k, v]),
                     "wo": cols(gen(p + "o", (h, spec.heads * d), (spec.heads * d) ** -0.5), sh.heads * d)}
            if spec.moe:
                layer["router"] = gen(p + "router", (spec.experts, h), h ** -0.5)
                mine = range(rank * sh.experts, (rank + 1) * sh.experts)
                inter = spec.intermediate
                layer["w13"] = torch.stack([torch.cat([gen(p + f"e{e}.w1", (inter, h), h ** -0.5),
                                                       gen(p + f"e{e}.w3", (inter, h), h ** -0.5)]) for e in mine])
                layer["w2"] = torch.stack([gen(p + f"e{e}.w2", (h, inter), inter ** -0.5) for e in mine])
            else:
                inter = sh.intermediate
                layer["w13"] = torch.cat([rows(gen(p + "gate", (spec.intermediate, h), h ** -0.5), inter),
                                          rows(gen(p + "up", (spec.intermediate, h), h ** -0.5), inter)])
                layer["w2"] = cols(gen(p + "down", (h, spec.intermediate), spec.intermediate ** -0.5), inter)
            self.layers.append(layer)
        self._rope_len = 0
        self.inv_freq = rope_inv_freq(d, spec.rope_theta, spec.rope_scaling).to(self.device)
        self.moe_dense = "auto"  # auto: dense while a CUDA graph is being captured, else routed rows only

    # -- caches and tables -----------------------------------------------------------------------------------
    def new_cache(self, batch: int, length: int) -> KVCache:
        shape = (batch, self.sh.kv_heads, length, self.spec.head_dim)
        new = lambda: [torch.zeros(shape, dtype=self.dtype, device=self.device)  # noqa: E731
                       for _ in range(self.spec.layers)]
        self.rope_table(length)
        return KVCache(new(), new())

    def rope_table(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """[c, c] and [-s, s] for positions 0..length-1, [length, head_dim] float32 (grown on demand, outside any
        graph capture)."""
        if self._rope_len < length:
            angles = torch.outer(torch.arange(length, device=self.device, dtype=torch.float32), self.inv_freq)
            cos, sin = angles.cos(), angles.sin()
            self._cos, self._sin = torch.cat([cos, cos], -1), torch.cat([-sin, sin], -1)
            self._rope_len = length
        return self._cos, self._sin

    # -- whole forward passes ------------------------------------------------------------------------------------
    def prefill_forwards(self, coll: Collectives, tokens: torch.Tensor, cache: KVCache, first_seq: int,
                         parts: list[Part]) -> list[Forward]:
        """A prefill's forwards, one per part (schedule.py chooses the parts and drives them): tokens [b, S],
        whole prompts for cache rows first_seq..first_seq+b-1; each returns the logits of its part's last tokens
        (None: a part without them)."""
        return [self._prefill_part(Bufs(coll, j), tokens, cache, first_seq, p) for j, p in enumerate(parts)]

    def decode_forwards(self, coll: Collectives, tokens: torch.Tensor, pos: torch.Tensor, cache: KVCache,
                        parts: list[Part]) -> list[Forward]:
        """A decode step's forwards, one per part: tokens [B] at position ``pos`` (a one-element device tensor, the
        same for every sequence); each returns float32 logits of its sequences. Fixed shapes, no host sync:
        capturable. Attends over the whole cache (the runner allocates it to the prompt and the steps it replays),
        positions after ``pos`` masked out."""
        L = cache.length
        bias = torch.zeros(L, device=self.device).masked_fill(torch.arange(L, device=self.device) > pos,
                                                              float("-inf"))
        cos, sin = self.rope_table(L)
        rope = cos[pos].unsqueeze(1), sin[pos].unsqueeze(1)
        return [self._decode_part(Bufs(coll, j), tokens, pos, rope, bias, cache, p) for j, p in enumerate(parts)]

    # -- one micro-batch's forward (a generator: schedule.py) ---------------------------------------------------
    def _prefill_part(self, bufs: "Bufs", tokens: torch.Tensor, cache: KVCache, first_seq: int, p: Part):
        """Sequences / tokens ``p`` of a prefill. A part that starts inside its prompts (tok0 > 0) attends to the
        keys the part before it cached, so it must run after that part's attention (it does: parts start in
        order and the first one leads)."""
        S = tokens.shape[1]
        ids = tokens[p.seq0:p.seq1, p.tok0:p.tok1]
        b, n = ids.shape
        rows = slice(first_seq + p.seq0, first_seq + p.seq1)
        cos, sin = self.rope_table(p.tok1)
        pos = torch.arange(p.tok0, p.tok1, device=self.device).repeat(b)

        def attend(i: int, q, k, v):
            q, k, v = (t.reshape(b, n, t.shape[1], t.shape[2]).transpose(1, 2) for t in (q, k, v))
            cache.k[i][rows, :, p.tok0:p.tok1] = k
            cache.v[i][rows, :, p.tok0:p.tok1] = v
            if p.tok0 == 0:
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            else:  # queries at tok0.. see every cached key up to their own position
                g = q.shape[1] // k.shape[1]
                keys, values = (c[i][rows, :, :p.tok1].repeat_interleave(g, 1) for c in (cache.k, cache.v))
                mask = torch.ones(n, p.tok1, dtype=torch.bool, device=self.device).tril(p.tok0)
                o = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
            return o.transpose(1, 2).reshape(b * n, -1)

        last = (lambda h: h.view(b, n, -1)[:, -1]) if p.tok1 == S else None
        return (yield from self._forward(bufs, ids.reshape(-1), (cos[pos].unsqueeze(1), sin[pos].unsqueeze(1)),
                                         attend, last, uneven=True))

    def _decode_part(self, bufs: "Bufs", tokens: torch.Tensor, pos: torch.Tensor, rope, bias: torch.Tensor,
                     cache: KVCache, p: Part):
        rows = slice(p.seq0, p.seq1)
        B, d = p.seq1 - p.seq0, self.spec.head_dim
        scale = d ** -0.5

        def attend(i: int, q, k, v):
            kc, vc = cache.k[i][rows], cache.v[i][rows]
            kc.index_copy_(2, pos, k.unsqueeze(2))
            vc.index_copy_(2, pos, v.unsqueeze(2))
            qg = q.reshape(B, kc.shape[1], -1, d)  # query heads grouped by their KV head, no KV copies
            scores = torch.add(bias, qg @ kc.transpose(-1, -2), alpha=scale)  # scaled, masked, float32: 1 kernel
            return (torch.softmax(scores, dim=-1).to(self.dtype) @ vc).reshape(B, -1)

        return (yield from self._forward(bufs, tokens[rows], rope, attend, lambda h: h, uneven=False))

    def _forward(self, bufs: "Bufs", ids: torch.Tensor, rope, attend, last, uneven: bool):
        """Embedding, the layers, and (``last`` picks the rows) the LM head; None without a head. ``uneven``: the
        experts' tokens travel as routed (``expert_parallel``)."""
        h = yield from self._embed(bufs, ids)
        for i, lw in enumerate(self.layers):
            q, k, v = self.qkv(rms_norm(h, lw["attn_norm"], self.spec.rms_eps) @ lw["wqkv"].t(), rope)
            o = attend(i, q, k, v)
            buf = bufs("reduce", h.shape[0], self.spec.hidden)
            torch.matmul(o, lw["wo"].t(), out=buf)  # row-parallel: partial sums
            h = h + (yield from collective("all_reduce", f"attn{i}", buf))
            x = rms_norm(h, lw["mlp_norm"], self.spec.rms_eps)
            if self.spec.moe:
                h = h + (yield from self._moe(bufs, i, x, lw, uneven))
            else:
                buf = bufs("reduce", x.shape[0], self.spec.hidden)
                self.swiglu(x, lw, buf)
                h = h + (yield from collective("all_reduce", f"mlp{i}", buf))
        if last is None:
            return None
        return (yield from self.logits(bufs, last(h)))

    # -- the pieces (also used by seqpar.py) ---------------------------------------------------------------------
    def qkv(self, qkv: torch.Tensor, rope) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The QKV projection's output [T, ...] -> q, k (rotated together), v: [T, heads, head_dim] each."""
        sh, d = self.sh, self.spec.head_dim
        T = qkv.shape[0]
        qk = apply_rope(qkv[:, :(sh.heads + sh.kv_heads) * d].view(T, -1, d), *rope)
        return qk[:, :sh.heads], qk[:, sh.heads:], qkv[:, (sh.heads + sh.kv_heads) * d:].view(T, sh.kv_heads, d)

    def swiglu(self, x: torch.Tensor, lw: dict, out: torch.Tensor) -> torch.Tensor:
        """The (column-, then row-parallel) MLP: partial sums into ``out``."""
        inter = self.sh.intermediate
        gu = x @ lw["w13"].t()
        return torch.matmul(F.silu(gu[:, :inter]) * gu[:, inter:], lw["w2"].t(), out=out)

    def embed_partial(self, ids: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """Vocab-parallel lookup into ``out``: rows this rank does not hold (and negative ids) are zero."""
        vl = self.sh.vocab
        local = ids - self.rank * vl
        inside = (local >= 0) & (local < vl) & (ids >= 0)
        torch.index_select(self.embed, 0, local.clamp(0, vl - 1), out=out)
        return out.mul_(inside.unsqueeze(1).to(out.dtype))

    def _embed(self, bufs: "Bufs", ids: torch.Tensor):
        buf = self.embed_partial(ids, bufs("reduce", ids.numel(), self.spec.hidden))
        out = yield from collective("all_reduce", "embed", buf)
        return out.clone()  # the buffer is reused by the next all-reduce

    def moe_dense_now(self) -> bool:
        capturing = self.device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        return capturing if self.moe_dense == "auto" else self.moe_dense == "dense"

    def _moe(self, bufs: "Bufs", i: int, x: torch.Tensor, lw: dict, uneven: bool):
        """Expert parallel over a 1/world slice of the (replicated) tokens, slices all-gathered back."""
        gates = route(x, lw["router"], self.spec.top_k)
        w, r, T, H, el = self.world, self.rank, x.shape[0], self.spec.hidden, self.sh.experts
        if w == 1:
            return expert_mix(x, gates, lw["w13"], lw["w2"], self.moe_dense_now())
        s = math.ceil(T / w)  # this rank's slice of the tokens (padding rows have zero gates: routed nowhere)
        mine = slice(r * s, min((r + 1) * s, T))
        xs = x.new_zeros(s, H)
        gs = gates.new_zeros(s, w * el)
        n = max(0, mine.stop - mine.start)
        xs[:n], gs[:n] = x[mine], gates[mine]
        mixed = yield from self.expert_parallel(bufs, i, xs, gs, lw, uneven)
        gathered = bufs("gather", w * s, H)
        gathered[r * s:(r + 1) * s] = mixed
        out = yield from collective("all_gather", f"gather{i}", gathered, gathered[r * s:(r + 1) * s])
        return out[:T]

    def expert_parallel(self, bufs: "Bufs", i: int, xs: torch.Tensor, gs: torch.Tensor, lw: dict, uneven: bool):
        """Tokens ``xs`` [s, H] with gates ``gs`` [s, experts] to the ranks owning their experts and back; the gated
        sum [s, H]. ``uneven`` (prefill): each rank receives only the tokens routed to it, by ``all_to_all_v``
        after an all-gather of every rank's counts (read on the host); else (decode) a capacity-padded all-to-all
        of fixed sizes that a CUDA graph can capture (config.py says why neither drops a token)."""
        w, s, H, el = self.world, xs.shape[0], self.spec.hidden, self.sh.experts
        gs = gs.view(s, w, el)
        routed = gs.ne(0).any(-1)  # [s, w]: token j goes to rank p
        rank_in = routed.long().cumsum(0) - 1  # its row among the tokens going to p
        rows = torch.cat([xs.unsqueeze(1).expand(s, w, H), gs], dim=-1).reshape(s * w, H + el)
        if uneven:
            counts = bufs("counts", 4 * w * w).view(torch.uint8)[:4 * w * w].view(torch.int32).view(w, w)
            counts[self.rank] = routed.sum(0)
            sends = (yield from collective("all_gather", f"counts{i}", counts, counts[self.rank])).tolist()
            total, received = sum(sends[self.rank]), sum(row[self.rank] for row in sends)
            ahead = torch.tensor([0, *sends[self.rank][:-1]], device=xs.device).cumsum(0)  # rows before p's block
            # row of (token, rank) in the send buffer: p's tokens back to back in rank order; a last row catches the
            # tokens not routed, and is never read
            slot = torch.where(routed, rank_in + ahead, total)
            send = bufs("dispatch_send", total + 1, H + el)
            send.index_copy_(0, slot.view(-1), rows)
            recv = yield from collective("all_to_all_v", f"dispatch{i}", bufs("dispatch_recv", w, s + 1, H + el),
                                         send, counts=[[n * (H + el) for n in row] for row in sends])
            got = recv.view(-1, H + el)[:received]
            csend = bufs("combine_send", received, H)
            csend.copy_(expert_mix(got[:, :H], got[:, H:], lw["w13"], lw["w2"], self.moe_dense_now()))
            # back to each token's rank: rank p returns to rank q the rows q sent it, in q's order
            crecv = yield from collective("all_to_all_v", f"combine{i}", bufs("combine_recv", w, s + 1, H), csend,
                                          counts=[[sends[q][p] * H for q in range(w)] for p in range(w)])
        else:
            # dispatch: row j of block p = the j-th token of the slice routed to rank p; a last row per block
            # catches the tokens not routed there, and is never read
            slot = torch.where(routed, rank_in, s) + torch.arange(w, device=xs.device) * (s + 1)
            send = bufs("dispatch_send", w, s + 1, H + el)
            send.zero_()  # unused rows: zero gates, so no expert spends time on them
            send.view(-1, H + el).index_copy_(0, slot.view(-1), rows)
            recv = yield from collective("all_to_all", f"dispatch{i}", bufs("dispatch_recv", w, s + 1, H + el), send)
            got = recv[:, :s].reshape(w * s, H + el)
            y = expert_mix(got[:, :H], got[:, H:], lw["w13"], lw["w2"], self.moe_dense_now())
            csend = bufs("combine_send", w, s + 1, H)
            csend[:, :s] = y.view(w, s, H)
            crecv = yield from collective("all_to_all", f"combine{i}", bufs("combine_recv", w, s + 1, H), csend)
        back = crecv.view(-1, H).index_select(0, slot.view(-1)).view(s, w, H)
        mixed = torch.where(routed.unsqueeze(-1), back.float(), 0.0).sum(1)  # where, not *: unread rows may be NaN
        return mixed.to(xs.dtype)

    def logits(self, bufs: "Bufs", h_last: torch.Tensor):
        """Vocab-parallel LM head, all-gathered: [b, vocab] float32."""
        b = h_last.shape[0]
        out = bufs("logits", self.world, b, self.sh.vocab)
        torch.matmul(rms_norm(h_last, self.final_norm, self.spec.rms_eps), self.lm_head.t(), out=out[self.rank])
        yield from collective("all_gather", "logits", out, out[self.rank])
        return out.permute(1, 0, 2).reshape(b, -1).to(torch.float32, copy=True)  # never a view of the buffer


class Bufs:
    """The communication buffers of one micro-batch (``calls.suffix`` names them)."""

    def __init__(self, coll: Collectives, mb: int):
        self.coll, self.suffix = coll, suffix(mb)

    def __call__(self, name: str, *shape: int) -> torch.Tensor:
        return self.coll.buffer(name + self.suffix, *shape)
