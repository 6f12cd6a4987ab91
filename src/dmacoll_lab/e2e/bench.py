"""`dmacoll e2e`: LLM inference (prefill + decode) with NCCL or dmacoll collectives, one process per GPU, under
each schedule of schedule.py (serial, microbatch, seqpar).

Per (model, batch, prompt length), per implementation and per schedule, on the same weights and inputs:

* TTFT: the whole batch's prefill (``chunk_tokens`` tokens per forward, whole prompts) up to the logits of every
  prompt's last token, eager, CUDA events, median of ``repeats`` after one warm-up; the slowest rank's time;
* decode: one step (one token per sequence) captured in a CUDA graph; ``decode_steps`` replays back to back
  between two events, per-step time, median of ``repeats``; the slowest rank's. seqpar is a prefill schedule:
  its rows have no decode;
* throughput: prefill tokens/s = batch x prompt / TTFT, decode tokens/s = batch / step time, and
  e2e tokens/s = batch x output_len / (TTFT + (output_len - 1) x step) (derived from the two, not run);
* where the time goes (``breakdown``): the same prefill and decode step with the collectives replaced by no-ops
  on the same buffers and streams (compute alone) and the schedule's own recorded collectives replayed back to
  back (communication alone, a CUDA graph for decode); C3's metrics from the three times: ideal speedup =
  (compute + comm) / max(compute, comm), realized = (compute + comm) / measured, fraction of ideal = (realized
  - 1) / (ideal - 1), clipped at 1 (the raw value kept), as ``analysis/c3_rules.collapse`` does;
* floors: the copy rate and the GEMM rate measured once per run (rates.py); a decode step's compute against its
  bytes (weights and live KV cache, config.decode_bytes) at the copy rate, the prefill's compute against its GEMM
  FLOPs (config.prefill_gemm_flops) at the GEMM rate;
* collectives: each row's prefill and decode step record the calls they issued, checked against what the
  schedule must issue (calls.py: ``calls_ok``), and counted (``prefill_calls``, ``decode_calls``);
* a schedule per phase (phases.py): per implementation, a ``phased`` row made of the serial decode step and the
  prefill of the overlapped schedule that its breakdown predicts and its TTFT shows to win, else serial's, with
  the reason (``phase_reason``); derived from the measured rows, nothing run again;
* outputs: the first implementation in ``impls`` (NCCL by default) under the first schedule is the reference.
  Per model, before the timed points, every (implementation, schedule) runs one untimed prefill + decode step
  (smallest batch and prompt; seqpar's decode step is serial, after its own prefill) on the same weights in
  ``check_dtype`` (float32 by default); every other one must give the reference's logits within
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

import math
import statistics
from typing import Callable, Optional

from dmacoll.lab_api import bench_time, graph_capture
from ..bench.c3_grid import c3_metrics
from ..bench.harness import Rank
from .calls import PREFILL_ONLY, check_calls, expected_calls, merged_schedule_buffers, split
from .config import (E2E_COLUMNS, MEASURED_COLUMNS, ModelSpec, decode_bytes, max_tokens, prefill_chunks,
                     prefill_gemm_flops, spec)
from .phases import phased

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


def overlap(phase: str, compute_ms: float, comm_ms: float, measured_ms: float) -> dict:
    """C3's metrics of one phase (module docstring), NaN where a time is missing."""
    names = ["compute_ms", "comm_ms", "ideal_speedup", "realized_speedup", "fraction_of_ideal",
             "fraction_of_ideal_raw"]
    if not all(math.isfinite(t) and t > 0 for t in (compute_ms, comm_ms, measured_ms)):
        return {f"{phase}_{n}": v for n, v in zip(names, [compute_ms, comm_ms] + [float("nan")] * 4)}
    m = c3_metrics(compute_ms, comm_ms, measured_ms)
    raw = m["fraction_of_ideal"]
    return {f"{phase}_{n}": v for n, v in zip(names, [compute_ms, comm_ms, m["ideal_speedup"],
                                                      m["realized_speedup"], min(raw, 1.0), raw])}


def floors(s: ModelSpec, world: int, batch: int, prompt: int, cfg: dict, rates: dict, row: dict) -> dict:
    """The compute times of ``row`` against the run's measured rates (module docstring)."""
    import torch

    elsize = torch.empty((), dtype=getattr(torch, cfg["dtype"])).element_size()
    live = prompt + (cfg["decode_steps"] + 1) / 2  # positions a step attends to, on average over the replays
    decode_floor = decode_bytes(s, world, batch, live, elsize) / (rates["copy_GBps"] * 1e9) * 1e3
    prefill_floor = prefill_gemm_flops(s, world, batch, prompt) / (rates["gemm_TFLOPs"] * 1e12) * 1e3
    return {**rates, "decode_floor_ms": decode_floor, "prefill_floor_ms": prefill_floor,
            "decode_compute_over_floor": row.get("decode_compute_ms", float("nan")) / decode_floor,
            "prefill_compute_over_floor": row.get("ttft_compute_ms", float("nan")) / prefill_floor}


class Runner(Rank):
    """The harness's rank (stream, host group, slowest-rank reduction) with the models' specs, one set of
    collectives per implementation (buffers sized for the largest point under every schedule), and the run's
    copy and GEMM rates (the slowest rank's)."""

    def __init__(self, rank: int, world: int, cfg: dict):
        import torch

        from . import rates
        from .collectives import make

        super().__init__(rank, world, dtype=cfg["dtype"])
        self.cfg = cfg
        self.specs = [m if isinstance(m, ModelSpec) else spec(m, cfg["layers"]) for m in cfg["models"]]
        tokens = max_tokens(cfg["batches"], cfg["prompts"], cfg["chunk_tokens"])
        elements = merged_schedule_buffers(self.specs, world, tokens, max(cfg["batches"]), cfg["schedules"],
                                           cfg["pieces"])
        self.colls = {impl: make(impl, self.device, elements, self.dtype, overlap_path=cfg["overlap_path"])
                      for impl in cfg["impls"]}
        measured = rates.measure(self.device, self.dtype)
        self.rates = {k: min(v) for k, v in zip(measured, zip(*self.gather(list(measured.values()))))}
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def replayable(rn: Rank, fn: Callable[[], object]) -> tuple[Callable[[], None], object]:
    """``fn`` as something to replay, and its output: on a GPU a CUDA graph (captured after one eager call on a
    side stream: kernels chosen, NCCL and dmacoll warmed up), on the host ``fn`` itself."""
    import torch

    if rn.device.type != "cuda":
        return fn, fn()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    rn.barrier()
    graph = torch.cuda.CUDAGraph()
    with graph_capture(graph):
        out = fn()
    torch.cuda.synchronize()
    rn.barrier()
    return graph.replay, out


def measure(rn: Runner, model, impl: str, schedule: str, batch: int, prompt: int, inputs: tuple) -> tuple[dict, tuple]:
    """TTFT and decode step time of one implementation under one schedule, their compute and communication
    alone; also its logits (prefill, first decode step) and the collectives it issued."""
    import torch

    from .schedule import NoComm, Schedule, replay

    cfg, coll = rn.cfg, rn.colls[impl]
    nocomm = NoComm(coll)
    prompts, step_tokens = inputs
    steps, repeats, breakdown = cfg["decode_steps"], cfg["repeats"], cfg["breakdown"]
    chunks = prefill_chunks(batch, prompt, cfg["chunk_tokens"])
    cache = model.new_cache(batch, prompt + steps + 4)
    sched = Schedule(schedule, cfg["pieces"])
    nan = float("nan")

    def times(fn) -> list[float]:
        """ms of one ``fn`` (after one warm-up), the slowest rank's per repeat."""
        return rn.slowest([t / 1e3 for t in rn.bench(fn, 1, repeats, warmup=1).samples])

    prefill = lambda c: sched.prefill_batch(model, c, prompts, cache, chunks)  # noqa: E731
    ttft = times(lambda: prefill(coll))  # the warm-up is NCCL's eager call before any capture, too
    sched.log = []
    prefill_logits = prefill(coll)
    prefill_calls, sched.log = sched.log, None
    compute, comm = [nan], [nan]
    if breakdown:
        compute = times(lambda: prefill(nocomm))
        comm = times(lambda: replay(coll, prefill_calls))
        prefill(coll)  # the cache as the real prefill leaves it, for decode
    row = {"ttft_ms": statistics.median(ttft), "ttft_ms_p10": _pct(ttft, 0.1), "ttft_ms_p90": _pct(ttft, 0.9),
           **overlap("ttft", statistics.median(compute), statistics.median(comm), statistics.median(ttft)),
           "prefill_calls": len(prefill_calls)}
    expected = merged_expected(model.spec, rn.world, schedule, chunks, prompt, cfg["pieces"])
    problems = [check_calls([c.record() for c in prefill_calls], expected)]

    decode_logits, decode = None, [nan]
    compute, comm = [nan], [nan]
    if schedule not in PREFILL_ONLY:
        tokens = step_tokens.clone()
        pos = torch.full((1,), prompt, dtype=torch.long, device=rn.device)

        def step(c):
            out = sched.decode(model, c, tokens, pos, cache)
            pos.add_(1)
            return out

        def per_step(run) -> list[float]:
            """ms per step of ``steps`` replays back to back from the prompt's end, the slowest rank's per repeat."""
            def each() -> None:
                pos.fill_(prompt)
                rn.barrier()

            timed = bench_time(run, steps, repeats, warmup=0, device=rn.device, each=each)
            return rn.slowest([t / 1e3 for t in timed.samples])

        def recorded_step():
            sched.log = []  # what the last call (the captured one) issued
            return step(coll)

        real, static_logits = replayable(rn, recorded_step)
        step_calls, sched.log = sched.log, None
        pos.fill_(prompt)
        real()
        decode_logits = static_logits.clone()
        decode = per_step(real)
        row["decode_calls"] = len(step_calls)
        problems.append(check_calls([c.record() for c in step_calls],
                                    expected_calls(model.spec, rn.world, schedule, batch, 1, cfg["pieces"], True)))
        if breakdown:
            compute = per_step(replayable(rn, lambda: step(nocomm))[0])
            comm = per_step(replayable(rn, lambda: replay(coll, step_calls))[0])
    row.update({"decode_ms": statistics.median(decode), "decode_ms_p10": _pct(decode, 0.1),
                "decode_ms_p90": _pct(decode, 0.9),
                **overlap("decode", statistics.median(compute), statistics.median(comm), statistics.median(decode))})
    row.update(derived(batch, prompt, cfg["output_len"], row["ttft_ms"], row["decode_ms"]))
    row.update(floors(model.spec, rn.world, batch, prompt, cfg, rn.rates, row))
    problems = [p for p in problems if p]
    row["calls_ok"] = not problems
    if problems and rn.rank == 0:
        print(f"{model.spec.name} {impl} {schedule} batch {batch} prompt {prompt}: collectives differ from the "
              f"schedule's: {problems[0]}", flush=True)
    return row, (prefill_logits, decode_logits)


def merged_expected(s: ModelSpec, world: int, schedule: str, chunks: list[int], prompt: int, pieces: int) -> dict:
    """The calls of a whole prefill (one forward per chunk), per micro-batch."""
    out: dict = {}
    for n in chunks:
        for mb, calls in expected_calls(s, world, schedule, n, prompt, pieces).items():
            out.setdefault(mb, []).extend(calls)
    return out


def decode_schedule(schedule: str) -> str:
    """The schedule of the checked decode step: a prefill-only schedule's is serial."""
    return "serial" if schedule in PREFILL_ONLY else schedule


def logits_once(rn: Runner, model, coll, inputs: tuple, batch: int, prompt: int, schedule: str = "serial") -> tuple:
    """Untimed, eager: logits of a prefill and of the first decode step."""
    import torch

    from .schedule import Schedule

    prompts, step_tokens = inputs
    cache = model.new_cache(batch, prompt + 4)
    chunks = prefill_chunks(batch, prompt, rn.cfg["chunk_tokens"])
    pre = Schedule(schedule, rn.cfg["pieces"]).prefill_batch(model, coll, prompts, cache, chunks)
    pos = torch.full((1,), prompt, dtype=torch.long, device=rn.device)
    dec = Schedule(decode_schedule(schedule)).decode(model, coll, step_tokens, pos, cache)
    return pre, dec


def agreement(ref: tuple, got: tuple, rtol: float, atol: float) -> dict:
    """``compare`` over the (prefill, decode) logits pairs present in both: the worse."""
    both = [compare(r.float(), g.float(), rtol, atol) for r, g in zip(ref, got) if r is not None and g is not None]
    return {"logits_max_abs_diff": max(c["logits_max_abs_diff"] for c in both),
            "logits_ref_max_abs": max(c["logits_ref_max_abs"] for c in both),
            "logits_ok": all(c["logits_ok"] for c in both),
            "argmax_agree": min(c["argmax_agree"] for c in both)}


def variants(cfg: dict) -> list[tuple[str, str]]:
    """(implementation, schedule) in run order; the first is the reference."""
    return [(impl, sched) for impl in cfg["impls"] for sched in cfg["schedules"]]


def check_model(rn: Runner, s: ModelSpec) -> dict:
    """Per (implementation, schedule) after the first: {"check_max_abs_diff", "logits_ok"} of the
    ``check_dtype`` run."""
    import torch

    from .collectives import make
    from .model import Model

    cfg = rn.cfg
    dtype = getattr(torch, cfg["check_dtype"])
    batch, prompt = min(cfg["batches"]), min(cfg["prompts"])
    model = Model(s, rn.rank, rn.world, rn.device, dtype, cfg["seed"])
    elements = merged_schedule_buffers([s], rn.world, max_tokens([batch], [prompt], cfg["chunk_tokens"]), batch,
                                       cfg["schedules"], cfg["pieces"])
    inputs = point_inputs(rn, s, batch, prompt)
    out, ref = {}, None
    for impl in cfg["impls"]:
        coll = make(impl, rn.device, elements, dtype, overlap_path=cfg["overlap_path"])
        try:
            got = {sched: logits_once(rn, model, coll, inputs, batch, prompt, sched) for sched in cfg["schedules"]}
            if rn.device.type == "cuda":
                torch.cuda.synchronize()
        finally:
            rn.barrier()
            coll.close()
        for sched, logits in got.items():
            if ref is None:
                ref = logits
                continue
            a = agreement(ref, logits, cfg["rtol"], cfg["atol"])
            out[impl, sched] = {"check_max_abs_diff": a["logits_max_abs_diff"], "logits_ok": a["logits_ok"]}
            if rn.rank == 0:
                print(f"{s.name:14s} {impl:5s} {sched:10s} {cfg['check_dtype']} check (batch {batch}, prompt "
                      f"{prompt}): logits max diff {a['logits_max_abs_diff']:.3g} of max "
                      f"{a['logits_ref_max_abs']:.3g} ({'ok' if a['logits_ok'] else 'MISMATCH'})", flush=True)
    del model
    if rn.device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def point_inputs(rn: Runner, s: ModelSpec, batch: int, prompt: int) -> tuple:
    """Seeded prompts and decode tokens, the same on every rank and for every implementation."""
    import torch

    gen = torch.Generator(device=rn.device).manual_seed(rn.cfg["seed"] * 7919 + batch * 31 + prompt)
    return (torch.randint(0, s.vocab, (batch, prompt), generator=gen, device=rn.device),
            torch.randint(0, s.vocab, (batch,), generator=gen, device=rn.device))


def point_fields(s: ModelSpec, rn: Runner, impl: str, batch: int, prompt: int, schedule: str = "serial") -> dict:
    cfg = rn.cfg
    return {"model": s.name, "arch": s.arch, "layers": s.layers, "world": rn.world,
            "parallel": f"tp{rn.world}" + (f"+ep{rn.world}" if s.moe else ""), "impl": impl, "schedule": schedule,
            "pieces": cfg.get("pieces", 1) if schedule == "seqpar" else 1,
            "microbatches": len(split(batch, 1)) if schedule == "microbatch" else 1,
            "dtype": cfg["dtype"], "batch": batch, "prompt_len": prompt, "chunk_tokens": cfg["chunk_tokens"],
            "decode_steps": cfg["decode_steps"], "output_len": cfg["output_len"],
            "collectives_per_step": sum(s.collectives_per_forward().values()),
            "measured_order": "", "prefill_schedule": schedule,
            "decode_schedule": "" if schedule in PREFILL_ONLY else schedule, "phase_reason": "", "data_paths": ""}


def progress(r: dict) -> str:
    check = "" if r["logits_ok"] == "" else \
        f", {r['dtype']} logits max diff {r['logits_max_abs_diff']:.3g}, argmax agree {r['argmax_agree']:.2f}"
    where = "" if not math.isfinite(r.get("ttft_compute_ms", float("nan"))) else \
        (f"; TTFT compute {r['ttft_compute_ms']:.2f} comm {r['ttft_comm_ms']:.2f}, decode compute "
         f"{r['decode_compute_ms']:.3f} (floor {r['decode_floor_ms']:.3f}) comm {r['decode_comm_ms']:.3f} ms")
    return (f"{r['model']:14s} {r['impl']:5s} {r['schedule']:10s} batch {r['batch']:4d} prompt {r['prompt_len']:5d}: "
            f"TTFT {r['ttft_ms']:9.2f} ms, decode {r['decode_ms']:7.3f} ms/step, {r['decode_tok_s']:9.0f} tok/s"
            f"{where}{check}")


def run_point(rn: Runner, s: ModelSpec, model, batch: int, prompt: int, checked: dict, turn: int = 0) -> list[dict]:
    """Every (implementation, schedule) on one (model, batch, prompt); the first (``variants``) is the logits
    reference. ``checked``: ``check_model``'s verdicts. ``turn``: the point's place in the run; every other point
    measures the variants in reverse order (``measured_order``), so no implementation is always measured after the
    other: a GPU's clocks drift over a run (at batch 128 on 2x H200 the compute alone of the second of two identical
    prefills came out 1-5% slower, 11e4cc8)."""
    import torch

    cfg, nan = rn.cfg, float("nan")
    inputs = point_inputs(rn, s, batch, prompt)
    order = variants(cfg) if turn % 2 == 0 else variants(cfg)[::-1]
    measured = {}
    for place, (impl, schedule) in enumerate(order):
        try:
            got, logits, err = *measure(rn, model, impl, schedule, batch, prompt, inputs), ""
        except Exception as e:  # noqa: BLE001 - recorded; a rank stuck in a collective hits the launcher's timeout
            got, logits, err = {}, None, f"{type(e).__name__}: {e}".replace("\n", " ")[:300]
        errors = [e for e in rn.gather(err) if e]
        measured[impl, schedule] = (got, logits, errors[0] if errors else "", place,
                                    getattr(rn.colls[impl], "take_paths", lambda: "")())
        if errors and rn.device.type == "cuda":
            torch.cuda.empty_cache()
    rows, ref = [], None
    for impl, schedule in variants(cfg):
        got, logits, error, place, paths = measured[impl, schedule]
        row = {**point_fields(s, rn, impl, batch, prompt, schedule), **dict.fromkeys(MEASURED_COLUMNS, nan)}
        row["measured_order"], row["data_paths"] = place, paths
        if error:
            rows.append({**row, "logits_ok": "", "calls_ok": "", "status": error})
            continue
        check = {"logits_max_abs_diff": nan, "logits_ref_max_abs": nan, "argmax_agree": nan,
                 "check_dtype": cfg["check_dtype"], "check_max_abs_diff": nan, "logits_ok": ""}
        if ref is None:
            ref = logits
        else:
            timed = agreement(ref, logits, cfg["rtol"], cfg["atol"])
            check.update({k: timed[k] for k in ("logits_max_abs_diff", "logits_ref_max_abs", "argmax_agree")})
            check.update(checked.get((impl, schedule), {}))
        rows.append({**row, **got, **check, "status": "ok"})
        if rn.rank == 0:
            print(progress(rows[-1]) + (f"\n  data paths of its calls: {paths}" if paths else ""), flush=True)
    chosen = phased(rows, derived)
    if rn.rank == 0:
        for r in chosen:
            print(progress(r) + f"\n  {r['phase_reason']}", flush=True)
    return rows + chosen


def run_e2e(rank: int, world: int, cfg: dict) -> Optional[list[dict]]:
    import torch

    from .model import Model

    rn = Runner(rank, world, cfg)
    if rank == 0:
        print(f"rates: device-local copy {rn.rates['copy_GBps']:.0f} GB/s (read + write), {cfg['dtype']} GEMM "
              f"{rn.rates['gemm_TFLOPs']:.0f} TFLOP/s", flush=True)
    rows: list[dict] = []
    turn = 0
    for s in rn.specs:
        checked = check_model(rn, s)
        model = Model(s, rank, world, rn.device, rn.dtype, cfg["seed"])
        for batch in cfg["batches"]:
            for prompt in cfg["prompts"]:
                rows += run_point(rn, s, model, batch, prompt, checked, turn)
                turn += 1
                if rn.device.type == "cuda":
                    torch.cuda.empty_cache()
        del model
    rn.barrier()
    for coll in rn.colls.values():
        coll.close()
    return rows if rank == 0 else None
