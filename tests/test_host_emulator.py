"""Every protocol on the host emulator: one process per rank, world sizes 2 to 8."""
import itertools
import time

import pytest
import torch

from dmacoll_lab.verify.check import DTYPES
from dmacoll_lab.verify.check import check_rank as _check_rank
from dmacoll_lab.verify.launch import run_ranks
from dmacoll.plan import VARIANTS
from dmacoll import ops


def _run_check(seed, world, dtypes, counts, syncs=("reset", "epoch"),
               ops=("all_gather", "all_to_all", "all_to_all_v"), signal="memop"):
    args = dict(backend="host", timeout_s=60, variants=VARIANTS, directions=("push", "pull"), dtypes=dtypes,
                counts=counts, ops=ops, seed=seed, syncs=syncs, reference="cpu", signal=signal)
    per_rank = run_ranks(_check_rank, world, args)
    bad = [r for rank in per_rank for r in rank if not r["ok"]]
    assert per_rank[0], f"seed {seed}: no cases ran"
    assert not bad, f"seed {seed}: {bad[:3]}"
    return per_rank[0]


def test_world2_every_dtype_odd_and_power_of_two_sizes(seed):
    results = _run_check(seed, 2, list(DTYPES), [1, 3, 64, 1023, 4096])
    assert {r["dtype"] for r in results} == set(DTYPES)
    assert {r["in_place"] for r in results} == {True, False}
    assert {r["buffers"] for r in results} == {"sym", "private", "alternating", "owned"}  # the last two: lean pipelines
    auto = [r for r in results if r["variant"] == "auto"]  # Communicator() with no options: every op and dtype
    assert {(r["op"], r["dtype"]) for r in auto} == {(r["op"], r["dtype"]) for r in results if r["variant"] != "auto"}


def test_world3(seed):
    _run_check(seed, 3, ["float32", "bfloat16", "int8"], [1, 17, 4096, 300001])


def test_world4(seed):
    _run_check(seed, 4, ["float16", "int64", "bool"], [5, 1024])


@pytest.mark.parametrize("signal", ["copy", "kernel"])
def test_world3_constant_signals(signal, seed):
    results = _run_check(seed, 3, ["bfloat16"], [1, 4096], signal=signal)
    assert {r["sync"] for r in results} == {"reset"}


def test_world8(seed):
    _run_check(seed, 8, ["bfloat16", "uint8"], [3, 256], syncs=("reset",))


def _skip_a_call(rank, world, timeout_s):
    import torch.distributed as dist

    from dmacoll import Communicator, DmaCollError, DmaCollTimeoutError

    comm = Communicator(backend="host", timeout_s=timeout_s)
    x = comm.empty(16, dtype=torch.float32)
    out = comm.empty(16 * world, dtype=torch.float32)
    comm.all_gather(out, x)  # everyone: fine
    report = {}
    if rank == 0:  # rank 1 never makes the second call
        t0 = time.monotonic()
        try:
            comm.all_gather(out, x)
        except DmaCollTimeoutError as e:
            report["error"], report["after_s"] = str(e), time.monotonic() - t0
        try:
            comm.all_gather(out, x)
        except DmaCollError as e:
            report["next_call"] = str(e)
    dist.barrier()
    comm.close()
    return report


def test_missing_peer_ends_in_timeout_error_not_a_hang():
    report = run_ranks(_skip_a_call, 2, 1.0)[0]
    assert 0.9 < report["after_s"] < 5.0
    assert "rank 0: all_gather call #2" in report["error"]
    assert "waited more than 1 s for rank 1 to signal READY" in report["error"]
    assert "unusable after an earlier error" in report["next_call"]


def test_check_cli_prints_closing_line(capsys, seed):
    from dmacoll_lab.cli import main

    rc = main(["check", "--backend", "host", "--world", "2", "--dtypes", "float32", "--counts", "5",
               "--seed", str(seed)])
    out = capsys.readouterr().out
    assert rc == 0, f"seed {seed}: {out[-2000:]}"
    last = out.strip().splitlines()[-1]
    n = int(last.split()[0])
    assert last == f"{n} passed, 0 failed" and n > 0, f"seed {seed}: {last}"


# -- reduce collectives (sum): compared with the exact float64 / int64 sum ----------------------------
REDUCE_OPS = ("reduce_scatter", "all_reduce")
SUMMED = ["float32", "float64", "float16", "bfloat16", "int32", "int64"]


def test_reduce_world2_every_summed_dtype(seed):
    results = _run_check(seed, 2, SUMMED + ["int8", "bool"], [1, 3, 64, 1023], ops=REDUCE_OPS)
    assert {r["dtype"] for r in results} == set(SUMMED)  # int8 and bool are not summed: no cases
    assert {(r["op"], r["in_place"]) for r in results} == {(op, p) for op in REDUCE_OPS for p in (True, False)}
    assert {(r["variant"], r["direction"], r["buffers"], r["sync"]) for r in results} == set(
        itertools.product(VARIANTS, ("push", "pull"), ("sym", "private"), ("reset", "epoch"))) | {
        ("auto", "auto", b, "reset") for b in ("sym", "private")}  # the last: Communicator() with no options


def test_reduce_world3_odd_sizes(seed):
    # all_reduce of 1, 7 and 4099 elements on 3 ranks: uneven chunks, some empty
    _run_check(seed, 3, ["float32", "bfloat16", "int64"], [1, 7, 4099], ops=REDUCE_OPS)


def test_reduce_world4(seed):
    _run_check(seed, 4, ["float16", "int32"], [2, 5, 1024], ops=REDUCE_OPS)


@pytest.mark.parametrize("world", [5, 6, 7])
def test_reduce_worlds_5_to_7(world, seed):
    _run_check(seed, world, ["float32"], [1, world + 1], syncs=("reset",), ops=REDUCE_OPS)


def test_reduce_world8(seed):
    _run_check(seed, 8, ["bfloat16", "int32"], [3, 256], syncs=("reset",), ops=REDUCE_OPS)


@pytest.mark.parametrize("signal", ["copy", "kernel"])
def test_reduce_world3_constant_signals(signal, seed):
    _run_check(seed, 3, ["float32"], [1, 100], ops=REDUCE_OPS, signal=signal)


def _check_two_shot(rank, world, seed):
    """Every all-reduce through the two-exchange algorithm (small sizes take the one-shot one by default)."""
    from dmacoll.ops import all_reduce

    all_reduce.one_shot_all_reduce = lambda nbytes, world: False
    built = []
    two_exchanges = all_reduce.all_reduce_plans
    all_reduce.all_reduce_plans = lambda *a, **k: built.append(1) or two_exchanges(*a, **k)
    args = dict(backend="host", timeout_s=60, variants=list(VARIANTS), directions=["push", "pull"],
                dtypes=["bfloat16", "int32"], counts=[1, 7, 4099], ops=("all_reduce",), seed=seed,
                syncs=["reset", "epoch"], reference="cpu")
    return _check_rank(rank, world, args), len(built)


@pytest.mark.parametrize("world", [2, 3])
def test_two_shot_all_reduce(world, seed):
    per_rank = run_ranks(_check_two_shot, world, seed)
    cases = [r for rows, _ in per_rank for r in rows]
    assert cases and all(r["ok"] for r in cases), f"seed {seed}: {[r for r in cases if not r['ok']][:3]}"
    assert all(built > 0 for _, built in per_rank)  # the two-exchange plans really ran


def _check_with_a_wrong_reduction(rank, world, seed):
    """Every rank's reductions off by one chunk (the slots from one slot later): the check must fail."""
    import dataclasses

    from dmacoll.ops import all_reduce, reduce_scatter
    from dmacoll.plan import Reduce, Ref

    def shifted(build):
        def wrong(*args):
            plans, scratch = build(*args)
            shift = [dataclasses.replace(p, post=tuple(
                dataclasses.replace(c, src=Ref(c.src.space, c.src.rank, c.src.offset + c.nbytes))
                if isinstance(c, Reduce) else c for c in p.post)) for p in plans]
            return tuple(shift), scratch
        return wrong

    reduce_scatter.reduce_scatter_plans = shifted(reduce_scatter.reduce_scatter_plans)
    all_reduce.all_reduce_plans = shifted(all_reduce.all_reduce_plans)
    all_reduce.all_reduce_one_shot_plans = shifted(all_reduce.all_reduce_one_shot_plans)
    args = dict(backend="host", timeout_s=60, variants=["b2b"], directions=["push", "pull"],
                dtypes=["float32", "int32"], counts=[6], ops=REDUCE_OPS, seed=seed, syncs=["reset"],
                reference="cpu")
    return _check_rank(rank, world, args)


def test_an_off_by_one_chunk_is_caught(seed):
    results = run_ranks(_check_with_a_wrong_reduction, 3, seed)
    cases = [r for rank in results for r in rank]
    assert cases and not any(r["ok"] for r in cases), f"seed {seed}: {[r for r in cases if r['ok']][:3]}"
    assert any("exact (float64) sum" in r["error"] for r in cases), f"seed {seed}"  # floats: beyond the tolerance
    assert any("bytes differ from the CPU reference" in r["error"] for r in cases), f"seed {seed}"  # ints: exact


def _reduce_api(rank, world):
    from dmacoll import Communicator

    comm = Communicator(backend="host", timeout_s=30)
    t = torch.arange(10, dtype=torch.float32) + rank
    same = comm.all_reduce(t)  # in place, returns the tensor
    out = torch.empty(5, dtype=torch.int64)
    comm.reduce_scatter(out, torch.arange(5 * world, dtype=torch.int64) * (rank + 1))
    comm.close()
    return same is t, t.tolist(), out.tolist()


def test_reduce_api_in_place_and_reduce_scatter_chunks():
    world = 3
    for rank, (same, summed, scattered) in enumerate(run_ranks(_reduce_api, world)):
        assert same
        assert summed == [float(world * i + sum(range(world))) for i in range(10)]
        assert scattered == [6 * i for i in range(5 * rank, 5 * rank + 5)]  # (1 + 2 + 3) x chunk `rank`


# -- handshake='lean': back-to-back calls into alternating outputs, one flag crossing each --------------
def _pipeline_count(args, i):
    """Pipeline i's count: owned (Communicator.result) sizes grow and shrink, so the buffers grow under them."""
    return args["count"] * (1 + i % 3) if args["owned"] else args["count"]


def _lean_pipelines(rank, world, args):
    from dmacoll import Communicator
    from dmacoll_lab.verify.check import pipeline_buffers, pipeline_ops, run_pipeline

    comm = Communicator(backend="host", timeout_s=30)
    buffers = pipeline_buffers(comm, 1 << 16, 1 << 16)
    results = []
    for i, (op, variant) in enumerate(itertools.product(pipeline_ops(), VARIANTS)):
        errors, lean = run_pipeline(comm, op, variant, args["dtype"], _pipeline_count(args, i), 5,
                                    args["seed"] + 100 * i, late_consumer=True, buffers=buffers, owned=args["owned"])
        results.append((op, variant, errors, lean))
    comm.close()
    return results


@pytest.mark.parametrize("owned", [False, True], ids=["given", "owned"])
@pytest.mark.parametrize("world,dtype,count", [(2, "bfloat16", 1023), (3, "int8", 1), (4, "float32", 64),
                                               (8, "int64", 5)])
def test_lean_handshake_pipelines_are_correct_with_a_late_reader(world, dtype, count, owned, seed):
    """Two given alternating outputs, or the communicator's own (Communicator.result, no promise needed): every
    output right, and every call skips READY with exactly the peers the protocol allows (``skipped_ready``)."""
    from dmacoll_lab.verify.check import pipeline_cases, skipped_ready

    args = dict(dtype=dtype, count=count, seed=seed, owned=owned)
    per_rank = run_ranks(_lean_pipelines, world, args)
    for rank, results in enumerate(per_rank):
        last = None  # the previous pipeline's last call: owned outputs carry its proof into the next pipeline
        for i, (op, variant, errors, lean) in enumerate(results):
            assert errors == [None] * 5, f"seed {seed} rank {rank} {op} {variant}: {errors}"
            cases = pipeline_cases(op, variant, dtype, _pipeline_count(args, i), 5, seed + 100 * i)
            want = skipped_ready(cases, rank, world, last if owned else None)
            assert lean == want, f"seed {seed} rank {rank} {op} {variant}: READY skipped with {lean}, want {want}"
            last = cases[-1]


def _after_a_silent_rank(rank, world, splits):
    from dmacoll import Communicator

    comm = Communicator(backend="host", timeout_s=30)
    x = torch.arange(sum(splits[rank]), dtype=torch.int32) + 100 * rank
    comm.result("all_to_all_v", x, splits)
    got = comm.result("all_gather", torch.full((4,), rank, dtype=torch.int32)).tolist()
    skipped = comm.last_handshake.ready_implied
    comm.close()
    return skipped, got


def test_a_rank_that_exchanged_nothing_vouches_for_no_peer():
    """The issue-31 case: rank 1 sends and receives nothing in an all_to_all_v, so the next (owned, lean) call
    skips READY only between ranks 0 and 2; rank 1 and its peers run the full handshake with each other."""
    splits = [[2, 0, 0], [0, 5, 0], [5, 0, 2]]
    per_rank = run_ranks(_after_a_silent_rank, 3, splits)
    assert [skipped for skipped, _ in per_rank] == [frozenset({2}), frozenset(), frozenset({0})]
    assert all(got == [r for r in range(3) for _ in range(4)] for _, got in per_rank), per_rank


def _reused_output(rank, world, broken_rule, seed):
    from dmacoll import Communicator, InvalidArgument
    from dmacoll_lab.verify.check import run_pipeline

    comm = Communicator(backend="host", timeout_s=30)
    if broken_rule:  # vouch although every call writes the same output
        flags = comm._lean.flags
        comm._lean.flags = lambda spec, opts, ctx, out: flags(spec, opts, ctx, out and (-2, -1))
    try:
        errors, lean = run_pipeline(comm, "all_gather", "pcpy", "float32", 4096, 4, seed, late_consumer=True,
                                    same_output=True)
    except InvalidArgument as e:
        errors, lean = str(e), None
    comm.close()
    return errors, lean


def test_lean_handshake_refuses_a_reused_output_and_the_check_sees_why(seed):
    # a lean call into the previous call's output: a clear error before any copy, on every rank
    for error, _ in run_ranks(_reused_output, 2, False, seed):
        assert "overlaps the previous call's" in error and "handshake='full'" in error
    # control: skipping READY anyway lets the fast rank overwrite what the late one has not read yet
    per_rank = run_ranks(_reused_output, 2, True, seed)
    assert per_rank[0][1][1:] == [frozenset({1})] * 3, f"seed {seed}: {per_rank[0][1]}"
    late_errors = per_rank[1][0]
    assert any(e is not None for e in late_errors), f"seed {seed}: {late_errors}"


def test_every_option_family_of_dmacoll_check_runs_on_the_host(seed):
    """`dmacoll check`'s option families (each signal and wait, multi-op sequences) beside the core grid, each on
    its own communicator, every row right and tagged with its family."""
    from dmacoll.backends.host import HostEngine
    from dmacoll_lab.verify.check import families

    names = [name for name, _ in families(HostEngine.capabilities)]
    assert names == ["signal=copy", "signal=kernel", "wait=spin", "wait=fold", "multi-op", "uneven splits",
                     "random splits"]  # no graphs, no native
    args = dict(backend="host", timeout_s=60, variants=VARIANTS, directions=("push", "pull"), dtypes=["bfloat16"],
                counts=[1, 5], ops=("all_gather", "all_to_all_v", "all_reduce"), seed=seed, syncs=("reset",),
                reference="cpu", signal="memop", families=names)
    per_rank = run_ranks(_check_rank, 3, args)
    bad = [r for rank in per_rank for r in rank if not r["ok"]]
    assert not bad, f"seed {seed}: {bad[:3]}"
    assert {r["family"] for r in per_rank[0]} == {"core (signal=memop, wait=memop, submit=python)", "lean pipelines",
                                                  "defaults", *names}
    sequence = [r for r in per_rank[0] if r["family"] == "multi-op"]
    assert {r["op"] for r in sequence} == set(ops.names()) and all("sequence" in r["buffers"] for r in sequence)


def test_the_sm_path_family_is_offered_where_the_engine_has_the_path():
    from dmacoll.backends import engine_class
    from dmacoll_lab.verify.check import families

    assert [name for name, _ in families(engine_class("cuda").capabilities)][-1] == "path=sm"
    assert "path=sm" not in [name for name, _ in families(engine_class("host").capabilities)]


def test_the_sm_path_family_keeps_the_calls_the_path_takes():
    """Every op at the counts the check runs by default; no in-place all_to_all_v, nothing larger than a slot."""
    from dmacoll_lab.verify.check import cases, numels, sm_cases

    world, slot = 4, 4 << 20
    every = cases(("auto",), ("auto",), ["bfloat16", "int8"], [1, 4099, 1 << 22])
    kept = sm_cases(every, world, slot)
    assert {c.op for c in kept} == set(ops.names())
    assert not [c for c in kept if c.op == "all_to_all_v" and c.in_place]
    too_large = [c for c in every if any(max(numels(c, r, world)) * DTYPES[c.dtype].itemsize > slot
                                         for r in range(world))]
    assert too_large and not set(too_large) & set(kept)
    assert {(c.op, c.dtype, c.in_place) for c in kept if c.count == 4099} == {
        (c.op, c.dtype, c.in_place) for c in every if c.count == 4099 and not (c.op == "all_to_all_v" and c.in_place)}


def _forced_path_rows(rank, world, seed):
    from dmacoll import Communicator
    from dmacoll_lab.verify.check import cases, run_cases

    comm = Communicator(backend="host", timeout_s=30)
    few = cases(("auto",), ("auto",), ["float32"], [3], ops=("all_gather", "all_reduce"), seed=seed)
    try:
        return run_cases(comm, few), run_cases(comm, few, path="sm")
    finally:
        comm.close()


def test_a_row_names_its_path_and_fails_where_the_call_took_another_than_asked(seed):
    for plain, forced in run_ranks(_forced_path_rows, 2, seed):
        assert plain and all(r["ok"] and r["path"] == "dma" for r in plain), f"seed {seed}: {plain}"
        assert all(not r["ok"] and r["error"] == "ran on path 'dma', not 'sm'" for r in forced), f"seed {seed}"


def _multi_op_skipping(rank, world, seed):
    from dmacoll import Communicator
    from dmacoll_lab.verify import check

    real = check.call
    check.call = lambda comm, case, out, inp, counts=None: None if case.op == "all_to_all" else real(
        comm, case, out, inp, counts)
    comm = Communicator(backend="host", timeout_s=30)
    try:
        return check.run_multi_op(comm, "b2b", "push", "float32", 5, seed, graph=False, replays=2)
    finally:
        comm.close()


def test_a_multi_op_sequence_catches_an_op_that_wrote_nothing(seed):
    rows = run_ranks(_multi_op_skipping, 2, seed)[0]
    assert {r["op"]: r["ok"] for r in rows} == {op: op != "all_to_all" for op in ops.names()}, seed
    assert [r["error"] for r in rows if not r["ok"]][0].startswith("pass 1:")
