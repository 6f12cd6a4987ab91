"""The README's library example, exactly as written (its code block and its launch command), runs on the host
emulator at world 2 and prints what the calls compute; docs/library.md's continuation of it runs too."""
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAUNCH = re.compile(r"run `(torchrun [^`]*example\.py)`")
PYTHON = re.compile(r"```python\n(.*?)```", re.S)
PRINTED = re.compile(r"rank \d+ on \w+: gathered \[[^]]*\], summed [0-9.]+")  # the ranks' lines may interleave


def example() -> tuple[list[str], str, int]:
    """The README's launch command, the code after it, and where it starts."""
    text = (ROOT / "README.md").read_text()
    launch = LAUNCH.search(text)
    assert launch, "README.md: no 'run `torchrun ... example.py`' line"
    code = PYTHON.search(text, launch.end())
    return shlex.split(launch.group(1)), code.group(1), launch.start()


def run(command: list[str], code: str, tmp_path: Path, gpus: bool = False) -> subprocess.CompletedProcess:
    """``command`` (torchrun ...) as the same program, ``python -m torch.distributed.run``, in a folder holding
    ``code`` as example.py; unless ``gpus``, with no GPU visible: the host emulator."""
    assert command[0] == "torchrun" and command[-1] == "example.py", command
    (tmp_path / "example.py").write_text(code)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), **({} if gpus else {"CUDA_VISIBLE_DEVICES": ""})}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", *command[1:]], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=240)


def world_of(command: list[str]) -> int:
    return int(command[command.index("--nproc-per-node") + 1])


def test_the_readme_example_is_on_the_first_screen():
    text = (ROOT / "README.md").read_text()
    _, code, start = example()
    assert start < text.index("## Headline") and text[:start].count("\n") < 25
    assert "Communicator()" in code


def expected(world: int, backend: str) -> list[str]:
    """What the example's ranks print: every rank's number gathered, their sum."""
    gathered, summed = [float(r) for r in range(world)], float(sum(range(world)))
    return [f"rank {r} on {backend}: gathered {gathered}, summed {summed}" for r in range(world)]


def test_the_readme_example_runs_as_written_on_the_host_emulator(tmp_path):
    command, code, _ = example()
    done = run(command, code, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(PRINTED.findall(done.stdout)) == expected(world_of(command), "host"), done.stdout


def test_the_library_pages_calls_continue_the_example(tmp_path):
    command, code, _ = example()
    tour = PYTHON.search((ROOT / "docs/library.md").read_text()).group(1)
    assert code.count("comm.close()\n") == 1 and tour.endswith("comm.close()\n")
    done = run(command, code.replace("comm.close()\n", tour), tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(PRINTED.findall(done.stdout)) == world_of(command), done.stdout
