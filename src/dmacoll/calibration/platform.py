"""The platform a communicator runs on (``tuning.Platform``), the same on every rank: each rank says what it sees
(its GPU, the GPU's NVLinks, the driver, free memory), every rank gathers every rank's view and derives one key."""
from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import NamedTuple, Optional

import torch
import torch.distributed as dist

from .. import __version__
from ..tuning import Platform


class Facts(NamedTuple):
    """What one rank sees."""

    gpu: str
    device_id: str          # the GPU's UUID (ranks that share a GPU share it)
    nvlinks: Optional[int]  # active NVLinks of the GPU (None: NVML could not tell)
    driver: str
    free_bytes: int         # free device memory now (the host emulator: 0, no limit it knows of)


def local_facts(device: torch.device) -> Facts:
    if device.type != "cuda":
        return Facts("cpu", "cpu", None, "", 0)
    free = torch.cuda.mem_get_info(device)[0]
    return _gpu_facts(device.index if device.index is not None else torch.cuda.current_device())._replace(
        free_bytes=free)


@functools.lru_cache(maxsize=None)
def _gpu_facts(index: int) -> Facts:
    props = torch.cuda.get_device_properties(index)
    uuid = str(getattr(props, "uuid", "") or getattr(props, "pci_bus_id", index))
    nvlinks, driver = _nvml(uuid)
    return Facts(props.name, uuid, nvlinks, driver or _driver_api(), 0)


def _nvml(uuid: str) -> tuple[Optional[int], str]:
    """(active NVLinks, driver version) from NVML (nvidia-ml-py), or (None, "") where it is not there."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
        driver = pynvml.nvmlSystemGetDriverVersion()
        links = 0
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            try:
                links += pynvml.nvmlDeviceGetNvLinkState(handle, link) == pynvml.NVML_FEATURE_ENABLED
            except pynvml.NVMLError:  # a link the GPU does not have
                break
        return links, driver.decode() if isinstance(driver, bytes) else str(driver)
    except Exception:  # noqa: BLE001 - no NVML (not installed, not NVIDIA, no driver): the key says unknown
        return None, ""


def _driver_api() -> str:
    """The driver's API version where NVML cannot name the driver (ROCm: HIP's version)."""
    if torch.version.hip:
        return f"hip {torch.version.hip}"
    try:
        from cuda.bindings import driver

        err, version = driver.cuDriverGetVersion()
        return f"cuda {version}" if err == driver.CUresult.CUDA_SUCCESS else "unknown"
    except Exception:  # noqa: BLE001 - cuda-bindings missing: the key says unknown
        return "unknown"


def gather(group, device: torch.device) -> list[Facts]:
    """Every rank's facts, in rank order (collective)."""
    out: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, tuple(local_facts(device)), group=group)
    return [Facts(*f) for f in out]


def key(facts: list[Facts], backend: str, code: str = "") -> Platform:
    """The platform of these ranks: rank 0's GPU name (every rank's where they differ) and driver; the topology
    ``host`` (the emulator), ``shared-device`` (ranks share a GPU), ``nvlink`` / ``pcie`` (every GPU has active
    NVLinks / none), else ``unknown``."""
    names = sorted({f.gpu for f in facts})
    links = [f.nvlinks for f in facts]
    if backend == "host":
        topology = "host"
    elif len({f.device_id for f in facts}) < len(facts):
        topology = "shared-device"
    elif None in links:
        topology = "unknown"
    else:
        topology = "nvlink" if all(links) else "pcie" if not any(links) else "unknown"
    return Platform(facts[0].gpu if len(names) == 1 else " / ".join(names), len(facts), topology, facts[0].driver,
                    code)


def ranks_per_device(facts: list[Facts]) -> int:
    return max(sum(f.device_id == g.device_id for g in facts) for f in facts)


@functools.lru_cache(maxsize=None)
def code_version() -> str:
    """dmacoll's version and a digest of its source files: a calibrated table is remeasured when the code changes."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.suffix in (".py", ".c") and "__pycache__" not in p.parts):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    return f"{__version__}+{digest.hexdigest()[:12]}"
