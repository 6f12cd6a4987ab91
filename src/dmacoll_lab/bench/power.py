"""Energy and power of collectives: NVML on NVIDIA, amdsmi on AMD, one interface.

Energy comes from the board's cumulative energy counter (read before and after a
run of back-to-back collectives lasting ``seconds``); power samples from a
background thread are kept as a cross-check (on Hopper NVML's power reading is a
1-second average, so the counter is the primary source). An idle baseline,
measured the same way with the GPU idle, is reported and subtracted:

    dynamic energy per call = (E_run - P_idle x t_run) / calls
"""
from __future__ import annotations

import statistics
import threading
import time
from typing import Callable, Optional, Protocol

from dmacoll.lab_api import BackendUnavailable


class Meter(Protocol):
    name: str

    def energy_j(self) -> float: ...

    def power_w(self) -> float: ...


class NvmlMeter:
    """One NVIDIA GPU through nvidia-ml-py, found by the UUID torch reports (CUDA and NVML orders may differ)."""

    def __init__(self, device_index: int):
        try:
            import pynvml
        except ImportError:
            raise BackendUnavailable("power needs nvidia-ml-py on NVIDIA GPUs (pip install nvidia-ml-py)") from None
        import torch

        pynvml.nvmlInit()
        uuid = str(torch.cuda.get_device_properties(device_index).uuid)
        self._nvml = pynvml
        self._handle = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
        self.name = f"cuda:{device_index} ({torch.cuda.get_device_name(device_index)})"

    def energy_j(self) -> float:
        return self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle) / 1e3  # mJ

    def power_w(self) -> float:
        return self._nvml.nvmlDeviceGetPowerUsage(self._handle) / 1e3  # mW


class AmdSmiMeter:
    """One AMD GPU through amdsmi (ROCm): the accumulated energy counter times its resolution.

    The board is found by PCI address (amdsmi lists every GPU of the node, HIP only the visible
    ones, renumbered), falling back to the index when torch does not report PCI ids. amdsmi's
    Python API names the counter ``power`` in older releases and ``energy_accumulator`` in newer
    ones; MI300-class boards report ``average_socket_power`` as "N/A" and the power in
    ``current_socket_power`` (ROCm >= 7: ``socket_power``)."""

    POWER_KEYS = ("socket_power", "current_socket_power", "average_socket_power")

    def __init__(self, device_index: int, smi=None, bdf: Optional[str] = None):
        if smi is None:
            try:
                import amdsmi as smi
            except ImportError:
                raise BackendUnavailable("power needs the amdsmi Python package on AMD GPUs (it ships with "
                                         "ROCm; see envs/rocm.yaml)") from None
        smi.amdsmi_init()
        self._smi = smi
        handles = smi.amdsmi_get_processor_handles()
        bdf = bdf if bdf is not None else _pci_address(device_index)
        match = [h for h in handles if bdf and str(smi.amdsmi_get_gpu_device_bdf(h)).lower() == bdf]
        if bdf and not match:
            raise BackendUnavailable(f"amdsmi lists no GPU at PCI address {bdf} (hip:{device_index})")
        self._handle = match[0] if match else handles[device_index]
        self.name = f"hip:{device_index}" + (f" ({bdf})" if bdf else "")

    def energy_j(self) -> float:
        e = self._smi.amdsmi_get_energy_count(self._handle)
        ticks = e["energy_accumulator"] if "energy_accumulator" in e else e["power"]
        return ticks * e["counter_resolution"] / 1e6  # resolution: microjoules per tick

    def power_w(self) -> float:
        info = self._smi.amdsmi_get_power_info(self._handle)
        for key in self.POWER_KEYS:
            value = info.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
        return float("nan")  # no reading: the energy counter stays the primary source


def _pci_address(device_index: int) -> Optional[str]:
    """'0000:0c:00.0' for a HIP device from torch's properties, None when torch does not say."""
    try:
        import torch

        props = torch.cuda.get_device_properties(device_index)
        return f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
    except (AttributeError, RuntimeError, AssertionError):
        return None


def meter_for(device_index: int) -> Meter:
    import torch

    return AmdSmiMeter(device_index) if torch.version.hip else NvmlMeter(device_index)


class PowerSampler:
    """Samples ``meter.power_w()`` every ``interval_s`` in a background thread."""

    def __init__(self, meter: Meter, interval_s: float = 0.02):
        self.meter, self.interval_s = meter, interval_s
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="dmacoll-power", daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self.meter.power_w())
            self._stop.wait(self.interval_s)

    def __enter__(self) -> "PowerSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def measure(meter: Meter, sync: Callable[[], None], steps: int = 0, step: Optional[Callable[[], int]] = None,
            idle_seconds: float = 0.0) -> dict:
    """Energy, time, calls and power over ``steps`` repetitions of ``step`` (which issues some
    calls and returns how many; a fixed count, so that every rank issues the same collectives),
    or over ``idle_seconds`` of an idle GPU when ``step`` is None."""
    sync()
    with PowerSampler(meter) as sampler:
        e0, t0, calls = meter.energy_j(), time.perf_counter(), 0
        if step is None:
            time.sleep(idle_seconds)
        for _ in range(steps if step is not None else 0):
            calls += step()
        sync()
        e1, t1 = meter.energy_j(), time.perf_counter()
    elapsed = t1 - t0
    return {"seconds": elapsed, "calls": calls, "energy_j": e1 - e0, "avg_power_w": (e1 - e0) / elapsed,
            "sampled_power_w": statistics.median(sampler.samples) if sampler.samples else float("nan"),
            "power_samples": len(sampler.samples)}


def dynamic_energy(run: dict, idle_power_w: float, bytes_per_call: int) -> dict:
    """Energy above idle, per call and per byte moved."""
    extra_j = run["energy_j"] - idle_power_w * run["seconds"]
    per_call = extra_j / run["calls"] if run["calls"] else float("nan")
    return {"idle_power_w": idle_power_w, "energy_per_call_uj": run["energy_j"] / max(run["calls"], 1) * 1e6,
            "dynamic_energy_per_call_uj": per_call * 1e6,
            "dynamic_energy_per_byte_pj": per_call / bytes_per_call * 1e12 if bytes_per_call else float("nan")}


# -- the power sweep: one process per GPU, each measuring its own board ------------------------
POWER_COLUMNS = ["op", "impl", "variant", "direction", "place", "world", "rank", "gpu", "bytes_per_rank",
                 "bytes_sent_per_call", "repeat", "calls", "seconds", "energy_j", "avg_power_w", "sampled_power_w",
                 "power_samples", "idle_power_w", "energy_per_call_uj", "dynamic_energy_per_call_uj",
                 "dynamic_energy_per_byte_pj", "correct"]


def power_points(op: str, impls) -> list:
    """NCCL; DMA-Latte's unoptimised baseline (pcpy push, out of place) and what Communicator() does by default
    (variant auto, in place where the op has the form)."""
    from dmacoll.lab_api import ops
    from .sweep import Point

    out = []
    if "nccl" in impls:
        out.append(Point(op, "nccl"))
    if "dma" in impls:
        out.append(Point(op, "dma", "pcpy", "push", "out", "memop"))
        out.append(Point(op, "dma", "auto", "auto", "in" if ops.get(op).in_place else "out", "memop"))
    return out


def run_power(rank: int, world: int, cfg: dict) -> Optional[list[dict]]:
    import torch

    from dmacoll.lab_api import capture, check_after, ops
    from . import harness
    from .baselines import Baselines
    from .sweep import Bound, point_fields

    sizes = cfg["sizes"]
    rk = harness.Rank(rank, world, pool_bytes=max(sizes), dtype=cfg["dtype"])
    baselines = Baselines(rk, max(sizes))
    meter = meter_for(torch.cuda.current_device())
    sync = torch.cuda.synchronize
    idle = [measure(meter, sync, idle_seconds=cfg["idle_seconds"]) for _ in range(cfg["repeats"])]
    idle_w = statistics.median(r["avg_power_w"] for r in idle)
    rows: list[dict] = [{"op": "idle", "impl": "idle", "repeat": i, "world": world, "rank": rank, "gpu": meter.name,
                         **r, "idle_power_w": idle_w} for i, r in enumerate(idle)]
    for i, nbytes in enumerate(sizes):
        for op in cfg["ops"]:
            sent = round(ops.get(op).bus_bytes(nbytes, world))
            for pt in power_points(op, cfg["impls"]):
                b = Bound(rk, baselines, pt, nbytes, 7919 * (i + 1))
                per_call_us = statistics.median(rk.bench(b.run, 10, 3, "graph").samples)
                # one replay ~ 20 ms of back-to-back calls; the same count on every rank (collectives must match)
                calls = min(rk.gather(max(10, min(2000, int(20e3 / max(per_call_us, 1e-3))))))
                graph = capture(b.run, calls)
                steps = rk.most(max(1, int(cfg["seconds"] / max(calls * per_call_us * 1e-6, 1e-6))))
                for rep in range(cfg["repeats"]):
                    rk.barrier()
                    res = measure(meter, sync, steps=steps, step=lambda: (graph.replay(), calls)[1])
                    rows.append({**point_fields(pt), "world": world, "rank": rank, "gpu": meter.name,
                                 "bytes_per_rank": nbytes, "bytes_sent_per_call": sent, "repeat": rep, **res,
                                 **dynamic_energy(res, idle_w, sent)})
                ok = check_after(b, b.run, calls, graph)  # the energy loop is the timing: its check after
                for r in rows[-cfg["repeats"]:]:
                    r["correct"] = ok
                if rank == 0:
                    last = rows[-1]
                    print(f"{op:14s} {pt.impl:5s} {pt.variant:5s} {nbytes:>10d} B: {last['avg_power_w']:6.1f} W "
                          f"(idle {idle_w:.1f}), {last['dynamic_energy_per_call_uj']:9.2f} uJ/call above idle, "
                          f"{'ok' if ok else 'WRONG'}", flush=True)
    return rk.finish(rows)
