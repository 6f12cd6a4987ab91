"""`dmacoll e2e`: LLM inference (prefill + decode) with NCCL or dmacoll collectives, one process per GPU.

Per (model, batch, prompt length) and per implementation, on the same weights and inputs:

* TTFT: the whole batch's prefill (``chunk_tokens`` tokens per forward, whole prompts) up to the logits of every
  prompt's last token, eager, CUDA events, median of ``repeats`` after one warm-up; the slowest rank's time;
* decode: one step (one token per sequence) captured in a CUDA graph; ``decode_steps`` replays back to back
  between two events, per-step time, median of ``repeats``; the slowest rank's;
* throughput: prefill tokens/s = batch x prompt / TTFT, decode tokens/s = batch / step time, and
  e2e tokens/s = batch x output_len / (TTFT + (output_len - 1) x step) (derived from the two, not run);
* outputs: the first implementation in ``impls`` (NCCL by default) is the reference. Per model, before the timed
  points, every implementation runs one untimed prefill + decode step (smallest batch and prompt) on the same
  weights in ``check_dtype`` (float32 by default); every other one must give the reference's logits within
  ``|a - b| <= atol x rms(ref) + rtol x |ref|`` per element (``logits_ok``, ``check_max_abs_diff``). The check
  is in float32 because in bfloat16 the implementations legitimately differ by roundings: NCCL's ring rounds
  every partial sum to bfloat16 (world - 1 times), dmacoll adds in float32 and rounds once; over layers that
  is a few bfloat16 ulps of the logits, and in a MoE a near-tied router can send a token to another expert.
  For the timed (``dtype``) runs the max abs diff of their logits and the share of equal argmax (greedy) tokens
  are recorded as information.

Prompts and decode tokens are seeded random ids, the same on every rank and for every implementation; decode
feeds fixed tokens (not greedy ones) so that both implementations see the same inputs at every step.
"""
from __future__ import annotations

import statistics
from typing import Optional

from ..bench.harness import Rank, elapsed_us
from .config import E2E_COLUMNS, MEASURED_COLUMNS, ModelSpec, max_tokens, merged_buffers, prefill_chunks, spec

__all__ = ["E2E_COLUMNS", "run_e2e"]


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def compare(ref, got, rtol: float, atol: float) -> dict:
    """Logits agreement (float tensors of the same shape)."""
    import torch

    diff = (got - ref).abs()
    bound = atol * ref.pow(2).mean().sqrt() + rtol * ref.abs()
    return {"logits_max_abs_diff": float(diff.max()), "logits_ref_max_abs": float(ref.abs().max()),
            "logits_ok": bool(torch.isfinite(got).all() and (diff <= bound).all()),
            "argmax_agree": float((got.argmax(-1) == ref.argmax(-1)).float().mean())}


def derived(batch: int, prompt: int, output_len: int, ttft_ms: float, decode_ms: float) -> dict:
    ttft_s, step_s = ttft_ms / 1e3, decode_ms / 1e3
    return {"prefill_tok_s": batch * prompt / ttft_s, "decode_tok_s": batch / step_s,
            "e2e_tok_s": batch * output_len / (ttft_s + (output_len - 1) * step_s)}


class Runner(Rank):
    """The harness's rank (stream, host group, slowest-rank reduction) with the models' specs and one set of
    collectives per implementation, their buffers sized for the largest point."""

    def __init__(self, rank: int, world: int, cfg: dict):
        from .collectives import make

        super().__init__(rank, world, dtype=cfg["dtype"])
        self.cfg = cfg
        self.specs = [spec(m, cfg["layers"]) for m in cfg["models"]]
        tokens = max_tokens(cfg["batches"], cfg["prompts"], cfg["chunk_tokens"])
        elements = merged_buffers(self.specs, world, tokens, max(cfg["batches"]))
        self.colls = {impl: make(impl, self.device, elements, self.dtype) for impl in cfg["impls"]}


def measure(rn: Runner, model, impl: str, batch: int, prompt: int, inputs: tuple) -> tuple[dict, tuple]:
    """TTFT and decode step time of one implementation; also its logits (prefill, first decode step)."""
    import torch

    cfg, coll = rn.cfg, rn.colls[impl]
    prompts, step_tokens = inputs
    steps, repeats = cfg["decode_steps"], cfg["repeats"]
    chunks = prefill_chunks(batch, prompt, cfg["chunk_tokens"])
    cache = model.new_cache(batch, prompt + steps + 4)

    def timed(fn) -> float:
        rn.barrier()
        return elapsed_us(fn) / 1e3  # ms

    model.prefill_batch(coll, prompts, cache, chunks)  # warm-up (and NCCL's eager call before capture)
    ttft = rn.slowest([timed(lambda: model.prefill_batch(coll, prompts, cache, chunks)) for _ in range(repeats)])
    prefill_logits = model.prefill_batch(coll, prompts, cache, chunks)

    tokens = step_tokens.clone()
    pos = torch.full((1,), prompt, dtype=torch.long, device=rn.device)

    def step():
        out = model.decode(coll, tokens, pos, cache)
        pos.add_(1)
        return out

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # eager once: kernels chosen, NCCL and dmacoll warmed up
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    rn.barrier()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_logits = step()
    torch.cuda.synchronize()
    rn.barrier()
    pos.fill_(prompt)
    graph.replay()
    decode_logits = static_logits.clone()

    def replays():
        for _ in range(steps):
            graph.replay()

    per_step = []
    for _ in range(repeats):
        pos.fill_(prompt)
        per_step.append(timed(replays) / steps)
    decode = rn.slowest(per_step)
    del graph
    row = {"ttft_ms": statistics.median(ttft), "ttft_ms_p10": _pct(ttft, 0.1), "ttft_ms_p90": _pct(ttft, 0.9),
           "decode_ms": statistics.median(decode), "decode_ms_p10": _pct(decode, 0.1),
           "decode_ms_p90": _pct(decode, 0.9)}
    row.update(derived(batch, prompt, cfg["output_len"], row["ttft_ms"], row["decode_ms"]))
    return row, (prefill_logits, decode_logits)


def logits_once(rn: Runner, model, coll, inputs: tuple, batch: int, prompt: int) -> tuple:
    """Untimed, eager: logits of a prefill and of the first decode step."""
    import torch

    prompts, step_tokens = inputs
    cache = model.new_cache(batch, prompt + 4)
    pre = model.prefill_batch(coll, prompts, cache, prefill_chunks(batch, prompt, rn.cfg["chunk_tokens"]))
    dec = model.decode(coll, step_tokens, torch.full((1,), prompt, dtype=torch.long, device=rn.device), cache)
    return pre, dec


def agreement(ref: tuple, got: tuple, rtol: float, atol: float) -> dict:
    """``compare`` over the (prefill, decode) logits pairs: the worse of the two."""
    both = [compare(r.float(), g.float(), rtol, atol) for r, g in zip(ref, got)]
    return {"logits_max_abs_diff": max(c["logits_max_abs_diff"] for c in both),
            "logits_ref_max_abs": max(c["logits_ref_max_abs"] for c in both),
            "logits_ok": all(c["logits_ok"] for c in both),
            "argmax_agree": min(c["argmax_agree"] for c in both)}


def check_model(rn: Runner, s: ModelSpec) -> dict:
    """Per implementation after the first: {"check_max_abs_diff", "logits_ok"} of the ``check_dtype`` run."""
    import torch

    from .collectives import make
    from .model import Model

    cfg = rn.cfg
    dtype = getattr(torch, cfg["check_dtype"])
    batch, prompt = min(cfg["batches"]), min(cfg["prompts"])
    model = Model(s, rn.rank, rn.world, rn.device, dtype, cfg["seed"])
    elements = merged_buffers([s], rn.world, max_tokens([batch], [prompt], cfg["chunk_tokens"]), batch)
    inputs = point_inputs(rn, s, batch, prompt)
    out, ref = {}, None
    for impl in cfg["impls"]:
        coll = make(impl, rn.device, elements, dtype)
        try:
            logits = logits_once(rn, model, coll, inputs, batch, prompt)
            if rn.device.type == "cuda":
                torch.cuda.synchronize()
        finally:
            rn.barrier()
            coll.close()
        if ref is None:
            ref = logits
            continue
        a = agreement(ref, logits, cfg["rtol"], cfg["atol"])
        out[impl] = {"check_max_abs_diff": a["logits_max_abs_diff"], "logits_ok": a["logits_ok"]}
        if rn.rank == 0:
            print(f"{s.name:14s} {impl:5s} {cfg['check_dtype']} check (batch {batch}, prompt {prompt}): logits max "
                  f"diff {a['logits_max_abs_diff']:.3g} of max {a['logits_ref_max_abs']:.3g} "
                  f"({'ok' if a['logits_ok'] else 'MISMATCH'})", flush=True)
    del model
    torch.cuda.empty_cache()
    return out


def point_inputs(rn: Runner, s: ModelSpec, batch: int, prompt: int) -> tuple:
    """Seeded prompts and decode tokens, the same on every rank and for every implementation."""
    import torch

    gen = torch.Generator(device=rn.device).manual_seed(rn.cfg["seed"] * 7919 + batch * 31 + prompt)
    return (torch.randint(0, s.vocab, (batch, prompt), generator=gen, device=rn.device),
            torch.randint(0, s.vocab, (batch,), generator=gen, device=rn.device))


def point_fields(s: ModelSpec, rn: Runner, impl: str, batch: int, prompt: int) -> dict:
    cfg = rn.cfg
    return {"model": s.name, "arch": s.arch, "layers": s.layers, "world": rn.world,
            "parallel": f"tp{rn.world}" + (f"+ep{rn.world}" if s.moe else ""), "impl": impl,
            "dtype": cfg["dtype"], "batch": batch, "prompt_len": prompt, "chunk_tokens": cfg["chunk_tokens"],
            "decode_steps": cfg["decode_steps"], "output_len": cfg["output_len"],
            "collectives_per_step": sum(s.collectives_per_forward().values())}


def progress(r: dict) -> str:
    check = "" if r["logits_ok"] == "" else \
        f", {r['dtype']} logits max diff {r['logits_max_abs_diff']:.3g}, argmax agree {r['argmax_agree']:.2f}"
    return (f"{r['model']:14s} {r['impl']:5s} batch {r['batch']:4d} prompt {r['prompt_len']:5d}: "
            f"TTFT {r['ttft_ms']:9.2f} ms, decode {r['decode_ms']:7.3f} ms/step, {r['decode_tok_s']:9.0f} tok/s{check}")


def run_point(rn: Runner, s: ModelSpec, model, batch: int, prompt: int, checked: dict) -> list[dict]:
    """Every implementation on one (model, batch, prompt); the first is the logits reference. ``checked``:
    ``check_model``'s verdicts."""
    import torch

    cfg, nan = rn.cfg, float("nan")
    inputs = point_inputs(rn, s, batch, prompt)
    rows, ref = [], None
    for impl in cfg["impls"]:
        row = point_fields(s, rn, impl, batch, prompt)
        try:
            got, logits, err = *measure(rn, model, impl, batch, prompt, inputs), ""
        except Exception as e:  # noqa: BLE001 - recorded; a rank stuck in a collective hits the launcher's timeout
            got, logits, err = {}, None, f"{type(e).__name__}: {e}".replace("\n", " ")[:300]
        errors = [e for e in rn.gather(err) if e]
        if errors:
            rows.append({**row, **dict.fromkeys(MEASURED_COLUMNS, nan), "logits_ok": "", "status": errors[0]})
            torch.cuda.empty_cache()
            continue
        check = {"logits_max_abs_diff": nan, "logits_ref_max_abs": nan, "argmax_agree": nan,
                 "check_dtype": cfg["check_dtype"], "check_max_abs_diff": nan, "logits_ok": ""}
        if ref is None:
            ref = logits
        else:
            timed = agreement(ref, logits, cfg["rtol"], cfg["atol"])
            check.update({k: timed[k] for k in ("logits_max_abs_diff", "logits_ref_max_abs", "argmax_agree")})
            check.update(checked.get(impl, {}))
        rows.append({**row, **got, **check, "status": "ok"})
        if rn.rank == 0:
            print(progress(rows[-1]), flush=True)
    return rows


def run_e2e(rank: int, world: int, cfg: dict) -> Optional[list[dict]]:
    import torch

    from .model import Model

    rn = Runner(rank, world, cfg)
    rows: list[dict] = []
    for s in rn.specs:
        checked = check_model(rn, s)
        model = Model(s, rank, world, rn.device, rn.dtype, cfg["seed"])
        for batch in cfg["batches"]:
            for prompt in cfg["prompts"]:
                rows += run_point(rn, s, model, batch, prompt, checked)
                torch.cuda.empty_cache()
        del model
        torch.cuda.empty_cache()
    rn.barrier()
    for coll in rn.colls.values():
        coll.close()
    return rows if rank == 0 else None
