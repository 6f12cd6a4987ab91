"""graph_capture: no garbage collection inside a capture (a collection there may destroy an old CUDA graph, which
CUDA refuses mid-capture), the collector restored as it was. torch.cuda.graph is a stand-in here (no GPU)."""
from __future__ import annotations

import contextlib
import gc

import pytest
import torch

from dmacoll.graphs import graph_capture


@pytest.fixture
def captures(monkeypatch):
    seen = []

    @contextlib.contextmanager
    def fake_graph(graph, stream=None):
        seen.append((graph, stream, gc.isenabled()))
        yield

    monkeypatch.setattr(torch.cuda, "graph", fake_graph)
    return seen


def test_the_collector_is_off_inside_and_back_on_after(captures):
    assert gc.isenabled()
    with graph_capture("g", "s"):
        assert not gc.isenabled()
    assert gc.isenabled() and captures == [("g", "s", False)]


def test_the_collector_comes_back_after_a_failed_capture(captures):
    with pytest.raises(RuntimeError), graph_capture("g"):
        raise RuntimeError("capture invalidated")
    assert gc.isenabled()


def test_a_collector_that_was_off_stays_off(captures):
    gc.disable()
    try:
        with graph_capture("g"):
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
