"""Every `dmacoll` command turns the library's own errors into one line on stderr and exit code 2."""
import subprocess
import sys

import pytest

from dmacoll import ops
from dmacoll.cli import build_parser


def dmacoll(*args):
    return subprocess.run([sys.executable, "-m", "dmacoll", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("args, says", [
    (["check", "--backend", "host", "--world", "1"], "at least 2 ranks"),
    (["check", "--backend", "hip"], "hip"),
    (["e2e", "--dry-run", "--world", "16"], "cannot be split over 16 ranks"),
    (["report", "claims"], "needs --csv"),
    (["sweep", "--backend", "host"], "--backend host needs --world"),
])
def test_a_library_error_is_one_line_and_exit_code_2(args, says):
    done = dmacoll(*args)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip() and "Warning" not in line
             and not line.startswith("  ")]
    assert len(lines) == 1 and says in lines[0] and lines[0].startswith(f"dmacoll {args[0]}: "), done.stderr
    assert "Traceback" not in done.stderr


def test_every_collective_is_selectable_wherever_ops_are_chosen():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "cmd").choices
    choosers = {name: p for name, p in sub.items()
                if any(a.dest == "ops" for a in p._actions)}
    assert {"check", "sweep", "tune", "power", "sm-usage", "c3", "interference"} <= set(choosers)
    for name, p in choosers.items():
        ops_action = next(a for a in p._actions if a.dest == "ops")
        assert tuple(ops_action.choices) == ops.NAMES, name


def test_timeouts_mean_the_same_everywhere():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "cmd").choices
    for name, p in sub.items():
        for a in p._actions:
            if a.dest == "timeout_s":
                assert "one wait of a collective" in a.help, name
            if a.dest == "deadline_s":
                assert "ranks may run in all" in a.help, name
