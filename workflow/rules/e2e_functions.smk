"""Helpers of workflow/rules/e2e.smk (kept apart: the linter wants rules and functions in separate files)."""
from dmacoll_lab.vllm import runs as vllm_runs

VLLM = config.get("vllm", {})
VLLM_ON = GPU and bool(VLLM.get("enabled", False))  # vLLM runs only where asked for, on a GPU machine
# the interpreter with vLLM (and dmacoll installed into it: the plugin's entry point); under --sdm conda the
# rule's environment (envs/vllm.yaml)
VLLM_PY = "python" if SDM_CONDA else (VLLM.get("python") or PY)
# run name -> vllm_runs.Run: per model, TP (up to this machine's GPUs), EP choice and plugin off / on,
# `vllm bench latency` per (batch, input length) and `vllm bench throughput`
VLLM_RUNS = vllm_runs.plan(VLLM, config["gpus"]) if VLLM_ON else {}
VLLM_MODELS = vllm_runs.models(VLLM_RUNS)  # model folder -> (dmacoll e2e model, layers)
VLLM_PREVIOUS = vllm_runs.previous(VLLM_RUNS)  # run -> the run of its point before it (the rounds' order)


def vllm_previous(wildcards):
    """The JSON of the run that goes before this one (none for a point's first): the plugin off and on alternate
    their order round by round."""
    before = VLLM_PREVIOUS[wildcards.run]
    return [f"{OUT}/vllm/bench/raw/{before}.json"] if before else []


def vllm_model_flags(wildcards):
    spec, layers = VLLM_MODELS[wildcards.model]
    return f"--model {spec}" + (f" --layers {layers}" if layers else "")
