"""What a collective call runs with: the options a caller asks for, what an engine can run, and the one function
that turns the first into a call's options on the second.

* ``Options``: how a communicator's collectives run; its call options may be changed per call by keyword;
* ``EngineCapabilities``: what a backend's engine can run (each engine states it; a cuda engine also learns at
  start whether its driver takes stream-memop writes into peer memory, and the communicator whether the native
  submission library loads);
* ``Call``: what a call's choice depends on, the same on every rank (so the ranks choose alike);
* ``resolve(options, capabilities, call, table)``: refuses what cannot run, saying what to use instead, sends
  memop flags as copies where the driver refuses them, and replaces every 'auto' by the fastest combination the
  tuning table measured that the call may use, else by ``fallback``. Pure (no engine, no device, no state): the
  communicator caches its answer per call shape, so a cached call pays a dict lookup.

``candidates`` says what 'auto' may choose on an engine and ``choices`` lists those combinations: the one place a
new option value enters both the communicator and the calibration.
"""
from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from typing import Collection, Mapping, NamedTuple, Optional, TypedDict, Union

from .errors import InvalidArgument
from .executor import SIGNAL_MODES, SYNC_MODES, WAIT_MODES
from .plan import DIRECTIONS, VARIANTS
from .tuning import CHOSEN, Choice, TuningTable

HANDSHAKES = ("full", "lean")
PATHS = ("dma", "sm", "nccl")
# 'auto' takes the sm path up to this many bytes per peer (the sm path's default slots; an all_reduce's per peer part
# is its two-shot chunk where it runs two kernels): graph-replayed on 4x and 2x H200 its kernels beat the copy engines'
# calls for every op up to here, and NCCL for every op but all_to_all at world 4 (1.06-1.12x at 4 MB per peer, 0.95-0.98
# at 2 MB: results/h200x4/sm_path/sm_path_large/, default_call/), not at 8-16 MB per peer for the gathers at world 4.
# At world 2 up to 8 MB per peer (``sm_auto_max_bytes``) but for all_to_all: there the sm rows at 8 MB per peer took
# 0.74-0.87 of NCCL for all_reduce, all_gather and reduce_scatter, as fast as the copy engines or faster (0.84-1.30),
# and all_to_all 1.13-1.26 where the copy engines took 1.07-1.13 (results/h200x2/sm_path/, four runs)
SM_AUTO_MAX_BYTES = 4 << 20
WORLD2_SM_AUTO_MAX_BYTES = 8 << 20
WORLD4_ALL_TO_ALL_SM_AUTO_MAX_BYTES = 2 << 20
# An eager all_reduce takes the sm path up to this tensor size: at 16 MB its two kernels lost to NCCL outside a graph
# (1.00-1.09 of NCCL at world 2 over six runs, 1.02-1.07 at world 4 over four; graph-replayed 0.92-0.99), where at
# 8 MB they won at world 2 (0.66-0.83; one kernel there) and came out at 0.84-1.17 at world 4
# (results/h200x2/sm_path/default_call_large_run*, d8bd0b9 and 8855b00;
# results/h200x4/sm_path/large_calls_interleaved_*)
EAGER_ALL_REDUCE_SM_MAX_BYTES = 8 << 20
# Above the sm path, 'auto' takes the copy engines only where they were measured faster than NCCL: from these sizes
# (the tuning table's: all_gather's input, all_to_all's, reduce_scatter's input, all_reduce's tensor), per (world, op);
# below them, and for a world or op not listed, NCCL itself (path 'nccl', the communicator's own process group) where
# the group runs it, so the default call is never slower than the baseline it is measured against. A sum whose
# received chunks do not fit the communicator's staging area goes to NCCL too (``Communicator(staging_bytes=...)``).
# The sizes come from six runs per world on 2x and 4x H200, 8-256 MB per rank (results/h200x{2,4}/sm_path/
# large_calls_staged_run*, large_calls_dma_sums_run*): from the smallest size at which the median over the runs of the
# copy engines' time over NCCL's is below 0.99 in graph-replayed and eager calls and stays so at every larger size
# (the lab's tables.dma_auto_sizes). docs/results.md ("Where auto leaves NCCL for the copy engines") shows those
# medians per size, and a test fails when these constants and the runs disagree. all_to_all_v (the MoE dispatch,
# uneven) stays on the copy engines.
DMA_AUTO_MIN_BYTES = {(2, "all_gather"): 0, (2, "all_to_all"): 128 << 20, (2, "reduce_scatter"): 64 << 20,
                      (2, "all_reduce"): 32 << 20, (4, "all_gather"): 64 << 20, (4, "all_to_all"): 128 << 20,
                      (4, "reduce_scatter"): 256 << 20, (4, "all_reduce"): 128 << 20}
NCCL_AUTO_OPS = ("all_gather", "all_to_all", "reduce_scatter", "all_reduce")
# Where a calibrated table measured the paths, 'auto' leaves NCCL only for a path measured faster by more than this:
# a single calibration's point below 1 MB is partly luck (two identical sweeps differ by a median 4%), and losing a
# true win of under 3% costs less than taking a false one (the lab's analysis.path_replay scores this on the
# committed default-call runs)
PATH_MARGIN = 0.03


def sm_auto_max_bytes(world: int, op: str) -> int:
    """The most bytes per peer 'auto' sends on the sm path for ``op`` at ``world`` ranks."""
    if op.startswith("all_to_all"):
        return WORLD4_ALL_TO_ALL_SM_AUTO_MAX_BYTES if world == 4 else SM_AUTO_MAX_BYTES
    return WORLD2_SM_AUTO_MAX_BYTES if world == 2 else SM_AUTO_MAX_BYTES


def nccl_auto(world: int, op: str, nbytes: int) -> bool:
    """Whether 'auto' hands a call of ``op`` of ``nbytes`` (the tuning table's size) that the sm path does not take
    to NCCL rather than the copy engines (``DMA_AUTO_MIN_BYTES``)."""
    return op in NCCL_AUTO_OPS and nbytes < DMA_AUTO_MIN_BYTES.get((world, op), float("inf"))


COPY_ENGINE_OPTIONS = ("variant", "direction", "signal", "wait", "prerecord", "submit")
SUBMITS = ("python", "native")
MAX_ENGINES = 16

# a table without rows for a reduction (a calibrated one: it measures the gathers only) chooses for it from these
# rows: a reduce_scatter is an all-to-all of its chunks and then a sum, a large all_reduce two such exchanges (on 4x
# H200 the fallback's pcpy took 1.1-1.6x the time of b2b, all_to_all's choice there, from 16 MB:
# results/h200x4/operator/sweep_reductions/)
STAND_IN = {"reduce_scatter": "all_to_all", "all_reduce": "all_to_all"}

# without a table (or an entry the call may use): one queue per peer, pushed, and flags as copy-engine copies,
# which every driver takes (no stream-memop write into peer memory); eager calls prerecorded where graphs are
# allowed (95-98% of the eager winners of the committed sweeps prerecord; ``fallback`` drops it elsewhere)
FALLBACK = Choice("pcpy", "push", "copy", "memop", True, "python")


class CallOptions(TypedDict, total=False):
    """The keywords a call takes to change the communicator's options for itself (``Options``' call options):
    ``comm.all_gather(out, x, variant='b2b')``."""

    variant: str
    direction: str
    sync: str
    signal: str
    prerecord: Union[bool, str]
    submit: str
    handshake: str
    wait: str
    path: str


CALL_OPTIONS = tuple(CallOptions.__annotations__)


@dataclass(frozen=True)
class Options:
    """How a communicator's collectives run: ``Communicator(options=Options(...))``. The first nine are call
    options, the defaults of every call, which a call may change for itself by keyword (``CallOptions``); the last
    three are the communicator's own, set once.

    ``path``: ``dma`` (the copy engines: the papers' collectives, every option below), ``sm`` (one one-shot kernel
    per call: stores into every peer's heap over NVLink, a flag per block (up to 64 KB per peer at world 2, 16 KB at
    world 4, the flag rides in the data: LL lines), a local copy or sum; all_gather, all_to_all(_v), all_reduce (two
    kernels from ``cuda_sm.TWO_SHOT_BYTES`` at 3 ranks or more, above a slot at 2), reduce_scatter up to
    ``cuda_sm.slot_bytes`` per peer and 8 ranks; while it runs it occupies up to ``cuda_sm.BLOCKS`` blocks of
    ``cuda_sm.THREADS`` threads; cuda only), ``nccl`` (the call handed to the communicator's process group, as
    ``torch.distributed`` hands it: the baseline itself, where the group runs NCCL (RCCL on ROCm)) or ``auto`` (the
    default): where the tuning table measured the paths (a calibrated one), the fastest it measured for the call;
    else ``sm`` up to ``sm_auto_max_bytes`` per peer (4 MB; 8 MB at world 2 but for all_to_all, 2 MB for
    all_to_all at world 4; an eager all_reduce up to 8 MB) where the call fits it and names no copy-engine option;
    above it ``dma`` where the copy engines were measured faster than NCCL (``DMA_AUTO_MIN_BYTES``), else ``nccl``
    where the group runs it, else ``dma`` (``choose_path``).
    ``last_options.path`` says which ran. Explicit ``dma`` is the papers' reproduction: pure copy engines.

    ``variant``: ``pcpy`` (one queue per peer), ``b2b`` (all copies on one queue), ``multi`` (one handshake, copies
    split over ``engines`` queues) or ``auto``; ``direction``: ``push`` (write into peers), ``pull`` (read from
    peers) or ``auto``. ``auto`` (the default of these and of ``signal``, ``wait``, ``prerecord``, ``submit``) takes
    the fastest safe combination measured for the call's (op, size, graph/eager, in place) from the communicator's
    tuning table (``tuning_table`` or $DMACOLL_TUNING, else a shipped one measured on this platform, else one
    calibrated for it: cached, or measured now on GPUs, $DMACOLL_CALIBRATE, see ``calibration.lookup``; without one
    ``FALLBACK``: pcpy/push with copy-engine flags, eager calls prerecorded; see ``resolve``).

    ``sync``: ``reset`` (graph-safe) or ``epoch`` (eager-only sequence numbers). ``signal``: how a flag reaches a
    peer, ``memop`` (cuStreamWriteValue32), ``copy`` (a 4-byte copy-engine copy queued behind the data) or
    ``kernel`` (one one-thread kernel writes a group of flags; it uses an SM, briefly); the last two need
    sync='reset'. ``wait``: how a rank waits for a flag, ``memop`` (cuStreamWaitValue32 on the stream), ``spin`` (a
    one-thread kernel polls the flag words and re-arms them: a sliver of one SM while it waits) or ``fold``
    (``spin``, and a pushed reduction's DONE waits done inside its sum kernel, each slot added as it arrives); cuda
    only, not with submit='native' (see executor.py). ``prerecord``: eager calls replay a CUDA graph recorded on
    first use per (op, size, buffers, variant): one launch instead of a command per step (cuda; sync='reset'; a call
    inside a graph capture is recorded by the capture itself; only calls whose input and output are in the symmetric
    heap, since a graph replayed on a freed private tensor's reused address faults: others run eagerly).
    ``submit``: ``python`` (a driver call from Python per step) or ``native`` (the call's driver commands worked out
    once, then issued by one call into the C library that ``dmacoll build`` compiles; cuda, signal memop or copy).

    ``handshake``: ``full`` (every call: READY then DONE, two flag crossings) or ``lean``, a promise by the caller,
    on every rank: *this call's output does not overlap the previous call's, and the output of a call is read only
    before the next collective call of this communicator is issued* (stream order), e.g. back-to-back calls into
    two alternating buffers, each read before the next call. Then a push all-gather / all-to-all(-v) into a
    symmetric output, following such a call in the same context (both eager, or both in one graph capture; not
    prerecorded, not gated), skips the READY handshake with every peer it exchanged DONE with in that call: the peer
    signalled that DONE after issuing the previous call, hence after reading the output before it, the buffer this
    call writes. One flag crossing per call instead of two. Other calls run the full handshake; an output that
    overlaps the previous one raises (the decision must not depend on one rank's buffer sizes, or ranks would
    disagree). ``Communicator.result`` gives the lean handshake without a promise.

    The communicator's own: ``engines``, the queues ``multi`` splits its copies over (1 to 16); ``tuning_table``, a
    table's path (see above); ``check_calls``: before each call, check across the ranks that every rank makes the
    same call (op, dtype, sizes, send_counts, in place, buffers, protocol options, the call's number) and raise
    ``InvalidArgument`` on every rank, naming the ranks that differ, when not (``dmacoll.consistency``). One small
    collective of the process group per call (two for ``result``), so off by default; None: on under
    $DMACOLL_CHECK_CALLS=1 or TORCH_DISTRIBUTED_DEBUG=DETAIL; the attribute ``Communicator.check_calls`` may be
    changed between calls, on every rank alike. Without it each rank still checks its own call (sizes against its
    own tensors, overlaps, integer counts) but not that its peers made the same one.

    Values are checked by ``resolve`` (a communicator checks its options when it is created, before it allocates)."""

    variant: str = "auto"
    direction: str = "auto"
    sync: str = "reset"
    signal: str = "auto"
    prerecord: Union[bool, str] = "auto"  # True, False or "auto"
    submit: str = "auto"
    handshake: str = "full"
    wait: str = "auto"
    path: str = "auto"
    # the communicator's own
    engines: int = 2
    tuning_table: Optional[str] = None
    check_calls: Optional[bool] = None

    @property
    def auto(self) -> bool:
        """Whether the tuning table (or the fallback) still has something to choose."""
        return "auto" in (self.variant, self.direction, self.signal, self.wait, self.prerecord, self.submit)

    def changed(self, changes: Mapping[str, object]) -> "Options":
        """These options with a call's ``changes`` (its keywords); a name that is no call option raises."""
        wrong = set(changes) - set(CALL_OPTIONS)
        own = sorted(wrong & {f.name for f in dataclasses.fields(self)})
        if own:
            raise InvalidArgument(f"{own[0]} is the communicator's own option, set once: "
                                  f"Communicator(options=Options({own[0]}=...))")
        if wrong:
            raise InvalidArgument(f"unknown option(s) {sorted(wrong)}; use " + ", ".join(f"{n}=" for n in CALL_OPTIONS))
        return dataclasses.replace(self, **changes) if changes else self


@dataclass(frozen=True)
class EngineCapabilities:
    """What a backend's engine can run (``Engine.capabilities``): a class attribute of each engine, read before one
    exists so that a bad option fails before any memory is allocated; an engine or communicator that learns more
    holds its own copy. The defaults are the cuda engine's: everything."""

    backend: str = "cuda"
    graphs: bool = True             # calls can be captured in (and prerecorded as) CUDA / HIP graphs
    native_submit: bool = True      # submit='native': the C library issues a call's driver commands
    kernel_signals: bool = True     # signal='kernel': flags written by one-thread kernels
    spin_waits: bool = True         # wait='spin' / 'fold': flags polled by a kernel, reductions that wait
    remote_memop_writes: bool = True  # flags may be stream-memop writes into peer memory (else copies carry them)
    memop_refusal: str = ""         # why not, where they may not
    native_available: bool = True   # the native library loads here (False once it failed to: 'auto' stops choosing it)
    sm_path: bool = True            # path='sm': dmacoll's one-shot CUDA kernels (backends/cuda_sm.py)


class Call(NamedTuple):
    """What the choice of a call's options depends on: the same on every rank, so the ranks choose alike."""

    op: str          # whose tuning-table rows choose (``OpSpec.tuning_op``)
    nbytes: int      # the size looked up (``Request.nbytes``)
    in_place: bool
    capturing: bool  # inside a CUDA graph capture (the table's 'graph' rows), else eager
    heap: bool = True  # input and output in the symmetric heap (else never prerecorded: see ``resolve``)


def resolve(options: Options, capabilities: EngineCapabilities, call: Optional[Call] = None,
            table: Optional[TuningTable] = None) -> Options:
    """What a call runs with: ``options`` checked against ``capabilities`` (InvalidArgument says what to use
    instead), memop flags sent as 4-byte copies where the driver refuses memop writes into peer memory, and every
    'auto' chosen for ``call`` from ``table`` (a reduction without rows there: its ``STAND_IN``'s), else ``fallback``.
    Without a call, what holds for every call is checked and nothing is chosen (a communicator's options when it is
    created)."""
    _check_values(options)
    _check_combination(options, capabilities)
    if not capabilities.remote_memop_writes and options.signal in ("memop", "auto"):
        if options.sync == "epoch":
            raise InvalidArgument(f"sync='epoch' sends sequence numbers as stream-memop writes to peers, and "
                                  f"{capabilities.memop_refusal}; use sync='reset'")
        if options.signal == "memop":
            options = dataclasses.replace(options, signal="copy")  # 'auto' is left to choose among copy flags
    if call is None:
        return options
    if options.sync == "epoch" and call.capturing:
        raise InvalidArgument("sync='epoch' bakes sequence numbers into a CUDA graph, whose replays would then "
                              "deadlock; capture with sync='reset'")
    if options.prerecord is True and capabilities.graphs and not call.capturing and options.sync != "reset":
        raise InvalidArgument("prerecord=True replays a CUDA graph: it needs sync='reset'")
    if options.prerecord is True and not call.heap:
        # a recorded graph holds its buffers' addresses: a private tensor's memory can be freed (torch.cuda.graph
        # empties the allocator's cache) and the address handed to a new tensor, and replaying the old graph on it
        # faults the copy engine (issue 47); the heap lives as long as the communicator
        options = dataclasses.replace(options, prerecord=False)
    if not options.auto:
        return options
    may = allowed(options, capabilities, call.capturing, call.heap)
    mode = "graph" if call.capturing else "eager"
    looked_up = (op for op in (call.op, STAND_IN.get(call.op)) if op and table)
    choice = next(filter(None, (table.select(op, call.nbytes, mode, call.in_place, may) for op in looked_up)),
                  None) or fallback(may)
    return dataclasses.replace(options, **{name: getattr(choice, name) for name in Choice._fields
                                           if getattr(options, name) == "auto"})


def _check_values(options: Options) -> None:
    for name, values in (("variant", VARIANTS + ("auto",)), ("direction", DIRECTIONS + ("auto",)),
                         ("sync", SYNC_MODES), ("signal", SIGNAL_MODES + ("auto",)), ("submit", SUBMITS + ("auto",)),
                         ("handshake", HANDSHAKES), ("wait", WAIT_MODES + ("auto",)),
                         ("prerecord", (False, True, "auto")), ("path", PATHS + ("auto",))):
        value = getattr(options, name)
        wrong_type = isinstance(value, bool) != (name == "prerecord" and value != "auto")  # 1 == True: a bool
        if wrong_type or value not in values:
            raise InvalidArgument(f"{name}={value!r} is not one of {values}")
    engines = options.engines
    if isinstance(engines, bool) or not isinstance(engines, int) or not 1 <= engines <= MAX_ENGINES:
        raise InvalidArgument(f"engines must be between 1 and {MAX_ENGINES}, got {engines!r}")


def _check_combination(options: Options, capabilities: EngineCapabilities) -> None:
    """Options that do not go together, or that this engine cannot run."""
    backend = capabilities.backend
    if options.signal in ("copy", "kernel") and options.sync == "epoch":
        raise InvalidArgument(f"signal={options.signal!r} sends a constant 1: it needs sync='reset'")
    if options.signal == "kernel" and not capabilities.kernel_signals:
        raise InvalidArgument(f"signal='kernel' launches dmacoll's CUDA flag kernels; on backend={backend!r} use "
                              "signal='memop' or 'copy'")
    if options.submit == "native" and not capabilities.native_submit:
        raise InvalidArgument(f"submit='native' issues CUDA driver calls: it needs backend='cuda', not {backend!r}")
    if options.submit == "native" and options.signal == "kernel":
        raise InvalidArgument("submit='native' issues driver calls only: use signal='memop' or 'copy'")
    if options.path == "sm" and not capabilities.sm_path:
        raise InvalidArgument(f"path='sm' runs dmacoll's CUDA kernels; on backend={backend!r} use path='dma'")
    if options.wait in ("spin", "fold"):
        if not capabilities.spin_waits:
            raise InvalidArgument(f"wait={options.wait!r} runs CUDA kernels; on backend={backend!r} use wait='memop'")
        if options.submit == "native":
            raise InvalidArgument(f"submit='native' issues driver calls only, and wait={options.wait!r} launches a "
                                  "kernel: use wait='memop'")


def choose_path(options: Options, capabilities: EngineCapabilities, op: str, sm_bytes: Optional[int], world: int,
                gated: bool = False, nbytes: int = 0, nccl: bool = False, staged: bool = True,
                eager: bool = False, table: Optional[TuningTable] = None) -> str:
    """Which data path a call takes: the caller's, or for 'auto' the copy engines where the caller chose a copy-engine
    option (a variant, direction, signal, wait, prerecord or submit) or the call is behind a prelaunch gate
    (``gated``); else, where ``table`` measured the paths for ``op`` (a calibrated table), the fastest it measured
    at ``nbytes`` of those the call may take (``sm`` where the engine has it and the call fits it: ``sm_bytes``, its
    bytes per peer there, None where the sm path cannot run it; ``nccl`` where the communicator's group runs it;
    ``dma`` where its plans fit the staging area, ``staged``), NCCL unless another took less than
    ``1 - PATH_MARGIN`` of its time; else the measured constants: the sm path where the call fits it up to
    ``sm_auto_max_bytes`` (an ``eager`` all_reduce: of at most ``EAGER_ALL_REDUCE_SM_MAX_BYTES``), else NCCL where
    the group runs it (``nccl``) and ``nccl_auto`` says the copy engines were not measured faster at ``nbytes`` or
    their plans would not fit the staging area, else the copy engines. Pure, the same on every rank."""
    if options.path != "auto":
        return options.path
    if gated or any(getattr(options, name) != "auto" for name in COPY_ENGINE_OPTIONS):
        return "dma"
    fits_sm = capabilities.sm_path and sm_bytes is not None
    if table is not None and op in NCCL_AUTO_OPS:
        may = [path for path, ok in (("sm", fits_sm), ("nccl", nccl), ("dma", staged or not nccl)) if ok]
        measured = table.fastest_path(op, nbytes, "eager" if eager else "graph", may, "nccl", PATH_MARGIN)
        if measured:
            return measured
    if fits_sm and sm_bytes <= sm_auto_max_bytes(world, op) and not (
            eager and op == "all_reduce" and nbytes > EAGER_ALL_REDUCE_SM_MAX_BYTES):
        return "sm"
    return "nccl" if nccl and (nccl_auto(world, op, nbytes) or not staged) else "dma"


def candidates(capabilities: EngineCapabilities, eager: bool, epoch: bool = False) -> dict[str, set]:
    """Per option 'auto' may choose (``tuning.CHOSEN``), the values an engine with ``capabilities`` runs. Never
    chosen: signal='kernel' (an SM while it signals; measured slower), memop flags where the driver refuses them
    (copy flags carry a constant: not with sync='epoch'), prerecording (a replayed graph: sync='reset') or native
    submission under capture, native submission where the library does not load."""
    native = eager and capabilities.native_submit and capabilities.native_available
    return {"signal": {"memop"} if epoch else {"copy", "memop"} if capabilities.remote_memop_writes else {"copy"},
            "wait": {"memop", "spin", "fold"} if capabilities.spin_waits else {"memop"},
            "prerecord": {False, True} if eager and capabilities.graphs and not epoch else {False},
            "submit": {"python", "native"} if native else {"python"}}


def allowed(options: Options, capabilities: EngineCapabilities, capturing: bool, heap: bool = True
            ) -> dict[str, set]:
    """Per option the table may choose, the values a call may take: the caller's where it fixed one, else what the
    engine runs (``candidates``); prerecording only with both buffers in the symmetric heap (``heap``)."""
    runs = candidates(capabilities, not capturing, options.sync == "epoch")
    if not heap:
        runs["prerecord"] = {False}
    return {name: values if getattr(options, name) == "auto" else {getattr(options, name)}
            for name, values in runs.items()}


def choices(allowed: Mapping[str, Collection]) -> list[Choice]:
    """Every combination 'auto' may choose among (``allowed``: what ``candidates`` gives, per option): each variant
    and direction with each allowed value of the other options, less prerecorded native submission (a replayed
    graph submits nothing)."""
    values = [VARIANTS, DIRECTIONS, *(sorted(allowed[name], key=str) for name in CHOSEN)]
    return [c for c in map(Choice._make, itertools.product(*values)) if not (c.prerecord and c.submit == "native")]


def fallback(allowed: Mapping[str, Collection]) -> Choice:
    """FALLBACK, each option that ``allowed`` rules out replaced by the first value it may take."""
    values = FALLBACK._asdict()
    for name in CHOSEN:
        if name in allowed and values[name] not in allowed[name]:
            values[name] = sorted(allowed[name], key=str)[0]
    return Choice(**values)
