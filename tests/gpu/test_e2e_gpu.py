"""`dmacoll e2e` with several ranks: TP2 / TP4 (EP for the MoE) under every schedule give world 1's logits (the same
model: weights drawn per full tensor, then sliced), and the benchmark's own rows are complete and checked.

Ranks spread over the visible GPUs (``verify.launch.gpus_for``): on one GPU they share it through the IPC heap and
run dmacoll alone (NCCL refuses two ranks on one GPU); with a GPU per rank NCCL is the benchmark's reference too.

Run on the GPU machine: ``python -m pytest -m gpu tests/gpu/test_e2e_gpu.py`` (a few minutes).
"""
from __future__ import annotations

import math

import pytest
import torch

from dmacoll_lab.e2e.bench import compare, run_e2e
from dmacoll_lab.e2e.calls import SCHEDULES
from dmacoll_lab.e2e.config import DEFAULTS, E2E_COLUMNS
from dmacoll_lab.verify.launch import nccl_usable, run_ranks

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
MODELS = ["llama-3.1-8b", "mixtral-8x7b"]
CHECK = {**DEFAULTS, "models": MODELS, "layers": 1, "batches": [8], "prompts": [128], "decode_steps": 2,
         "repeats": 1}


def _logits(rank: int, world: int, impl: str) -> dict:
    """float32 logits of one prefill and one decode step per model and schedule (rank 0's)."""
    from dmacoll_lab.e2e.bench import Runner, logits_once, point_inputs
    from dmacoll_lab.e2e.calls import merged_schedule_buffers
    from dmacoll_lab.e2e.collectives import make
    from dmacoll_lab.e2e.config import max_tokens
    from dmacoll_lab.e2e.model import Model

    schedules = list(SCHEDULES) if world > 1 else ["serial"]
    cfg = {**CHECK, "impls": [impl], "schedules": schedules}
    rn = Runner(rank, world, cfg)
    batch, prompt = cfg["batches"][0], cfg["prompts"][0]
    out = {}
    for s in rn.specs:
        model = Model(s, rank, world, rn.device, torch.float32, cfg["seed"])
        coll = make(impl, rn.device, merged_schedule_buffers([s], world, max_tokens([batch], [prompt],
                                                             cfg["chunk_tokens"]), batch, schedules, cfg["pieces"]),
                    torch.float32)
        for sched in schedules:
            got = logits_once(rn, model, coll, point_inputs(rn, s, batch, prompt), batch, prompt, sched)
            out[s.name, sched] = [None if t is None else t.float().cpu() for t in got]
        torch.cuda.synchronize()
        rn.barrier()
        coll.close()
    for coll in rn.colls.values():
        coll.close()
    return out if rank == 0 else {}


@pytest.mark.parametrize("world", (2, 4))
def test_tensor_parallel_schedules_give_world_ones_logits(world):
    one = run_ranks(_logits, 1, "none", device="cuda", timeout_s=600)[0]
    many = run_ranks(_logits, world, "dma", device="cuda", timeout_s=600)[0]
    assert set(many) == {(m, s) for m in MODELS for s in SCHEDULES}
    for (model, sched), logits in many.items():
        for ref, got in zip(one[model, "serial"], logits):
            if ref is None or got is None:  # seqpar has no decode of its own
                continue
            c = compare(ref, got, CHECK["rtol"], CHECK["atol"])
            assert c["logits_ok"] and c["argmax_agree"] == 1.0, (world, model, sched, c)


@pytest.mark.parametrize("world", (2, 4))
def test_small_e2e_rows_are_complete_and_checked(world):
    impls = ["nccl", "dma"] if nccl_usable(world) else ["dma"]
    cfg = {**DEFAULTS, "models": MODELS, "layers": 1, "batches": [1, 8], "prompts": [128], "decode_steps": 4,
           "repeats": 2, "impls": impls}
    rows = run_ranks(run_e2e, world, cfg, device="cuda", timeout_s=600)[0]
    # per model and batch: each (implementation, schedule), and a phased row per implementation (derived)
    assert len(rows) == 2 * 2 * len(impls) * (3 + 1) and all(set(r) == set(E2E_COLUMNS) for r in rows)
    assert all(r["status"] == "ok" for r in rows), [r["status"] for r in rows]
    phased = [r for r in rows if r["schedule"] == "phased"]
    assert all(r["decode_schedule"] == "serial" and r["prefill_schedule"] in SCHEDULES and r["phase_reason"]
               for r in phased)
    checked = [r for r in rows if (r["impl"], r["schedule"]) != (impls[0], "serial") and r["schedule"] != "phased"]
    assert all(r["logits_ok"] is True for r in checked), \
        [(r["model"], r["impl"], r["schedule"], r["batch"], r["check_max_abs_diff"]) for r in checked]
    assert all(r["calls_ok"] for r in rows)
    decoded = [r for r in rows if r["schedule"] != "seqpar"]
    assert all(math.isfinite(r["ttft_ms"]) and r["decode_ms"] > 0 for r in decoded)  # a shared GPU: no bound
    assert all(math.isfinite(r["decode_fraction_of_ideal_raw"]) for r in decoded)
