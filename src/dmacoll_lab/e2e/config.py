"""Model shapes for `dmacoll e2e` (real configurations, random weights), how they shard, and what a run costs.

Pure Python (no torch): the CLI's --dry-run, the tests and the notebook use it on any machine.

Parallelism (one process group of ``world`` ranks):

* attention: tensor parallel, heads split (Megatron column-parallel QKV, row-parallel output projection),
  KV heads split too (needs kv_heads % world == 0), then an **all-reduce** of the output projection;
* dense MLP (Llama): column-parallel gate/up, row-parallel down, then an **all-reduce**;
* embedding: vocab-parallel lookup then an **all-reduce**; LM head: vocab-parallel logits, **all-gathered**;
* MoE (Mixtral): **expert parallel**, experts split over the ranks. The tokens are the same on every rank after
  the attention all-reduce, so each rank takes a 1/world slice of them (padded to a multiple of world) and sends
  each token once to every rank owning one of its top-k experts; the owners apply their experts weighted by the
  router's gates, a second exchange brings the results back, and an **all-gather** of the slices restores the
  full token set. No token is ever dropped. A prefill sends only the routed tokens: an **all-gather** of every
  rank's counts (read on the host: one sync per layer), then an **all_to_all_v** each way, whose bytes follow the
  routing. A decode step, captured in a CUDA graph, cannot read counts on the host: it sends capacity-padded
  **all-to-alls** (capacity = the slice, fixed sizes; padding travels too).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Optional

from dmacoll.lab_api import InvalidArgument

LLAMA3_ROPE_SCALING = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 8192}

# The published configs (Hugging Face config.json of each model), the fields a decoder needs.
MODELS: dict[str, dict] = {
    "llama-3.1-8b": dict(arch="llama", hidden=4096, heads=32, kv_heads=8, head_dim=128, intermediate=14336,
                         vocab=128256, layers=32, rope_theta=500000.0, rope_scaling=LLAMA3_ROPE_SCALING,
                         rms_eps=1e-5, max_positions=131072, hf_id="meta-llama/Llama-3.1-8B"),
    "llama-3.1-70b": dict(arch="llama", hidden=8192, heads=64, kv_heads=8, head_dim=128, intermediate=28672,
                          vocab=128256, layers=80, rope_theta=500000.0, rope_scaling=LLAMA3_ROPE_SCALING,
                          rms_eps=1e-5, max_positions=131072, hf_id="meta-llama/Llama-3.1-70B"),
    "mixtral-8x7b": dict(arch="mixtral", hidden=4096, heads=32, kv_heads=8, head_dim=128, intermediate=14336,
                         vocab=32000, layers=32, experts=8, top_k=2, rope_theta=1e6, rope_scaling=None,
                         rms_eps=1e-5, max_positions=32768, hf_id="mistralai/Mixtral-8x7B-v0.1"),
}

# 4 layers x batches {1, 8, 32, 128} x prompts {128, 2048}: estimated 144 s on 2x H200 (plan_text prints it; the
# {1, 8, 32} grid was estimated at 101 s and took 35 s there)
DEFAULTS = dict(models=list(MODELS), layers=4, batches=[1, 8, 32, 128], prompts=[128, 2048], impls=["nccl", "dma"],
                schedules=["serial", "microbatch", "seqpar"], pieces=4, overlap_path="dma", breakdown=True,
                decode_steps=16, repeats=3, output_len=128, chunk_tokens=8192, dtype="bfloat16", seed=0,
                check_dtype="float32", rtol=1e-3, atol=1e-3)

POINT_COLUMNS = ["model", "arch", "layers", "world", "parallel", "impl", "schedule", "pieces", "microbatches",
                 "dtype", "batch", "prompt_len", "chunk_tokens", "decode_steps", "output_len", "collectives_per_step"]
# where the time goes, per phase (ttft: the prefill of the batch; decode: one step): the schedule's compute alone
# (collectives replaced by no-ops), its communication alone (its own calls back to back) and C3's metrics of the
# two against the measured time; the floors: the step's bytes at the measured copy rate, the prefill's GEMM
# FLOPs at the measured GEMM rate (one measurement per run)
BREAKDOWN_COLUMNS = [f"{phase}_{m}" for phase in ("ttft", "decode") for m in
                     ("compute_ms", "comm_ms", "ideal_speedup", "realized_speedup", "fraction_of_ideal",
                      "fraction_of_ideal_raw")]
FLOOR_COLUMNS = ["copy_GBps", "gemm_TFLOPs", "decode_floor_ms", "decode_compute_over_floor", "prefill_floor_ms",
                 "prefill_compute_over_floor"]
MEASURED_COLUMNS = ["ttft_ms", "ttft_ms_p10", "ttft_ms_p90", "decode_ms", "decode_ms_p10", "decode_ms_p90",
                    "prefill_tok_s", "decode_tok_s", "e2e_tok_s", *BREAKDOWN_COLUMNS, *FLOOR_COLUMNS,
                    "prefill_calls", "decode_calls", "calls_ok", "logits_max_abs_diff", "logits_ref_max_abs",
                    "argmax_agree", "check_dtype", "check_max_abs_diff", "logits_ok"]
# a row's place among its point's measurements (alternating per point: bench.run_point); what each phase ran (a
# ``phased`` row: the schedule per phase chosen from the others, phases.py, and why); the data path each op's calls
# took while the row was measured (dmacoll's: 'all_reduce sm x120, ...'; '' for NCCL and for a phased row, which
# measured nothing itself: its prefill's and decode's rows say)
PHASE_COLUMNS = ["measured_order", "prefill_schedule", "decode_schedule", "phase_reason", "data_paths"]
E2E_COLUMNS = POINT_COLUMNS + PHASE_COLUMNS + MEASURED_COLUMNS + ["status"]


@dataclass(frozen=True)
class ModelSpec:
    name: str
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    layers: int
    arch: str = "llama"
    experts: int = 0
    top_k: int = 0
    rope_theta: float = 10000.0
    rope_scaling: Optional[dict] = field(default=None, hash=False, compare=False)
    rms_eps: float = 1e-5
    max_positions: int = 4096
    hf_id: str = ""

    @property
    def moe(self) -> bool:
        return self.experts > 0

    def shards(self, world: int) -> "Shards":
        """Per-rank sizes; InvalidArgument saying what does not divide."""
        need = {"heads": self.heads, "kv_heads": self.kv_heads, "vocab": self.vocab}
        need.update({"experts": self.experts} if self.moe else {"intermediate": self.intermediate})
        bad = [f"{k}={v}" for k, v in need.items() if v % world]
        if bad:
            raise InvalidArgument(f"{self.name} cannot be split over {world} ranks: {', '.join(bad)} not divisible "
                             f"by {world}")
        return Shards(heads=self.heads // world, kv_heads=self.kv_heads // world, vocab=self.vocab // world,
                      intermediate=self.intermediate if self.moe else self.intermediate // world,
                      experts=self.experts // world)

    def params_per_rank(self, world: int) -> int:
        """Weights one rank holds (embedding and LM head vocab-parallel)."""
        s, h, d = self.shards(world), self.hidden, self.head_dim
        attn = h * (s.heads + 2 * s.kv_heads) * d + s.heads * d * h
        mlp = s.experts * 3 * h * s.intermediate + self.experts * h if self.moe else 3 * h * s.intermediate
        return self.layers * (attn + mlp + 2 * h) + 2 * s.vocab * h + h

    def active_params_per_rank_token(self, world: int) -> float:
        """Weights one token touches on one rank, on average (MoE: top_k of the experts, spread over ranks)."""
        s, h = self.shards(world), self.hidden
        attn = h * (s.heads + 2 * s.kv_heads) * self.head_dim + s.heads * self.head_dim * h
        mlp = self.top_k * 3 * h * self.intermediate / world if self.moe else 3 * h * s.intermediate
        return self.layers * (attn + mlp)

    def collectives_per_forward(self, prefill: bool = False) -> dict[str, int]:
        """Calls per forward pass: a decode step, or (``prefill``) a prefill chunk (MoE: the counts' all-gathers
        and the uneven exchanges of the module docstring)."""
        if self.moe and prefill:
            return {"all_reduce": 1 + self.layers, "all_to_all_v": 2 * self.layers, "all_gather": 2 * self.layers + 1}
        if self.moe:
            return {"all_reduce": 1 + self.layers, "all_to_all": 2 * self.layers, "all_gather": self.layers + 1}
        return {"all_reduce": 1 + 2 * self.layers, "all_gather": 1}


@dataclass(frozen=True)
class Shards:
    heads: int
    kv_heads: int
    vocab: int
    intermediate: int
    experts: int


def spec(name: str, layers: Optional[int] = None) -> ModelSpec:
    """A model of MODELS, optionally cut to its first ``layers`` layers (a slice that fits the time budget)."""
    if name not in MODELS:
        raise InvalidArgument(f"unknown model {name!r}; choose from {sorted(MODELS)}")
    full = ModelSpec(name=name, **MODELS[name])
    if layers is None:
        return full
    if not 1 <= layers <= full.layers:
        raise InvalidArgument(f"{name} has {full.layers} layers; --layers must be between 1 and {full.layers}")
    return replace(full, layers=layers)


def prefill_chunks(batch: int, prompt: int, chunk_tokens: int) -> list[int]:
    """Sequences per prefill forward: whole prompts, at most ``chunk_tokens`` tokens (at least one prompt)."""
    per = max(1, chunk_tokens // prompt)
    return [min(per, batch - i) for i in range(0, batch, per)]


def max_tokens(batches, prompts, chunk_tokens: int) -> int:
    """The most tokens one forward handles over a grid (the size of the shared buffers)."""
    prefill = max(max(prefill_chunks(b, p, chunk_tokens)) * p for b in batches for p in prompts)
    return max(prefill, max(batches))


def buffer_elements(s: ModelSpec, world: int, tokens: int, rows: int) -> dict[str, int]:
    """Elements of each reusable communication buffer (model dtype) for up to ``tokens`` tokens per forward
    and ``rows`` logits rows (sequences). For dmacoll they live in the symmetric heap: zero-copy collectives."""
    sh = s.shards(world)
    out = {"reduce": tokens * s.hidden, "logits": world * rows * sh.vocab}
    if s.moe:
        slice_ = math.ceil(tokens / world)
        out.update(counts=4 * world * world,  # int32 [world, world] in any dtype of >= 1 byte
                   dispatch_send=world * (slice_ + 1) * (s.hidden + sh.experts),
                   dispatch_recv=world * (slice_ + 1) * (s.hidden + sh.experts),
                   combine_send=world * (slice_ + 1) * s.hidden, combine_recv=world * (slice_ + 1) * s.hidden,
                   gather=world * slice_ * s.hidden)
    return out


def merged_buffers(specs, world: int, tokens: int, rows: int) -> dict[str, int]:
    """The largest size of each buffer over several models (one set serves them all, one after the other)."""
    out: dict[str, int] = {}
    for s in specs:
        for k, v in buffer_elements(s, world, tokens, rows).items():
            out[k] = max(out.get(k, 0), v)
    return out


# -- what a run costs (H200-ish rates; a plan, not a prediction to the percent) -------------------------------
GEMM_FLOPS = 5.0e14       # bf16 dense, achieved
HBM_BYTES_S = 3.5e12      # decode reads every weight and the KV cache once per step
STEP_OVERHEAD_S = 40e-6   # per collective in a forward (latency-bound sizes)
POINT_OVERHEAD_S = 1.2    # graph capture, cache allocation, barriers, the logits check
STARTUP_S = 35.0          # processes, CUDA contexts, NCCL and dmacoll set-up
MODEL_SETUP_S = 3.0       # random weights on the GPU


def decode_bytes(s: ModelSpec, world: int, batch: int, live: float, elsize: int) -> float:
    """What one decode step must read on one rank: every weight it holds but the embedding table (a lookup reads
    ``batch`` rows of it), and the live KV cache (``live`` positions per sequence)."""
    sh = s.shards(world)
    weights = s.params_per_rank(world) - (sh.vocab - batch) * s.hidden
    kv = 2 * s.layers * batch * sh.kv_heads * live * s.head_dim
    return (weights + kv) * elsize


def prefill_gemm_flops(s: ModelSpec, world: int, batch: int, prompt: int) -> float:
    """The GEMM FLOPs of one rank's prefill: every token through the layers' projections (MoE: its top-k experts,
    spread over the ranks), the LM head for the last tokens. Attention's own FLOPs are not counted."""
    return 2 * batch * prompt * s.active_params_per_rank_token(world) + 2 * batch * s.shards(world).vocab * s.hidden


def point_seconds(s: ModelSpec, world: int, batch: int, prompt: int, cfg: dict, schedule: str = "serial") -> float:
    """One (model, impl, schedule, batch, prompt): prefill warm-up + repeats, decode warm-up + repeats x steps;
    with the breakdown, twice more of each (compute alone, communication alone)."""
    calls, prefill_calls = (sum(s.collectives_per_forward(p).values()) for p in (False, True))
    sh = s.shards(world)
    prefill_flops = prefill_gemm_flops(s, world, batch, prompt) + \
        4 * batch * prompt * prompt * sh.heads * s.head_dim * s.layers / 2  # causal attention
    chunks = len(prefill_chunks(batch, prompt, cfg["chunk_tokens"]))
    prefill = prefill_flops / GEMM_FLOPS + chunks * prefill_calls * STEP_OVERHEAD_S * 2
    step = decode_bytes(s, world, batch, prompt + cfg["decode_steps"] + 4, 2) / HBM_BYTES_S + calls * STEP_OVERHEAD_S
    runs = cfg["repeats"] + 1
    kinds = 3 if cfg.get("breakdown", True) else 1
    decode = 0.0 if schedule == "seqpar" else runs * (cfg["decode_steps"] + 1) * step
    return kinds * (runs * prefill + decode) + POINT_OVERHEAD_S


def estimate(cfg: dict, world: int) -> dict:
    """The plan of a run and its estimated duration in seconds."""
    specs = [spec(m, cfg["layers"]) for m in cfg["models"]]
    points = [(s, b, p) for s in specs for b in cfg["batches"] for p in cfg["prompts"]]
    schedules = cfg.get("schedules", ["serial"])
    seconds = STARTUP_S + MODEL_SETUP_S * len(specs) + len(cfg["impls"]) * sum(
        point_seconds(s, world, b, p, cfg, sched) for s, b, p in points for sched in schedules)
    return {"models": [s.name for s in specs], "points": len(points) * len(cfg["impls"]) * len(schedules),
            "seconds": seconds, "specs": specs}


def plan_text(cfg: dict, world: int) -> str:
    """What `dmacoll e2e` will run, per model: shards, collectives per step, memory, estimated time."""
    est = estimate(cfg, world)
    schedules = cfg.get("schedules", ["serial"])
    lines = [f"dmacoll e2e: {len(est['specs'])} model(s) x batches {cfg['batches']} x prompts {cfg['prompts']} x "
             f"{' '.join(cfg['impls'])} x schedules {' '.join(schedules)} on {world} rank(s) = {est['points']} "
             f"points; {cfg['layers']} layer(s) each, {cfg['dtype']}, decode {cfg['decode_steps']} steps in a CUDA "
             f"graph, {cfg['repeats']} repeats" + (f", seqpar in {cfg['pieces']} pieces" if "seqpar" in schedules
                                                  else "") +
             (f"; dma's overlapped calls on path {cfg.get('overlap_path', 'dma')}" if set(schedules) - {"serial"}
              else "") + ("" if cfg.get("breakdown", True) else
                                                              ", no compute / communication breakdown")]
    for s in est["specs"]:
        sh = s.shards(world)
        par = f"TP{world}" + (f" + EP{world} ({sh.experts} experts/rank, top-{s.top_k})" if s.moe else "")
        calls = {p: ", ".join(f"{v} {k}" for k, v in s.collectives_per_forward(p).items()) for p in (True, False)}
        per = calls[False] + " per forward (serial)" if calls[True] == calls[False] else \
            f"{calls[True]} per prefill forward, {calls[False]} per decode step (serial)"
        gb = s.params_per_rank(world) * 2 / 1e9
        lines.append(f"  {s.name}: {par}; per rank {sh.heads} heads, {sh.kv_heads} KV heads, vocab {sh.vocab}; "
                     f"{per}; weights {gb:.1f} GB/rank")
    lines.append(f"estimated {est['seconds']:.0f} s ({est['seconds'] / 60:.1f} min)")
    return "\n".join(lines)


def hf_config(s: ModelSpec) -> dict:
    """A Hugging Face config.json for the same shapes (``vllm ... --load-format dummy`` needs no weights)."""
    arch = "MixtralForCausalLM" if s.moe else "LlamaForCausalLM"
    cfg = {"architectures": [arch], "model_type": "mixtral" if s.moe else "llama", "hidden_size": s.hidden,
           "intermediate_size": s.intermediate, "num_attention_heads": s.heads, "num_key_value_heads": s.kv_heads,
           "head_dim": s.head_dim, "num_hidden_layers": s.layers, "vocab_size": s.vocab,
           "max_position_embeddings": s.max_positions, "rms_norm_eps": s.rms_eps, "rope_theta": s.rope_theta,
           "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "bfloat16", "bos_token_id": 1,
           "eos_token_id": 2}
    if s.rope_scaling:
        cfg["rope_scaling"] = {"rope_type": "llama3", **s.rope_scaling}
    if s.moe:
        cfg.update(num_local_experts=s.experts, num_experts_per_tok=s.top_k)
    return cfg
