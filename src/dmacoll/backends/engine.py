"""The engine protocol: every member of a backend's engine that the communicator and the executor use.

An engine is one rank's side of a communicator on one backend: the symmetric heap, the queues, the driver
calls. ``cuda.CudaEngine`` and ``hip.HipEngine`` share their stream machinery (``stream_engine.StreamEngine``);
``host.HostEngine`` emulates it on the CPU. What a backend can run is its ``capabilities`` record
(``options.EngineCapabilities``), a class attribute read before an engine exists, so that a bad option fails
before any memory is allocated; an engine that learns more when it starts holds its own copy.
"""
from __future__ import annotations

from typing import Callable, ClassVar, Mapping, Optional, Protocol, Sequence, runtime_checkable

import torch

from ..executor import Folded, MemOp, Program
from ..options import EngineCapabilities
from ..plan import Copy, Reduce, Ref


@runtime_checkable
class Engine(Protocol):
    name: ClassVar[str]             # the backend: cuda, hip or host
    capabilities: EngineCapabilities  # what it can run (graphs, native submission, flag kernels, memop writes...)

    device: torch.device
    rank: int
    world: int
    heap: torch.Tensor              # this rank's symmetric memory: [flags | staging | Communicator.empty()]
    main_queue: object              # the caller's queue of the call being issued (a stream on GPUs)

    # -- the executor's primitives (see executor.py) -----------------------------------------------------
    def copy(self, queue: object, src: Ref, dst: Ref, nbytes: int, bases: Mapping[str, object]) -> None: ...

    def copies(self, queue: object, run: Sequence[Copy], bases: Mapping[str, object]) -> None:
        """Consecutive copies, in one command where the backend can."""

    def memops(self, queue: object, ops: Sequence[MemOp]) -> None:
        """Issue consecutive flag operations, in order, as one command where the backend can."""

    def reduce(self, queue: object, step: Reduce, bases: Mapping[str, object]) -> None:
        """Sum ``step.count`` slots into ``step.dst`` on ``queue``, after what is queued there."""

    def folded_reduce(self, queue: object, step: Folded, bases: Mapping[str, object]) -> None:
        """``step.reduce``, each slot added once its wait (``step.waits[i]``) is met; the waits re-arm their
        words in the reset mode (wait='fold')."""

    def parallel(self, tasks: Sequence[Callable[[object], None]]) -> None:
        """Run ``tasks[0]`` on the main queue and the others on side queues, joined back before returning."""

    # -- addresses -----------------------------------------------------------------------------------------
    def bases(self, input: torch.Tensor, output: torch.Tensor) -> Mapping[str, object]:
        """What a plan's "input" / "output" refs are relative to, for this call's tensors."""

    def sym_offset(self, t: torch.Tensor) -> Optional[int]:
        """Byte offset of ``t`` in the symmetric heap, or None for private memory."""

    # -- a call ----------------------------------------------------------------------------------------------
    def is_capturing(self) -> bool:
        """Whether the current stream is being captured into a graph."""

    def capture_id(self) -> Optional[int]:
        """The id of the capture the current stream is in (None: the engine cannot tell captures apart)."""

    def begin_call(self, label: str) -> None:
        """Raise an error seen since the last call (a timeout); set ``main_queue``."""

    def end_call(self, label: str, sync: str, value: int, words: tuple[int, ...] = ()) -> None:
        """Issue what is held back; track an eager call's end for timeouts (``words``: the flag words the call
        waits on, in issue order, from which a timeout names the peers that never signalled)."""

    def submit(self, work: Callable[[], None]) -> None:
        """Run ``work`` now, or hold it until a prelaunch gate opens."""

    def replay_recorded(self, key: tuple, work: Callable[[], None], label: str, sync: str,
                        words: tuple[int, ...] = ()) -> None:
        """prerecord=True: replay the graph recorded for ``key`` (recording ``work`` on first use); ``words`` as in
        ``end_call``."""

    def load_kernels(self) -> None:
        """Load the engine's own kernels now (wait='spin' / 'fold'), before a gate or a capture needs them."""

    def ensure_native(self) -> None:
        """Load the native submission library now (BackendUnavailable if it is not built)."""

    def run_native(self, program: Program, bases: Mapping[str, object], epoch: int) -> None: ...

    # -- prelaunch gates (Communicator.prelaunch) --------------------------------------------------------------
    def gate_open(self, slot: int) -> None: ...

    def gate_close(self, slot: int) -> None: ...

    def gate_release(self, slot: int, stream: object = None) -> None: ...

    def gate_wait(self, slot: int, stream: object = None) -> None: ...

    def close(self) -> None: ...
