"""Both cluster profiles against the SLURM executor plugin's own rules: every job of the workflow's DAGs (NVIDIA with
vLLM and probes, MI300X with AMD-DMA-Latte), with the resources Snakemake resolves for it under the profile, passes
the plugin's check of `slurm_extra` (which refuses the flags the plugin sets itself: --gres, --gpus, --mem, -p,
...), and the plugin's own sbatch command for it asks for what the rule needs. Needs the plugin (pip install -e
'./lab[slurm]'; make test-slurm); without it these skip, unless DMACOLL_REQUIRE_SLURM=1."""
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROFILES = sorted(p.parent.name for p in (ROOT / "profiles").glob("slurm*/config.yaml"))
SNAKEMAKE = shutil.which("snakemake", path=str(Path(sys.executable).parent)) or shutil.which("snakemake")

if os.environ.get("DMACOLL_REQUIRE_SLURM") != "1":
    pytest.importorskip("snakemake_executor_plugin_slurm", reason="pip install -e './lab[slurm]' (make test-slurm)")
from snakemake_executor_plugin_slurm.submit_string import get_submit_command  # noqa: E402
from snakemake_executor_plugin_slurm.utils import set_gres_string  # noqa: E402
from snakemake_executor_plugin_slurm.validation import validate_slurm_extra  # noqa: E402
from snakemake_interface_common.exceptions import WorkflowError  # noqa: E402

# the DAGs a profile must submit: every GPU rule appears in one of them
DAGS = {
    "cuda": ("config/h200x2.yaml", "vllm: {enabled: true}\nprobes: [flag_latency]\n"),
    "rocm": ("config/mi300x.yaml", "amd_dmalatte:\n  checkout: /opt/AMD-DMA-Latte\n  runs:\n"
                                   "    ag_pcpy: {op: ag, variant: pcpy, command: './build/sdma_collective --ag'}\n"),
}


class Resources(dict):
    """A job's resources as the plugin reads them: job.resources.mem_mb and job.resources.get('mem_mb')."""
    __getattr__ = dict.get


def value(text: str):
    try:
        return int(text)
    except ValueError:
        return text


def planned_jobs(profile: str, platform: str, tmp_path: Path) -> list[SimpleNamespace]:
    """Every job a dry run under the profile plans: the rule, threads and resources as Snakemake resolves them (a
    dry run does not tell local rules apart: the report's are checked as if they were submitted)."""
    config, extra = DAGS[platform]
    (tmp_path / "extra.yaml").write_text(f"outdir: {tmp_path}/out\n{extra}")
    # --cores: a dry run caps threads at the cores it is given (1 by default); a cluster run does not
    r = subprocess.run([SNAKEMAKE, "--profile", f"profiles/{profile}", "--dry-run", "--forceall", "--cores", "1024",
                        "--configfile", "config/config.yaml", config, str(tmp_path / "extra.yaml")], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    jobs, job = [], None
    for line in r.stdout.splitlines():
        if not line.startswith(" "):  # a job starts with "rule X:" ('all' only collects the targets)
            job = SimpleNamespace(name=line[5:-1], threads=1, resources=Resources()) \
                if line.startswith("rule ") and line != "rule all:" else None
            jobs += [job] if job else []
            continue
        key, _, rest = line.strip().partition(": ")
        if job and key == "threads":
            job.threads = int(rest)
        elif job and key == "resources":
            job.resources = Resources({k: value(v) for k, v in (item.split("=", 1) for item in rest.split(", "))})
    assert jobs, r.stdout[-2000:]
    return jobs


def sbatch(job) -> str:
    """The plugin's own sbatch command for the job (account and partition left to the cluster's defaults)."""
    params = dict(run_uuid="run", slurm_logfile="log", comment_str=f"rule_{job.name}", account="", partition="",
                  workdir=str(ROOT))
    return get_submit_command(job, params) + set_gres_string(job)


def test_the_plugin_refuses_what_the_profiles_used_to_ask():
    """The check this file relies on is live: the GPU request both profiles carried before refused."""
    with pytest.raises(WorkflowError, match="generic resources"):
        validate_slurm_extra(SimpleNamespace(resources=Resources(slurm_extra="'--gres=gpu:2'")))


@pytest.mark.parametrize("platform", sorted(DAGS))
@pytest.mark.parametrize("profile", PROFILES)
def test_every_job_passes_the_plugin_and_asks_for_what_its_rule_needs(profile, platform, tmp_path):
    gpus = 2 if platform == "cuda" else 8  # config/h200x2.yaml, config/mi300x.yaml
    jobs = planned_jobs(profile, platform, tmp_path)
    names = {j.name for j in jobs}
    assert {"operator_sweep", "breakdown", "power", "c3", "ficco", "e2e", "build", "host_check"} <= names
    for job in jobs:
        validate_slurm_extra(job)
        call = sbatch(job)
        if job.resources.get("gpu"):  # a measurement: its GPUs, a whole node, a CPU per rank
            assert f"--gpus={gpus}" in call and "--exclusive" in call, (job.name, call)
            assert f"--mem {16000 * gpus}" in call and " -t 60" in call, (job.name, call)
            cpus = 1 if job.name == "breakdown" else gpus  # breakdown drives both GPUs from one process
            assert f"--cpus-per-task={cpus}" in call, (job.name, call)
        else:  # seconds of CPU work: little memory, a CPU per process
            assert "--gpus" not in call and "--exclusive" not in call, (job.name, call)
            assert " -t 15" in call, (job.name, call)
            world = 8 if platform == "rocm" else 4  # host_check: the config's host_check.world ranks
            cpus, mem = (world, 500 * (world + 1)) if job.name == "host_check" else (1, 1000)
            assert f"--cpus-per-task={cpus}" in call and f"--mem {mem}" in call, (job.name, call)
    assert {j.name for j in jobs if j.resources.get("gpu")} >= ({"vllm_bench", "probe", "default_call",
                                                                 "operator_sweep_nccl_ce"}
                                                               if platform == "cuda" else {"amd_dmalatte_sweep"})


@pytest.mark.parametrize("profile", PROFILES)
def test_a_cluster_run_must_state_its_platform(profile, tmp_path):
    """platform: auto would be detected on the submitting host: refused before anything is submitted."""
    r = subprocess.run([SNAKEMAKE, "--profile", f"profiles/{profile}", "--config", "platform=auto",
                        f"outdir={tmp_path}"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0
    assert "a cluster run must state its platform" in r.stdout + r.stderr, r.stdout[-2000:] + r.stderr[-2000:]
    assert "Submitted" not in r.stdout + r.stderr and not (tmp_path / "check").exists()
