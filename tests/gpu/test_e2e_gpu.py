"""`dmacoll e2e` on 2 GPUs at one small point per model and schedule: it runs, graphs replay (micro-batches on two
streams), every (implementation, schedule)'s float32 logits equal NCCL serial's, the calls are the schedule's.

Run on the GPU machine: ``python -m pytest -m gpu tests/gpu/test_e2e_gpu.py`` (about a minute).
"""
from __future__ import annotations

import math

import pytest
import torch

from dmacoll.e2e.bench import run_e2e
from dmacoll.e2e.config import DEFAULTS, E2E_COLUMNS
from dmacoll.verify.launch import run_ranks

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")]


def test_small_e2e_matches_nccl():
    cfg = {**DEFAULTS, "models": ["llama-3.1-8b", "mixtral-8x7b"], "layers": 1, "batches": [1, 8], "prompts": [128],
           "decode_steps": 4, "repeats": 2}
    rows = run_ranks(run_e2e, 2, cfg, device="cuda", timeout_s=600)[0]
    assert len(rows) == 2 * 2 * 2 * 3 and all(set(r) == set(E2E_COLUMNS) for r in rows)
    assert all(r["status"] == "ok" for r in rows), [r["status"] for r in rows]
    checked = [r for r in rows if (r["impl"], r["schedule"]) != ("nccl", "serial")]
    assert all(r["logits_ok"] is True for r in checked), \
        [(r["model"], r["impl"], r["schedule"], r["batch"], r["check_max_abs_diff"]) for r in checked]
    assert all(r["calls_ok"] for r in rows)
    decoded = [r for r in rows if r["schedule"] != "seqpar"]
    assert all(0 < r["decode_ms"] < 50 and math.isfinite(r["ttft_ms"]) for r in decoded)
    assert all(math.isfinite(r["decode_fraction_of_ideal_raw"]) for r in decoded)
