"""The measurements: `dmacoll sweep`, `tune`, `power`, `sm-usage`, `breakdown`, `c3`, `interference` (C3 at fixed
sizes), `ficco`, `check-cost` (the cross-rank check of each call), and `amd-dmalatte` (the authors' benchmark
output as a sweep table)."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Optional

from dmacoll.lab_api import InvalidArgument, seconds
from .common import (add_out, add_ranks, add_sizes, apply_timeout, existing_file, gpu_world, parse_size, planned_world,
                     positive, run_on_gpus)


def cmd_sweep(a: argparse.Namespace) -> int:
    from ..bench.sweep import SweepConfig

    return sweep(SweepConfig.from_args(a), a, host=a.backend == "host")


def sweep(cfg, a: argparse.Namespace, host: bool) -> int:
    """Run the sweep ``cfg`` on the ranks ``a`` asks for (--world; --timeout-s, --deadline-s), on the host emulator
    or the GPUs: what `dmacoll sweep` does, and `dmacoll tune` where it measures. On the host emulator what needs
    CUDA (an implementation, graph mode) is left out of a default list with one line, and refused (exit 2) where
    the command asked for it by name."""
    import dataclasses

    from ..bench.sweep import CUDA_IMPLS, HEAP_IMPLS, run_sweep
    from ..verify.launch import run_ranks

    for field, cuda_only in (("impls", CUDA_IMPLS), ("modes", ("graph",))) if host else ():
        cannot = [v for v in getattr(cfg, field) if v in cuda_only]
        if cannot and getattr(a, field, None):
            print(f"dmacoll sweep: --backend host cannot run {field} {' '.join(cannot)} (CUDA only); leave it out of "
                  f"--{field}", file=sys.stderr)
            return 2
        if cannot:
            print(f"dmacoll sweep: leaving out {field} {' '.join(cannot)} (CUDA only) on the host emulator")
            cfg = dataclasses.replace(cfg, **{field: tuple(v for v in getattr(cfg, field) if v not in cannot)})

    if "nccl_ce" in cfg.impls and set(HEAP_IMPLS) & set(cfg.impls):
        print("dmacoll sweep: run nccl_ce in a sweep of its own: it switches torch's symmetric-memory backend to "
              "NCCL for the whole process", file=sys.stderr)
        return 2
    if host and (a.world or 0) < 2:
        raise InvalidArgument("--backend host needs --world N (N >= 2 CPU ranks)")
    world = a.world if host else gpu_world(a)
    apply_timeout(a)
    run_ranks(run_sweep, world, cfg, device="cpu" if host else "cuda", timeout_s=a.deadline_s)
    return 0


def cmd_tune(a: argparse.Namespace) -> int:
    """Measure every dma variant (or read a sweep) and write the fastest per (op, size, mode, place); --quick:
    calibrate (what Communicator() does on a platform without a table) and cache the table."""
    if a.quick:
        return cmd_tune_quick(a)
    from ..analysis import load
    from ..analysis.tuning_table import derive
    from ..bench import provenance

    out = Path(a.out)
    csvs = a.from_sweep
    for csv in csvs or ():
        if not Path(csv).with_suffix(".json").is_file():
            raise InvalidArgument(f"--from-sweep {csv}: its provenance sidecar {Path(csv).with_suffix('.json')} "
                                  "is missing (every sweep CSV is written with one beside it)")
    if not csvs:
        from ..bench.sweep import SweepConfig

        sweep_csv = str(out.with_suffix(".sweep.csv"))
        # --backend host: the sweep on the host emulator (mechanics only); every other backend: the GPUs
        rc = sweep(SweepConfig.from_args(a, impls=("dma",), out=sweep_csv), a, host=a.backend == "host")
        if rc:
            return rc
        csvs = [sweep_csv]
    table = derive(csvs, load.provenance(csvs[0]))
    provenance.write_atomic(out, table.to_json())
    print(f"wrote {out}: {len(table.entries)} entries from {csvs} (world {table.meta['world']}, "
          f"{table.meta['gpu']}, code {str(table.meta['source_git_sha'])[:10]})")
    return 0


def tune_rank(rank: int, world: int, backend: str, budget: Optional[float] = None) -> tuple[Optional[str], str]:
    """One rank of ``dmacoll tune --quick``: ``Communicator.calibrate()`` (whatever table the platform has) within
    ``budget`` seconds; the table (JSON; None where the calibration failed) and where it is cached."""
    from dmacoll.lab_api import Communicator, calibration_cache as cache, tuning

    os.environ["DMACOLL_CALIBRATE"] = "0"  # the constructor looks for no table to calibrate: calibrate() does
    comm = Communicator(backend=backend)
    try:
        table = comm.tuning if comm.calibrate(budget) else None  # this platform may have a table: measure anyway
        where = cache.path(tuning.Platform(**{k: table.meta[k] for k in tuning.Platform._fields})) if table else ""
        return (table.to_json() if table else None), str(where)
    finally:
        comm.close()


def cmd_tune_quick(a: argparse.Namespace) -> int:
    from dmacoll.lab_api import resolve
    from ..bench import provenance
    from ..verify.launch import run_ranks

    backend = resolve(a.backend)
    world = (a.world or 2) if backend == "host" else gpu_world(a)
    apply_timeout(a)
    text, where = run_ranks(tune_rank, world, backend, a.budget_s, device="cpu" if backend == "host" else "cuda",
                            timeout_s=a.deadline_s)[0]
    if text is None:
        print("dmacoll tune --quick: the calibration failed (see above)", file=sys.stderr)
        return 1
    provenance.write_atomic(Path(a.out), text)
    print(f"wrote {a.out}; cached in {where}")
    for line in path_summary(text):
        print(line)
    return 0


def path_summary(text: str) -> list[str]:
    """Where a calibrated table (JSON) sends 'auto' calls, per op and mode: each path's sizes, as measured
    (``TuningTable.fastest_path`` at each size the table holds); nothing for a table without path times."""
    import itertools

    from dmacoll.lab_api import human, options, tuning

    table = tuning.TuningTable.from_json(text)
    lines = []
    for op, mode in sorted({(e.op, e.mode) for e in table.paths}):
        sizes = sorted({e.bytes_per_rank for e in table.paths if (e.op, e.mode) == (op, mode)})
        picks = [(s, table.fastest_path(op, s, mode, options.PATHS, "nccl", options.PATH_MARGIN)) for s in sizes]
        spans = []  # each run of sizes sent the same way: its path, first and last size
        for path, run in itertools.groupby(picks, key=lambda pick: pick[1]):
            run = [size for size, _ in run]
            spans.append(f"{path} {human(run[0])}" + (f"-{human(run[-1])}" if len(run) > 1 else ""))
        lines.append(f"auto, {op} {mode}: " + ", ".join(spans))
    return lines


def cmd_power(a: argparse.Namespace) -> int:
    from ..bench.power import POWER_COLUMNS, run_power

    cfg = dict(ops=a.ops, impls=a.impls, sizes=a.sizes, seconds=a.seconds, idle_seconds=a.idle_seconds,
               repeats=a.repeats, dtype=a.dtype)
    return run_on_gpus(a, run_power, POWER_COLUMNS, cfg)


def cmd_sm_usage(a: argparse.Namespace) -> int:
    from ..bench.smusage import SM_COLUMNS, run_sm_usage

    cfg = dict(ops=a.ops, impls=a.impls, sizes=a.sizes, calls=a.calls, modes=a.modes)
    return run_on_gpus(a, run_sm_usage, SM_COLUMNS, cfg)


def cmd_breakdown(a: argparse.Namespace) -> int:
    import torch

    from ..bench import harness
    from ..bench.breakdown import BREAKDOWN_COLUMNS, run_breakdown

    if not torch.cuda.is_available():
        print("dmacoll breakdown needs a CUDA GPU", file=sys.stderr)
        return 2
    cfg = dict(sizes=a.sizes, transfers=a.transfers, warmup=a.warmup, src=a.src, dst=a.dst)
    harness.write(a.out, run_breakdown(**cfg), BREAKDOWN_COLUMNS, cfg)
    return 0


def c3_config(a: argparse.Namespace) -> dict:
    return dict(shapes=a.shapes, ops=a.ops, strategies=a.strategies, targets=a.targets, sizes=a.sizes,
                sm_fractions=a.sm_fractions, carveout_sms=a.carveout_sms, repeats=a.repeats,
                min_comp_us=a.min_comp_us, max_calls=a.max_calls, hold_us=a.hold_us, ladder=a.ladder)


def cmd_c3(a: argparse.Namespace) -> int:
    """C3 (ConCCL): compute next to a collective per strategy; --dry-run: the plan only."""
    from ..bench.c3_grid import estimate_seconds

    cfg = c3_config(a)
    est = estimate_seconds(cfg)
    print(f"dmacoll {a.cmd}: {est['shapes']} shapes, {est['scenarios']} scenarios x options "
          f"{', '.join(est['options'])}; estimated {est['seconds'] / 60:.1f} min", flush=True)
    if a.dry_run:
        return 0
    from ..bench.c3 import C3_COLUMNS, run_c3

    return run_on_gpus(a, run_c3, C3_COLUMNS, cfg)


def cmd_ficco(a: argparse.Namespace) -> int:
    """FiCCO: a collective and its dependent GEMM, serial vs decomposed into overlapped pieces; --dry-run: plan."""
    from ..bench.ficco_grid import PEAK_TFLOPS, estimate_seconds

    cfg = dict(models=a.models, tokens=a.tokens, patterns=a.patterns, impls=a.impls, factors=a.factors,
               repeats=a.repeats, hold_us=a.hold_us)
    world = planned_world(a)
    est = estimate_seconds(cfg, world)
    print(f"dmacoll ficco: world {world}, {est['scenarios']} scenarios ({', '.join(est['labels'])}) x schedules "
          f"{', '.join(est['schedules'])}; estimated {est['seconds'] / 60:.1f} min (GEMMs at {PEAK_TFLOPS:g} "
          f"TFLOP/s)", flush=True)
    if a.dry_run:
        return 0
    from ..bench.ficco import FICCO_COLUMNS, run_ficco

    return run_on_gpus(a, run_ficco, FICCO_COLUMNS, cfg)


def cmd_check_cost(a: argparse.Namespace) -> int:
    """The cost of the cross-rank check of each call: on every GPU, or on the host emulator without one."""
    import torch

    from ..bench import harness
    from ..bench.check_cost import CHECK_COST_COLUMNS, run_check_cost
    from ..verify.launch import run_ranks

    cfg = dict(ops=a.ops, sizes=a.sizes, calls=a.calls, repeats=a.repeats, dtype=a.dtype, seed=a.seed)
    if torch.cuda.device_count():
        return run_on_gpus(a, run_check_cost, CHECK_COST_COLUMNS, cfg)
    from dmacoll.lab_api import validate

    world = a.world or 2
    validate.check_world(world)
    apply_timeout(a)
    harness.write(a.out, run_ranks(run_check_cost, world, cfg, timeout_s=a.deadline_s)[0], CHECK_COST_COLUMNS, cfg)
    return 0


def cmd_amd_dmalatte(a: argparse.Namespace) -> int:
    from ..bench.amd_dmalatte import OPS, convert

    out = convert(a.stdout, a.out, world=a.world, op=OPS.get(a.op) if a.op else None, variant=a.variant)
    print(f"wrote {out}")
    return 0


def register(sub) -> None:
    from ..bench.sweep import CUDA_IMPLS, DEFAULT_IMPLS, IMPLS
    from dmacoll.lab_api import DIRECTIONS, SIGNAL_MODES, VARIANTS, names

    s = sub.add_parser("sweep", help="time collectives over message sizes (GPUs)")
    add_ranks(s, deadline_s=3600.0)
    s.add_argument("--ops", nargs="+", choices=names(), default=["all_gather", "all_to_all"])
    s.add_argument("--impls", nargs="+", choices=IMPLS, default=None,
                   help="dma_default: a call with no options on Communicator() (what a user gets); dma: every "
                        f"configuration of the options below (default: {' '.join(DEFAULT_IMPLS)}; on --backend "
                        f"host without {' and '.join(CUDA_IMPLS)}, which need CUDA)")
    s.add_argument("--backend", choices=("gpu", "host"), default="gpu",
                   help="host: CPU ranks on the host emulator (gloo for nccl), to test the workflow without GPUs; "
                        "its times are not GPU measurements")
    add_sweep_options(s, VARIANTS, DIRECTIONS, SIGNAL_MODES)
    add_out(s, "results/local/operator/sweep/data.csv")
    s.set_defaults(func=cmd_sweep)

    t = sub.add_parser("tune", help="measure the dma variants and write a tuning table for variant='auto'")
    add_ranks(t, deadline_s=3600.0)
    t.add_argument("--ops", nargs="+", choices=names(), default=["all_gather", "all_to_all"])
    add_sweep_options(t, VARIANTS, DIRECTIONS, SIGNAL_MODES)
    t.add_argument("--from-sweep", nargs="+", type=existing_file,
                   help="derive from existing sweep CSV(s) instead of measuring")
    t.add_argument("--quick", action="store_true",
                   help="calibrate instead of sweeping: what Communicator() does where no table fits (the options "
                        "above do not apply), bounded by --budget-s; the table goes to the user's cache (and --out)")
    t.add_argument("--backend", choices=("auto", "cuda", "hip", "host"), default="auto",
                   help="--quick: the backend (host: the CPU emulator, mechanics only)")
    t.add_argument("--budget-s", type=seconds, default=None,
                   help="--quick: seconds the calibration may take ($DMACOLL_CALIBRATE_BUDGET_S, else 20)")
    t.add_argument("--out", default="results/local/tuning.json", help="the tuning table (JSON)")
    t.set_defaults(func=cmd_tune)

    w = sub.add_parser("power", help="energy and power per collective (NVML / amdsmi), idle baseline subtracted")
    add_gpu_tool(w, names(), ("1K", "1M", "256M"))
    w.add_argument("--seconds", type=float, default=2.0, help="sustained run per measurement")
    w.add_argument("--idle-seconds", type=float, default=2.0)
    w.add_argument("--repeats", type=int, default=3)
    w.add_argument("--dtype", default="bfloat16")
    add_out(w, "results/local/power/power/data.csv")
    w.set_defaults(func=cmd_power)

    m = sub.add_parser("sm-usage", help="GPU kernels vs copy-engine work per collective (PyTorch profiler)")
    add_gpu_tool(m, names(), ("64K", "4M", "256M"))
    m.add_argument("--modes", nargs="+", choices=("graph", "eager"), default=["graph", "eager"])
    m.add_argument("--calls", type=int, default=10)
    add_out(m, "results/local/power/sm_usage/data.csv")
    m.set_defaults(func=cmd_sm_usage)

    b = sub.add_parser("breakdown", help="control/schedule/copy/sync phases of one copy-engine transfer (CUPTI)")
    add_sizes(b, ("1K", "4K", "16K", "64K", "256K", "1M", "4M", "16M", "64M"), "transfer sizes")
    b.add_argument("--transfers", type=int, default=30, help="profiled transfers per size")
    b.add_argument("--warmup", type=int, default=5)
    b.add_argument("--src", type=int, default=0, help="sender GPU")
    b.add_argument("--dst", type=int, default=None, help="receiver GPU (default: 1, or 0 on a one-GPU machine)")
    add_out(b, "results/local/breakdown/breakdown/data.csv")
    b.set_defaults(func=cmd_breakdown)

    from ..bench import c3_grid

    add_c3_parser(sub, "c3", c3_grid.DEFAULTS, "results/local/c3/c3/data.csv",
                  "compute next to a collective per strategy (baseline, priority, SM partition, SM carveout, dma, "
                  "dma+priority, dma+partition, dma+carveout): ConCCL's C3 metrics")
    add_c3_parser(sub, "interference", c3_grid.INTERFERENCE, "results/local/power/interference/data.csv",
                  "C3 at fixed collective sizes: how a large GEMM / memory-bound add and an all-gather slow each "
                  "other down (NCCL vs dma)")
    add_ficco_parser(sub)

    k = sub.add_parser("check-cost", help="what the cross-rank check of each call (check_calls) adds to an eager "
                                          "call (GPUs; without one, the host emulator)")
    add_ranks(k)
    k.add_argument("--ops", nargs="+", choices=names(), default=list(names()))
    add_sizes(k, ("1K", "1M"))
    k.add_argument("--calls", type=positive, default=20, help="calls per timed batch")
    k.add_argument("--repeats", type=positive, default=15)
    k.add_argument("--dtype", default="bfloat16")
    k.add_argument("--seed", type=int, default=0)
    add_out(k, "results/local/check_calls/check_cost/data.csv")
    k.set_defaults(func=cmd_check_cost)

    d = sub.add_parser("amd-dmalatte", help="the authors' sdma_collective output as the sweep's tidy CSV")
    d.add_argument("stdout", type=existing_file, help="sdma_collective's console output")
    d.add_argument("out", help="CSV to write")
    d.add_argument("--world", type=int, required=True)
    d.add_argument("--op", choices=("ag", "aa", "all_gather", "all_to_all"), default=None)
    d.add_argument("--variant", default=None, help="pcpy / bcst / swap / b2b, optionally +PRELAUNCH")
    d.set_defaults(func=cmd_amd_dmalatte)


def add_sweep_options(s: argparse.ArgumentParser, variants, directions, signals) -> None:
    from dmacoll.lab_api import WAIT_MODES

    s.add_argument("--variants", nargs="+", choices=variants, default=list(variants))
    s.add_argument("--directions", nargs="+", choices=directions, default=list(directions))
    s.add_argument("--places", nargs="+", choices=("out", "in"), default=["out", "in"],
                   help="dma: out of place and/or in place (ops that have the form)")
    s.add_argument("--signals", nargs="+", choices=signals, default=["memop"],
                   help="dma: how flags reach peers (copy, kernel: reset sync only)")
    s.add_argument("--waits", nargs="+", choices=WAIT_MODES, default=["memop"],
                   help="dma: how flags are awaited (spin: a polling kernel; fold: also inside the reduce ops' sum)")
    s.add_argument("--prerecord", nargs="+", choices=("no", "yes"), default=["no"],
                   help="dma, eager mode: also replay a graph recorded on first use")
    s.add_argument("--submit", nargs="+", choices=("python", "native"), default=["python"],
                   help="dma, eager mode: issue driver calls from Python and/or the native library (dmacoll build)")
    s.add_argument("--handshakes", nargs="+", choices=("full", "lean"), default=["full"],
                   help="dma push: lean = calls alternate between two outputs and skip READY (one flag crossing)")
    s.add_argument("--min-bytes", type=parse_size, default=parse_size("1K"), help="bytes per rank")
    s.add_argument("--max-bytes", type=parse_size, default=parse_size("256M"), help="bytes per rank")
    s.add_argument("--modes", nargs="+", choices=("graph", "eager"), default=None,
                   help="CUDA-graph replayed and/or eager calls (default: both; eager only on --backend host)")
    s.add_argument("--dtype", default="bfloat16")
    s.add_argument("--calls", type=int, default=10, help="calls per timed batch (per graph)")
    s.add_argument("--repeats", type=int, default=5)
    s.add_argument("--warmup", type=int, default=3)
    s.add_argument("--seed", type=int, default=0)


def add_gpu_tool(parser: argparse.ArgumentParser, ops: tuple, sizes: tuple[str, ...]) -> None:
    add_ranks(parser)
    parser.add_argument("--ops", nargs="+", choices=ops, default=["all_gather", "all_to_all"])
    parser.add_argument("--impls", nargs="+", choices=("nccl", "dma"), default=["nccl", "dma"])
    add_sizes(parser, sizes)


def add_c3_parser(sub, name: str, d: dict, out: str, text: str) -> None:
    from dmacoll.lab_api import names
    from ..bench import c3_grid as g

    def shape(value: str) -> str:
        try:
            g.Shape.parse(value)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        return value

    def fraction(value: str) -> float:
        v = float(value)
        if not 0 < v < 1:
            raise argparse.ArgumentTypeError(f"an SM fraction is between 0 and 1: {value!r}")
        return v

    p = sub.add_parser(name, help=text)
    add_ranks(p, deadline_s=3600.0)
    p.add_argument("--shapes", nargs="+", type=shape, default=d["shapes"],
                   help="gemm:MxNxK (bf16 (MxK)@(KxN)) or membound:MxN (bf16 add)")
    p.add_argument("--ops", nargs="+", choices=names(), default=d["ops"])
    p.add_argument("--strategies", nargs="+", choices=g.STRATEGIES, default=d["strategies"])
    p.add_argument("--targets", nargs="+", type=float, default=d["targets"], help="T_comm / T_comp to aim at")
    p.add_argument("--sizes", nargs="+", type=parse_size, default=d["sizes"],
                   help="fixed collective sizes (bytes per rank), each called to span the compute, instead of "
                        "--targets")
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
    add_out(p, out)
    p.set_defaults(func=cmd_c3)


def add_ficco_parser(sub) -> None:
    from ..bench import ficco_grid as g

    d = g.DEFAULTS
    p = sub.add_parser("ficco", help="FiCCO: all-gather->GEMM, GEMM->reduce-scatter, all-to-all->GEMM, serial vs "
                                     "decomposed pieces overlapped, on NCCL or dma")
    add_ranks(p)
    p.add_argument("--models", nargs="+", choices=list(g.MODELS), default=d["models"])
    p.add_argument("--tokens", nargs="+", type=int, default=d["tokens"], help="global token counts")
    p.add_argument("--patterns", nargs="+", choices=list(g.PATTERNS), default=d["patterns"])
    p.add_argument("--impls", nargs="+", choices=g.IMPLS, default=d["impls"])
    p.add_argument("--factors", nargs="+", type=int, default=d["factors"], help="pieces d = factor x world")
    p.add_argument("--repeats", type=int, default=d["repeats"])
    p.add_argument("--hold-us", type=float, default=d["hold_us"], help="GPU sleep before each timed start")
    p.add_argument("--dry-run", action="store_true", help="print the plan and its estimated duration; no GPU")
    add_out(p, "results/local/ficco/ficco/data.csv")
    p.set_defaults(func=cmd_ficco)
