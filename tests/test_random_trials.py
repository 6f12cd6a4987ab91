"""Random trials on the host emulator, at worlds 2-8, as a new user would mix calls: a random op, dtype and size
(zero too), private / symmetric / in-place / owned outputs (chained: an owned output as the next call's input),
options or none, uneven and all-zero all_to_all_v splits; among them inputs that overlap the output illegally,
and ranks that disagree on a call (with the cross-rank check on). Every output is compared with the reference;
every refused call must be refused on every rank, and the communicators go on working afterwards."""
import random

import pytest
import torch

from dmacoll_lab.verify.launch import run_ranks

TRIALS = 40
COUNTS = (0, 1, 3, 17, 64, 257)
POOL_BYTES = 1 << 16  # symmetric input and output pools: the largest call is all_to_all_v at world 8, 257 x 8 B


def _in_place_at(op: str, out_at: int, in_at: int, n_in: int, n_out: int, rank: int) -> bool:
    """Whether an input at element ``in_at`` and an output at ``out_at`` of one buffer are ``op``'s in-place form."""
    return {"all_gather": in_at == out_at + rank * n_in, "reduce_scatter": out_at == in_at + rank * n_out,
            "all_reduce": in_at == out_at}.get(op, False)


class Trials:
    def __init__(self, rank: int, world: int, seed: int):
        from dmacoll import Communicator, Options

        self.rank, self.world, self.seed = rank, world, seed
        self.rng = random.Random(seed)  # the same draws on every rank: the ranks agree on each call
        sizes = dict(backend="host", heap_bytes=1 << 20, staging_bytes=1 << 20, timeout_s=60)
        self.comms = [Communicator(**sizes), Communicator(**sizes, options=Options(check_calls=True))]
        self.pools = [(c.empty(POOL_BYTES, dtype=torch.uint8), c.empty(POOL_BYTES, dtype=torch.uint8))
                      for c in self.comms]
        self.chain = None  # (comm index, every rank's output, this rank's owned output) of an owned exchange

    def close(self) -> None:
        for c in self.comms:
            c.close()

    def inputs(self, spec, count, counts, dtype, seed):
        from dmacoll_lab.verify.reference import draw

        return [draw(spec, spec.numels(count, self.world, p, counts)[0], dtype, seed + p) for p in range(self.world)]

    def call(self, trial: int) -> str | None:
        """A call that must run and be right: None, or what is wrong."""
        from dmacoll import ops
        from dmacoll.plan import DIRECTIONS, VARIANTS
        from dmacoll_lab.verify.reference import DTYPES, mismatch, poison

        rng, rank, world = self.rng, self.rank, self.world
        which = rng.randrange(2)
        comm, (sym_in, sym_out) = self.comms[which], self.pools[which]
        op = rng.choice(ops.names())
        spec = ops.get(op)
        dtype = rng.choice([d for d in DTYPES.values() if spec.accepts(d)])
        count, counts = rng.choice(COUNTS), None
        if op == "all_to_all_v":
            zero = rng.random() < 0.2
            counts = [[0] * world] * world if zero else spec.counts(max(count, 1), world, rng.randrange(1 << 30))
        kind = rng.choice(("private", "sym", "owned", "owned") + (("in place",) if spec.in_place else ()))
        options = rng.choice(({}, {}, {"variant": rng.choice(VARIANTS), "direction": rng.choice(DIRECTIONS)}))
        inputs = self.inputs(spec, count, counts, dtype, rng.randrange(1 << 30))
        chained = self.chain if kind == "owned" and op in ("all_gather", "all_to_all") else None
        if chained and chained[0] == which and (op == "all_gather" or chained[1][0].numel() % world == 0):
            inputs, inp = chained[1], chained[2]  # the previous owned output, as promised valid until this call
            dtype = inp.dtype
        else:
            inp = inputs[rank].clone()
        extra = () if counts is None else (counts,)
        n_in, n_out = inp.numel(), spec.numels(count, world, rank, counts)[1]
        if op in ("all_gather", "all_to_all"):
            n_out = n_in * (world if op == "all_gather" else 1)
        if kind == "owned":
            got = comm.result(op, inp, *extra, **options)
        else:
            size = dtype.itemsize
            if kind == "private":
                out, buf = torch.empty(n_out, dtype=dtype), torch.empty(n_in, dtype=dtype)
            else:
                out, buf = sym_out[: n_out * size].view(dtype), sym_in[: n_in * size].view(dtype)
            if kind == "in place":
                out, buf = spec.in_place_views(out if rng.random() < 0.5 else torch.empty(n_out, dtype=dtype),
                                               buf, rank)
            poison(spec, out)
            buf.copy_(inp)
            got = comm.collective(op, out, buf, *extra, **options)
        error = mismatch(spec, got.reshape(-1), inputs, rank, counts)
        exact = not (spec.reduces and dtype.is_floating_point)  # a float sum is not every rank's known output
        self.chain = (which, [spec.reference(inputs, p, counts) for p in range(world)], got) \
            if kind == "owned" and exact and op != "all_to_all_v" and error is None else None
        return error and f"trial {trial}: {op} {dtype} x{count} {kind} {options} on comm {which}: {error}"

    def overlap(self, trial: int) -> str | None:
        """An input that overlaps the output but is not the op's in-place form: refused on every rank."""
        from dmacoll import InvalidArgument, ops

        rng, rank, world = self.rng, self.rank, self.world
        which = rng.randrange(2)
        comm = self.comms[which]
        op = rng.choice(ops.names())
        spec = ops.get(op)
        count = rng.choice((3, 17))  # a one-element all_reduce can only overlap in place
        counts = [[count] * world for _ in range(world)] if op == "all_to_all_v" else None
        n_in, n_out = spec.numels(count, world, rank, counts)
        base = self.pools[which][1].view(torch.float32) if rng.random() < 0.5 else torch.zeros(n_in + n_out + n_in)
        mine = random.Random(f"{self.seed}-{trial}-{rank}")  # where this rank's input overlaps: its own choice
        out_at = n_in
        in_at = mine.choice([b for b in range(out_at - n_in + 1, out_at + n_out)
                             if not _in_place_at(op, out_at, b, n_in, n_out, rank)])
        extra = () if counts is None else (counts,)
        what = f"trial {trial}: {op} x{count} input at {in_at}, output at {out_at} on comm {which}"
        try:
            comm.collective(op, base[out_at: out_at + n_out], base[in_at: in_at + n_in], *extra)
        except InvalidArgument as e:
            return None if "overlap" in str(e) else f"{what}: refused for another reason: {e}"
        return f"{what}: ran"

    def disagree(self, trial: int) -> str | None:
        """One rank makes a different call; with the check on, every rank raises, naming that rank."""
        from dmacoll import InvalidArgument, ops
        from dmacoll_lab.verify.reference import DTYPES

        rng, rank, world = self.rng, self.rank, self.world
        op = rng.choice(ops.names())
        spec = ops.get(op)
        dtypes = [d for d in DTYPES.values() if spec.accepts(d)]
        dtype, count, odd = rng.choice(dtypes), rng.choice((1, 3, 17)), rng.randrange(world)
        how = rng.choice(("size", "dtype", "direction"))
        counts = spec.counts(count, world, rng.randrange(1 << 30)) if op == "all_to_all_v" else None
        cell = (rng.randrange(world), rng.randrange(world))
        options = {"direction": "push"}
        if rank == odd:
            if how == "size" and counts is not None:
                counts = [row[:] for row in counts]
                counts[cell[0]][cell[1]] += 1
            elif how == "size":
                count += 1
            elif how == "dtype":
                dtype = next(d for d in dtypes if d != dtype)
            else:
                options = {"direction": "pull"}
        n_in, n_out = spec.numels(count, world, rank, counts)
        extra = () if counts is None else (counts,)
        what = f"trial {trial}: {op} {dtype} x{count}, rank {odd}'s {how} differs"
        try:
            self.comms[1].collective(op, torch.zeros(n_out + 1, dtype=dtype)[:n_out], torch.ones(n_in, dtype=dtype),
                                     *extra, **options)
        except InvalidArgument as e:
            said = str(e)
            return None if "the ranks disagree" in said and f"on rank {odd}" in said else f"{what}: {said}"
        return f"{what}: ran"


def _trials(rank, world, seed):
    trials = Trials(rank, world, seed)
    errors = []
    try:
        for t in range(TRIALS):
            kind = trials.rng.choices(("call", "overlap", "disagree"), weights=(6, 2, 2))[0]
            errors.append(getattr(trials, kind)(t))
    finally:
        trials.close()
    return [e for e in errors if e]


@pytest.mark.parametrize("world", [2, 3, 5, 8])
def test_random_calls_overlaps_and_disagreeing_ranks(world, seed):
    per_rank = run_ranks(_trials, world, seed)
    wrong = [f"rank {r}: {e}" for r, errors in enumerate(per_rank) for e in errors]
    assert not wrong, f"seed {seed}: " + "\n".join(wrong[:5])
