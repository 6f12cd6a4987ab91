"""The Snakemake DAG parses, validates its config and plans the right jobs on a CPU machine."""
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = shutil.which("snakemake", path=str(Path(sys.executable).parent)) or shutil.which("snakemake")
pytestmark = pytest.mark.skipif(SNAKEMAKE is None, reason="snakemake not installed (pip install -e './lab[workflow]')")


def dry_run(*args, config=("platform=none",), targets=()):
    return subprocess.run([SNAKEMAKE, *targets, "--cores", "1", "--dry-run", *args, "--config", *config], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_default_target_renders_from_reference_results(tmp_path):
    r = dry_run(config=("platform=none", f"outdir={tmp_path}"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "host_check" in r.stdout
    for platform in ("h200x2", "h200x4"):  # every machine of results/, side by side
        for job in ("claims.json", *(f"notebooks/{n}.html" for n in ("operator", "speedup", "breakdown",
                                                                      "resources"))):
            assert f"{tmp_path}/report/{platform}/{job}" in r.stdout
    # 2x H100: its defaults study's sweeps give it an operator page and claims; one-GPU sets hold no sweep
    for job in ("claims.json", "notebooks/operator.html"):
        assert f"{tmp_path}/report/h100x2/{job}" in r.stdout
    assert f"{tmp_path}/report/h200x1/claims.json" not in r.stdout
    assert "rendering h100x1 (results/h100x1), h100x2 (results/h100x2), h200x1 (results/h200x1)" in r.stderr
    for gpu_rule in ("operator_sweep", "breakdown:", "power:", "probe:"):  # no GPUs: nothing is measured
        assert f"rule {gpu_rule}" not in r.stdout


def test_kick_config_parses():
    r = dry_run("--configfile", "config/config.yaml", "config/kick.yaml")
    assert "kick" in r.stdout or "Nothing to be done" in r.stdout
    assert r.returncode == 0, r.stderr[-2000:]


def test_bad_config_value_is_rejected_clearly():
    r = dry_run(config=("platform=tpu",))
    assert r.returncode != 0
    assert "tpu" in (r.stdout + r.stderr)


@pytest.mark.parametrize("section", ["operator", "c3"])
def test_a_collective_the_registry_lacks_is_rejected_when_the_workflow_loads(section, tmp_path):
    """The schema keeps no list of collectives: the Snakefile checks the config's against the op registry."""
    cfg = tmp_path / "ops.yaml"
    cfg.write_text(f"{section}:\n  ops: [all_gather, broadcast]\n")
    r = dry_run("--configfile", "config/config.yaml", str(cfg))
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert f"config {section}.ops: unknown value(s) broadcast; choose from all_gather, " in out, \
        out[-2000:]


@pytest.mark.parametrize("section, value, where", [
    ({"operator": {"impls": ["nccl", "magic"]}}, "magic", "operator.impls"),
    ({"operator": {"waits": ["poll"]}}, "poll", "operator.waits"),
    ({"operator": {"prerecord": ["maybe"]}}, "maybe", "operator.prerecord"),
    ({"c3": {"strategies": ["dma", "teleport"]}}, "teleport", "c3.strategies"),
    ({"e2e": {"models": ["gpt5"]}}, "gpt5", "e2e.models"),
    ({"e2e": {"schedules": ["pipelined"]}}, "pipelined", "e2e.schedules"),
    ({"vllm": {"models": [{"name": "x", "spec": "gpt5"}]}}, "gpt5", "vllm.models[*].spec"),
    ({"amd_dmalatte": {"runs": {"r": {"command": "x", "op": "bcast", "variant": "pcpy"}}}}, "bcast",
     "amd_dmalatte.runs[*].op"),
    ({"power": {"ops": ["broadcast"]}}, "broadcast", "power.ops"),
    ({"sm_usage": {"modes": ["lazy"]}}, "lazy", "sm_usage.modes"),
    ({"interference": {"strategies": ["teleport"]}}, "teleport", "interference.strategies"),
    ({"ficco": {"models": ["gpt5"]}}, "gpt5", "ficco.models"),
    ({"e2e": {"overlap_path": "sm"}}, "sm", "e2e.overlap_path"),
    ({"e2e_phased": {"overlap_path": "nccl"}}, "nccl", "e2e_phased.overlap_path"),
    ({"vllm": {"benches": ["latency", "serve"]}}, "serve", "vllm.benches"),
])
def test_a_name_no_command_takes_is_named_with_what_they_take(section, value, where):
    """The schema keeps no list of names: the commands' choices decide (dmacoll_lab.workflow_config)."""
    from dmacoll_lab.workflow_config import problems

    found = problems(section)
    assert len(found) == 1 and found[0].startswith(f"config {where}: unknown value(s) {value}; choose from "), found


@pytest.mark.parametrize("text, key", [("vllm:\n  rounds: 0\n", "rounds"), ("power:\n  seconds: 0\n", "seconds"),
                                       ("ficco:\n  pieces: 4\n", "pieces"),
                                       ("breakdown:\n  transfers: 0\n", "transfers")])
def test_a_bad_value_in_a_flag_section_stops_the_workflow_before_any_run(text, key, tmp_path):
    """The schema validates the sections that pass flags to the commands: out of range, or a key no flag takes."""
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(text)
    r = dry_run("--configfile", "config/config.yaml", str(cfg))
    assert r.returncode != 0 and key in r.stdout + r.stderr, (r.stdout + r.stderr)[-2000:]


def test_the_shipped_configs_name_only_what_the_commands_take():
    from dmacoll_lab.workflow_config import problems

    for path in sorted((ROOT / "config").glob("*.yaml")):
        assert problems(yaml.safe_load(path.read_text()) or {}) == [], path


def test_lint_is_clean():
    for platform in ("none", "cuda"):
        r = subprocess.run([SNAKEMAKE, "--lint", "--config", f"platform={platform}"], cwd=ROOT, capture_output=True,
                           text=True, timeout=300)
        assert "Congratulations, your workflow is in a good condition!" in r.stdout + r.stderr, r.stdout[-3000:]


@pytest.mark.parametrize("platform_file", ["h200x2", "h200x4", "h200x8"])
def test_gpu_platform_configs_plan_every_experiment(platform_file, tmp_path):
    r = dry_run("--configfile", "config/config.yaml", f"config/{platform_file}.yaml",
                config=(f"outdir={tmp_path}",))
    assert r.returncode == 0, r.stderr[-2000:]
    for rule in ("operator_sweep", "operator_sweep_nccl_ce", "breakdown", "power", "c3", "default_call", "index"):
        assert f"rule {rule}:" in r.stdout
    assert f"{tmp_path}/report/measured/notebooks/c3.html" in r.stdout
    assert f"{tmp_path}/report/measured/notebooks/ficco.html" in r.stdout


def test_host_platform_runs_the_sweep_on_cpu_ranks_and_renders_it(tmp_path):
    """config/host.yaml: the GPU rule that the host emulator can run (the operator sweep) runs there as CPU ranks,
    still asking for its GPUs; the report renders what the sweep measured; nothing else of the GPUs is planned."""
    r = dry_run("-p", "--forceall", "--cores", "2", "--configfile", "config/config.yaml", "config/host.yaml",
                config=(f"outdir={tmp_path}",))
    assert r.returncode == 0, r.stderr[-2000:]
    rules = set(re.findall(r"^rule (\w+):", r.stdout, re.M))
    assert rules == {"build", "host_check", "operator_sweep", "notebook", "claims", "index", "all"}, rules
    assert " -m dmacoll_lab sweep --backend host --world 2 --ops all_gather " in r.stdout
    sweep = r.stdout.split("rule operator_sweep:")[1].split("Shell command")[0]
    assert "gpu=2" in sweep and "mem_mb=1000," in sweep  # the GPUs asked for; a host rank's memory each
    for name in ("operator", "speedup"):
        assert f"{tmp_path}/report/measured/notebooks/{name}.html" in r.stdout
    assert "notebooks/breakdown.html" not in r.stdout and "--power" not in r.stdout  # nothing without its inputs
    assert "--impls nccl dma_default dma peer_copy " in r.stdout  # no copy-engine NCCL, no symmetric memory


def test_probes_run_when_the_config_lists_them(tmp_path):
    r = dry_run("-p", "--configfile", "config/config.yaml", "config/h200x2.yaml",
                config=(f"outdir={tmp_path}", "probes=[flag_latency]"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.count("rule probe:") == 1
    run = f"{tmp_path}/probes/flag_latency"
    assert f" -m dmacoll_lab probe flag_latency --out {run}/data.csv 2>&1 | tee {run}/run.log" in r.stdout
    assert "gpu=2" in r.stdout.split("rule probe:")[1].split("Shell command")[0]
    # without a GPU the list is set aside: a CPU render plans nothing new
    cpu = dry_run(config=("platform=none", f"outdir={tmp_path}", "probes=[flag_latency]"))
    assert cpu.returncode == 0 and "rule probe:" not in cpu.stdout, cpu.stderr[-2000:]
    assert "probes ['flag_latency'] not run" in cpu.stderr
    # a probe's own options from config probe_args; a name no probe has is refused before anything runs
    r = dry_run("-p", "--configfile", "config/config.yaml", "config/h200x2.yaml",
                config=(f"outdir={tmp_path}", "probes=[flag_latency]", "probe_args={flag_latency: '--rounds 7'}"))
    assert r.returncode == 0 and f"--out {run}/data.csv --rounds 7 2>&1" in r.stdout, r.stderr[-2000:]
    bad = dry_run(config=(f"outdir={tmp_path}", "probe_args={flag_latensy: '--rounds 7'}"))
    assert bad.returncode != 0 and "flag_latensy" in bad.stdout + bad.stderr


def test_each_page_has_a_measure_target_on_a_gpu_machine(tmp_path):
    """`snakemake measure_<page>`: one experiment's runs (a lent machine's 10-minute command), nothing rendered."""
    r = dry_run("-p", "--configfile", "config/config.yaml", "config/h200x4.yaml",
                config=(f"outdir={tmp_path}",), targets=("measure_speedup", "measure_check_cost"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "rule native_submit:" in r.stdout and "rule check_cost:" in r.stdout and "rule notebook:" not in r.stdout
    assert f"--modes eager --max-bytes 4M --repeats 15 --out {tmp_path}/native/native/data.csv" in r.stdout
    assert f"check-cost --world 4 --out {tmp_path}/check_calls/check_cost/data.csv" in r.stdout
    cpu = dry_run(config=("platform=none", f"outdir={tmp_path}"), targets=("measure_speedup",))
    assert cpu.returncode != 0  # no such target where nothing is measured


def test_default_call_runs_each_part_of_its_sizes_repeatedly_and_names_its_rule(tmp_path):
    """config default_call: each part (small, large sizes) run `runs` times at the machine's world, the rule's name in
    the run's environment (its provenance), the operator page rendered from them; not on a CPU render."""
    small = tmp_path / "small.yaml"
    small.write_text("default_call: {runs: 2, parts: {small: {sizes: [1K, 4K], calls: 7}}}\n")
    r = dry_run("-p", "--configfile", "config/config.yaml", "config/h200x4.yaml", str(small),
                config=(f"outdir={tmp_path}",))
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.count("rule default_call:") == 4  # the shipped large part too: configs merge
    for n in (1, 2):
        run = f"{tmp_path}/sm_path/default_call_small_run{n}"
        assert f"export DMACOLL_WORKFLOW_RULE=default_call; {sys.executable} -m dmacoll_lab probe sm_path" in r.stdout
        assert (f" -m dmacoll_lab probe sm_path --worlds 4 --sizes 1K 4K --calls 7 --repeats 10 --out {run}/data.csv "
                f"2>&1 | tee {run}/run.log") in r.stdout
    assert "gpu=4" in r.stdout.split("rule default_call:")[1].split("Shell command")[0]
    cpu = dry_run(config=("platform=none", f"outdir={tmp_path}"))
    assert cpu.returncode == 0 and "rule default_call:" not in cpu.stdout, cpu.stderr[-2000:]


def test_mi300x_config_dry_runs_the_full_dag(tmp_path):
    r = dry_run("-p", "--configfile", "config/config.yaml", "config/mi300x.yaml", config=(f"outdir={tmp_path}",))
    assert r.returncode == 0, r.stderr[-2000:]
    for rule in ("operator_sweep", "breakdown", "power", "c3", "claims", "index"):
        assert f"rule {rule}:" in r.stdout
    assert "nccl_ce" not in r.stdout  # RCCL has no copy-engine mode
    assert "--submit python --handshakes full lean --min-bytes" in r.stdout  # native drives the CUDA driver: not here


def test_amd_dmalatte_baseline_is_built_swept_and_parsed_when_configured(tmp_path):
    cfg = tmp_path / "dmalatte.yaml"
    cfg.write_text("amd_dmalatte:\n  checkout: /opt/AMD-DMA-Latte\n  runs:\n"
                   "    ag_pcpy: {op: ag, variant: pcpy, command: './build/sdma_collective --ag'}\n")
    r = dry_run("-p", "--configfile", "config/config.yaml", "config/mi300x.yaml", str(cfg),
                config=(f"outdir={tmp_path}",))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "rule amd_dmalatte_build:" in r.stdout and "rule amd_dmalatte_sweep:" in r.stdout
    assert "dmacoll_lab amd-dmalatte" in r.stdout and "--world 8 --op ag --variant 'pcpy'" in r.stdout


# Snakemake probes conda even in a dry run (`conda info --json`, `conda --version`, the channel priority) and stops
# where there is none (CI). This stand-in answers those probes, so that `--sdm conda --dry-run --printshellcmds` prints
# the commands the rules would run in their environments; it fails loudly on any other call.
FAKE_CONDA = """#!/bin/sh
case "$*" in
  "info --json") echo '{"conda_prefix": "/nonexistent/conda", "platform": "linux-64"}' ;;
  "--version") echo "conda 25.1.1" ;;
  "config --get channel_priority --json") echo '{"get": {"channel_priority": "strict"}}' ;;
  *) echo "fake conda: unexpected call: conda $*" >&2; exit 1 ;;
esac
"""


def interpreters(out):
    """The interpreter of every `<python> -m <module>` in the shell commands a --printshellcmds dry run shows."""
    commands = [line for line in out.splitlines() if line.startswith("Shell command:")]
    return [py for c in commands for py in re.findall(r"([^\s(]+) -m \S", c)]


@pytest.mark.parametrize("platform_file, extra, module", [
    (None, "platform: none\n", "dmacoll_lab report index"),  # no GPU: build, host check, notebooks, claims, index
    ("config/h200x2.yaml", "vllm: {enabled: true}\n", "dmacoll_lab vllm results"),  # every GPU rule, vLLM's too
    ("config/mi300x.yaml", "amd_dmalatte:\n  checkout: /opt/AMD-DMA-Latte\n  runs:\n"  # the AMD-DMA-Latte baseline
                           "    ag_pcpy: {op: ag, variant: pcpy, command: './build/sdma_collective --ag'}\n",
     "dmacoll_lab amd-dmalatte"),
], ids=["cpu", "cuda", "rocm"])
def test_sdm_conda_runs_rules_in_their_environments(platform_file, extra, module, tmp_path):
    """Under --sdm conda no rule's command names the interpreter running snakemake (the .venv): each runs the
    `python` of its activated conda environment. Without it (make artifact) each runs the .venv's interpreter."""
    (tmp_path / "extra.yaml").write_text(f"outdir: {tmp_path}\n{extra}")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin/conda").write_text(FAKE_CONDA)
    (tmp_path / "bin/conda").chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    # --forceall: plan every job whatever this checkout built before (build/native, Snakemake's records)
    command = [SNAKEMAKE, "--cores", "1", "--dry-run", "--forceall", "--printshellcmds", "--configfile",
               "config/config.yaml",
               *([platform_file] if platform_file else []), str(tmp_path / "extra.yaml")]

    conda = subprocess.run([*command, "--sdm", "conda"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                           env=env)
    assert conda.returncode == 0, conda.stdout[-2000:] + conda.stderr[-2000:]
    assert "Conda environment envs/cpu.yaml will be created" in conda.stdout + conda.stderr
    assert f"python -m {module} " in conda.stdout
    assert set(interpreters(conda.stdout)) == {"python"}
    # in the commands (Snakemake's reasons may name an interpreter an earlier local run recorded)
    assert sys.executable not in "\n".join(line for line in conda.stdout.splitlines() if line.startswith("Shell command:"))

    default = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert default.returncode == 0, default.stderr[-2000:]
    assert len(interpreters(default.stdout)) == len(interpreters(conda.stdout))
    assert {os.path.realpath(py) for py in interpreters(default.stdout)} == {os.path.realpath(sys.executable)}


@pytest.mark.parametrize("env", sorted((ROOT / "envs").glob("*.yaml")), ids=lambda p: p.name)
def test_conda_envs_install_this_checkout(env):
    """Snakemake hands conda a copy of the env file in .snakemake/conda/ and conda runs pip in that folder, so
    the editable installs of both distributions (the library, then dmacoll-lab from lab/) name the checkout through
    ${DMACOLL_ROOT} (the workflow sets it), not `..`."""
    import yaml

    pip = next(d["pip"] for d in yaml.safe_load(env.read_text())["dependencies"] if isinstance(d, dict))
    editable = [line.split()[1].split("[")[0] for line in pip if line.startswith("-e ")]
    assert editable == ["${DMACOLL_ROOT}", "${DMACOLL_ROOT}/lab"]


def artifact_flags():
    """The flags `make artifact` gives snakemake (the Makefile's SNAKEMAKE_FLAGS, the one place they are kept)."""
    r = subprocess.run(["make", "-s", "--no-print-directory", "snakemake-flags"], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return shlex.split(r.stdout)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("make") is None, reason="make not installed")
def test_make_artifact_resumes_after_ctrl_c(tmp_path):
    """Ctrl-C during `make artifact` leaves Snakemake's incomplete-output markers; the same command run again
    must finish the work, not stop with IncompleteFilesException. Cut down to one job of a few seconds (the
    host-emulator check at 2 ranks) by a small config and --until; the flags are make artifact's."""
    (tmp_path / "small.yaml").write_text(f"platform: none\noutdir: {tmp_path}/out\nhost_check: {{world: 2}}\n")
    select = ("--configfile", "config/config.yaml", str(tmp_path / "small.yaml"), "--until", "host_check")
    command = [SNAKEMAKE, *artifact_flags(), *select]
    with open(tmp_path / "interrupted.log", "w") as log:
        # a session of its own: the signal reaches snakemake and its jobs, as Ctrl-C reaches the terminal's
        # foreground process group, and not pytest. SIGINT restored to its default: a test run started in the
        # background of a script (`make test &`) inherits it ignored, and Python then never sees Ctrl-C
        run = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        try:
            deadline = time.monotonic() + 240
            # the job's shell creates its output (`> {output}`) before the check starts: from then on it runs
            while not any((tmp_path / "out").rglob("host_w2.txt")) and run.poll() is None \
                    and time.monotonic() < deadline:
                time.sleep(0.05)
            assert run.poll() is None, "the job ended before it could be interrupted"
            os.killpg(run.pid, signal.SIGINT)
            assert run.wait(timeout=120) != 0
        finally:
            if run.poll() is None:
                os.killpg(run.pid, signal.SIGKILL)
                run.wait()
    plain = subprocess.run([SNAKEMAKE, "--cores", "1", "--dry-run", *select], cwd=ROOT, capture_output=True,
                           text=True, timeout=300)
    assert "IncompleteFilesException" in plain.stdout + plain.stderr  # what stopped a plain rerun

    again = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    (out,) = (tmp_path / "out").rglob("host_w2.txt")
    assert out.read_text().strip()
    done = subprocess.run([SNAKEMAKE, "--cores", "1", "--dry-run", *select], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and "rule host_check:" not in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]


MEASURING = re.compile(r"-m dmacoll_lab (sweep|probe|breakdown|power|sm-usage|interference|c3|ficco|e2e|check-cost|"
                       r"amd-dmalatte|vllm bench|vllm results)\b")


def test_every_measuring_command_names_its_rule_in_the_runs_provenance(tmp_path):
    """Each job that measures exports DMACOLL_WORKFLOW_RULE=<its rule> first, so every run's data.json says which
    Snakemake rule made it (the docs' source lines read it); checked on the plan of every GPU experiment."""
    mine = tmp_path / "all.yaml"
    mine.write_text("probes: [flag_latency]\ne2e_phased: {runs: 1, models: [llama-3.1-8b]}\n")
    r = dry_run("-p", "--configfile", "config/config.yaml", "config/h200x2.yaml", str(mine),
                config=(f"outdir={tmp_path}",))
    assert r.returncode == 0, r.stderr[-2000:]
    jobs = r.stdout.split("\nrule ")[1:]
    measuring = [job for job in jobs if MEASURING.search(job)]
    assert len({job.split(":")[0] for job in measuring}) >= 10, [job.split(":")[0] for job in jobs]
    for job in measuring:
        rule = job.split(":")[0]
        command = job.split("Shell command:")[1]
        assert command.strip().startswith(f"export DMACOLL_WORKFLOW_RULE={rule}; "), job[-1500:]


def test_e2e_phased_runs_each_model_repeatedly_with_every_schedule_and_names_its_rule(tmp_path):
    """config e2e_phased: one model per run at the machine's world, `runs` times, the e2e section's schedules and
    this section's flags, the rule's name in the run's environment; not on a CPU render."""
    mine = tmp_path / "phased.yaml"
    mine.write_text("e2e_phased: {runs: 2, models: [llama-3.1-8b], prompts: [256], batches: [8, 32]}\n")
    r = dry_run("-p", "--configfile", "config/config.yaml", "config/h200x4.yaml", str(mine),
                config=(f"outdir={tmp_path}",))
    assert r.returncode == 0, r.stderr[-2000:]
    for n in (1, 2):
        run = f"{tmp_path}/e2e/phased_tp4_llama-3.1-8b_run{n}"
        assert (f"export DMACOLL_WORKFLOW_RULE=e2e_phased; {sys.executable} -m dmacoll_lab e2e --world 4 "
                f"--schedules serial microbatch seqpar --pieces 4 --models llama-3.1-8b --prompts 256 --batches 8 32 --out "
                f"{run}/data.csv 2>&1 | tee {run}/run.log") in r.stdout
    assert r.stdout.count("rule e2e_phased:") == 2  # a config list replaces the shipped one
    cpu = dry_run(config=("platform=none", f"outdir={tmp_path}"))
    assert cpu.returncode == 0 and "rule e2e_phased:" not in cpu.stdout, cpu.stderr[-2000:]
    bad = tmp_path / "bad.yaml"
    bad.write_text("e2e_phased: {models: [llama-9]}\n")
    wrong = dry_run("--configfile", "config/config.yaml", "config/h200x4.yaml", str(bad), config=(f"outdir={tmp_path}",))
    assert wrong.returncode != 0 and "e2e_phased.models: unknown value(s) llama-9" in wrong.stdout + wrong.stderr


def test_c3_extra_runs_are_the_c3_sections_flags_with_their_changes_and_feed_the_claims(tmp_path):
    """config c3_extra (2x H200: the claims' carveout runs): each a run of rule c3 into c3/<name>/, the c3 section's
    flags with the run's changes; the claims rest on them beside c3/c3; a run named c3 is refused."""
    r = dry_run("-p", "--configfile", "config/config.yaml", "config/h200x2.yaml", config=(f"outdir={tmp_path}",))
    assert r.returncode == 0, r.stderr[-2000:]
    for name, sms in (("carveout16", 16), ("carveout24", 24)):
        run = f"{tmp_path}/c3/{name}"
        assert (f"export DMACOLL_WORKFLOW_RULE=c3; {sys.executable} -m dmacoll_lab c3 --ops all_gather all_to_all "
                f"reduce_scatter all_reduce --strategies dma dma_carveout --targets 0.25 1 4 --sm-fractions 0.75 0.875 "
                f"--carveout-sms {sms} --repeats 7 --out {run}/data.csv") in r.stdout, r.stdout[-3000:]
    claims = r.stdout.split("rule claims:")[1].split("\nrule ")[0]
    assert f"{tmp_path}/c3/c3/data.csv {tmp_path}/c3/carveout16/data.csv" in claims, claims[:2000]
    bad = tmp_path / "bad.yaml"
    bad.write_text("c3_extra: {c3: {carveout_sms: 4}}\n")
    wrong = dry_run("--configfile", "config/config.yaml", "config/h200x2.yaml", str(bad), config=(f"outdir={tmp_path}",))
    assert wrong.returncode != 0 and "c3_extra" in wrong.stdout + wrong.stderr
