"""vLLM's benchmarks through dmacoll: the runs a config plans, the command of each (parsed back by the CLI),
what a finished run records (vLLM's all-reduce backends, the plugin's routing), the workflow's dry runs."""
import json
import os
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from dmacoll_lab import cli
from dmacoll_lab.vllm import results as vr
from dmacoll_lab.vllm import runs as vruns

ROOT = Path(__file__).resolve().parents[1]


def test_plan_covers_models_tp_ep_and_both_plugins():
    runs = vruns.plan({}, gpus=4)  # the defaults: 3 models, TP 1/2/4, Mixtral with and without EP where TP > 1
    combos = {(r.model, r.tp, r.ep) for r in runs.values()}
    assert combos == {(m, tp, False) for m in ("llama-3.1-8b", "llama-3.1-70b-l20", "mixtral-8x7b-l16")
                      for tp in (1, 2, 4)} | {("mixtral-8x7b-l16", tp, True) for tp in (2, 4)}
    per_combo = {c: sorted((r.bench, r.batch, r.plugin) for r in runs.values() if (r.model, r.tp, r.ep) == c)
                 for c in combos}
    want = sorted(2 * [("latency", b, p) for b in (1, 8, 32) for p in ("vllm", "dma")]  # two rounds each
                  + 2 * [("throughput", None, p) for p in ("vllm", "dma")])
    assert all(v == want for v in per_combo.values())
    assert {r.tp for r in vruns.plan({}, gpus=1).values()} == {1}  # one GPU: TP 1 only, no EP
    assert not any(r.ep for r in vruns.plan({}, gpus=1).values())
    assert vruns.models(runs) == {"llama-3.1-8b": ("llama-3.1-8b", None), "llama-3.1-70b-l20": ("llama-3.1-70b", 20),
                                  "mixtral-8x7b-l16": ("mixtral-8x7b", 16)}


def test_rounds_alternate_which_plugin_starts_first_and_chain_each_points_runs():
    """Of two vLLM starts in a row the second ran 2-6% slower: each point runs its rounds off-on, on-off, ...
    (ABBA), and each run waits for the one before it in its point (``previous``: the workflow's order)."""
    cfg = {"models": [{"name": "m", "spec": "llama-3.1-8b", "tp": [2]}], "latency": {"batches": [8]}, "rounds": 3}
    runs = vruns.plan(cfg, gpus=2)
    lat = [n for n in runs if n.startswith("latency_")]
    assert lat == [f"latency_m_tp2_b8_i128_{p}_r{n}" for n, pair in ((1, "vllm dma"), (2, "dma vllm"), (3, "vllm dma"))
                   for p in pair.split()]
    before = vruns.previous(runs)
    assert [before[n] for n in lat] == [None] + lat[:-1]
    assert before["throughput_m_tp2_vllm_r1"] is None
    assert before["throughput_m_tp2_dma_r1"] == "throughput_m_tp2_vllm_r1"
    assert len(vruns.plan({**cfg, "rounds": 1}, gpus=2)) == 4  # one round: each point off, then on
    for benches in (["latency"], ["throughput"]):  # one bench alone: the other's points are not planned
        assert {r.bench for r in vruns.plan({**cfg, "benches": benches}, gpus=2).values()} == set(benches)


def test_run_environment_and_vllm_arguments():
    r = vruns.plan({"models": [{"name": "m", "spec": "mixtral-8x7b", "layers": 2, "tp": [2], "ep": True,
                                "args": ["--enforce-eager"]}], "latency": {"batches": [4]}}, gpus=2)
    lat = r["latency_m_tp2_ep_b4_i128_dma_r1"]
    assert lat.env()["DMACOLL_VLLM"] == "1" and r["latency_m_tp2_ep_b4_i128_vllm_r1"].env()["DMACOLL_VLLM"] == "0"
    for k, v in {"VLLM_USE_FLASHINFER_SAMPLER": "0", "VLLM_ALLREDUCE_USE_SYMM_MEM": "0", "NCCL_NVLS_ENABLE": "0",
                 "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}.items():
        assert lat.env()[k] == v
    a = lat.vllm_args("/m")
    assert a[:4] == ["--model", "/m", "--load-format", "dummy"] and "--enable-expert-parallel" in a
    assert a[a.index("--batch-size") + 1] == "4" and a[a.index("--tensor-parallel-size") + 1] == "2"
    assert a[-1] == "--enforce-eager"
    thr = vruns.plan({"models": [{"name": "m", "spec": "llama-3.1-8b", "tp": [1]}]}, gpus=1)["throughput_m_tp1_vllm_r1"]
    b = thr.vllm_args("/m")
    assert b[b.index("--dataset-name") + 1] == "random" and b[b.index("--num-prompts") + 1] == "200"


@pytest.mark.parametrize("name", ["latency_mixtral-8x7b-l16_tp4_ep_b8_i128_dma_r1",
                                  "throughput_llama-3.1-8b_tp2_vllm_r2"])
def test_cli_flags_parse_back_into_the_same_run(name):
    run = vruns.plan({"args": ["--gpu-memory-utilization=0.8"]}, gpus=4)[name]
    argv = ["vllm", "bench", "--model-dir", "/m", "--out-json", "/x.json", *shlex.split(vruns.cli_flags(run))]
    args = cli.build_parser().parse_args(argv)
    assert vruns.run_from_flags(args) == run


def test_allreduce_backends_from_vllms_log_line():
    log = ("INFO 11-24 [cuda_communicator.py:268] Using ['CUSTOM', 'PYNCCL'] all-reduce backends (in dispatch "
           "order) for group 'tp:0' out of potential backends: ['NCCL_SYMM_MEM', 'QUICK_REDUCE', 'CUSTOM'].\n"
           "(Worker_TP1 pid=2) INFO Using ['PYNCCL'] all-reduce backends (in dispatch order) for group 'ep:0' out of "
           "potential backends: ['PYNCCL'].\n")
    assert vruns.allreduce_backends(log) == {"tp:0": ["CUSTOM", "PYNCCL"], "ep:0": ["PYNCCL"]}
    assert vruns.allreduce_backends("no such line") == {}


FAKE_VLLM = textwrap.dedent('''\
    """Stands in for `python -m dmacoll_lab.vllm.entry`: checks the environment, writes what vLLM would."""
    import json, os, sys
    args = sys.argv[3:]
    out = args[args.index("--output-json") + 1]
    assert os.environ["VLLM_USE_FLASHINFER_SAMPLER"] == "0"
    plugin = os.environ["DMACOLL_VLLM"]
    if plugin == "1":
        print("INFO dmacoll.vllm: dmacoll: CudaPlatform process groups use "
              "dmacoll.integrations.vllm.DmaCudaCommunicator (DMACOLL_VLLM=1)")
    print("Using ['CUSTOM', 'PYNCCL'] all-reduce backends (in dispatch order) for group 'tp:0' out of ...")
    if plugin == "1":
        for pid in (11, 12):  # two workers, one decision each
            with open(os.environ["DMACOLL_VLLM_DECISIONS"] + f"{pid}.jsonl", "a") as f:
                f.write(json.dumps({"group": "tp:0", "op": "all_gather", "mode": "graph", "size_class": "4 MB",
                                    "route": True, "reason": "faster"}) + "\\n")
                f.write(json.dumps({"group": "tp:0", "op": "all_reduce", "mode": "graph", "size_class": "any size",
                                    "route": False, "reason": "deferred"}) + "\\n")
    json.dump({"avg_latency": 0.5 if plugin == "1" else 0.6, "percentiles": {"50": 0.5}}, open(out, "w"))
    json.dump({"vllm": "0.26.0", "gpu": "NVIDIA H200", "torch": "2.11.0"}, open(out[:-5] + ".info.json", "w"))
''')


def test_execute_records_what_vllms_json_leaves_out(tmp_path, capsys):
    fake = tmp_path / "fake_python"
    (tmp_path / "fake.py").write_text(FAKE_VLLM)
    fake.write_text(f"#!/bin/sh\nexec {sys.executable} {tmp_path / 'fake.py'} \"$@\"\n")
    fake.chmod(0o755)
    (tmp_path / "model").mkdir()
    (tmp_path / "model/config.json").write_text("{}")
    outs = []
    for plugin in ("vllm", "dma"):
        out = tmp_path / f"raw/latency_{plugin}.json"
        argv = ["vllm", "bench", "--model-dir", str(tmp_path / "model"), "--out-json", str(out), "--bench", "latency",
                "--model-name", "m", "--spec", "llama-3.1-8b", "--tp", "2", "--plugin", plugin, "--batch", "8",
                "--python", str(fake)]
        assert cli.main(argv) == 0
        outs.append(str(out))
    meta = json.loads((tmp_path / "raw/latency_dma.meta.json").read_text())
    assert meta["allreduce_backends"] == '{"tp:0": ["CUSTOM", "PYNCCL"]}' and meta["vllm_version"] == "0.26.0"
    assert meta["dmacoll_routed"] == "all_gather graph 4 MB" and meta["dmacoll_decisions"] == 2  # deduplicated
    assert meta["plugin_registered"] is True
    off = json.loads((tmp_path / "raw/latency_vllm.meta.json").read_text())
    assert off["dmacoll_routed"] == "" and off["plugin_registered"] is False
    assert "DMACOLL_VLLM=1" in capsys.readouterr().out  # the command is printed with its environment
    csv = tmp_path / "data.csv"
    (tmp_path / "raw/latency_vllm.info.json").write_text('{"vllm": "0.26.0"}')  # as the run writes it
    everything = sorted(str(p) for p in (tmp_path / "raw").glob("*.json"))  # a shell glob names the sidecars too
    assert cli.main(["vllm", "results", "csv", "--out", str(csv), *everything]) == 0
    df = pd.read_csv(csv)
    avg = df[df["metric"] == "latency_avg"].set_index("plugin")["value"]
    assert avg["vllm"] == pytest.approx(600) and avg["dma"] == pytest.approx(500)
    assert set(df["gpu"]) == {"NVIDIA H200"} and list(df.columns) == vr.VLLM_COLUMNS


def test_bench_needs_a_model_folder_and_its_settings(tmp_path, capsys):
    base = ["vllm", "bench", "--model-dir", str(tmp_path), "--out-json", str(tmp_path / "x.json"), "--model-name", "m",
            "--spec", "llama-3.1-8b", "--plugin", "dma"]
    assert cli.main(base + ["--bench", "latency"]) == 2 and "needs --batch" in capsys.readouterr().err
    assert cli.main(base + ["--bench", "latency", "--batch", "1"]) == 2
    assert "has no config.json" in capsys.readouterr().err


def test_vllm_entry_says_how_to_use_it(capsys):
    from dmacoll_lab.vllm import entry as vllm_entry

    assert vllm_entry.main(["serve"]) == 2 and "latency|throughput" in capsys.readouterr().err


SNAKEMAKE = shutil.which("snakemake", path=str(Path(sys.executable).parent)) or shutil.which("snakemake")


@pytest.mark.skipif(SNAKEMAKE is None, reason="snakemake not installed")
@pytest.mark.parametrize("configs, gpus, tps", [(["config/vllm_1gpu.yaml"], 1, {1}),
                                                (["config/h200x2.yaml"], 2, {1, 2}),
                                                (["config/h200x4.yaml"], 4, {1, 2, 4})])
def test_workflow_plans_the_vllm_runs(tmp_path, configs, gpus, tps):
    (tmp_path / "extra.yaml").write_text(f"outdir: {tmp_path}\nvllm: {{enabled: true}}\n")
    r = subprocess.run([SNAKEMAKE, "--cores", "1", "--dry-run", "--printshellcmds", "--configfile",
                        "config/config.yaml", *configs, str(tmp_path / "extra.yaml"), "--until", "vllm_results"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ})
    assert r.returncode == 0, r.stderr[-2000:]
    runs = vruns.plan({}, gpus)
    assert {x.tp for x in runs.values()} == tps
    assert r.stdout.count("rule vllm_bench:") == len(runs) and r.stdout.count("rule vllm_model:") == 3
    lines = [x for x in r.stdout.splitlines() if "-m dmacoll_lab vllm bench" in x]
    for line in lines:  # every planned command parses back into its run
        argv = shlex.split(line.split(">")[0])
        args = cli.build_parser().parse_args(argv[argv.index("vllm"):])
        assert vruns.run_from_flags(args) == runs[args.name]
    assert bench_inputs(r.stdout) == {name: {f"{tmp_path}/vllm/bench/raw/{before}.json"} if before else set()
                                      for name, before in vruns.previous(runs).items()}  # the rounds' order


def bench_inputs(dry_run: str) -> dict[str, set[str]]:
    """Per vllm_bench job of a Snakemake dry run, the runs' JSON files among its inputs (what it waits for)."""
    jobs = {}
    for block in dry_run.split("rule vllm_bench:")[1:]:
        fields = dict(line.strip().split(": ", 1) for line in block.splitlines()[1:9] if ": " in line)
        jobs[fields["wildcards"].split("run=", 1)[1]] = {x for x in fields["input"].split(", ") if x.endswith(".json")}
    return jobs
