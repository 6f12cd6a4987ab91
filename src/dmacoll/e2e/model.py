"""A Llama / Mixtral decoder stack in plain torch, sharded over the ranks of a ``Collectives`` (see config.py for
the parallel layout): RMSNorm, RoPE (with Llama 3's frequency scaling), grouped-query attention, a KV cache,
prefill and decode. Random weights, drawn per full tensor from a seed and then sliced, so any world size holds
the same model as world 1 (the unsharded reference in the tests).

Activations are 2-D ``[tokens, hidden]``. Decode attends over the whole cache with a mask built from a position
held on the device, so a decode step has fixed shapes and no host synchronisation: it can be captured in a
CUDA graph and replayed, each replay advancing the position by one.
"""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .collectives import Collectives
from .config import ModelSpec


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


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
    """x: [tokens, heads, head_dim]; cos/sin: [tokens, head_dim / 2] (Llama's rotate-half layout)."""
    half = x.shape[-1] // 2
    xf = x.float()
    x1, x2 = xf[..., :half], xf[..., half:]
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(x.dtype)


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
        self._rope = torch.zeros(0, d // 2, device=self.device)
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
        """cos, sin for positions 0..length-1 (grown on demand, outside any graph capture)."""
        if self._rope.shape[0] < length:
            angles = torch.outer(torch.arange(length, device=self.device, dtype=torch.float32), self.inv_freq)
            self._rope = angles
            self._cos, self._sin = angles.cos(), angles.sin()
        return self._cos, self._sin

    # -- forward -------------------------------------------------------------------------------------------
    def prefill(self, coll: Collectives, tokens: torch.Tensor, cache: KVCache, first_seq: int = 0) -> torch.Tensor:
        """tokens [b, S]: whole prompts for cache rows first_seq..first_seq+b-1; float32 logits of their last
        tokens [b, vocab]."""
        b, S = tokens.shape
        cos, sin = self.rope_table(S)
        pos = torch.arange(S, device=self.device).repeat(b)

        def attend(i: int, q, k, v):
            q, k, v = (t.view(b, S, t.shape[1], t.shape[2]).transpose(1, 2) for t in (q, k, v))
            cache.k[i][first_seq:first_seq + b, :, :S] = k
            cache.v[i][first_seq:first_seq + b, :, :S] = v
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            return o.transpose(1, 2).reshape(b * S, -1)

        h = self._layers(coll, self._embed(coll, tokens.reshape(-1)), cos[pos], sin[pos], attend)
        return self._logits(coll, h.view(b, S, -1)[:, -1])

    def decode(self, coll: Collectives, tokens: torch.Tensor, pos: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """tokens [B] at position ``pos`` (a one-element device tensor, the same for every sequence); float32
        logits [B, vocab]. Fixed shapes, no host sync: capturable."""
        B = tokens.shape[0]
        L = cache.length
        cos, sin = self.rope_table(L)
        mask = torch.arange(L, device=self.device) <= pos  # attend to positions 0..pos
        scale = self.spec.head_dim ** -0.5

        def attend(i: int, q, k, v):
            kc, vc = cache.k[i], cache.v[i]
            kc.index_copy_(2, pos, k.unsqueeze(2))
            vc.index_copy_(2, pos, v.unsqueeze(2))
            hkv = kc.shape[1]
            qg = q.view(B, hkv, -1, q.shape[-1])  # query heads grouped by their KV head, no KV copies
            scores = (qg @ kc.transpose(-1, -2)).float() * scale
            p = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1).to(self.dtype)
            return (p @ vc).reshape(B, -1)

        h = self._layers(coll, self._embed(coll, tokens), cos[pos].expand(B, -1), sin[pos].expand(B, -1), attend)
        return self._logits(coll, h)

    def _embed(self, coll: Collectives, ids: torch.Tensor) -> torch.Tensor:
        """Vocab-parallel lookup: rows this rank does not hold are zero, the all-reduce fills them in."""
        vl = self.sh.vocab
        local = ids - self.rank * vl
        inside = (local >= 0) & (local < vl)
        buf = coll.buffer("reduce", ids.numel(), self.spec.hidden)
        torch.index_select(self.embed, 0, local.clamp(0, vl - 1), out=buf)
        buf.mul_(inside.unsqueeze(1).to(buf.dtype))
        return coll.all_reduce(buf).clone()  # the buffer is reused by the next all-reduce

    def _layers(self, coll: Collectives, h: torch.Tensor, cos, sin, attend) -> torch.Tensor:
        s, sh, d = self.spec, self.sh, self.spec.head_dim
        T = h.shape[0]
        for i, lw in enumerate(self.layers):
            qkv = rms_norm(h, lw["attn_norm"], s.rms_eps) @ lw["wqkv"].t()
            q, k, v = qkv.split([sh.heads * d, sh.kv_heads * d, sh.kv_heads * d], dim=-1)
            q = apply_rope(q.view(T, sh.heads, d), cos, sin)
            k = apply_rope(k.view(T, sh.kv_heads, d), cos, sin)
            o = attend(i, q, k, v.reshape(T, sh.kv_heads, d))
            buf = coll.buffer("reduce", T, s.hidden)
            torch.matmul(o, lw["wo"].t(), out=buf)  # row-parallel: partial sums
            h = h + coll.all_reduce(buf)
            x = rms_norm(h, lw["mlp_norm"], s.rms_eps)
            h = h + (self._moe(coll, x, lw) if s.moe else self._mlp(coll, x, lw))
        return h

    def _mlp(self, coll: Collectives, x: torch.Tensor, lw: dict) -> torch.Tensor:
        inter = self.sh.intermediate
        gu = x @ lw["w13"].t()
        buf = coll.buffer("reduce", x.shape[0], self.spec.hidden)
        torch.matmul(F.silu(gu[:, :inter]) * gu[:, inter:], lw["w2"].t(), out=buf)
        return coll.all_reduce(buf)

    def _moe(self, coll: Collectives, x: torch.Tensor, lw: dict) -> torch.Tensor:
        """Expert parallel with a capacity-padded all-to-all (config.py says why it drops nothing)."""
        capturing = self.device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        dense = capturing if self.moe_dense == "auto" else self.moe_dense == "dense"
        gates = route(x, lw["router"], self.spec.top_k)
        w, r, T, H, el = self.world, self.rank, x.shape[0], self.spec.hidden, self.sh.experts
        if w == 1:
            return expert_mix(x, gates, lw["w13"], lw["w2"], dense)
        s = math.ceil(T / w)  # this rank's slice of the tokens (padding rows have zero gates: routed nowhere)
        mine = slice(r * s, min((r + 1) * s, T))
        xs = x.new_zeros(s, H)
        gs = gates.new_zeros(s, w, el)
        n = max(0, mine.stop - mine.start)
        xs[:n], gs[:n] = x[mine], gates[mine].view(n, w, el)
        # dispatch: row j of block p = the j-th token of the slice routed to rank p; a last row per block
        # catches the tokens not routed there, and is never read
        routed = gs.ne(0).any(-1)  # [s, w]
        slot = torch.where(routed, routed.long().cumsum(0) - 1, s) + torch.arange(w, device=x.device) * (s + 1)
        rows = torch.cat([xs.unsqueeze(1).expand(s, w, H), gs], dim=-1).reshape(s * w, H + el)
        send = coll.buffer("dispatch_send", w, s + 1, H + el)
        send.zero_()  # unused rows: zero gates, so no expert spends time on them
        send.view(-1, H + el).index_copy_(0, slot.view(-1), rows)
        recv = coll.all_to_all(coll.buffer("dispatch_recv", w, s + 1, H + el), send)
        got = recv[:, :s].reshape(w * s, H + el)
        y = expert_mix(got[:, :H], got[:, H:], lw["w13"], lw["w2"], dense)
        csend = coll.buffer("combine_send", w, s + 1, H)
        csend[:, :s] = y.view(w, s, H)
        crecv = coll.all_to_all(coll.buffer("combine_recv", w, s + 1, H), csend)
        back = crecv.view(-1, H).index_select(0, slot.view(-1)).view(s, w, H)
        mixed = torch.where(routed.unsqueeze(-1), back.float(), 0.0).sum(1)  # where, not *: unread rows may be NaN
        gathered = coll.buffer("gather", w * s, H)
        gathered[r * s:(r + 1) * s] = mixed.to(x.dtype)
        return coll.all_gather(gathered, gathered[r * s:(r + 1) * s])[:T]

    def _logits(self, coll: Collectives, h_last: torch.Tensor) -> torch.Tensor:
        """Vocab-parallel LM head, all-gathered: [b, vocab] float32."""
        b = h_last.shape[0]
        out = coll.buffer("logits", self.world, b, self.sh.vocab)
        torch.matmul(rms_norm(h_last, self.final_norm, self.spec.rms_eps), self.lm_head.t(), out=out[self.rank])
        coll.all_gather(out, out[self.rank])
        return out.permute(1, 0, 2).reshape(b, -1).to(torch.float32, copy=True)  # never a view of the buffer

    # -- whole requests ----------------------------------------------------------------------------------------
    def prefill_batch(self, coll: Collectives, prompts: torch.Tensor, cache: KVCache, chunks: list[int]):
        """All prompts [B, S], ``chunks`` sequences per forward; the logits of every last token [B, vocab]."""
        out, first = [], 0
        for n in chunks:
            out.append(self.prefill(coll, prompts[first:first + n], cache, first))
            first += n
        return torch.cat(out)
