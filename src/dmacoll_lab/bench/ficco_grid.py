"""The FiCCO experiment's grid and arithmetic, free of GPUs: scenarios, row slicing, schedules, loss metrics,
static features and a duration estimate. The method is described in ``bench/ficco.py``."""
from __future__ import annotations

from dataclasses import dataclass

from .c3_grid import PEAK_TFLOPS

# layer shapes: hidden, MLP intermediate, experts (0: dense), experts per token
MODELS = {"llama3-8b": (4096, 14336, 0, 0), "llama3-70b": (8192, 28672, 0, 0), "mixtral-8x7b": (4096, 14336, 8, 2)}
# pattern -> the collective it decomposes
PATTERNS = {"ag_gemm": "all_gather", "gemm_rs": "reduce_scatter", "a2a_gemm": "all_to_all"}
DENSE_PATTERNS, MOE_PATTERNS = ("ag_gemm", "gemm_rs"), ("a2a_gemm",)
IMPLS = ("nccl", "dma")
TOKENS = (2048, 8192)
FACTORS = (1, 2, 4)   # pieces d = factor x world
LINK_GBPS = 350.0     # static estimate of one rank's NVLink receive bandwidth (H200, measured order)
BAND = 32             # nonzeros per row of the integer test matrices (module ``ficco``: exact sums)

FICCO_COLUMNS = ["pattern", "op", "model", "tokens", "hidden", "intermediate", "experts", "topk", "world", "rank",
                 "M", "N", "K", "gflop", "coll_bytes", "est_ratio", "impl", "pieces", "option", "t_us",
                 "t_serial_us", "t_serial_nccl_us", "t_gemm_us", "t_gemm_pieces_us", "t_coll_us",
                 "t_coll_pieces_us", "t_pipeline_ideal_us", "decomposition_loss", "overlap_vs_isolated_sum",
                 "contention_loss", "speedup_vs_serial", "speedup_vs_nccl_serial", "correct", "skipped"]
TIME_COLUMNS = ["t_us", "t_serial_us", "t_serial_nccl_us", "t_gemm_us", "t_gemm_pieces_us", "t_coll_us",
                "t_coll_pieces_us", "t_pipeline_ideal_us", "decomposition_loss", "overlap_vs_isolated_sum",
                "contention_loss", "speedup_vs_serial", "speedup_vs_nccl_serial"]
NAN = float("nan")
DEFAULTS = {"models": list(MODELS), "tokens": list(TOKENS), "patterns": list(PATTERNS), "impls": list(IMPLS),
            "factors": list(FACTORS), "repeats": 10, "hold_us": 500.0}


@dataclass(frozen=True)
class Scenario:
    """One layer's communication + GEMM on ``world`` ranks; ``tokens`` is the global token count."""
    model: str
    pattern: str
    tokens: int
    world: int

    @property
    def dims(self) -> tuple[int, int, int, int]:
        return MODELS[self.model]

    @property
    def op(self) -> str:
        return PATTERNS[self.pattern]

    @property
    def experts_local(self) -> int:
        return self.dims[2] // self.world

    @property
    def rows_per_block(self) -> int:
        """The sliced dimension: a rank's rows of A (ag_gemm), of its output (gemm_rs), or routed rows per
        (source rank, local expert) (a2a_gemm, balanced routing)."""
        h, i, e, k = self.dims
        if self.pattern == "a2a_gemm":
            return self.tokens * k // (self.world * e)
        return self.tokens // self.world

    @property
    def mnk(self) -> tuple[int, int, int]:
        """This rank's whole GEMM (a2a_gemm: all its local experts' rows together)."""
        h, i, _, k = self.dims
        if self.pattern == "ag_gemm":     # column-parallel up-projection: gathered A @ W[:, N/world]
            return self.tokens, i // self.world, h
        if self.pattern == "gemm_rs":     # row-parallel down-projection: A[:, K/world] @ W[K/world, :]
            return self.tokens, h, i // self.world
        return self.tokens * k // self.world, i, h  # expert up-projection of the rows this rank receives

    @property
    def gflop(self) -> float:
        m, n, k = self.mnk
        return 2.0 * m * n * k / 1e9

    @property
    def coll_in_bytes(self) -> int:
        m, n, k = self.mnk
        if self.pattern == "ag_gemm":
            return m // self.world * k * 2
        return m * n * 2 if self.pattern == "gemm_rs" else m * k * 2

    @property
    def coll_out_bytes(self) -> int:
        return {"ag_gemm": self.coll_in_bytes * self.world, "gemm_rs": self.coll_in_bytes // self.world,
                "a2a_gemm": self.coll_in_bytes}[self.pattern]

    @property
    def coll_bytes(self) -> int:
        """Bytes a rank receives from its peers."""
        if self.pattern == "gemm_rs":
            return self.coll_out_bytes * (self.world - 1)
        return self.coll_out_bytes * (self.world - 1) // self.world

    @property
    def est_ratio(self) -> float:
        """Static T_comm / T_gemm estimate: received bytes at LINK_GBPS over the GEMM at PEAK_TFLOPS."""
        return (self.coll_bytes / (LINK_GBPS * 1e3)) / estimate_gemm_us(self.gflop)

    def reason(self) -> str:
        """Why this scenario cannot run ('' when it can)."""
        h, i, e, k = self.dims
        if (self.pattern in MOE_PATTERNS) != (e > 0):
            return f"{self.pattern} needs {'an MoE' if e == 0 else 'a dense'} model"
        if self.tokens % self.world or i % self.world:
            return f"tokens {self.tokens} / intermediate {i} not divisible by world {self.world}"
        if e and (e % self.world or (self.tokens * k) % (self.world * e)):
            return f"{e} experts x {self.tokens} tokens do not split evenly over world {self.world}"
        return ""

    def fields(self, world: int, rank: int) -> dict:
        h, i, e, k = self.dims
        m, n, kk = self.mnk
        return {"pattern": self.pattern, "op": self.op, "model": self.model, "tokens": self.tokens, "hidden": h,
                "intermediate": i, "experts": e, "topk": k, "world": world, "rank": rank, "M": m, "N": n, "K": kk,
                "gflop": self.gflop, "coll_bytes": self.coll_bytes, "est_ratio": self.est_ratio}


def scenarios(models, tokens, patterns, world: int) -> list[Scenario]:
    """Dense models get ag_gemm and gemm_rs, MoE models a2a_gemm (patterns filter); runnable ones only."""
    out = []
    for m in models:
        mine = MOE_PATTERNS if MODELS[m][2] else DENSE_PATTERNS
        for p in mine:
            if p in patterns:
                for t in tokens:
                    s = Scenario(m, p, t, world)
                    if not s.reason():
                        out.append(s)
    return out


# -- decomposition ---------------------------------------------------------------------------------------------
def split_rows(n: int, d: int) -> list[tuple[int, int]]:
    """(offset, rows) of ``d`` contiguous slices covering ``n`` rows; sizes differ by at most one (the first
    ``n % d`` slices are one longer, like torch.tensor_split)."""
    if not 1 <= d <= n:
        raise ValueError(f"cannot cut {n} rows into {d} non-empty pieces")
    base, extra = divmod(n, d)
    out, off = [], 0
    for i in range(d):
        size = base + (i < extra)
        out.append((off, size))
        off += size
    return out


def piece_major_order(rows: int, blocks: int, d: int) -> list[int]:
    """Row indices of a ``blocks x rows`` matrix (block-major) in piece-major order: for each piece, each
    block's slice of it. A gathered piece (ag_gemm) or a piece's reduce-scatter input (gemm_rs) is exactly
    one piece's run of this order."""
    return [b * rows + off + j for off, size in split_rows(rows, d) for b in range(blocks) for j in range(size)]


def schedules(world: int, factors, impls) -> list[tuple[str, int]]:
    """(impl, pieces): serial (1 piece) then d = factor x world, per comm implementation."""
    ds = [1] + sorted({f * world for f in factors})
    return [(impl, d) for impl in IMPLS if impl in impls for d in ds]


def option_label(impl: str, pieces: int) -> str:
    return f"{impl} serial" if pieces == 1 else f"{impl} d={pieces}"


# -- metrics ---------------------------------------------------------------------------------------------------
def pipeline_time(t_first_pieces: float, t_second_pieces: float, d: int) -> float:
    """A d-stage two-step pipeline from isolated times (each the sum of its d pieces, pieces taken equal):
    first piece of step one, then d-1 times the slower step, then last piece of step two; serial: the sum."""
    a, b = t_first_pieces / d, t_second_pieces / d
    return a + b + (d - 1) * max(a, b)


def metrics(pattern: str, pieces: int, t: float, t_serial: float, t_serial_nccl: float, t_gemm: float,
            t_gemm_pieces: float, t_coll: float, t_coll_pieces: float) -> dict:
    """FiCCO's losses for one schedule (times in us, all isolated times from the same run):

    * decomposition loss = the pieces' GEMMs alone / the whole GEMM alone (>= 1: small GEMMs are less
      efficient);
    * overlap_vs_isolated_sum = T / (pieces' GEMMs alone + pieces' collectives alone): < 1 when overlap helps;
    * contention loss = T / the ideal pipeline of the isolated pieces (> 1: time lost to the two sides
      slowing each other, plus stream / event overhead);
    * speedups over serial on the same comm implementation and over NCCL serial."""
    first, second = (t_gemm_pieces, t_coll_pieces) if pattern == "gemm_rs" else (t_coll_pieces, t_gemm_pieces)
    ideal = pipeline_time(first, second, pieces)
    return {"t_us": t, "t_serial_us": t_serial, "t_serial_nccl_us": t_serial_nccl, "t_gemm_us": t_gemm,
            "t_gemm_pieces_us": t_gemm_pieces, "t_coll_us": t_coll, "t_coll_pieces_us": t_coll_pieces,
            "t_pipeline_ideal_us": ideal, "decomposition_loss": t_gemm_pieces / t_gemm,
            "overlap_vs_isolated_sum": t / (t_gemm_pieces + t_coll_pieces), "contention_loss": t / ideal,
            "speedup_vs_serial": t_serial / t, "speedup_vs_nccl_serial": t_serial_nccl / t}


def skipped_row(reason: str) -> dict:
    return {**{k: NAN for k in TIME_COLUMNS}, "correct": False, "skipped": reason}


# -- plan ------------------------------------------------------------------------------------------------------
def estimate_gemm_us(gflop: float) -> float:
    return gflop * 1e9 / (PEAK_TFLOPS * 1e12) * 1e6


def estimate_seconds(cfg: dict, world: int) -> dict:
    """Seconds a run takes: GEMMs at PEAK_TFLOPS (700), collectives at LINK_GBPS, plus guessed fixed costs:
    45 s to start the ranks, NCCL and the communicator; 3 s per scenario for data, references and checks;
    per graph 0.3 s to capture plus its warm-up and check replays; per timed repeat the hold plus 2 ms."""
    scs = scenarios(cfg["models"], cfg["tokens"], cfg["patterns"], world)
    sch = schedules(world, cfg["factors"], cfg["impls"])
    r, hold_s = cfg["repeats"], cfg["hold_us"] * 1e-6 + 2e-3
    ds = sorted({d for _, d in sch})
    total = 45.0
    for s in scs:
        g = estimate_gemm_us(s.gflop) * 1e-6
        c = s.coll_bytes / (LINK_GBPS * 1e9)
        # graphs: whole GEMM, GEMM pieces per d>1, and per schedule: its collective(s) alone and the schedule
        graphs = [g] + [g for d in ds if d > 1] + [c for _ in sch] + [g + c for _ in sch]
        total += 3.0 + sum(0.3 + (r + 3) * (t + hold_s) for t in graphs)
    return {"seconds": total, "scenarios": len(scs), "schedules": [option_label(i, d) for i, d in sch],
            "labels": [f"{s.model}/{s.pattern}/{s.tokens}" for s in scs]}


def heap_top(scs: list[Scenario]) -> int:
    """The largest collective input of a run (the communicator's buffers are sized from it)."""
    return max([s.coll_in_bytes for s in scs] + [s.coll_out_bytes // s.world for s in scs] + [1 << 20])


def band_ok(world: int) -> bool:
    """Sums of ``world`` partial products of BAND unit terms stay exact integers in bf16 (<= 256)."""
    return BAND * world <= 256

