"""Outputs with the dmacoll plugin off and on must agree (``dmacoll vllm check``, for TP 2 and more).

    dmacoll vllm check OUT_DIR --tp 2 [--model llama-3.1-8b --layers 2]

One model folder with seeded random weights at a trained model's scale (``model.write_weights``; vLLM's own
dummy weights would make every logit nearly equal), the same token-id prompts and greedy decoding, each setting in
a process of its own (``python -m dmacoll_lab.vllm.check generate``):

* the plugin off, bfloat16, twice: vLLM must repeat its own outputs bit for bit, or no bit-for-bit comparison
  can judge the plugin (the first TP 2 run, 2x H200, saw data movement differ by 0.031 in a log-probability and had
  no such baseline: ``results/h200x2/vllm/README.md``);
* data movement only (``DMACOLL_VLLM_ROUTE=moves``: every eligible all-gather on dmacoll, no sums), bfloat16,
  against the plugin off: **token for token**, and every prompt and sample log-probability bit for bit (where the
  repeat was not bit-equal, this comparison fails saying so, with both differences);
* every eligible call (``DMACOLL_VLLM_ROUTE=all``: all-reduce and reduce-scatter too), float32, against the plugin
  off in float32: the prompt log-probabilities (teacher-forced, so one early difference does not carry over)
  within ``|on - off| <= RTOL x spread(off)`` per prompt, where spread is the standard deviation of the reference's
  log-probabilities over the prompt's positions (the scale the model separates tokens by); the greedy tokens are
  reported, not required (a near-tie may flip). Why float32: dmacoll sums in float32 and rounds once, vLLM's
  custom all-reduce and NCCL round each partial sum to bf16, so in bf16 they legitimately differ by roundings.

Each run records which calls the plugin actually sent to dmacoll (``DMACOLL_VLLM_DECISIONS``); a comparison where
nothing of its kind was routed fails, since it would test nothing. Results: ``OUT_DIR/data.csv`` (a row per
comparison) with provenance, the generated outputs beside it.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from . import runs

RTOL = 1e-3  # float32: roundings of sums in another order are ~1e-6 of the spread; a wrong sum is O(1)
CHECK_COLUMNS = ["comparison", "dtype", "route", "tp", "model", "layers", "prompts", "routed", "tokens_equal",
                 "sample_tokens", "max_abs_logprob_diff", "max_rel_logprob_diff", "tolerance", "ok", "why"]


@dataclass(frozen=True)
class Setting:
    name: str
    plugin: bool
    route: str  # DMACOLL_VLLM_ROUTE
    dtype: str


SETTINGS = (Setting("off_bf16", False, "measured", "bfloat16"),
            Setting("off_bf16_again", False, "measured", "bfloat16"), Setting("moves_bf16", True, "moves", "bfloat16"),
            Setting("off_fp32", False, "measured", "float32"), Setting("all_fp32", True, "all", "float32"))
# (reference, other, kind); 'repeat': the reference against itself, bit for bit, judging what 'exact' can judge
COMPARISONS = (("off_bf16", "off_bf16_again", "repeat"), ("off_bf16", "moves_bf16", "exact"),
               ("off_fp32", "all_fp32", "close"))


def prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    """Token-id prompts, the same in every run (ids 3.. : no special tokens)."""
    import random

    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(length)] for _ in range(n)]


# -- inside vLLM's interpreter ---------------------------------------------------------------------------------------
def generate(model_dir: str, tp: int, dtype: str, out: str, n: int, length: int, new_tokens: int, seed: int,
             max_model_len: int, extra: Sequence[str] = ()) -> None:
    """Greedy outputs of ``n`` prompts with prompt and sample log-probabilities (top 5), as JSON."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    vocab = json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"]
    llm = LLM(model=model_dir, tensor_parallel_size=tp, dtype=dtype, seed=seed, max_model_len=max_model_len,
              skip_tokenizer_init=True, **(json.loads(extra[0]) if extra else {}))
    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True, logprobs=5, prompt_logprobs=5,
                            detokenize=False)
    ids = prompts(n, length, vocab, seed)
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in ids], params, use_tqdm=False)
    rows = []
    for p, o in zip(ids, outputs):
        c = o.outputs[0]
        prompt_lp = [None if pos is None else float(dict(pos)[tok].logprob)
                     for tok, pos in zip(p, o.prompt_logprobs)]
        sample_lp = [float(dict(pos)[tok].logprob) for tok, pos in zip(c.token_ids, c.logprobs)]
        rows.append({"prompt": p, "tokens": list(c.token_ids), "prompt_logprobs": prompt_lp,
                     "sample_logprobs": sample_lp})
    Path(out).write_text(json.dumps(rows) + "\n")


# -- comparing ----------------------------------------------------------------------------------------------------
def spread(values: Sequence[float]) -> float:
    xs = [v for v in values if v is not None]
    mean = sum(xs) / len(xs)
    return math.sqrt(sum((x - mean) ** 2 for x in xs) / len(xs))


def compare(off: list[dict], on: list[dict], kind: str, rtol: float = RTOL) -> dict:
    """``exact`` (and ``repeat``): same tokens and bit-equal log-probabilities; ``close``: prompt log-probabilities
    within ``rtol`` x spread(off) per prompt. Returns the measured differences and the verdict."""
    if [r["prompt"] for r in off] != [r["prompt"] for r in on]:
        raise ValueError("the two runs had different prompts")
    equal = sum(a["tokens"] == b["tokens"] for a, b in zip(off, on))
    same = sum(x == y for a, b in zip(off, on) for x, y in zip(a["tokens"], b["tokens"]))
    total = sum(len(a["tokens"]) for a in off)
    worst_abs = worst_rel = 0.0
    for a, b in zip(off, on):
        pairs = [(x, y) for x, y in zip(a["prompt_logprobs"], b["prompt_logprobs"]) if x is not None]
        if kind != "close":
            pairs += list(zip(a["sample_logprobs"], b["sample_logprobs"]))
        diff = max(abs(x - y) for x, y in pairs)
        worst_abs = max(worst_abs, diff)
        worst_rel = max(worst_rel, diff / max(spread(a["prompt_logprobs"]), 1e-30))
    row = {"tokens_equal": f"{equal}/{len(off)}", "sample_tokens": f"{same}/{total}",
           "max_abs_logprob_diff": worst_abs, "max_rel_logprob_diff": worst_rel}
    if kind != "close":
        ok = equal == len(off) and worst_abs == 0.0
        why = "vLLM does not repeat its own outputs bit for bit" if kind == "repeat" else \
            "data movement must not change a bit"
        return {**row, "tolerance": "identical", "ok": ok, "why": "" if ok else why}
    ok = worst_rel <= rtol
    return {**row, "tolerance": f"|on - off| <= {rtol:g} x spread(off) per prompt", "ok": ok,
            "why": "" if ok else "prompt log-probabilities differ beyond the tolerance"}


def routed_kinds(decisions: list[dict]) -> set[str]:
    """``moves`` and / or ``sums``: what the plugin sent to dmacoll in a run."""
    from dmacoll.lab_api import SERVED_BY, moves

    return {"moves" if moves(SERVED_BY[d["op"]]) else "sums" for d in decisions if d["route"]}


# -- the driver ------------------------------------------------------------------------------------------------------
def run_setting(s: Setting, model_dir: str, out_dir: Path, tp: int, python: str, n: int, length: int,
                new_tokens: int, seed: int, max_model_len: int, reuse: bool = False) -> tuple[list[dict], list[dict]]:
    """One setting in a process of its own; its outputs and the plugin's decisions (``reuse``: those a finished
    earlier run of this setting left in ``out_dir``, where there are)."""
    trace = out_dir / f"{s.name}.decisions"
    out = out_dir / f"{s.name}.json"
    if reuse and out.exists():
        print(f"reusing {out} (--reuse)", flush=True)
        return json.loads(out.read_text()), runs.decisions(trace)
    trace.mkdir(parents=True, exist_ok=True)
    for old in trace.glob("*.jsonl"):
        old.unlink()
    env = {**os.environ, **runs.ENV, "DMACOLL_VLLM": "1" if s.plugin else "0", "DMACOLL_VLLM_ROUTE": s.route,
           "DMACOLL_VLLM_DECISIONS": str(trace / "decisions-")}
    cmd = [python, "-m", "dmacoll_lab.vllm.check", "generate", model_dir, str(tp), s.dtype, str(out), str(n),
           str(length), str(new_tokens), str(seed), str(max_model_len)]
    print(f"$ DMACOLL_VLLM={env['DMACOLL_VLLM']} DMACOLL_VLLM_ROUTE={s.route} " + " ".join(cmd), flush=True)
    with open(out_dir / f"{s.name}.log", "w") as log:
        code = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    if code or not out.exists():
        raise RuntimeError(f"{s.name}: vLLM exited with {code} (see {out_dir / (s.name + '.log')})")
    return json.loads(out.read_text()), runs.decisions(trace)


def check(out_dir: str | Path, model_dir: str, tp: int, model: str, layers: Optional[int], python: str = sys.executable,
          n: int = 8, length: int = 64, new_tokens: int = 32, seed: int = 0, max_model_len: int = 512,
          rtol: float = RTOL, reuse: bool = False) -> list[dict]:
    """Every setting, then every comparison; the rows of data.csv (written with provenance). ``reuse``: take the
    settings a run cut off by a time limit finished (same model and arguments: the caller's word)."""
    from ..bench import provenance

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    results = {s.name: run_setting(s, model_dir, out_dir, tp, python, n, length, new_tokens, seed, max_model_len,
                                   reuse) for s in SETTINGS}
    rows, repeat = [], None
    for ref, other, kind in COMPARISONS:
        setting = next(s for s in SETTINGS if s.name == other)
        got = routed_kinds(results[other][1])
        need = {"repeat": None, "exact": "moves", "close": "sums"}[kind]
        row = {"comparison": f"{other} vs {ref}", "dtype": setting.dtype, "route": setting.route, "tp": tp,
               "model": model, "layers": layers or "", "prompts": n,
               "routed": runs.routed_summary(results[other][1]),
               **compare(results[ref][0], results[other][0], kind, rtol)}
        if need and need not in got:
            row.update(ok=False, why=f"nothing of kind '{need}' was routed: the comparison would test nothing")
        if kind == "exact" and repeat is not None and not repeat["ok"]:
            row.update(ok=False, why=f"not judged: the plugin-off repeat differs too (max |d logprob| "
                                     f"{repeat['max_abs_logprob_diff']:.3g}, "
                                     f"this one {row['max_abs_logprob_diff']:.3g})")
        if any(results[ref][1]) or kind == "repeat" and any(results[other][1]):
            row.update(ok=False, why="the plugin-off run routed calls")
        repeat = row if kind == "repeat" else repeat
        rows.append(row)
    provenance.write_table(out_dir / "data.csv", rows, CHECK_COLUMNS,
                           {"tp": tp, "model": model, "layers": layers, "prompts": n, "prompt_len": length,
                            "new_tokens": new_tokens, "seed": seed, "rtol": rtol, "env": runs.ENV})
    return rows


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m dmacoll_lab.vllm.check generate MODEL_DIR TP DTYPE OUT N LEN NEW SEED MAX_LEN [LLM_KWARGS_JSON]``"""
    a = list(sys.argv[1:] if argv is None else argv)
    if len(a) < 10 or a[0] != "generate":
        print(main.__doc__, file=sys.stderr)
        return 2
    generate(a[1], int(a[2]), a[3], a[4], int(a[5]), int(a[6]), int(a[7]), int(a[8]), int(a[9]), a[10:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
