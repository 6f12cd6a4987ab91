"""The user object: collectives on DMA engines for one ``torch.distributed`` group.

Memory of a communicator (the same layout on every rank, so offsets are shared)::

    [ flag words | staging area | heap for Communicator.empty() ]

Tensors from ``empty()`` are addressable by peers (zero-copy); other tensors
are staged through the staging area when the protocol needs peer access
(push into a private output, pull from a private input).

A call goes through four steps, each a method below: its tensors are checked by the op's spec
(``ops``) and its options resolved (``options.resolve``: legality, and 'auto' from the tuning table), once per
call shape; a plan is chosen (the lean-handshake state for the flags, ``LeanState``) and lowered once per key (the
program cache); then it is submitted to the engine (now, as a recorded graph's replay, or behind a prelaunch
gate).
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import warnings
from typing import TYPE_CHECKING, Iterator, NamedTuple, NoReturn, Optional, Sequence

import torch
import torch.distributed as dist

from . import backends, consistency, nccl_path, ops, validate
from .calibration import lookup
from .errors import BackendUnavailable, DmaCollDeviceError, DmaCollError, DmaCollTimeoutError, InvalidArgument
from .executor import GATES, Program, flag_words, lower, run, wait_words
from .options import Call, CallOptions, Options, choose_path, nccl_auto, resolve
from .plan import DONE, DONE_ALT, FULL, Handshake, Layout, Wait
from .tuning import TuningTable

if TYPE_CHECKING:
    from typing_extensions import Unpack

ALIGN = 512
log = logging.getLogger("dmacoll")
_REFUSALS_SAID: set[str] = set()  # each reason for a fallback is logged once per process
DEFAULT_TIMEOUT_S = float(os.environ.get("DMACOLL_TIMEOUT_S", "120"))


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class LeanState:
    """handshake='lean' bookkeeping (see ``Options``): what the previous call proved.

    ``previous`` is (context, output start, output end, peers we waited DONE from, its DONE phase) when the
    previous call was one exchange into a symmetric output, else None."""

    def __init__(self):
        self.previous: Optional[tuple[object, int, int, frozenset, int]] = None

    def flags(self, spec: ops.OpSpec, options: Options, context: object,
              output: Optional[tuple[int, int]]) -> Handshake:
        """READY skipped with the peers the previous call vouches for, DONE alternating along such runs.
        Every condition is the same on every rank (buffer kinds and call options must be), so the ranks
        of a pair always agree."""
        prev = self.previous
        if (options.handshake != "lean" or spec.reduces or options.direction != "push" or output is None or prev is None
                or prev[0] != context):
            return FULL
        _, prev_start, prev_end, done_peers, prev_done = prev
        if output[0] < prev_end and prev_start < output[1]:
            raise InvalidArgument(f"{spec.name} with handshake='lean': the output (heap bytes {output[0]}.."
                                  f"{output[1]}) overlaps the previous call's ({prev_start}..{prev_end}); alternate "
                                  "between two output buffers or pass handshake='full' for this call")
        return Handshake(done_peers, DONE_ALT if prev_done == DONE else DONE)

    def record(self, spec: ops.OpSpec, context: object, output: Optional[tuple[int, int]], done_peers: frozenset,
               flags: Handshake) -> None:
        exchange = not spec.reduces and output is not None
        self.previous = (context, *output, done_peers, flags.done) if exchange else None


class Lowered(NamedTuple):
    """A call's lowered plans (cached per call shape), what its last plan waits DONE from (what a lean successor
    may skip READY with), the peers it waits on at all and the flag words it waits on in issue order (for a timeout's
    message: the watchdog names the peers whose signals never came)."""

    programs: tuple[Program, ...]
    done: frozenset
    waits: str
    words: tuple[int, ...]


class ResultBuffers:
    """The two alternating regions of the symmetric heap that ``Communicator.result`` returns outputs in, grown
    (at least doubled, both together) when a call needs more; a grown pair replaces the old one, whose bytes the
    heap does not take back (so up to 4x the largest output in all; ``reserve`` first to hold exactly 2x).
    ``take`` hands out the region the previous call did not use; ``taken`` says the call ran (a rejected call
    leaves the alternation where it was, the same on every rank)."""

    def __init__(self, allocate):
        self.allocate = allocate  # bytes -> a uint8 tensor of the symmetric heap (collective)
        self.regions: list[torch.Tensor] = []
        self.next = 0

    def reserve(self, nbytes: int, grow: int = 1) -> None:
        held = self.regions[0].numel() if self.regions else 0
        if not self.regions or nbytes > held:
            size = max(nbytes, grow * held, 4096)
            self.regions = [self.allocate(size), self.allocate(size)]

    def take(self, nbytes: int, capturing: bool) -> torch.Tensor:
        held = self.regions[0].numel() if self.regions else 0
        if capturing and (not self.regions or nbytes > held):
            raise InvalidArgument(f"Communicator.result needs {nbytes} bytes but holds {held}: growing them "
                                  "allocates collectively, which a CUDA graph capture cannot; make one call of "
                                  "the largest size (or reserve_results) before capturing")
        self.reserve(nbytes, grow=2)
        return self.regions[self.next][:nbytes]

    def taken(self) -> None:
        self.next = 1 - self.next


def _result_shape(input: torch.Tensor, numel: int) -> tuple[int, ...]:
    """The input's shape with its first dimension scaled to ``numel`` elements where it divides, else flat."""
    row = input[0].numel() if input.dim() > 0 and input.shape[0] > 0 else 0
    return (numel // row, *input.shape[1:]) if row and numel % row == 0 else (numel,)


class Communicator:
    """DMA collectives for the ranks of ``group`` (default: the world group).

    ``backend``: ``cuda``, ``hip``, ``host`` (the CPU emulator) or ``auto`` (cuda or hip where torch sees a GPU,
    else host), on ``device`` (default: the current one); ``heap_bytes``: the symmetric heap that ``empty()``
    allocates from; ``staging_bytes``: where private tensors and reduced chunks are staged (a call that needs more
    says how much to ask for); ``timeout_s``: how long a wait for a peer may take before it raises
    ``DmaCollTimeoutError``; ``options``: how the collectives run (``Options``: variant, direction, flags, waits,
    the tuning table, the cross-rank check...), each call option overridable per call by keyword.

    The collectives (``all_gather``, ``all_to_all``, ``all_to_all_v``, ``reduce_scatter``, ``all_reduce``) are the
    methods below, each the registry's op (``dmacoll.ops``) by name; ``collective(name, ...)`` calls any registered
    op. Calls enqueue work on the current stream and never block the host; they can be captured in a CUDA graph
    (sync='reset'). ``result(op, input, ...)`` returns an output the communicator owns (the lean handshake without
    a promise). ``calibrate()`` measures the 'auto' defaults of the platform when the caller chooses (the constructor
    never measures; without a table to take, the first call outside a graph capture does). After ``close()`` every
    use raises ``InvalidArgument``.
    """

    def __init__(self, group: Optional[dist.ProcessGroup] = None, *, backend: str = "auto",
                 device: Optional[torch.device] = None, heap_bytes: int = 64 << 20, staging_bytes: int = 16 << 20,
                 timeout_s: float = DEFAULT_TIMEOUT_S, options: Optional[Options] = None, **moved: NoReturn):
        if moved:
            raise TypeError(_moved_keywords(moved))
        options = Options() if options is None else options
        if not isinstance(options, Options):
            raise TypeError(f"options must be dmacoll.Options(...), got {type(options).__name__}")
        if not dist.is_initialized():
            raise InvalidArgument("torch.distributed is not initialised; call dist.init_process_group first")
        self.group = group if group is not None else dist.group.WORLD
        self.rank = dist.get_rank(self.group)
        self.world = dist.get_world_size(self.group)
        validate.check_world(self.world)
        if timeout_s <= 0:
            raise InvalidArgument(f"timeout_s must be > 0, got {timeout_s}")
        self.backend = _agreed_backend(backend, self.group, self.world)
        resolve(options, backends.engine_class(self.backend).capabilities)  # refused before any memory is allocated
        self._nccl = nccl_path.available(self.group, self.backend)  # path 'nccl': the group runs NCCL
        if options.path == "nccl" and not self._nccl:
            raise InvalidArgument(_NO_NCCL.format(what="path='nccl'", backend=self.backend))
        self.options = options
        self.staging = _align(flag_words(self.world) * 4)
        self.heap_start = self.staging + _align(staging_bytes)
        heap_end = self.heap_start + _align(heap_bytes)
        engine_class = backends.engine_class(self.backend)
        # the sm path's area (flags, epochs, slots) sits past the heap that empty() allocates from
        total = heap_end + (_align(engine_class.sm_area_bytes(self.world)) if engine_class.capabilities.sm_path else 0)
        self.engine = backends.make_engine(self.backend, self.group, total, flag_words(self.world), timeout_s, device)
        self.capabilities = self.engine.capabilities  # the native library's loading: learned on first need
        try:
            resolve(options, self.capabilities)  # what the engine found at start (memop writes into peer memory)
            self._say_copy_flags(options)
            if options.wait in ("spin", "fold"):
                self.engine.load_kernels()
            if self.capabilities.sm_path:
                self.engine.open_sm(heap_end)
        except DmaCollError:
            self.engine.close()
            raise
        self.device = self.engine.device
        self._ops_group = ops.Group(self.world, self.rank, self.device)
        try:  # given, shipped or cached; or one to calibrate at the first call (the constructor never measures)
            self.tuning, self._calibration = lookup.table_for(self, options.tuning_table)
        except DmaCollError:
            self.engine.close()
            raise
        self._next = self.heap_start
        self._total = heap_end
        self._epoch = 0
        self._calls = 0
        self._programs: dict[tuple, Lowered] = {}
        self._resolved: dict[tuple, Options] = {}  # (op, size, in place, capturing, a call's changes) -> its Options
        self._repeats: dict[tuple, tuple[ops.OpSpec, Options]] = {}  # _repeat_key -> an sm / nccl call's spec, options
        self._lean = LeanState()
        self._results = ResultBuffers(lambda n: self.empty(n, dtype=torch.uint8))
        self.last_handshake: Handshake = FULL  # the flags the last call used (for tests and logs)
        self.last_options: Optional[Options] = None  # every option the last call ran with, 'auto' resolved
        self.error: Optional[DmaCollError] = None  # set by a failed call; every later call raises it
        self._gate: Optional[Gate] = None  # the open or pending prelaunch gate
        self._gates_used = 0
        self.check_calls = consistency.enabled(options.check_calls)  # every rank alike (see Options)
        self.closed = False

    # -- memory ----------------------------------------------------------------
    def empty(self, *shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """A tensor in the symmetric heap; peers read and write it directly.

        Collective: every rank must allocate the same sizes in the same order."""
        self._check_open("empty")
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)) else shape
        nbytes = _align(max(1, int(torch.Size(shape).numel()) * torch.empty((), dtype=dtype).element_size()))
        validate.check_capacity("Communicator.empty", self._next + nbytes, self._total,
                                f"create the communicator with a larger heap_bytes (free: "
                                f"{self._total - self._next} bytes)")
        offsets: list = [None] * self.world
        dist.all_gather_object(offsets, (self._next, nbytes), group=self.group)
        if len(set(offsets)) != 1:
            raise InvalidArgument(f"ranks allocated different symmetric tensors: (offset, bytes) per rank = "
                                  f"{offsets}; allocate the same shapes in the same order on every rank")
        start, self._next = self._next, self._next + nbytes
        flat = self.engine.heap[start: start + nbytes].view(dtype)
        return flat[: torch.Size(shape).numel()].view(shape)

    # -- collectives -------------------------------------------------------------
    def all_gather(self, output: torch.Tensor, input: torch.Tensor, **options: Unpack[CallOptions]) -> torch.Tensor:
        """``output`` = every rank's ``input``, concatenated in rank order (world x ``input``'s elements); in place
        when ``input`` is this rank's chunk of ``output``. ``options``: this call's changes to the communicator's
        call options (``Options``), e.g. ``variant='b2b'``. Returns ``output``."""
        return self.collective("all_gather", output, input, **options)

    def all_to_all(self, output: torch.Tensor, input: torch.Tensor, **options: Unpack[CallOptions]) -> torch.Tensor:
        """Equal splits: chunk p of ``input`` goes to rank p, where it lands as chunk r (this rank) of its ``output``
        (both world x chunk elements). ``options`` as in ``all_gather``. Returns ``output``."""
        return self.collective("all_to_all", output, input, **options)

    def all_to_all_v(self, output: torch.Tensor, input: torch.Tensor, send_counts: Sequence[Sequence[int]],
                     **options: Unpack[CallOptions]) -> torch.Tensor:
        """Uneven splits: ``send_counts[i][j]`` elements go from rank i to rank j (the same matrix on every rank,
        ints or integer tensors); ``input`` holds this rank's row back to back, ``output`` receives its column in
        rank order. ``options`` as in ``all_gather``. Returns ``output``."""
        return self.collective("all_to_all_v", output, input, send_counts, **options)

    def reduce_scatter(self, output: torch.Tensor, input: torch.Tensor,
                       **options: Unpack[CallOptions]) -> torch.Tensor:
        """``output`` = the sum over the ranks of chunk r (this rank) of their ``input`` (world x ``output``'s
        elements); in place when ``output`` is this rank's chunk of ``input``. Sums in ``ops.REDUCE_DTYPES``.
        ``options`` as in ``all_gather``. Returns ``output``."""
        return self.collective("reduce_scatter", output, input, **options)

    def all_reduce(self, tensor: torch.Tensor, input: Optional[torch.Tensor] = None,
                   **options: Unpack[CallOptions]) -> torch.Tensor:
        """``tensor`` = the sum over the ranks of their ``input`` (default: ``tensor`` itself, in place, like
        ``torch.distributed.all_reduce``). Sums in ``ops.REDUCE_DTYPES``. ``options`` as in ``all_gather``.
        Returns ``tensor``."""
        return self.collective("all_reduce", tensor, input, **options)

    def collective(self, op: str, output: torch.Tensor, input: Optional[torch.Tensor] = None, *args: object,
                   **options: Unpack[CallOptions]) -> torch.Tensor:
        """Run collective ``op`` (a name in ``dmacoll.ops``; its method's arguments after ``output``, ``input``,
        then this call's option changes); the named methods call this."""
        capturing = self.engine.is_capturing()
        repeat = self._repeat_key(op, output, input, capturing, options) if not args else None
        known = self._repeats.get(repeat) if repeat is not None else None
        if known is not None:  # an sm / nccl call seen before with these very tensors: its checks and choice hold
            self._check_open(op)
            self._check_usable(op)
            self._run_kernel_path(known[0], output, output if input is None else input, None, known[1])
            return output
        if self._calibration is not None and not capturing and self._gate is None:
            self._calibrate(self._calibration)  # the first call measures the platform's defaults once (cached), on
            # every rank before its own checks of the call: a rank that refuses the call must not leave the others
            # calibrating alone
        spec, request, opts, syms = self._agreed(op, lambda: self._checked(op, output, input, args, options,
                                                                          capturing),
                                                 lambda checked: self._signature(*checked))
        # not behind a prelaunch gate: recording a graph synchronizes the device (torch.cuda.graph), which waits for
        # the gate stream, which waits for a release the host has not issued yet: a deadlock
        prerecord = opts.prerecord and self.capabilities.graphs and not capturing and self._gate is None
        if opts.path in ("sm", "nccl"):
            self._run_kernel_path(spec, request.output, request.input, _matrix(spec, request), opts)
            if repeat is not None and spec.name != "all_to_all_v":
                if len(self._repeats) >= 4096:
                    self._repeats.clear()
                self._repeats[repeat] = (spec, opts)
            return output
        if opts.submit == "native":
            self.engine.ensure_native()  # a missing library is an error of this call, not of the communicator
        if opts.wait != "memop":
            self.engine.load_kernels()
        self._submit(spec, request, opts, self._plan(spec, request, opts, syms, capturing, prerecord), prerecord)
        return output

    def _checked(self, op: str, output: torch.Tensor, input: Optional[torch.Tensor], args: tuple, options: dict,
                 capturing: bool) -> tuple[ops.OpSpec, ops.Request, Options, tuple[Optional[int], Optional[int]]]:
        """This rank's checks of a call (InvalidArgument before any device work): its tensors, its options; and
        where its input and output sit in the symmetric heap (None: private), worked out once per call."""
        spec = ops.get(op)
        self._check_open(op)
        request = spec.bind(self._ops_group, output, input, *args)
        validate.check_overlap(spec.name, request.output, request.input, request.in_place, spec.in_place)
        self._check_usable(spec.name)
        syms = (self.engine.sym_offset(request.input), self.engine.sym_offset(request.output))
        return spec, request, self._options(spec, request, options, capturing, None not in syms), syms

    def _sm_bytes(self, spec: ops.OpSpec, request: ops.Request) -> Optional[int]:
        """The call's bytes per peer on the sm path (None: the path cannot run it here)."""
        if not self.capabilities.sm_path or spec.name == "all_to_all_v" and request.in_place:
            return None  # in place, all_to_all_v's rows and columns overlap: a block could overwrite unsent input
        return self.engine.sm_bytes(spec.name, ops.spec.nbytes(request.input), ops.spec.nbytes(request.output),
                                    ops.dtype_name(request.input.dtype), _matrix(spec, request))

    def _repeat_key(self, op: str, output: object, input: object, capturing: bool, options: dict) -> Optional[tuple]:
        """What decides an sm / nccl call's checks and options (None where a call must take the full way: a
        calibration or a cross-rank check to come, a prelaunch block, an unhashable option): the tensors' addresses,
        shapes, strides and dtypes fix every check (device, contiguity, sizes, overlap, heap or not), and the
        options hang on nothing else but the call's option changes. The eager fast path: a repeated call skips
        binding and checking (tens of microseconds of Python)."""
        if not self.capabilities.sm_path or self._calibration is not None or self.check_calls or self._gate is not None:
            return None
        if not isinstance(output, torch.Tensor) or not (input is None or isinstance(input, torch.Tensor)):
            return None
        inp = None if input is None else (input.data_ptr(), input.shape, input.stride(), input.dtype)
        key = (op, capturing, output.data_ptr(), output.shape, output.stride(), output.dtype, inp,
               tuple(sorted(options.items())))
        try:
            hash(key)
        except TypeError:  # a value no option takes: the full way says which
            return None
        return key

    def _run_kernel_path(self, spec: ops.OpSpec, output: torch.Tensor, input: torch.Tensor, matrix: Optional[tuple],
                         opts: Options) -> None:
        """One call on the sm path (a kernel on the current stream, the engine's ``sm``; a wait that gave up since the
        last call is raised first, naming the silent ranks) or on the nccl path (``nccl_path``)."""
        self._calls += 1
        if opts.path == "sm":
            silent = self.engine.sm.silent_ranks()
            if silent:
                self.error = DmaCollTimeoutError(f"an sm call waited more than {self.engine.timeout_s:g} s for "
                                                 f"rank(s) {', '.join(map(str, silent))} to deliver; the "
                                                 "communicator is unusable")
                raise self.error
            self.engine.begin_call(f"{spec.name} call #{self._calls} (sm)")  # raises a timeout the watchdog saw
        else:
            self.engine.raise_timeout()  # NCCL runs on its own stream: only a copy-engine call's timeout to raise
        try:
            if opts.path == "sm":
                self.engine.sm.run(spec.name, output, input, matrix)
            else:
                nccl_path.run(spec.name, output, input, matrix, self.group, self.rank)
        except InvalidArgument:
            raise
        except Exception as e:
            self._raise_failed(f"{spec.name} call #{self._calls} ({opts.path})", e)
        self._lean.previous = None  # no DONE was exchanged: the next copy-engine call vouches for nothing
        self.last_handshake = FULL
        self.last_options = opts

    def _signature(self, spec: ops.OpSpec, request: ops.Request, opts: Options,
                   syms: tuple[Optional[int], Optional[int]]) -> dict:
        """What every rank must agree on for a call to meet (the cross-rank check, ``consistency``)."""
        def buffer(offset: Optional[int]) -> str:
            return "private" if offset is None else f"symmetric at {offset}"
        if request.in_place:  # one buffer, the rank's part of it where the op's form puts it: the larger one counts
            first = 0 if request.input.data_ptr() <= request.output.data_ptr() else 1
            buffers = ("in place", buffer(syms[first]))
        else:
            buffers = (buffer(syms[0]), buffer(syms[1]))
        return {"call": self._calls + 1, "op": spec.name, "dtype": ops.dtype_name(request.input.dtype),
                "sizes (bytes)": request.key, "buffers (input, output)": buffers, "direction": opts.direction,
                "sync": opts.sync, "signal": opts.signal, "handshake": opts.handshake, "path": opts.path}

    def _agreed(self, op: str, prepare, signature):
        """``prepare()``: this rank's part of a call before any collective work. With the cross-rank check on,
        every rank then learns whether all the others accepted the same call (``signature`` of what ``prepare``
        returned), and if not, every rank raises."""
        if not self.check_calls:
            return prepare()
        try:
            value = prepare()
            mine, error = signature(value), None
        except Exception as e:  # noqa: BLE001 - said to the peers, then raised here as it was
            mine, error = None, e
        consistency.agree(self.group, f"{op} call #{self._calls + 1}", mine,
                          None if error is None else f"{type(error).__name__}: {error}")
        if error is not None:
            raise error
        return value

    def result(self, op: str, input: torch.Tensor, *args: object,
               **options: Unpack[CallOptions]) -> torch.Tensor:
        """Run collective ``op`` into an output the communicator owns, and return that output.

        The output is valid until the next collective call of this communicator is issued: read it (on the
        call's stream, or on a stream that waits for it) or pass it as the next call's input before then; copy it
        to keep it longer. The outputs alternate between two buffers of the symmetric heap, so the library itself
        knows what ``handshake='lean'`` otherwise needs the caller to promise, and an all-gather / all-to-all(-v)
        that follows such a call skips the READY crossing by default (``handshake=`` overrides). Same arguments
        as the named method, without ``output``; shapes: the input's with its first dimension scaled (all-gather:
        x world, reduce-scatter: / world), all-to-all-v flat (this rank's column of ``send_counts``). The
        buffers grow collectively (every rank calls with sizes that agree, as for any collective): the first
        call of a new largest size must not be inside a CUDA graph capture."""
        # growing the buffers allocates collectively: the ranks agree on the size first (with the check on)
        numel, reserve = self._agreed(op, lambda: self._result_sizes(op, input, args),
                                      lambda sizes: {"op": op, "result bytes": sizes[1] * input.element_size()})
        spec, size = ops.get(op), input.element_size()
        region = self._results.take(reserve * size, self.engine.is_capturing())
        output = region[: numel * size].view(input.dtype).view(_result_shape(input, numel))
        if not spec.reduces:
            options.setdefault("handshake", "lean")
        self.collective(op, output, input, *args, **options)
        self._results.taken()  # only a call that ran moves on to the other buffer: the ranks alternate alike
        return output

    def _result_sizes(self, op: str, input: torch.Tensor, args: tuple) -> tuple[int, int]:
        """(elements of this rank's output, elements every rank reserves) of a ``result`` call, checked."""
        spec = ops.get(op)
        self._check_open(op)
        if not isinstance(input, torch.Tensor):
            raise InvalidArgument(f"{op}: result(op, input, ...) needs an input tensor, got {type(input).__name__}")
        self._check_usable(op)
        return spec.result_numel(self.world, self.rank, input, *args)

    def warm_up(self) -> None:
        """Compile and load now what a path's first call would (the copy engines' wait and sum kernels, the sm
        path's kernels: NVRTC, a fraction of a second each), so that no call pays it: a server calls this at start,
        before it times or serves anything. This rank only, no collective; the calls' plans are still built at each
        call shape's first call."""
        self._check_open("warm_up")
        if self.engine.is_capturing():
            raise InvalidArgument("warm_up() compiles kernels: call it outside a CUDA graph capture")
        if self.capabilities.spin_waits:
            self.engine.load_kernels()
        if self.capabilities.sm_path:
            self.engine.sm.kernels()

    def calibrate(self, budget_s: Optional[float] = None, force: bool = True) -> bool:
        """Measure the candidates 'auto' may choose on this platform now, within about ``budget_s`` seconds (default
        $DMACOLL_CALIBRATE_BUDGET_S, else 20), cache the table and take it from the next call: whatever table the
        communicator had, or (``force=False``) only where it has none to take and calibration is on
        ($DMACOLL_CALIBRATE, ``calibration.lookup``), which its first call outside a graph capture would otherwise do.
        Collective: every rank calls it. Returns whether a table was made (else 'auto' keeps what it had; a failure
        is logged)."""
        self._check_open("calibrate")
        if self.engine.is_capturing() or self._gate is not None:
            raise InvalidArgument("calibrate() allocates and times collectives: call it outside a CUDA graph capture "
                                  "and a prelaunch block")
        if not force:
            return self._calibration is not None and self._calibrate(self._calibration)
        return self._calibrate(lookup.forced(self, budget_s))

    def _calibrate(self, calibration: lookup.Calibration) -> bool:
        self._calibration = None  # measured once, whatever comes of it
        table = lookup.calibrate(self, calibration, self._measuring)
        if table is not None:
            self._use_table(table)
        return table is not None

    def _use_table(self, table: Optional[TuningTable]) -> None:
        """Take ``table`` for the calls' 'auto' options and paths from the next call on (every rank alike: the
        calibration gives each rank the same table)."""
        self.tuning = table
        self._resolved.clear()  # the calls' options are chosen again from the new table
        self._repeats.clear()

    def _measuring(self, heap_bytes: int) -> "Communicator":
        """The communicator a calibration times its candidates on: this one's group, backend, device, queues and
        staging area (which decides where a copy-engine sum can run), a heap of its own, no table (``lookup`` gives
        it none while calibrating)."""
        return Communicator(self.group, backend=self.backend, device=self.device, heap_bytes=heap_bytes,
                            staging_bytes=self.heap_start - self.staging, timeout_s=self.engine.timeout_s,
                            options=Options(engines=self.options.engines))

    def reserve_results(self, nbytes: int) -> None:
        """Hold ``result``'s two output buffers at ``nbytes`` each or more from now on (collective, like
        ``empty``): outputs up to that size then never grow them."""
        self._check_open("reserve_results")
        self._results.reserve(int(nbytes))

    def _check_open(self, what: str) -> None:
        if self.closed:
            raise InvalidArgument(f"{what}: this communicator is closed; create a new Communicator")

    def _check_usable(self, op: str) -> None:
        if self.error is not None:
            raise DmaCollError(f"this communicator is unusable after an earlier error ({self.error}); "
                               "create a new one")
        if self._gate is not None and self._gate.closed:
            raise InvalidArgument(f"{op}: a prelaunched collective is still pending; call gate.wait() first "
                                  "(collectives of one communicator run one after another)")

    def _options(self, spec: ops.OpSpec, request: ops.Request, changes: dict, capturing: bool, heap: bool) -> Options:
        """What this call runs with (``options.resolve``), worked out once per (op, size, in place, graph/eager,
        both buffers in the heap or not, changes), then a dict lookup: the size is the same on every rank
        (``Request.nbytes``), so the ranks choose alike. A rejected call stores nothing."""
        try:
            # all_to_all_v's matrix too: its path depends on every entry, not only on the largest row
            key = (spec.name, request.nbytes, request.in_place, capturing, heap, request.input.dtype,
                   self._gate is not None, _matrix(spec, request), tuple(sorted(changes.items())) if changes else ())
            resolved = self._resolved.get(key)
        except TypeError:  # an unhashable value: not an option (resolve says which), nothing to cache
            key, resolved = None, None
        if resolved is None:
            wanted = self.options.changed(changes)
            call = Call(spec.tuning_op, request.nbytes, request.in_place, capturing, heap)
            resolved = resolve(wanted, self.capabilities, call, self.tuning)
            shared = self.capabilities.sm_path and self.engine.sm_shares_device()
            sm_bytes = self._sm_bytes(spec, request)
            # a copy-engine sum that would not fit the staging area goes to NCCL rather than to an error; its plans
            # are built only where that can decide (a sum that a table's measured paths or, without them, its size
            # may give the copy engines)
            by_size = not (self.tuning is not None and self.tuning.measured_paths(spec.name))
            staged = not (spec.reduces and self._nccl) \
                or (by_size and nccl_auto(self.world, spec.name, request.nbytes)) or self._stages(request, resolved)
            path = choose_path(wanted, self.capabilities, spec.name, sm_bytes, self.world,
                               self._gate is not None or shared, request.nbytes, self._nccl, staged, not capturing,
                               self.tuning)
            if path == "sm":
                if sm_bytes is None:
                    raise InvalidArgument(f"{spec.name} with path='sm': the sm path runs all_gather, all_to_all(_v), "
                                          f"all_reduce and reduce_scatter up to {self.engine.sm.slot_bytes} bytes "
                                          "per peer and 8 ranks (sums of float and int dtypes; all_to_all_v not in "
                                          "place); use path='dma'")
                if self._gate is not None:
                    raise InvalidArgument(f"{spec.name} with path='sm' inside a prelaunch block: prelaunched calls "
                                          "run on the copy engines; use path='dma'")
            elif path == "nccl":
                if not self._nccl:
                    raise InvalidArgument(_NO_NCCL.format(what=f"{spec.name} with path='nccl'", backend=self.backend))
                if self._gate is not None:
                    raise InvalidArgument(f"{spec.name} with path='nccl' inside a prelaunch block: prelaunched calls "
                                          "run on the copy engines; use path='dma'")
            elif resolved.submit == "native" and wanted.submit == "auto" and not self._native_available():
                resolved = resolve(wanted, self.capabilities, call, self.tuning)  # chosen again, from Python
            resolved = dataclasses.replace(resolved, path=path)
            self._say_copy_flags(wanted)
            if key is not None:
                if len(self._resolved) >= 4096:
                    self._resolved.clear()
                self._resolved[key] = resolved
        return resolved

    def _native_available(self) -> bool:
        """Whether the native library loads here (built on first use if needed); a failure is said once, and from
        then on the capabilities say so: the calls go on from Python."""
        if not self.capabilities.native_available:
            return False
        try:
            self.engine.ensure_native()
            return True
        except DmaCollError as e:
            self.capabilities = dataclasses.replace(self.capabilities, native_available=False)
            log.warning("dmacoll: submitting from Python: %s", e)
            return False

    def _say_copy_flags(self, options: Options) -> None:
        """Where the driver refuses memop writes into peer memory, say once per process that flags travel as
        copies (``resolve`` sends them so)."""
        why = self.capabilities.memop_refusal
        if options.signal in ("memop", "auto") and not self.capabilities.remote_memop_writes \
                and why not in _REFUSALS_SAID:
            _REFUSALS_SAID.add(why)
            log.warning("dmacoll: %s: flags travel as 4-byte copy-engine copies (signal='copy')", why)

    def _plan(self, spec: ops.OpSpec, request: ops.Request, opts: Options, syms: tuple[Optional[int], Optional[int]],
              capturing: bool, prerecord: bool) -> "Lowered":
        """The call's lowered plans, with the flags the lean-handshake state allows."""
        out_sym = syms[1]
        out_range = None if out_sym is None else (out_sym, out_sym + ops.spec.nbytes(request.output))
        # prerecorded graphs and gated calls replay after whatever came before: they never vouch or skip
        context = object() if prerecord or self._gate is not None else self._context(capturing)
        flags = self._lean.flags(spec, opts, context, out_range)
        key = (spec.name, request.key, opts.variant, opts.direction, opts.sync, opts.signal, opts.wait,
               syms[0], out_sym, flags)
        lowered = self._programs.get(key) or self._lower(key, spec, request, opts, flags, syms)
        self._lean.record(spec, context, out_range, lowered.done, flags)
        self.last_handshake = flags
        return lowered

    def _context(self, capturing: bool) -> object:
        """What must match between two calls for one to vouch for the other: eager, or the same capture.
        An engine that cannot name its capture gets a new context per call (never lean under capture)."""
        if not capturing:
            return None
        capture = self.engine.capture_id()
        return ("capture", capture) if capture is not None else object()

    def _stages(self, request: ops.Request, opts: Options) -> bool:
        """Whether the copy engines' plans of a call fit the staging area, counted as for private buffers (which
        need the most)."""
        _, need = request.build(opts.variant, opts.direction, Layout(None, None, self.staging), FULL,
                                self.options.engines)
        return need <= self.heap_start - self.staging

    def _lower(self, key: tuple, spec: ops.OpSpec, request: ops.Request, opts: Options, flags: Handshake,
               syms: tuple[Optional[int], Optional[int]]) -> "Lowered":
        """Build and lower the plans of a call (cached by ``key``: eager calls pay only a dict lookup)."""
        layout = Layout(*syms, self.staging)
        direction = opts.direction
        built, need = request.build(opts.variant, direction, layout, flags, self.options.engines)
        larger = f"create the communicator with a larger staging_bytes (>= {_align(need)})"
        if spec.reduces:  # the received chunks always go through staging, whatever the buffers
            what, hint = f"{spec.name} ({direction})", f"{larger}; reduce collectives receive every rank's chunk there"
        else:
            what, hint = f"{spec.name} with private buffers ({direction})", \
                f"allocate input/output with Communicator.empty() or {larger}"
        validate.check_capacity(what, need, self.heap_start - self.staging, hint)
        if len(self._programs) >= 4096:  # e.g. all_to_all_v with ever-new splits
            self._programs.clear()
        done = frozenset(c.peer for c in built[-1].post if isinstance(c, Wait) and c.phase in (DONE, DONE_ALT))
        waits = sorted({c.peer for plan in built for c in plan.commands() if isinstance(c, Wait)})
        programs = tuple(lower(plan, opts.sync, opts.signal, opts.wait) for plan in built)
        cached = self._programs[key] = Lowered(programs, done, f"rank(s) {', '.join(map(str, waits))}" if waits
                                               else "no rank", wait_words(programs))
        return cached

    def _submit(self, spec: ops.OpSpec, request: ops.Request, opts: Options, lowered: "Lowered",
                prerecord: bool) -> None:
        """Hand the call to the engine: now, as a recorded graph's replay, or (prelaunch) behind the gate."""
        programs = lowered.programs
        self._calls += 1
        # a sequence number per plan: an epoch wait of a call's second plan must not be met by its first's signals
        first, last = self._epoch + 1, self._epoch + len(programs)
        self._epoch = last
        label = (f"{spec.name} call #{self._calls} "
                 f"({opts.variant}/{opts.direction}/{opts.sync}/{opts.signal}/{opts.wait}, waiting on {lowered.waits})")
        self.last_options = dataclasses.replace(opts, prerecord=prerecord) if opts.prerecord != prerecord else opts
        if not any(p.steps for p in programs):  # nothing to move with anyone (an all-zero split, say): nothing is
            self.engine.begin_call(label)  # recorded or launched (the epoch moved on above, as on every rank);
            return  # a timeout the watchdog saw since the last call is raised all the same
        bases = self.engine.bases(request.input, request.output)
        native = opts.submit == "native"

        def work() -> None:
            self.engine.begin_call(label)  # raises a timeout the watchdog saw since the last call
            try:
                for i, program in enumerate(programs):
                    if native:
                        self.engine.run_native(program, bases, first + i)
                    else:
                        run(program, self.engine, bases, first + i)
            except Exception as e:
                self._raise_failed(label, e)
            self.engine.end_call(label, opts.sync, 1 if opts.sync == "reset" else last, lowered.words)

        try:
            if prerecord:  # keyed by address: only heap buffers are prerecorded (options.resolve), whose memory lives
                # as long as the communicator
                graph_key = (spec.name, request.key, opts.variant, opts.direction, opts.signal, opts.wait,
                             request.input.data_ptr(), request.output.data_ptr())
                self.engine.submit(lambda: self.engine.replay_recorded(graph_key, work, label, opts.sync,
                                                                       lowered.words))
            else:
                self.engine.submit(work)  # now, or (host emulator, prelaunch) once the gate opens
        except Exception as e:
            self._raise_failed(label, e)

    def _raise_failed(self, label: str, error: Exception) -> NoReturn:
        """Raise what a call that failed on the way to the engine raises (``_failed``), from ``error``."""
        failure = self._failed(label, error)
        if failure is error:
            raise error
        raise failure from error

    def _failed(self, label: str, error: Exception) -> Exception:
        """What a call that failed on the way to the engine raises, and the error every later call raises: the
        library's own as it is; a driver's refusal or a device error (torch's AcceleratorError from a stream, event or
        graph call: a sticky CUDA error) as one ``DmaCollDeviceError`` naming the call."""
        if isinstance(error, DmaCollError) and type(error) is not DmaCollError:
            failure: Exception = error  # a timeout, an invalid argument, a device error already named
        elif isinstance(error, RuntimeError):
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            failure = DmaCollDeviceError(f"rank {self.rank}: {label} failed: {first}")
        else:
            return error  # not the device's: a bug, raised as it is
        if self.error is None:
            self.error = failure  # type: ignore[assignment]
        return failure

    @contextlib.contextmanager
    def prelaunch(self) -> Iterator["Gate"]:
        """Prepare the collectives called inside the block now and hold them behind a gate:
        they start when ``gate.release(stream)`` executes on ``stream`` (e.g. right after the
        kernel producing their input, with no CPU on the path). ``gate.wait(stream)`` makes
        ``stream`` wait for them; call it before using their outputs or the communicator again.

        On CUDA the commands go onto a gate stream behind a ``cuStreamWaitValue32`` on a gate
        flag, and release is one ``cuStreamWriteValue32``; both are graph-capturable.

        Lazy module loading (CUDA's default): a kernel launched for the first time in the
        process while a gate is pending can block in the driver until the GPU is idle, which
        it never is before the release: a deadlock that no timeout can break (seen on H200,
        driver 580). Launch the producer's kernels once before opening a gate, or set
        CUDA_MODULE_LOADING=EAGER; a warning says so once per process. reduce_scatter and
        all_reduce launch a sum kernel themselves: call them once (same dtype) before gating; the
        same for a first wait='spin' or 'fold' call (it loads dmacoll's kernels). Calls in the block are not
        prerecorded (recording a graph synchronizes the device, which would wait for the gate)."""
        self._check_open("prelaunch")
        if self._gate is not None:
            raise InvalidArgument("a prelaunch gate is already open or pending; call gate.wait() first")
        _warn_lazy_loading(self.backend)
        gate = Gate(self, self._gates_used % GATES)
        self._gates_used += 1
        self._gate = gate
        self.engine.gate_open(gate.slot)
        try:
            yield gate
        finally:
            self.engine.gate_close(gate.slot)
            gate.closed = True

    def close(self) -> None:
        """Free the communicator's memory and queues and let go of the process group; a second close does nothing,
        any other use raises."""
        if not self.closed:
            self.closed = True
            self.engine.close()
            # no reference left to the group: dist.destroy_process_group() then ends it (gloo's threads joined)
            # before the interpreter exits; kept alive, a gloo thread could release its last work during the
            # interpreter's finalization and abort the process ("terminate called without an active exception")
            self.group = self.engine.group = None

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_NO_NCCL = ("{what} hands calls to torch.distributed on the communicator's process group, which does not run NCCL "
            "here (backend={backend!r}, or a group of another torch backend); use path='dma'")


def _agreed_backend(requested: str, group, world: int) -> str:
    """``requested`` resolved on every rank, and the same everywhere: a rank that cannot run it, or that resolves
    'auto' to another backend (a rank without a GPU beside ranks with one), fails every rank with the reason
    instead of leaving the others waiting in the engine's set-up."""
    error: Optional[DmaCollError] = None
    try:
        mine = backends.resolve(requested)
    except DmaCollError as e:
        mine, error = None, e
    every: list = [None] * world
    dist.all_gather_object(every, (mine, None if error is None else str(error)), group=group)
    if error is not None:
        raise error
    failed = [f"rank {r}: {why}" for r, (_, why) in enumerate(every) if why]
    if failed:
        raise BackendUnavailable(f"backend={requested!r} cannot run on every rank: " + "; ".join(failed))
    chosen = [name for name, _ in every]
    if len(set(chosen)) > 1:
        raise InvalidArgument(f"backend={requested!r} resolved to different backends on the ranks ({chosen}): "
                              "every rank of a communicator must run the same backend on the same kind of device")
    return mine


def _matrix(spec: ops.OpSpec, request: ops.Request) -> Optional[tuple]:
    """all_to_all_v's bytes from rank i to rank j (its request's key), else None."""
    return request.key[0] if spec.name == "all_to_all_v" else None


def _moved_keywords(keywords: dict) -> str:
    """The error for constructor keywords that are not the communicator's (options moved into ``Options``)."""
    names = {f.name for f in dataclasses.fields(Options)}
    unknown = sorted(set(keywords) - names)
    if unknown:
        return f"Communicator() got an unexpected keyword argument {unknown[0]!r}"
    given = ", ".join(f"{name}={value!r}" for name, value in keywords.items())
    return f"Communicator({given}): options are passed as Communicator(options=Options({given}))"


def _warn_lazy_loading(backend: str) -> None:
    if backend == "cuda" and os.environ.get("CUDA_MODULE_LOADING", "LAZY") != "EAGER":
        warnings.warn("dmacoll prelaunch: CUDA lazy module loading is on; launch every kernel the producer uses "
                      "once before opening a gate (or set CUDA_MODULE_LOADING=EAGER), else a first launch while "
                      "the gate is pending can deadlock the process (see Communicator.prelaunch)", stacklevel=3)


class Gate:
    """A prelaunched group of collectives (see Communicator.prelaunch)."""

    def __init__(self, comm: Communicator, slot: int):
        self.comm, self.slot = comm, slot
        self.closed = False
        self.released = False

    def release(self, stream: Optional[torch.cuda.Stream] = None) -> None:
        """Open the gate from ``stream`` (default: the current one) once its prior work is done."""
        if not self.closed:
            raise InvalidArgument("release the gate after the `with comm.prelaunch()` block")
        if self.released:
            raise InvalidArgument("this gate was already released")
        self.released = True
        self.comm.engine.gate_release(self.slot, stream)

    def wait(self, stream: Optional[torch.cuda.Stream] = None) -> None:
        """Make ``stream`` (default: the current one) wait for the gated collectives."""
        if self.comm._gate is not self:
            raise InvalidArgument("this gate was already waited for")
        self.comm._gate = None
        try:
            self.comm.engine.gate_wait(self.slot, stream)
        except DmaCollError as e:
            self.comm.error = e
            raise
