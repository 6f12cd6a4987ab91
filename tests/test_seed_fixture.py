"""The ``seed`` fixture (tests/conftest.py): fresh per run, replayed from $DMACOLL_TEST_SEED, named by a failure."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import SEED_VARIABLE, fresh_seed

CONFTEST = Path(__file__).with_name("conftest.py")
PROBE = '''
def test_probe(seed):
    print(f"SEED={seed}")
    assert seed < 0, "a failure"
'''


def _run(tmp_path, env_seed=None):
    shutil.copy(CONFTEST, tmp_path / "conftest.py")
    (tmp_path / "test_probe.py").write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if k != SEED_VARIABLE}
    if env_seed is not None:
        env[SEED_VARIABLE] = str(env_seed)
    out = subprocess.run([sys.executable, "-m", "pytest", "-ra", "-p", "no:cacheprovider", "-q", str(tmp_path)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120).stdout
    return int(re.search(r"SEED=(\d+)", out).group(1)), out


def test_a_failure_names_its_seed_and_the_variable_replays_it(tmp_path):
    seed, out = _run(tmp_path)
    replay = f"replay with DMACOLL_TEST_SEED={seed}"
    summary = [line for line in out.splitlines() if line.startswith("FAILED")]
    assert summary and replay in summary[0], out  # the one line a CI log keeps
    assert re.search(rf"-+ seed -+\n{replay}", out), out  # and a section of the failure's report
    assert _run(tmp_path, seed)[0] == seed  # replayed
    assert _run(tmp_path, 12345)[0] == 12345


def test_the_variable_must_be_a_non_negative_integer(monkeypatch):
    for bad in ("0x1f", "-3", "seed"):
        monkeypatch.setenv(SEED_VARIABLE, bad)
        with pytest.raises(ValueError, match=f"DMACOLL_TEST_SEED='{bad}': a seed is a non-negative integer"):
            fresh_seed()
    monkeypatch.setenv(SEED_VARIABLE, " 42")
    assert fresh_seed() == 42


def test_the_readme_says_how_to_replay():
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    assert f"replay with {SEED_VARIABLE}=<seed>" in readme  # what a failure prints
    assert f"{SEED_VARIABLE}=<seed> .venv/bin/python -m pytest" in readme
