"""The one timing loop (``dmacoll.timing.bench_time``, and ``interleave`` of several prepared calls) on the host clock: what it calls, in which order, what it
returns, what it refuses; and its check after timing. The CUDA half (graphs, events, streams, the one-call graph of
an in-place sum) is in tests/gpu/test_harness_one_gpu.py."""
import random

import pytest
import torch

from dmacoll.errors import InvalidArgument
from dmacoll.timing import Timed, bench_time, check_after, interleave, prepare

CPU = torch.device("cpu")


class Recorder:
    """A call that logs itself and the loop's hooks, and a check that logs what its rerun did."""

    def __init__(self, sums_in_place=False, right=True):
        self.log, self.sums_in_place, self.right = [], sums_in_place, right

    def call(self):
        self.log.append("call")

    def check(self, rerun):
        self.log.append("check")
        rerun()
        self.log.append("compared")
        return self.right


def test_the_loop_warms_up_then_times_repeats_of_calls_then_checks(seed):
    rng = random.Random(seed)
    calls, repeats, warmup = rng.randint(1, 5), rng.randint(1, 5), rng.randint(0, 3)
    r = Recorder(right=rng.random() < 0.5)
    timed = bench_time(r.call, calls, repeats, warmup=warmup, device=CPU, start=lambda: r.log.append("start"),
                       each=lambda: r.log.append("each"), check=r)
    want = ["call"] * warmup + ["start"] + (["each"] + ["call"] * calls) * repeats + ["check", "call", "compared"]
    assert r.log == want, f"seed {seed}: calls {calls} repeats {repeats} warmup {warmup}"
    assert isinstance(timed, Timed) and timed.correct is r.right, f"seed {seed}"
    assert len(timed.samples) == repeats and all(t >= 0 for t in timed.samples), f"seed {seed}"


def test_without_a_check_nothing_is_rerun_and_correct_is_none():
    r = Recorder()
    timed = bench_time(r.call, 2, 3, warmup=1, device=CPU)
    assert timed.correct is None and r.log == ["call"] * 7


def test_a_sample_is_per_call_time():
    import time

    timed = bench_time(lambda: time.sleep(0.02), 5, 2, warmup=0, device=CPU)
    # 5 calls of >= 20 ms, divided by 5: >= 20 ms each; undivided a sample would be >= 100 ms (a loaded machine's
    # late wake-ups stay far below the 80 ms a call would have to overshoot by)
    assert all(20_000 <= t < 100_000 for t in timed.samples), timed.samples


@pytest.mark.parametrize("kwargs, says", [
    (dict(calls=0), "calls 0"),
    (dict(repeats=0), "repeats 0"),
    (dict(warmup=-1), "warmup -1"),
    (dict(mode="replay"), "mode 'replay'"),
    (dict(mode="graph", device=CPU), "needs a GPU"),
])
def test_bad_arguments_are_refused_before_any_call(kwargs, says):
    r = Recorder()
    with pytest.raises(InvalidArgument, match=says):
        bench_time(r.call, **{"device": CPU, **kwargs})
    assert r.log == []


def test_check_after_reruns_the_eager_call_once():
    r = Recorder(sums_in_place=True)
    assert check_after(r, r.call, calls=4) is True
    assert r.log == ["check", "call", "compared"]


def test_interleave_takes_samples_in_rotating_turns(seed):
    rng = random.Random(seed)
    names, calls, repeats = ["a", "b", "c"][:rng.randint(1, 3)], rng.randint(1, 3), rng.randint(1, 7)
    log = []
    runs = {}
    for name in names:
        call = lambda name=name: log.append(name)  # noqa: E731
        run, graph = prepare(call, calls, warmup=0, device=CPU)
        assert graph is None and log == []
        runs[name] = run
    samples = interleave(runs, calls, repeats, device=CPU, each=lambda: log.append("each"),
                         before={names[0]: lambda: log.append("before")})
    want = []
    for i in range(repeats):
        k = i % len(names)
        for name in names[k:] + names[:k]:
            want += (["before"] if name == names[0] else []) + ["each"] + [name] * calls
    assert log == want, f"seed {seed}: {names} calls {calls} repeats {repeats}"
    assert list(samples) == names and all(len(v) == repeats for v in samples.values()), f"seed {seed}"
    assert all(t >= 0 for v in samples.values() for t in v), f"seed {seed}"


def test_prepare_warms_up_and_interleave_refuses_no_samples():
    r = Recorder()
    run, _ = prepare(r.call, 2, warmup=3, device=CPU)
    assert r.log == ["call"] * 3
    run()
    assert r.log == ["call"] * 5
    with pytest.raises(InvalidArgument, match="repeats 0"):
        interleave({"a": run}, 2, 0, device=CPU)
    assert interleave({}, 2, 3, device=CPU) == {}  # nothing ready: no samples, no error
    with pytest.raises(InvalidArgument, match="warmup -1"):
        prepare(r.call, warmup=-1, device=CPU)
