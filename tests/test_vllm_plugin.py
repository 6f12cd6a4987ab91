"""dmacoll's vLLM plugin: the switch, the routing decisions and the 'not installed' message on any machine;
the vLLM side only where vLLM is importable."""
import dataclasses
import importlib.util
import logging
import inspect
import sys
from pathlib import Path

import pytest
import torch

from dmacoll.integrations import vllm as plug

ROOT = Path(__file__).resolve().parents[1]
HAVE_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAVE_VLLM, reason="vLLM is not installed here (pip install 'dmacoll[vllm]')")


@pytest.fixture(autouse=True)
def fresh_log():
    plug._logged.clear()
    yield
    plug._logged.clear()


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
    assert plug.VLLM_PIN in plug.vllm_missing()
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


def test_entry_point_and_pins_agree():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert meta["entry-points"]["vllm.general_plugins"]["dmacoll"] == "dmacoll.integrations.vllm:register"
    assert meta["optional-dependencies"]["vllm"] == [f"vllm=={plug.VLLM_PIN}"]
    assert f"vllm=={plug.VLLM_PIN}" in (ROOT / "envs/vllm.yaml").read_text()
    assert plug.QUALNAME == "dmacoll.integrations.vllm.DmaCudaCommunicator"


# -- with vLLM ----------------------------------------------------------------------------------------------------
@needs_vllm
def test_communicator_class_extends_vllms():
    from vllm.distributed.device_communicators.cuda_communicator import CudaCommunicator

    cls = plug.DmaCudaCommunicator
    assert issubclass(cls, CudaCommunicator) and cls.__qualname__ == "DmaCudaCommunicator"
    for name in ("all_reduce", "all_gather", "reduce_scatter", "all_gatherv", "reduce_scatterv",
                 "reduce_scatterv_into_output", "destroy"):
        assert getattr(cls, name) is not getattr(CudaCommunicator, name), name
        ours, theirs = inspect.signature(getattr(cls, name)), inspect.signature(getattr(CudaCommunicator, name))
        assert list(ours.parameters)[:len(theirs.parameters)] == list(theirs.parameters), name  # vLLM's API
    mod = sys.modules["dmacoll.integrations.vllm"]
    assert getattr(mod, "DmaCudaCommunicator") is cls  # what resolve_obj_by_qualname(QUALNAME) finds


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


@needs_vllm
def test_register_leaves_a_platform_without_cuda_communicator_alone(monkeypatch):
    from vllm.platforms import current_platform

    cls = type(current_platform)
    if cls.get_device_communicator_cls() == plug.CUDA_COMMUNICATOR:
        pytest.skip(f"{cls.__name__} uses vLLM's CudaCommunicator: the test below covers it")
    before = cls.get_device_communicator_cls()
    monkeypatch.setenv("DMACOLL_VLLM", "1")
    plug.register()  # logs why it does nothing; never raises
    assert "platform" in plug._logged and cls.get_device_communicator_cls() == before


@needs_vllm
def test_register_switches_the_platforms_communicator(monkeypatch):
    from vllm.platforms import current_platform

    cls = type(current_platform)
    if cls.get_device_communicator_cls() != plug.CUDA_COMMUNICATOR:
        pytest.skip(f"{cls.__name__} does not use vLLM's CudaCommunicator")
    own = "get_device_communicator_cls" in cls.__dict__
    original = inspect.getattr_static(cls, "get_device_communicator_cls")
    try:
        monkeypatch.setenv("DMACOLL_VLLM", "0")
        plug.register()
        assert cls.get_device_communicator_cls() == plug.CUDA_COMMUNICATOR
        monkeypatch.setenv("DMACOLL_VLLM", "1")
        plug.register()
        assert current_platform.get_device_communicator_cls() == plug.QUALNAME
    finally:  # leave vLLM's platform as it was for other tests
        if own:
            cls.get_device_communicator_cls = original
        else:
            del cls.get_device_communicator_cls


# -- the wrapper's logic against a stand-in for vLLM (no vLLM, no GPU) ---------------------------------------------
@pytest.fixture
def fake_vllm(monkeypatch):
    """Just enough of vLLM's module layout for the plugin: CudaCommunicator (whose methods say 'vllm') and a
    CUDA platform. Written here from the documented interface; nothing of vLLM is imported or copied."""
    import importlib.machinery
    import types

    class CudaCommunicator:
        def __init__(self, cpu_group, device=None, device_group=None, unique_name=""):
            self.world_size, self.unique_name = 2, unique_name

        def all_reduce(self, input_):
            return "vllm"

        def all_gather(self, input_, dim=-1):
            return "vllm"

        def reduce_scatter(self, input_, dim=-1):
            return "vllm"

        def all_gatherv(self, input_, dim=0, sizes=None):
            return "vllm"

        def reduce_scatterv(self, input_, dim=-1, sizes=None):
            return "vllm"

        def reduce_scatterv_into_output(self, input_, output, dim=-1, sizes=None):
            return "vllm"

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
    yield Platform
    plug.__dict__.pop("DmaCudaCommunicator", None)  # built from the stand-in: not for other tests


class FakeDma:
    """Rank 0 of two whose peer holds its data + 100 (gathers) or the same data (sums)."""

    def all_gather(self, out, inp):
        out[0], out[1] = inp, inp + 100

    def reduce_scatter(self, out, x):
        out.copy_(2 * x[: out.shape[0]])

    def all_reduce(self, out, inp):
        return out.copy_(2 * inp)


def _wrapper(cls, limit=1 << 20):
    comm = cls.__new__(cls)  # no process group here: the attributes __init__ would set
    comm.world_size, comm.dma, comm.dma_limit = 2, FakeDma(), limit
    return comm


def test_wrapper_routes_and_keeps_vllms_layouts(fake_vllm, monkeypatch):
    if HAVE_VLLM:
        pytest.skip("a real vLLM is installed: the stand-in would shadow it")
    cls = plug.DmaCudaCommunicator
    assert cls.__module__ == "dmacoll.integrations.vllm" and cls.__qualname__ == "DmaCudaCommunicator"
    comm = _wrapper(cls)
    x = torch.arange(24.0).view(2, 3, 4)
    assert comm.all_reduce(x) == "vllm"  # CPU tensors: vLLM's path
    real = plug.fallback_reason  # the real decisions, with these CPU tensors taken for GPU ones
    monkeypatch.setattr(plug, "fallback_reason", lambda call, limit: real(dataclasses.replace(call, device="cuda"),
                                                                         limit))
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
    out = torch.zeros(1, 3, 4)  # vLLM 0.33's EP combine writes into the caller's output
    assert comm.reduce_scatterv_into_output(x, out, 0, [1, 1]) is out and torch.equal(out, 2 * x[:1])
    out = torch.zeros(2, 3, 2)
    assert comm.reduce_scatterv_into_output(x, out, -1) is out and torch.equal(out, 2 * x[..., :2])
    assert comm.reduce_scatterv_into_output(x, torch.zeros(1, 3, 4), 0, [1, 3]) == "vllm"
    comm.dma = None
    assert comm.all_gather(x, 0) == "vllm"  # dmacoll off for this group


def test_register_with_the_stand_in(fake_vllm, monkeypatch):
    if HAVE_VLLM:
        pytest.skip("a real vLLM is installed: test_register_switches_the_platforms_communicator covers it")
    monkeypatch.setenv("DMACOLL_VLLM", "1")
    plug.register()
    assert sys.modules["vllm.platforms"].current_platform.get_device_communicator_cls() == plug.QUALNAME
