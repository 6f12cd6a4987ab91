"""The C3 experiment's grid and arithmetic, free of GPUs: shapes, strategy options, collective sizing,
metrics rows and a duration estimate. The method is described in ``bench/c3.py``."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

DEFAULT_OPS = ("all_gather", "all_to_all", "reduce_scatter", "all_reduce")  # the measured grid (--ops: any)
STRATEGIES = ("baseline", "priority", "partition", "carveout", "dma", "dma_priority", "dma_partition", "dma_carveout")
NCCL_STRATEGIES = ("baseline", "priority", "partition", "carveout")
GREEN_STRATEGIES = ("partition", "dma_partition")
# the collective graph each strategy replays: NCCL or dmacoll's, captured on a default-priority stream or
# (``_hi``) on the greatest-priority one
GRAPH_OF = {"baseline": "nccl", "priority": "nccl_hi", "partition": "nccl", "carveout": "nccl", "dma": "dma",
            "dma_priority": "dma_hi", "dma_partition": "dma", "dma_carveout": "dma"}
CARVEOUT_STRATEGIES = ("carveout", "dma_carveout")  # the compute's GEMMs leave ``carveout_sms`` SMs free
CARVEOUT = "carveout"  # the compute setting of CARVEOUT_STRATEGIES (see compute_setting)
COMM_FIRST = ("priority", "dma_priority")  # strategies that launch the collective before the compute
LADDER = tuple(1 << p for p in range(16, 29, 2))  # 64 KB .. 256 MB per rank, x4 steps
# LLM GEMMs (Llama-3 8B / 70B: hidden 4096 / 8192, MLP 14336 / 28672) at 512..16384 tokens, and two adds
DEFAULT_SHAPES = (
    "gemm:512x4096x4096", "gemm:512x28672x8192", "gemm:2048x4096x14336", "gemm:2048x8192x8192",
    "gemm:2048x28672x8192", "gemm:8192x4096x4096", "gemm:8192x14336x4096", "gemm:8192x8192x28672",
    "gemm:16384x8192x8192", "gemm:16384x28672x8192", "membound:16384x8192", "membound:65536x8192",
)
PEAK_TFLOPS = 700.0   # H200 dense bf16 that a large cuBLAS GEMM reaches (8192^3 measured 1.38-1.5 ms)
HBM_TBPS = 4.0        # H200 HBM3e a streaming add reaches (4.8 TB/s peak)
RIDGE = PEAK_TFLOPS / HBM_TBPS  # flop/byte: below it an operator is memory-bound

C3_COLUMNS = ["strategy", "option", "compute", "M", "N", "K", "gflop", "intensity", "bound", "comp_reps", "op",
              "impl", "variant", "world", "rank", "bytes_per_rank", "comm_calls", "target_ratio", "ratio",
              "ratio_nccl", "t_comp_us", "t_comm_us", "t_comm_nccl_us", "t_comp_strategy_us", "t_comp_together_us",
              "t_comm_together_us", "t_c3_us", "comp_slowdown", "comm_slowdown", "ideal_speedup",
              "realized_speedup", "fraction_of_ideal", "speedup_vs_nccl_serial", "sm_split", "comm_priority",
              "correct", "skipped"]
NAN = float("nan")
DEFAULTS = {"shapes": list(DEFAULT_SHAPES), "ops": list(DEFAULT_OPS), "strategies": list(STRATEGIES),
            "targets": [0.25, 1.0, 4.0], "sizes": [], "sm_fractions": [0.75, 0.875], "carveout_sms": 8,
            "repeats": 7, "min_comp_us": 200.0, "max_calls": 128, "hold_us": 500.0, "ladder": list(LADDER)}
# `dmacoll interference`: the same measurement at fixed collective sizes, each called to span one large GEMM or
# memory-bound add (1 GiB per operand), NCCL against the tuned dma all-gather
INTERFERENCE = {**DEFAULTS, "shapes": ["gemm:8192x8192x8192", "membound:32768x16384"], "ops": ["all_gather"],
                "strategies": ["baseline", "dma"], "sizes": [64 << 10, 4 << 20, 256 << 20], "targets": [1.0],
                "repeats": 5, "max_calls": 4000}


def c3_metrics(t_comp: float, t_comm: float, t_c3: float) -> dict:
    """ConCCL's metrics from times measured alone and together (module docstring of ``bench/c3.py``)."""
    serial, longest = t_comp + t_comm, max(t_comp, t_comm)
    return {"ideal_speedup": serial / longest, "realized_speedup": serial / t_c3,
            "fraction_of_ideal": (serial - t_c3) / (serial - longest) if serial > longest else float("nan")}


@dataclass(frozen=True)
class Shape:
    compute: str  # gemm | membound
    M: int
    N: int
    K: int = 0

    @classmethod
    def parse(cls, text: str) -> "Shape":
        """``gemm:MxNxK`` or ``membound:MxN``."""
        kind, _, dims = text.partition(":")
        try:
            nums = [int(x) for x in dims.lower().split("x")]
        except ValueError:
            nums = []
        if (kind, len(nums)) not in (("gemm", 3), ("membound", 2)) or min(nums) <= 0:
            raise ValueError(f"not a shape: {text!r} (examples: gemm:2048x8192x8192, membound:16384x8192)")
        return cls(kind, *nums)

    @property
    def flops(self) -> float:
        return 2.0 * self.M * self.N * self.K if self.compute == "gemm" else float(self.M * self.N)

    @property
    def bytes(self) -> float:  # bf16 operands read and result written once
        if self.compute == "gemm":
            return 2.0 * (self.M * self.K + self.K * self.N + self.M * self.N)
        return 2.0 * 3 * self.M * self.N

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes

    @property
    def bound(self) -> str:
        return "compute" if self.intensity >= RIDGE else "memory"

    def fields(self) -> dict:
        return {"compute": self.compute, "M": self.M, "N": self.N, "K": self.K, "gflop": self.flops / 1e9,
                "intensity": self.intensity, "bound": self.bound}


def estimate_comp_us(shape: Shape) -> float:
    """Roofline time of one operator at PEAK_TFLOPS / HBM_TBPS."""
    return max(shape.flops / (PEAK_TFLOPS * 1e6), shape.bytes / (HBM_TBPS * 1e6))


def comp_reps(one_us: float, min_comp_us: float) -> int:
    return max(1, math.ceil(min_comp_us / max(one_us, 1e-3)))


def choose_comm(call_us: dict[int, float], target_us: float, max_calls: int, tol: float = 0.15) -> tuple[int, int]:
    """(bytes per rank, calls) whose time ``calls x call_us[bytes]`` is nearest ``target_us``: the largest size
    within ``tol`` (relative) of the target, else the nearest on a log scale (ties: the larger size)."""
    options = []
    for size, t in sorted(call_us.items()):
        calls = min(max_calls, max(1, round(target_us / t)))
        options.append((abs(math.log(calls * t / target_us)), size, calls))
    close = [o for o in options if o[0] <= math.log1p(tol)]
    if close:
        _, size, calls = max(close, key=lambda o: o[1])
    else:
        _, size, calls = min(options, key=lambda o: (round(o[0], 9), -o[1]))
    return size, calls


def comm_points(cfg: dict, call_us: dict[int, float], t_comp_us: float) -> list[tuple[int, int, float]]:
    """(bytes per rank, calls, target ratio) of each collective next to a compute of ``t_comp_us``: per target,
    ``choose_comm`` over the ladder; with fixed ``sizes``, each size called to span the compute (target 1)."""
    if cfg.get("sizes"):
        return [(*choose_comm({s: call_us[s]}, t_comp_us, cfg["max_calls"]), 1.0) for s in cfg["sizes"]]
    return [(*choose_comm(call_us, target * t_comp_us, cfg["max_calls"]), target) for target in cfg["targets"]]


def metrics_row(t_comp: float, t_comm: float, t_comm_nccl: float, comp_alone_here: float, together: dict) -> dict:
    """A row's times and ConCCL metrics (module docstring): ``together`` has comp, comm and total times."""
    t_c3 = together["total"]
    return {"t_comp_us": t_comp, "t_comm_us": t_comm, "t_comm_nccl_us": t_comm_nccl,
            "t_comp_strategy_us": comp_alone_here, "t_comp_together_us": together["comp"],
            "t_comm_together_us": together["comm"], "t_c3_us": t_c3, "ratio": t_comm / t_comp,
            "ratio_nccl": t_comm_nccl / t_comp, "comp_slowdown": together["comp"] / t_comp,
            "comm_slowdown": together["comm"] / t_comm, **c3_metrics(t_comp, t_comm, t_c3),
            "speedup_vs_nccl_serial": (t_comp + t_comm_nccl) / t_c3}


def scenario_fields(shape: Shape, reps: int, op: str, world: int, rank: int, nbytes: int, calls: int,
                    target: float) -> dict:
    return {**shape.fields(), "comp_reps": reps, "op": op, "world": world, "rank": rank, "bytes_per_rank": nbytes,
            "comm_calls": calls, "target_ratio": target}


def option_fields(strategy: str, frac: Optional[float], split: str, variant: str, priority) -> dict:
    """What a row says about its strategy; ``option`` names it in tables (a partition or a carveout with its SM
    split: the compute's SMs / all SMs)."""
    impl = "dma" if GRAPH_OF[strategy] == "dma" else "nccl"
    label = f"{strategy} {split}" if split else (f"{strategy} {frac:g}" if strategy == "partition" else strategy)
    return {"strategy": strategy, "option": label, "impl": impl, "variant": variant if impl == "dma" else "",
            "sm_split": split, "comm_priority": priority}


def skipped_row(reason: str) -> dict:
    times = ("t_comp_us", "t_comm_us", "t_comm_nccl_us", "t_comp_strategy_us", "t_comp_together_us",
             "t_comm_together_us", "t_c3_us", "ratio", "ratio_nccl", "comp_slowdown", "comm_slowdown",
             "ideal_speedup", "realized_speedup", "fraction_of_ideal", "speedup_vs_nccl_serial")
    return {**{k: NAN for k in times}, "correct": False, "skipped": reason}


def options(strategies, fractions) -> list[tuple[str, Optional[float]]]:
    """(strategy, SM fraction for the compute or None): partition once per fraction; dma_partition uses
    all SMs but fewer than a granule (fraction 1.0 stands for that)."""
    out: list[tuple[str, Optional[float]]] = []
    for s in STRATEGIES:
        if s in strategies:
            out += [(s, f) for f in fractions] if s == "partition" else [(s, 1.0 if s == "dma_partition" else None)]
    return out


def compute_setting(strategy: str, frac: Optional[float]):
    """Where an option runs its compute: None (the whole GPU), a green-context SM fraction, or CARVEOUT."""
    return CARVEOUT if strategy in CARVEOUT_STRATEGIES else frac


def estimate_seconds(cfg: dict) -> dict:
    """Seconds a run takes, from roofline compute times (PEAK_TFLOPS, HBM_TBPS): every timed repeat
    (pessimistic for NCCL strategies: T_c3 = serial), plus guessed fixed costs: 45 s to start the ranks, NCCL
    and the communicator; 0.15 s per ladder probe; per collective graph 0.3 s to capture and check plus its
    warm-up and check calls; per repeat the hold plus 2 ms (barrier, Python); 1 s per shape."""
    r, hold_s = cfg["repeats"], cfg["hold_us"] * 1e-6 + 2e-3
    opts = options(cfg["strategies"], cfg["sm_fractions"])
    nccl = [o for o in opts if o[0] in NCCL_STRATEGIES]
    dma = [o for o in opts if o[0] not in NCCL_STRATEGIES]
    graphs = ("baseline" in cfg["strategies"] or "partition" in cfg["strategies"]) + (
        "priority" in cfg["strategies"]) + bool(dma)
    settings = len({compute_setting(s, f) for s, f in opts} - {None})  # each times the compute alone once more
    sizes = cfg.get("sizes") or []
    total = 45.0 + len(cfg["ops"]) * len(sizes or cfg["ladder"]) * 0.15
    targets = [1.0] * len(sizes) if sizes else cfg["targets"]
    for text in cfg["shapes"]:
        one = estimate_comp_us(Shape.parse(text)) * 1e-6
        t = one * comp_reps(one * 1e6, cfg["min_comp_us"])
        total += (r + 3) * t * (1 + settings) + 1.0
        for target in targets:
            tc = target * t
            per_op = graphs * (r * tc + 0.3 + 2 * tc) + r * (len(nccl) * (t + tc) + len(dma) * max(t, tc))
            per_op += r * (graphs + len(opts)) * hold_s
            total += len(cfg["ops"]) * per_op
    return {"seconds": total, "shapes": len(cfg["shapes"]), "scenarios": len(cfg["shapes"]) * len(cfg["ops"]) * len(
        targets), "options": [f"{s} {f:g}" if s == "partition" else s for s, f in opts]}
