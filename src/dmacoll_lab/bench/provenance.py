"""Provenance recorded next to every result: code, software, hardware, config."""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

ENV_PREFIXES = ("NCCL_", "TORCH_", "CUDA_", "NVSHMEM_", "DMACOLL_", "HIP_", "HSA_", "OMP_", "VLLM_")


def _run(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def git_sha() -> dict[str, Any]:
    """The commit the code came from. DMACOLL_GIT_SHA, where the runner sets it, names the commit
    whose tree was shipped to the machine (a shipped copy's own .git can be stale: it then shows
    an older HEAD plus the newer code as changes); the checkout's state is recorded beside it."""
    root = Path(__file__).resolve().parents[3]
    sha = _run(["git", "-C", str(root), "rev-parse", "HEAD"])
    checkout: dict[str, Any] = {"sha": "unknown", "dirty": "unknown"}
    if re.fullmatch(r"[0-9a-f]{40}", sha):  # a copied tree may hold a .git without commits
        dirty = bool(_run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"]))
        checkout = {"sha": sha, "dirty": dirty}
    stated = os.environ.get("DMACOLL_GIT_SHA")
    if stated:
        return {"git_sha": stated, "git_dirty": os.environ.get("DMACOLL_GIT_DIRTY", "False") == "True",
                "git_checkout": checkout}
    return {"git_sha": checkout["sha"], "git_dirty": checkout["dirty"]}


def _version(pkg: str) -> str:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return "not installed"


def software() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "python": sys.version.split()[0], "torch": torch.__version__, "torch_cuda": torch.version.cuda,
        "torch_hip": torch.version.hip, "cuda_bindings": _version("cuda-bindings"),
        "dmacoll": _version("dmacoll"), "numpy": _version("numpy"),
    }
    try:
        info["nccl"] = ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None
    except Exception as e:  # noqa: BLE001
        info["nccl"] = f"unknown ({e})"
    return info


def hardware() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"hostname": socket.gethostname(), "platform": platform.platform(),
                            "cpu_count": os.cpu_count()}
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        info["driver"] = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]).splitlines()[:1]
        info["topology"] = _run(["nvidia-smi", "topo", "-m"])
        info["nvlink"] = _run(["nvidia-smi", "nvlink", "--status"])[:4000]
        props = torch.cuda.get_device_properties(0)
        info["sm_count"] = props.multi_processor_count
        info["async_engine_count"] = _async_engines()
    else:
        info["gpus"] = []
    return info


def _async_engines() -> Any:
    try:
        from cuda.bindings import driver

        err, n = driver.cuDeviceGetAttribute(driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT, 0)
        return int(n) if err == driver.CUresult.CUDA_SUCCESS else None
    except Exception:  # noqa: BLE001
        return None


def process_seconds() -> float | None:
    """How long this process has run (Linux: its start in /proc/self/stat against the uptime), None elsewhere: the
    run's length where the writing process is the run (rank 0's where ranks are spawned, the launcher excluded), so
    a lent machine's 10-minute calls can be planned from committed runs."""
    try:
        started_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return round(uptime - started_ticks / os.sysconf("SC_CLK_TCK"), 1)
    except (OSError, ValueError, IndexError):
        return None


def collect(config: dict[str, Any]) -> dict[str, Any]:
    return {
        "created_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "process_seconds": process_seconds(),
        "command": sys.argv,
        **git_sha(),
        "software": software(),
        "hardware": hardware(),
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)},
        "config": config,
    }


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_sidecar(csv_path: Path, provenance: dict[str, Any]) -> Path:
    side = csv_path.with_suffix(".json")
    write_atomic(side, json.dumps(provenance, indent=2, default=str) + "\n")
    return side


def write_table(path: Path, rows: list[dict], columns: list[str], config: dict[str, Any]) -> Path:
    """A tidy CSV (floats to 4 decimals) and its provenance sidecar, both written atomically."""
    import csv
    import io

    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow({k: (f"{v:.7g}" if isinstance(v, float) else v) for k, v in r.items()})
    write_atomic(Path(path), buf.getvalue())
    write_sidecar(Path(path), collect(config))
    print(f"wrote {path} ({len(rows)} rows) and {Path(path).with_suffix('.json')}", flush=True)
    return Path(path)
