"""tools/ is transport for the lent machines, under one README, each script exercised by a test: here the shell
scripts no other test runs, with the commands they call replaced by stubs on PATH (no GPU, no nvidia-smi)."""
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / "tools"


def stub(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text("#!/usr/bin/env bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def run(script: str, *args: str, env: dict, cwd: Path = ROOT, timeout: int = 120) -> subprocess.CompletedProcess:
    own = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}  # the stubs' GPUs, not this shell's
    return subprocess.run(["bash", str(TOOLS / script), *args], cwd=cwd, env={**own, **env},
                          capture_output=True, text=True, timeout=timeout)


def test_every_tool_is_named_in_the_readme_and_shell_scripts_parse():
    readme = (TOOLS / "README.md").read_text()
    for path in sorted(TOOLS.iterdir()):
        if path.name != "README.md":
            assert f"`{path.name}`" in readme, path.name
        if path.suffix == ".sh":
            assert subprocess.run(["bash", "-n", str(path)]).returncode == 0, path.name


def test_machine_probe_says_what_ran_and_the_commit(tmp_path):
    stub(tmp_path, "nvidia-smi", 'echo "stub-smi $*"\n')
    stub(tmp_path, "python3", f'exec {sys.executable} "$@"\n')
    r = run("machine_probe.sh", env={"PATH": f"{tmp_path}:{os.environ['PATH']}", "DMACOLL_GIT_SHA": "abc123"})
    assert r.returncode == 0, r.stderr
    assert "stub-smi" in r.stdout and "stub-smi topo -m" in r.stdout and "torch" in r.stdout
    assert "DMACOLL_GIT_SHA=abc123" in r.stdout


def test_lent_snakemake_plans_the_workflows_targets_with_every_gpu(tmp_path):
    stub(tmp_path, "nvidia-smi", 'for i in 0 1 2 3; do echo "GPU $i: stub (UUID: GPU-$i)"; done\n')
    stub(tmp_path, "python3", f'exec {sys.executable} "$@"\n')  # this checkout's interpreter, with Snakemake
    out = tmp_path / "out"
    target = f"{out}/sm_path/default_call_small_run1/data.csv"
    r = run("lent_snakemake.sh", str(out), "config/h200x4.yaml", target, "-n",  # targets first, as on a machine
            env={"PATH": f"{tmp_path}:{os.environ['PATH']}"}, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "4 GPUs" in r.stderr and "rule default_call" in r.stdout
    assert "DMACOLL_WORKFLOW_RULE=default_call" in r.stdout and "--worlds 4" in r.stdout
    stub(tmp_path, "nvidia-smi", "exit 9\n")  # no GPU: refused, nothing planned
    r = run("lent_snakemake.sh", str(out), "config/h200x4.yaml", "-n", target,
            env={"PATH": f"{tmp_path}:{os.environ['PATH']}"})
    assert r.returncode == 2 and "no GPU" in r.stderr


@pytest.mark.parametrize("gpus, config", [(4, "config/h200x4.yaml"), (3, "config/config.yaml")])
def test_lent_snakemake_auto_takes_the_machines_config_where_there_is_one(tmp_path, gpus, config):
    stub(tmp_path, "nvidia-smi", f'for i in $(seq 1 {gpus}); do echo "GPU $i: stub (UUID: GPU-$i)"; done\n')
    stub(tmp_path, "python3", f'exec {sys.executable} "$@"\n')
    r = run("lent_snakemake.sh", str(tmp_path / "out"), "auto", "config/kick.yaml", "-n",
            f"{tmp_path}/out/breakdown/breakdown/data.csv", env={"PATH": f"{tmp_path}:{os.environ['PATH']}"},
            timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert f"{gpus} GPUs, {config} config/kick.yaml," in r.stderr and "--transfers 10" in r.stdout


def test_lent_snakemake_counts_the_visible_gpus(tmp_path):
    """CUDA_VISIBLE_DEVICES=0,1 on a 4-GPU machine: world 2 and its config; naming more GPUs than there are, or
    none, stops."""
    stub(tmp_path, "nvidia-smi", 'for i in 0 1 2 3; do echo "GPU $i: stub (UUID: GPU-$i)"; done\n')
    stub(tmp_path, "python3", f'exec {sys.executable} "$@"\n')
    out = tmp_path / "out"
    env = {"PATH": f"{tmp_path}:{os.environ['PATH']}", "CUDA_VISIBLE_DEVICES": "0,1"}
    r = run("lent_snakemake.sh", str(out), "auto", "-n", f"{out}/sm_path/default_call_small_run1/data.csv",
            env=env, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "2 GPUs, config/h200x2.yaml," in r.stderr and "--worlds 2" in r.stdout
    for visible, n in (("0,1,2,3,4", 5), ("", 0)):  # more than there are, or none (set but empty hides them all)
        r = run("lent_snakemake.sh", str(out), "auto", "-n", env={**env, "CUDA_VISIBLE_DEVICES": visible})
        assert r.returncode == 2 and f"names {n} GPUs; the machine has 4" in r.stderr, r.stderr


def lanes(tmp_path: Path, queue: str, **env) -> tuple[str, str]:
    state, log = tmp_path / "state", tmp_path / "lanes.log"
    (tmp_path / "queue").write_text(queue)
    r = run("gpu_lanes.sh", str(state), str(tmp_path / "queue"), str(log),
            env={"LANES": "2", "DEADLINE_S": "60", **env})
    assert r.returncode == 0, r.stderr
    return log.read_text(), (state / "done").read_text()


def test_gpu_lanes_run_each_item_once_within_its_limit_and_go_on_where_they_stopped(tmp_path):
    queue = ("# LIMIT_S NAME COMMAND\n"
             "20 passes echo $CUDA_VISIBLE_DEVICES\n"
             "20 fails echo boom; exit 3\n"
             "2 hangs sleep 30\n"
             "20 skips echo '1 skipped in 0.1s'\n"
             "90 too_long true\n")  # longer than the deadline: left for the next call
    log, done = lanes(tmp_path, queue)
    verdicts = {line.split()[3]: line.split()[0] for line in done.splitlines()}
    assert verdicts == {"passes": "PASS", "fails": "FAIL", "hangs": "TIMEOUT", "skips": "SKIP"}
    assert "1 item(s) not run yet" in log and "[fails] boom" in log  # a failure's tail goes into the log
    assert {line.split()[2] for line in done.splitlines()} <= {"gpu0", "gpu1"}  # a lane per GPU
    assert (tmp_path / "state/logs/passes.log").read_text().strip() in ("0", "1")  # the lane's GPU only
    # the same command again: nothing run twice; with a later deadline the long item runs
    log2, done2 = lanes(tmp_path, queue, DEADLINE_S="200")
    assert [line.split()[3] for line in done2.splitlines()].count("passes") == 1
    assert "too_long" in done2 and "0 item(s) not run yet" in log2


def test_gpu_suite_queues_every_gpu_test_check_and_tune_and_runs_them(tmp_path):
    """With python3 a stub (collect-only lists two tests, everything else succeeds) the suite writes its queue,
    runs every item over the lanes and copies the logs beside the queue."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    stub(bin_, "python3", 'case "$*" in *--collect-only*) echo "tests/gpu/test_a.py::test_one[2]"; '
                          'echo "tests/gpu/test_b.py::test_every_op_variant[4]";; esac; exit 0\n')
    stub(bin_, "nvidia-smi", 'echo "GPU 0: stub"\n')
    work = tmp_path / "repo"
    (work / "tools").mkdir(parents=True)
    for name in ("gpu_suite.sh", "gpu_lanes.sh", "machine_probe.sh"):
        (work / "tools" / name).write_text((TOOLS / name).read_text())
    (work / "build/native").mkdir(parents=True)
    (work / "build/native/libdmacoll_submit.so").write_text("")
    out = tmp_path / "out"
    r = subprocess.run(["bash", "tools/gpu_suite.sh"], cwd=work, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "OUT": str(out),
                            "DEADLINE_S": "2000"})  # every item's limit fits (they end at once)
    assert r.returncode == 0, r.stderr
    queue = (out / "one_gpu/queue.txt").read_text()
    names = [line.split()[1] for line in queue.splitlines() if not line.startswith("#")]
    assert names[0] == "test_b.py__test_every_op_variant_4_"  # the longest first
    assert {"test_a.py__test_one_2_", "check_w4", "check_w2", "tune_quick_w2", "tune_quick_w4", "check_w8"} \
        <= set(names)
    done = (out / "one_gpu/done").read_text()
    assert done.count("PASS") == len(names)


def stub_h200x4_dry_run(tmp_path):
    """A 4x H200 machine's nvidia-smi, this Python, and a `timeout` that runs its command as Snakemake's dry run."""
    stub(tmp_path, "nvidia-smi", 'case "$*" in *query-gpu*) for i in 0 1 2 3; do echo "NVIDIA H200"; done;;\n'
                                 '  *-L*) for i in 0 1 2 3; do echo "GPU $i: NVIDIA H200 (UUID: GPU-$i)"; done;;\n'
                                 '  *) echo stub-smi;; esac\n')
    stub(tmp_path, "python3", f'exec {sys.executable} "$@"\n')
    stub(tmp_path, "timeout", 'shift; exec "$@" -n\n')


def test_vllm_gpu_run_bench_runs_the_workflows_vllm_rules_in_alternating_rounds(tmp_path):
    """tools/vllm_gpu_run.sh bench is the workflow's rules (vllm_model, vllm_bench, vllm_results) through
    lent_snakemake.sh with config/vllm_lent.yaml: on 4 GPUs the 8B shapes at TP 2 and 4, each point in two rounds,
    the plugin off first, then on first. Planned here (a `timeout` stub adds Snakemake's -n), not run."""
    from dmacoll_lab.vllm import runs as vruns

    stub_h200x4_dry_run(tmp_path)
    out = tmp_path / "out"
    r = run("vllm_gpu_run.sh", str(out), "bench", env={"PATH": f"{tmp_path}:{os.environ['PATH']}",
                                                       "DMACOLL_GIT_SHA": "abc123"}, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    log = (out / "run/vllm/bench/snakemake.log").read_text()
    assert "config/h200x4.yaml" in log and "config/vllm_lent.yaml" in log, log[-2000:]
    names = [line.split("--name ", 1)[1].split()[0] for line in log.splitlines() if "vllm bench --model-dir" in line]
    assert len(names) == 16 and {n.split("_tp")[1][0] for n in names} == {"2", "4"}, names
    assert all("llama-3.1-8b" in n for n in names) and log.count("rule vllm_model:") == 1
    for before, after in (("latency_llama-3.1-8b_tp4_b8_i128_vllm_r1", "latency_llama-3.1-8b_tp4_b8_i128_dma_r1"),
                          ("latency_llama-3.1-8b_tp4_b8_i128_dma_r2", "latency_llama-3.1-8b_tp4_b8_i128_vllm_r2"),
                          ("throughput_llama-3.1-8b_tp2_dma_r1", "throughput_llama-3.1-8b_tp2_dma_r2")):
        job = next(b for b in log.split("rule vllm_bench:") if f"wildcards: run={after}\n" in b)
        inputs = next(line for line in job.splitlines() if line.strip().startswith("input:"))
        assert f"raw/{before}.json" in inputs, inputs  # it waits for the one before
    assert "machine h200x4" in (out / "summary.txt").read_text()


@pytest.mark.parametrize("bench", ["throughput", "latency"])
def test_vllm_gpu_run_bench_takes_other_config_files(tmp_path, bench):
    """VLLM_CONFIGS replaces config/vllm_lent.yaml: with config/vllm_<bench>.yaml over it, only that bench's points
    (at TP 2 and 4, two rounds each) are planned."""
    stub_h200x4_dry_run(tmp_path)
    out = tmp_path / "out"
    r = run("vllm_gpu_run.sh", str(out), "bench", env={
        "PATH": f"{tmp_path}:{os.environ['PATH']}", "DMACOLL_GIT_SHA": "abc123",
        "VLLM_CONFIGS": f"config/vllm_lent.yaml config/vllm_{bench}.yaml"}, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    log = (out / "run/vllm/bench/snakemake.log").read_text()
    names = [line.split("--name ", 1)[1].split()[0] for line in log.splitlines() if "vllm bench --model-dir" in line]
    point = {"throughput": "throughput_llama-3.1-8b_tp{}", "latency": "latency_llama-3.1-8b_tp{}_b8_i128"}[bench]
    assert sorted(names) == sorted(f"{point.format(tp)}_{p}_r{n}"
                                   for tp in (2, 4) for p in ("vllm", "dma") for n in (1, 2)), names


def test_gpu_smoke_refuses_one_gpu_before_running_anything(tmp_path):
    stub(tmp_path, "nvidia-smi", 'echo "GPU 0: NVIDIA H200 (UUID: GPU-0)"\n')
    r = run("gpu_smoke.sh", str(tmp_path / "out"), env={"PATH": f"{tmp_path}:{os.environ['PATH']}"}, timeout=60)
    assert r.returncode == 2 and "need 2 or more GPUs; 1 visible" in r.stderr, r.stderr
    assert not (tmp_path / "out" / "snakemake.log").exists()


@pytest.mark.parametrize("wrong", [False, True])
def test_gpu_smoke_runs_the_workflow_with_the_kick_config_and_checks_every_row(tmp_path, wrong):
    """tools/gpu_smoke.sh is the workflow's measurements with config/kick.yaml (planned here: a `timeout` stub adds
    Snakemake's -n), then every output's checked rows: one wrong row fails the smoke run."""
    stub(tmp_path, "nvidia-smi", 'for i in 0 1; do echo "GPU $i: NVIDIA H200 (UUID: GPU-$i)"; done\n')
    stub(tmp_path, "python3", f'exec {sys.executable} "$@"\n')
    stub(tmp_path, "timeout", 'shift; exec "$@" -n\n')
    dest = tmp_path / "out"
    run_dir = dest / "run/smoke/checks/rows"  # a finished run's table, as a rule leaves it
    run_dir.mkdir(parents=True)
    (run_dir / "data.csv").write_text(f"op,correct\nall_gather,True\nall_reduce,{not wrong}\n")
    r = run("gpu_smoke.sh", str(dest), env={"PATH": f"{tmp_path}:{os.environ['PATH']}"}, timeout=300)
    plan = (dest / "snakemake.log").read_text()
    assert "config/h200x2.yaml" in plan and "config/kick.yaml" in plan, plan[-2000:]
    for rule in ("operator_sweep", "operator_sweep_nccl_ce", "breakdown", "power", "c3", "ficco", "e2e",
                 "e2e_phased", "default_call"):
        assert f"rule {rule}:" in plan, rule
    assert "ficco --models llama3-8b mixtral-8x7b --tokens 2048" in plan and "--seconds 0.2" in plan
    assert f"checks/rows{'':17s}     2 rows,     2 checked (correct), {int(wrong)} wrong" in r.stdout, r.stdout
    assert r.returncode == int(wrong), r.stdout + r.stderr
    assert (dest / "results.tgz").is_file() and not (dest / "run").exists()
