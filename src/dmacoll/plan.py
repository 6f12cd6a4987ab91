"""The plan layer: a collective, seen from one rank, as per-queue command lists.

Every collective here is an *exchange*: rank r sends ``nbytes[r][p]`` bytes from
offset ``src[r][p]`` of its input to offset ``dst[r][p]`` of rank p's output.
A plan says, for one rank, which copies to issue on which queue and which flags
to signal and wait, so that every backend (CUDA streams, HIP streams, the host
emulator's threads) executes the same protocol.

Protocol, for every peer pair, two flags per call:

* ``push``: the receiver signals READY ("my output may be written"), the
  sender waits for READY, copies into the receiver's memory, signals DONE;
  the receiver waits for DONE.
* ``pull``: the owner of the data signals READY ("my input may be read"), the
  reader waits for READY, copies from the owner's memory into its own output,
  signals DONE ("finished reading"); the owner waits for DONE before its input
  may change again.

A push may drop the READY handshake with a peer when an earlier call already proves the
receiver's output free (``Handshake``, an argument of ``build_plan``; ``Communicator``'s
``handshake="lean"``): one flag crossing per call instead of two.

A plan has three phases: ``pre`` and ``post`` run on the caller's queue,
``queues`` run concurrently between them (the first on the caller's queue).

Whether a signal carries a sequence number or a reset-able 1 is the
executor's business (see ``dmacoll.executor``), so plans can be cached.

Reduce collectives (sum) are exchanges too: reduce-scatter is an all-to-all
of the peers' chunks into a symmetric scratch block (one slot per sending peer)
followed by a ``Reduce`` command in ``post``, after the DONE waits, that adds
our own chunk straight from the input (no device-local copy: on Hopper a local
copy waits for a concurrent GEMM, a peer copy does not; see ``results/
h200x2/c3/copy_contention``); all-reduce is that plan followed by
a second plan, an all-gather of the reduced chunks (see ``reduce_scatter_plans``
and ``all_reduce_plans``); small all-reduces (``one_shot_all_reduce``) are instead one
exchange of whole tensors and a local sum (``all_reduce_one_shot_plans``).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional, Sequence

VARIANTS = ("pcpy", "b2b", "multi")
SPLIT_MIN_BYTES = 1 << 20  # `multi` splits copies at least this large over its queues
SPLIT_ALIGN = 4096
DIRECTIONS = ("push", "pull")

# Flag phases: index of a flag on its owner = phase * world + rank that signals it.
# DONE_ALT: a second DONE word, used by every other call of a run without READY (see Handshake).
READY, DONE, DONE_ALT = 0, 1, 2
NUM_PHASES = 3


@dataclass(frozen=True)
class Ref:
    """A byte address: ``space`` is "input" or "output" (the caller's private
    tensors, only on the calling rank) or "sym" (the symmetric heap of ``rank``)."""

    space: str
    rank: int
    offset: int


@dataclass(frozen=True)
class Copy:
    src: Ref
    dst: Ref
    nbytes: int


@dataclass(frozen=True)
class Signal:
    """Set flag ``phase`` on rank ``peer`` (slot of the signalling rank)."""

    peer: int
    phase: int


@dataclass(frozen=True)
class Wait:
    """Wait until ``peer`` has signalled our flag ``phase``, then re-arm it."""

    peer: int
    phase: int


@dataclass(frozen=True)
class Reduce:
    """Elementwise sum of ``count`` slots of ``nbytes`` bytes, back to back from ``src``
    (a [count, n] block of ``dtype``), plus ``own`` (``nbytes`` more, if given), into ``dst``.
    Local: every ref is on the calling rank; backends run it on the caller's queue (small
    kernels on GPUs). ``dst`` may be ``own`` itself (an in-place all-reduce).

    ``senders`` (push plans): the peer whose DONE says slot i has arrived, so a backend may wait for each slot
    inside the sum (``wait='fold'``); None where this rank's own copies fill the slots (pull)."""

    src: Ref
    dst: Ref
    nbytes: int
    count: int
    dtype: str  # a torch dtype name, e.g. "bfloat16" (plans stay torch-free)
    own: Optional[Ref] = None
    senders: Optional[tuple[int, ...]] = None


Command = Copy | Signal | Wait | Reduce


@dataclass(frozen=True)
class Exchange:
    """Who sends what where, for all ranks: ``nbytes[r][p]`` bytes from input
    offset ``src[r][p]`` of rank r to output offset ``dst[r][p]`` of rank p."""

    nbytes: tuple[tuple[int, ...], ...]
    src: tuple[tuple[int, ...], ...]
    dst: tuple[tuple[int, ...], ...]
    in_place_self: bool = False  # the self chunk already sits in the output

    @property
    def world(self) -> int:
        return len(self.nbytes)

    def input_bytes(self, rank: int) -> int:
        return max((s + n for s, n in zip(self.src[rank], self.nbytes[rank])), default=0)

    def output_bytes(self, rank: int) -> int:
        return max((self.dst[r][rank] + self.nbytes[r][rank] for r in range(self.world)), default=0)


def all_gather_exchange(world: int, nbytes: int, in_place: bool = False) -> Exchange:
    return all_gather_v_exchange([nbytes] * world, in_place)


def all_gather_v_exchange(sizes: Sequence[int], in_place: bool = False) -> Exchange:
    """Rank r's ``sizes[r]`` bytes go to every rank's output at offset ``sum(sizes[:r])``."""
    world = len(sizes)
    n = tuple(tuple(sizes[r] for _ in range(world)) for r in range(world))
    src = tuple(tuple(0 for _ in range(world)) for _ in range(world))
    dst = tuple(tuple(sum(sizes[:r]) for _ in range(world)) for r in range(world))
    return Exchange(n, src, dst, in_place_self=in_place)


def all_to_all_exchange(send_bytes: list[list[int]]) -> Exchange:
    """``send_bytes[r][p]``: bytes rank r sends to rank p (the full matrix)."""
    world = len(send_bytes)
    n = tuple(tuple(int(x) for x in row) for row in send_bytes)
    src = tuple(tuple(sum(n[r][:p]) for p in range(world)) for r in range(world))
    dst = tuple(tuple(sum(n[q][p] for q in range(r)) for p in range(world)) for r in range(world))
    return Exchange(n, src, dst)


@dataclass(frozen=True)
class Layout:
    """Where the caller's tensors live. A symmetric offset means the tensor sits
    at that offset of every rank's heap (``Communicator.empty``), so peers can
    address it directly; ``None`` means private memory, staged through
    ``staging`` (a symmetric offset) when the protocol needs peer access."""

    input_sym: Optional[int] = None
    output_sym: Optional[int] = None
    staging: int = 0


@dataclass(frozen=True)
class Handshake:
    """The flags of one call's exchange. Default: READY then DONE with every peer.

    ``ready_implied`` (push only): peers whose READY is already known, so neither side signals or
    waits for it (``Communicator``'s ``handshake="lean"``); both ranks of a pair must agree. Without
    READY a peer may signal this call's DONE before we re-armed the previous call's DONE word, and
    a flag set twice is one signal lost: calls of such a run alternate ``done`` between DONE and
    DONE_ALT (a peer cannot get two calls ahead: its next call needs our DONE of this one)."""

    ready_implied: frozenset = frozenset()
    done: int = DONE


FULL = Handshake()


@dataclass(frozen=True)
class Plan:
    rank: int
    world: int
    pre: tuple[Command, ...]
    queues: tuple[tuple[Command, ...], ...]
    post: tuple[Command, ...]

    def commands(self) -> list[Command]:
        return [*self.pre, *(c for q in self.queues for c in q), *self.post]


def staging_bytes(ex: Exchange, rank: int, direction: str, layout: Layout) -> int:
    """Symmetric staging bytes this rank needs for a private buffer."""
    if direction == "push" and layout.output_sym is None:
        return ex.output_bytes(rank)
    if direction == "pull" and layout.input_sym is None:
        return ex.input_bytes(rank)
    return 0


def _out_ref(layout: Layout, rank: int, offset: int, staged: bool) -> Ref:
    if layout.output_sym is not None:
        return Ref("sym", rank, layout.output_sym + offset)
    if staged:
        return Ref("sym", rank, layout.staging + offset)
    return Ref("output", rank, offset)


def _in_ref(layout: Layout, rank: int, offset: int, staged: bool) -> Ref:
    if layout.input_sym is not None:
        return Ref("sym", rank, layout.input_sym + offset)
    if staged:
        return Ref("sym", rank, layout.staging + offset)
    return Ref("input", rank, offset)


def coalesce(copies: list[Copy]) -> list[Copy]:
    """Merge copies that continue each other in both source and destination."""
    merged: list[Copy] = []
    for c in sorted(copies, key=lambda c: (c.src.space, c.src.rank, c.dst.space, c.dst.rank, c.src.offset)):
        last = merged[-1] if merged else None
        if (
            last is not None
            and (last.src.space, last.src.rank, last.dst.space, last.dst.rank)
            == (c.src.space, c.src.rank, c.dst.space, c.dst.rank)
            and last.src.offset + last.nbytes == c.src.offset
            and last.dst.offset + last.nbytes == c.dst.offset
        ):
            merged[-1] = Copy(last.src, last.dst, last.nbytes + c.nbytes)
        else:
            merged.append(c)
    return merged


def split(c: Copy, pieces: int) -> list[Copy]:
    """``c`` cut into up to ``pieces`` aligned parts (none below SPLIT_MIN_BYTES / pieces)."""
    if pieces <= 1 or c.nbytes < SPLIT_MIN_BYTES:
        return [c]
    step = -(-c.nbytes // pieces // SPLIT_ALIGN) * SPLIT_ALIGN
    return [Copy(Ref(c.src.space, c.src.rank, c.src.offset + o), Ref(c.dst.space, c.dst.rank, c.dst.offset + o),
                 min(step, c.nbytes - o)) for o in range(0, c.nbytes, step)]


def build_plan(ex: Exchange, rank: int, variant: str = "pcpy", direction: str = "push",
               layout: Layout = Layout(), engines: int = 2, handshake: Handshake = FULL) -> Plan:
    """The commands ``rank`` issues for exchange ``ex``.

    Variants: ``pcpy`` the READYs, then a queue per peer that waits, copies and signals DONE; ``b2b`` every copy
    on one queue, signals batched; ``multi`` READY once for all on the caller's queue, then all copies (large
    ones split) spread over ``engines`` queues and DONE after them, or, when no copy is large enough to split,
    each copy on a queue of its own with its peer's DONE behind it. ``handshake``: see ``Handshake``."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose one of {VARIANTS}")
    if direction not in DIRECTIONS:
        raise ValueError(f"unknown direction {direction!r}; choose one of {DIRECTIONS}")
    world = ex.world
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} outside world of size {world}")
    push = direction == "push"
    if handshake.ready_implied and not push:
        raise ValueError("ready_implied applies to push only: a pull's READY says the input is written")
    if handshake.done not in (DONE, DONE_ALT):
        raise ValueError(f"handshake.done must be DONE or DONE_ALT, got {handshake.done}")
    done = handshake.done
    stage_out = push and layout.output_sym is None
    stage_in = (not push) and layout.input_sym is None
    peers = [(rank + i) % world for i in range(1, world)]  # ring order spreads load

    pre: list[Command] = []
    post: list[Command] = []
    if stage_in and any(ex.nbytes[rank][p] > 0 for p in peers):
        # pull from private input: peers read a staged copy of it (none where no peer reads from us)
        pre.append(Copy(Ref("input", rank, 0), Ref("sym", rank, layout.staging), ex.input_bytes(rank)))

    self_copies: list[Copy] = []
    if not ex.in_place_self and ex.nbytes[rank][rank] > 0:
        self_copies.append(Copy(_in_ref(layout, rank, ex.src[rank][rank], False),
                                _out_ref(layout, rank, ex.dst[rank][rank], False), ex.nbytes[rank][rank]))

    # peers we exchange data with: for push, those we send to or receive from
    talk = [p for p in peers if ex.nbytes[rank][p] > 0 or ex.nbytes[p][rank] > 0]
    peer_copies: dict[int, Copy] = {}
    for p in talk:
        if push and ex.nbytes[rank][p] > 0:
            peer_copies[p] = Copy(_in_ref(layout, rank, ex.src[rank][p], False),
                                  _out_ref(layout, p, ex.dst[rank][p], stage_out), ex.nbytes[rank][p])
        if not push and ex.nbytes[p][rank] > 0:
            if ex.in_place_self and layout.output_sym is not None:  # p's input is its own output slot
                src = Ref("sym", p, layout.output_sym + ex.dst[p][p] + ex.src[p][rank])
            else:
                src = _in_ref(layout, p, ex.src[p][rank], stage_in)
            peer_copies[p] = Copy(src,
                                  _out_ref(layout, rank, ex.dst[p][rank], False), ex.nbytes[p][rank])

    # READY goes to the peer that will act on it: push -> senders, pull -> readers.
    ready = [p for p in talk if p not in handshake.ready_implied]
    if variant == "pcpy":  # each peer's wait, copy and DONE on a queue of its own, side by side; every READY
        # goes out first, on the caller's queue: a queue then only waits for flags every peer sent before its own
        # queues began, so the call completes in whatever order the queues run (CUDA may run side streams and
        # graph branches one after another: four ranks on one H100 hung when each queue sent its own READY)
        pre += [Signal(p, READY) for p in ready]
        queues = [tuple(self_copies)]
        for p in talk:
            c = peer_copies.get(p)
            queues.append((*((Wait(p, READY),) if p in ready else ()), *((c,) if c else ()), Signal(p, done)))
    elif variant == "b2b":  # one queue, peer copies back to back, signals batched after them; the
        # local copy runs while the peers' DONE signals travel
        pre += [Signal(p, READY) for p in ready]
        queues = [(*(Wait(p, READY) for p in ready), *(peer_copies[p] for p in talk if p in peer_copies),
                   *(Signal(p, done) for p in talk), *self_copies)]
    else:  # multi: wait for every READY, fan the copies out, join, wait for every DONE
        pre += [*(Signal(p, READY) for p in ready), *(Wait(p, READY) for p in ready)]
        copies = [*(peer_copies[p] for p in talk if p in peer_copies), *self_copies]
        pieces = [piece for c in copies for piece in split(c, engines)]
        if len(pieces) > len(copies):  # bandwidth-bound: pieces over `engines` queues, every DONE after the join
            queues = [tuple(pieces[i::engines]) for i in range(max(1, engines))]
            post += [Signal(p, done) for p in talk]
        else:  # latency-bound: a queue per copy, side by side on the copy engines, each DONE behind its copy
            # (in a graph parallel nodes cost little, serial ones a node each: dmacoll probe call_cost)
            queues = [*((peer_copies[p], Signal(p, done)) for p in talk if p in peer_copies),
                      *((c,) for c in self_copies)]
            post += [Signal(p, done) for p in talk if p not in peer_copies]
    post += [Wait(p, done) for p in talk]
    if stage_out:
        # push into private output: received chunks land in staging, move them out
        post += coalesce([Copy(Ref("sym", rank, layout.staging + ex.dst[p][rank]),
                               Ref("output", rank, ex.dst[p][rank]), ex.nbytes[p][rank])
                          for p in talk if ex.nbytes[p][rank] > 0])
    return Plan(rank, world, tuple(pre), tuple(q for q in queues if q), tuple(post))


# -- reduce collectives (sum) --------------------------------------------------------------
SCRATCH_ALIGN = 512  # scratch regions start as aligned as Communicator.empty() tensors


def chunk_elements(numel: int, world: int) -> list[int]:
    """All-reduce's split of ``numel`` elements: ``numel // world`` per rank, one more for the
    first ``numel % world`` ranks (``torch.tensor_split``'s split; chunks may be empty)."""
    base, extra = divmod(numel, world)
    return [base + (p < extra) for p in range(world)]


@dataclass(frozen=True)
class Scratch:
    """A reduce collective's symmetric scratch inside the staging area (same offsets on every rank)."""

    recv: int  # [world x chunk] block, slot q = rank q's chunk for us; reused as the all-gather's staging
    staged_input: int  # pull from a private input: a copy of it that peers can read
    reduced: int  # all_reduce into a private output: our summed chunk, readable by peers
    end: int  # first byte after the scratch


def reduce_scratch(chunks: Sequence[int], input_bytes: int, direction: str, layout: Layout,
                   all_reduce: bool) -> Scratch:
    """Scratch for chunks of ``chunks[p]`` bytes. Regions are reserved only when the buffers need
    them; that depends only on the kind of buffers, which every rank must share."""
    def aligned(n: int) -> int:
        return -(-n // SCRATCH_ALIGN) * SCRATCH_ALIGN

    recv = layout.staging
    staged_input = recv + aligned(len(chunks) * max(chunks, default=0))
    reduced = staged_input + (aligned(input_bytes) if direction == "pull" and layout.input_sym is None else 0)
    end = reduced + (aligned(max(chunks, default=0)) if all_reduce and layout.output_sym is None else 0)
    return Scratch(recv, staged_input, reduced, end)


def scatter_exchange(chunks: Sequence[int], offsets: Sequence[int]) -> Exchange:
    """``chunks[p]`` bytes at input offset ``offsets[p]`` of every other rank into rank p's recv block:
    sender q fills slot ``(q - p - 1) % world``, so the ``world - 1`` peer slots sit back to back; nothing
    is sent to oneself (the reduction reads its own part from the input)."""
    world = len(chunks)
    n = tuple(tuple(0 if q == p else chunks[p] for p in range(world)) for q in range(world))
    src = tuple(tuple(offsets[p] for p in range(world)) for _ in range(world))
    dst = tuple(tuple(((q - p - 1) % world) * chunks[p] for p in range(world)) for q in range(world))
    return Exchange(n, src, dst)


def _scatter_plan(chunks: Sequence[int], rank: int, dtype: str, variant: str, direction: str, layout: Layout,
                  engines: int, scratch: Scratch, out: Ref, offsets: Optional[Sequence[int]] = None) -> Plan:
    """The peers' parts for us (``chunks[rank]`` bytes at input offset ``offsets[rank]``, by default chunk
    ``rank`` of a tensor cut into ``chunks``) into our recv block (``scatter_exchange``); after the DONE
    waits, our block plus our own part of the input, summed into ``out``."""
    world = len(chunks)
    offsets = [sum(chunks[:p]) for p in range(world)] if offsets is None else offsets
    plan = build_plan(scatter_exchange(chunks, offsets), rank, variant, direction,
                      Layout(layout.input_sym, scratch.recv, scratch.staged_input), engines)
    if chunks[rank] == 0:
        return plan
    own = _in_ref(layout, rank, offsets[rank], False)
    # slot i holds rank (rank + 1 + i)'s part (scatter_exchange); pushed, its DONE says it is there
    senders = tuple((rank + 1 + i) % world for i in range(world - 1)) if direction == "push" else None
    return replace(plan, post=(*plan.post, Reduce(Ref("sym", rank, scratch.recv), out, chunks[rank], world - 1,
                                                  dtype, own, senders)))


def reduce_scatter_plans(world: int, nbytes: int, rank: int, dtype: str, variant: str = "pcpy",
                         direction: str = "push", layout: Layout = Layout(),
                         engines: int = 2) -> tuple[tuple[Plan, ...], Scratch]:
    """Rank r's output (``nbytes``) = the sum over ranks of chunk r of their input (``world x nbytes``)."""
    chunks = [nbytes] * world
    scratch = reduce_scratch(chunks, world * nbytes, direction, layout, all_reduce=False)
    out = _out_ref(layout, rank, 0, False)
    return (_scatter_plan(chunks, rank, dtype, variant, direction, layout, engines, scratch, out),), scratch


ONE_SHOT_MAX_BYTES = 512 << 10  # all-reduce: up to this size, one exchange of whole tensors (latency-bound)
# At two ranks one exchange moves as many bytes per link as two (n vs 2 n (w - 1) / w) for half the flag
# crossings; it only doubles the local sum (n elements instead of n / 2, ~1 us per MB on H200).
ONE_SHOT_MAX_BYTES_WORLD2 = 2 << 20


def one_shot_all_reduce(nbytes: int, world: int) -> bool:
    """Whether an all-reduce of ``nbytes`` takes the one-exchange plan (``all_reduce_one_shot_plans``)."""
    return nbytes <= (ONE_SHOT_MAX_BYTES_WORLD2 if world == 2 else ONE_SHOT_MAX_BYTES)


def all_reduce_one_shot_plans(nbytes: int, world: int, rank: int, dtype: str, variant: str = "pcpy",
                              direction: str = "push", layout: Layout = Layout(),
                              engines: int = 2) -> tuple[tuple[Plan, ...], Scratch]:
    """One plan: every rank's whole input into every peer's recv block, then each rank sums its block and
    its own input into its output. Half the handshakes of ``all_reduce_plans`` (one exchange instead of
    two) for ``world - 1`` times the bytes on each link instead of ``2 (world - 1) / world``: the
    latency-bound choice."""
    scratch = reduce_scratch([nbytes] * world, nbytes, direction, layout, all_reduce=False)
    out = _out_ref(layout, rank, 0, False)
    return (_scatter_plan([nbytes] * world, rank, dtype, variant, direction, layout, engines, scratch, out,
                          [0] * world),), scratch


def all_reduce_plans(chunks: Sequence[int], rank: int, dtype: str, variant: str = "pcpy", direction: str = "push",
                     layout: Layout = Layout(), engines: int = 2) -> tuple[tuple[Plan, ...], Scratch]:
    """Two plans, run one after the other: a reduce-scatter that leaves rank p's summed chunk
    (``chunks[p]`` bytes at offset ``sum(chunks[:p])``) on rank p, then an all-gather of those chunks.
    The second plan's READY signals go out after the first plan's reduction (caller's queue order),
    so its writes cannot overtake the first plan's reads."""
    mine = sum(chunks[:rank])
    scratch = reduce_scratch(chunks, sum(chunks), direction, layout, all_reduce=True)
    if layout.output_sym is not None:  # sum straight into our chunk of the output, then gather in place
        reduced = layout.output_sym + mine
        gather = all_gather_v_exchange(chunks, in_place=True)
    else:  # sum into scratch that peers can read; the gather's local copy moves it into the output
        reduced = scratch.reduced
        gather = all_gather_v_exchange(chunks)
    scatter = _scatter_plan(chunks, rank, dtype, variant, direction, layout, engines, scratch,
                            Ref("sym", rank, reduced))
    return (scatter, build_plan(gather, rank, variant, direction, Layout(reduced, layout.output_sym, scratch.recv),
                                engines)), scratch
