"""Can a GEMM leave SMs free for the few kernels a copy-engine collective still needs? (one GPU)

The dma all-to-all's own-chunk copy and the reduce ops' sum run on SMs, and next to a cuBLAS GEMM they wait for it
(`tools/probe_local_copy_paths.py`): its persistent kernels hold every SM. Two knobs give SMs back:

* a carveout, ``torch._C._set_sm_carveout_experimental(n)``: cuBLAS(Lt) is asked to size the GEMM for
  ``SMs - n`` SMs (``CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET``), so ``n`` SMs stay free;
* a green context of ``k`` SMs for the GEMM's stream (``dmacoll.bench.green``); cuBLAS does not see it, so its
  persistent grid is still sized for every SM (a carveout of ``SMs - k`` tells it).

For each BLAS library (``torch.backends.cuda.preferred_blas_library``) and setting this times three bf16 8192^3
GEMMs alone, and next to each of two side jobs that arrive 100 us after the GEMMs start (as every call after the
first of a back-to-back series does): a 64 MB device-local copy (the own chunk) and a bf16 add of two 16 Mi-element
tensors (the reduce ops' sum). Medians of 5. Columns: ``gemm_alone_us``; ``side_alone_us``; ``side_us`` (side
issue -> end, next to the GEMMs); ``gemm_us`` (release -> GEMMs' end, next to the side job).

GEMM times drift between settings measured one after the other (clocks, power), so what a carveout costs the GEMM
is measured apart, interleaved: ``OUT_gemm_cost.csv`` has, for C3 GEMM shapes, each of cuBLAS, cuBLASLt and
cuBLASLt with carveouts 8 and 16 timed in turn, ``ROUNDS`` rounds, and the median ratio to cuBLAS per round.

Usage: python3 tools/probe_sm_carveout.py OUT.csv
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

REPEATS = 5
ROUNDS = 15
COST_SHAPES = ((512, 28672, 8192), (2048, 8192, 8192), (8192, 14336, 4096), (16384, 8192, 8192))  # M, N, K
COST_SETTINGS = (("cublas", None), ("cublaslt", None), ("cublaslt", 8), ("cublaslt", 16))
SETTINGS = (  # (name, green-context SMs or None, carveout or None)
    ("full", None, None), ("carveout_4", None, 4), ("carveout_8", None, 8), ("carveout_16", None, 16),
    ("green_128", 128, None), ("green_128_carveout_4", 128, 4), ("green_120_carveout_12", 120, 12))
COLUMNS = ["blas", "setting", "green_sms", "carveout", "side", "gemm_alone_us", "side_alone_us", "side_us", "gemm_us",
           "correct"]


def main() -> int:
    import torch

    from dmacoll.bench import provenance
    from dmacoll.bench.c3 import sleep_cycles_per_us
    from dmacoll.bench.green import green_stream

    total = torch.cuda.get_device_properties(0).multi_processor_count
    a = torch.randn(8192, 8192, device=0, dtype=torch.bfloat16)
    c = torch.empty_like(a)
    src = torch.randint(0, 255, (64 << 20,), dtype=torch.uint8, device=0)
    dst = torch.empty_like(src)
    x, y = torch.randn(16 << 20, device=0, dtype=torch.bfloat16), torch.randn(16 << 20, device=0, dtype=torch.bfloat16)
    z = torch.empty_like(x)
    sides = {"local_copy_64MB": lambda: dst.copy_(src), "add_bf16_16Mi": lambda: torch.add(x, y, out=z)}
    expected = {"local_copy_64MB": lambda: torch.equal(dst, src), "add_bf16_16Mi": lambda: torch.equal(z, x + y)}
    side_stream = torch.cuda.Stream()
    cycles = sleep_cycles_per_us()
    hold, delay = int(200 * cycles), int(100 * cycles)
    greens = {k: green_stream(k, 0) for k in {g for _, g, _ in SETTINGS if g}}

    def gemms(stream):
        with torch.cuda.stream(stream):
            for _ in range(3):
                torch.mm(a, a, out=c)

    def timed(fn, stream) -> float:
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        with torch.cuda.stream(stream):
            fn()
        end.record(stream)
        torch.cuda.synchronize()
        return start.elapsed_time(end) * 1e3

    def side_by_side(side, comp) -> tuple[float, float]:
        """(side issue -> end, release -> GEMMs' end): both streams sleep from one instant, the side longer."""
        torch.cuda.synchronize()
        release, side_start, side_end, gemm_end = (torch.cuda.Event(enable_timing=True) for _ in range(4))
        with torch.cuda.stream(comp):
            torch.cuda._sleep(hold)
        release.record(comp)
        gemms(comp)
        gemm_end.record(comp)
        with torch.cuda.stream(side_stream):
            torch.cuda._sleep(hold + delay)
        side_start.record(side_stream)
        with torch.cuda.stream(side_stream):
            side()
        side_end.record(side_stream)
        torch.cuda.synchronize()
        return side_start.elapsed_time(side_end) * 1e3, release.elapsed_time(gemm_end) * 1e3

    rows = []
    for blas in ("cublas", "cublaslt"):
        torch.backends.cuda.preferred_blas_library(blas)
        for name, green_sms, carveout in SETTINGS:
            torch._C._set_sm_carveout_experimental(carveout)
            comp = greens[green_sms].stream if green_sms else torch.cuda.Stream()
            timed(lambda: gemms(comp), comp)  # warm-up (and cuBLAS's choice for this setting)
            gemm_alone = statistics.median(timed(lambda: gemms(comp), comp) for _ in range(REPEATS))
            for side_name, side in sides.items():
                side_alone = statistics.median(timed(side, side_stream) for _ in range(REPEATS))
                together = [side_by_side(side, comp) for _ in range(REPEATS)]
                rows.append({"blas": blas, "setting": name, "green_sms": green_sms or total, "carveout": carveout or 0,
                             "side": side_name, "gemm_alone_us": gemm_alone, "side_alone_us": side_alone,
                             "side_us": statistics.median(t[0] for t in together),
                             "gemm_us": statistics.median(t[1] for t in together), "correct": expected[side_name]()})
                r = rows[-1]
                print(f"{blas:8s} {name:22s} {side_name:16s} GEMMs alone {gemm_alone:7.0f} us | side alone "
                      f"{side_alone:6.0f} us, next to the GEMMs {r['side_us']:7.0f} us | GEMMs then {r['gemm_us']:7.0f} us"
                      f"{'' if r['correct'] else '  WRONG'}", flush=True)
    torch._C._set_sm_carveout_experimental(None)
    out = Path(sys.argv[1])
    provenance.write_table(out, rows, COLUMNS,
                           {"gemm": "3x bf16 8192^3", "repeats": REPEATS, "sms": total, "side_delay_us": 100})
    provenance.write_table(out.with_name(out.stem + "_gemm_cost.csv"), gemm_cost(timed), COST_COLUMNS,
                           {"shapes": COST_SHAPES, "rounds": ROUNDS, "gemms_per_time": 3})
    torch.backends.cuda.preferred_blas_library("cublas")
    return 0


COST_COLUMNS = ["M", "N", "K", "blas", "carveout", "gemm_us", "ratio_to_cublas"]


def gemm_cost(timed) -> list[dict]:
    """Per shape: every COST_SETTINGS timed in turn for ROUNDS rounds (3 GEMMs each time); medians, and the
    median over rounds of each setting's time / cuBLAS's time in the same round."""
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
        for r in range(ROUNDS + 1):
            for blas, carveout in COST_SETTINGS:
                torch.backends.cuda.preferred_blas_library(blas)
                torch._C._set_sm_carveout_experimental(carveout)
                t = timed(three, stream)
                if r:  # round 0 warms every setting up
                    times[(blas, carveout)].append(t)
        torch._C._set_sm_carveout_experimental(None)
        base = times[COST_SETTINGS[0]]
        for (blas, carveout), ts in times.items():
            rows.append({"M": m, "N": n, "K": k, "blas": blas, "carveout": carveout or 0,
                         "gemm_us": statistics.median(ts),
                         "ratio_to_cublas": statistics.median(t / t0 for t, t0 in zip(ts, base))})
            print(f"{m}x{n}x{k} {blas:8s} carveout {carveout or 0:2d}: 3 GEMMs {rows[-1]['gemm_us']:8.1f} us, "
                  f"x{rows[-1]['ratio_to_cublas']:.3f} of cuBLAS", flush=True)
    return rows


if __name__ == "__main__":
    sys.exit(main())
