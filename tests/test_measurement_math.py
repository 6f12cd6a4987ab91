"""Measurement arithmetic on synthetic inputs: energy (idle subtracted), profiler classes, C3 metrics."""
import builtins

import pytest

from dmacoll_lab.bench import power
from dmacoll_lab.bench.bandwidth import bandwidths
from dmacoll.errors import BackendUnavailable


class FakeMeter:
    """A board drawing `idle_w`, plus `joules_per_call` for every call issued."""

    name = "fake"

    def __init__(self, idle_w, joules_per_call, clock):
        self.idle_w, self.per_call, self.clock = idle_w, joules_per_call, clock
        self.calls = 0

    def energy_j(self):
        return self.idle_w * self.clock() + self.per_call * self.calls

    def power_w(self):
        return self.idle_w


def test_dynamic_energy_per_call_and_byte_is_recovered(monkeypatch):
    import time

    meter = FakeMeter(idle_w=90.0, joules_per_call=0.002, clock=time.perf_counter)

    def step():
        meter.calls += 100
        time.sleep(0.002)
        return 100

    idle = power.measure(meter, lambda: None, idle_seconds=0.05)
    # energy and time are read a few microseconds apart: agreement to 0.1%
    assert idle["calls"] == 0 and idle["avg_power_w"] == pytest.approx(90.0, rel=1e-3)
    run = power.measure(meter, lambda: None, steps=20, step=step)
    assert run["calls"] == 2000
    out = power.dynamic_energy(run, idle["avg_power_w"], bytes_per_call=1 << 20)
    assert out["dynamic_energy_per_call_uj"] == pytest.approx(2000.0, rel=1e-3)
    assert out["dynamic_energy_per_byte_pj"] == pytest.approx(0.002 / (1 << 20) * 1e12, rel=1e-3)
    assert out["energy_per_call_uj"] > out["dynamic_energy_per_call_uj"]
    assert run["power_samples"] >= 1


def test_bytes_sent_per_call_are_the_bus_bytes():
    from dmacoll import ops

    assert ops.get("all_gather").bus_bytes(1024, 4) == 3072
    assert ops.get("all_to_all").bus_bytes(1024, 4) == 768
    assert ops.get("reduce_scatter").bus_bytes(1024, 4) == 768
    assert ops.get("all_reduce").bus_bytes(1024, 4) == 1536


@pytest.mark.parametrize("meter,missing", [(power.NvmlMeter, "pynvml"), (power.AmdSmiMeter, "amdsmi")])
def test_missing_library_says_what_to_install(monkeypatch, meter, missing):
    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name == missing:
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(BackendUnavailable, match="nvidia-ml-py" if missing == "pynvml" else "amdsmi"):
        meter(0)


def test_sm_usage_classes_gpu_activities_by_name():
    from dmacoll_lab.bench.smusage import summarize

    acts = [("Memcpy PtoP (Device -> Device)", 5.0), ("Memcpy DtoD (Device -> Device)", 1.0),
            ("Memset (Device)", 0.5), ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 8.0)] * 2
    s = summarize(acts, calls=2)
    assert s["kernels_per_call"] == 1 and s["kernel_us_per_call"] == 8.0
    assert s["copies_per_call"] == 2 and s["copy_us_per_call"] == 6.0 and s["memsets_per_call"] == 1
    assert s["kernel_names"] == "ncclDevKernel_AllGather_RING_LL x2"


def test_c3_metrics_follow_the_conccl_definitions():
    from dmacoll_lab.bench.c3_grid import c3_metrics

    m = c3_metrics(t_comp=100.0, t_comm=50.0, t_c3=110.0)
    assert m["ideal_speedup"] == 1.5
    assert m["realized_speedup"] == pytest.approx(150 / 110)
    assert m["fraction_of_ideal"] == pytest.approx(40 / 50)
    assert c3_metrics(100.0, 50.0, 100.0)["fraction_of_ideal"] == 1.0   # perfect overlap
    assert c3_metrics(100.0, 50.0, 150.0)["fraction_of_ideal"] == 0.0   # none at all


def test_bandwidths_follow_nccl_tests_and_peer_copy_is_one_chunk():
    mb = 1 << 20
    total, algbw, busbw = bandwidths("all_gather", "dma", 256 * mb, 4, 2000.0)
    assert total == 1024 * mb and busbw == pytest.approx(algbw * 3 / 4)
    assert bandwidths("all_to_all", "nccl", 256 * mb, 4, 2000.0)[0] == 256 * mb
    # one copy of one chunk: not scaled by the collective's (n-1)/n factor at any world size
    for op, chunk in (("all_gather", 256 * mb), ("all_to_all", 64 * mb), ("reduce_scatter", 64 * mb),
                      ("all_reduce", 128 * mb)):
        total, algbw, busbw = bandwidths(op, "peer_copy", 256 * mb, 4, 1000.0)
        assert total == chunk and algbw == busbw == pytest.approx(chunk / 1e-3 / 1e9)
