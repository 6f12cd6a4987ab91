"""wait='spin' and wait='fold': how they lower, what the cuda engine issues for them, their kernels' source, and
every collective through them on the host emulator (worlds 2-8)."""
from types import SimpleNamespace

import pytest

from dmacoll.backends import cuda as cuda_backend
from dmacoll.backends import cubins, cuda_kernels
from dmacoll.ops import get, names
from dmacoll.executor import Folded, MemOp, execute, flag_index, lower
from dmacoll.plan import (DONE, READY, VARIANTS, Layout, Reduce, Ref, all_gather_exchange, all_reduce_one_shot_plans,
                          build_plan, reduce_scatter_plans)
from dmacoll_lab.verify.check import check_rank
from dmacoll_lab.verify.launch import run_ranks
from tests.test_cuda_commands import HEAPS, FakeDriver, flag

LAYOUT = Layout(input_sym=8192, output_sym=16384, staging=512)


def _memops(program):
    return [op for part in (program.pre, *program.queues, program.post) for step in part if type(step) is tuple
            for op in step]


def _folded(program):
    return [step for part in (program.pre, *program.queues, program.post) for step in part
            if isinstance(step, Folded)]


@pytest.mark.parametrize("variant", VARIANTS)
def test_spin_waits_rearm_their_words_themselves(variant):
    plan = build_plan(all_gather_exchange(3, 256), 1, variant, "push", LAYOUT)
    ops = _memops(lower(plan, "reset", "copy", "spin"))
    waits = [op for op in ops if op.wait]
    assert waits and all(op.via == "spin" for op in waits)
    assert not [op for op in ops if not op.wait and op.rank == 1]  # no re-arming write of our own words
    assert all(op.via == "copy" for op in ops if not op.wait)  # the signals are the signal mode's


@pytest.mark.parametrize("world,variant", [(2, "pcpy"), (3, "b2b"), (4, "multi"), (5, "pcpy")])
def test_fold_takes_each_slots_done_wait_into_the_sum_in_slot_order(world, variant):
    rank = world - 1
    (plan,), _ = reduce_scatter_plans(world, 64, rank, "bfloat16", variant, "push", LAYOUT)
    program = lower(plan, "reset", "memop", "fold")
    (folded,) = _folded(program)
    senders = [(rank + 1 + i) % world for i in range(world - 1)]  # slot i: scatter_exchange's sender
    assert folded.reduce.senders == tuple(senders)
    assert [op.index for op in folded.waits] == [flag_index(world, "reset", DONE, s) for s in senders]
    assert all(op.wait and op.via == "spin" for op in folded.waits)
    done_words = {flag_index(world, "reset", DONE, s) for s in senders}
    assert not [op for op in _memops(program) if op.wait and op.index in done_words]  # waited for once only


def test_fold_leaves_pulls_and_exchanges_alone():
    (pull,), _ = reduce_scatter_plans(3, 64, 0, "float32", "pcpy", "pull", LAYOUT)
    assert pull.post[-1].senders is None  # our own copies fill the slots: no flag says they arrived
    assert not _folded(lower(pull, "reset", "memop", "fold"))
    gather = build_plan(all_gather_exchange(3, 64), 0, "pcpy", "push", LAYOUT)
    assert not _folded(lower(gather, "reset", "memop", "fold"))
    (one_shot,), _ = all_reduce_one_shot_plans(64, 3, 0, "float32", "b2b", "push", LAYOUT)
    assert len(_folded(lower(one_shot, "epoch", "memop", "fold"))) == 1


def test_kernel_signals_take_any_wait_and_unknown_waits_are_refused():
    plan = build_plan(all_gather_exchange(2, 64), 0, "b2b", "push", LAYOUT)
    ops = _memops(lower(plan, "reset", "kernel", "spin"))  # kernel signals write dmacoll's words: spin polls them
    assert {(op.wait, op.via) for op in ops} == {(False, "kernel"), (True, "spin")}
    with pytest.raises(ValueError, match="unknown wait mode"):
        lower(plan, "reset", "memop", "poll")


# -- the cuda engine's commands (fake driver, recorded kernel launches) -------------------------------------
class FakeKernels:
    def __init__(self, calls, rearm=True):
        self.calls, self.rearm = calls, rearm

    def spin(self, stream, flags, indices, value, geq):
        self.calls.append(("spin", flags, tuple(indices), value, geq, stream))

    def fold(self, stream, dtype, slots, own, out, numel, count, flags, indices, value, geq):
        self.calls.append(("fold", dtype, slots, own, out, numel, count, flags, tuple(indices), value, geq, stream))
        return self.rearm

    def sum(self, stream, dtype, itemsize, slots, own, out, numel, count):
        self.calls.append(("sum", dtype, itemsize, slots, own, out, numel, count, stream))


@pytest.fixture
def engine(monkeypatch):
    drv = FakeDriver()
    monkeypatch.setattr(cuda_backend, "_drv", drv)
    eng = cuda_backend.CudaEngine.for_commands(0, 2, HEAPS, SimpleNamespace(cuda_stream=7))
    eng._kernels = FakeKernels(drv.calls)
    eng.drv = drv
    return eng


def test_spin_waits_are_one_polling_kernel_behind_the_signals(engine):
    plan = build_plan(all_gather_exchange(2, 512, in_place=True), 0, "b2b", "push",
                      Layout(input_sym=4096, output_sym=4096, staging=512))
    execute(plan, engine, {}, "reset", signal="copy", wait="spin")
    one = HEAPS[0] + 4 * cuda_backend.one_index(2)
    assert engine.drv.calls == [
        ("copy", flag(1, "reset", READY, 0), one, 4, 7),
        ("spin", HEAPS[0], (flag_index(2, "reset", READY, 1),), 1, False, 7),  # re-arms the word itself
        ("copy", HEAPS[1] + 4096, HEAPS[0] + 4096, 512, 7),
        ("copy", flag(1, "reset", DONE, 0), one, 4, 7),
        ("spin", HEAPS[0], (flag_index(2, "reset", DONE, 1),), 1, False, 7),
    ]


@pytest.mark.parametrize("rearm", [True, False])
def test_fold_is_one_kernel_after_the_signals(engine, rearm):
    engine._kernels.rearm = rearm
    (plan,), scratch = reduce_scatter_plans(2, 16, 0, "bfloat16", "b2b", "push", LAYOUT)
    execute(plan, engine, {}, "reset", wait="fold")
    done = flag_index(2, "reset", DONE, 1)
    fold = ("fold", "bfloat16", HEAPS[0] + scratch.recv, HEAPS[0] + 8192, HEAPS[0] + 16384, 8, 1, HEAPS[0], (done,),
            1, False, 7)
    tail = [fold] if rearm else [fold, ("write", HEAPS[0] + 4 * done, 0, 7)]  # several blocks: re-armed after
    assert engine.drv.calls[-len(tail):] == tail
    assert ("write", flag(1, "reset", DONE, 0), 1, 7) in engine.drv.calls  # our DONE went to the peer before


def test_memop_waits_then_one_sum_kernel(engine):
    (plan,), scratch = reduce_scatter_plans(2, 16, 0, "bfloat16", "b2b", "push", LAYOUT)
    execute(plan, engine, {}, "reset", wait="memop")
    assert engine.drv.calls[-1] == ("sum", "bfloat16", 2, HEAPS[0] + scratch.recv, HEAPS[0] + 8192, HEAPS[0] + 16384,
                                    8, 1, 7)


def test_sums_fall_back_to_torch_where_the_kernels_cannot_be_built(engine, monkeypatch):
    summed = []
    monkeypatch.setattr(cuda_backend, "reduce_step", lambda queue, step, *rest: summed.append(step))

    def refuse():
        raise cuda_backend.BackendUnavailable("NVRTC is needed")
    monkeypatch.setattr(engine, "kernels", refuse)
    r = Reduce(Ref("sym", 0, 0), Ref("sym", 0, 4096), 64, 1, "float32")
    with pytest.warns(UserWarning, match="torch's kernels"):
        engine.reduce(engine.main_queue, r, {})
    engine.reduce(engine.main_queue, r, {})  # said once; no second attempt to build
    engine.reduce(engine.main_queue, Reduce(Ref("sym", 0, 0), Ref("sym", 0, 4096), 64, 1, "int8"), {})
    assert len(summed) == 3 and engine._no_kernels


def test_large_folds_wait_in_a_spin_kernel_and_sum_with_the_full_grid(engine, monkeypatch):
    summed = []
    monkeypatch.setattr(engine, "reduce", lambda queue, step, bases: summed.append(step))
    numel = cuda_kernels.FOLD_MAX_BLOCKS * cuda_kernels.FOLD_MAX_TILES * cuda_kernels.THREADS * cuda_kernels.ITEMS
    waits = (MemOp(True, 0, 3, 1, via="spin"),)
    for n, folded in ((numel, True), (numel + 1, False)):
        engine.drv.calls.clear()
        r = Reduce(Ref("sym", 0, 0), Ref("sym", 0, 4 * n), 4 * n, 1, "float32", None, (1,))
        engine.folded_reduce(engine.main_queue, Folded(r, waits), {})
        assert [c[0] for c in engine.drv.calls][:1] == (["fold"] if folded else ["spin"])
        assert summed == ([] if folded else [r])


def test_sum_launches_take_vectors_where_every_address_is_whole_vectors():
    assert cuda_kernels.sum_launch(1 << 20, 2, [0, 16, 4096]) == (-(-(1 << 17) // cuda_kernels.SUM_THREADS), True)
    assert cuda_kernels.sum_launch(1 << 30, 2, [0, 16]) == (cuda_kernels.SUM_MAX_BLOCKS, True)
    assert cuda_kernels.sum_launch(7, 2, [0, 16]) == (1, False)        # 14 bytes: not whole vectors
    assert cuda_kernels.sum_launch(8, 2, [0, 18]) == (1, False)        # an address off the vector grid
    assert cuda_kernels.sum_launch(1000, 8, [0, 16]) == (2, True)      # 500 vectors of two float64


def test_fold_falls_back_to_a_spin_and_the_sum_beyond_one_launch(engine, monkeypatch):
    summed = []
    monkeypatch.setattr(engine, "reduce", lambda queue, step, bases: summed.append(step))
    waits = tuple(MemOp(True, 0, i, 1, via="spin") for i in range(cuda_kernels.MAX_WAITS + 1))
    r = Reduce(Ref("sym", 0, 0), Ref("sym", 0, 4096), 64, len(waits), "float32", None, tuple(range(1, 10)))
    engine.folded_reduce(engine.main_queue, Folded(r, waits), {})
    assert [c[0] for c in engine.drv.calls] == ["spin"] and summed == [r]


# -- the kernels' source and launch arguments --------------------------------------------------------------
def test_indices_pack_sixteen_bits_each_and_refuse_more_than_a_launch_holds():
    lo, hi = cuda_kernels.pack([1, 2, 3, 4, 5])
    assert [(lo >> 16 * k) & 0xFFFF for k in range(4)] == [1, 2, 3, 4] and hi == 5
    with pytest.raises(ValueError):
        cuda_kernels.pack(range(cuda_kernels.MAX_WAITS + 1))
    with pytest.raises(ValueError):
        cuda_kernels.pack([1 << 16])


def test_fold_grids_grow_with_the_size_up_to_the_cap():
    tile = cuda_kernels.THREADS * cuda_kernels.ITEMS
    assert [cuda_kernels.fold_grid(n) for n in (1, tile, tile + 1, 10 ** 9)] == [1, 1, 2, cuda_kernels.FOLD_MAX_BLOCKS]


def test_launch_arguments_match_the_kernels_parameters():
    launches = []

    class Drv:
        def cuLaunchKernel(self, fn, gx, gy, gz, bx, by, bz, shared, stream, args, extra):
            launches.append((fn, gx, bx, stream, args))
            return (0,)

    k = object.__new__(cuda_kernels.Kernels)
    k._drv, k._check = Drv(), lambda result, what: result[1:]
    k.spin_fn, k.fold_fns = "spin", {d: d for d in cuda_kernels.FOLD_TYPES}
    k.spin(5, 0x1000, list(range(10)), 7, True)  # two launches: 8 words, then 2
    assert [(a[1], a[2], a[4][0][1]) for a in launches] == [(1, 1, 8), (1, 1, 2)]
    rearm = k.fold(5, "float16", 1, None, 3, 10 ** 6, 3, 0x1000, [4, 5, 6], 1, False)
    values, types = launches[-1][4]
    assert rearm is False and launches[-1][1] == cuda_kernels.FOLD_MAX_BLOCKS and values[1] == 0 and values[-1] == 0
    assert len(values) == len(types) == 11
    k.sum_fns = {d: d for d in cuda_kernels.FOLD_TYPES}
    k.sum(5, "bfloat16", 2, 0x100, None, 0x200, 10 ** 6, 3)
    values, types = launches[-1][4]
    assert launches[-1][2] == cuda_kernels.SUM_THREADS and values == (0x100, 0, 0x200, 10 ** 6, 3, 1)
    assert len(values) == len(types) == 6
    for name in ("dmacoll_spin(", *(f"dmacoll_{kind}_{d}(" for d in cuda_kernels.FOLD_TYPES
                                    for kind in ("fold", "sum"))):
        assert name in cuda_kernels.source()


def test_the_kernels_compile_with_nvrtc():
    pytest.importorskip("cuda.bindings.nvrtc", reason="NVRTC (cuda-bindings) is not installed here")
    try:
        cubin = cubins.compile_program(cuda_kernels.source(), "dmacoll_kernels.cu", "sm_90")
    except cuda_backend.BackendUnavailable as e:
        if "NVRTC" in str(e) and "compile" not in str(e):
            pytest.skip(f"NVRTC cannot run here: {e}")
        raise
    assert len(cubin) > 1000


# -- every collective through the waits, on the host emulator ------------------------------------------------
@pytest.mark.parametrize("world,wait,signal", [(2, "fold", "memop"), (3, "spin", "copy"), (4, "fold", "copy"),
                                               (6, "spin", "memop"), (8, "fold", "memop")])
def test_every_collective_is_right_through_the_waits(world, wait, signal, seed):
    args = dict(backend="host", timeout_s=60, variants=VARIANTS, directions=("push", "pull"),
                dtypes=["float32", "bfloat16", "int64"], counts=[1, world + 2], ops=names(), seed=seed,
                syncs=("reset", "epoch") if signal == "memop" else ("reset",), reference="cpu", signal=signal,
                wait=wait)
    if world > 4:
        args.update(dtypes=["bfloat16"], counts=[3])
    per_rank = run_ranks(check_rank, world, args)
    bad = [r for rank in per_rank for r in rank if not r["ok"]]
    assert per_rank[0] and not bad, f"seed {seed}: {bad[:3]}"
    assert {r["op"] for r in per_rank[0]} >= {"reduce_scatter", "all_reduce", "all_gather"}, f"seed {seed}"


# -- the sweep measures the waits where they apply ------------------------------------------------------------
def test_sweep_points_offer_spin_everywhere_and_fold_where_there_is_a_sum():
    from dmacoll_lab.bench.sweep import SweepConfig, points

    cfg = SweepConfig(ops=names(), variants=("b2b",), directions=("push",), places=("out",),
                      signals=("memop", "kernel"), waits=("memop", "spin", "fold"), submit=("python", "native"))
    for op in names():
        dma = [p for p in points(cfg, op, 2) if p.impl == "dma"]
        waits = {(s, sub): sorted({p.wait for p in dma if (p.signal, p.submit) == (s, sub)})
                 for s, sub in {(p.signal, p.submit) for p in dma}}
        every = ["fold", "memop", "spin"] if get(op).reduces else ["memop", "spin"]
        assert waits[("memop", "python")] == every and waits[("kernel", "python")] == every  # kernel: any wait
        assert waits[("memop", "native")] == ["memop"]


def test_a_host_sweep_through_the_waits_checks_every_point(tmp_path):
    import pandas as pd

    from dmacoll_lab.bench.sweep import SweepConfig, run_sweep

    out = tmp_path / "sweep" / "data.csv"
    cfg = SweepConfig(ops=("all_gather", "reduce_scatter", "all_reduce"), impls=("dma",), variants=("b2b",),
                      directions=("push",), places=("out",), signals=("copy",), waits=("spin", "fold"),
                      min_bytes=1 << 10, max_bytes=1 << 10, modes=("eager",), calls=2, repeats=2, warmup=1,
                      out=str(out))
    run_ranks(run_sweep, 3, cfg, timeout_s=300)
    df = pd.read_csv(out)
    assert set(zip(df["op"], df["wait"])) == {("all_gather", "spin"), ("reduce_scatter", "spin"),
                                              ("reduce_scatter", "fold"), ("all_reduce", "spin"),
                                              ("all_reduce", "fold")}
    assert (df["status"] == "ok").all() and df["correct"].all()


def test_options_refuse_waits_a_backend_or_mode_cannot_run():
    from dmacoll.backends.cuda import CudaEngine
    from dmacoll.backends.hip import HipEngine
    from dmacoll.backends.host import HostEngine
    from dmacoll.errors import InvalidArgument
    from dmacoll.options import Options, resolve

    assert resolve(Options(wait="fold", signal="copy"), HostEngine.capabilities).wait == "fold"
    assert resolve(Options(wait="spin", signal="kernel"), CudaEngine.capabilities).wait == "spin"  # any wait
    for options, engine, why in ((Options(wait="spin"), HipEngine, "hip"),
                                 (Options(wait="fold", submit="native"), CudaEngine, "submit='native'"),
                                 (Options(wait="spin", signal="kernel"), HipEngine, "hip"),
                                 (Options(wait="poll"), CudaEngine, "wait='poll'")):
        with pytest.raises(InvalidArgument, match=why):
            resolve(options, engine.capabilities)
