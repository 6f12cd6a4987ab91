"""What the probes share: the table a probe returns, the checks that it can run here, argument types."""
from __future__ import annotations

import argparse
from typing import Callable, NamedTuple, Optional

from dmacoll.lab_api import BackendUnavailable, count, parse_size


class Table(NamedTuple):
    rows: list[dict]
    config: dict  # what the provenance sidecar records as the run's config


def quantiles(samples: list[float]) -> tuple[float, float, float]:
    """Median, p10, p90 (nearest rank) of ``samples``; nan for none."""
    import statistics

    if not samples:
        return (float("nan"),) * 3
    s = sorted(samples)
    q = lambda f: s[min(len(s) - 1, int(f * (len(s) - 1) + 0.5))]  # noqa: E731
    return statistics.median(s), q(0.1), q(0.9)


def require_gpus(n: int, what: str) -> None:
    """Raise BackendUnavailable unless ``n`` CUDA GPUs are visible."""
    import torch

    found = torch.cuda.device_count() if torch.version.cuda and torch.cuda.is_available() else 0
    if found < n:
        raise BackendUnavailable(f"{what} needs {n} CUDA GPU{'s' if n > 1 else ''}, found {found}")


def driver():
    """cuda-bindings' driver module, or BackendUnavailable saying it is missing."""
    try:
        from cuda.bindings import driver as drv
    except ImportError as e:
        raise BackendUnavailable(f"this probe needs cuda-bindings (pip install cuda-bindings): {e}") from None
    return drv


def checked(result, what: str):
    """A cuda-bindings call's result (its value, or the tuple of values past the error), or RuntimeError naming
    ``what`` and the error."""
    err = result[0] if isinstance(result, tuple) else result
    if int(err) != 0:
        raise RuntimeError(f"{what}: error {err}")
    return result[1] if isinstance(result, tuple) and len(result) == 2 else result


def nvrtc_functions(source: str, name: str, arch: str, kernels: tuple[str, ...],
                    options: tuple[str, ...] = ()) -> dict:
    """The ``kernels`` of CUDA ``source``, compiled by NVRTC to a cubin for ``arch`` (``sm_90``) and loaded into the
    current context: kernel name -> CUfunction."""
    from dmacoll.lab_api import compile_program

    drv = driver()
    cubin = compile_program(source, name, arch, options)
    module = checked(drv.cuModuleLoadData(cubin), "cuModuleLoadData")
    return {k: checked(drv.cuModuleGetFunction(module, k.encode()), k) for k in kernels}


def gemm_and_side_operands(copy_bytes: int, add_elements: int) -> tuple:
    """On GPU 0: the GEMMs' bf16 8192^3 operands (a, c = a @ a) and the side jobs' buffers: a device-local copy
    (src -> dst, bytes) and a bf16 add (x + y -> z)."""
    import torch

    a = torch.randn(8192, 8192, device=0, dtype=torch.bfloat16)
    src = torch.randint(0, 255, (copy_bytes,), dtype=torch.uint8, device=0)
    x, y = (torch.randn(add_elements, device=0, dtype=torch.bfloat16) for _ in range(2))
    return a, torch.empty_like(a), src, torch.empty_like(src), x, y, torch.empty_like(x)


def idle_gpu_us(fn: Callable[[], None], stream, repeats: int = 1, warmup: int = 0) -> list[float]:
    """Microseconds of ``fn``'s work on ``stream`` alone, the GPU idle before each of ``repeats`` samples (the
    timing loop, ``dmacoll.timing.bench_time``: CUDA events), after ``warmup`` calls."""
    import torch

    from dmacoll.lab_api import bench_time

    return bench_time(fn, 1, repeats, warmup=warmup, stream=stream, each=torch.cuda.synchronize).samples


def next_to_gemms(side: Callable[[], None], side_stream, gemms: Optional[Callable[[], None]], comp, hold: int,
                  delay: int) -> tuple[float, float]:
    """(side issue -> side end, release -> GEMMs' end) in us: both streams sleep from one instant (``hold`` GPU
    cycles, one block each on an idle GPU), so both sides are queued before either starts, with no cross-stream
    wait (which would need an SM while the GEMMs hold them all); the side sleeps ``delay`` cycles longer, so it
    arrives while a GEMM runs. ``gemms`` None: the side alone (the second time is nan). Not the timing loop: two
    streams timed from their own starts, the harness's ``time_parts`` without its cross-stream wait."""
    import torch

    torch.cuda.synchronize()
    release, side_start, side_end, gemm_end = (torch.cuda.Event(enable_timing=True) for _ in range(4))
    if gemms is not None:
        with torch.cuda.stream(comp):
            torch.cuda._sleep(hold)
        release.record(comp)
        with torch.cuda.stream(comp):
            gemms()
        gemm_end.record(comp)
    with torch.cuda.stream(side_stream):
        torch.cuda._sleep(hold + delay)
    side_start.record(side_stream)
    with torch.cuda.stream(side_stream):
        side()
    side_end.record(side_stream)
    torch.cuda.synchronize()
    return (side_start.elapsed_time(side_end) * 1e3,
            release.elapsed_time(gemm_end) * 1e3 if gemms is not None else float("nan"))


# -- argument types shared by the probes ---------------------------------------------------------------------
def at_most(limit: int):
    """A positive whole number up to ``limit``."""
    def parse(text: str) -> int:
        value = count(text)
        if value > limit:
            raise argparse.ArgumentTypeError(f"at most {limit}: {text!r}")
        return value
    return parse


def size_multiple_of(granule: int):
    """A size with units (``64M``) that is a whole multiple of ``granule`` bytes (or elements)."""
    def parse(text: str) -> int:
        value = parse_size(text)
        if value % granule:
            raise argparse.ArgumentTypeError(f"must be a multiple of {granule}: {text!r}")
        return value
    return parse


def add_repeats(p: argparse.ArgumentParser, default: int, what: str = "timed repeats (their median is reported)"):
    p.add_argument("--repeats", type=count, default=default, help=f"{what} (default {default})")
