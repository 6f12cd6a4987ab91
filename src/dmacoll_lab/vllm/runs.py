"""vLLM's own benchmarks with and without the dmacoll plugin: the runs a config asks for, the command of each, and
what a run records beside vLLM's JSON.

The workflow (``workflow/rules/e2e.smk``: rules ``vllm_model``, ``vllm_bench``, ``vllm_results``) and the
one-GPU script (``tools/vllm_gpu_run.sh``) both run ``dmacoll vllm bench``, which runs one of them:

    python -m dmacoll_lab.vllm.entry latency|throughput ARGS    # = `vllm bench latency|throughput ARGS`

``entry.py`` parses ARGS with the benchmark module's own ``add_cli_args`` and calls its ``main``: what the
``vllm bench`` subcommand does, without importing vLLM's API server (its CLI loads every subcommand, which needs
uvicorn and more; the offline benchmarks need none of it). Every run uses dummy weights from a model folder of
``dmacoll vllm model`` (config.json + synthetic tokenizer), the environment of ``ENV`` and ``DMACOLL_VLLM`` off
(plugin ``vllm``) or on (``dma``). After the run, ``RunRecord`` adds what vLLM's JSON leaves out: vLLM's version,
the all-reduce backends it enabled per group (its log line), and what the plugin routed (its decision lines).
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

# on the lent machines: no FlashInfer (its sampler), no symmetric-memory all-reduce, NVLink multicast off
ENV = {"VLLM_USE_FLASHINFER_SAMPLER": "0", "VLLM_ALLREDUCE_USE_SYMM_MEM": "0", "NCCL_NVLS_ENABLE": "0",
       "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1",
       "VLLM_WORKER_MULTIPROC_METHOD": "spawn"}  # what `vllm`'s CLI sets before any subcommand
PLUGINS = ("vllm", "dma")  # DMACOLL_VLLM=0, =1
DEFAULT_MODELS = [
    {"name": "llama-3.1-8b", "spec": "llama-3.1-8b"},
    {"name": "llama-3.1-70b-l20", "spec": "llama-3.1-70b", "layers": 20},  # 80 layers do not fit one GPU
    {"name": "mixtral-8x7b-l16", "spec": "mixtral-8x7b", "layers": 16, "ep": [False, True]},
]
# each point runs in rounds of the plugin off and on, odd rounds off first, even rounds on first: of two vLLM starts in a
# row the second ran 2-6% slower on 2x and 4x H200 (results/h200x2/vllm/README.md), so one order alone is biased
DEFAULTS = {"tp": [1, 2, 4], "max_model_len": 2048, "seed": 0, "rounds": 2, "benches": ["latency", "throughput"],
            "latency": {"batches": [1, 8, 32], "input_lens": [128], "output_len": 128, "warmup": 3, "iters": 10},
            "throughput": {"num_prompts": 200, "input_len": 128, "output_len": 128}}


@dataclass(frozen=True)
class Run:
    name: str
    bench: str  # latency | throughput
    model: str  # the model folder's name
    spec: str  # dmacoll e2e model (config.MODELS)
    layers: Optional[int]
    tp: int
    ep: bool
    plugin: str  # vllm | dma
    input_len: int
    output_len: int
    batch: Optional[int] = None  # latency
    warmup: Optional[int] = None
    iters: Optional[int] = None
    num_prompts: Optional[int] = None  # throughput
    max_model_len: int = 2048
    seed: int = 0
    args: tuple[str, ...] = field(default_factory=tuple)

    def vllm_args(self, model_dir: str) -> list[str]:
        """The arguments `vllm bench <bench>` takes for this run."""
        a = ["--model", model_dir, "--load-format", "dummy", "--tensor-parallel-size", str(self.tp),
             "--max-model-len", str(self.max_model_len), "--seed", str(self.seed)]
        if self.ep:
            a.append("--enable-expert-parallel")
        if self.bench == "latency":
            a += ["--batch-size", str(self.batch), "--input-len", str(self.input_len), "--output-len",
                  str(self.output_len), "--num-iters-warmup", str(self.warmup), "--num-iters", str(self.iters)]
        else:
            a += ["--dataset-name", "random", "--num-prompts", str(self.num_prompts), "--input-len",
                  str(self.input_len), "--output-len", str(self.output_len)]
        return a + list(self.args)

    def env(self) -> dict[str, str]:
        return {**ENV, "DMACOLL_VLLM": "1" if self.plugin == "dma" else "0"}

    def meta(self) -> dict:
        keep = ("bench", "model", "spec", "layers", "tp", "ep", "plugin", "batch", "input_len", "output_len",
                "num_prompts", "max_model_len", "seed")
        return {k: v for k, v in asdict(self).items() if k in keep and v is not None}


def plan(cfg: dict, gpus: int) -> dict[str, Run]:
    """Run name -> Run for a config's ``vllm`` section on a machine of ``gpus`` GPUs (larger TP is left out):
    per model, TP and EP choice, `bench latency` per (batch, input length) and one `bench throughput` (those of
    ``benches``), each point in ``rounds`` rounds of the plugin off and on (``<point>_<plugin>_r<round>``), in the
    order they are to run."""
    lat = {**DEFAULTS["latency"], **cfg.get("latency", {})}
    thr = {**DEFAULTS["throughput"], **cfg.get("throughput", {})}
    rounds = cfg.get("rounds", DEFAULTS["rounds"])
    benches = cfg.get("benches", DEFAULTS["benches"])
    runs: dict[str, Run] = {}
    for m in cfg.get("models") or DEFAULT_MODELS:
        eps = m.get("ep", [False])
        for tp in m.get("tp", cfg.get("tp", DEFAULTS["tp"])):
            for ep in (eps if isinstance(eps, list) else [eps]):
                if tp > gpus or (ep and tp < 2):  # expert parallel needs more than one rank
                    continue
                common = dict(model=m["name"], spec=m.get("spec", m["name"]), layers=m.get("layers"), tp=tp, ep=ep,
                              max_model_len=cfg.get("max_model_len", DEFAULTS["max_model_len"]),
                              seed=cfg.get("seed", DEFAULTS["seed"]),
                              args=tuple(m.get("args", [])) + tuple(cfg.get("args", [])))
                tag = f"{m['name']}_tp{tp}{'_ep' if ep else ''}"
                points = [(f"latency_{tag}_b{batch}_i{inp}",
                           dict(bench="latency", batch=batch, input_len=inp, output_len=lat["output_len"],
                                warmup=lat["warmup"], iters=lat["iters"]))
                          for batch in lat["batches"] for inp in lat["input_lens"] if "latency" in benches]
                if "throughput" in benches:
                    points.append((f"throughput_{tag}", dict(bench="throughput", num_prompts=thr["num_prompts"],
                                                             input_len=thr["input_len"], output_len=thr["output_len"])))
                for point, settings in points:
                    for n in range(1, rounds + 1):
                        for plugin in (PLUGINS if n % 2 else PLUGINS[::-1]):
                            name = f"{point}_{plugin}_r{n}"
                            runs[name] = Run(name, plugin=plugin, **settings, **common)
    return runs


ROUND = re.compile(r"_(?:vllm|dma)_r\d+$")  # a run's name less its plugin and round: its point


def previous(runs: dict[str, Run]) -> dict[str, Optional[str]]:
    """Run name -> the run of the same point that must finish before it (None: the point's first), so that the
    rounds alternate their order as ``plan`` lists them, whatever else runs in between."""
    out: dict[str, Optional[str]] = {}
    last: dict[str, str] = {}
    for name in runs:
        point = ROUND.sub("", name)
        out[name] = last.get(point)
        last[point] = name
    return out


def models(runs: dict[str, Run]) -> dict[str, tuple[str, Optional[int]]]:
    """Model folder name -> (spec, layers) of the runs."""
    return {r.model: (r.spec, r.layers) for r in runs.values()}


def cli_flags(r: Run) -> str:
    """``dmacoll vllm bench`` flags that reproduce run ``r`` (the workflow's command line)."""
    flags = ["--name", r.name, "--bench", r.bench, "--model-name", r.model, "--spec", r.spec, "--tp", str(r.tp),
             "--plugin", r.plugin, "--input-len", str(r.input_len), "--output-len", str(r.output_len),
             "--max-model-len", str(r.max_model_len), "--seed", str(r.seed)]
    flags += ["--layers", str(r.layers)] if r.layers else []
    flags += ["--ep"] if r.ep else []
    if r.bench == "latency":
        flags += ["--batch", str(r.batch), "--warmup", str(r.warmup), "--iters", str(r.iters)]
    else:
        flags += ["--num-prompts", str(r.num_prompts)]
    flags += [f"--vllm-arg={a}" for a in r.args]
    return " ".join(shlex.quote(f) for f in flags)


# -- what a run records -----------------------------------------------------------------------------------------
REGISTERED = "process groups use dmacoll.integrations.vllm.DmaCudaCommunicator"  # register()'s log line
ALLREDUCE_LINE = re.compile(r"Using (\[[^\]]*\]) all-reduce backends.*?group '([^']+)'")


def allreduce_backends(log: str) -> dict[str, list[str]]:
    """vLLM's own all-reduce choice per group, from its log line (vLLM >= 0.26; none at TP 1)."""
    out = {}
    for m in ALLREDUCE_LINE.finditer(log):
        out[m[2]] = [x.strip().strip("'\"") for x in m[1].strip("[]").split(",") if x.strip()]
    return out


def decisions(folder: Path) -> list[dict]:
    """The plugin's routing decisions of a run (``DMACOLL_VLLM_DECISIONS`` files, one per process), deduplicated."""
    seen, out = set(), []
    for f in sorted(Path(folder).glob("decisions-*.jsonl")):
        for line in f.read_text().splitlines():
            d = json.loads(line)
            key = (d["group"], d["op"], d["mode"], d["size_class"], d["route"])
            if key not in seen:
                seen.add(key)
                out.append(d)
    return out


def routed_summary(ds: list[dict]) -> str:
    """``op mode size_class`` of every call kind the plugin sent to dmacoll ('' if none)."""
    return "; ".join(sorted({f"{d['op']} {d['mode']} {d['size_class']}" for d in ds if d["route"]}))


def record(r: Run, out_json: Path, log: str, info: dict) -> dict:
    """The ``.meta.json`` of a finished run: its settings and what vLLM's JSON does not say."""
    ds = decisions(out_json.parent / f"{out_json.stem}.decisions")
    return {**r.meta(), "vllm_version": info.get("vllm", ""), "gpu": info.get("gpu", ""),
            "allreduce_backends": json.dumps(allreduce_backends(log), sort_keys=True),
            "dmacoll_routed": routed_summary(ds), "dmacoll_decisions": len(ds),
            "plugin_registered": REGISTERED in log}


def execute(r: Run, model_dir: str, out_json: Path, python: str = sys.executable, timeout_s: float = 3600) -> int:
    """Run ``r`` (vLLM's JSON to ``out_json``, its log beside it, then its ``.meta.json``); vLLM's exit status."""
    out_json = Path(out_json)
    out_json.parent.mkdir(parents=True, exist_ok=True)
    trace = out_json.parent / f"{out_json.stem}.decisions"
    trace.mkdir(exist_ok=True)
    for old in trace.glob("*.jsonl"):
        old.unlink()
    env = {**os.environ, **r.env(), "DMACOLL_VLLM_DECISIONS": str(trace / "decisions-")}
    cmd = [python, "-m", "dmacoll_lab.vllm.entry", r.bench, *r.vllm_args(model_dir), "--output-json",
           str(out_json)]
    print("$ " + " ".join(f"{k}={v}" for k, v in r.env().items()) + " " + shlex.join(cmd), flush=True)
    lines = []
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as p:
        for line in p.stdout:
            sys.stdout.write(line)
            lines.append(line)
        code = p.wait(timeout=timeout_s)
    log = "".join(lines)
    info_path = out_json.with_suffix(".info.json")
    info = json.loads(info_path.read_text()) if info_path.exists() else {}
    out_json.with_suffix(".meta.json").write_text(json.dumps(record(r, out_json, log, info), indent=1) + "\n")
    return code


def run_from_flags(a) -> Run:
    """The Run an argparse namespace of ``dmacoll vllm bench`` describes."""
    return Run(a.name, a.bench, a.model_name, a.spec, a.layers, a.tp, a.ep, a.plugin, a.input_len, a.output_len,
               batch=a.batch if a.bench == "latency" else None, warmup=a.warmup if a.bench == "latency" else None,
               iters=a.iters if a.bench == "latency" else None,
               num_prompts=a.num_prompts if a.bench == "throughput" else None, max_model_len=a.max_model_len,
               seed=a.seed, args=tuple(a.vllm_arg or ()))


