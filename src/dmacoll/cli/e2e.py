"""`dmacoll e2e` (the built-in LLM inference benchmark) and the vLLM side: `vllm-model` (a dummy-weight model
folder), `vllm-bench` (one `vllm bench` run, plugin off or on), `vllm-results` (vLLM's bench JSON as a tidy table),
`vllm-bundle` (vLLM for a GPU machine without network), `vllm-check` (outputs with the plugin off and on)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..errors import InvalidArgument
from .common import add_out, add_ranks, planned_world, positive, run_on_gpus


def cmd_e2e(a: argparse.Namespace) -> int:
    """LLM inference (prefill + CUDA-graph decode) with NCCL vs dmacoll collectives; --dry-run: the plan only."""
    from ..e2e import config as e2e

    cfg = dict(models=a.models, layers=a.layers, batches=a.batches, prompts=a.prompts, impls=a.impls,
               schedules=a.schedules, pieces=a.pieces, breakdown=not a.no_breakdown,
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
    from ..errors import InvalidArgument

    check_schedules(cfg["schedules"], cfg["pieces"])
    if world < 2 and "dma" in cfg["impls"]:
        raise InvalidArgument("dmacoll collectives need at least 2 ranks; on one GPU run --impls nccl (the "
                              "schedules then run their compute and NCCL's one-rank calls)")


def cmd_vllm_results(a: argparse.Namespace) -> int:
    from ..e2e import vllm_results as vr

    if a.what == "meta":
        bad = [x for x in a.items if "=" not in x]
        if bad:
            print(f"dmacoll vllm-results meta: not key=value: {bad}", file=sys.stderr)
            return 2
        vr.write_meta(a.out, dict(x.split("=", 1) for x in a.items))
        return 0
    if a.what == "tests":
        rows = vr.write_tests(a.out, a.items[0])
        print(", ".join(f"{sum(r['outcome'] == o for r in rows)} {o}" for o in ("passed", "failed", "error", "skipped")))
        return 0
    vr.write_csv(a.out, a.items)
    return 0


def cmd_vllm_model(a: argparse.Namespace) -> int:
    from ..e2e import vllm_model

    print(f"wrote {vllm_model.write(a.out, a.model, a.layers)} (config.json, synthetic tokenizer)")
    if a.weights:
        print(f"wrote {vllm_model.write_weights(a.out, a.model, a.layers, a.seed, a.device)}")
    return 0


def cmd_vllm_bench(a: argparse.Namespace) -> int:
    """One `vllm bench latency|throughput` run (dmacoll.e2e.vllm_runs); vLLM's exit status."""
    from ..e2e import vllm_runs

    if a.bench == "latency" and a.batch is None:
        raise InvalidArgument("vllm-bench latency needs --batch")
    if a.bench == "throughput" and a.num_prompts is None:
        raise InvalidArgument("vllm-bench throughput needs --num-prompts")
    if not (Path(a.model_dir) / "config.json").exists():
        raise InvalidArgument(f"{a.model_dir} has no config.json (make one: dmacoll vllm-model {a.model_dir} "
                              f"--model {a.spec})")
    run = vllm_runs.run_from_flags(a)
    return vllm_runs.execute(run, a.model_dir, Path(a.out_json), a.python or sys.executable)


def cmd_vllm_check(a: argparse.Namespace) -> int:
    """Outputs with the plugin off and on (dmacoll.e2e.vllm_check); exit 1 if a comparison fails."""
    from ..e2e import vllm_check, vllm_model

    if a.tp < 2:
        raise InvalidArgument("vllm-check needs --tp 2 or more: at TP 1 the plugin routes nothing")
    model_dir = Path(a.model_dir or Path(a.out) / "model")
    if not (model_dir / "model.safetensors").exists():
        vllm_model.write(model_dir, a.model, a.layers)
        vllm_model.write_weights(model_dir, a.model, a.layers, a.seed, a.device)
    rows = vllm_check.check(a.out, str(model_dir), a.tp, a.model, a.layers, a.python or sys.executable, a.prompts,
                            a.prompt_len, a.new_tokens, a.seed)
    for r in rows:
        print(f"{'ok  ' if r['ok'] else 'FAIL'} {r['comparison']} ({r['dtype']}): tokens {r['tokens_equal']}, "
              f"max |d logprob| {r['max_abs_logprob_diff']:.3g} ({r['max_rel_logprob_diff']:.3g} of the spread), "
              f"routed: {r['routed'] or 'nothing'} {r['why']}")
    return 0 if all(r["ok"] for r in rows) else 1


def cmd_vllm_bundle(a: argparse.Namespace) -> int:
    from ..e2e import vllm_bundle as vb

    if a.probe:
        Path(a.out).write_text(vb.probe().to_json())
        print(f"wrote {a.out}")
        return 0
    m = vb.build(a.out, a.vllm, a.target, a.piece_mib, a.cache)
    tree = vb.tree_mib()
    print(f"{a.out}: vLLM {m['vllm']} and {len(m['wheels']) - 1} wheels the target lacks, {m['tar_bytes'] >> 20} MiB "
          f"in {len(m['pieces'])} pieces: " + ", ".join(f"{p['file']} {p['bytes'] / 2**20:.1f} MiB" for p in m["pieces"]))
    print(f"left out: {', '.join(m['left_out'])}; import check: {m['import_check']}")
    print(f"each call carries one piece + the working tree ({tree:.1f} MiB): keep both under 64 MiB")
    return 0


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

    v = sub.add_parser("vllm-results", help="meta: record how a `vllm bench` run was made (key=value ...); "
                                            "csv: vLLM result JSONs (each with its .meta.json) as one tidy CSV; tests: "
                                            "pytest's JUnit XML as a table")
    v.add_argument("what", choices=("meta", "csv", "tests"))
    v.add_argument("items", nargs="+", metavar="key=value | result.json")
    v.add_argument("--out", required=True)
    v.set_defaults(func=cmd_vllm_results)

    m = sub.add_parser("vllm-model", help="a model folder for `vllm bench --load-format dummy`: config.json (e2e's "
                                          "shapes) and a synthetic tokenizer of its vocabulary size")
    m.add_argument("out")
    m.add_argument("--model", choices=list(MODELS), required=True)
    m.add_argument("--layers", type=positive, default=None, help="the first N layers (default: all)")
    m.add_argument("--weights", action="store_true", help="also model.safetensors: seeded random weights at a "
                                                          "trained model's scale (for dmacoll vllm-check)")
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--device", default="cpu", help="where the random weights are drawn (cuda: faster)")
    m.set_defaults(func=cmd_vllm_model)

    b = sub.add_parser("vllm-bench", help="one `vllm bench latency|throughput` run with the dmacoll plugin off "
                                          "(--plugin vllm) or on (dma); writes vLLM's JSON and a .meta.json")
    b.add_argument("--model-dir", required=True, help="a folder of `dmacoll vllm-model`")
    b.add_argument("--out-json", required=True)
    b.add_argument("--name", default="run")
    b.add_argument("--bench", choices=("latency", "throughput"), required=True)
    b.add_argument("--model-name", required=True, help="how results name the model")
    b.add_argument("--spec", choices=list(MODELS), required=True)
    b.add_argument("--layers", type=positive, default=None)
    b.add_argument("--tp", type=positive, default=1)
    b.add_argument("--ep", action="store_true", help="--enable-expert-parallel")
    b.add_argument("--plugin", choices=("vllm", "dma"), required=True, help="DMACOLL_VLLM=0 (vllm) or =1 (dma)")
    b.add_argument("--batch", type=positive, default=None)
    b.add_argument("--input-len", type=positive, default=128)
    b.add_argument("--output-len", type=positive, default=128)
    b.add_argument("--warmup", type=int, default=3)
    b.add_argument("--iters", type=positive, default=10)
    b.add_argument("--num-prompts", type=positive, default=None)
    b.add_argument("--max-model-len", type=positive, default=2048)
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--vllm-arg", action="append", help="one more argument for vLLM (repeat)")
    b.add_argument("--python", help="the interpreter that has vLLM (default: this one)")
    b.set_defaults(func=cmd_vllm_bench)

    c = sub.add_parser("vllm-check", help="outputs with the plugin off and on at TP >= 2: token for token where only "
                                          "data moves, log-probabilities within a tolerance where sums are routed")
    c.add_argument("out")
    c.add_argument("--tp", type=positive, default=2)
    c.add_argument("--model", choices=list(MODELS), default="llama-3.1-8b")
    c.add_argument("--layers", type=positive, default=2)
    c.add_argument("--model-dir", help="a folder with model.safetensors (default: OUT/model, written if missing)")
    c.add_argument("--prompts", type=positive, default=8)
    c.add_argument("--prompt-len", type=positive, default=64)
    c.add_argument("--new-tokens", type=positive, default=32)
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--device", default="cpu", help="where the random weights are drawn")
    c.add_argument("--python", help="the interpreter that has vLLM (default: this one)")
    c.set_defaults(func=cmd_vllm_check)

    u = sub.add_parser("vllm-bundle", help="vLLM and the wheels a GPU machine without network lacks, in pieces "
                                           "that fit one transfer, with a checking install script (docs/e2e.md)")
    u.add_argument("out", help="the bundle folder (partNN + meta/); with --probe: the snapshot file to write")
    u.add_argument("--probe", action="store_true", help="write this machine's snapshot (python, glibc, installed "
                                                        "packages) to OUT instead; run it on the GPU machine")
    u.add_argument("--vllm", default=None, help="vLLM version (default: the newest that pins torch 2.11.0)")
    u.add_argument("--target", default=None, help="the target's snapshot (default: envs/lent-gpu.json)")
    u.add_argument("--piece-mib", type=positive, default=None)
    u.add_argument("--cache", default=None, help="where downloaded wheels are kept (default: OUT_cache beside OUT)")
    u.set_defaults(func=cmd_vllm_bundle)
