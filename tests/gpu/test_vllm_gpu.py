"""The plugin inside vLLM's own CUDA platform (a GPU machine with vLLM: tools/vllm_gpu_run.sh runs this)."""
from __future__ import annotations

import importlib.util

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM")]


def test_register_switches_vllms_cuda_platform(monkeypatch):
    from vllm.platforms import current_platform
    from vllm.utils.import_utils import resolve_obj_by_qualname

    from dmacoll.integrations import vllm as plug

    cls = type(current_platform)
    assert current_platform.is_cuda() and cls.get_device_communicator_cls() == plug.CUDA_COMMUNICATOR
    own = cls.__dict__.get("get_device_communicator_cls")
    monkeypatch.setenv("DMACOLL_VLLM", "1")
    try:
        plug.register()
        assert resolve_obj_by_qualname(current_platform.get_device_communicator_cls()) is plug.DmaCudaCommunicator
    finally:  # vLLM's platform as it was
        if own is None:
            del cls.get_device_communicator_cls
        else:
            cls.get_device_communicator_cls = own
    assert plug.capture_mode() == "eager"
    g = torch.cuda.CUDAGraph()
    seen = []
    with torch.cuda.graph(g):
        seen.append(plug.capture_mode())
    assert seen == ["graph"]
