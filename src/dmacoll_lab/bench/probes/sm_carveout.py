"""Can a GEMM leave SMs free for the few kernels a copy-engine collective still needs? (one GPU)

The dma all-to-all's own-chunk copy and the reduce ops' sum run on SMs, and next to a cuBLAS GEMM they wait for it
(``dmacoll probe local_copy_paths``): its persistent kernels hold every SM. Two knobs give SMs back:

* a carveout, ``torch._C._set_sm_carveout_experimental(n)``: cuBLAS(Lt) is asked to size the GEMM for
  ``SMs - n`` SMs (``CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET``), so ``n`` SMs stay free;
* a green context of ``k`` SMs for the GEMM's stream (``dmacoll_lab.bench.green``); cuBLAS does not see it, so its
  persistent grid is still sized for every SM (a carveout of ``SMs - k`` tells it).

For each BLAS library (``torch.backends.cuda.preferred_blas_library``) and setting this times three bf16 8192^3
GEMMs alone, and next to each of two side jobs that arrive 100 us after the GEMMs start (as every call after the
first of a back-to-back series does): a 64 MB device-local copy (the own chunk) and a bf16 add of two 16 Mi-element
tensors (the reduce ops' sum). Medians of 5. Columns: ``gemm_alone_us``; ``side_alone_us``; ``side_us`` (side
issue -> end, next to the GEMMs); ``gemm_us`` (release -> GEMMs' end, next to the side job).

GEMM times drift between settings measured one after the other (clocks, power), so what a carveout costs the GEMM
is measured apart, interleaved: a second table, ``sm_carveout_gemm_cost`` (a run folder beside this one), has, for
C3 GEMM shapes, each of cuBLAS, cuBLASLt and cuBLASLt with carveouts 8 and 16 timed in turn, ``--rounds`` rounds,
and the median ratio to cuBLAS per round.

Usage: dmacoll probe sm_carveout [--repeats 5] [--rounds 15] [--copy-bytes 64M] [--add-elements 16M] [--out CSV]
"""
from __future__ import annotations

import argparse
import statistics

from dmacoll.lab_api import human
from .common import Table, add_repeats, count, gemm_and_side_operands, idle_gpu_us, next_to_gemms, size_multiple_of

NAME = "sm_carveout"
HELP = "SM carveouts, green contexts: does a copy / bf16 add next to GEMMs find free SMs; their GEMM cost (1 GPU)"
GPUS = 1
COLUMNS = ["blas", "setting", "green_sms", "carveout", "side", "gemm_alone_us", "side_alone_us", "side_us", "gemm_us",
           "correct"]
COST = NAME + "_gemm_cost"  # the GEMM-cost table's run folder, beside this probe's
COST_COLUMNS = ["M", "N", "K", "blas", "carveout", "gemm_us", "ratio_to_cublas"]
EXTRA = {COST: COST_COLUMNS}
COST_SHAPES = ((512, 28672, 8192), (2048, 8192, 8192), (8192, 14336, 4096), (16384, 8192, 8192))  # M, N, K
COST_SETTINGS = (("cublas", None), ("cublaslt", None), ("cublaslt", 8), ("cublaslt", 16))  # the first: the baseline
SETTINGS = (  # (name, green-context SMs or None, carveout or None)
    ("full", None, None), ("carveout_4", None, 4), ("carveout_8", None, 8), ("carveout_16", None, 16),
    ("green_128", 128, None), ("green_128_carveout_4", 128, 4), ("green_120_carveout_12", 120, 12))
SIDE_DELAY_US = 100


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_repeats(p, 5)
    p.add_argument("--rounds", type=count, default=15, help="interleaved rounds of the GEMM-cost table (default 15)")
    p.add_argument("--copy-bytes", type=size_multiple_of(1 << 20), default=64 << 20,
                   help="the device-local copy's bytes (whole MB; default 64M)")
    p.add_argument("--add-elements", type=size_multiple_of(1 << 20), default=16 << 20,
                   help="bf16 elements per add operand (whole Mi; default 16M = 16 Mi)")


def side_names(copy_bytes: int, add_elements: int) -> tuple[str, str]:
    """The side jobs' names, which carry their sizes (``local_copy_64MB``, ``add_bf16_16Mi`` by default)."""
    return f"local_copy_{human(copy_bytes).replace(' ', '')}", f"add_bf16_{add_elements >> 20}Mi"


def setting_row(blas: str, setting: str, green_sms, carveout, total_sms: int, side: str, gemm_alone: float,
                side_alone: float, together: list[tuple[float, float]], correct: bool) -> dict:
    """One (library, setting, side job) from its times: GEMMs alone, side alone, (side_us, gemm_us) together."""
    return {"blas": blas, "setting": setting, "green_sms": green_sms or total_sms, "carveout": carveout or 0,
            "side": side, "gemm_alone_us": gemm_alone, "side_alone_us": side_alone,
            "side_us": statistics.median(t[0] for t in together),
            "gemm_us": statistics.median(t[1] for t in together), "correct": correct}


def cost_rows(m: int, n: int, k: int, times: dict[tuple, list[float]]) -> list[dict]:
    """One shape's GEMM-cost rows from each COST_SETTINGS' times per round (3 GEMMs each): the median time, and the
    median over rounds of that setting's time / cuBLAS's time in the same round."""
    base = times[COST_SETTINGS[0]]
    return [{"M": m, "N": n, "K": k, "blas": blas, "carveout": carveout or 0, "gemm_us": statistics.median(ts),
             "ratio_to_cublas": statistics.median(t / t0 for t, t0 in zip(ts, base))}
            for (blas, carveout), ts in times.items()]


def run(args: argparse.Namespace) -> dict[str, Table]:
    import torch

    from ..green import green_stream
    from ..harness import sleep_cycles_per_us

    total = torch.cuda.get_device_properties(0).multi_processor_count
    a, c, src, dst, x, y, z = gemm_and_side_operands(args.copy_bytes, args.add_elements)
    copy_name, add_name = side_names(args.copy_bytes, args.add_elements)
    sides = {copy_name: lambda: dst.copy_(src), add_name: lambda: torch.add(x, y, out=z)}
    expected = {copy_name: lambda: torch.equal(dst, src), add_name: lambda: torch.equal(z, x + y)}
    side_stream = torch.cuda.Stream()
    cycles = sleep_cycles_per_us()
    hold, delay = int(200 * cycles), int(SIDE_DELAY_US * cycles)
    greens = {k: green_stream(k, 0) for k in {g for _, g, _ in SETTINGS if g}}

    def gemms(stream):
        with torch.cuda.stream(stream):
            for _ in range(3):
                torch.mm(a, a, out=c)

    def side_by_side(side, comp) -> tuple[float, float]:
        return next_to_gemms(side, side_stream, lambda: gemms(comp), comp, hold, delay)

    rows = []
    for blas in ("cublas", "cublaslt"):
        torch.backends.cuda.preferred_blas_library(blas)
        for name, green_sms, carveout in SETTINGS:
            torch._C._set_sm_carveout_experimental(carveout)
            comp = greens[green_sms].stream if green_sms else torch.cuda.Stream()
            # the warm-up call: cuBLAS's choice for this setting
            gemm_alone = statistics.median(idle_gpu_us(lambda: gemms(comp), comp, args.repeats, warmup=1))
            for side_name, side in sides.items():
                side_alone = statistics.median(idle_gpu_us(side, side_stream, args.repeats))
                together = [side_by_side(side, comp) for _ in range(args.repeats)]
                rows.append(setting_row(blas, name, green_sms, carveout, total, side_name, gemm_alone, side_alone,
                                        together, expected[side_name]()))
                r = rows[-1]
                print(f"{blas:8s} {name:22s} {side_name:16s} GEMMs alone {gemm_alone:7.0f} us | side alone "
                      f"{side_alone:6.0f} us, next to the GEMMs {r['side_us']:7.0f} us | GEMMs then "
                      f"{r['gemm_us']:7.0f} us{'' if r['correct'] else '  WRONG'}", flush=True)
    torch._C._set_sm_carveout_experimental(None)
    config = {"gemm": "3x bf16 8192^3", "repeats": args.repeats, "sms": total, "side_delay_us": SIDE_DELAY_US,
              "copy_bytes": args.copy_bytes, "add_elements": args.add_elements}
    cost = gemm_cost(args.rounds)
    torch.backends.cuda.preferred_blas_library("cublas")
    return {NAME: Table(rows, config),
            COST: Table(cost, {"shapes": COST_SHAPES, "rounds": args.rounds, "gemms_per_time": 3})}


def gemm_cost(rounds: int) -> list[dict]:
    """Per shape: every COST_SETTINGS timed in turn for ``rounds`` rounds (3 GEMMs each time): ``cost_rows``."""
    import torch

    rows = []
    stream = torch.cuda.Stream()
    for m, n, k in COST_SHAPES:
        a = torch.randn(m, k, device=0, dtype=torch.bfloat16)
        b = torch.randn(k, n, device=0, dtype=torch.bfloat16)
        c = torch.empty(m, n, device=0, dtype=torch.bfloat16)

        def three():
            for _ in range(3):
                torch.mm(a, b, out=c)

        times = {s: [] for s in COST_SETTINGS}
        for r in range(rounds + 1):
            for blas, carveout in COST_SETTINGS:
                torch.backends.cuda.preferred_blas_library(blas)
                torch._C._set_sm_carveout_experimental(carveout)
                t = idle_gpu_us(three, stream)[0]
                if r:  # round 0 warms every setting up
                    times[(blas, carveout)].append(t)
        torch._C._set_sm_carveout_experimental(None)
        for row in cost_rows(m, n, k, times):
            rows.append(row)
            print(f"{m}x{n}x{k} {row['blas']:8s} carveout {row['carveout']:2d}: 3 GEMMs {row['gemm_us']:8.1f} us, "
                  f"x{row['ratio_to_cublas']:.3f} of cuBLAS", flush=True)
    return rows
