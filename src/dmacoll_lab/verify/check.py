"""Correctness cases: fresh random data, poisoned outputs, every op x variant x direction x sync x dtype.

Each case runs one collective on every rank and compares the output with ``verify.reference`` (the op spec's
exact result from every rank's seeded input); on GPUs the reference can also be torch.distributed (NCCL) run on
the same inputs. Lean-handshake pipelines (``run_pipeline``) check the promise ``handshake='lean'`` rests on.
"""
from __future__ import annotations

import itertools
import time
from dataclasses import asdict, dataclass, replace
from typing import Iterable, Optional

import torch
import torch.distributed

from dmacoll.lab_api import EngineCapabilities, OpSpec, Options, get, graph_capture, names
from .reference import DTYPES, POISON, compare_bytes, compare_sum, draw, expected, fuzzy, mismatch, poison
from .splits import PATTERNS, split_counts

__all__ = ["DTYPES", "POISON", "Case", "cases", "run_case", "run_cases", "check_rank"]


@dataclass(frozen=True)
class Case:
    op: str
    variant: str
    direction: str
    dtype: str
    count: int          # elements per chunk (per peer for all_to_all; all_reduce: of the whole tensor)
    buffers: str        # "sym" (Communicator.empty) or "private"
    in_place: bool = False
    sync: str = "reset"
    seed: int = 0
    handshake: str = "full"
    splits: str = ""    # all_to_all_v: a split pattern of ``splits.PATTERNS`` or 'random' (drawn from ``seed``)

    @property
    def spec(self) -> OpSpec:
        return get(self.op)

    def label(self) -> str:
        place = "/in-place" if self.in_place else ""
        splits = f" splits={self.splits}" + (f" seed={self.seed}" if self.splits == "random" else "") \
            if self.splits else ""
        return (f"{self.op} {self.variant}/{self.direction}/{self.sync}/{self.handshake} {self.dtype} x{self.count} "
                f"{self.buffers}{place}{splits}")


def send_counts(case: Case, world: int):
    """The case's split matrix (all_to_all_v: its named or random uneven split, else the op's seeded random one,
    with empty and odd splits), or None."""
    if case.splits:
        return split_counts(case.splits, case.count, world, case.seed)
    return case.spec.counts(case.count, world, case.seed)


def numels(case: Case, rank: int, world: int) -> tuple[int, int]:
    """Elements of rank's input and output."""
    return case.spec.numels(case.count, world, rank, send_counts(case, world))


def rank_input(case: Case, rank: int, world: int) -> torch.Tensor:
    return draw(case.spec, numels(case, rank, world)[0], DTYPES[case.dtype], case.seed * 1009 + rank)


def all_inputs(case: Case, world: int) -> list[torch.Tensor]:
    return [rank_input(case, r, world) for r in range(world)]


def expected_output(case: Case, rank: int, world: int) -> torch.Tensor:
    """The exact output in the case's dtype (sums rounded once)."""
    return expected(case.spec, all_inputs(case, world), rank, send_counts(case, world))[0].to(DTYPES[case.dtype])


def cases(variants: Iterable[str], directions: Iterable[str], dtypes: Iterable[str], counts: Iterable[int],
          ops: Optional[Iterable[str]] = None, buffers: Iterable[str] = ("sym", "private"), seed: int = 0,
          syncs: Iterable[str] = ("reset",)) -> list[Case]:
    """Every combination (``ops``: default every registered collective), in place too where the op has an in-place
    form; sums skip the dtypes that dmacoll does not sum (bool, int8, ...)."""
    ops = names() if ops is None else ops
    out = []
    for i, (op, v, d, dt, n, b, s) in enumerate(itertools.product(ops, variants, directions, dtypes, counts,
                                                                  buffers, syncs)):
        spec = get(op)
        if not spec.accepts(DTYPES[dt]):
            continue
        out.append(Case(op, v, d, dt, n, b, False, s, seed + i))
        if spec.in_place:
            out.append(Case(op, v, d, dt, n, b, True, s, seed + i + 100_000))
    return out


class Buffers:
    """Symmetric scratch for the cases, allocated once (allocation is collective)."""

    def __init__(self, comm, max_bytes: int):
        self.comm = comm
        self.sym_in = comm.empty(max_bytes, dtype=torch.uint8)
        self.sym_out = comm.empty(max_bytes, dtype=torch.uint8)

    def make(self, case: Case, in_numel: int, out_numel: int) -> tuple[torch.Tensor, torch.Tensor]:
        dtype = DTYPES[case.dtype]
        size = torch.empty((), dtype=dtype).element_size()
        if case.buffers == "sym":
            out = self.sym_out[: out_numel * size].view(dtype)
            inp = self.sym_in[: in_numel * size].view(dtype)
        else:
            out = torch.empty(out_numel, dtype=dtype, device=self.comm.device)
            inp = torch.empty(in_numel, dtype=dtype, device=self.comm.device)
        return case.spec.in_place_views(out, inp, self.comm.rank) if case.in_place else (out, inp)


def call(comm, case: Case, out: torch.Tensor, inp: torch.Tensor, counts=None):
    extra = () if counts is None else (counts,)
    return comm.collective(case.op, out, inp, *extra, variant=case.variant, direction=case.direction,
                           sync=case.sync, handshake=case.handshake)


def run_case(comm, bufs: Buffers, case: Case, nccl: bool = False) -> Optional[str]:
    """Run one case on this rank; None if the output is right, else what is wrong.
    With ``nccl``, torch.distributed's output on the same input must match too."""
    world, rank, spec = comm.world, comm.rank, case.spec
    counts = send_counts(case, world)
    inputs = all_inputs(case, world)
    n_in, n_out = numels(case, rank, world)
    out, inp = bufs.make(case, n_in, n_out)
    poison(spec, out)
    inp.copy_(inputs[rank].to(inp.device))
    sent = inp.clone()  # in place, the input is overwritten by the collective
    call(comm, case, out, inp, counts)
    got = out.cpu()
    error = mismatch(spec, got, inputs, rank, counts,
                     "exact (float64) sum" if fuzzy(spec, got.dtype) else "CPU reference")
    if error is None and nccl:
        theirs = torch.empty(n_out, dtype=out.dtype, device=out.device)
        spec.torch_call(theirs, sent, counts=counts)
        if fuzzy(spec, got.dtype):  # both are within the tolerance of the exact sum: within twice of each other
            magnitude = expected(spec, inputs, rank, counts)[1]
            error = compare_sum(got, theirs.cpu().to(torch.float64), magnitude, world, "NCCL", slack=2)
        else:
            error = compare_bytes(got, theirs.cpu(), "NCCL")
    return error


def pipeline_ops() -> tuple[str, ...]:
    """The registered ops a lean pipeline applies to: exchanges, not sums."""
    return tuple(name for name in names() if not get(name).reduces)


def pipeline_buffers(comm, in_bytes: int, out_bytes: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Two symmetric inputs and two symmetric outputs (bytes) for ``run_pipeline``; allocation is collective."""
    return ([comm.empty(max(1, in_bytes), dtype=torch.uint8) for _ in range(2)],
            [comm.empty(max(1, out_bytes), dtype=torch.uint8) for _ in range(2)])


def pipeline_cases(op: str, variant: str, dtype: str, count: int, calls: int, seed: int) -> list[Case]:
    """The calls of a lean pipeline: the first with the full handshake (whatever came before it may have
    written the same buffer), the others lean."""
    return [Case(op, variant, "push", dtype, count, "alternating", seed=seed + k, handshake="lean" if k else "full")
            for k in range(calls)]


def exchange_peers(case: Case, rank: int, world: int) -> frozenset:
    """The peers ``rank`` sends data to or receives data from in the case's call (an exchange op): those a push
    waits DONE from, so those whose READY a lean call right after it may skip."""
    counts = send_counts(case, world)  # None: equal splits, every pair moves a chunk of ``count`` elements
    return frozenset(p for p in range(world) if p != rank and (
        case.count > 0 if counts is None else counts[rank][p] > 0 or counts[p][rank] > 0))


def skipped_ready(cases: list[Case], rank: int, world: int, before: Optional[Case] = None) -> list[frozenset]:
    """What ``run_pipeline`` must report per call: the peers whose READY ``rank`` skips, i.e. those it exchanged
    data with in the call before (their DONE of it proves they had issued it, hence read the output before).
    ``before``: the call right before the first one, when that first call may skip READY too (owned outputs,
    every call lean, after an exchange in the same context: eager, or the same capture); None: the first call
    runs the full handshake."""
    return [frozenset() if previous is None else exchange_peers(previous, rank, world)
            for previous in [before, *cases[:-1]]]


def run_pipeline(comm, op: str, variant: str, dtype: str, count: int, calls: int, seed: int,
                 late_consumer: bool = False, same_output: bool = False, graph: bool = False,
                 buffers: Optional[tuple[list[torch.Tensor], list[torch.Tensor]]] = None, owned: bool = False
                 ) -> tuple[list[Optional[str]], list[frozenset]]:
    """``handshake='lean'`` used as promised: ``calls`` back-to-back push calls (``pipeline_cases``) into two
    alternating symmetric outputs (one, with ``same_output``: a broken promise), each output read (copied out)
    right after its call and before the next one; every copy compared with the CPU reference. ``late_consumer``: the last
    rank reads each output ~50 ms late, which exposes a peer writing too early. ``graph`` (cuda): the calls,
    input refills and reads captured once, replayed on fresh inputs. ``buffers``: from ``pipeline_buffers``
    (default: allocated here). ``owned``: the outputs are the communicator's (``Communicator.result``, the
    handshake left to it) instead of the two given ones. Returns an error or None per call, and per call (of the
    last pass) the peers it skipped READY with (``skipped_ready`` says which it must)."""
    world, rank = comm.world, comm.rank
    cases = pipeline_cases(op, variant, dtype, count, calls, seed)
    sizes = [numels(c, rank, world) for c in cases]
    n_in, n_out = max(s[0] for s in sizes), max(s[1] for s in sizes)
    torch_dtype = DTYPES[dtype]
    size = torch_dtype.itemsize
    raw_ins, raw_outs = buffers or pipeline_buffers(comm, n_in * size, n_out * size)
    ins = [b[: n_in * size].view(torch_dtype) for b in raw_ins]
    outs = [b[: n_out * size].view(torch_dtype) for b in raw_outs]
    sources = [torch.empty(n, dtype=torch_dtype, device=comm.device) for n, _ in sizes]
    results = [torch.empty(n, dtype=torch_dtype, device=comm.device) for _, n in sizes]
    late = late_consumer and rank == world - 1
    lean: list[frozenset] = []
    returned: list[torch.Tensor] = []  # owned: the outputs the communicator gave

    def one_pass() -> None:
        lean.clear()
        returned.clear()
        for k, case in enumerate(cases):
            slot = 0 if same_output else k % 2
            inp, out = ins[slot][: sizes[k][0]], outs[slot][: sizes[k][1]]
            inp.copy_(sources[k])
            counts = send_counts(case, world)
            if owned:
                out = comm.result(case.op, inp, *(() if counts is None else (counts,)), variant=case.variant,
                                  direction=case.direction, sync=case.sync)
                returned.append(out)
            else:
                call(comm, case, out, inp, counts)
            lean.append(comm.last_handshake.ready_implied)
            if late:  # a slow reader: the next call must not overwrite what it has not read yet
                torch.cuda._sleep(100_000_000) if comm.device.type == "cuda" else time.sleep(0.05)
            results[k].copy_(out)

    def refill(offset: int) -> None:
        for k, case in enumerate(cases):
            sources[k].copy_(rank_input(replace(case, seed=case.seed + offset), rank, world).to(comm.device))
            results[k].view(torch.uint8).fill_(POISON)

    refill(0)
    if graph:
        one_pass()  # warm-up: plans built, kernels loaded
        torch.cuda.synchronize(comm.device)
        g = torch.cuda.CUDAGraph()
        with graph_capture(g):
            one_pass()
        offset = 7919 if get(op).counts(count, world, 0) is None else 0  # a new seed would change seeded splits
        refill(offset)
        for out in returned if owned else outs:
            out.view(torch.uint8).fill_(POISON)  # the replay must move the data, whatever the seed
        g.replay()
    else:
        offset = 0
        one_pass()
    if comm.device.type == "cuda":
        torch.cuda.synchronize(comm.device)
    return [compare_bytes(results[k].cpu(), expected_output(replace(c, seed=c.seed + offset), rank, world),
                          "CPU reference") for k, c in enumerate(cases)], lean


def run_pipelines(comm, ops: Iterable[str], variants: Iterable[str], dtypes: Iterable[str], counts: Iterable[int],
                  seed: int = 0, calls: int = 6) -> list[dict]:
    """``run_pipeline`` for every exchange op, variant, dtype and count, on two given outputs and on the
    communicator's own (``Communicator.result``: ``buffers`` 'owned'): a result row per call."""
    grid = list(itertools.product([o for o in ops if o in pipeline_ops()], variants, dtypes, counts))
    if not grid:
        return []
    world = comm.world
    most = max(max(numels(c, r, world)) * DTYPES[dt].itemsize for i, (op, v, dt, n) in enumerate(grid)
               for c in pipeline_cases(op, v, dt, n, calls, seed + 1000 * i) for r in range(world))
    buffers = pipeline_buffers(comm, most, most)
    comm.reserve_results(most)  # the owned outputs at their largest once (growing would leave old pairs behind)
    rows = []
    for i, (op, v, dt, n) in enumerate(grid):
        for owned in (False, True):
            errors, _ = run_pipeline(comm, op, v, dt, n, calls, seed + 1000 * i, buffers=buffers, owned=owned)
            for case, error in zip(pipeline_cases(op, v, dt, n, calls, seed + 1000 * i), errors):
                case = replace(case, buffers="owned") if owned else case
                rows.append({**asdict(case), "rank": comm.rank, "ok": error is None, "error": error or ""})
    return rows


def run_multi_op(comm, variant: str, direction: str, dtype: str, count: int, seed: int, graph: bool,
                 replays: int = 3) -> list[dict]:
    """Every op once, one after another, each into its own output (symmetric and private buffers in turn), the
    whole sequence captured in one CUDA graph with ``graph`` and replayed ``replays`` times on fresh inputs (run
    eagerly that often without); every output of every pass against the CPU reference. A result row per op."""
    world, rank = comm.world, comm.rank
    torch_dtype = DTYPES[dtype]
    cs = [Case(op, variant, direction, dtype, count, ("sym", "private")[i % 2], seed=seed + i)
          for i, op in enumerate(names()) if get(op).accepts(torch_dtype)]
    counts = [send_counts(c, world) for c in cs]
    sizes = [numels(c, rank, world) for c in cs]
    tensors = []
    for c, (n_in, n_out) in zip(cs, sizes):  # symmetric ones: the same sizes in the same order on every rank
        if c.buffers == "sym":
            most = [max(numels(c, r, world)[i] for r in range(world)) for i in (0, 1)]
            tensors.append((comm.empty(max(1, most[1]), dtype=torch_dtype)[:n_out],
                            comm.empty(max(1, most[0]), dtype=torch_dtype)[:n_in]))
        else:
            tensors.append((torch.empty(n_out, dtype=torch_dtype, device=comm.device),
                            torch.empty(n_in, dtype=torch_dtype, device=comm.device)))

    def data(k: int, r: int, p: int) -> torch.Tensor:  # pass p's input of op k on rank r (the splits stay)
        return draw(cs[k].spec, numels(cs[k], r, world)[0], torch_dtype, (cs[k].seed * 1009 + r) * 31 + p)

    def one_pass() -> None:
        for c, (out, inp), n in zip(cs, tensors, counts):
            call(comm, c, out, inp, n)

    graphed = None
    if graph:
        for k, (_, inp) in enumerate(tensors):
            inp.copy_(data(k, rank, 0).to(comm.device))
        one_pass()  # warm-up: plans built, kernels loaded
        torch.cuda.synchronize(comm.device)
        graphed = torch.cuda.CUDAGraph()
        with graph_capture(graphed):
            one_pass()
    errors: list[Optional[str]] = [None] * len(cs)
    for p in range(1, replays + 1):
        for k, (out, inp) in enumerate(tensors):
            inp.copy_(data(k, rank, p).to(comm.device))
            poison(cs[k].spec, out)
        graphed.replay() if graphed is not None else one_pass()
        if comm.device.type == "cuda":
            torch.cuda.synchronize(comm.device)
        for k, (out, _) in enumerate(tensors):
            if errors[k] is None:
                error = mismatch(cs[k].spec, out.cpu(), [data(k, r, p) for r in range(world)], rank, counts[k],
                                 "CPU reference")
                errors[k] = error and f"pass {p}: {error}"
        torch.distributed.barrier(group=comm.group)  # passes in step: a failure shows in the pass it happened
    return [{**asdict(replace(c, buffers=f"{c.buffers}/{'graph' if graph else 'eager'} sequence")), "rank": rank,
             "ok": e is None, "error": e or ""} for c, e in zip(cs, errors)]


def run_cases(comm, all_cases: list[Case], nccl: bool = False, progress: bool = False,
              path: Optional[str] = None) -> list[dict]:
    """Every case on this rank, each row naming the data path it ran on (``last_options.path``); with ``path``, a
    call that ran on another path fails; with ``progress``, a line per (op, variant) group with the elapsed time."""
    if not all_cases:
        return []
    world = comm.world
    max_bytes = max(max(numels(c, r, world)) * DTYPES[c.dtype].itemsize for c in all_cases for r in range(world))
    bufs = Buffers(comm, max_bytes)
    results, group, t0 = [], None, time.monotonic()
    for i, case in enumerate(all_cases):
        if progress and (case.op, case.variant) != group:
            group = (case.op, case.variant)
            print(f"  {case.op} {case.variant}: from case {i + 1} of {len(all_cases)}, "
                  f"{time.monotonic() - t0:.0f} s so far", flush=True)
        error = run_case(comm, bufs, case, nccl)
        ran = comm.last_options.path
        if error is None and path is not None and ran != path:
            error = f"ran on path {ran!r}, not {path!r}"
        results.append({**asdict(case), "rank": comm.rank, "path": ran, "ok": error is None, "error": error or ""})
    if comm.device.type == "cuda":
        torch.cuda.synchronize(comm.device)
    return results


def families(capabilities: EngineCapabilities) -> list[tuple[str, dict]]:
    """The option families `dmacoll check` runs beyond the core grid on an engine (what it can run): each
    signal and wait besides memop, native submission, prerecorded eager calls, multi-op sequences (captured in one
    CUDA graph where the engine has graphs, else eager), the uneven splits, and the sm path (every call forced onto
    it, where the engine has it)."""
    out = [("signal=copy", {"signal": "copy"})]
    if capabilities.kernel_signals:
        out.append(("signal=kernel", {"signal": "kernel", "wait": "memop", "submit": "python"}))
    if capabilities.spin_waits:
        out += [("wait=spin", {"wait": "spin"}), ("wait=fold", {"wait": "fold"})]
    if capabilities.native_submit:
        out.append(("submit=native", {"submit": "native"}))
    if capabilities.graphs:
        out.append(("prerecord", {"prerecord": True}))
    out.append(("multi-op", {"sequence": True}))  # captured in one graph where the engine has graphs
    # all_to_all_v's uneven splits on Communicator() as a user makes it (every option 'auto'): what an MoE layer sends
    out += [(name, {"splits": splits}) for name, splits in SPLIT_FAMILIES.items()]
    if capabilities.sm_path:
        out.append(("path=sm", {"path": "sm"}))
    return out


def sm_cases(all_cases: list[Case], world: int, slot_bytes: int) -> list[Case]:
    """Of ``all_cases`` (variant and direction 'auto'), those the sm path runs: no in-place all_to_all_v (its rows and
    columns overlap), and every rank's whole input and output within a slot (so no part of the call can exceed it;
    the counts the check runs by default all fit). A call the path then refuses is a failure, not a skip."""
    def fits(case: Case) -> bool:
        size = DTYPES[case.dtype].itemsize
        return all(max(numels(case, r, world)) * size <= slot_bytes for r in range(world))

    return [c for c in all_cases if not (c.op == "all_to_all_v" and c.in_place) and fits(c)]


SPLIT_FAMILIES = {"uneven splits": "patterns", "random splits": "random"}
RANDOM_SPLITS = 4  # random split matrices per (variant, direction, buffers) in the 'random splits' family
SPLIT_COUNT = 4099  # elements the split patterns are built from (at most; 'one_huge' has splits.HUGE)


def split_dtypes(dtypes: Iterable[str]) -> list[str]:
    """Up to three of ``dtypes`` for the split families, one of them of one byte (int8 if none is)."""
    dtypes = list(dtypes)
    one_byte = next((d for d in dtypes if DTYPES[d].itemsize == 1), "int8")
    return [one_byte, *[d for d in dtypes if d != one_byte][:2]]


def split_cases(family: str, variants: Iterable[str], directions: Iterable[str], dtypes: Iterable[str],
                count: int, seed: int) -> list[Case]:
    """all_to_all_v with uneven splits, on every variant and direction given and 'auto', heap ('sym') and private
    buffers: ``family`` 'patterns', every ``splits.PATTERNS`` in each of ``dtypes``; 'random', ``RANDOM_SPLITS``
    matrices drawn from ``seed`` (a case's own seed replays it) in the first dtype."""
    variants, directions = [*variants, "auto"], [*directions, "auto"]
    dtypes = list(dtypes)
    grid = list(itertools.product(variants, directions, ("sym", "private")))
    if family == "patterns":
        return [Case("all_to_all_v", v, d, dt, count, b, seed=seed, splits=p)
                for p in PATTERNS for v, d, b in grid for dt in dtypes]
    return [Case("all_to_all_v", v, d, dtypes[0], count, b, seed=seed + 7919 * k + i, splits="random")
            for i, (v, d, b) in enumerate(grid) for k in range(RANDOM_SPLITS)]


def run_split_family(comm, family: str, variants: Iterable[str], directions: Iterable[str],
                     dtypes: Iterable[str], seed: int, count: int = SPLIT_COUNT) -> list[dict]:
    """``split_cases`` one after another on ``comm`` (as an MoE layer calls them): a result row per case."""
    return run_cases(comm, split_cases(family, variants, directions, split_dtypes(dtypes), count, seed))


def _tagged(rows: list[dict], family: str) -> list[dict]:
    return [{**row, "family": family} for row in rows]


def _family_rows(rank: int, world: int, args: dict, family: str, options: dict) -> list[dict]:
    """One family (``families``) on a communicator of its own: the core grid's ops, variants and directions on the
    first two dtypes, reset sync (every family's option needs it)."""
    from dmacoll.lab_api import Communicator, DEFAULT_TIMEOUT_S

    options = dict(options)
    sequence, splits, path = options.pop("sequence", False), options.pop("splits", None), options.pop("path", None)
    if path:  # every call forced onto that data path
        chosen = Options(path=path)
    elif splits:  # as a user makes it: every option 'auto'
        chosen = Options()
    else:
        chosen = Options(**{"prerecord": False, **options})
    comm = Communicator(backend=args["backend"], timeout_s=args.get("timeout_s", DEFAULT_TIMEOUT_S), options=chosen)
    try:
        if rank == 0:
            print(f"  {family}", flush=True)
        if splits:
            return run_split_family(comm, splits, args["variants"], args["directions"], args["dtypes"],
                                    args["seed"] + 30_000)
        if path == "sm":  # every op, dtype and count the path takes, as the defaults' calls name them
            from dmacoll.lab_api import cuda_sm

            if world > cuda_sm.MAX_WORLD:  # the path does not run there: no case to force onto it
                return []
            auto = cases(("auto",), ("auto",), args["dtypes"][:2], args["counts"], ops=args["ops"],
                         seed=args["seed"] + 40_000)
            return run_cases(comm, sm_cases(auto, world, cuda_sm.slot_bytes(world)), path="sm")
        if sequence:
            rows = []
            for i, (v, d) in enumerate(itertools.product(args["variants"], args["directions"])):
                for count in args["counts"][:2]:
                    rows += run_multi_op(comm, v, d, args["dtypes"][0], count, args["seed"] + 50_000 + 100 * i,
                                         graph=comm.capabilities.graphs)
            return rows
        return run_cases(comm, cases(args["variants"], args["directions"], args["dtypes"][:2], args["counts"],
                                     ops=args["ops"], seed=args["seed"] + 20_000))
    finally:
        comm.close()


def check_rank(rank: int, world: int, args: dict) -> list[dict]:
    """One rank of `dmacoll check`: every case of ``args`` (the CLI's options) on a new communicator, then the
    lean-handshake pipelines, then (``args['families']``: names from ``families``) each option family, then every
    op, dtype and count on ``Communicator()`` with no options (every option 'auto': variant and direction 'auto'
    in the rows); a result row per case, its ``family`` named."""
    from dmacoll.lab_api import Communicator, DEFAULT_TIMEOUT_S

    signal = args.get("signal", "memop")
    core = f"core (signal={signal}, wait={args.get('wait', 'memop')}, submit={args.get('submit', 'python')})"
    # the core grid runs eager calls as they come (prerecorded ones are a family of their own, and the defaults')
    comm = Communicator(backend=args["backend"], timeout_s=args.get("timeout_s", DEFAULT_TIMEOUT_S),
                        options=Options(signal=signal, submit=args.get("submit", "python"),
                                        wait=args.get("wait", "memop"), prerecord=False))
    syncs = [s for s in args["syncs"] if signal == "memop" or s == "reset"]  # copy signals carry a constant 1
    all_cases = cases(args["variants"], args["directions"], args["dtypes"], args["counts"], ops=args["ops"],
                      seed=args["seed"], syncs=syncs)
    try:
        rows = _tagged(run_cases(comm, all_cases, nccl=args["reference"] == "nccl", progress=rank == 0), core)
        if "push" in args["directions"] and "reset" in syncs:  # handshake='lean': alternating outputs, one dtype
            if rank == 0:
                print("  handshake=lean pipelines (push, alternating outputs, the communicator's own)", flush=True)
            rows += _tagged(run_pipelines(comm, args["ops"], args["variants"], args["dtypes"][:1], args["counts"],
                                          seed=args["seed"]), "lean pipelines")
        capabilities = comm.capabilities
    finally:
        comm.close()
    wanted = args.get("families", ())
    for family, options in families(capabilities):
        if family in wanted:
            rows += _tagged(_family_rows(rank, world, args, family, options), family)
    if rank == 0:
        print("  Communicator() with no options (what the tuning table or the fallback picks)", flush=True)
    default = Communicator(backend=args["backend"], timeout_s=args.get("timeout_s", DEFAULT_TIMEOUT_S))
    try:
        auto = cases(("auto",), ("auto",), args["dtypes"], args["counts"], ops=args["ops"], seed=args["seed"] + 7)
        return rows + _tagged(run_cases(default, auto, nccl=args["reference"] == "nccl"), "defaults")
    finally:
        default.close()
