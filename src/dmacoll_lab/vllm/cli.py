"""`dmacoll vllm ...`: `model` (a dummy-weight model folder), `bench` (one `vllm bench` run, plugin off or on),
`results` (vLLM's bench JSON as a tidy table), `check` (outputs with the plugin off and on), `routes` (the plugin's
routing table from the committed sweeps). vLLM for a GPU machine without network: tools/vllm_bundle.py."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dmacoll.lab_api import InvalidArgument, count as positive


def cmd_results(a: argparse.Namespace) -> int:
    from . import results

    if a.what == "meta":
        bad = [x for x in a.items if "=" not in x]
        if bad:
            print(f"dmacoll vllm results meta: not key=value: {bad}", file=sys.stderr)
            return 2
        results.write_meta(a.out, dict(x.split("=", 1) for x in a.items))
        return 0
    if a.what == "tests":
        rows = results.write_tests(a.out, a.items[0])
        outcomes = ("passed", "failed", "error", "skipped")
        print(", ".join(f"{sum(r['outcome'] == o for r in rows)} {o}" for o in outcomes))
        return 0
    results.write_csv(a.out, a.items)
    return 0


def cmd_model(a: argparse.Namespace) -> int:
    from . import model

    print(f"wrote {model.write(a.out, a.model, a.layers)} (config.json, synthetic tokenizer)")
    if a.weights:
        print(f"wrote {model.write_weights(a.out, a.model, a.layers, a.seed, a.device)}")
    return 0


def cmd_bench(a: argparse.Namespace) -> int:
    """One `vllm bench latency|throughput` run (dmacoll_lab.vllm.runs); vLLM's exit status."""
    from . import runs

    if a.bench == "latency" and a.batch is None:
        raise InvalidArgument("vllm bench latency needs --batch")
    if a.bench == "throughput" and a.num_prompts is None:
        raise InvalidArgument("vllm bench throughput needs --num-prompts")
    if not (Path(a.model_dir) / "config.json").exists():
        raise InvalidArgument(f"{a.model_dir} has no config.json (make one: dmacoll vllm model {a.model_dir} "
                              f"--model {a.spec})")
    run = runs.run_from_flags(a)
    return runs.execute(run, a.model_dir, Path(a.out_json), a.python or sys.executable)


def cmd_check(a: argparse.Namespace) -> int:
    """Outputs with the plugin off and on (dmacoll_lab.vllm.check); exit 1 if a comparison fails."""
    from . import check, model

    if a.tp < 2:
        raise InvalidArgument("vllm check needs --tp 2 or more: at TP 1 the plugin routes nothing")
    model_dir = Path(a.model_dir or Path(a.out) / "model")
    if not (model_dir / "model.safetensors").exists():
        model.write(model_dir, a.model, a.layers)
        model.write_weights(model_dir, a.model, a.layers, a.seed, a.device)
    rows = check.check(a.out, str(model_dir), a.tp, a.model, a.layers, a.python or sys.executable, a.prompts,
                       a.prompt_len, a.new_tokens, a.seed, reuse=a.reuse)
    for r in rows:
        print(f"{'ok  ' if r['ok'] else 'FAIL'} {r['comparison']} ({r['dtype']}): tokens {r['tokens_equal']}, "
              f"max |d logprob| {r['max_abs_logprob_diff']:.3g} ({r['max_rel_logprob_diff']:.3g} of the spread), "
              f"routed: {r['routed'] or 'nothing'} {r['why']}")
    return 0 if all(r["ok"] for r in rows) else 1


def cmd_routes(a: argparse.Namespace) -> int:
    """The vLLM plugin's routing table from the committed operator sweeps (--check: exit 1 if stale)."""
    from . import routes

    if a.check:
        if routes.stale():
            print(f"{routes.OUT} is stale: run `dmacoll vllm routes`")
            return 1
        print(f"{routes.OUT} is up to date")
        return 0
    print(f"{routes.OUT}: {'updated' if routes.write() else 'already up to date'}")
    return 0


def register(sub) -> None:
    from ..e2e.config import MODELS

    group = sub.add_parser("vllm", help="vLLM with and without the dmacoll plugin: model, bench, results, check, "
                                        "routes", description=__doc__)
    cmds = group.add_subparsers(dest="vllm_cmd", required=True, metavar="command")

    v = cmds.add_parser("results", help="meta: record how a `vllm bench` run was made (key=value ...); "
                                        "csv: vLLM result JSONs (each with its .meta.json) as one tidy CSV; tests: "
                                        "pytest's JUnit XML as a table")
    v.add_argument("what", choices=("meta", "csv", "tests"))
    v.add_argument("items", nargs="+", metavar="key=value | result.json")
    v.add_argument("--out", required=True)
    v.set_defaults(func=cmd_results)

    m = cmds.add_parser("model", help="a model folder for `vllm bench --load-format dummy`: config.json (e2e's "
                                      "shapes) and a synthetic tokenizer of its vocabulary size")
    m.add_argument("out")
    m.add_argument("--model", choices=list(MODELS), required=True)
    m.add_argument("--layers", type=positive, default=None, help="the first N layers (default: all)")
    m.add_argument("--weights", action="store_true", help="also model.safetensors: seeded random weights at a "
                                                          "trained model's scale (for dmacoll vllm check)")
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--device", default="cpu", help="where the random weights are drawn (cuda: faster)")
    m.set_defaults(func=cmd_model)

    b = cmds.add_parser("bench", help="one `vllm bench latency|throughput` run with the dmacoll plugin off "
                                      "(--plugin vllm) or on (dma); writes vLLM's JSON and a .meta.json")
    b.add_argument("--model-dir", required=True, help="a folder of `dmacoll vllm model`")
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
    b.set_defaults(func=cmd_bench)

    c = cmds.add_parser("check", help="outputs with the plugin off and on at TP >= 2: token for token where only "
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
    c.add_argument("--reuse", action="store_true", help="take the settings whose outputs are already in OUT (a run "
                                                        "with the same arguments, cut off by a time limit)")
    c.set_defaults(func=cmd_check)

    r = cmds.add_parser("routes", help="the plugin's routing table (dmacoll/integrations/vllm_routes.json) from "
                                       "the committed operator sweeps")
    r.add_argument("--check", action="store_true", help="only say whether it is stale (exit 1 if so)")
    r.set_defaults(func=cmd_routes)
