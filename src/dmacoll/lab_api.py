"""The library surface the artifact (``dmacoll_lab``: benchmarks, probes, the emulator checks, the report) stands
on: every name of ``dmacoll`` it uses beyond the public API (``dmacoll.__all__``), listed once, here. The lab imports
``dmacoll`` and this module only (``tests/test_layering.py``), so a change to one of these names is a change to this
list, and nothing else of the library is the lab's to reach.

A module the lab reads several names of (``ops``, ``options``, ``cuda_sm``...) is a view here: a namespace holding
only the names listed with it, so ``from dmacoll.lab_api import cuda_sm`` gives ``cuda_sm.slot_bytes`` and nothing
else of the module (the layering test also checks every such use in the lab's source against these lists). No
name starting with ``_`` crosses.

Names load on first use (PEP 562), so ``from dmacoll.lab_api import human`` costs what ``from dmacoll.sizes import
human`` costs (no torch for the CLI's ``--help``).
"""
from __future__ import annotations

import importlib
import types

# name -> (module, attribute); attribute None: a view of the module holding the names in _VIEWS[name]
_SURFACE: dict[str, tuple[str, str | None]] = {}
_VIEWS: dict[str, tuple[str, ...]] = {}
_loaded: dict[str, types.SimpleNamespace] = {}


def _add(module: str, *names: str) -> None:
    for name in names:
        _SURFACE[name] = (module, name)


def _add_view(alias: str, module: str, *names: str) -> None:
    _SURFACE[alias] = (module, None)
    _VIEWS[alias] = names


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
_add_view("ops", "dmacoll.ops", "OpSpec", "get")
_add_view("options", "dmacoll.options", "EngineCapabilities", "PATHS", "PATH_MARGIN", "candidates", "choices",
          "fallback", "nccl_auto")
_add_view("tuning", "dmacoll.tuning", "CHOSEN", "Choice", "Platform", "TuningTable", "find")
_add_view("validate", "dmacoll.validate", "check_world")
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
_add_view("native", "dmacoll.backends.native", "COPY", "Cmd", "build", "driver_api", "ensure_built", "load")
_add("dmacoll.backends.cuda", "CudaEngine", "check_driver", "counted_driver_calls", "memcpy_batch")
_add("dmacoll.backends.cubins", "compile_program")
_add_view("stream_engine", "dmacoll.backends.stream_engine", "StreamEngine")  # the crash map counts its graphs
_add_view("cuda_sm", "dmacoll.backends.cuda_sm", "MAX_WORLD", "default_two_shot_bytes", "slot_bytes", "sm_bytes")
# calibration, for `dmacoll tune`, the defaults study and the replays
_add_view("calibration_cache", "dmacoll.calibration.cache", "path")
_add_view("calibration_strategy", "dmacoll.calibration.strategy", "Point", "Strategy", "Timing", "run")
_add_view("calibration_paths", "dmacoll.calibration.paths", "PathPoint", "PathSearch", "run")  # replayed on runs
# the vLLM plugin's routing table, for the vLLM runs and checks
_add_view("vllm_routes", "dmacoll.integrations.vllm_routes", "SERVED", "TABLE_FILE")
_add("dmacoll.integrations.vllm_routes", "SERVED_BY", "moves")

__all__ = sorted(_SURFACE)


def __getattr__(name: str):
    try:
        module, attribute = _SURFACE[name]
    except KeyError:
        raise AttributeError(f"module 'dmacoll.lab_api' has no attribute {name!r}") from None
    loaded = importlib.import_module(module)
    if attribute is not None:
        return getattr(loaded, attribute)
    if name not in _loaded:
        _loaded[name] = types.SimpleNamespace(**{n: getattr(loaded, n) for n in _VIEWS[name]})
    return _loaded[name]


def __dir__() -> list[str]:
    return __all__
