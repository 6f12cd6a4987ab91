"""dmacoll's vLLM plugin: the switch, the routing decisions and the 'not installed' message on any machine;
the vLLM side only where vLLM is importable."""
import dataclasses
import importlib.util
import logging
import inspect
import json
import os
import sys
from pathlib import Path

import pytest
import torch

from dmacoll.integrations import vllm as plug

ROOT = Path(__file__).resolve().parents[1]
HAVE_VLLM = importlib.util.find_spec("vllm") is not None
# `make test-vllm` sets DMACOLL_REQUIRE_VLLM=1: there a missing vLLM fails these tests instead of skipping them
needs_vllm = pytest.mark.skipif(not HAVE_VLLM and not os.environ.get("DMACOLL_REQUIRE_VLLM"),
                                reason="vLLM is not installed here (make test-vllm runs these)")


@pytest.fixture(autouse=True)
def fresh_log():
    plug._logged.clear()
    yield
    plug._logged.clear()


def test_supported_version_range():
    assert plug.VLLM_REQUIREMENT == "vllm>=0.26.0,<=0.33.0"
    assert all(plug.supported(v) for v in ("0.26.0", "0.27.1", "0.32.0", "0.33.0", "0.33.0rc1+cu130", "0.30"))
    assert not any(plug.supported(v) for v in ("0.25.1", "0.33.1", "0.34.0", "1.0.0", "unknown", ""))
    assert plug.release("0.26.0+cu130") == (0, 26, 0) and plug.release("dev") is None


def test_switch_and_size_limit():
    assert not any(plug.enabled(env) for env in ({}, {"DMACOLL_VLLM": "0"}, {"DMACOLL_VLLM": ""}))
    assert all(plug.enabled({"DMACOLL_VLLM": v}) for v in ("1", "true", "ON", " yes "))
    assert plug.max_bytes({}) == 32 << 20 and plug.max_bytes({"DMACOLL_VLLM_MAX_BYTES": "4M"}) == 4 << 20


def test_fallback_decisions():
    limit = 1 << 20
    ok = plug.Call("all_reduce", 4096, "bfloat16", "cuda")
    assert plug.fallback_reason(ok, limit) == ""
    cases = {
        plug.Call("all_reduce", 4096, "bfloat16", "cpu"): "all_reduce on cpu tensors",
        plug.Call("all_gather", 0, "bfloat16", "cuda"): "all_gather of an empty tensor",
        plug.Call("all_reduce", 4096, "int8", "cuda"): "all_reduce of int8 (dmacoll sums",
        plug.Call("all_gatherv", 4096, "bfloat16", "cuda", sizes=(3, 5)): "different sizes per rank",
        plug.Call("reduce_scatter", 4096, "float16", "cuda", contiguous=False): "non-contiguous",
        plug.Call("reduce_scatter", 4096, "float16", "cuda", dim_ok=False): "does not split evenly",
        plug.Call("all_reduce", limit + 1, "bfloat16", "cuda"): "above DMACOLL_VLLM_MAX_BYTES=1048576",
    }
    for call, want in cases.items():
        assert want in plug.fallback_reason(call, limit), call
    # gathers move bytes, whatever the dtype; equal sizes are fine
    assert plug.fallback_reason(plug.Call("all_gatherv", 64, "int8", "cuda", sizes=(4, 4)), limit) == ""
    # the reason is the log-once key: it must not depend on the size
    big = [plug.fallback_reason(plug.Call("all_reduce", n, "bfloat16", "cuda"), limit)
           for n in (limit + 1, 9 * limit)]
    assert big[0] == big[1]


def test_groups_and_all2all_backends():
    assert plug.group_reason("tp:0", 2) == plug.group_reason("ep:3", 4) == plug.group_reason("dp:0", 2) == ""
    assert "only tp/ep/dp" in plug.group_reason("pp:0", 2)
    assert "one rank" in plug.group_reason("tp:0", 1)
    agrs = type("AgRsAll2AllManager", (), {})()
    naive = type("NaiveAll2AllManager", (), {})()
    deepep = type("DeepEPHTAll2AllManager", (), {})()
    assert "dispatch (all_gatherv) and combine (reduce_scatterv) run on dmacoll" in plug.describe_all2all(agrs)
    assert "combine (all_reduce) runs on dmacoll" in plug.describe_all2all(naive)
    assert "keep this backend's own kernels" in plug.describe_all2all(deepep)
    assert plug.describe_all2all(None) == ""


def test_log_once(caplog):
    with caplog.at_level(logging.INFO, logger="dmacoll.vllm"):
        assert plug.log_once("k", "first")
        assert not plug.log_once("k", "second")
    assert [r.getMessage() for r in caplog.records] == ["dmacoll: first"]


def test_without_vllm_the_module_imports_and_says_what_is_missing(monkeypatch, caplog):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    assert "vLLM is not installed" in plug.vllm_missing() and "dmacoll[vllm]" in plug.vllm_missing()
    assert plug.VLLM_REQUIREMENT in plug.vllm_missing()
    monkeypatch.delenv("DMACOLL_VLLM", raising=False)
    plug.register()  # switch off: nothing happens, nothing is logged
    assert not caplog.records
    monkeypatch.setenv("DMACOLL_VLLM", "1")
    with caplog.at_level(logging.WARNING, logger="dmacoll.vllm"):
        plug.register()  # switch on, no vLLM: a warning, never an exception
    assert "vLLM is not installed" in caplog.text
    with pytest.raises(ImportError, match="vLLM is not installed"):
        plug.DmaCudaCommunicator  # noqa: B018 - the lazy class needs vLLM
    with pytest.raises(AttributeError):
        plug.NoSuchThing  # noqa: B018


def test_entry_point_and_version_range_agree():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert meta["entry-points"]["vllm.general_plugins"]["dmacoll"] == "dmacoll.integrations.vllm:register"
    assert meta["optional-dependencies"]["vllm"] == [plug.VLLM_REQUIREMENT]
    assert plug.VLLM_REQUIREMENT in (ROOT / "envs/vllm.yaml").read_text()
    assert plug.QUALNAME == "dmacoll.integrations.vllm.DmaCudaCommunicator"


def test_decisions_are_logged_once_per_size_class_and_written_as_json_lines(tmp_path, caplog):
    from dmacoll.integrations.vllm_routes import Decision

    env = {plug.DECISIONS_ENV: str(tmp_path / "d-")}
    yes, no = Decision(True, "2 MB-4 MB", "faster"), Decision(False, "1 MB", "slower")
    with caplog.at_level(logging.INFO, logger="dmacoll.vllm"):
        assert plug.record_decision("tp:0", "all_gather", "graph", yes, env)
        assert not plug.record_decision("tp:0", "all_gather", "graph", yes, env)  # same class: once
        assert plug.record_decision("tp:0", "all_gather", "eager", no, env)  # another mode: its own line
    assert [r.getMessage() for r in caplog.records] == [
        "dmacoll: tp:0: all_gather (graph, 2 MB-4 MB) on dmacoll: faster",
        "dmacoll: tp:0: all_gather (eager, 1 MB) on vLLM's path: slower"]
    lines = [json.loads(x) for f in tmp_path.glob("d-*.jsonl") for x in f.read_text().splitlines()]
    assert [(d["mode"], d["route"]) for d in lines] == [("graph", True), ("eager", False)]


# -- with vLLM ----------------------------------------------------------------------------------------------------
@needs_vllm
def test_communicator_class_extends_vllms():
    from vllm.distributed.device_communicators.cuda_communicator import CudaCommunicator

    cls = plug.DmaCudaCommunicator
    assert issubclass(cls, CudaCommunicator) and cls.__qualname__ == "DmaCudaCommunicator"
    for name in ("all_reduce", "all_gather", "reduce_scatter", "all_gatherv", "reduce_scatterv", "destroy",
                 *plug.OPTIONAL_OVERRIDES):
        if not hasattr(CudaCommunicator, name):  # only some versions have it: then neither do we
            assert name in plug.OPTIONAL_OVERRIDES and not hasattr(cls, name), name
            continue
        assert getattr(cls, name) is not getattr(CudaCommunicator, name), name
        ours, theirs = inspect.signature(getattr(cls, name)), inspect.signature(getattr(CudaCommunicator, name))
        assert list(ours.parameters)[:len(theirs.parameters)] == list(theirs.parameters), name  # vLLM's API
    mod = sys.modules["dmacoll.integrations.vllm"]
    assert getattr(mod, "DmaCudaCommunicator") is cls  # what resolve_obj_by_qualname(QUALNAME) finds
    from vllm.utils.import_utils import resolve_obj_by_qualname

    assert resolve_obj_by_qualname(plug.QUALNAME) is cls


@needs_vllm
def test_the_installed_vllm_is_in_the_supported_range():
    from importlib import metadata

    assert plug.supported(metadata.version("vllm")), metadata.version("vllm")


@needs_vllm
def test_vllms_plugin_loader_finds_and_calls_register(monkeypatch):
    """The registration path through vLLM itself: its entry-point discovery and load_general_plugins()."""
    import vllm.plugins as vp

    found = vp.load_plugins_by_group(vp.DEFAULT_PLUGINS_GROUP)
    assert found.get("dmacoll") is plug.register, sorted(found)
    calls = []
    monkeypatch.setattr(plug, "register", lambda: calls.append("register"))  # what the entry point resolves to
    monkeypatch.setattr(vp, "plugins_loaded", False)
    vp.load_general_plugins()
    assert calls == ["register"]


def _vllm_platform(monkeypatch, communicator: str):
    """A subclass of vLLM's own Platform building ``communicator``, made vLLM's current platform (this CPU
    machine's own platform builds no CudaCommunicator)."""
    import vllm.platforms as vp
    from vllm.platforms.interface import Platform

    cls = type("TestPlatform", (Platform,), {"get_device_communicator_cls": classmethod(lambda c: communicator)})
    monkeypatch.setattr(vp, "current_platform", cls(), raising=False)
    return cls


@needs_vllm
def test_register_leaves_a_platform_without_cuda_communicator_alone(monkeypatch):
    other = "vllm.distributed.device_communicators.base_device_communicator.DeviceCommunicatorBase"
    cls = _vllm_platform(monkeypatch, other)
    monkeypatch.setenv("DMACOLL_VLLM", "1")
    plug.register()  # logs why it does nothing; never raises
    assert "platform" in plug._logged and cls.get_device_communicator_cls() == other


@needs_vllm
def test_register_switches_the_platforms_communicator(monkeypatch):
    from vllm.platforms import current_platform as before  # noqa: F401 - resolved before the stand-in

    cls = _vllm_platform(monkeypatch, plug.CUDA_COMMUNICATOR)
    monkeypatch.setenv("DMACOLL_VLLM", "0")
    plug.register()
    assert cls.get_device_communicator_cls() == plug.CUDA_COMMUNICATOR
    monkeypatch.setenv("DMACOLL_VLLM", "1")
    plug.register()
    from vllm.platforms import current_platform

    assert current_platform.get_device_communicator_cls() == plug.QUALNAME


# -- the wrapper's logic, on vLLM's class with its collectives stubbed (or a stand-in where vLLM is absent) --------
VLLM_METHODS = ("all_reduce", "all_gather", "reduce_scatter", "all_gatherv", "reduce_scatterv",
                "reduce_scatterv_into_output")


def _stand_in(monkeypatch, optional: bool):
    """Just enough of vLLM's module layout for the plugin: CudaCommunicator and a CUDA platform. Written here
    from the documented interface; nothing of vLLM is imported or copied. ``optional``: whether it has the
    methods only some versions have (0.33's reduce_scatterv_into_output)."""
    import importlib.machinery
    import types

    class CudaCommunicator:
        def __init__(self, cpu_group, device=None, device_group=None, unique_name=""):
            self.world_size, self.unique_name = 2, unique_name

        def destroy(self):
            pass

    class Platform:
        @classmethod
        def get_device_communicator_cls(cls):
            return plug.CUDA_COMMUNICATOR

    names = ["vllm", "vllm.distributed", "vllm.distributed.device_communicators",
             "vllm.distributed.device_communicators.cuda_communicator", "vllm.platforms"]
    for name in names:
        mod = types.ModuleType(name)
        mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
        monkeypatch.setitem(sys.modules, name, mod)
    sys.modules["vllm.distributed.device_communicators.cuda_communicator"].CudaCommunicator = CudaCommunicator
    sys.modules["vllm.platforms"].current_platform = Platform()
    return CudaCommunicator, VLLM_METHODS if optional else VLLM_METHODS[:-1]


@pytest.fixture(params=["installed vLLM"] if HAVE_VLLM else ["0.33-like stand-in", "0.26-like stand-in"])
def vllm_class(request, monkeypatch):
    """vLLM's CudaCommunicator (where installed) or the stand-in, with each collective vLLM has replaced by one
    that answers 'vllm': what the plugin defers to is visible, and nothing needs a process group or GPU."""
    if HAVE_VLLM:
        from vllm.distributed.device_communicators.cuda_communicator import CudaCommunicator as base

        methods = [m for m in VLLM_METHODS if hasattr(base, m)]
    else:
        base, methods = _stand_in(monkeypatch, request.param.startswith("0.33"))
    for m in methods:
        monkeypatch.setattr(base, m, lambda self, *a, **k: "vllm", raising=False)
    plug.__dict__.pop("DmaCudaCommunicator", None)  # built from this class, then dropped again
    yield plug.DmaCudaCommunicator, methods
    plug.__dict__.pop("DmaCudaCommunicator", None)


class FakeDma:
    """Rank 0 of two whose peer holds its data + 100 (gathers) or the same data (sums)."""

    def all_gather(self, out, inp):
        out[0], out[1] = inp, inp + 100

    def reduce_scatter(self, out, x):
        out.copy_(2 * x[: out.shape[0]])

    def all_reduce(self, out, inp):
        return out.copy_(2 * inp)


def _wrapper(cls, how="all", limit=1 << 20, gpu="NVIDIA H200", routes=None):
    from dmacoll.integrations.vllm_routes import Routes

    comm = cls.__new__(cls)  # no process group here: the attributes __init__ would set
    comm.world_size, comm.unique_name, comm.dma, comm.dma_limit = 2, "tp:0", FakeDma(), limit
    comm.dma_policy, comm.dma_routes, comm.dma_gpu = how, routes or Routes.shipped(), gpu
    return comm


@pytest.fixture
def on_gpu(monkeypatch):
    """These CPU tensors taken for GPU ones by the eligibility rules (the real rules otherwise)."""
    real = plug.fallback_reason
    monkeypatch.setattr(plug, "fallback_reason",
                        lambda call, limit: real(dataclasses.replace(call, device="cuda"), limit))


def test_wrapper_routes_and_keeps_vllms_layouts(vllm_class, on_gpu):
    cls, methods = vllm_class
    assert cls.__module__ == "dmacoll.integrations.vllm" and cls.__qualname__ == "DmaCudaCommunicator"
    comm = _wrapper(cls)  # DMACOLL_VLLM_ROUTE=all: every eligible call
    x = torch.arange(24.0).view(2, 3, 4)
    out = comm.all_reduce(x)
    assert torch.equal(out, 2 * x) and torch.equal(x, torch.arange(24.0).view(2, 3, 4))  # out of place
    for dim in (0, 1, -1):
        assert torch.equal(comm.all_gather(x, dim), torch.cat([x, x + 100], dim=dim)), dim
    assert torch.equal(comm.reduce_scatter(x, 0), 2 * x[:1])
    assert torch.equal(comm.reduce_scatter(x, -1), 2 * x[..., :2])  # the scattered dim moved back in place
    assert comm.reduce_scatter(x, 1) == "vllm"  # 3 rows do not split over 2 ranks
    pair = comm.all_gatherv([x, x.long()], 0, [2, 2])  # EP dispatch: hidden states and ids
    assert torch.equal(pair[0], torch.cat([x, x + 100])) and pair[1].dtype == torch.long
    assert comm.all_gatherv(x, 0, [2, 3]) == "vllm" and comm.all_gatherv(x, 1) == "vllm"
    assert torch.equal(comm.reduce_scatterv(x, 0, [1, 1]), 2 * x[:1])  # EP combine
    assert comm.reduce_scatterv(x, 1, [1, 1]) == "vllm"
    if "reduce_scatterv_into_output" in methods:  # vLLM 0.33's EP combine writes into the caller's output
        out = torch.zeros(1, 3, 4)
        assert comm.reduce_scatterv_into_output(x, out, 0, [1, 1]) is out and torch.equal(out, 2 * x[:1])
        out = torch.zeros(2, 3, 2)
        assert comm.reduce_scatterv_into_output(x, out, -1) is out and torch.equal(out, 2 * x[..., :2])
        assert comm.reduce_scatterv_into_output(x, torch.zeros(1, 3, 4), 0, [1, 3]) == "vllm"
    else:
        assert not hasattr(cls, "reduce_scatterv_into_output")
    comm.dma = None
    assert comm.all_gather(x, 0) == "vllm"  # dmacoll off for this group


def test_wrapper_sends_only_data_movement_with_route_moves(vllm_class, on_gpu, seed):
    comm = _wrapper(vllm_class[0], how="moves")
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(seed))
    assert torch.equal(comm.all_gather(x, 0), torch.cat([x, x + 100])), f"seed {seed}"
    assert comm.all_reduce(x) == "vllm" and comm.reduce_scatter(x, 0) == "vllm"


def _table(rows, margin=0.1, world=2, gpu="NVIDIA H200"):
    from dmacoll.integrations.vllm_routes import Routes

    entries = [{"op": op, "mode": mode, "bytes_per_rank": b, "dmacoll_us": d, "dmacoll_config": "pcpy/push/out",
                "vllm_path": "nccl", "vllm_us": n} for op, mode, b, d, n in rows]
    return Routes({"margin": margin, "deferred": {"all_reduce": "not measured"},
                   "tables": [{"machine": "m", "world": world, "gpu": gpu, "entries": entries}]})


def test_measured_policy_routes_only_where_dmacoll_is_faster(vllm_class, on_gpu, monkeypatch, caplog, seed):
    table = _table([("all_gather", "graph", 1024, 20.0, 10.0), ("all_gather", "graph", 4096, 8.0, 10.0),
                    ("all_gather", "graph", 16384, 8.0, 10.0), ("all_gather", "eager", 16384, 50.0, 40.0)])
    comm = _wrapper(vllm_class[0], how="measured", routes=table)
    assert plug.capture_mode() == "eager"  # no capture here
    gen = torch.Generator().manual_seed(seed)
    small, mid, big = (torch.randn(n, 4, generator=gen) for n in (64, 256, 1024))  # 1 KB, 4 KB, 16 KB fp32
    monkeypatch.setattr(plug, "capture_mode", lambda: "graph")
    with caplog.at_level(logging.INFO, logger="dmacoll.vllm"):
        assert comm.all_gather(small, 0) == "vllm"  # 20 us vs 10: slower
        # 8 vs 10 us: 20% faster
        assert torch.equal(comm.all_gather(big, 0), torch.cat([big, big + 100])), f"seed {seed}"
        assert torch.equal(comm.all_gather(mid, 0), torch.cat([mid, mid + 100])), f"seed {seed}"
        assert comm.all_gather(torch.zeros(128, 4), 0) == "vllm"  # 2 KB: between a slower and a faster size
        assert comm.all_reduce(big) == "vllm"  # deferred op
        monkeypatch.setattr(plug, "capture_mode", lambda: "eager")
        assert comm.all_gather(big, 0) == "vllm"  # eager is measured slower
        assert comm.all_gather(big, 0) == "vllm"
        assert len(comm._dma_why) == 6  # one decision per kind of call, remembered
        comm.dma_gpu, comm._dma_why = "NVIDIA H100 80GB HBM3", {}  # no measurement on this GPU: vLLM's path
        assert comm.all_gather(big, 0) == "vllm"
    text = caplog.text
    assert text.count("all_gather (eager, 16 KB)") == 1  # once per size class
    assert "all_gather (graph, 1 KB-4 KB) on vLLM's path: dmacoll not faster" in text
    assert "all_gather (graph, 4 KB) on dmacoll" in text
    assert "all_gather (graph, 16 KB) on dmacoll" in text and "all_reduce (graph, any size)" in text
    assert "(eager, any size) on vLLM's path: no measurement at world 2 on NVIDIA H100" in text


def test_register_with_the_stand_in(monkeypatch):
    _stand_in(monkeypatch, optional=True)
    monkeypatch.setenv("DMACOLL_VLLM", "1")
    plug.register()
    assert sys.modules["vllm.platforms"].current_platform.get_device_communicator_cls() == plug.QUALNAME
