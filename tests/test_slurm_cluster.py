"""The workflow through real SLURM (make test-slurm): a one-node cluster of this machine (tests/slurm_cluster.py)
runs config/host.yaml through profiles/slurm as a cluster user would: CPU rules (the build, the host check) and a
GPU rule (the operator sweep, `--gpus=2` on GPUs that SLURM counts, run by CPU ranks on the host emulator) through
sbatch, then the report (notebooks, claims, index: local rules) on the submitting host. Its outputs must match a
local run of the same config. Opt-in: DMACOLL_REQUIRE_SLURM=1 (make test-slurm sets it); a cluster that cannot
start then fails the test."""
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

import slurm_cluster

ROOT = Path(__file__).resolve().parents[1]
REQUIRED = os.environ.get("DMACOLL_REQUIRE_SLURM") == "1"
SNAKEMAKE = [sys.executable, "-m", "snakemake"]
CONFIG = ["--configfile", "config/config.yaml", "config/host.yaml"]
OUT = "results/local/host"  # config/host.yaml's outdir, inside each copy
GPUS = 2  # config/host.yaml's gpus
MEASURED = ["time_us", "time_us_p10", "time_us_p90", "algbw_GBps", "busbw_GBps"]  # the sweep's timings


def checkout_copy(dest: Path) -> Path:
    """This checkout's files as git sees them (tracked and untracked, not ignored): a run of its own, whose
    build/, logs/, .snakemake/ and outputs touch neither this checkout nor the other run."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split("\0")
    for name in filter(None, files):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def snakemake(cwd: Path, *args: str, env=None, timeout_s: float = 600) -> subprocess.CompletedProcess:
    started = time.monotonic()
    r = subprocess.run([*SNAKEMAKE, *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=timeout_s)
    print(f"snakemake {' '.join(args)}: rc {r.returncode}, {time.monotonic() - started:.0f} s")
    return r


def test_the_install_step_fails_loudly_where_it_cannot_install(tmp_path):
    """Without SLURM's programs and without root, tests/slurm_install.sh says what to install and fails."""
    (tmp_path / "id").write_text("#!/bin/sh\necho 1000\n")  # not root
    (tmp_path / "id").chmod(0o755)
    r = subprocess.run(["/bin/bash", str(ROOT / "tests/slurm_install.sh")], capture_output=True, text=True,
                       env={"PATH": str(tmp_path)}, timeout=60)
    assert r.returncode == 1 and "install Debian's slurmctld slurmd slurm-client munge as root" in r.stderr, r.stderr


@pytest.fixture(scope="module")
def cluster():
    if not REQUIRED:
        pytest.skip("a real SLURM cluster: make test-slurm")
    missing = slurm_cluster.missing_programs()
    if missing:
        pytest.fail(f"SLURM is not installed here ({' '.join(missing)} missing): make test-slurm installs it as root")
    c = slurm_cluster.OneNodeCluster(gpus=GPUS)
    # a SIGTERM (a CI time limit) unwinds through the finally below, which stops the daemons
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        c.start()
        yield c
    finally:
        signal.signal(signal.SIGTERM, previous)
        procs = dict(c.procs)
        c.stop()
        alive = [name for name, p in procs.items() if p.poll() is None]
        assert not alive and not c.root.exists(), f"left running: {alive}, left behind: {c.root}"


@pytest.fixture(scope="module")
def runs(cluster, tmp_path_factory):
    """The same config run locally and through SLURM, each in its own copy of the checkout."""
    local = checkout_copy(tmp_path_factory.mktemp("local"))
    r = snakemake(local, "--cores", str(GPUS), *CONFIG)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]

    remote = checkout_copy(tmp_path_factory.mktemp("slurm"))
    # status checks every few seconds (a real cluster keeps the profile's pace: 40 s, then up to 180)
    r = snakemake(remote, "--profile", "profiles/slurm", *CONFIG, "--slurm-init-seconds-before-status-checks", "2",
                  "--seconds-between-status-checks", "2", env=cluster.env)
    # the plugin keeps the SLURM logs of failed jobs only
    job_logs = "\n".join(f"--- {f}\n{f.read_text()[-3000:]}" for f in (remote / ".snakemake/slurm_logs").rglob("*.log"))
    assert r.returncode == 0, r.stderr[-5000:] + "\n" + job_logs + "\n" + cluster.logs()
    return local, remote, cluster.jobs()


def by_rule(jobs):
    """SLURM jobs by the rule the plugin names in their comment (rule_<name> or rule_<name>_wildcards_...)."""
    rules = {}
    for job in jobs:
        comment = job.get("Comment", "")
        assert comment.startswith("rule_"), job
        name = next(r for r in ("operator_sweep", "host_check", "build")
                    if comment == f"rule_{r}" or comment.startswith(f"rule_{r}_wildcards_"))
        rules.setdefault(name, []).append(job)
    return rules


def test_every_job_went_through_sbatch_with_what_its_rule_asks(runs):
    _, _, jobs = runs
    rules = by_rule(jobs)
    # the report's rules are local rules: no job of theirs
    assert {r: len(j) for r, j in rules.items()} == {"build": 1, "host_check": 1, "operator_sweep": 1}
    assert all(j["JobState"] == "COMPLETED" for j in jobs), [(j["Comment"], j["JobState"]) for j in jobs]
    (sweep,) = rules["operator_sweep"]
    assert sweep["TresPerJob"] == f"gres:gpu:{GPUS}"  # the rule's gpu resource became --gpus
    assert sweep["OverSubscribe"] == "NO"  # --exclusive: the node to itself
    assert sweep["NumCPUs"] == str(GPUS)  # a CPU per rank
    (check,) = rules["host_check"]
    assert check["NumCPUs"] == "2" and check["MinMemoryNode"] == "1500M"  # world 2: a CPU and 500 MB per rank
    (build,) = rules["build"]  # CPU-only: one CPU, the profile's 1 GB, no GPU
    assert build["NumCPUs"] == "1" and build["MinMemoryNode"] == "1000M", build
    assert "gpu" not in build.get("TresPerJob", "") + check.get("TresPerJob", "")


def files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def test_outputs_match_a_local_run(runs):
    local, remote, _ = runs
    a, b = local / OUT, remote / OUT
    assert files(a) == files(b)
    assert "report/index.html" in files(b) and "report/measured/notebooks/speedup.html" in files(b)
    for name in ("report/measured/claims.json", "report/measured/claims.md"):  # from the sweeps, through the claims
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    # the sweep measured the same points and found every one correct; only the times differ
    sweeps = [pd.read_csv(d / "operator/sweep_all_gather/data.csv") for d in (a, b)]
    keys = [c for c in sweeps[0].columns if c not in MEASURED]
    pd.testing.assert_frame_equal(sweeps[0][keys], sweeps[1][keys])
    assert sweeps[1]["correct"].all() and (sweeps[1]["status"] == "ok").all()
    checks = [(d / "check/host_w2.txt").read_text().splitlines()[-1] for d in (a, b)]
    assert checks[0] == checks[1] and checks[1].endswith(" passed, 0 failed"), checks
    # the emulator's report is whole: a headline from its eager sweep (it captures no graphs), every claim counted
    check = subprocess.run([sys.executable, "-m", "dmacoll_lab", "report", "check", "--report-dir", str(b / "report")],
                           cwd=remote, capture_output=True, text=True, timeout=300)
    assert check.returncode == 0 and check.stdout.strip().endswith("0 problems"), check.stdout[-2000:] + check.stderr
