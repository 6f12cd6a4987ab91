"""The plan layer alone: command shapes, protocol balance, byte coverage."""
import dataclasses
import itertools
import random

import pytest

from dmacoll.plan import (DONE, DONE_ALT, READY, VARIANTS, Copy, Handshake, Layout, Ref, Signal, Wait,
                          all_gather_exchange, all_to_all_exchange, build_plan, coalesce, split)

LAYOUTS = {"sym": Layout(input_sym=1 << 20, output_sym=2 << 20, staging=512),
           "private": Layout(None, None, 512)}


def exchanges(world, seed):
    rng = random.Random(seed)
    yield "all_gather", all_gather_exchange(world, 1000)
    yield "all_gather_in_place", all_gather_exchange(world, 1000, in_place=True)
    yield "all_to_all", all_to_all_exchange([[300] * world for _ in range(world)])
    yield "all_to_all_v", all_to_all_exchange([[rng.choice((0, 7, 4096)) for _ in range(world)]
                                                for _ in range(world)])


def test_pcpy_has_one_queue_per_peer_and_b2b_one_queue():
    ex = all_gather_exchange(4, 1 << 10)
    pcpy = build_plan(ex, 1, "pcpy", "push", LAYOUTS["sym"])
    assert len(pcpy.queues) == 4  # the local copy + 3 peers
    # every READY first on the caller's queue, then each peer's queue: its READY awaited, the copy, its DONE
    assert [(type(c), c.phase) for c in pcpy.pre] == [(Signal, READY)] * 3
    assert all([type(c) for c in q] == [Wait, Copy, Signal] for q in pcpy.queues[1:])
    b2b = build_plan(ex, 1, "b2b", "push", LAYOUTS["sym"])
    assert len(b2b.queues) == 1
    copies = [c for c in b2b.queues[0] if isinstance(c, Copy)]
    assert len(copies) == 4


def test_multi_splits_large_copies_over_its_queues():
    ex = all_gather_exchange(2, 8 << 20)
    plan = build_plan(ex, 0, "multi", "push", LAYOUTS["sym"], engines=4)
    assert len(plan.queues) == 4
    assert sum(c.nbytes for q in plan.queues for c in q) == 2 * (8 << 20)
    assert isinstance(plan.pre[-1], Wait) and isinstance(plan.post[0], Signal)


@pytest.mark.parametrize("world", [2, 4, 8])
def test_small_multi_gives_each_copy_a_queue_of_its_own(world):
    plan = build_plan(all_gather_exchange(world, 1024), 0, "multi", "push", LAYOUTS["sym"], engines=2)
    # a queue per copy, side by side: each peer's copy with its DONE behind it, and our own copy
    assert [[type(c) for c in q] for q in plan.queues] == [[Copy, Signal]] * (world - 1) + [[Copy]]
    assert [q[0].dst.rank for q in plan.queues[:-1]] == [q[1].peer for q in plan.queues[:-1]]
    assert sum(isinstance(c, Wait) for c in plan.pre) == world - 1  # READY still awaited once for all


@pytest.mark.parametrize("world", [2, 3, 4, 8])
@pytest.mark.parametrize("variant,direction,layout", list(itertools.product(VARIANTS, ("push", "pull"), LAYOUTS)))
def test_every_signal_has_a_matching_wait(world, variant, direction, layout, seed):
    for name, ex in exchanges(world, seed):
        plans = [build_plan(ex, r, variant, direction, LAYOUTS[layout]) for r in range(world)]
        sent = sorted((r, c.peer, c.phase) for r, p in enumerate(plans) for c in p.commands()
                      if isinstance(c, Signal))
        waited = sorted((c.peer, r, c.phase) for r, p in enumerate(plans) for c in p.commands()
                        if isinstance(c, Wait))
        assert sent == waited, f"seed {seed}: {name}"
        assert {s[2] for s in sent} <= {READY, DONE}, f"seed {seed}: {name}"


@pytest.mark.parametrize("world", [2, 3, 4, 8])
@pytest.mark.parametrize("variant", VARIANTS)
def test_lean_handshake_drops_ready_only_with_vouched_peers(world, variant, seed):
    """Each rank vouches for a different set of peers (symmetric, as the communicator's rule gives):
    READY goes only between pairs outside it, DONE uses the call's word, and signals still balance."""
    rng = random.Random(seed)
    vouched = {frozenset(pair) for pair in itertools.combinations(range(world), 2) if rng.random() < 0.5}
    for done in (DONE, DONE_ALT):
        for name, ex in exchanges(world, seed):
            plans = [build_plan(ex, r, variant, "push", LAYOUTS["sym"], handshake=Handshake(
                frozenset(p for p in range(world) if frozenset((r, p)) in vouched), done)) for r in range(world)]
            sent = sorted((r, c.peer, c.phase) for r, p in enumerate(plans) for c in p.commands()
                          if isinstance(c, Signal))
            waited = sorted((c.peer, r, c.phase) for r, p in enumerate(plans) for c in p.commands()
                            if isinstance(c, Wait))
            what = f"seed {seed}: {name}"
            assert sent == waited, what
            assert {phase for *_, phase in sent} <= {READY, done}, what
            assert not any(phase == READY and frozenset((a, b)) in vouched for a, b, phase in sent), what
            full = [build_plan(ex, r, variant, "push", LAYOUTS["sym"]) for r in range(world)]
            copies = [[c for c in p.commands() if isinstance(c, Copy)] for p in plans]
            assert copies == [[c for c in p.commands() if isinstance(c, Copy)] for p in full], what


def test_lean_handshake_is_push_only():
    ex = all_gather_exchange(2, 64)
    with pytest.raises(ValueError, match="push only"):
        build_plan(ex, 0, "pcpy", "pull", LAYOUTS["sym"], handshake=Handshake(frozenset({1})))
    with pytest.raises(ValueError, match="DONE or DONE_ALT"):
        build_plan(ex, 0, "pcpy", "push", LAYOUTS["sym"], handshake=Handshake(done=READY))


@pytest.mark.parametrize("world", [2, 3, 5, 8])
@pytest.mark.parametrize("variant,direction", list(itertools.product(VARIANTS, ("push", "pull"))))
def test_every_output_byte_is_written_exactly_once(world, variant, direction, seed):
    """Follow the copies of all ranks: each byte of each rank's output comes from the
    right rank's input, once (symmetric buffers, so no staging)."""
    for name, ex in exchanges(world, seed):
        layout = LAYOUTS["sym"]
        written = {}
        for r in range(world):
            for c in build_plan(ex, r, variant, direction, layout).commands():
                if isinstance(c, Copy) and c.dst.space == "sym" and c.dst.offset >= layout.output_sym:
                    for b in range(c.nbytes):
                        key = (c.dst.rank, c.dst.offset - layout.output_sym + b)
                        assert key not in written, (seed, name, key)
                        written[key] = (c.src.rank, c.src.offset + b)
        for p in range(world):
            for q in range(world):
                if ex.in_place_self and p == q:
                    continue
                for b in range(ex.nbytes[q][p]):
                    src = written[(p, ex.dst[q][p] + b)]
                    assert src[0] == q, f"seed {seed}: {name}"
        expected = sum(ex.nbytes[q][p] for p in range(world) for q in range(world)
                       if not (ex.in_place_self and p == q))
        assert len(written) == expected, name


def test_private_output_is_staged_and_copied_out():
    ex = all_gather_exchange(3, 100)
    plan = build_plan(ex, 0, "pcpy", "push", LAYOUTS["private"])
    out_copies = [c for c in plan.post if isinstance(c, Copy)]
    assert out_copies and all(c.src.space == "sym" and c.dst.space == "output" for c in out_copies)
    assert sum(c.nbytes for c in out_copies) == 200  # both peers' chunks, merged where adjacent
    assert len(out_copies) == 1  # slots 1 and 2 are adjacent: one copy


def test_private_input_is_staged_before_pull():
    ex = all_to_all_exchange([[10, 20], [30, 40]])
    plan = build_plan(ex, 1, "b2b", "pull", LAYOUTS["private"])
    assert isinstance(plan.pre[0], Copy) and plan.pre[0].dst.space == "sym"
    assert plan.pre[0].nbytes == 70


def test_coalesce_and_split_are_inverse():
    from dmacoll.plan import Ref
    c = Copy(Ref("sym", 0, 4096), Ref("sym", 1, 8192), (5 << 20) + 3)
    parts = split(c, 3)
    assert len(parts) == 3 and sum(p.nbytes for p in parts) == c.nbytes
    assert coalesce(parts) == [c]
    assert split(Copy(c.src, c.dst, 1000), 4) == [Copy(c.src, c.dst, 1000)]


def test_bad_arguments_are_rejected():
    ex = all_gather_exchange(2, 8)
    with pytest.raises(ValueError, match="variant"):
        build_plan(ex, 0, "bcst")
    with pytest.raises(ValueError, match="direction"):
        build_plan(ex, 0, "pcpy", "sideways")
    with pytest.raises(ValueError, match="rank 2"):
        build_plan(ex, 2)


# -- reduce collectives ------------------------------------------------------------------------
import numpy as np  # noqa: E402

from dmacoll.plan import Reduce, all_reduce_one_shot_plans, all_reduce_plans, chunk_elements, \
    reduce_scatter_plans  # noqa: E402

ELEM = 8  # the simulated reductions sum int64
SYM_BYTES = 1 << 18
REDUCE_LAYOUTS = {"sym": Layout(input_sym=1 << 16, output_sym=1 << 17, staging=512),
                  "private": Layout(None, None, 512), "sym_in": Layout(1 << 16, None, 512),
                  "sym_out": Layout(None, 1 << 17, 512)}


def reduce_plans(op, world, count, variant, direction, layout):
    """Per rank (plans, scratch); ``count``: elements per chunk (reduce_scatter) or of the tensor (all_reduce)."""
    if op == "reduce_scatter":
        return [reduce_scatter_plans(world, count * ELEM, r, "int64", variant, direction, layout)
                for r in range(world)]
    if op == "all_reduce_one_shot":
        return [all_reduce_one_shot_plans(count * ELEM, world, r, "int64", variant, direction, layout)
                for r in range(world)]
    chunks = [n * ELEM for n in chunk_elements(count, world)]
    return [all_reduce_plans(chunks, r, "int64", variant, direction, layout) for r in range(world)]


REDUCE_PLAN_OPS = ["reduce_scatter", "all_reduce", "all_reduce_one_shot"]


def simulate(per_rank, inputs, out_elems, layout, in_place=False):
    """Run every rank's plans on numpy memory, plan by plan: all ranks' pre, then their queues, then
    their post (the order the flags enforce). Returns each rank's output (int64)."""
    world = len(per_rank)
    sym = [np.zeros(SYM_BYTES, np.uint8) for _ in range(world)]
    mem = []
    for r in range(world):
        inp = inputs[r].view(np.uint8).copy()
        if layout.input_sym is not None:
            sym[r][layout.input_sym: layout.input_sym + inp.size] = inp
        out = inp if in_place else np.full(out_elems * ELEM, 0xA5, np.uint8)
        if layout.output_sym is not None:
            sym[r][layout.output_sym: layout.output_sym + out.size] = out
        mem.append({"input": inp, "output": out})

    def view(ref, nbytes):
        base = sym[ref.rank] if ref.space == "sym" else mem[ref.rank][ref.space]
        assert ref.offset + nbytes <= base.size, ref
        return base[ref.offset: ref.offset + nbytes]

    def issue(rank, commands):
        for c in commands:
            if isinstance(c, Copy):
                assert c.src.rank == rank or c.dst.rank == rank
                view(c.dst, c.nbytes)[:] = view(c.src, c.nbytes)
            elif isinstance(c, Reduce):
                assert c.src.rank == c.dst.rank == rank, "a reduction is local"
                block = view(c.src, c.count * c.nbytes).view(np.int64).reshape(c.count, -1)
                total = block.sum(0)
                if c.own is not None:
                    assert c.own.rank == rank, "a reduction is local"
                    total = total + view(c.own, c.nbytes).view(np.int64)
                view(c.dst, c.nbytes)[:] = total.view(np.uint8)

    for k in range(len(per_rank[0][0])):
        for part in ("pre", "queues", "post"):
            for r in range(world):
                plan = per_rank[r][0][k]
                issue(r, [c for q in plan.queues for c in q] if part == "queues" else getattr(plan, part))
    outs = []
    for r in range(world):
        out = mem[r]["output"] if layout.output_sym is None else \
            sym[r][layout.output_sym: layout.output_sym + out_elems * ELEM]
        outs.append(out.view(np.int64))
    return outs


def run_reduce(seed, op, world, count, variant, direction, layout, mutate=None, in_place=False):
    rng = np.random.default_rng(seed)
    n_in = world * count if op == "reduce_scatter" else count
    inputs = [rng.integers(-1000, 1000, n_in, dtype=np.int64) for _ in range(world)]
    per_rank = reduce_plans(op, world, count, variant, direction, layout)
    if mutate:
        per_rank = [(tuple(mutate(p) for p in plans), scratch) for plans, scratch in per_rank]
    total = np.sum(inputs, axis=0)
    want = [total[r * count: (r + 1) * count] for r in range(world)] if op == "reduce_scatter" else [total] * world
    got = simulate(per_rank, inputs, len(want[0]), layout, in_place)
    return per_rank, got, want


@pytest.mark.parametrize("world", [2, 3, 5, 8])
@pytest.mark.parametrize("op", REDUCE_PLAN_OPS)
@pytest.mark.parametrize("variant,direction", list(itertools.product(VARIANTS, ("push", "pull"))))
def test_reduce_plans_compute_the_sum(world, op, variant, direction, seed):
    for layout_name, count in itertools.product(REDUCE_LAYOUTS, (1, world - 1, 7, 3 * world + 1)):
        _, got, want = run_reduce(seed + count, op, world, count, variant, direction, REDUCE_LAYOUTS[layout_name])
        for r in range(world):
            assert np.array_equal(got[r], want[r]), (seed, layout_name, count, r)


@pytest.mark.parametrize("layout", [Layout(1 << 17, 1 << 17, 512), Layout(None, None, 512)], ids=["sym", "private"])
@pytest.mark.parametrize("variant,direction", list(itertools.product(VARIANTS, ("push", "pull"))))
@pytest.mark.parametrize("op", ["all_reduce", "all_reduce_one_shot"])
def test_all_reduce_plans_in_place(layout, variant, direction, op, seed):
    _, got, want = run_reduce(seed, op, 4, 11, variant, direction, layout, in_place=True)
    assert all(np.array_equal(g, w) for g, w in zip(got, want)), f"seed {seed}"


def test_one_shot_limit_is_larger_at_two_ranks():
    from dmacoll.plan import ONE_SHOT_MAX_BYTES, ONE_SHOT_MAX_BYTES_WORLD2, one_shot_all_reduce

    assert ONE_SHOT_MAX_BYTES_WORLD2 > ONE_SHOT_MAX_BYTES
    assert one_shot_all_reduce(2 << 20, 2) and not one_shot_all_reduce((2 << 20) + 2, 2)
    assert one_shot_all_reduce(512 << 10, 3) and not one_shot_all_reduce(1 << 20, 3)
    assert not one_shot_all_reduce(1 << 20, 8)


def test_one_shot_all_reduce_is_one_exchange_of_whole_tensors():
    for r, (plans, _) in enumerate(reduce_plans("all_reduce_one_shot", 4, 10, "pcpy", "push", REDUCE_LAYOUTS["sym"])):
        (plan,) = plans
        copies = [c for c in plan.commands() if isinstance(c, Copy)]
        assert len(copies) == 3 and all(c.nbytes == 10 * ELEM and c.src.offset == 1 << 16 for c in copies)
        assert sum(isinstance(c, Signal) for c in plan.commands()) == 2 * 3  # one READY, one DONE per peer


def _shift_reduce_source(plan):
    """Off by one chunk: sum the slots starting one slot later."""
    post = tuple(dataclasses.replace(c, src=Ref(c.src.space, c.src.rank, c.src.offset + c.nbytes))
                 if isinstance(c, Reduce) else c for c in plan.post)
    return dataclasses.replace(plan, post=post)


def _drop_last_rank(plan):
    post = tuple(dataclasses.replace(c, count=c.count - 1) if isinstance(c, Reduce) else c for c in plan.post)
    return dataclasses.replace(plan, post=post)


@pytest.mark.parametrize("mutate", [_shift_reduce_source, _drop_last_rank])
@pytest.mark.parametrize("op", REDUCE_PLAN_OPS)
def test_the_simulation_catches_a_wrong_reduction(op, mutate, seed):
    _, got, want = run_reduce(seed, op, 3, 6, "b2b", "push", REDUCE_LAYOUTS["sym"], mutate=mutate)
    assert not all(np.array_equal(g, w) for g, w in zip(got, want)), f"seed {seed}"


@pytest.mark.parametrize("world", [2, 3, 8])
@pytest.mark.parametrize("op", REDUCE_PLAN_OPS)
@pytest.mark.parametrize("variant,direction,layout", list(itertools.product(VARIANTS, ("push", "pull"),
                                                                            REDUCE_LAYOUTS)))
def test_reduce_runs_on_the_callers_queue_after_every_done_wait(world, op, variant, direction, layout):
    for r, (plans, scratch) in enumerate(reduce_plans(op, world, 5 * world, variant, direction,
                                                      REDUCE_LAYOUTS[layout])):
        scatter = plans[0]
        post = list(scatter.post)  # the caller's queue, after the join of the side queues
        assert not any(isinstance(c, Reduce) for c in scatter.pre + tuple(c for q in scatter.queues for c in q))
        reduces = [i for i, c in enumerate(post) if isinstance(c, Reduce)]
        done_waits = [i for i, c in enumerate(post) if isinstance(c, Wait) and c.phase == DONE]
        assert len(reduces) == 1 and done_waits and max(done_waits) < reduces[0]
        reduce = post[reduces[0]]
        assert (reduce.src, reduce.count) == (Ref("sym", r, scratch.recv), world - 1)
        assert reduce.own is not None and reduce.own.rank == r  # our chunk, read where it is
        assert len(plans) == (2 if op == "all_reduce" else 1)
        if op == "all_reduce":  # the gather moves the summed chunk, never the raw input
            assert not any(isinstance(c, Reduce) for c in plans[1].commands())


@pytest.mark.parametrize("world", [2, 3, 8])
@pytest.mark.parametrize("op", REDUCE_PLAN_OPS)
@pytest.mark.parametrize("variant,direction", list(itertools.product(VARIANTS, ("push", "pull"))))
def test_reduce_plans_on_heap_buffers_copy_nothing_locally(world, op, variant, direction):
    """Heap input and output: every copy crosses to a peer (a device-local copy waits for a concurrent GEMM)."""
    for r, (plans, _) in enumerate(reduce_plans(op, world, 3 * world, variant, direction, REDUCE_LAYOUTS["sym"])):
        local = [c for p in plans for c in p.commands() if isinstance(c, Copy) and c.src.rank == c.dst.rank]
        assert not local, (r, local)


@pytest.mark.parametrize("op", REDUCE_PLAN_OPS)
@pytest.mark.parametrize("variant,direction,layout", list(itertools.product(VARIANTS, ("push", "pull"),
                                                                            REDUCE_LAYOUTS)))
def test_reduce_plans_balance_signals_and_stay_inside_their_scratch(op, variant, direction, layout):
    world, lay = 4, REDUCE_LAYOUTS[layout]
    per_rank = reduce_plans(op, world, 9, variant, direction, lay)
    for k in range(len(per_rank[0][0])):  # each plan of the sequence balances on its own
        sent = sorted((r, c.peer, c.phase) for r, (plans, _) in enumerate(per_rank) for c in plans[k].commands()
                      if isinstance(c, Signal))
        waited = sorted((c.peer, r, c.phase) for r, (plans, _) in enumerate(per_rank)
                        for c in plans[k].commands() if isinstance(c, Wait))
        assert sent == waited
    scratch = per_rank[0][1]
    assert {s for _, s in per_rank} == {scratch}, "the scratch offsets must agree across ranks"
    in_heap = [(o, o + (1 << 16)) for o in (lay.input_sym, lay.output_sym) if o is not None]
    data = [c for plans, _ in per_rank for p in plans for c in p.commands() if isinstance(c, (Copy, Reduce))]
    touched = [(c.src, c.nbytes * (c.count if isinstance(c, Reduce) else 1)) for c in data] + \
        [(c.dst, c.nbytes) for c in data]
    for ref, n in touched:  # every symmetric byte outside the user's heap buffers is scratch
        if ref.space == "sym" and not any(lo <= ref.offset < hi for lo, hi in in_heap):
            assert scratch.recv <= ref.offset and ref.offset + n <= scratch.end, (ref, n, scratch)


def test_reduce_scratch_grows_only_for_private_buffers():
    sym = reduce_scatter_plans(4, 1000, 0, "float32", "pcpy", "pull", REDUCE_LAYOUTS["sym"])[1]
    private = reduce_scatter_plans(4, 1000, 0, "float32", "pcpy", "pull", REDUCE_LAYOUTS["private"])[1]
    assert sym.end - sym.recv == 4096  # 4 slots of 1000 bytes, aligned
    assert private.end - private.recv == 4096 + 4096  # + the staged input
    ar = all_reduce_plans([1000] * 4, 0, "float32", "pcpy", "push", REDUCE_LAYOUTS["private"])[1]
    assert ar.end - ar.recv == 4096 + 1024  # + the summed chunk that peers read


def test_chunk_elements_is_tensor_splits_split():
    import torch

    for numel, world in itertools.product((0, 1, 7, 8, 9, 100), (2, 3, 8)):
        assert chunk_elements(numel, world) == [len(t) for t in torch.tensor_split(torch.arange(numel), world)]


# -- progress whatever order a rank's queues run in -------------------------------------------------------------
def serialized(plans, order):
    """A rank's commands with its queues run one after another, in ``order`` (a permutation of queue indices
    per plan): what the GPU may do, since CUDA does not promise that independent streams or graph branches run
    concurrently (a wait on one can hold up another sharing its hardware queue)."""
    return [c for plan, perm in zip(plans, order) for c in (*plan.pre, *(c for i in perm for c in plan.queues[i]),
                                                           *plan.post)]


def deadlock(per_rank):
    """Run every rank's command list against the others' flags (a signal counts, a wait consumes one):
    None when every rank reaches its end, else where each rank stands."""
    flags = {}
    at = [0] * len(per_rank)
    moved = True
    while moved:
        moved = False
        for r, commands in enumerate(per_rank):
            while at[r] < len(commands):
                c = commands[at[r]]
                if isinstance(c, Signal):
                    flags[c.peer, c.phase, r] = flags.get((c.peer, c.phase, r), 0) + 1
                elif isinstance(c, Wait):
                    if not flags.get((r, c.phase, c.peer)):
                        break
                    flags[r, c.phase, c.peer] -= 1
                at[r] += 1
                moved = True
    return None if all(at[r] == len(c) for r, c in enumerate(per_rank)) else \
        [f"rank {r} at {per_rank[r][at[r]]}" for r in range(len(per_rank)) if at[r] < len(per_rank[r])]


ORDERS = ("forward", "reverse", "random", "random")  # queue orders tried: as built, reversed, two drawn


def order(plans, how, rng):
    """Per plan, the order its queues run in."""
    perms = []
    for plan in plans:
        perm = list(range(len(plan.queues)))
        if how == "reverse":
            perm.reverse()
        elif how == "random":
            rng.shuffle(perm)
        perms.append(perm)
    return perms


@pytest.mark.parametrize("world", [2, 3, 4, 8])
@pytest.mark.parametrize("variant,direction", list(itertools.product(VARIANTS, ("push", "pull"))))
def test_every_call_completes_whatever_order_its_queues_run_in(world, variant, direction, seed):
    """A rank's queues may run one after another, in any order (CUDA runs independent streams and graph branches
    concurrently only when it can): no queue may wait for a flag that a peer sends from a queue of its own that
    could be held up behind one of that peer's waits. Seen on one H100 with four ranks: pcpy calls hung when
    each peer queue signalled its READY itself (results/h100x2/tests/README.md)."""
    calls = [(name, [(build_plan(ex, r, variant, direction, LAYOUTS[layout]),) for r in range(world)])
             for name, ex in exchanges(world, seed) for layout in LAYOUTS]
    calls += [(f"{op} {layout}", [plans for plans, _ in reduce_plans(op, world, 5, variant, direction,
                                                                    REDUCE_LAYOUTS[layout])])
              for op in REDUCE_PLAN_OPS for layout in ("sym", "private")]
    for name, per_rank in calls:
        for k, how in enumerate(ORDERS):
            rngs = [random.Random(f"{seed}-{k}-{r}") for r in range(world)]  # each rank its own order
            stuck = deadlock([serialized(plans, order(plans, how, rngs[r])) for r, plans in enumerate(per_rank)])
            assert stuck is None, f"seed {seed}: {name}, queues run {how}: deadlock, {stuck}"
