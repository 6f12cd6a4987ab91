"""The user object: collectives on DMA engines for one ``torch.distributed`` group.

Memory of a communicator (the same layout on every rank, so offsets are shared)::

    [ flag words | staging area | heap for Communicator.empty() ]

Tensors from ``empty()`` are addressable by peers (zero-copy); other tensors
are staged through the staging area when the protocol needs peer access
(push into a private output, pull from a private input).
"""
from __future__ import annotations

import contextlib
import os
import warnings
from typing import Callable, Iterator, Optional, Sequence

import torch
import torch.distributed as dist

from . import tuning, validate
from .backends import make_engine, resolve
from .errors import DmaCollError, InvalidArgument
from .executor import GATES, SIGNAL_MODES, SYNC_MODES, Program, flag_words, lower, run
from .plan import DIRECTIONS, DONE, DONE_ALT, FULL, VARIANTS, Exchange, Handshake, Layout, Plan, Scratch, Wait, \
    all_gather_exchange, all_reduce_one_shot_plans, all_reduce_plans, all_to_all_exchange, build_plan, \
    chunk_elements, one_shot_all_reduce, reduce_scatter_plans, staging_bytes

ALIGN = 512
REDUCE_OPS = ("reduce_scatter", "all_reduce")
# (variant, direction, layout, handshake) -> (plans run one after the other, staging bytes they need)
PlanBuilder = Callable[[str, str, Layout, Handshake], tuple[tuple[Plan, ...], int]]
HANDSHAKES = ("full", "lean")
DEFAULT_TIMEOUT_S = float(os.environ.get("DMACOLL_TIMEOUT_S", "120"))


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class Communicator:
    """DMA collectives for the ranks of ``group`` (default: the world group).

    ``variant``: ``pcpy`` (one queue per peer), ``b2b`` (all copies on one queue),
    ``multi`` (one handshake, copies split over ``engines`` queues) or ``auto``;
    ``direction``: ``push`` (write into peers), ``pull`` (read from peers) or ``auto``.
    ``auto`` takes the fastest measured choice for the call's (op, size, graph/eager, in place)
    from a tuning table (``tuning_table`` or $DMACOLL_TUNING, else a shipped one measured on
    this platform; without one: pcpy/push);
    ``sync``: ``reset`` (graph-safe) or ``epoch`` (eager-only sequence numbers);
    ``signal``: how a flag reaches a peer, ``memop`` (cuStreamWriteValue32), ``copy``
    (a 4-byte copy-engine copy queued behind the data) or ``kernel`` (one-thread flag
    kernels; the only option that uses an SM, briefly); the last two need sync='reset';
    ``prerecord``: eager calls replay a CUDA graph recorded on first use per (op, size,
    buffers, variant): one launch instead of a command per step (cuda; sync='reset');
    ``submit``: ``python`` (a driver call from Python per step) or ``native`` (the call's
    driver commands worked out once, then issued by one call into the C library that
    ``dmacoll build`` compiles; cuda, signal memop or copy);
    ``handshake``: ``full`` (every call: READY then DONE, two flag crossings) or ``lean``, a
    promise by the caller, on every rank: *this call's output does not overlap the previous
    call's, and the output of a call is read only before the next collective call of this
    communicator is issued* (stream order), e.g. back-to-back calls into two alternating buffers,
    each read before the next call. Then a push all-gather / all-to-all(-v) into a symmetric
    output, following such a call in the same context (both eager, or both in one graph capture;
    not prerecorded, not gated), skips the READY handshake with every peer it exchanged DONE
    with in that call: the peer signalled that DONE after issuing the previous call, hence after
    reading the output before it, the buffer this call writes. One flag crossing per call
    instead of two. Other calls run the full handshake; an output that overlaps the previous
    one raises (the decision must not depend on one rank's buffer sizes, or ranks would disagree).
    Each may be overridden per call. Calls enqueue work on the current stream and
    never block the host; they can be captured in a CUDA graph (sync='reset').
    """

    def __init__(self, group: Optional[dist.ProcessGroup] = None, *, backend: str = "auto",
                 heap_bytes: int = 64 << 20, staging_bytes: int = 16 << 20, variant: str = "auto",
                 direction: str = "auto", sync: str = "reset", timeout_s: float = DEFAULT_TIMEOUT_S,
                 engines: int = 2, signal: str = "memop", prerecord: bool = False, submit: str = "python",
                 handshake: str = "full", tuning_table: Optional[str] = None,
                 device: Optional[torch.device] = None):
        if not dist.is_initialized():
            raise InvalidArgument("torch.distributed is not initialised; call dist.init_process_group first")
        self.group = group if group is not None else dist.group.WORLD
        self.rank = dist.get_rank(self.group)
        self.world = dist.get_world_size(self.group)
        validate.check_world(self.world)
        self.variant, self.direction, self.sync, self.signal = self._options(variant, direction, sync, signal)
        if timeout_s <= 0:
            raise InvalidArgument(f"timeout_s must be > 0, got {timeout_s}")
        if not 1 <= engines <= 16:
            raise InvalidArgument(f"engines must be between 1 and 16, got {engines}")
        self.engines = engines
        self.prerecord = prerecord
        self.handshake = self._handshake(handshake)
        self.backend = resolve(backend)
        self.submit = self._submit(submit, signal)
        self.staging = _align(flag_words(self.world) * 4)
        self.heap_start = self.staging + _align(staging_bytes)
        total = self.heap_start + _align(heap_bytes)
        self.engine = make_engine(self.backend, self.group, total, flag_words(self.world), timeout_s, device)
        self.device = self.engine.device
        name = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu"
        self.tuning = tuning.find(self.world, name, tuning_table or os.environ.get("DMACOLL_TUNING"))
        self._next = self.heap_start
        self._total = total
        self._epoch = 0
        self._calls = 0
        self._programs: dict[tuple, tuple[tuple[Program, ...], frozenset]] = {}
        # handshake='lean': (context, output start, output end, peers we waited DONE from, DONE phase) of the
        # previous call, when it was an exchange into a symmetric output (else None)
        self._previous: Optional[tuple[object, int, int, frozenset, int]] = None
        self.last_handshake: Handshake = FULL  # the flags the last call used (for tests and logs)
        self.error: Optional[DmaCollError] = None  # set by a failed call; every later call raises it
        self._gate: Optional[Gate] = None  # the open or pending prelaunch gate
        self._gates_used = 0

    # -- memory ----------------------------------------------------------------
    def empty(self, *shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """A tensor in the symmetric heap; peers read and write it directly.

        Collective: every rank must allocate the same sizes in the same order."""
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

    # -- collectives ---------------------------------------------------------
    def all_gather(self, output: torch.Tensor, input: torch.Tensor, **options: str) -> torch.Tensor:
        """``output`` = concatenation of every rank's ``input``; in place when
        ``input`` is this rank's slice of ``output``."""
        validate.check_all_gather(output, input, self.world, self.device)
        nbytes = input.numel() * input.element_size()
        in_place = input.data_ptr() == output.data_ptr() + self.rank * nbytes and nbytes > 0
        return self._run("all_gather", ("all_gather", nbytes, in_place), in_place, output, input, options,
                         self._exchange(lambda: all_gather_exchange(self.world, nbytes, in_place)))

    def all_to_all(self, output: torch.Tensor, input: torch.Tensor, **options: str) -> torch.Tensor:
        """Equal split: chunk p of ``input`` goes to rank p, chunk p of ``output`` comes from rank p."""
        validate.check_all_to_all(output, input, self.world, self.device)
        chunk = input.numel() // self.world * input.element_size()
        return self._run("all_to_all", ("all_to_all", chunk), False, output, input, options,
                         self._exchange(lambda: all_to_all_exchange([[chunk] * self.world for _ in range(self.world)])))

    def all_to_all_v(self, output: torch.Tensor, input: torch.Tensor, send_counts: Sequence[Sequence[int]],
                     **options: str) -> torch.Tensor:
        """``send_counts[i][j]``: elements rank i sends to rank j (the same matrix on every rank).
        Rank r's input holds its chunks for ranks 0..n-1 in order; its output the chunks
        from ranks 0..n-1 in order."""
        counts = validate.split_matrix(send_counts, self.world)
        validate.check_all_to_all_v(output, input, counts, self.rank, self.device)
        size = input.element_size()
        matrix = tuple(tuple(c * size for c in row) for row in counts)
        return self._run("all_to_all_v", ("all_to_all_v", matrix), False, output, input, options,
                         self._exchange(lambda: all_to_all_exchange([list(row) for row in matrix])))

    def reduce_scatter(self, output: torch.Tensor, input: torch.Tensor, **options: str) -> torch.Tensor:
        """``output`` (n elements) = the elementwise sum over ranks of chunk ``rank`` of their ``input``
        (world x n elements), like ``torch.distributed.reduce_scatter_tensor`` with SUM.

        The peers' chunks move on copy engines into a staging block of this rank (one slot per peer);
        after the DONE waits a small kernel on the caller's stream adds them to the own chunk, read in place.
        ``output`` may be (part of) ``input``. Dtypes: float32, float64, float16, bfloat16 (summed in
        float32, rounded once), int32, int64. Staging: world x n elements (plus the input for pull
        from a private input)."""
        self._check_reduce("reduce_scatter")
        validate.check_reduce_scatter(output, input, self.world, self.device)
        nbytes, dtype = output.numel() * output.element_size(), _dtype_name(output.dtype)
        return self._run("reduce_scatter", ("reduce_scatter", nbytes, dtype), False, output, input, options,
                         lambda v, d, layout, _: _with_scratch(reduce_scatter_plans(
                             self.world, nbytes, self.rank, dtype, v, d, layout, self.engines), layout))

    def all_reduce(self, tensor: torch.Tensor, input: Optional[torch.Tensor] = None,
                   **options: str) -> torch.Tensor:
        """Elementwise sum over ranks. In place by default (``tensor`` holds this rank's values and
        receives the sum, like ``torch.distributed.all_reduce``); with ``input``, ``tensor`` is the output.

        Small (``plan.one_shot_all_reduce``: up to 512 KiB, at two ranks 2 MiB): one exchange of whole
        tensors, then a local sum (fewest handshakes). Larger: a reduce-scatter then an all-gather of the
        summed chunks, two exchanges run back to back (least traffic). Chunks are
        ``torch.tensor_split(tensor.view(-1), world)``'s: uneven when the size is not divisible by the world
        (the first ``numel % world`` ranks sum one element more), no padding.
        Dtypes as for ``reduce_scatter``. Staging: about the tensor's size (plus the input for pull
        from a private input, plus a chunk for a private output; twice the tensor for the one exchange)."""
        self._check_reduce("all_reduce")
        input = tensor if input is None else input
        validate.check_all_reduce(tensor, input, self.device)
        size, dtype = input.element_size(), _dtype_name(input.dtype)
        chunks = tuple(n * size for n in chunk_elements(input.numel(), self.world))
        in_place = input.data_ptr() == tensor.data_ptr() and input.numel() > 0
        nbytes = sum(chunks)
        one_shot = one_shot_all_reduce(nbytes, self.world)

        def plans(v: str, d: str, layout: Layout, _: Handshake):
            built = (all_reduce_one_shot_plans(nbytes, self.world, self.rank, dtype, v, d, layout, self.engines)
                     if one_shot else all_reduce_plans(chunks, self.rank, dtype, v, d, layout, self.engines))
            return _with_scratch(built, layout)
        return self._run("all_reduce", ("all_reduce", nbytes, dtype), in_place, tensor, input, options, plans)

    # -- machinery -------------------------------------------------------------
    def _options(self, variant: str, direction: str, sync: str, signal: str) -> tuple[str, str, str, str]:
        for name, value, allowed in (("variant", variant, VARIANTS + ("auto",)),
                                     ("direction", direction, DIRECTIONS + ("auto",)), ("sync", sync, SYNC_MODES),
                                     ("signal", signal, SIGNAL_MODES)):
            if value not in allowed:
                raise InvalidArgument(f"{name}={value!r} is not one of {allowed}")
        if signal != "memop" and sync == "epoch":
            raise InvalidArgument(f"signal={signal!r} sends a constant 1: it needs sync='reset'")
        return variant, direction, sync, signal

    def _exchange(self, exchange: Callable[[], Exchange]) -> PlanBuilder:
        """The builder for a collective that is one exchange."""
        def plans(variant: str, direction: str, layout: Layout, handshake: Handshake) -> tuple[tuple[Plan, ...], int]:
            ex = exchange()
            return ((build_plan(ex, self.rank, variant, direction, layout, self.engines, handshake),),
                    staging_bytes(ex, self.rank, direction, layout))
        return plans

    def _check_reduce(self, op: str) -> None:
        if not hasattr(self.engine, "reduce"):
            raise InvalidArgument(f"{op} is not available on the {self.backend} backend yet (its engine has no "
                                  "reduce step); use backend='cuda' or backend='host'")

    @staticmethod
    def _handshake(handshake: str) -> str:
        if handshake not in HANDSHAKES:
            raise InvalidArgument(f"handshake={handshake!r} is not one of {HANDSHAKES}")
        return handshake

    def _flags(self, op: str, direction: str, handshake: str, context: object,
               output: Optional[tuple[int, int]]) -> Handshake:
        """The flags of this call: READY skipped with the peers the previous call vouches for
        (handshake='lean', see the class docstring), DONE alternating along such runs. Every
        condition is the same on every rank (buffer kinds and call options must be), so the ranks
        of a pair always agree."""
        prev = self._previous
        if (handshake != "lean" or op in REDUCE_OPS or direction != "push" or output is None or prev is None
                or prev[0] != context):
            return FULL
        _, prev_start, prev_end, done_peers, prev_done = prev
        if output[0] < prev_end and prev_start < output[1]:
            raise InvalidArgument(f"{op} with handshake='lean': the output (heap bytes {output[0]}..{output[1]}) "
                                  f"overlaps the previous call's ({prev_start}..{prev_end}); alternate between two "
                                  "output buffers or pass handshake='full' for this call")
        return Handshake(done_peers, DONE_ALT if prev_done == DONE else DONE)

    def _context(self, capturing: bool) -> object:
        """What must match between two calls for one to vouch for the other: eager, or the same capture.
        An engine that cannot name its capture gets a new context per call (never lean under capture)."""
        if not capturing:
            return None
        capture_id = getattr(self.engine, "capture_id", None)
        return ("capture", capture_id()) if capture_id is not None else object()

    def _submit(self, submit: str, signal: str) -> str:
        if submit not in ("python", "native"):
            raise InvalidArgument(f"submit={submit!r} is not one of ('python', 'native')")
        if submit == "native" and self.backend != "cuda":
            raise InvalidArgument(f"submit='native' issues CUDA driver calls: it needs backend='cuda', not "
                                  f"{self.backend!r}")
        if submit == "native" and signal == "kernel":
            raise InvalidArgument("submit='native' issues driver calls only: use signal='memop' or 'copy'")
        return submit

    def _run(self, op: str, key: tuple, in_place: bool, output: torch.Tensor, input: torch.Tensor, options: dict,
             plans: PlanBuilder) -> torch.Tensor:
        if options:
            unknown = set(options) - {"variant", "direction", "sync", "signal", "prerecord", "submit", "handshake"}
            if unknown:
                raise InvalidArgument(f"unknown option(s) {sorted(unknown)}; use variant=, direction=, sync=, "
                                      "signal=, prerecord=, submit=, handshake=")
        variant, direction, sync, signal = self._options(
            options.get("variant", self.variant), options.get("direction", self.direction),
            options.get("sync", self.sync), options.get("signal", self.signal))
        native = self._submit(options.get("submit", self.submit), signal) == "native"
        if native:
            self.engine.ensure_native()  # a missing library is an error of this call, not of the communicator
        handshake = self._handshake(options.get("handshake", self.handshake))
        if signal == "kernel" and self.backend == "hip":
            raise InvalidArgument("signal='kernel' uses PyTorch's CUDA signal pads; on backend='hip' use signal='memop' "
                                  "or 'copy'")
        gpu = self.backend in ("cuda", "hip")  # torch.cuda is HIP on ROCm builds: graphs work the same way
        capturing = gpu and torch.cuda.is_current_stream_capturing()
        if sync == "epoch" and capturing:
            raise InvalidArgument("sync='epoch' bakes sequence numbers into a CUDA graph, whose replays would "
                                  "then deadlock; capture with sync='reset'")
        prerecord = options.get("prerecord", self.prerecord) and gpu and not capturing
        if prerecord and sync != "reset":
            raise InvalidArgument("prerecord=True replays a CUDA graph: it needs sync='reset'")
        if self.error is not None:
            raise DmaCollError(f"this communicator is unusable after an earlier error ({self.error}); "
                               "create a new one")
        if self._gate is not None and self._gate.closed:
            raise InvalidArgument(f"{op}: a prelaunched collective is still pending; call gate.wait() first "
                                  "(collectives of one communicator run one after another)")
        if "auto" in (variant, direction):
            picked = self.tuning.select(op, input.numel() * input.element_size(), "graph" if capturing else "eager",
                                        in_place, signal) if self.tuning else tuning.FALLBACK
            variant = picked[0] if variant == "auto" else variant
            direction = picked[1] if direction == "auto" else direction
        output_sym = self.engine.sym_offset(output)
        output_range = None if output_sym is None else (output_sym, output_sym + output.numel() * output.element_size())
        # prerecorded graphs and gated calls replay after whatever came before: they never vouch or skip
        context = object() if prerecord or self._gate is not None else self._context(capturing)
        flags = self._flags(op, direction, handshake, context, output_range)
        programs, done_peers = self._programs_for(op, key, plans, variant, direction, sync, signal,
                                                  self.engine.sym_offset(input), output_sym, flags)
        exchange = op not in REDUCE_OPS and output_range is not None
        self._previous = (context, *output_range, done_peers, flags.done) if exchange else None
        self.last_handshake = flags
        self._calls += 1
        # a sequence number per plan: an epoch wait of a call's second plan must not be met by its first's signals
        first, last = self._epoch + 1, self._epoch + len(programs)
        self._epoch = last
        label = f"{op} call #{self._calls} ({variant}/{direction}/{sync}/{signal})"
        self.last_choice = (variant, direction, sync)  # what 'auto' resolved to, for logs and tests
        bases = self.engine.bases(input, output)

        def work() -> None:
            self.engine.begin_call(label)  # raises a timeout the watchdog saw since the last call
            try:
                for i, program in enumerate(programs):
                    if native:
                        self.engine.run_native(program, bases, first + i)
                    else:
                        run(program, self.engine, bases, first + i)
            except DmaCollError as e:
                self.error = e
                raise
            self.engine.end_call(label, sync, 1 if sync == "reset" else last)

        if prerecord:
            graph_key = (key, variant, direction, signal, input.data_ptr(), output.data_ptr())
            self.engine.submit(lambda: self.engine.replay_recorded(graph_key, work, label, sync))
        else:
            self.engine.submit(work)  # now, or (host emulator, prelaunch) once the gate opens
        return output

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
        all_reduce launch a sum kernel themselves: call them once (same dtype) before gating."""
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

    def _programs_for(self, op: str, key: tuple, plans: PlanBuilder, variant: str, direction: str, sync: str,
                      signal: str, input_sym: Optional[int], output_sym: Optional[int],
                      flags: Handshake) -> tuple[tuple[Program, ...], frozenset]:
        """The lowered plans for a call and the peers its last plan waits DONE from, cached by a cheap
        key (eager calls pay only a dict lookup)."""
        ck = (key, variant, direction, sync, signal, input_sym, output_sym, flags)
        cached = self._programs.get(ck)
        if cached is None:
            layout = Layout(input_sym, output_sym, self.staging)
            built, need = plans(variant, direction, layout, flags)
            larger = f"create the communicator with a larger staging_bytes (>= {_align(need)})"
            if op in REDUCE_OPS:  # the received chunks always go through staging, whatever the buffers
                what, hint = f"{op} ({direction})", f"{larger}; reduce collectives receive every rank's chunk there"
            else:
                what, hint = f"{op} with private buffers ({direction})", \
                    f"allocate input/output with Communicator.empty() or {larger}"
            validate.check_capacity(what, need, self.heap_start - self.staging, hint)
            if len(self._programs) >= 4096:  # e.g. all_to_all_v with ever-new splits
                self._programs.clear()
            done = frozenset(c.peer for c in built[-1].post if isinstance(c, Wait) and c.phase in (DONE, DONE_ALT))
            cached = self._programs[ck] = (tuple(lower(plan, sync, signal) for plan in built), done)
        return cached

    def close(self) -> None:
        self.engine.close()

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _with_scratch(built: tuple[tuple[Plan, ...], Scratch], layout: Layout) -> tuple[tuple[Plan, ...], int]:
    plans, scratch = built
    return plans, scratch.end - layout.staging


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
