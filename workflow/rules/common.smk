import os
import shlex
import shutil
from pathlib import Path
import subprocess
import sys

from snakemake.exceptions import WorkflowError
from snakemake.settings.types import DeploymentMethod

from dmacoll_lab.analysis import machines

# The rules' interpreter. Under `snakemake --sdm conda` Snakemake activates each rule's conda: environment
# (envs/*.yaml) around its command, so plain `python` is that environment's; otherwise (`make artifact`) the
# interpreter running snakemake: the project's .venv.
SDM_CONDA = DeploymentMethod.CONDA in workflow.deployment_settings.deployment_method
PY = "python" if SDM_CONDA else sys.executable
# A measuring job's command starts with `export DMACOLL_WORKFLOW_RULE={params.rule}; ` (its params hold its name; the
# shell's own {rule} works but fails the lint): each run's data.json then names what made it, and the docs' source
# lines say so (dmacoll_lab.analysis.report.made_by; tests/test_workflow.py checks every measuring job)

# envs/*.yaml install dmacoll with `pip: -e ${DMACOLL_ROOT}[...]`: Snakemake hands conda a copy of the env file in
# .snakemake/conda/ and conda runs pip in that copy's folder, so a relative path could not name this checkout.
os.environ.update(DMACOLL_ROOT=str(Path(workflow.basedir).resolve()))  # set for conda and pip, read by no rule

OUT = config["outdir"]


def detect_platform():
    """cuda if nvidia-smi lists a GPU, rocm if rocm-smi does, else none."""
    if config["platform"] != "auto":
        return config["platform"]
    for tool, name in (("nvidia-smi", "cuda"), ("rocm-smi", "rocm")):
        if shutil.which(tool):
            probe = subprocess.run([tool, "-L"] if name == "cuda" else [tool], capture_output=True, text=True)
            if probe.returncode == 0 and probe.stdout.strip():
                return name
    return "none"


def cluster_platform_stated():
    """Under a cluster executor this file is parsed on the submitting host (a login node, often without GPUs) and
    again in every job: detection there is a guess about other machines, so a cluster run states its platform.
    Called when the run starts (the executor is known then, and nothing is submitted yet); not in a dry run."""
    if not workflow.non_local_exec or workflow.remote_exec:  # a local run, or inside a cluster job
        return
    if config["platform"] == "auto":
        raise WorkflowError(
            f"dmacoll workflow: a cluster run must state its platform, not detect it on the submitting host (here: "
            f"{PLATFORM}): add --configfile config/config.yaml config/h200x2.yaml (or h200x4, h200x8, mi300x), or "
            "--config platform=cuda gpus=N (README: 'On a SLURM cluster')")
    if config["platform"] == "none":
        print("dmacoll workflow: WARNING: platform=none under a cluster executor: nothing is measured, the jobs only "
              "render the shipped results (make artifact does that locally)", file=sys.stderr)


PLATFORM = detect_platform()
GPU = PLATFORM in ("cuda", "rocm")  # measure here (cuda backend on NVIDIA, hip backend on AMD)
# platform 'host' (config/host.yaml): CPU ranks on the host emulator stand in for the GPUs, to test the workflow and
# its cluster submission without any. Of the GPU rules only the operator sweep runs there; its times are not GPU
# measurements. The GPU rules still ask for `gpu` GPUs, so a cluster allocates them as it would for a real run.
EMULATED = PLATFORM == "host"
EMULATED_NOTEBOOKS = ("operator", "speedup")  # what the emulator's sweeps alone render
MEASURED = GPU or EMULATED  # render this machine's fresh results, not the shipped ones

# What a job asks of a cluster (profiles/slurm*; locally only `threads` counts against --cores): a CPU per process it
# starts, and memory. CPU-only rules take the profile's default (one CPU, 1 GB: a notebook render peaked at 430 MB
# summed over papermill and its kernel). A host-emulator rank peaked near 300 MB (host_check at world 2: 760 MB
# max_rss with its parent, benchmarks/host_check_w2.tsv). A rank on a GPU holds a CUDA context, torch and pinned
# staging buffers, vLLM's workers more: 16 GB each is an allowance, not a measurement (benchmarks/<rule>.tsv of a
# GPU run records max_rss).
HOST_RANK_MB = 500
GPU_RANK_MB = 16000
GPU_RANKS = config["gpus"]  # a GPU rule starts one process per GPU
GPU_JOB = dict(gpu=config["gpus"], mem_mb=(HOST_RANK_MB if EMULATED else GPU_RANK_MB) * config["gpus"])


def platforms():
    """Result sets to render, name -> (directory, label): this machine's fresh results on a GPU
    machine (or the host emulator's); otherwise the config's `references`, or, where it names none, every machine
    folder of results/ with a GPU run (dmacoll_lab.analysis.machines: labels from the runs' provenance)."""
    if MEASURED:
        return {"measured": (OUT, config["label"])}
    if config.get("references"):
        return {name: (ref["dir"], ref["label"]) for name, ref in config["references"].items()}
    return machines.discover(Path("results"))


PLATFORMS = platforms()
REPORT = f"{OUT}/report"  # rendered notebooks, figures and claims, one folder per platform
print(f"dmacoll workflow: platform={PLATFORM}, rendering "
      + ", ".join(f"{name} ({d})" for name, (d, _) in PLATFORMS.items()), file=sys.stderr)


def result(platform, path):
    """A result file of one platform (fresh on a GPU machine, shipped otherwise)."""
    return f"{PLATFORMS[platform][0]}/{path}"


# the authors' AMD-DMA-Latte as an external baseline on ROCm, when the config names a checkout
DMALATTE = config.get("amd_dmalatte", {})
DMALATTE_ON = PLATFORM == "rocm" and bool(DMALATTE.get("checkout"))


def operator_csvs(platform):
    """The sweeps, NCCL's copy-engine path where there is one (not on ROCm: RCCL has no such mode), and the
    AMD-DMA-Latte runs where configured; for a shipped set, the sweeps it holds (machines.operator_sweeps) and its
    NCCL copy-engine run where it has one."""
    if not MEASURED:
        sweeps = machines.operator_sweeps(Path(PLATFORMS[platform][0]))
        return sweeps + shipped_extra(platform, "operator/nccl_ce/data.csv")
    ce = [] if PLATFORM in ("rocm", "host") else [result(platform, "operator/nccl_ce/data.csv")]
    amd = [f"{OUT}/amd_dmalatte/{run}/data.csv" for run in DMALATTE.get("runs", {})] if DMALATTE_ON else []
    return [result(platform, f"operator/sweep_{op}/data.csv") for op in config["operator"]["ops"]] + ce + amd


# Communicator()'s default call against NCCL, each part of its sizes run `runs` times by the default_call rule: on
# NVIDIA GPUs only, where the sm path runs
DEFAULT_CALL = config["default_call"]
DEFAULT_CALL_RUNS = [f"{OUT}/sm_path/default_call_{part}_run{n}/data.csv" for n in range(1, DEFAULT_CALL["runs"] + 1)
                     for part in DEFAULT_CALL["parts"]] if PLATFORM == "cuda" else []


# dmacoll e2e with a schedule per phase, one model per run, `runs` runs each, by the e2e_phased rule, on GPUs
E2E_PHASED = config.get("e2e_phased", {})
E2E_PHASED_RUNS = [f"{OUT}/e2e/phased_tp{GPU_RANKS}_{model}_run{n}/data.csv"
                   for n in range(1, E2E_PHASED.get("runs", 0) + 1) for model in E2E_PHASED.get("models", []) if GPU]


def e2e_phased_args(wildcards):
    """dmacoll e2e's options for one run: the config's e2e flags, then e2e_phased's (runs and models aside)."""
    return " ".join([cli_flags("e2e"), "--models", wildcards.model, cli_flags("e2e_phased", skip=("runs", "models"))])


def default_call_args(wildcards):
    """dmacoll probe sm_path's options for one part of the default call's sizes (config default_call.parts)."""
    part = DEFAULT_CALL["parts"][wildcards.part]
    return " ".join(["--sizes", *part["sizes"]] + [f"--{k} {part[k]}" for k in ("calls", "repeats") if k in part])


def default_call_csvs(platform):
    """The runs of Communicator()'s current defaults: measured here (the default_call rule, NVIDIA only), or a shipped
    set's (machines.default_call_runs)."""
    return DEFAULT_CALL_RUNS if MEASURED else [str(p) for p in machines.default_call_runs(Path(PLATFORMS[platform][0]))]


# measured here beside the main sweep, on NVIDIA (the native library submits CUDA copies): rules native_submit and
# check_cost (operator.smk)
NATIVE_RUNS = [f"{OUT}/native/native/data.csv"] if PLATFORM == "cuda" else []
CHECK_COST_RUNS = [f"{OUT}/check_calls/check_cost/data.csv"] if PLATFORM == "cuda" else []


def shipped_extra(platform, path):
    """A side experiment some shipped sets hold (a fresh run measures it inside the main sweep)."""
    f = result(platform, path)
    return [f] if not MEASURED and Path(f).exists() else []


# more dmacoll c3 runs beside c3/c3 (config c3_extra: name -> flags over the c3 section's), on a GPU machine
C3_EXTRA = config["c3_extra"] if GPU else {}


def c3_extra(name):
    """The c3 section's changes for run ``name`` (none for c3/c3); a name the config does not list is refused."""
    if name == "c3":
        return {}
    if name not in C3_EXTRA:
        raise ValueError(f"c3/{name}: not a run of config c3_extra ({sorted(C3_EXTRA)})")
    return C3_EXTRA[name]


# what each notebook (notebooks/<name>.py) renders, passed as its `csvs` parameter
NOTEBOOK_INPUTS = {
    "operator": lambda p: operator_csvs(p) + default_call_csvs(p),
    "speedup": lambda p: operator_csvs(p) + (NATIVE_RUNS if MEASURED else shipped_extra(p, "native/native/data.csv")),
    "breakdown": lambda p: [result(p, "breakdown/breakdown/data.csv")],
    "resources": lambda p: [result(p, f"power/{name}/data.csv") for name in ("power", "sm_usage", "interference")],
    "c3": lambda p: [result(p, f"c3/{name}/data.csv") for name in ["c3"] + (list(C3_EXTRA) if MEASURED else [])],
    "ficco": lambda p: [result(p, "ficco/ficco/data.csv")],
    "e2e": lambda p: e2e_inputs(p),
}


def e2e_runs(platform):
    """The e2e runs a page and its claims rest on: the fresh run, or a shipped set's newest complete run per world
    (machines.e2e_runs; none where no run compares two implementations, e.g. 1x H100: NCCL alone at world 1)."""
    if MEASURED:
        return [result(platform, "e2e/e2e/data.csv")]
    return machines.e2e_runs(Path(PLATFORMS[platform][0]))


# vLLM's benchmarks measured by this run (rule vllm_results), where the config enables them on a GPU machine
FRESH_VLLM_RUNS = [f"{OUT}/vllm/bench/data.csv"] if GPU and config.get("vllm", {}).get("enabled") else []


def e2e_claim_runs(platform):
    """The e2e runs a machine's claims rest on: the fresh run, or a shipped set's repeated runs of the current default
    call (machines.e2e_claim_runs: each point's ratio the median over them)."""
    if MEASURED:
        return e2e_runs(platform)[:1]
    return machines.e2e_claim_runs(Path(PLATFORMS[platform][0]))


def vllm_claim_runs(platform):
    """The vLLM runs a machine's vLLM claims rest on: the fresh runs where enabled, or a shipped set's
    (machines.vllm_claim_runs)."""
    if MEASURED:
        return FRESH_VLLM_RUNS
    return machines.vllm_claim_runs(Path(PLATFORMS[platform][0]))


def e2e_inputs(platform):
    """The e2e runs, vLLM's (fresh where enabled; a shipped set's checks and default-route runs,
    machines.vllm_page_runs) and a shipped set's repeated runs of the default call and runs with a schedule per phase
    (machines.e2e_default_call_runs, e2e_phased_runs)."""
    runs = e2e_runs(platform)
    if not runs:
        return []
    if MEASURED:
        runs = runs + E2E_PHASED_RUNS
    vllm = FRESH_VLLM_RUNS
    folder = Path(PLATFORMS[platform][0])
    shipped = machines.vllm_page_runs(folder) if not MEASURED else []
    repeats = [] if MEASURED else [str(p) for p in machines.e2e_default_call_runs(folder) +
                                   machines.e2e_phased_runs(folder)]
    return runs + vllm + shipped + [p for p in repeats if p not in runs]


def renders():
    """(platform, notebook) pairs to render: all on a GPU machine (the rules make the inputs), those of the
    sweeps on the host emulator; for a shipped set, the notebooks whose inputs it holds (not every set has every
    experiment)."""
    pairs = []
    for platform in PLATFORMS:
        for name, inputs in NOTEBOOK_INPUTS.items():
            files = inputs(platform)
            missing = [f for f in files if not Path(f).exists()] or ([] if files else ["no such run"])
            if GPU or (EMULATED and name in EMULATED_NOTEBOOKS) or not missing:
                pairs.append((platform, name))
            else:
                print(f"dmacoll workflow: {platform} has no {name} results ({missing[0]}): not rendered",
                      file=sys.stderr)
    return pairs


RENDERS = renders()
# the platforms with operator sweeps: each has a claims table (a claim rests on the sweeps) and a headline
CLAIMED = [p for p in PLATFORMS if MEASURED or operator_csvs(p)]


def c3_runs(platform):
    """The C3 tables the claims rest on: the fresh run on a GPU machine; for a shipped set its full run and every
    other C3 table beside it (repeats of some strategies on the same scenarios: the spread over runs). Probe tables
    in that folder are not C3 tables (their header lacks C3's columns)."""
    main = NOTEBOOK_INPUTS["c3"](platform)
    if GPU:
        return main  # with the config's extra runs
    c3_columns = {"strategy", "option", "t_c3_us"}
    others = [str(p) for p in sorted(Path(result(platform, "c3")).glob("*/data.csv"))
              if str(p) not in main and c3_columns <= set(p.open().readline().strip().split(","))]
    return main + others


def cli_flags(section, skip=(), over=None):
    """`dmacoll <tool>` flags from a config section (key -> --key, lists spread) but its keys in ``skip``, with the
    keys of ``over`` replacing the section's; absent keys: the CLI defaults."""
    flags = []
    for key, value in {**config.get(section, {}), **(over or {})}.items():
        if key in skip:
            continue
        values = value if isinstance(value, list) else [value]
        flags += [f"--{key.replace('_', '-')}", *map(str, values)]
    return " ".join(shlex.quote(f) for f in flags)


onstart:
    cluster_platform_stated()
