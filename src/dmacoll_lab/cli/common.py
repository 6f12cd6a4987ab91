"""What every `dmacoll` command shares: option types, the options that mean the same everywhere, running on
every GPU, and writing a result with its provenance.

Conventions: sizes are bytes per rank and take units (``4096``, ``64K``, ``256M``); ``--world`` is the number of
ranks (default: every visible GPU); ``--timeout-s`` is how long one wait of a collective may take before it
raises (``DMACOLL_TIMEOUT_S``), ``--deadline-s`` how long the ranks may run in all; ``--out`` is a result CSV,
its provenance JSON written beside it (``results/<machine>/<experiment>/<run>/data.csv`` by convention).

Errors: a bad option is argparse's (the command's usage and one line, exit 2); what only shows once the command
runs (no GPU, a library error) is a ``DmaCollError``, which ``dmacoll_lab.cli.main`` prints as one line, exit 2.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from dmacoll.lab_api import BackendUnavailable, count as positive, parse_size, seconds

__all__ = ["parse_size", "positive", "existing_file", "existing_dir", "add_ranks", "add_sizes", "add_out",
           "gpu_world", "run_on_gpus"]


def existing_file(text: str) -> str:
    """An argparse type: a file that must exist (its name, as the user wrote it, in the error)."""
    if not Path(text).is_file():
        raise argparse.ArgumentTypeError(f"no such file: {text!r}")
    return text


def existing_dir(text: str) -> str:
    """An argparse type: a folder that must exist."""
    if not Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"no such folder: {text!r}")
    return text


def add_ranks(p: argparse.ArgumentParser, world_default: int = 0, deadline_s: float = 1800.0) -> None:
    """--world, --timeout-s and --deadline-s, for a command that starts ranks."""
    p.add_argument("--world", type=positive, default=world_default,
                   help="ranks" + (" (default: every visible GPU)" if not world_default else ""))
    p.add_argument("--timeout-s", type=seconds, default=None,
                   help="how long one wait of a collective may take before it raises (default: $DMACOLL_TIMEOUT_S, "
                        "else 120)")
    p.add_argument("--deadline-s", type=seconds, default=deadline_s,
                   help="how long the ranks may run in all before they are stopped")


def add_sizes(p: argparse.ArgumentParser, defaults: tuple[str, ...], what: str = "message sizes") -> None:
    p.add_argument("--sizes", nargs="+", type=parse_size, default=[parse_size(x) for x in defaults],
                   help=f"{what}, bytes per rank (units: K, M, G)")


def add_out(p: argparse.ArgumentParser, default: str) -> None:
    p.add_argument("--out", default=default, help="result CSV (its provenance JSON is written beside it)")


def apply_timeout(a: argparse.Namespace) -> None:
    """--timeout-s reaches every communicator the ranks create (they read DMACOLL_TIMEOUT_S when they start)."""
    if getattr(a, "timeout_s", None) is not None:
        os.environ["DMACOLL_TIMEOUT_S"] = str(a.timeout_s)


def gpu_world(a: argparse.Namespace, least: int = 2) -> int:
    """--world, else every visible GPU; checked here, before any rank starts: BackendUnavailable without a GPU
    (--world may exceed the GPUs: ranks then share them), or when fewer than ``least`` ranks."""
    import torch

    gpus = torch.cuda.device_count()
    if gpus == 0:
        raise BackendUnavailable("needs a GPU (CUDA, or ROCm's torch), and this machine shows none "
                                 "(torch.cuda.device_count() is 0)")
    world = a.world or gpus
    if world < least:
        raise BackendUnavailable(f"needs at least {least} ranks; --world {a.world}" if a.world else
                                 f"needs at least {least} GPUs, found {gpus} (or pass --world {least})")
    return world


def planned_world(a: argparse.Namespace, least: int = 2) -> int:
    """Ranks of a command that can plan without GPUs: --world, else 2 for a dry run, else every visible GPU."""
    return a.world or (2 if getattr(a, "dry_run", False) else gpu_world(a, least))


def run_on_gpus(a: argparse.Namespace, run_rank, columns: list[str], cfg: dict, least: int = 2) -> int:
    """Run ``run_rank(rank, world, cfg)`` on every GPU and write rank 0's rows with provenance."""
    from ..bench import harness
    from ..verify.launch import run_ranks

    world = gpu_world(a, least)
    apply_timeout(a)
    rows = run_ranks(run_rank, world, cfg, device="cuda", timeout_s=a.deadline_s)[0]
    harness.write(a.out, rows, columns, cfg)
    return 0
