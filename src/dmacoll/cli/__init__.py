"""`dmacoll <subcommand>`: check, sweep, tune, build, breakdown, power, sm-usage, interference, c3, ficco, report."""
from __future__ import annotations

import argparse
import os
import random
import sys
import time
from typing import Optional, Sequence

from ..sizes import parse_size


def cmd_check(a: argparse.Namespace) -> int:
    from ..backends import resolve
    from ..verify.check import check_rank
    from ..verify.launch import run_ranks
    from ..errors import BackendUnavailable

    try:
        resolve(a.backend)  # before any rank starts: says why a backend cannot run here
    except BackendUnavailable as e:
        print(f"dmacoll check: {e}", file=sys.stderr)
        return 2
    seed = a.seed if a.seed is not None else random.randrange(1 << 30)
    device = "cpu" if a.backend == "host" else "cuda"  # hip: torch.cuda is HIP on ROCm builds
    print(f"dmacoll check: backend={a.backend} world={a.world} seed={seed} (pass --seed {seed} to repeat)",
          flush=True)
    t0 = time.monotonic()
    args = dict(backend=a.backend, timeout_s=a.timeout_s, variants=a.variants, directions=a.directions,
                dtypes=a.dtypes, counts=a.counts, ops=a.ops, seed=seed, syncs=a.syncs, reference=a.reference,
                signal=a.signal, submit=a.submit)
    per_rank = run_ranks(check_rank, a.world, args, device=device)
    passed = failed = 0
    for i, first in enumerate(per_rank[0]):
        results = [r[i] for r in per_rank]
        if all(r["ok"] for r in results):
            passed += 1
        else:
            failed += 1
            errors = "; ".join(f"rank {r['rank']}: {r['error']}" for r in results if not r["ok"])
            print(f"FAIL {first['op']} {first['variant']}/{first['direction']}/{first['sync']}/{first['handshake']} "
                  f"{first['dtype']} count={first['count']} {first['buffers']}"
                  f"{' in-place' if first['in_place'] else ''}: {errors}")
    print(f"({time.monotonic() - t0:.1f} s, world {a.world}, backend {a.backend})")
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


def cmd_sweep(a: argparse.Namespace) -> int:
    from ..bench.sweep import SweepConfig, run_sweep
    from ..verify.launch import run_ranks

    if "nccl_ce" in a.impls and {"dma", "peer_copy"} & set(a.impls):
        print("run nccl_ce in a sweep of its own: it switches torch's symmetric-memory backend to NCCL "
              "for the whole process", file=sys.stderr)
        return 2
    world = _gpu_world(a, "sweep")
    if world < 2:
        return 2
    cfg = SweepConfig(ops=tuple(a.ops), impls=tuple(a.impls), variants=tuple(a.variants),
                      directions=tuple(a.directions), places=tuple(a.places), signals=tuple(a.signals),
                      prerecord=tuple(p == "yes" for p in a.prerecord), submit=tuple(a.submit),
                      handshakes=tuple(a.handshakes), min_bytes=a.min_bytes,
                      max_bytes=a.max_bytes, modes=tuple(a.modes), dtype=a.dtype, calls=a.calls, repeats=a.repeats,
                      warmup=a.warmup, seed=a.seed, out=a.out)
    run_ranks(run_sweep, world, cfg, device="cuda", timeout_s=a.timeout_s)
    return 0


def cmd_tune(a: argparse.Namespace) -> int:
    """Measure every dma variant (or read a sweep) and write the fastest per (op, size, mode, place)."""
    import json
    from pathlib import Path

    from ..analysis.tuning_table import derive
    from ..bench import provenance

    out = Path(a.out)
    csvs = a.from_sweep
    if not csvs:
        sweep_csv = str(out.with_suffix(".sweep.csv"))
        rc = cmd_sweep(build_parser().parse_args(
            ["sweep", "--impls", "dma", "--min-bytes", str(a.min_bytes), "--max-bytes", str(a.max_bytes),
             "--repeats", str(a.repeats), "--world", str(a.world), "--out", sweep_csv]))
        if rc:
            return rc
        csvs = [sweep_csv]
    prov = json.loads(Path(csvs[0]).with_suffix(".json").read_text())
    table = derive(csvs, prov)
    provenance.write_atomic(out, table.to_json())
    print(f"wrote {out}: {len(table.entries)} entries from {csvs} (world {table.meta['world']}, "
          f"{table.meta['gpu']}, code {str(table.meta['source_git_sha'])[:10]})")
    return 0


def _planned_world(a: argparse.Namespace, what: str) -> int:
    """Ranks of a planning tool: --world, else 2 for a dry run, else every visible GPU."""
    return a.world or (2 if a.dry_run else _gpu_world(a, what))


def _gpu_world(a: argparse.Namespace, what: str) -> int:
    import torch

    world = a.world or torch.cuda.device_count()
    if world < 2:
        print(f"dmacoll {what} needs at least 2 GPUs, found {world}", file=sys.stderr)
    return world


def _gpu_tool(a: argparse.Namespace, what: str, run_rank, columns: list[str], cfg: dict, timeout_s: float) -> int:
    """Run ``run_rank`` on every GPU and write rank 0's rows as a CSV with provenance."""
    from ..bench import provenance
    from ..verify.launch import run_ranks

    world = _gpu_world(a, what)
    if world < 2:
        return 2
    rows = run_ranks(run_rank, world, cfg, device="cuda", timeout_s=timeout_s)[0]
    provenance.write_table(a.out, rows, columns, cfg)
    return 0


def cmd_power(a: argparse.Namespace) -> int:
    """Energy per collective: NVML energy counter around sustained graph-replayed calls."""
    from ..bench.power import POWER_COLUMNS, run_power

    cfg = dict(ops=a.ops, impls=a.impls, sizes=a.sizes, seconds=a.seconds, idle_seconds=a.idle_seconds,
               repeats=a.repeats, dtype=a.dtype)
    return _gpu_tool(a, "power", run_power, POWER_COLUMNS, cfg, 3600)


def cmd_sm_usage(a: argparse.Namespace) -> int:
    """GPU kernels versus copies per collective, from the PyTorch profiler."""
    from ..bench.smusage import SM_COLUMNS, run_sm_usage

    cfg = dict(ops=a.ops, impls=a.impls, sizes=a.sizes, calls=a.calls, modes=a.modes)
    return _gpu_tool(a, "sm-usage", run_sm_usage, SM_COLUMNS, cfg, 1800)


def cmd_breakdown(a: argparse.Namespace) -> int:
    """Control / schedule / copy / sync of one copy-engine transfer, from CUPTI timestamps."""
    import torch

    from ..bench import provenance
    from ..bench.breakdown import BREAKDOWN_COLUMNS, run_breakdown

    if not torch.cuda.is_available():
        print("dmacoll breakdown needs a CUDA GPU", file=sys.stderr)
        return 2
    cfg = dict(sizes=a.sizes, transfers=a.transfers, warmup=a.warmup, src=a.src, dst=a.dst)
    rows = run_breakdown(**cfg)
    provenance.write_table(a.out, rows, BREAKDOWN_COLUMNS, cfg)
    return 0


def cmd_interference(a: argparse.Namespace) -> int:
    """Slowdown a collective inflicts on a concurrent GEMM / memory-bound kernel, and vice versa."""
    from ..bench.overlap import INTERFERENCE_COLUMNS, run_interference

    cfg = dict(compute=a.compute, impls=a.impls, sizes=a.sizes, repeats=a.repeats)
    return _gpu_tool(a, "interference", run_interference, INTERFERENCE_COLUMNS, cfg, 1800)


def cmd_c3(a: argparse.Namespace) -> int:
    """C3: a GEMM / memory-bound kernel next to a collective, per strategy (ConCCL); --dry-run: the plan only."""
    from ..bench.c3_grid import estimate_seconds

    cfg = dict(shapes=a.shapes, ops=a.ops, strategies=a.strategies, targets=a.targets, sm_fractions=a.sm_fractions,
               carveout_sms=a.carveout_sms, repeats=a.repeats, min_comp_us=a.min_comp_us, max_calls=a.max_calls,
               hold_us=a.hold_us, ladder=a.ladder)
    est = estimate_seconds(cfg)
    print(f"dmacoll c3: {est['shapes']} shapes, {est['scenarios']} scenarios x options {', '.join(est['options'])}; "
          f"estimated {est['seconds'] / 60:.1f} min", flush=True)
    if a.dry_run:
        return 0
    from ..bench.c3 import C3_COLUMNS, run_c3

    return _gpu_tool(a, "c3", run_c3, C3_COLUMNS, cfg, 3600)


def cmd_e2e(a: argparse.Namespace) -> int:
    """LLM inference (prefill + CUDA-graph decode) with NCCL vs dmacoll collectives; --dry-run: the plan only."""
    import json
    from pathlib import Path

    from ..e2e import config as e2e

    cfg = dict(models=a.models, layers=a.layers, batches=a.batches, prompts=a.prompts, impls=a.impls,
               decode_steps=a.decode_steps, repeats=a.repeats, output_len=a.output_len, chunk_tokens=a.chunk_tokens,
               dtype=a.dtype, seed=a.seed, check_dtype=a.check_dtype, rtol=a.rtol, atol=a.atol)
    if a.hf_config_dir:  # shapes for `vllm bench ... --load-format dummy`
        for name in a.models:
            d = Path(a.hf_config_dir) / name
            d.mkdir(parents=True, exist_ok=True)
            (d / "config.json").write_text(json.dumps(e2e.hf_config(e2e.spec(name, a.layers)), indent=1) + "\n")
            print(f"wrote {d / 'config.json'}")
        return 0
    world = _planned_world(a, "e2e")
    if world < 2:
        return 2
    try:
        print(e2e.plan_text(cfg, world), flush=True)
    except ValueError as e:
        print(f"dmacoll e2e: {e}", file=sys.stderr)
        return 2
    if a.dry_run:
        return 0
    from ..e2e.bench import E2E_COLUMNS, run_e2e

    return _gpu_tool(a, "e2e", run_e2e, E2E_COLUMNS, cfg, 1800)


def cmd_build(a: argparse.Namespace) -> int:
    """Compile the native submission library, check it, and record the toolchain."""
    from ..backends import native

    record = native.build(a.out, a.cc)
    print(f"built {record['library']} with {record['compiler_version']}; self-test passed "
          f"({record['self_test_commands']} commands); toolchain in {a.out}/toolchain.json")
    return 0


def add_report_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("what", choices=("table", "readme", "claims"),
                   help="table: print/write Markdown; readme: update README; claims: the papers' claims "
                        "(--out claims.json, Markdown beside it)")
    p.add_argument("--csv", nargs="+", required=True, help="sweep CSV(s)")
    p.add_argument("--out", help="write the Markdown here (table)")
    p.add_argument("--readme", default="README.md")
    p.add_argument("--power", help="claims: the power CSV of `dmacoll power` (its claims are 'not run' without)")
    p.add_argument("--c3", help="claims: the CSV of `dmacoll c3` (its claims are 'not run' without)")


def cmd_report(a: argparse.Namespace) -> int:
    if a.what == "claims":
        from ..analysis import claims

        out = Path(a.out or "results/local/claims.json")
        rows = claims.write(a.csv, out, out.with_suffix(".md"), a.power, a.c3)
        for r in rows:
            print(f"{r['status']:7s} {r['id']}: {r['reproduced']} (tolerance {r['tolerance']})")
        return 0
    from ..analysis.report import readme_block, update_readme

    block = readme_block(a.csv)
    if a.what == "readme":
        changed = update_readme(Path(a.readme), block)
        print(f"{a.readme}: {'updated' if changed else 'already up to date'}")
    elif a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(block + "\n")
        print(f"wrote {a.out}")
    else:
        print(block)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from ..bench.sweep import IMPLS, OPS as SWEEP_OPS
    from ..ops import NAMES as OPS
    from ..verify.check import DTYPES
    from ..executor import SIGNAL_MODES, SYNC_MODES
    from ..plan import DIRECTIONS, VARIANTS

    p = argparse.ArgumentParser(prog="dmacoll", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)

    c = sub.add_parser("check", help="run every op x variant on a backend and compare with a reference")
    c.add_argument("--backend", choices=("host", "cuda", "hip"), default="host")
    c.add_argument("--world", type=int, default=2)
    c.add_argument("--ops", nargs="+", choices=OPS, default=list(OPS),
                   help="reduce_scatter/all_reduce (sum) skip the dtypes they do not sum (bool, int8, uint8)")
    c.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    c.add_argument("--directions", nargs="+", choices=DIRECTIONS, default=list(DIRECTIONS))
    c.add_argument("--syncs", nargs="+", choices=SYNC_MODES, default=list(SYNC_MODES))
    c.add_argument("--dtypes", nargs="+", choices=list(DTYPES), default=["float32", "bfloat16", "int8", "int64",
                                                                        "bool"])
    c.add_argument("--counts", nargs="+", type=int, default=[1, 17, 4096, 65537],
                   help="elements per chunk, all_reduce: per tensor (odd and power-of-two sizes)")
    c.add_argument("--seed", type=int, default=None, help="default: random, printed")
    c.add_argument("--timeout-s", type=float, default=60.0)
    c.add_argument("--signal", choices=SIGNAL_MODES, default="memop",
                   help="how flags reach peers: stream memory op or a 4-byte copy (reset sync only)")
    c.add_argument("--reference", choices=("cpu", "nccl"), default="cpu",
                   help="also compare with NCCL on the same inputs (cuda backend)")
    c.add_argument("--submit", choices=("python", "native"), default="python",
                   help="cuda: issue driver calls from Python or the native library (dmacoll build)")
    c.set_defaults(func=cmd_check)

    s = sub.add_parser("sweep", help="time collectives over message sizes (GPUs)")
    s.add_argument("--world", type=int, default=0, help="ranks (default: every visible GPU)")
    s.add_argument("--ops", nargs="+", choices=SWEEP_OPS, default=list(SWEEP_OPS))
    s.add_argument("--impls", nargs="+", choices=IMPLS, default=["nccl", "dma", "symm_mem_lc", "peer_copy"])
    s.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    s.add_argument("--directions", nargs="+", choices=DIRECTIONS, default=list(DIRECTIONS))
    s.add_argument("--places", nargs="+", choices=("out", "in"), default=["out", "in"],
                   help="all-gather out-of-place and/or in-place (dma)")
    s.add_argument("--signals", nargs="+", choices=SIGNAL_MODES, default=["memop"],
                   help="dma: how flags reach peers (copy: reset sync only)")
    s.add_argument("--prerecord", nargs="+", choices=("no", "yes"), default=["no"],
                   help="dma, eager mode: also replay a graph recorded on first use")
    s.add_argument("--submit", nargs="+", choices=("python", "native"), default=["python"],
                   help="dma, eager mode: issue driver calls from Python and/or the native library (dmacoll build)")
    s.add_argument("--handshakes", nargs="+", choices=("full", "lean"), default=["full"],
                   help="dma push: lean = calls alternate between two outputs and skip READY (one flag crossing)")
    s.add_argument("--min-bytes", type=parse_size, default=parse_size("1K"))
    s.add_argument("--max-bytes", type=parse_size, default=parse_size("256M"))
    s.add_argument("--modes", nargs="+", choices=("graph", "eager"), default=["graph", "eager"])
    s.add_argument("--dtype", default="bfloat16")
    s.add_argument("--calls", type=int, default=10, help="calls per timed batch (per graph)")
    s.add_argument("--repeats", type=int, default=5)
    s.add_argument("--warmup", type=int, default=3)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--timeout-s", type=float, default=3600)
    s.add_argument("--out", default="results/sweep.csv")
    s.set_defaults(func=cmd_sweep)

    t = sub.add_parser("tune", help="measure the dma variants and write a tuning table for variant='auto'")
    t.add_argument("--out", default="results/local/tuning.json")
    t.add_argument("--from-sweep", nargs="+", help="derive from existing sweep CSV(s) instead of measuring")
    t.add_argument("--world", type=int, default=0)
    t.add_argument("--min-bytes", type=parse_size, default=parse_size("1K"))
    t.add_argument("--max-bytes", type=parse_size, default=parse_size("256M"))
    t.add_argument("--repeats", type=int, default=5)
    t.set_defaults(func=cmd_tune)

    def gpu_tool_arguments(parser: argparse.ArgumentParser, sizes: tuple[str, ...], ops: bool = True) -> None:
        parser.add_argument("--world", type=int, default=0, help="ranks (default: every visible GPU)")
        if ops:
            parser.add_argument("--ops", nargs="+", choices=SWEEP_OPS, default=list(SWEEP_OPS))
        parser.add_argument("--impls", nargs="+", choices=("nccl", "dma"), default=["nccl", "dma"])
        parser.add_argument("--sizes", nargs="+", type=parse_size, default=[parse_size(x) for x in sizes],
                            help="bytes per rank")

    w = sub.add_parser("power", help="energy and power per collective (NVML / amdsmi), idle baseline subtracted")
    gpu_tool_arguments(w, ("1K", "1M", "256M"))
    w.add_argument("--seconds", type=float, default=2.0, help="sustained run per measurement")
    w.add_argument("--idle-seconds", type=float, default=2.0)
    w.add_argument("--repeats", type=int, default=3)
    w.add_argument("--dtype", default="bfloat16")
    w.add_argument("--out", default="results/local/power.csv")
    w.set_defaults(func=cmd_power)

    m = sub.add_parser("sm-usage", help="GPU kernels vs copy-engine work per collective (PyTorch profiler)")
    gpu_tool_arguments(m, ("64K", "4M", "256M"))
    m.add_argument("--modes", nargs="+", choices=("graph", "eager"), default=["graph", "eager"])
    m.add_argument("--calls", type=int, default=10)
    m.add_argument("--out", default="results/local/sm_usage.csv")
    m.set_defaults(func=cmd_sm_usage)

    f = sub.add_parser("interference", help="collective vs concurrent GEMM / memory-bound kernel slowdowns")
    gpu_tool_arguments(f, ("64K", "4M", "256M"), ops=False)  # all-gather
    f.add_argument("--compute", nargs="+", choices=("gemm", "membound"), default=["gemm", "membound"])
    f.add_argument("--repeats", type=int, default=5)
    f.add_argument("--out", default="results/local/interference.csv")
    f.set_defaults(func=cmd_interference)

    add_c3_parser(sub)
    add_ficco_parser(sub)
    add_e2e_parser(sub)

    b = sub.add_parser("breakdown", help="control/schedule/copy/sync phases of one copy-engine transfer (CUPTI)")
    b.add_argument("--sizes", nargs="+", type=parse_size,
                   default=[parse_size(x) for x in ("1K", "4K", "16K", "64K", "256K", "1M", "4M", "16M", "64M")])
    b.add_argument("--transfers", type=int, default=30, help="profiled transfers per size")
    b.add_argument("--warmup", type=int, default=5)
    b.add_argument("--src", type=int, default=0, help="sender GPU")
    b.add_argument("--dst", type=int, default=None, help="receiver GPU (default: 1, or 0 on a one-GPU machine)")
    b.add_argument("--out", default="results/local/breakdown.csv")
    b.set_defaults(func=cmd_breakdown)

    n = sub.add_parser("build", help="compile and self-test the native submission library (submit='native')")
    n.add_argument("--out", default="build/native", help="output folder (the library, toolchain.json)")
    n.add_argument("--cc", default=None, help="C compiler (default: $CC, else cc / gcc / clang)")
    n.set_defaults(func=cmd_build)

    r = sub.add_parser("report", help="render tables from sweep CSVs")
    add_report_arguments(r)
    r.set_defaults(func=cmd_report)
    return p


def add_c3_parser(sub) -> None:
    from ..bench import c3_grid as g

    def shape(text: str) -> str:
        try:
            g.Shape.parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        return text

    def fraction(text: str) -> float:
        v = float(text)
        if not 0 < v < 1:
            raise argparse.ArgumentTypeError(f"an SM fraction is between 0 and 1: {text!r}")
        return v

    d = g.DEFAULTS
    p = sub.add_parser("c3", help="compute next to a collective per strategy (baseline, priority, SM partition, "
                                  "SM carveout, dma, dma+priority, dma+partition, dma+carveout): ConCCL's C3 "
                                  "metrics")
    p.add_argument("--world", type=int, default=0, help="ranks (default: every visible GPU)")
    p.add_argument("--shapes", nargs="+", type=shape, default=d["shapes"],
                   help="gemm:MxNxK (bf16 (MxK)@(KxN)) or membound:MxN (bf16 add)")
    p.add_argument("--ops", nargs="+", choices=g.OPS, default=d["ops"])
    p.add_argument("--strategies", nargs="+", choices=g.STRATEGIES, default=d["strategies"])
    p.add_argument("--targets", nargs="+", type=float, default=d["targets"], help="T_comm / T_comp to aim at")
    p.add_argument("--sm-fractions", nargs="+", type=fraction, default=d["sm_fractions"],
                   help="partition: share of the SMs given to the compute")
    p.add_argument("--carveout-sms", type=int, default=d["carveout_sms"],
                   help="carveout, dma_carveout: SMs the compute's GEMMs leave free (cuBLASLt's SM-count target)")
    p.add_argument("--repeats", type=int, default=d["repeats"])
    p.add_argument("--min-comp-us", type=float, default=d["min_comp_us"], help="repeat the operator up to this")
    p.add_argument("--max-calls", type=int, default=d["max_calls"], help="most collective calls in one graph")
    p.add_argument("--hold-us", type=float, default=d["hold_us"], help="GPU sleep before each timed start")
    p.add_argument("--ladder", nargs="+", type=parse_size, default=d["ladder"],
                   help="collective sizes (bytes per rank) to choose from")
    p.add_argument("--dry-run", action="store_true", help="print the plan and its estimated duration; no GPU")
    p.add_argument("--out", default="results/local/c3/c3.csv")
    p.set_defaults(func=cmd_c3)


def add_e2e_parser(sub) -> None:
    from ..e2e.config import DEFAULTS as d, MODELS

    def positive(text: str) -> int:
        v = int(text)
        if v <= 0:
            raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
        return v

    p = sub.add_parser("e2e", help="LLM inference (Llama / Mixtral layers, random weights): TTFT, decode step, "
                                   "tokens/s with NCCL vs dmacoll collectives; logits compared")
    p.add_argument("--world", type=int, default=0, help="ranks (default: every visible GPU)")
    p.add_argument("--models", nargs="+", choices=list(MODELS), default=d["models"])
    p.add_argument("--layers", type=positive, default=d["layers"], help="the first N layers of each model")
    p.add_argument("--batches", nargs="+", type=positive, default=d["batches"])
    p.add_argument("--prompts", nargs="+", type=positive, default=d["prompts"], help="prompt lengths (tokens)")
    p.add_argument("--impls", nargs="+", choices=("nccl", "dma"), default=d["impls"],
                   help="collectives; the first is the logits reference")
    p.add_argument("--decode-steps", type=positive, default=d["decode_steps"], help="graph replays per timing")
    p.add_argument("--repeats", type=positive, default=d["repeats"])
    p.add_argument("--output-len", type=positive, default=d["output_len"],
                   help="tokens per request for the derived e2e tokens/s")
    p.add_argument("--chunk-tokens", type=positive, default=d["chunk_tokens"],
                   help="most tokens per prefill forward (whole prompts)")
    p.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default=d["dtype"])
    p.add_argument("--seed", type=int, default=d["seed"])
    p.add_argument("--check-dtype", default=d["check_dtype"], choices=["float32", "bfloat16", "float16"],
                   help="dtype of the logits check (one untimed prefill + decode step per model and impl)")
    p.add_argument("--rtol", type=float, default=d["rtol"], help="logits check: relative tolerance")
    p.add_argument("--atol", type=float, default=d["atol"], help="logits check: absolute, times rms(ref)")
    p.add_argument("--dry-run", action="store_true", help="print the plan and its estimated duration; no GPU")
    p.add_argument("--hf-config-dir", help="write a Hugging Face config.json per model (the --layers slice) "
                                          "here for vLLM dummy-weight runs, then exit")
    p.add_argument("--out", default="results/local/e2e/e2e.csv")
    p.set_defaults(func=cmd_e2e)


def cmd_ficco(a: argparse.Namespace) -> int:
    """FiCCO: a collective and its dependent GEMM, serial vs decomposed into overlapped pieces; --dry-run: plan."""
    from ..bench.ficco_grid import PEAK_TFLOPS, estimate_seconds

    cfg = dict(models=a.models, tokens=a.tokens, patterns=a.patterns, impls=a.impls, factors=a.factors,
               repeats=a.repeats, hold_us=a.hold_us)
    world = _planned_world(a, "ficco")
    est = estimate_seconds(cfg, world)
    print(f"dmacoll ficco: world {world}, {est['scenarios']} scenarios ({', '.join(est['labels'])}) x schedules "
          f"{', '.join(est['schedules'])}; estimated {est['seconds'] / 60:.1f} min (GEMMs at {PEAK_TFLOPS:g} "
          f"TFLOP/s)", flush=True)
    if a.dry_run:
        return 0
    from ..bench.ficco import FICCO_COLUMNS, run_ficco

    return _gpu_tool(a, "ficco", run_ficco, FICCO_COLUMNS, cfg, 1800)


def add_ficco_parser(sub) -> None:
    from ..bench import ficco_grid as g

    d = g.DEFAULTS
    p = sub.add_parser("ficco", help="FiCCO: all-gather->GEMM, GEMM->reduce-scatter, all-to-all->GEMM, serial vs "
                                     "decomposed pieces overlapped, on NCCL or dma")
    p.add_argument("--world", type=int, default=0, help="ranks (default: every visible GPU; --dry-run: 2)")
    p.add_argument("--models", nargs="+", choices=list(g.MODELS), default=d["models"])
    p.add_argument("--tokens", nargs="+", type=int, default=d["tokens"], help="global token counts")
    p.add_argument("--patterns", nargs="+", choices=list(g.PATTERNS), default=d["patterns"])
    p.add_argument("--impls", nargs="+", choices=g.IMPLS, default=d["impls"])
    p.add_argument("--factors", nargs="+", type=int, default=d["factors"], help="pieces d = factor x world")
    p.add_argument("--repeats", type=int, default=d["repeats"])
    p.add_argument("--hold-us", type=float, default=d["hold_us"], help="GPU sleep before each timed start")
    p.add_argument("--dry-run", action="store_true", help="print the plan and its estimated duration; no GPU")
    p.add_argument("--out", default="results/local/ficco/ficco.csv")
    p.set_defaults(func=cmd_ficco)


def main(argv: Optional[Sequence[str]] = None) -> int:
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
