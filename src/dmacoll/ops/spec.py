"""What a collective is, once: the ``OpSpec`` every part of dmacoll asks instead of switching on op names.

Modelled on nccl-tests, where each ``src/<collective>.cu`` holds one small description (counts, in-place
offsets, the expected output, the bus-bandwidth factor, the call into the library) and the common code does the
rest. An ``OpSpec`` says, for one collective:

* sizes: the elements of a rank's input and output for a chunk size (``numels``), nccl-tests' *size* and bus
  factor (``total_bytes``, ``bus_factor``);
* the user call: ``bind`` checks a call's tensors (before any device work) and returns a ``Request`` holding
  the plan builder the communicator runs;
* verification: the exact expected output from every rank's input (``reference``), how an in-place call lays
  its tensors out (``in_place_views``), and the same collective through ``torch.distributed``
  (``torch_call``: NCCL on GPUs, gloo on the CPU), the baseline every benchmark runs;
* which dtypes it accepts (``accepts``: sums take ``REDUCE_DTYPES`` only).

Sizes follow nccl-tests: ``bytes_per_rank`` is one rank's input; a *chunk* is the part of it that goes to one
peer (all-to-all, reduce-scatter) or all of it (all-gather, all-reduce).
"""
from __future__ import annotations

import inspect
from typing import Callable, NamedTuple, Optional, Sequence

import torch

from .. import validate
from ..errors import InvalidArgument
from ..plan import Exchange, Handshake, Layout, Plan, Scratch, build_plan, staging_bytes

# Summed by torch.sum (CPU or GPU kernel): float16/bfloat16 accumulate in float32 and round once.
REDUCE_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64)
Counts = Optional[Sequence[Sequence[int]]]  # all_to_all_v's matrix: counts[i][j] elements from rank i to rank j
# (variant, direction, layout, handshake, engines) -> (plans run one after the other, staging bytes they need)
PlanBuilder = Callable[[str, str, Layout, Handshake, int], tuple[tuple[Plan, ...], int]]


class Group(NamedTuple):
    """What a spec needs to know of the calling rank."""

    world: int
    rank: int
    device: torch.device


class Request(NamedTuple):
    """One checked call: its tensors, what its plans depend on, and how to build them (only on a cache miss: the
    key is all a cached call needs)."""

    output: torch.Tensor
    input: torch.Tensor
    key: tuple          # with the options and buffer offsets: the plan cache's key
    nbytes: int         # the size a tuning table is looked up by: the same on every rank
    in_place: bool
    build: PlanBuilder


def exchange_plans(exchange: Callable[[], Exchange], rank: int) -> PlanBuilder:
    """The builder of a collective that is one exchange (the only kind the lean handshake applies to); the exchange
    is made only when plans are built."""
    def build(variant: str, direction: str, layout: Layout, handshake: Handshake, engines: int):
        ex = exchange()
        return ((build_plan(ex, rank, variant, direction, layout, engines, handshake),),
                staging_bytes(ex, rank, direction, layout))
    return build


def scratch_plans(build: Callable[[str, str, Layout, int], tuple[tuple[Plan, ...], Scratch]]) -> PlanBuilder:
    """The builder of a reduce collective: its scratch (received chunks, etc.) is its staging need."""
    def wrapped(variant: str, direction: str, layout: Layout, handshake: Handshake, engines: int):
        if handshake.ready_implied:
            raise ValueError("reduce collectives always run the full handshake")
        plans, scratch = build(variant, direction, layout, engines)
        return plans, scratch.end - layout.staging
    return wrapped


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def byte_view(t: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view: data movement by torch.distributed for every dtype (NCCL has no bool)."""
    return t.reshape(-1).view(torch.uint8)


class OpSpec:
    """One collective. Subclasses set the class attributes and fill in the methods marked so."""

    name: str                     # the Communicator method, the CLI and CSV name
    reduces: bool = False         # an elementwise sum: REDUCE_DTYPES only, never the lean handshake
    in_place: str = ""            # how an in-place call is formed ('' = it has none)
    params: tuple[str, ...] = ("output", "input")  # the Communicator method's tensors and arguments, in order

    # -- sizes -------------------------------------------------------------------------------------------
    def chunks(self, world: int) -> tuple[int, int]:
        """(chunks in a rank's input, chunks in its output) for equal-split calls: to fill in."""
        raise NotImplementedError

    def numels(self, chunk: int, world: int, rank: int, counts: Counts = None) -> tuple[int, int]:
        """Elements of ``rank``'s input and output for chunks of ``chunk`` elements."""
        n_in, n_out = self.chunks(world)
        return n_in * chunk, n_out * chunk

    def result_numel(self, world: int, rank: int, input: torch.Tensor, *extra) -> tuple[int, int]:
        """(elements of ``rank``'s output, elements every rank reserves for it) of a call whose output the
        communicator provides (``Communicator.result``): the reserve is the same on every rank, so the ranks'
        symmetric allocations agree. Equal splits: the output is the input scaled by the op's chunks."""
        n_in, n_out = self.chunks(world)
        n = input.numel() * n_out // n_in
        return n, n

    def counts(self, chunk: int, world: int, seed: Optional[int] = None) -> Counts:
        """The split matrix of a call with chunks of ``chunk`` elements (None: equal splits)."""
        return None

    def total_bytes(self, bytes_per_rank: int, world: int) -> int:
        """nccl-tests' *size* (all-gather: the output; the others: the input): algbw = total / time."""
        return bytes_per_rank

    def bus_factor(self, world: int) -> float:
        """nccl-tests' busbw / algbw."""
        return (world - 1) / world

    def bus_bytes(self, bytes_per_rank: int, world: int) -> float:
        """Bytes one rank sends to its peers per call (ring algorithms: the bus bytes)."""
        return self.total_bytes(bytes_per_rank, world) * self.bus_factor(world)

    def peer_bytes(self, bytes_per_rank: int, world: int) -> int:
        """What one rank sends one peer: the size of one copy, the NVLink floor of a call."""
        return int(self.bus_bytes(bytes_per_rank, world) // max(1, world - 1))

    @property
    def tuning_op(self) -> str:
        """Whose tuning-table rows choose this op's variant (a sweep measures the op itself by default)."""
        return self.name

    def accepts(self, dtype: torch.dtype) -> bool:
        return not self.reduces or dtype in REDUCE_DTYPES

    # -- the user call -----------------------------------------------------------------------------------
    def bind(self, group: Group, output: torch.Tensor, input: Optional[torch.Tensor], *extra) -> Request:
        """Check a call (InvalidArgument before any device work) and say how to plan it: to fill in."""
        raise NotImplementedError

    def check_dtype(self, t: torch.Tensor) -> None:
        if not self.accepts(t.dtype):
            names = ", ".join(dtype_name(d) for d in REDUCE_DTYPES)
            raise InvalidArgument(f"{self.name} does not sum {t.dtype}; supported dtypes: {names}; cast the "
                                  "tensors first (e.g. bool/int8/uint8 to torch.int32)")

    def check_pair(self, group: Group, output: torch.Tensor, input: Optional[torch.Tensor]) -> torch.Tensor:
        """Both tensors on the communicator's device, contiguous, of one dtype that this op accepts."""
        if input is None:
            raise InvalidArgument(f"{self.name} needs an input tensor: {self.name}(output, input)")
        validate.check_pair(output, input, group.device)
        self.check_dtype(input)
        return input

    # -- verification ------------------------------------------------------------------------------------
    def reference(self, inputs: Sequence[torch.Tensor], rank: int, counts: Counts = None) -> torch.Tensor:
        """``rank``'s exact output from every rank's input (flat tensors; sums in the inputs' dtype, so pass
        float64 / int64 inputs for an exact sum): to fill in."""
        raise NotImplementedError

    def in_place_views(self, output: torch.Tensor, input: torch.Tensor, rank: int) -> tuple[torch.Tensor,
                                                                                            torch.Tensor]:
        """(output, input) of an in-place call, made from buffers of the out-of-place sizes."""
        raise InvalidArgument(f"{self.name} has no in-place form")

    def torch_call(self, output: torch.Tensor, input: torch.Tensor, group=None, counts: Counts = None) -> None:
        """The same collective through torch.distributed, enqueued on the current stream: to fill in."""
        raise NotImplementedError

    # -- documentation -------------------------------------------------------------------------------------
    def signature(self) -> inspect.Signature:
        """The Communicator method's signature: ``params`` (``name=None``: optional), then the options."""
        P = inspect.Parameter
        params = [P("self", P.POSITIONAL_OR_KEYWORD)]
        for p in self.params:
            name, optional, _ = p.partition("=None")
            params.append(P(name, P.POSITIONAL_OR_KEYWORD, default=None if optional else P.empty))
        return inspect.Signature([*params, P("options", P.VAR_KEYWORD)])

    def __repr__(self) -> str:
        return f"<OpSpec {self.name}>"
