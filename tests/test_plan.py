"""The plan layer alone: command shapes, protocol balance, byte coverage."""
import itertools
import random

import pytest

from dmacoll.plan import (DONE, READY, VARIANTS, Copy, Layout, Signal, Wait, all_gather_exchange,
                          all_to_all_exchange, build_plan, coalesce, split)

LAYOUTS = {"sym": Layout(input_sym=1 << 20, output_sym=2 << 20, staging=512),
           "private": Layout(None, None, 512)}


def exchanges(world):
    rng = random.Random(world)
    yield "all_gather", all_gather_exchange(world, 1000)
    yield "all_gather_in_place", all_gather_exchange(world, 1000, in_place=True)
    yield "all_to_all", all_to_all_exchange([[300] * world for _ in range(world)])
    yield "all_to_all_v", all_to_all_exchange([[rng.choice((0, 7, 4096)) for _ in range(world)]
                                                for _ in range(world)])


def test_pcpy_has_one_queue_per_peer_and_b2b_one_queue():
    ex = all_gather_exchange(4, 1 << 10)
    pcpy = build_plan(ex, 1, "pcpy", "push", LAYOUTS["sym"])
    assert len(pcpy.queues) == 4  # the local copy + 3 peers
    assert all(isinstance(q[0], Wait) and isinstance(q[-1], Signal) for q in pcpy.queues[1:])
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


@pytest.mark.parametrize("world", [2, 3, 4, 8])
@pytest.mark.parametrize("variant,direction,layout", list(itertools.product(VARIANTS, ("push", "pull"), LAYOUTS)))
def test_every_signal_has_a_matching_wait(world, variant, direction, layout):
    for name, ex in exchanges(world):
        plans = [build_plan(ex, r, variant, direction, LAYOUTS[layout]) for r in range(world)]
        sent = sorted((r, c.peer, c.phase) for r, p in enumerate(plans) for c in p.commands()
                      if isinstance(c, Signal))
        waited = sorted((c.peer, r, c.phase) for r, p in enumerate(plans) for c in p.commands()
                        if isinstance(c, Wait))
        assert sent == waited, name
        assert {s[2] for s in sent} <= {READY, DONE}


@pytest.mark.parametrize("world", [2, 3, 5, 8])
@pytest.mark.parametrize("variant,direction", list(itertools.product(VARIANTS, ("push", "pull"))))
def test_every_output_byte_is_written_exactly_once(world, variant, direction):
    """Follow the copies of all ranks: each byte of each rank's output comes from the
    right rank's input, once (symmetric buffers, so no staging)."""
    for name, ex in exchanges(world):
        layout = LAYOUTS["sym"]
        written = {}
        for r in range(world):
            for c in build_plan(ex, r, variant, direction, layout).commands():
                if isinstance(c, Copy) and c.dst.space == "sym" and c.dst.offset >= layout.output_sym:
                    for b in range(c.nbytes):
                        key = (c.dst.rank, c.dst.offset - layout.output_sym + b)
                        assert key not in written, (name, key)
                        written[key] = (c.src.rank, c.src.offset + b)
        for p in range(world):
            for q in range(world):
                if ex.in_place_self and p == q:
                    continue
                for b in range(ex.nbytes[q][p]):
                    src = written[(p, ex.dst[q][p] + b)]
                    assert src[0] == q, name
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
