"""The measurement harness's CUDA paths on one GPU (a world of one rank): events, graph capture and replay, released
parts on two streams, the post-timing check through NCCL for every collective, and the e2e runner. Two-GPU runs of
the benchmarks themselves are the workflow's rules (tools/lent_snakemake.sh on the lent machines)."""
from __future__ import annotations

import pytest
import torch

from dmacoll_lab.verify.launch import run_ranks

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _harness(rank: int, world: int) -> dict:
    from dmacoll import ops
    from dmacoll_lab.bench import harness

    rk = harness.Rank(rank, world, hold_us=100.0)
    rk.priv_in = torch.empty(1 << 20, dtype=torch.uint8, device=rk.device)
    rk.priv_out = torch.empty(1 << 20, dtype=torch.uint8, device=rk.device)
    out = {"device": rk.device.type, "hold": rk.hold}
    x = torch.ones(1 << 22, device=rk.device)
    out["graph_us"] = rk.bench(lambda: x.add_(1), 4, 3, "graph").samples
    out["eager_us"] = rk.bench(lambda: x.add_(1), 4, 3).samples
    side = torch.cuda.Stream()
    parts = rk.time_parts([("a", lambda: x.mul_(1), torch.cuda.current_stream()), ("b", lambda: x.add_(0), side)], 3)
    out["parts"] = sorted(parts)
    out["total_is_last"] = parts["total"] >= max(parts["a"], parts["b"])
    out["checks"] = {}
    for name, spec in ops.REGISTRY.items():
        # graph-replayed in place (an in-place sum of several calls is checked by a graph of one) and eager
        right = harness.Bound(rk, spec, 4096, 7, harness.torch_caller(spec), symmetric=False, in_place=True)
        lazy = harness.Bound(rk, spec, 4096, 7, lambda o, i, c: (lambda: None), symmetric=False)
        out["checks"][name] = (rk.bench(right.run, 3, 2, "graph", check=right).correct,
                               rk.bench(lazy.run, 1, 1, check=lazy).correct)
    rk.close()
    return out


def _loop_on_a_stream(rank: int, world: int) -> dict:
    """The timing loop's graph mode on a stream of its own, and its check: the rerun of an in-place sum is one call
    (a graph of one), of anything else the timed graph."""
    from dmacoll.timing import bench_time

    stream = torch.cuda.Stream()
    x = torch.zeros(1 << 20, device="cuda")
    seen = {}

    class Adds:
        def __init__(self, sums_in_place):
            self.sums_in_place = sums_in_place

        def check(self, rerun):
            before = x.clone()
            rerun()
            torch.cuda.synchronize()
            seen[self.sums_in_place] = float((x - before).max())
            return True

    samples = {sums: bench_time(lambda: x.add_(1), 5, 3, mode="graph", warmup=2, stream=stream,
                                check=Adds(sums)).samples for sums in (True, False)}
    return {"samples": samples, "added": seen}


def test_the_timing_loop_on_a_gpu_stream_and_its_check():
    out = run_ranks(_loop_on_a_stream, 1, device="cuda", timeout_s=300)[0]
    assert all(len(s) == 3 and all(t > 0 for t in s) for s in out["samples"].values())
    assert out["added"] == {True: 1.0, False: 5.0}  # one call for an in-place sum, the timed graph otherwise


def test_harness_times_and_checks_on_a_gpu():
    out = run_ranks(_harness, 1, device="cuda", timeout_s=300)[0]
    assert out["device"] == "cuda" and out["hold"] > 0
    assert all(t > 0 for t in out["graph_us"] + out["eager_us"])
    assert out["parts"] == ["a", "b", "total"] and out["total_is_last"]
    # every op's graph-replayed NCCL call passes the check; a call that writes nothing fails it
    assert out["checks"] == {name: (True, False) for name in out["checks"]} and len(out["checks"]) == 5


def _e2e(rank: int, world: int):
    from dmacoll_lab.e2e.bench import run_e2e
    from dmacoll_lab.e2e.config import DEFAULTS

    # batch 2: the micro-batches split the sequences; batch 1, prompt 33: one prompt split by tokens, seqpar padded
    cfg = {**DEFAULTS, "models": ["llama-3.1-8b", "mixtral-8x7b"], "layers": 1, "batches": [1, 2], "prompts": [33],
           "impls": ["nccl"], "pieces": 2, "decode_steps": 2, "repeats": 2}
    return run_e2e(rank, world, cfg)


def test_the_e2e_runner_measures_on_a_gpu():
    """Every schedule on one GPU (NCCL's one-rank calls on the communication stream), decode graphs captured with
    the micro-batches on two streams; the float32 logits of every schedule equal serial's."""
    rows = run_ranks(_e2e, 1, device="cuda", timeout_s=300)[0]
    # per model and batch: three schedules and the phased row derived from them
    assert len(rows) == 2 * 2 * (3 + 1) and all(r["status"] == "ok" for r in rows), [r["status"] for r in rows]
    assert all(r["calls_ok"] for r in rows) and all(r["ttft_ms"] > 0 for r in rows)
    assert all(r["logits_ok"] is True for r in rows if r["schedule"] not in ("serial", "phased"))
    decoded = [r for r in rows if r["schedule"] != "seqpar"]
    assert all(r["decode_ms"] > 0 and r["decode_compute_ms"] > 0 and r["decode_floor_ms"] > 0 for r in decoded)
    assert {r["microbatches"] for r in decoded if r["schedule"] == "microbatch"} == {1, 2}
    assert all(r["copy_GBps"] > 100 and r["gemm_TFLOPs"] > 10 for r in rows)
