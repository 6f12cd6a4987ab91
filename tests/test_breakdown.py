"""The phase arithmetic of `dmacoll breakdown`, on a synthetic CUPTI trace."""
import random

import pytest

from dmacoll_lab.bench.breakdown import CALL, HOST_WAIT, phases, trace_events


def _trace(seed, transfers, nbytes, dst=1):
    rng = random.Random(seed)
    events, expected = [], []
    t = 1000.0
    for _ in range(transfers):
        control, schedule, copy, sync, host = (rng.uniform(1, 9) for _ in range(5))
        events += [
            {"ph": "X", "name": CALL, "cat": "user_annotation", "ts": t, "dur": control},
            {"ph": "X", "name": "Memcpy PtoP (Device -> Device)", "cat": "gpu_memcpy", "ts": t + control + schedule,
             "dur": copy, "args": {"bytes": nbytes, "device": 0}},
            {"ph": "X", "name": "Memset (Device)", "cat": "gpu_memset", "ts": t + control + schedule + copy + sync,
             "dur": 0.5, "args": {"bytes": 4, "device": dst}},
            {"ph": "X", "name": HOST_WAIT, "cat": "user_annotation", "ts": t + control + 0.1,
             "dur": schedule + copy + host - 0.1},
            # noise that must be ignored: another copy size, a memset on the sender
            {"ph": "X", "name": "Memcpy DtoD", "cat": "gpu_memcpy", "ts": t + 2, "dur": 1, "args": {"bytes": 7}},
            {"ph": "X", "name": "Memset (Device)", "cat": "gpu_memset", "ts": t + 3, "dur": 1,
             "args": {"bytes": 4, "device": 0}},
        ]
        expected.append((control, schedule, copy, sync, host))
        t += 100.0
    rng.shuffle(events)  # the exporter's order is not time order
    return {"traceEvents": events}, expected


def test_phases_recover_the_intervals(seed):
    trace, expected = _trace(seed, 7, 4096)
    got = phases(*trace_events(trace, 4096, dst_gpu=1))
    for i, want in enumerate(expected):
        for name, value in zip(("control", "schedule", "copy", "sync", "host_sync"), want):
            assert got[name][i] == pytest.approx(value), f"seed {seed}: {name} of transfer {i}"


def test_the_driver_record_of_the_call_replaces_the_annotation(seed):
    trace, expected = _trace(seed, 4, 4096)
    for e in [e for e in trace["traceEvents"] if e["name"] == CALL]:  # the driver call inside the annotation
        trace["traceEvents"].append({"ph": "X", "name": "cuMemcpyAsync", "cat": "cuda_driver", "ts": e["ts"] + 0.5,
                                     "dur": e["dur"] - 1.0})
    got = phases(*trace_events(trace, 4096, dst_gpu=1))
    for i, (control, schedule, *_) in enumerate(expected):
        assert got["control"][i] == pytest.approx(control - 1.0), f"seed {seed}: transfer {i}"
        assert got["schedule"][i] == pytest.approx(schedule + 0.5), f"seed {seed}: transfer {i}"


def test_a_trace_that_does_not_pair_up_is_an_error(seed):
    trace, _ = _trace(seed, 3, 4096)
    trace["traceEvents"] = [e for e in trace["traceEvents"] if e.get("cat") != "gpu_memset"]
    with pytest.raises(RuntimeError, match="does not pair up"):
        phases(*trace_events(trace, 4096, dst_gpu=1))
