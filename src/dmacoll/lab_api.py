"""The library surface the artifact (``dmacoll_lab``: benchmarks, probes, the emulator checks, the report) stands
on: every name of ``dmacoll`` it uses beyond the public API (``dmacoll.__all__``), listed once, here. The lab imports
``dmacoll`` and this module only (``tests/test_layering.py``), so a change to one of these names is a change to this
list, and nothing else of the library is the lab's to reach.

Names load on first use (PEP 562), so ``from dmacoll.lab_api import human`` costs what ``from dmacoll.sizes import
human`` costs (no torch for the CLI's ``--help``).
"""
from __future__ import annotations

import importlib

# name -> (module, attribute); attribute None: the module itself
_SURFACE: dict[str, tuple[str, str | None]] = {}


def _add(module: str, *names: str) -> None:
    for name in names:
        _SURFACE[name] = (module, name)


def _add_module(alias: str, module: str) -> None:
    _SURFACE[alias] = (module, None)


# the public API and its errors, with the defaults the benchmarks print
_add("dmacoll", "__version__")
_add("dmacoll.communicator", "Communicator", "ALIGN", "DEFAULT_TIMEOUT_S")
_add("dmacoll.options", "Options", "EngineCapabilities")
_add("dmacoll.errors", "DmaCollError", "DmaCollTimeoutError", "InvalidArgument", "BackendUnavailable")
# measuring: timers, graph capture, sizes
_add("dmacoll.timing", "bench_time", "capture", "check_after", "elapsed_us", "interleave", "prepare",
     "synchronize", "Timed")
_add("dmacoll.graphs", "graph_capture")
_add("dmacoll.sizes", "count", "human", "parse_size", "seconds")
# the registries the CLI's choices come from, and the validation a benchmark shares with the library
for _module in ("ops", "options", "tuning", "validate"):
    _add_module(_module, f"dmacoll.{_module}")
_add("dmacoll.ops", "OpSpec", "get", "names")
_add("dmacoll.ops.spec", "Counts")
_add("dmacoll.tuning", "Entry", "Platform", "TuningTable")
# the protocol: plans, their lowering and execution (the emulator checks, the structure probes)
_add("dmacoll.plan", "Copy", "DIRECTIONS", "DONE", "DONE_ALT", "FULL", "Handshake", "Layout", "Plan", "READY", "Ref",
     "Signal", "VARIANTS", "Wait", "all_gather_exchange", "build_plan")
_add("dmacoll.executor", "SIGNAL_MODES", "SYNC_MODES", "WAIT_MODES", "critical_crossings", "flag_words", "lower",
     "one_index", "run")
# backends, for the probes that time one mechanism of them
_add("dmacoll.backends", "engine_class", "resolve")
_add_module("native", "dmacoll.backends.native")
_add_module("cuda_backend", "dmacoll.backends.cuda")
_add("dmacoll.backends.cuda", "CudaEngine", "check_driver", "memcpy_batch")
_add("dmacoll.backends.cubins", "compile_program")
_add_module("stream_engine", "dmacoll.backends.stream_engine")  # the crash map counts the graphs it replays
_add_module("cuda_sm", "dmacoll.backends.cuda_sm")
# calibration, for `dmacoll tune`, the defaults study and the replays
_add_module("calibration_cache", "dmacoll.calibration.cache")
_add_module("calibration_strategy", "dmacoll.calibration.strategy")
_add_module("calibration_paths", "dmacoll.calibration.paths")  # the path calibration, replayed on committed runs
# the vLLM plugin's routing table, for the vLLM runs and checks
_add_module("vllm_routes", "dmacoll.integrations.vllm_routes")
_add("dmacoll.integrations.vllm_routes", "SERVED_BY", "moves")

__all__ = sorted(_SURFACE)


def __getattr__(name: str):
    try:
        module, attribute = _SURFACE[name]
    except KeyError:
        raise AttributeError(f"module 'dmacoll.lab_api' has no attribute {name!r}") from None
    loaded = importlib.import_module(module)
    return loaded if attribute is None else getattr(loaded, attribute)


def __dir__() -> list[str]:
    return __all__
