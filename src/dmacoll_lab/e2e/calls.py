"""What one forward pass must communicate, per schedule: the collectives in order, their sizes, and the buffers
they need. Pure Python (no torch): the model's recorded calls are checked against it (``check_calls``), so a
schedule that drops, adds, resizes or reorders a collective is caught, and the buffers are sized from it.

Schedules (the parallel layout itself is in config.py):

* ``serial``: today's order, every collective waited for before the next GEMM.
* ``microbatch``: the forward split in two micro-batches (``split``): by sequences when there are several, else a
  single prompt by tokens (the second half attends to the first half's cached keys). Each micro-batch issues
  exactly the collectives a serial forward of its tokens issues, in the same order; the two are interleaved.
* ``seqpar`` (prefill only): the residual stream sharded by tokens between the blocks. Each block starts with
  ``pieces`` all-gathers of the normed shard and ends with ``pieces`` reduce-scatters (where serial has one
  all-reduce), so piece i's communication can run under piece i-1's GEMM. The embedding's all-reduce becomes
  ``pieces`` reduce-scatters; the LM head takes every sequence's last row from its owner with one all-reduce of
  ``rows x hidden`` (the rows of other ranks are zero) and then gathers the logits as serial does. Expert
  parallel (Mixtral) works on the shard directly: the counts' all-gather and the dispatch / combine all-to-alls
  stay, the all-gather of the slices goes (the output stays sharded).

Expert parallel sends a prefill's tokens as routed (``moe_calls``: an all-gather of every rank's counts, then two
``all_to_all_v``) and a decode step's capacity-padded (two ``all_to_all`` of fixed sizes: capturable).

Token layout of ``seqpar``: ``T`` tokens padded to ``Tp = pieces x world x P`` rows (``P = ceil(T / (pieces x
world))``). Piece i is rows ``[i w P, (i + 1) w P)``; rank r holds the r-th ``P`` rows of every piece, so an
all-gather of piece i yields its rows in order and a reduce-scatter of piece i hands each rank its own rows back.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from dmacoll.lab_api import InvalidArgument
from .config import ModelSpec, buffer_elements

SCHEDULES = ("serial", "microbatch", "seqpar")
PREFILL_ONLY = ("seqpar",)


def check_schedules(schedules: Sequence[str], pieces: int) -> None:
    bad = [s for s in schedules if s not in SCHEDULES]
    if bad or not schedules:
        raise InvalidArgument(f"unknown schedule(s) {bad}; choose from {list(SCHEDULES)}")
    if len(set(schedules)) != len(schedules):
        raise InvalidArgument(f"--schedules lists one twice: {list(schedules)}")
    if pieces < 1:
        raise InvalidArgument(f"--pieces must be >= 1, got {pieces}")


# -- micro-batches -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Part:
    """A micro-batch: sequences ``[seq0, seq1)``, tokens ``[tok0, tok1)`` of each."""
    seq0: int
    seq1: int
    tok0: int
    tok1: int

    @property
    def tokens(self) -> int:
        return (self.seq1 - self.seq0) * (self.tok1 - self.tok0)


def split(batch: int, length: int) -> list[Part]:
    """Two micro-batches of a forward of ``batch`` sequences x ``length`` tokens: by sequences (the first takes
    the odd one), else one sequence by tokens; a single token is one micro-batch."""
    if batch >= 2:
        half = (batch + 1) // 2
        return [Part(0, half, 0, length), Part(half, batch, 0, length)]
    if length >= 2:
        half = (length + 1) // 2
        return [Part(0, 1, 0, half), Part(0, 1, half, length)]
    return [Part(0, batch, 0, length)]


def logits_rows(part: Part, length: int) -> int:
    """Sequences whose last token is in ``part`` (its forward ends with the LM head only if any)."""
    return part.seq1 - part.seq0 if part.tok1 == length else 0


# -- sequence parallel geometry ------------------------------------------------------------------------------------
def piece_rows(tokens: int, world: int, pieces: int) -> int:
    """P: rows of one piece on one rank."""
    return max(1, math.ceil(tokens / (pieces * world)))


def padded_tokens(tokens: int, world: int, pieces: int) -> int:
    return pieces * world * piece_rows(tokens, world, pieces)


# -- the calls -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Expected:
    site: str
    op: str
    numel: int  # elements of the call's output


def moe_calls(world: int, layer: int, n: dict[str, int], uneven: bool) -> list[Expected]:
    """A layer's expert exchange (buffer sizes ``n``): uneven, the counts' all-gather (``world x world`` int32) and
    two all_to_all_v; else two capacity-padded all-to-alls. Their outputs are the whole buffers either way."""
    op = "all_to_all_v" if uneven else "all_to_all"
    return ([Expected(f"counts{layer}", "all_gather", world * world)] if uneven else []) + [
        Expected(f"dispatch{layer}", op, n["dispatch_recv"]), Expected(f"combine{layer}", op, n["combine_recv"])]


def serial_calls(s: ModelSpec, world: int, tokens: int, rows: int, uneven: bool = False) -> list[Expected]:
    """The collectives of a serial forward of ``tokens`` tokens ending with ``rows`` logits rows (0: no head);
    ``uneven``: a prefill's (``moe_calls``)."""
    n = buffer_elements(s, world, tokens, max(rows, 1))
    out = [Expected("embed", "all_reduce", n["reduce"])]
    for i in range(s.layers):
        out.append(Expected(f"attn{i}", "all_reduce", n["reduce"]))
        if not s.moe:
            out.append(Expected(f"mlp{i}", "all_reduce", n["reduce"]))
        elif world > 1:  # at world 1 the experts are all local: nothing to exchange
            out += moe_calls(world, i, n, uneven) + [Expected(f"gather{i}", "all_gather", n["gather"])]
    if rows:
        out.append(Expected("logits", "all_gather", n["logits"]))
    return out


def seqpar_calls(s: ModelSpec, world: int, tokens: int, rows: int, pieces: int) -> list[Expected]:
    """The collectives of a sequence-parallel prefill (module docstring), ``pieces`` per block boundary. Attention
    gathers every piece before it runs; an MLP pipelines: gather 0, then per piece i the next gather and the
    reduce-scatter of i."""
    H, P = s.hidden, piece_rows(tokens, world, pieces)
    n = buffer_elements(s, world, padded_tokens(tokens, world, pieces), rows)

    def ag(site):
        return Expected(site, "all_gather", world * P * H)

    def rs(site):
        return Expected(site, "reduce_scatter", P * H)

    out = [rs("embed")] * pieces
    for i in range(s.layers):
        out += [ag(f"attn{i}.in")] * pieces + [rs(f"attn{i}")] * pieces
        if not s.moe:
            out.append(ag(f"mlp{i}.in"))
            for k in range(pieces):
                out += ([ag(f"mlp{i}.in")] if k + 1 < pieces else []) + [rs(f"mlp{i}")]
        elif world > 1:
            out += moe_calls(world, i, n, uneven=True)
    return out + [Expected("head", "all_reduce", rows * H), Expected("logits", "all_gather", n["logits"])]


def expected_calls(s: ModelSpec, world: int, schedule: str, batch: int, length: int, pieces: int,
                   decode: bool = False) -> dict[int, list[Expected]]:
    """Micro-batch -> the collectives it must issue, in order, for one forward of ``batch`` x ``length`` tokens
    (decode: ``length`` 1, every row has logits)."""
    if schedule == "seqpar" and not decode:
        return {0: seqpar_calls(s, world, batch * length, batch, pieces)}
    parts = split(batch, length) if schedule == "microbatch" else [Part(0, batch, 0, length)]
    return {j: serial_calls(s, world, p.tokens, logits_rows(p, length), uneven=not decode)
            for j, p in enumerate(parts)}


def check_calls(recorded: Sequence[tuple[int, str, str, int]], expected: dict[int, list[Expected]]) -> str:
    """'' if every micro-batch issued exactly its expected collectives in order; else what differs first.
    ``recorded``: (micro-batch, site, op, output elements) in issue order."""
    got: dict[int, list[Expected]] = {}
    for mb, site, op, numel in recorded:
        got.setdefault(mb, []).append(Expected(site, op, numel))
    for mb in sorted(set(got) | set(expected)):
        want, have = expected.get(mb, []), got.get(mb, [])
        for k, (w, h) in enumerate(zip(want, have)):
            if w != h:
                return f"micro-batch {mb} call {k}: expected {w.op} at {w.site} ({w.numel}), got {h.op} at " \
                       f"{h.site} ({h.numel})"
        if len(want) != len(have):
            what = "missing" if len(have) < len(want) else "extra"
            first = (want if len(have) < len(want) else have)[min(len(want), len(have))]
            return f"micro-batch {mb}: {abs(len(want) - len(have))} call(s) {what}, first {first.op} at {first.site}"
    return ""


# -- buffers -----------------------------------------------------------------------------------------------------
def suffix(mb: int) -> str:
    """Buffer names of micro-batch ``mb`` (the first shares serial's blocks)."""
    return f".{mb}" if mb else ""


def schedule_buffers(s: ModelSpec, world: int, tokens: int, rows: int, schedule: str,
                     pieces: int) -> dict[str, int]:
    """Elements of each communication buffer a schedule needs for up to ``tokens`` tokens and ``rows`` logits rows
    per forward (names: config.buffer_elements', ``.1`` for the second micro-batch, ``sp_*`` for seqpar)."""
    if schedule == "serial":
        return buffer_elements(s, world, tokens, rows)
    if schedule == "microbatch":
        second = buffer_elements(s, world, math.ceil(tokens / 2), math.ceil(rows / 2))
        return {**buffer_elements(s, world, tokens, rows), **{k + suffix(1): v for k, v in second.items()}}
    tp = padded_tokens(tokens, world, pieces)
    out = buffer_elements(s, world, tp, rows)
    out.update(sp_gather=tp * s.hidden, sp_partial=tp * s.hidden, sp_in=tp // world * s.hidden,
               sp_out=tp // world * s.hidden, sp_head=rows * s.hidden)
    return out


def merged_schedule_buffers(specs, world: int, tokens: int, rows: int, schedules: Sequence[str],
                            pieces: int) -> dict[str, int]:
    """The largest size of each buffer over models and schedules (one set serves them all, one after another)."""
    out: dict[str, int] = {}
    for s in specs:
        for sched in schedules:
            for k, v in schedule_buffers(s, world, tokens, rows, sched, pieces).items():
                out[k] = max(out.get(k, 0), v)
    return out


def staging_elements(elements: dict[str, int]) -> int:
    """What a reducing collective may receive into staging: its whole input (an all-reduce's tensor, a
    reduce-scatter piece's world x rows)."""
    return max(elements.get(k, 0) for k in ("reduce", "sp_partial"))
