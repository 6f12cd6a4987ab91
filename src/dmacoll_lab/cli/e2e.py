"""`dmacoll e2e`: the built-in LLM inference benchmark (the vLLM commands: dmacoll_lab/vllm/cli.py)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from dmacoll.lab_api import InvalidArgument
from .common import add_out, add_ranks, planned_world, positive, run_on_gpus


def cmd_e2e(a: argparse.Namespace) -> int:
    """LLM inference (prefill + CUDA-graph decode) with NCCL vs dmacoll collectives; --dry-run: the plan only."""
    from ..e2e import config as e2e

    cfg = dict(models=a.models, layers=a.layers, batches=a.batches, prompts=a.prompts, impls=a.impls,
               schedules=a.schedules, pieces=a.pieces, overlap_path=a.overlap_path, breakdown=not a.no_breakdown,
               decode_steps=a.decode_steps, repeats=a.repeats, output_len=a.output_len, chunk_tokens=a.chunk_tokens,
               dtype=a.dtype, seed=a.seed, check_dtype=a.check_dtype, rtol=a.rtol, atol=a.atol)
    if a.hf_config_dir:  # shapes for `vllm bench ... --load-format dummy`
        for name in a.models:
            d = Path(a.hf_config_dir) / name
            d.mkdir(parents=True, exist_ok=True)
            (d / "config.json").write_text(json.dumps(e2e.hf_config(e2e.spec(name, a.layers)), indent=1) + "\n")
            print(f"wrote {d / 'config.json'}")
        return 0
    world = planned_world(a, least=1)
    check_plan(cfg, world)
    print(e2e.plan_text(cfg, world), flush=True)  # InvalidArgument if a model does not split over the ranks
    if a.dry_run:
        return 0
    from ..e2e.bench import E2E_COLUMNS, run_e2e

    return run_on_gpus(a, run_e2e, E2E_COLUMNS, cfg, least=1)


def check_plan(cfg: dict, world: int) -> None:
    """What no rank should start with: an unknown or repeated schedule, dmacoll on one GPU."""
    from ..e2e.calls import check_schedules

    check_schedules(cfg["schedules"], cfg["pieces"])
    if world < 2 and "dma" in cfg["impls"]:
        raise InvalidArgument("dmacoll collectives need at least 2 ranks; on one GPU run --impls nccl (the "
                              "schedules then run their compute and NCCL's one-rank calls)")


def register(sub) -> None:
    from ..e2e.calls import SCHEDULES
    from ..e2e.config import DEFAULTS as d, MODELS

    p = sub.add_parser("e2e", help="LLM inference (Llama / Mixtral layers, random weights): TTFT, decode step, "
                                   "tokens/s with NCCL vs dmacoll collectives; logits compared")
    add_ranks(p)
    p.add_argument("--models", nargs="+", choices=list(MODELS), default=d["models"])
    p.add_argument("--layers", type=positive, default=d["layers"], help="the first N layers of each model")
    p.add_argument("--batches", nargs="+", type=positive, default=d["batches"])
    p.add_argument("--prompts", nargs="+", type=positive, default=d["prompts"], help="prompt lengths (tokens)")
    p.add_argument("--impls", nargs="+", choices=("nccl", "dma"), default=d["impls"],
                   help="collectives; the first (under the first schedule) is the logits reference")
    p.add_argument("--schedules", nargs="+", choices=SCHEDULES, default=d["schedules"],
                   help="where the collectives go: serial (in line), microbatch (two micro-batches interleaved, "
                        "collectives on a stream of their own), seqpar (prefill only: sequence parallel, pieces "
                        "pipelined)")
    p.add_argument("--pieces", type=positive, default=d["pieces"],
                   help="seqpar: pieces per all-gather / reduce-scatter of a block")
    p.add_argument("--overlap-path", choices=("dma", "auto"), default=d["overlap_path"],
                   help="dma's collectives under an overlapped schedule: dma (the copy engines, leaving the SMs to "
                        "the compute they overlap) or auto (as alone: the sm path or NCCL below the copy engines' "
                        "sizes)")
    p.add_argument("--no-breakdown", action="store_true",
                   help="skip the compute-alone and communication-alone runs (a third of the time)")
    p.add_argument("--decode-steps", type=positive, default=d["decode_steps"], help="graph replays per timing")
    p.add_argument("--repeats", type=positive, default=d["repeats"])
    p.add_argument("--output-len", type=positive, default=d["output_len"],
                   help="tokens per request for the derived e2e tokens/s")
    p.add_argument("--chunk-tokens", type=positive, default=d["chunk_tokens"],
                   help="most tokens per prefill forward (whole prompts)")
    p.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default=d["dtype"])
    p.add_argument("--seed", type=int, default=d["seed"])
    p.add_argument("--check-dtype", default=d["check_dtype"], choices=["float32", "bfloat16", "float16"],
                   help="dtype of the logits check (one untimed prefill + decode step per model and impl)")
    p.add_argument("--rtol", type=float, default=d["rtol"], help="logits check: relative tolerance")
    p.add_argument("--atol", type=float, default=d["atol"], help="logits check: absolute, times rms(ref)")
    p.add_argument("--dry-run", action="store_true", help="print the plan and its estimated duration; no GPU")
    p.add_argument("--hf-config-dir", help="write a Hugging Face config.json per model (the --layers slice) "
                                          "here for vLLM dummy-weight runs, then exit")
    add_out(p, "results/local/e2e/e2e/data.csv")
    p.set_defaults(func=cmd_e2e)
