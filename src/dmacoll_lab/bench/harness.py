"""The one measurement harness every GPU benchmark uses (sweep, C3 and its interference view, FiCCO, power, SM
use, e2e; breakdown its timing summary and writer).

* ``Rank``: one process per GPU. A non-default stream (NCCL's copy-engine path rejects the legacy one, and
  applications use their own), a gloo group for host-side agreement, the dmacoll communicator and buffer pools
  when a benchmark needs them; ``barrier``, ``gather``, ``agreed`` (a value, or the same error on every rank)
  and ``slowest`` (a collective step ends when its slowest rank does).
* Timing: ``Rank.bench`` is the one timing loop (``dmacoll.timing.bench_time``: warm-up, back-to-back calls
  graph-replayed or eager, CUDA events on GPUs, an optional check after timing) with every rank starting each
  repeat together; ``Rank.time_parts`` is the other measurement (several streams released together after a GPU
  sleep, so the host has queued every part before any starts: C3, FiCCO). ``summarize``: median, p10, p90.
* ``Bound``: one collective on this rank's buffers with seeded inputs (``verify.reference.draw``), and its
  ``check`` after timing: outputs poisoned, the collective run once more (a call or a replay), compared with
  the op spec's exact reference.
* ``write``: rank 0's rows as a tidy CSV with its provenance sidecar (``provenance.write_table``).

Times are microseconds; graph and eager times are separate measurements, never mixed. Without a GPU the
harness runs on the host emulator with gloo as the baseline (eager calls only, timed by the host clock): what CI
uses to run the benchmarks' plumbing (every op, every check) end to end.
"""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch
import torch.distributed as dist

from dmacoll.lab_api import Timed, bench_time, elapsed_us, ops, synchronize
from ..verify.reference import draw, mismatch, poison
from . import provenance


# -- timing ------------------------------------------------------------------------------------------------
def summarize(samples_us: Sequence[float]) -> dict[str, float]:
    """Median with 10th/90th percentiles (nearest rank) of per-call times."""
    s = sorted(samples_us)
    pick = lambda q: s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]  # noqa: E731
    return {"time_us": statistics.median(s), "time_us_p10": pick(0.1), "time_us_p90": pick(0.9)}


def sleep_cycles_per_us() -> float:
    """GPU clock cycles per microsecond, for ``torch.cuda._sleep`` holds."""
    torch.cuda._sleep(1000)
    return 1_000_000 / elapsed_us(lambda: torch.cuda._sleep(1_000_000))


# -- one process per GPU -------------------------------------------------------------------------------------
class Rank:
    """This rank's device, streams, host group, and (``pool_bytes`` > 0) communicator and buffer pools: symmetric
    ``sym_in`` / ``sym_out`` (dmacoll's heap) and private ``priv_in`` / ``priv_out`` (NCCL's, and dmacoll's
    staged calls), inputs of ``pool_bytes`` per rank and outputs of ``world`` times that."""

    def __init__(self, rank: int, world: int, pool_bytes: int = 0, staging_bytes: int = 0,
                 extra_outputs: int = 0, hold_us: float = 0.0, dtype: str = "bfloat16", communicator: bool = True):
        self.rank, self.world = rank, world
        if torch.cuda.is_available():
            torch.cuda.set_stream(torch.cuda.Stream())  # never the legacy stream
            self.device = torch.device("cuda", torch.cuda.current_device())
        else:  # the host emulator (CI): dmacoll's host backend, gloo as the baseline
            self.device = torch.device("cpu")
        self.dtype = getattr(torch, dtype)
        self.cpu_group = dist.new_group(backend="gloo")
        self.comm = None
        out = world * pool_bytes
        if pool_bytes and communicator:
            from dmacoll.lab_api import Communicator

            # staging: a reduce-scatter receives every rank's chunk (its input's size), a one-exchange all-reduce
            # every rank's whole tensor (up to twice its size at two ranks)
            self.comm = Communicator(heap_bytes=pool_bytes + (1 + extra_outputs) * out + (1 << 20),
                                     staging_bytes=staging_bytes or 2 * pool_bytes + (1 << 20))
            self.comm.calibrate(force=False)  # where the platform has no table: now, not inside a timed call
            self.sym_in = self.comm.empty(pool_bytes, dtype=torch.uint8)
            self.sym_outs = [self.comm.empty(out, dtype=torch.uint8) for _ in range(1 + extra_outputs)]
            self.sym_out = self.sym_outs[0]
        if pool_bytes:
            self.priv_in = torch.empty(pool_bytes, dtype=torch.uint8, device=self.device)
            self.priv_out = torch.empty(out, dtype=torch.uint8, device=self.device)
        self.hold = int(sleep_cycles_per_us() * hold_us) if hold_us else 0
        self._inputs: tuple = ((), [])  # the last (spec, numels, dtype, seed) drawn, and its inputs

    def barrier(self) -> None:
        dist.barrier(group=self.cpu_group)

    def gather(self, value) -> list:
        out: list = [None] * self.world
        dist.all_gather_object(out, value, group=self.cpu_group)
        return out

    def agreed(self, fn: Callable[[], object]) -> tuple[object, str]:
        """Run ``fn`` on every rank; its value, or the first rank's error on all ranks if any failed (so every
        rank skips the same work and issues the same collectives)."""
        try:
            value, err = fn(), ""
        except Exception as e:  # noqa: BLE001 - a failure is a recorded reason, the same on every rank
            value, err = None, f"{type(e).__name__}: {e}".replace("\n", " ")[:300]
        errors = [e for e in self.gather(err) if e]
        return (None, errors[0]) if errors else (value, "")

    def slowest(self, samples: Sequence[float]) -> list[float]:
        """Per sample, the largest value over ranks (a step ends when every rank is done)."""
        return [max(per_rank) for per_rank in zip(*self.gather(list(samples)))]

    def most(self, value: float):
        """The largest of every rank's ``value`` (a count every rank must use alike)."""
        return max(self.gather(value))

    def inputs(self, spec: ops.OpSpec, numels: list[int], seed: int) -> list[torch.Tensor]:
        """Every rank's seeded input (``verify.reference.draw``, exact sums); the last set is kept, so the
        implementations of one point share it (the biggest may be a GiB per rank)."""
        key = (spec.name, tuple(numels), self.dtype, seed)
        if self._inputs[0] != key:
            self._inputs = (), []  # free the previous set before drawing the next
            self._inputs = key, [draw(spec, n, self.dtype, seed * 7919 + r, self.device, exact_sums=True)
                                 for r, n in enumerate(numels)]
        return self._inputs[1]

    # -- timing on this rank -------------------------------------------------------------------------------
    def bench(self, call: Callable[[], object], calls: int, repeats: int, mode: str = "eager", warmup: int = 3,
              check=None) -> Timed:
        """This rank's per-call microseconds of ``call`` (``dmacoll.timing.bench_time``), every rank starting each
        repeat together; ``check``: a ``Bound`` checked after timing."""
        return bench_time(call, calls, repeats, mode=mode, warmup=warmup, device=self.device, each=self.barrier,
                          check=check)

    def time_parts(self, parts: Sequence[tuple[str, Callable[[], None], object]], repeats: int) -> dict:
        """Medians over repeats of each part's end (name -> us) and of the last end ('total'), from one start.

        ``parts``: (name, fn, stream) in launch order. A GPU sleep (``hold_us``) before the start event keeps
        every stream waiting until the host has queued all parts, so launch latency is not timed."""
        gate = torch.cuda.current_stream()
        samples: dict[str, list[float]] = {name: [] for name, _, _ in parts}
        samples["total"] = []
        for _ in range(repeats):
            self.barrier()
            with torch.cuda.stream(gate):
                torch.cuda._sleep(self.hold)
            start = torch.cuda.Event(enable_timing=True)
            start.record(gate)
            ends = {}
            for name, fn, stream in parts:
                stream.wait_event(start)
                with torch.cuda.stream(stream):
                    fn()
                ends[name] = torch.cuda.Event(enable_timing=True)
                ends[name].record(stream)
            for name, ev in ends.items():  # per event: a device sync need not cover green-context streams
                ev.synchronize()
                samples[name].append(start.elapsed_time(ev) * 1e3)
            samples["total"].append(max(samples[n][-1] for n in ends))
        return {k: statistics.median(v) for k, v in samples.items()}

    def alone(self, fn: Callable[[], None], stream, repeats: int) -> float:
        """The median time of ``fn`` alone on ``stream`` (``time_parts`` with one part)."""
        return self.time_parts([("x", fn, stream)], repeats)["x"]

    # -- results ---------------------------------------------------------------------------------------------
    def rows_on_rank0(self, rows: list[dict]) -> Optional[list[dict]]:
        """Every rank's rows on rank 0, rank by rank (None elsewhere)."""
        gathered = self.gather(rows)
        return [r for per_rank in gathered for r in per_rank] if self.rank == 0 else None

    def finish(self, rows: list[dict]) -> Optional[list[dict]]:
        """The end of a benchmark: every rank's rows on rank 0 (None elsewhere), the communicator closed."""
        rows = self.rows_on_rank0(rows)
        self.close()
        return rows

    def close(self) -> None:
        if self.comm is not None:
            self.comm.close()


def write(out: str | Path, rows: list[dict], columns: list[str], config: dict) -> Path:
    """A tidy CSV (a row per measurement) and its provenance sidecar."""
    return provenance.write_table(Path(out), rows, columns, config)


# -- one collective on this rank's buffers -------------------------------------------------------------------
class Bound:
    """Collective ``spec`` with seeded inputs of ``bytes_per_rank`` on this rank's buffers: symmetric ones when
    ``symmetric`` (dmacoll), else private ones (NCCL); in place where asked and the op has the form. ``caller``
    makes the call: ``caller(out, inp, counts)`` returns a function of no arguments (which may return the output
    tensor, for implementations that make their own). Sums draw small integers, exact in any order."""

    def __init__(self, rk: Rank, spec: ops.OpSpec, bytes_per_rank: int, seed: int, caller, symmetric: bool,
                 in_place: bool = False, output_index: int = 0):
        self.rk, self.spec = rk, spec
        world, rank, dtype = rk.world, rk.rank, rk.dtype
        size = dtype.itemsize
        chunk = bytes_per_rank // size // spec.chunks(world)[0]
        self.counts = spec.counts(chunk, world)
        sizes = [spec.numels(chunk, world, r, self.counts) for r in range(world)]
        self.inputs = rk.inputs(spec, [n_in for n_in, _ in sizes], seed)
        n_in, n_out = sizes[rank]
        pool_in, pool_out = (rk.sym_in, rk.sym_outs[output_index]) if symmetric else (rk.priv_in, rk.priv_out)
        self.out, self.inp = pool_out[: n_out * size].view(dtype), pool_in[: n_in * size].view(dtype)
        self.in_place = in_place and bool(spec.in_place)
        if self.in_place:
            self.out, self.inp = spec.in_place_views(self.out, self.inp, rank)
        self.inp.copy_(self.inputs[rank])
        self.fn = caller(self.out, self.inp, self.counts)
        self.result: torch.Tensor = self.out

    def run(self) -> None:
        r = self.fn()
        self.result = r if isinstance(r, torch.Tensor) else self.out

    @property
    def sums_in_place(self) -> bool:
        """Whether a call changes its own input (an in-place sum): calls repeated in one graph sum again, so a
        check must rerun one call (``dmacoll.timing.check_after``), not a graph of several."""
        return self.in_place and self.spec.reduces

    def restore(self) -> None:
        """Put this rank's input back (an in-place call overwrote it)."""
        self.inp.copy_(self.inputs[self.rk.rank])

    def prepare(self) -> None:
        """Before a checked run: the output poisoned, the input restored (an in-place call overwrote it)."""
        poison(self.spec, *{id(t): t for t in (self.out, self.result)}.values())
        self.restore()

    def right(self) -> bool:
        """After a checked run: whether the output is the op spec's exact reference (byte for byte)."""
        return mismatch(self.spec, self.result, self.inputs, self.rk.rank, self.counts, exact_sums=True) is None

    def check(self, rerun: Callable[[], None]) -> bool:
        """Poison the output, restore the input, ``rerun`` once, compare (``dmacoll.timing.Check``)."""
        checked_run(self.rk, self.prepare, rerun)
        return self.right()


def checked_run(rk: Rank, prepare: Callable[[], None], rerun: Callable[[], None]) -> None:
    """``prepare`` (poison outputs, restore inputs), then ``rerun`` once with every rank in step, and wait for the
    peers' writes."""
    prepare()
    synchronize()
    rk.barrier()
    rerun()
    synchronize()
    rk.barrier()  # peers' writes into us are complete


# The papers' offload, for the experiments that reproduce it (C3, FiCCO): the copy engines carry the data and the
# flags, and the stream waits on its flags with stream memory operations; no SM kernel but a reduction's sum. 'auto'
# alone may take the sm path for small calls, or a one-thread spin kernel for a reduction's waits where the tuning
# table measured it faster (it takes a slot on an SM, and can queue behind a GEMM's blocks).
PURE_DMA = {"path": "dma", "wait": "memop"}


def dma_caller(comm, spec: ops.OpSpec, **options):
    """``Bound``'s caller for a dmacoll call with per-call ``options``."""
    def caller(out, inp, counts):
        extra = () if counts is None else (counts,)
        return lambda: comm.collective(spec.name, out, inp, *extra, **options)
    return caller


def torch_caller(spec: ops.OpSpec, group=None):
    """``Bound``'s caller for the same collective through torch.distributed (NCCL)."""
    def caller(out, inp, counts):
        return lambda: spec.torch_call(out, inp, group, counts)
    return caller
