"""``options.resolve``, the one place a call's options are checked and 'auto' chosen: every rule it enforces, on the
CPU, from capabilities records alone (no engine, no ranks); then the communicator's side of it (the API that
carries options, the cache per call shape)."""
import ast
import dataclasses
import inspect
import typing
from pathlib import Path

import pytest

from dmacoll import ops, tuning
from dmacoll.errors import InvalidArgument
from dmacoll.options import (CALL_OPTIONS, COPY_ENGINE_OPTIONS, DMA_AUTO_MIN_BYTES, EAGER_ALL_REDUCE_SM_MAX_BYTES,
                             FALLBACK, SM_AUTO_MAX_BYTES, Call, CallOptions, EngineCapabilities, Options, allowed,
                             candidates, choices, choose_path, fallback, nccl_auto, resolve, sm_auto_max_bytes)
from dmacoll_lab.verify.launch import run_ranks

CUDA = EngineCapabilities("cuda")
HOST = EngineCapabilities("host", graphs=False, native_submit=False, sm_path=False)
HIP = EngineCapabilities("hip", native_submit=False, kernel_signals=False, spin_waits=False, sm_path=False)
REFUSING = dataclasses.replace(CUDA, remote_memop_writes=False, memop_refusal="the driver refuses memop writes")
EAGER = Call("all_gather", 4096, False, capturing=False)
CAPTURED = EAGER._replace(capturing=True)


def _table(*rows) -> tuning.TuningTable:
    return tuning.TuningTable({}, [tuning.Entry(*row) for row in rows])


def _refused(options: Options, capabilities=CUDA, call=None) -> str:
    with pytest.raises(InvalidArgument) as e:
        resolve(options, capabilities, call)
    return str(e.value)


# -- legality ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,value", [("variant", "bcst"), ("direction", "sideways"), ("sync", "auto"),
                                        ("signal", "fence"), ("submit", "c++"), ("handshake", "none"),
                                        ("wait", "poll"), ("prerecord", 1), ("prerecord", "yes"), ("path", "cores"),
                                        ("variant", True), ("wait", None)])
def test_a_value_outside_its_list_is_refused_with_the_list(name, value):
    assert f"{name}={value!r} is not one of" in _refused(Options(**{name: value}))


@pytest.mark.parametrize("engines", [0, 17, True, 2.0, "2"])
def test_engines_must_be_a_count_of_queues(engines):
    assert "engines must be between 1 and 16" in _refused(Options(engines=engines))


@pytest.mark.parametrize("options,capabilities,fragment", [
    (Options(signal="copy", sync="epoch"), CUDA, "signal='copy' sends a constant 1: it needs sync='reset'"),
    (Options(signal="kernel", sync="epoch"), CUDA, "signal='kernel' sends a constant 1"),
    (Options(signal="kernel"), HIP, "on backend='hip' use signal='memop' or 'copy'"),
    (Options(submit="native"), HOST, "submit='native' issues CUDA driver calls: it needs backend='cuda', not 'host'"),
    (Options(submit="native", signal="kernel"), CUDA, "submit='native' issues driver calls only: use signal="),
    (Options(wait="spin"), HIP, "wait='spin' runs CUDA kernels; on backend='hip' use wait='memop'"),
    (Options(path="sm"), HOST, "path='sm' runs dmacoll's CUDA kernels; on backend='host' use path='dma'"),
    (Options(path="sm"), HIP, "on backend='hip' use path='dma'"),
    (Options(wait="fold", submit="native"), CUDA, "wait='fold' launches a kernel: use wait='memop'"),
    (Options(wait="spin", submit="native"), CUDA, "wait='spin' launches a kernel"),
    (Options(sync="epoch"), REFUSING, "sync='epoch' sends sequence numbers as stream-memop writes to peers, and "
                                      "the driver refuses memop writes; use sync='reset'"),
    (Options(sync="epoch", signal="memop"), REFUSING, "sync='epoch' sends sequence numbers"),
])
def test_combinations_an_engine_cannot_run_are_refused_before_any_call(options, capabilities, fragment):
    assert fragment in _refused(options, capabilities)  # no call: what a communicator checks when it is created


def test_what_each_engine_runs_passes():
    for options, capabilities in ((Options(wait="fold", signal="copy"), HOST),
                                  (Options(wait="spin", signal="kernel"), CUDA),  # kernel signals: any wait
                                  (Options(signal="kernel"), HOST),  # emulated
                                  (Options(submit="native", signal="copy", wait="memop"), CUDA),
                                  (Options(sync="epoch", signal="memop"), CUDA),
                                  (Options(sync="epoch", signal="memop"), HOST)):
        assert resolve(options, capabilities) == options


def test_the_engines_state_their_capabilities():
    from dmacoll.backends.cuda import CudaEngine
    from dmacoll.backends.hip import HipEngine
    from dmacoll.backends.host import HostEngine

    assert (CudaEngine.capabilities, HostEngine.capabilities, HipEngine.capabilities) == (CUDA, HOST, HIP)


# -- the data path -------------------------------------------------------------------------------------------------
def test_auto_takes_the_sm_path_for_small_calls_that_fit_it():
    assert choose_path(Options(), CUDA, "all_reduce", 1024, 4) == "sm"
    assert choose_path(Options(), CUDA, "all_reduce", SM_AUTO_MAX_BYTES, 4) == "sm"
    assert choose_path(Options(), CUDA, "all_reduce", SM_AUTO_MAX_BYTES + 16, 4) == "dma"  # larger: the copy engines
    assert choose_path(Options(), CUDA, "all_reduce", SM_AUTO_MAX_BYTES + 16, 2) == "sm"  # world 2: twice as much
    assert choose_path(Options(), CUDA, "all_reduce", 2 * SM_AUTO_MAX_BYTES + 16, 2) == "dma"
    assert choose_path(Options(), CUDA, "all_to_all", SM_AUTO_MAX_BYTES + 16, 2) == "dma"  # slower there on sm
    assert choose_path(Options(), CUDA, "all_reduce", None, 4) == "dma"  # an op, dtype or size the sm path cannot run
    # prelaunched calls run on the copy engines
    assert choose_path(Options(), CUDA, "all_reduce", 1024, 4, gated=True) == "dma"
    assert choose_path(Options(), HOST, "all_reduce", 1024, 4) == "dma"
    assert choose_path(Options(), HIP, "all_reduce", 1024, 4) == "dma"


@pytest.mark.parametrize("name", COPY_ENGINE_OPTIONS)
def test_a_copy_engine_option_named_by_the_caller_keeps_auto_on_the_copy_engines(name):
    value = {"variant": "b2b", "direction": "pull", "signal": "copy", "wait": "spin", "prerecord": False,
             "submit": "python"}[name]
    assert choose_path(Options(**{name: value}), CUDA, "all_reduce", 1024, 4) == "dma"


def test_above_the_sm_path_auto_takes_nccl_unless_the_copy_engines_were_measured_faster():
    def path(op, world, nbytes, sm_bytes=None, nccl=True, options=Options()):
        return choose_path(options, CUDA, op, sm_bytes, world, False, nbytes, nccl)

    for op in ("reduce_scatter", "all_reduce"):  # the copy engines' sums win only at the largest sizes
        for world in (2, 4):
            assert path(op, world, DMA_AUTO_MIN_BYTES[world, op] - 1) == "nccl"
            assert path(op, world, DMA_AUTO_MIN_BYTES[world, op]) == "dma"
        assert path(op, 4, 64 << 20) == "nccl"
    # a copy-engine sum whose chunks would not fit the staging area: NCCL, but only where 'auto' chose by size
    assert choose_path(Options(), CUDA, "all_reduce", None, 2, False, 64 << 20, True, staged=False) == "nccl"
    assert choose_path(Options(variant="b2b"), CUDA, "all_reduce", None, 2, False, 64 << 20, True, False) == "dma"
    assert choose_path(Options(), CUDA, "all_reduce", None, 2, True, 64 << 20, True, staged=False) == "dma"
    assert choose_path(Options(), CUDA, "all_reduce", None, 2, False, 64 << 20, False, staged=False) == "dma"
    assert path("all_gather", 2, 16 << 20) == "dma"  # world 2: the copy engines win at every size
    assert path("all_gather", 4, 8 << 20) == "nccl"
    assert path("all_gather", 4, DMA_AUTO_MIN_BYTES[4, "all_gather"]) == "dma"
    assert path("all_to_all", 4, DMA_AUTO_MIN_BYTES[4, "all_to_all"] - 1) == "nccl"
    assert path("all_to_all", 2, DMA_AUTO_MIN_BYTES[2, "all_to_all"]) == "dma"
    assert path("all_gather", 8, 1 << 30) == "nccl"  # a world without measurements: the baseline
    assert path("all_to_all_v", 4, 64 << 20) == "dma"  # the MoE dispatch stays on the copy engines
    assert path("all_reduce", 4, 1 << 20, sm_bytes=1 << 18) == "sm"  # the sm path first
    assert path("all_reduce", 4, 64 << 20, nccl=False) == "dma"  # a group without NCCL (ranks sharing a GPU, gloo)
    assert path("all_reduce", 4, 64 << 20, options=Options(variant="b2b")) == "dma"  # a copy-engine option
    assert choose_path(Options(), CUDA, "all_reduce", None, 4, True, 64 << 20, True) == "dma"  # prelaunched
    assert choose_path(Options(), HOST, "all_reduce", None, 4, False, 64 << 20, False) == "dma"
    assert not nccl_auto(4, "broadcast", 1 << 20)


def test_all_to_all_leaves_the_sm_path_at_2_mb_per_peer_at_world_4():
    assert sm_auto_max_bytes(4, "all_to_all") == 2 << 20 < sm_auto_max_bytes(4, "all_gather")
    assert sm_auto_max_bytes(2, "all_to_all") == SM_AUTO_MAX_BYTES < sm_auto_max_bytes(2, "all_reduce")


@pytest.mark.parametrize("world", [2, 4])
def test_an_eager_all_reduce_takes_the_sm_path_up_to_8_mb(world):
    def path(op: str, nbytes: int, eager: bool) -> str:
        sm_bytes = nbytes if world == 2 and nbytes <= 8 << 20 else nbytes // world  # one kernel, or a two-shot chunk
        return choose_path(Options(), CUDA, op, sm_bytes, world, nbytes=nbytes, nccl=True, eager=eager)

    assert EAGER_ALL_REDUCE_SM_MAX_BYTES == 8 << 20
    for nbytes in (1 << 20, 8 << 20, 16 << 20):
        assert path("all_reduce", nbytes, eager=False) == "sm"  # graph-replayed, as far as the sm path goes
        assert path("all_reduce", nbytes, eager=True) == ("sm" if nbytes <= 8 << 20 else "nccl")
    assert path("reduce_scatter", 16 << 20, eager=True) == "sm"  # only the sum's two kernels lost in eager calls


def test_a_named_path_is_taken_as_it_is():
    assert choose_path(Options(path="nccl"), CUDA, "all_reduce", 1024, 4) == "nccl"
    assert choose_path(Options(path="dma"), CUDA, "all_reduce", 1024, 4) == "dma"
    # the communicator refuses it
    assert choose_path(Options(path="sm", variant="b2b"), CUDA, "all_reduce", 1 << 30, 4) == "sm"


def test_epoch_cannot_be_captured_and_prerecording_needs_reset():
    epoch = Options(sync="epoch", signal="memop")
    assert "sync='epoch' bakes sequence numbers into a CUDA graph" in _refused(epoch, CUDA, CAPTURED)
    assert "prerecord=True replays a CUDA graph: it needs sync='reset'" in _refused(
        dataclasses.replace(epoch, prerecord=True), CUDA, EAGER)
    assert resolve(dataclasses.replace(epoch, prerecord=True), HOST, EAGER).prerecord is True  # no graphs: no replay
    # a prerecorded communicator may be captured: the capture records the call (the communicator does not prerecord)
    fixed = Options("pcpy", "push", signal="copy", wait="memop", prerecord=True, submit="python")
    assert resolve(fixed, CUDA, CAPTURED) == fixed


def test_memop_flags_travel_as_copies_where_the_driver_refuses_them():
    fixed = Options("pcpy", "push", signal="memop", wait="memop", prerecord=False, submit="python")
    assert resolve(fixed, CUDA, EAGER).signal == "memop"
    assert resolve(fixed, REFUSING).signal == "copy"
    assert resolve(fixed, REFUSING, EAGER).signal == "copy"
    assert resolve(dataclasses.replace(fixed, signal="kernel"), REFUSING, EAGER).signal == "kernel"
    table = _table(("all_gather", "eager", "out", 1 << 20, "b2b", "pull", 1.0, "memop"),
                   ("all_gather", "eager", "out", 1 << 20, "multi", "push", 9.0, "copy"))
    assert _chosen(resolve(Options(), CUDA, EAGER, table))[:2] == ("b2b", "pull")
    got = resolve(Options(), REFUSING, EAGER, table)
    assert (got.variant, got.direction, got.signal) == ("multi", "push", "copy")  # memop rows are not candidates


# -- choice -----------------------------------------------------------------------------------------------------
def _chosen(options: Options) -> tuning.Choice:
    return tuning.Choice(*(getattr(options, name) for name in tuning.Choice._fields))


def test_auto_takes_the_fastest_entry_the_call_may_use():
    table = _table(("all_gather", "eager", "out", 1024, "b2b", "pull", 1.0, "memop", "spin"),
                   ("all_gather", "eager", "out", 8192, "b2b", "pull", 5.0, "memop", "spin"),
                   ("all_gather", "eager", "out", 8192, "multi", "push", 2.0, "copy", "memop", True),
                   ("all_gather", "eager", "out", 8192, "pcpy", "pull", 3.0, "memop", "memop", False, "native"),
                   ("all_gather", "graph", "out", 8192, "b2b", "push", 1.0, "copy"))
    assert _chosen(resolve(Options(), CUDA, EAGER, table)) == ("multi", "push", "copy", "memop", True, "python")
    assert _chosen(resolve(Options(), CUDA, EAGER._replace(nbytes=512), table)) == (
        "b2b", "pull", "memop", "spin", False, "python")
    assert _chosen(resolve(Options(), CUDA, CAPTURED, table)) == ("b2b", "push", "copy", "memop", False, "python")
    # a fixed option narrows the choice to its value; the others stay the table's
    assert _chosen(resolve(Options(signal="memop"), CUDA, EAGER, table))[:2] == ("pcpy", "pull")
    pinned = resolve(Options(variant="b2b"), CUDA, EAGER, table)
    assert (pinned.variant, pinned.direction) == ("b2b", "push")  # multi's row, with the caller's variant
    # where the native library does not load, 'auto' does not choose it
    unloadable = dataclasses.replace(CUDA, native_available=False)
    assert resolve(Options(signal="memop"), unloadable, EAGER, table).submit == "python"
    # the options 'auto' does not choose are the caller's
    lean = resolve(Options(handshake="lean", engines=4), CUDA, EAGER, table)
    assert (lean.handshake, lean.engines, lean.sync) == ("lean", 4, "reset")


def test_all_to_all_v_is_looked_up_by_its_tuning_op_and_in_place_falls_back_to_out_of_place_rows():
    table = _table(("all_to_all", "eager", "out", 1024, "b2b", "pull", 1.0))
    call = Call(ops.get("all_to_all_v").tuning_op, 100, True, False)
    assert resolve(Options(), HOST, call, table).variant == "b2b"


def test_a_reduction_without_rows_chooses_from_all_to_all_s():
    table = _table(("all_to_all", "eager", "out", 1024, "b2b", "pull", 1.0))
    for op in ("reduce_scatter", "all_reduce"):
        assert (resolve(Options(), CUDA, Call(op, 100, False, False), table).variant) == "b2b"
    own = _table(("all_to_all", "eager", "out", 1024, "b2b", "pull", 1.0),
                 ("reduce_scatter", "eager", "out", 1024, "multi", "push", 2.0))
    assert resolve(Options(), CUDA, Call("reduce_scatter", 100, False, False), own).variant == "multi"
    assert _chosen(resolve(Options(), CUDA, Call("all_gather", 100, False, False), table)) == FALLBACK  # no stand-in


def test_without_a_table_or_a_usable_entry_auto_takes_the_fallback():
    assert _chosen(resolve(Options(), CUDA, EAGER)) == FALLBACK
    assert _chosen(resolve(Options(), CUDA, CAPTURED)) == FALLBACK._replace(prerecord=False)
    assert _chosen(resolve(Options(), HOST, EAGER)) == FALLBACK._replace(prerecord=False)  # no graphs
    assert _chosen(resolve(Options(sync="epoch"), CUDA, EAGER)) == FALLBACK._replace(prerecord=False, signal="memop")
    other_op = _table(("all_to_all", "eager", "out", 1024, "b2b", "pull", 1.0))
    assert _chosen(resolve(Options(), CUDA, EAGER, other_op)) == FALLBACK
    kernel_only = _table(("all_gather", "eager", "out", 1024, "b2b", "pull", 1.0, "kernel"))
    assert _chosen(resolve(Options(), CUDA, EAGER, kernel_only)) == FALLBACK  # never chooses kernel signals
    assert resolve(Options(), CUDA) == Options()  # no call: nothing chosen


def test_fallback_keeps_what_the_call_allows():
    assert fallback({}) == FALLBACK
    assert FALLBACK.signal == "copy"  # no stream-memop write into peer memory without a measurement
    # eager calls prerecord where graphs are allowed; not under capture, on the emulator, or with sync='epoch'
    assert fallback(candidates(CUDA, eager=True)).prerecord is True
    for runs in (candidates(CUDA, eager=False), candidates(HOST, eager=True)):
        assert fallback(runs) == FALLBACK._replace(prerecord=False)
    assert fallback(candidates(CUDA, eager=True, epoch=True)) == FALLBACK._replace(prerecord=False, signal="memop")
    assert fallback({"signal": {"memop"}, "wait": {"spin"}}) == FALLBACK._replace(signal="memop", wait="spin")


def test_candidates_follow_the_capabilities():
    assert candidates(CUDA, eager=True) == {"signal": {"copy", "memop"}, "wait": {"memop", "spin", "fold"},
                                            "prerecord": {False, True}, "submit": {"python", "native"}}
    assert candidates(CUDA, eager=False) == {"signal": {"copy", "memop"}, "wait": {"memop", "spin", "fold"},
                                             "prerecord": {False}, "submit": {"python"}}
    assert candidates(HIP, eager=True) == {"signal": {"copy", "memop"}, "wait": {"memop"},
                                           "prerecord": {False, True}, "submit": {"python"}}
    assert candidates(REFUSING, eager=True)["signal"] == {"copy"}
    assert candidates(dataclasses.replace(CUDA, native_available=False), eager=True)["submit"] == {"python"}
    assert allowed(Options(wait="memop", submit="python"), CUDA, False) == {
        "signal": {"copy", "memop"}, "wait": {"memop"}, "prerecord": {False, True}, "submit": {"python"}}
    every = choices(candidates(CUDA, eager=True))
    assert len(every) == len(set(every)) == 3 * 2 * 2 * 3 * (2 * 2 - 1)  # less prerecorded native submission
    assert not any(c.prerecord and c.submit == "native" for c in every)


def test_resolve_is_pure():
    table = _table(("all_gather", "eager", "out", 1024, "b2b", "pull", 1.0))
    before = table.to_json()
    assert resolve(Options(), CUDA, EAGER, table) == resolve(Options(), CUDA, EAGER, table)
    assert table.to_json() == before


# -- the options a call changes ---------------------------------------------------------------------------------
def test_a_call_changes_call_options_only():
    base = Options(variant="b2b", engines=4)
    assert base.changed({}) is base
    assert base.changed({"direction": "pull"}) == dataclasses.replace(base, direction="pull")
    with pytest.raises(InvalidArgument, match=r"unknown option\(s\) \['engine'\]; use variant=, direction="):
        base.changed({"engine": 3})
    for own in ("engines", "tuning_table", "check_calls"):
        with pytest.raises(InvalidArgument, match=rf"{own} is the communicator's own option, set once: "
                                                  rf"Communicator\(options=Options\({own}=\.\.\.\)\)"):
            base.changed({own: 1})


def test_the_call_keywords_are_the_first_options():
    fields = dataclasses.fields(Options)
    assert CALL_OPTIONS == tuple(f.name for f in fields[:len(CALL_OPTIONS)])
    hints = typing.get_type_hints(Options)
    assert typing.get_type_hints(CallOptions) == {name: hints[name] for name in CALL_OPTIONS}


# -- the communicator's side ------------------------------------------------------------------------------------
def test_the_old_keywords_say_where_they_went():
    from dmacoll import Communicator

    with pytest.raises(TypeError, match=r"Communicator\(variant='b2b', sync='reset'\): options are passed as "
                                        r"Communicator\(options=Options\(variant='b2b', sync='reset'\)\)"):
        Communicator(backend="host", variant="b2b", sync="reset")
    with pytest.raises(TypeError, match="unexpected keyword argument 'heap'"):
        Communicator(heap=1)
    with pytest.raises(TypeError, match="options must be dmacoll.Options"):
        Communicator(options={"variant": "b2b"})


def test_every_collective_is_a_method_written_out_with_its_spec_signature():
    """Type checkers and IDEs see what is in the source: each shipped op is a ``def`` of ``Communicator`` whose
    parameters are its spec's (``OpSpec.signature``), one line delegating to ``collective`` by the op's name."""
    from dmacoll.communicator import Communicator

    source = Path(inspect.getsourcefile(Communicator)).read_text()
    cls = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "Communicator")
    methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
    shipped = [n for n in ops.names() if type(ops.get(n)).__module__.startswith("dmacoll.ops.")]
    assert len(shipped) == 5, shipped  # tests/test_ops.py names them
    for name in shipped:  # a registered op of a user (tests/test_toy_collective.py) goes through collective()
        spec = ops.get(name)
        assert name in methods and ast.get_docstring(methods[name]), name
        body = methods[name].body[-1]
        assert len(methods[name].body) == 2 and isinstance(body, ast.Return), name
        call = body.value
        assert ast.unparse(call.func) == "self.collective" and ast.literal_eval(call.args[0]) == name, name
        ours = inspect.signature(getattr(Communicator, name)).parameters
        theirs = spec.signature().parameters
        assert [(p.name, p.kind, p.default) for p in ours.values()] == [
            (p.name, p.kind, p.default) for p in theirs.values()], name


def _cached(rank, world):
    from dmacoll import Communicator, communicator

    calls = []
    real = communicator.resolve

    def counting(options, capabilities, call=None, table=None):
        calls.append(call)
        return real(options, capabilities, call, table)

    communicator.resolve = counting
    comm = Communicator(backend="host", timeout_s=30)
    x, y = comm.empty(16), comm.empty(16 * world)
    for _ in range(3):
        comm.all_gather(y, x)
    comm.all_gather(y[: 8 * world], x[:8])
    for _ in range(2):
        comm.all_gather(y, x, variant="b2b")
    try:
        comm.all_gather(y, x, variant=["b2b"])  # unhashable: resolved (and refused) without the cache
    except InvalidArgument:
        pass
    comm.close()
    return [(c.op, c.nbytes, c.capturing) if c else None for c in calls], comm.last_options.variant


def test_a_call_shape_is_resolved_once():
    calls, variant = run_ranks(_cached, 2)[0]
    # creation checks twice (engine class, then the engine), then one resolution per (size, changes)
    assert calls == [None, None, ("all_gather", 64, False), ("all_gather", 32, False), ("all_gather", 64, False),
                     ("all_gather", 64, False)], calls
    assert variant == "b2b"


def test_a_repeated_call_with_the_same_options_is_recognized_and_other_options_are_not():
    """The eager fast path's key (``Communicator._repeat_key``): a call's option changes are part of it, so a
    repeat with the same changes skips the checks and one with other changes takes the full way; an unhashable
    value gives no key (the full way then names the option)."""
    import types

    import torch

    from dmacoll.communicator import Communicator

    comm = types.SimpleNamespace(capabilities=types.SimpleNamespace(sm_path=True), _calibration=None,
                                 check_calls=False, _gate=None)
    x, y = torch.zeros(8), torch.zeros(16)

    def key(**options):
        return Communicator._repeat_key(comm, "all_gather", y, x, False, options)

    assert key() == key() and key(path="nccl") == key(path="nccl")
    assert len({key(), key(path="nccl"), key(path="sm"), key(path="nccl", wait="memop")}) == 4
    assert key(path="nccl", wait="memop") == key(wait="memop", path="nccl")  # the order of keywords is no change
    assert key(path=["nccl"]) is None
    assert Communicator._repeat_key(comm, "all_gather", y, torch.zeros(4), False, {}) != key()  # other input
    comm._gate = object()  # a prelaunch gate: every call takes the full way
    assert key() is None
