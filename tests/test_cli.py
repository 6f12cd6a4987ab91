"""Every `dmacoll` command turns the library's own errors into one line on stderr and exit code 2."""
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from dmacoll import ops
from dmacoll_lab.cli import build_parser


def dmacoll(*args):
    return subprocess.run([sys.executable, "-m", "dmacoll_lab", *args], capture_output=True, text=True, timeout=300)


def error_lines(done):
    return [line for line in done.stderr.splitlines() if line.strip() and "Warning" not in line
            and not line.startswith("  ")]


NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="says what happens without a GPU")


@pytest.mark.parametrize("args, says", [
    (["check", "--backend", "host", "--world", "1"], "at least 2 ranks"),
    (["check", "--backend", "hip"], "hip"),
    (["e2e", "--dry-run", "--world", "16"], "cannot be split over 16 ranks"),
    (["report", "claims"], "needs --csv"),
    (["sweep", "--backend", "host"], "--backend host needs --world"),
    (["check", "--backend", "host", "--world", "1000"], "--world 1000: the host emulator runs one process per rank, "
                                                        "and this command starts at most 32"),
    pytest.param(["check", "--backend", "cuda", "--world", "2"], "backend 'cuda' needs an NVIDIA GPU", marks=NO_GPU),
    pytest.param(["sweep", "--world", "2"], "needs a GPU", marks=NO_GPU),
    pytest.param(["tune", "--world", "2"], "needs a GPU", marks=NO_GPU),  # not "dmacoll sweep: ..."
    pytest.param(["power"], "needs a GPU", marks=NO_GPU),
])
def test_a_library_error_is_one_line_and_exit_code_2(args, says):
    done = dmacoll(*args)
    assert done.returncode == 2, done.stderr
    lines = error_lines(done)
    assert len(lines) == 1 and says in lines[0] and lines[0].startswith(f"dmacoll {args[0]}: "), done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("args, says", [
    (["check", "--counts", "-5"], "argument --counts: must be positive: '-5'"),
    (["check", "--world", "0"], "argument --world: must be positive: '0'"),
    (["sweep", "--bogus"], "unrecognized arguments: --bogus"),
    (["tune", "--from-sweep", "missing.csv"], "argument --from-sweep: no such file: 'missing.csv'"),
    (["report", "table", "--csv", "missing"], "argument --csv: no such file: 'missing'"),
    (["report", "claims", "--csv", "missing"], "argument --csv: no such file: 'missing'"),
    (["report", "index", "--report-dir", "nowhere", "--platform", "a", "b"],
     "argument --report-dir: no such folder: 'nowhere'"),
    (["report", "check", "--report-dir", ".", "--results-dir", "nowhere"],
     "argument --results-dir: no such folder: 'nowhere'"),
    (["rules", "c3", "missing.csv"], "argument csv: no such file: 'missing.csv'"),
])
def test_a_bad_option_prints_its_commands_usage_and_one_line(args, says, tmp_path):
    done = subprocess.run([sys.executable, "-m", "dmacoll_lab", *args], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    lines = error_lines(done)
    assert lines[0].startswith(f"usage: dmacoll {args[0]} "), done.stderr  # the command's usage, not the top level
    assert lines[-1] == f"dmacoll {args[0]}: error: {says}", done.stderr
    assert "Traceback" not in done.stderr


def test_tune_names_the_missing_sidecar_of_a_sweep_it_was_given(tmp_path):
    (tmp_path / "sweep.csv").write_text("op\n")
    done = subprocess.run([sys.executable, "-m", "dmacoll_lab", "tune", "--from-sweep", "sweep.csv"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 2 and error_lines(done) == [
        "dmacoll tune: --from-sweep sweep.csv: its provenance sidecar sweep.json is missing (every sweep CSV is "
        "written with one beside it)"], done.stderr


def test_version():
    from dmacoll import __version__

    done = dmacoll("--version")
    assert done.returncode == 0 and done.stdout.strip() == f"dmacoll {__version__}"
    root = Path(__file__).resolve().parents[1]
    for pyproject in (root / "pyproject.toml", root / "lab/pyproject.toml"):  # one version, said in three places
        assert f'\nversion = "{__version__}"\n' in pyproject.read_text(), pyproject
    assert f'"dmacoll=={__version__}"' in (root / "lab/pyproject.toml").read_text()


def test_the_deadline_counts_from_the_first_rank_s_start():
    from dmacoll import DmaCollTimeoutError
    from dmacoll_lab.verify.launch import RankFailed, run_ranks

    t0 = time.monotonic()
    with pytest.raises(DmaCollTimeoutError, match="did not start within the deadline") as raised:
        run_ranks(_sleep, 4, 60, timeout_s=0.001)  # spawning alone takes longer than that
    assert isinstance(raised.value, RankFailed) and time.monotonic() - t0 < 5


def test_a_launcher_s_deadline_bounds_what_the_caller_asked(monkeypatch):
    # a tool that kills a run after its own limit (tools/gpu_lanes.sh) sets it, so the ranks' stacks come out first
    from dmacoll_lab.verify.launch import RanksTimedOut, run_ranks

    monkeypatch.setenv("DMACOLL_RANK_DEADLINE_S", "0.001")
    with pytest.raises(RanksTimedOut, match="deadline of 0.001 s"):
        run_ranks(_sleep, 2, 60, timeout_s=600)


@pytest.mark.parametrize("name", ["DMACOLL_RANK_DEADLINE_S", "DMACOLL_RANK_TIMEOUT_S"])
@pytest.mark.parametrize("value", ["soon", "0", "-5", "nan"])
def test_a_bad_launcher_time_is_a_clear_error_before_any_rank_starts(monkeypatch, name, value):
    from dmacoll import InvalidArgument
    from dmacoll_lab.verify.launch import run_ranks

    monkeypatch.setenv(name, value)
    with pytest.raises(InvalidArgument, match=rf"\${name} must be a positive number of seconds, got '{value}'"):
        run_ranks(_sleep, 2, 60)


def _sleep(rank, world, seconds):
    time.sleep(seconds)


def _rank_0_fails_fast(rank, world):
    from dmacoll import DmaCollTimeoutError

    if rank == 0:
        raise DmaCollTimeoutError("all_gather call #7 waited on rank(s) 1")
    time.sleep(60)


def test_a_timeout_says_what_the_ranks_that_ended_reported(monkeypatch):
    # a rank's own error (its watchdog naming the stuck call) is often why the others still wait: never lose it
    from dmacoll_lab.verify.launch import RanksTimedOut, run_ranks

    with pytest.raises(RanksTimedOut, match=r"ranks \[1\] of 2 did not finish(.|\n)*--- rank 0: raised "
                                            r"DmaCollTimeoutError: all_gather call #7 waited on rank\(s\) 1"):
        run_ranks(_rank_0_fails_fast, 2, timeout_s=8)


def test_every_collective_is_selectable_wherever_ops_are_chosen():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "cmd").choices
    choosers = {name: p for name, p in sub.items()
                if any(a.dest == "ops" for a in p._actions)}
    assert {"check", "sweep", "tune", "power", "sm-usage", "c3", "interference"} <= set(choosers)
    for name, p in choosers.items():
        ops_action = next(a for a in p._actions if a.dest == "ops")
        assert tuple(ops_action.choices) == ops.names(), name


def test_timeouts_mean_the_same_everywhere():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "cmd").choices
    for name, p in sub.items():
        for a in p._actions:
            if a.dest == "timeout_s":
                assert "one wait of a collective" in a.help, name
            if a.dest == "deadline_s":
                assert "ranks may run in all" in a.help, name


SWEEP_ARGS = ["--ops", "all_reduce", "--impls", "nccl", "dma", "--variants", "b2b", "--directions", "pull",
              "--places", "in", "--signals", "kernel", "--waits", "spin", "--prerecord", "no", "yes", "--submit",
              "native", "--handshakes", "lean", "--min-bytes", "2K", "--max-bytes", "4M", "--modes", "eager",
              "--dtype", "float32", "--calls", "7", "--repeats", "2", "--warmup", "1", "--seed", "5", "--out", "x.csv"]


def test_the_sweep_configuration_is_the_sweep_commands_arguments():
    from dataclasses import fields

    from dmacoll_lab.bench.sweep import SweepConfig

    cfg = SweepConfig.from_args(build_parser().parse_args(["sweep", *SWEEP_ARGS]))
    assert cfg == SweepConfig(ops=("all_reduce",), impls=("nccl", "dma"), variants=("b2b",), directions=("pull",),
                              places=("in",), signals=("kernel",), waits=("spin",), prerecord=(False, True),
                              submit=("native",), handshakes=("lean",), min_bytes=2048, max_bytes=4 << 20,
                              modes=("eager",), dtype="float32", calls=7, repeats=2, warmup=1, seed=5, out="x.csv")
    # every field came from its argument (none is its default): a new field must be added to SWEEP_ARGS
    assert [f.name for f in fields(SweepConfig) if getattr(cfg, f.name) == f.default] == []


def test_a_sweep_configuration_field_without_an_argument_is_an_error():
    from dmacoll_lab.bench.sweep import SweepConfig

    a = vars(build_parser().parse_args(["sweep"]))
    del a["warmup"]
    with pytest.raises(TypeError, match=r"no argument for \['warmup'\]"):
        SweepConfig.from_args(a)


def test_tune_measures_the_dma_sweep_of_its_arguments_without_changing_them(monkeypatch, tmp_path):
    from dmacoll_lab.cli import bench

    a = build_parser().parse_args(["tune", *[x for x in SWEEP_ARGS[5:] if x not in ("--out", "x.csv")],
                                   "--backend", "host", "--world", "2", "--out", str(tmp_path / "t.json")])
    before = dict(vars(a))
    seen = []
    monkeypatch.setattr(bench, "sweep", lambda cfg, args, host: seen.append((cfg, args, host)) or 3)
    assert bench.cmd_tune(a) == 3  # the sweep's failure is tune's
    (cfg, args, host), = seen
    assert cfg.impls == ("dma",) and cfg.out == str(tmp_path / "t.sweep.csv") and host
    assert (cfg.variants, cfg.calls, cfg.prerecord) == (("b2b",), 7, (False, True))
    assert args is a and vars(a) == before


def test_a_host_sweep_leaves_out_what_needs_cuda_and_refuses_it_by_name(monkeypatch, capsys):
    """`dmacoll sweep --backend host` with its defaults printed a traceback per torch symmetric-memory point and
    labelled the graph rows 'failed WRONG' (issue 47): now what needs CUDA is left out with one line each, and
    asking for it by name is refused before any rank starts."""
    from dmacoll_lab.cli import bench
    from dmacoll_lab.verify import launch

    ran = []
    monkeypatch.setattr(launch, "run_ranks", lambda fn, world, cfg, **kw: ran.append(cfg))
    assert bench.cmd_sweep(build_parser().parse_args(["sweep", "--backend", "host", "--world", "2"])) == 0
    (cfg,), out = ran, capsys.readouterr().out
    assert "symm_mem_lc" not in cfg.impls and "nccl" in cfg.impls and cfg.modes == ("eager",)
    assert out.count("leaving out") == 2 and "Traceback" not in out
    for asked in (["--impls", "nccl", "symm_mem_lc"], ["--modes", "graph", "eager"]):
        args = build_parser().parse_args(["sweep", "--backend", "host", "--world", "2", *asked])
        assert bench.cmd_sweep(args) == 2 and len(ran) == 1
        assert "cannot run" in capsys.readouterr().err


def test_a_failed_sweep_point_is_not_called_wrong():
    """'WRONG' marks a wrong result only; a point that could not run is 'failed' (its error said in one line)."""
    from dmacoll_lab.bench.sweep import status_text

    assert status_text({"status": "failed", "correct": False}) == "failed"
    assert status_text({"status": "ok", "correct": False}) == "ok WRONG"
    assert status_text({"status": "ok", "correct": True}) == "ok"
