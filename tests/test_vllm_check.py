"""The output check with the plugin off and on: the comparisons, the driver (against a stand-in for vLLM) and the
random checkpoint it serves (its names and shapes against transformers' own models, where installed)."""
import dataclasses
import importlib.util
import json
import os
import random
import shutil
import sys
import textwrap

import pandas as pd
import pytest

from dmacoll_lab import cli
from dmacoll_lab.e2e import config
from dmacoll_lab.vllm import check as vc, model as vllm_model

REQUIRE = bool(os.environ.get("DMACOLL_REQUIRE_VLLM"))
needs_transformers = pytest.mark.skipif(importlib.util.find_spec("transformers") is None and not REQUIRE,
                                        reason="transformers is not installed here (make test-vllm runs this)")


def outputs(seed, n=3, length=10, new=6, scale=1.0):
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        prompt = [rng.randrange(3, 1000) for _ in range(length)]
        rows.append({"prompt": prompt, "tokens": [rng.randrange(3, 1000) for _ in range(new)],
                     "prompt_logprobs": [None] + [-scale * rng.uniform(1, 9) for _ in range(length - 1)],
                     "sample_logprobs": [-rng.uniform(0, 3) for _ in range(new)]})
    return rows


def test_exact_comparison_wants_every_token_and_bit(seed):
    off = outputs(seed)
    assert vc.compare(off, json.loads(json.dumps(off)), "exact")["ok"], f"seed {seed}"
    flipped = json.loads(json.dumps(off))
    flipped[1]["tokens"][4] += 1
    r = vc.compare(off, flipped, "exact")
    assert not r["ok"] and r["tokens_equal"] == "2/3" and r["sample_tokens"] == "17/18", f"seed {seed}: {r}"
    nudged = json.loads(json.dumps(off))
    nudged[0]["sample_logprobs"][0] += 1e-7
    assert not vc.compare(off, nudged, "exact")["ok"], f"seed {seed}"


def test_close_comparison_scales_with_the_spread_of_each_prompt(seed):
    off = outputs(seed)
    near = json.loads(json.dumps(off))
    for r in near:
        r["prompt_logprobs"] = [None if x is None else x * (1 + 1e-6) for x in r["prompt_logprobs"]]
        r["tokens"][-1] += 1  # a flipped near-tie is reported, not failed
    got = vc.compare(off, near, "close")
    assert got["ok"] and got["max_rel_logprob_diff"] < 1e-4 and got["tokens_equal"] == "0/3", f"seed {seed}: {got}"
    far = json.loads(json.dumps(off))
    far[2]["prompt_logprobs"][5] += 0.01 * vc.spread(off[2]["prompt_logprobs"])  # 1% of the spread: too far
    assert not vc.compare(off, far, "close")["ok"], f"seed {seed}"
    tiny = outputs(seed, scale=1e-6)  # flat logits (vLLM's dummy weights): the tolerance shrinks with them
    moved = json.loads(json.dumps(tiny))
    moved[0]["prompt_logprobs"][3] += 1e-7
    assert not vc.compare(tiny, moved, "close")["ok"], f"seed {seed}"
    with pytest.raises(ValueError, match="different prompts"):
        vc.compare(off, outputs(seed + 1), "close")


def test_routed_kinds():
    d = [{"op": "all_gatherv", "route": True}, {"op": "all_reduce", "route": False}]
    assert vc.routed_kinds(d) == {"moves"}
    assert vc.routed_kinds(d + [{"op": "reduce_scatter", "route": True}]) == {"moves", "sums"}


FAKE = textwrap.dedent('''\
    """Stands in for `python -m dmacoll_lab.vllm.check generate`: fixed outputs, the plugin's decision lines."""
    import json, os, random, sys
    model, tp, dtype, out, n, length, new, seed, max_len = sys.argv[4:13]  # after -m MODULE generate
    rng = random.Random(int(seed))
    rows = []
    for _ in range(int(n)):
        prompt = [rng.randrange(3, 100) for _ in range(int(length))]
        rows.append({"prompt": prompt, "tokens": [7] * int(new), "sample_logprobs": [-1.0] * int(new),
                     "prompt_logprobs": [None] + [-1.0 - i / 7 for i in range(int(length) - 1)]})
    route = os.environ["DMACOLL_VLLM_ROUTE"]
    if os.environ["DMACOLL_VLLM"] == "1":
        ops = ["all_gather"] + (["all_reduce"] if route == "all" else [])
        with open(os.environ["DMACOLL_VLLM_DECISIONS"] + "5.jsonl", "w") as f:
            for op in ops:
                f.write(json.dumps({"group": "tp:0", "op": op, "mode": "graph", "size_class": "any size",
                                    "route": True, "reason": route}) + "\\n")
        if route == "all" and os.environ.get("BREAK_SUMS"):
            rows[0]["prompt_logprobs"][2] += 0.5
    elif os.environ.get("JITTER_OFF_AGAIN") and out.endswith("off_bf16_again.json"):
        rows[0]["sample_logprobs"][1] += 0.03
    json.dump(rows, open(out, "w"))
''')


@pytest.fixture
def fake_python(tmp_path):
    (tmp_path / "fake.py").write_text(FAKE)
    exe = tmp_path / "python"
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} {tmp_path / 'fake.py'} \"$@\"\n")
    exe.chmod(0o755)
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_text("")  # present: the CLI does not write one
    return str(exe), str(model)


def test_driver_runs_every_setting_and_writes_the_verdicts(tmp_path, fake_python, monkeypatch, capsys):
    exe, model = fake_python
    out = tmp_path / "check"
    argv = ["vllm", "check", str(out), "--tp", "2", "--model-dir", model, "--python", exe, "--prompts", "3"]
    assert cli.main(argv) == 0
    df = pd.read_csv(out / "data.csv")
    assert list(df["comparison"]) == ["off_bf16_again vs off_bf16", "moves_bf16 vs off_bf16",
                                      "all_fp32 vs off_fp32"] and df["ok"].all()
    assert list(df["routed"].fillna("")) == ["", "all_gather graph any size",
                                             "all_gather graph any size; all_reduce graph any size"]
    assert (out / "data.json").exists() and (out / "all_fp32.log").exists()
    monkeypatch.setenv("BREAK_SUMS", "1")
    assert cli.main(argv) == 1
    assert "FAIL all_fp32 vs off_fp32" in capsys.readouterr().out


def test_a_comparison_that_routed_nothing_fails(tmp_path, fake_python, monkeypatch):
    exe, model = fake_python
    monkeypatch.setattr(vc, "SETTINGS", tuple(dataclasses.replace(s, route="measured") for s in vc.SETTINGS))
    rows = vc.check(tmp_path / "c", model, 2, "llama-3.1-8b", 2, exe, n=2)
    assert not rows[2]["ok"] and "nothing of kind 'sums' was routed" in rows[2]["why"]


def test_an_exact_comparison_is_not_judged_when_vllm_does_not_repeat_itself(tmp_path, fake_python, monkeypatch):
    exe, model = fake_python
    monkeypatch.setenv("JITTER_OFF_AGAIN", "1")  # the stand-in's second plugin-off run differs a little
    rows = vc.check(tmp_path / "c", model, 2, "llama-3.1-8b", 2, exe, n=2)
    assert not rows[0]["ok"] and rows[0]["why"] == "vLLM does not repeat its own outputs bit for bit"
    assert not rows[1]["ok"] and rows[1]["why"].startswith("not judged: the plugin-off repeat differs too"), rows[1]
    assert rows[2]["ok"]


@pytest.mark.parametrize("name", ["llama-3.1-8b", "mixtral-8x7b"])
def test_weight_names_and_shapes(name, tmp_path):
    spec = config.spec(name, 2)
    shapes = vllm_model.weight_shapes(spec)
    per_layer = 9 if not spec.moe else 6 + 1 + 3 * spec.experts
    assert len(shapes) == 3 + 2 * per_layer
    assert shapes["lm_head.weight"] == (spec.vocab, spec.hidden)


@needs_transformers
@pytest.mark.parametrize("name", ["llama-3.1-8b", "mixtral-8x7b"])
def test_weights_load_into_transformers_own_model(name, tmp_path, monkeypatch, seed):
    """transformers loads the checkpoint (Hugging Face's names, what vLLM's weight loaders read) into its
    LlamaForCausalLM / MixtralForCausalLM with no key missing, unexpected or mismatched, here at a small size."""
    import torch
    import transformers

    small = dataclasses.replace(config.spec(name, 2), hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=96,
                                vocab=128)
    monkeypatch.setattr(vllm_model.config, "spec", lambda *a: small)
    vllm_model.write(tmp_path, name, 2)
    path = vllm_model.write_weights(tmp_path, name, 2, seed=seed)
    model, info = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), output_loading_info=True,
                                                                    dtype=torch.float32)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    from safetensors.torch import load_file

    ours = load_file(str(path))
    w = ours["model.layers.0.mlp.down_proj.weight" if name.startswith("llama") else
             "model.layers.0.block_sparse_moe.experts.0.w2.weight"].float()
    # std 1/sqrt(fan-in), estimated from 6144 samples: 0.1 is ~10 standard errors, so any seed passes
    assert abs(w.std().item() * small.intermediate ** 0.5 - 1) < 0.1, f"seed {seed}"
    assert torch.equal(ours["model.norm.weight"].float(), torch.ones(small.hidden))
    assert torch.equal(model.lm_head.weight, ours["lm_head.weight"].float())  # loaded, not re-initialised


def test_reuse_takes_the_settings_a_cut_off_run_finished_and_runs_the_rest(tmp_path, fake_python):
    exe, model = fake_python
    out = tmp_path / "c"
    first = vc.check(out, model, 2, "llama-3.1-8b", 2, exe, n=2)
    (out / "all_fp32.json").unlink()  # the run was cut off before its last setting
    failing = shutil.which("false")  # a setting that runs here fails, naming itself
    with pytest.raises(RuntimeError, match="^all_fp32: vLLM exited"):
        vc.check(out, model, 2, "llama-3.1-8b", 2, failing, n=2, reuse=True)  # only the missing one runs
    assert vc.check(out, model, 2, "llama-3.1-8b", 2, exe, n=2, reuse=True) == first
    with pytest.raises(RuntimeError, match="^off_bf16: vLLM exited"):
        vc.check(out, model, 2, "llama-3.1-8b", 2, failing, n=2)  # without reuse every setting runs again
