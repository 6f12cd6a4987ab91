"""The lowered programs' structure: the flag crossings on a call's critical path depend on the handshake, never on
the number of peers (issue 35: a per-call cost that does not grow with the world)."""
import pytest
import torch

from dmacoll import ops
from dmacoll.executor import critical_crossings, lower
from dmacoll.plan import DIRECTIONS, DONE, VARIANTS, Handshake, Layout


def programs(op, world, variant, direction, handshake, signal="memop", wait="memop", sync="reset", count=257):
    """Rank 1's lowered programs of ``op`` on symmetric buffers (so the lean handshake applies)."""
    spec = ops.get(op)
    rank = 1
    n_in, n_out = spec.numels(count, world, rank)
    request = spec.bind(ops.Group(world, rank, torch.device("cpu")), torch.empty(n_out, dtype=torch.bfloat16),
                        torch.empty(n_in, dtype=torch.bfloat16))
    layout = Layout(input_sym=1 << 20, output_sym=2 << 20, staging=4096)
    built, _ = request.build(variant, direction, layout, handshake, 2)
    return [lower(plan, sync, signal, wait) for plan in built], rank


@pytest.mark.parametrize("world", range(2, 9))
@pytest.mark.parametrize("variant", VARIANTS)
def test_crossings_on_the_critical_path_are_the_handshakes_whatever_the_world(world, variant):
    lean = Handshake(frozenset(p for p in range(world) if p != 1), DONE)
    for op in ("all_gather", "all_to_all", "reduce_scatter"):
        for direction in DIRECTIONS:
            for signal, wait, sync in (("memop", "memop", "reset"), ("copy", "spin", "reset"),
                                       ("memop", "memop", "epoch")):
                progs, rank = programs(op, world, variant, direction, Handshake(), signal, wait, sync)
                assert critical_crossings(progs, rank, world) == 2, (op, direction, signal, wait, sync)
        progs, rank = programs(op, world, variant, "push", lean) if op != "reduce_scatter" else (None, None)
        if progs:
            assert critical_crossings(progs, rank, world) == 1, op
    # a two-shot all-reduce is two exchanges back to back; one-shot (small) is one
    big, rank = programs("all_reduce", world, variant, "push", Handshake(), count=4 << 20)
    small, _ = programs("all_reduce", world, variant, "push", Handshake(), count=16)
    assert (critical_crossings(big, rank, world), critical_crossings(small, rank, world)) == (4, 2)


# -- the call_cost probe's GPU-free parts ---------------------------------------------------------------------
from dmacoll_lab.bench.probes import call_cost  # noqa: E402
from dmacoll.executor import Folded  # noqa: E402
from dmacoll.plan import NUM_PHASES  # noqa: E402


def met_in_order(program, world):
    """On the loopback engine (peer p's heap = ours shifted by 4 p bytes), rank 0's signal to p sets the word it
    waits on for p: every wait must come after that signal in an order the streams guarantee (pre before the
    queues, a queue's own order, the queues before post)."""
    def keys(steps, wait):
        for step in steps:
            for op in (step.waits if type(step) is Folded else step if type(step) is tuple else ()):
                if op.wait == wait and (wait or op.rank != 0):
                    yield (op.index // world % NUM_PHASES, op.index % world if wait else op.rank)

    def prefix_ok(before: set, steps) -> bool:
        seen = set(before)
        for step in steps:
            ops = step.waits if type(step) is Folded else step if type(step) is tuple else ()
            for op in ops:
                if not op.wait and op.rank != 0:
                    seen.add((op.index // world % NUM_PHASES, op.rank))
                elif op.wait and (op.index // world % NUM_PHASES, op.index % world) not in seen:
                    return False
        return True

    pre = set(keys(program.pre, False))
    every_queue = pre | {k for q in program.queues for k in keys(q, False)}
    return (prefix_ok(set(), program.pre) and all(prefix_ok(pre, q) for q in program.queues)
            and prefix_ok(every_queue, program.post))


@pytest.mark.parametrize("world", (2, 4, 8))
def test_the_loopback_engine_meets_every_wait_with_the_calls_own_signal(world):
    for variant in VARIANTS:
        for handshake in ("full", "lean"):
            for signal, wait in (("memop", "memop"), ("copy", "spin"), ("kernel", "spin"), ("kernel", "memop")):
                program, _ = call_cost.structure_program(world, 1024, variant, handshake, signal, wait)
                assert met_in_order(program, world), (variant, handshake, signal, wait)
                assert critical_crossings([program], 0, world) == (2 if handshake == "full" else 1)


@pytest.mark.parametrize("world", (2, 4, 8))
def test_the_floors_have_the_crossings_they_are_named_for(world):
    for name, crossings in call_cost.FLOORS.items():
        for rank in range(world):
            programs = [lower(p) for p in call_cost.floor_plans(rank, world, crossings, 4096, 8192, 1024)]
            assert critical_crossings(programs[:1], rank, world) == crossings, name
            copies = [s for p in programs for q in (p.pre, *p.queues, p.post) for s in q if not isinstance(s, tuple)]
            assert [c.dst.rank for c in copies] == [(rank + 1) % world] * len(programs)  # one peer copy a call


def test_the_probe_summarises_its_counts():
    from collections import Counter

    assert call_cost.node_summary(Counter({"CU_GRAPH_NODE_TYPE_MEMCPY": 4, "CU_GRAPH_NODE_TYPE_BATCH_MEM_OP": 2})) \
        == "batch_mem_op:2 memcpy:4"
    assert call_cost.quantiles([5.0, 1.0, 3.0, 2.0, 4.0]) == (3.0, 1.0, 5.0)
    r = call_cost.row("shared", 4, "b2b", "lean", "memop", "memop", "graph", 1024, [2.0, 1.0, 3.0], crossings=1)
    assert set(r) == set(call_cost.COLUMNS) and r["per_call_us"] == 2.0 and r["crossings"] == 1
