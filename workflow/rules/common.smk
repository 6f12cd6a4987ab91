import shutil
import subprocess
import sys

PY = sys.executable  # the interpreter running snakemake: the project's .venv
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


PLATFORM = detect_platform()
if PLATFORM == "rocm":
    raise WorkflowError("platform rocm: the hip backend is not part of this release yet; "
                        "run with --config platform=none to render the shipped reference results")
print(f"dmacoll workflow: platform={PLATFORM}, results rendered from "
      f"{'fresh runs under ' + OUT if PLATFORM == 'cuda' else config['reference'] + ' (shipped reference)'}",
      file=sys.stderr)


def result(path):
    """A result file: measured here on a GPU machine, the shipped reference otherwise."""
    return f"{OUT}/{path}" if PLATFORM == "cuda" else f"{config['reference']}/{path}"


def operator_csvs():
    return [result(f"operator/sweep_{op}.csv") for op in config["operator"]["ops"]] + [
        result("operator/nccl_ce.csv")]


# what each notebook (notebooks/<name>.py) renders, passed as its `csvs` parameter
NOTEBOOK_INPUTS = {
    "operator": operator_csvs,
    "speedup": operator_csvs,
    "breakdown": lambda: [result("breakdown/breakdown.csv")],
    "resources": lambda: [result(f"power/{name}.csv") for name in ("power", "sm_usage", "interference")],
}
