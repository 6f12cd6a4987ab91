"""dmacoll inside vLLM: tensor-parallel all-gather / reduce-scatter / all-reduce and expert-parallel dispatch /
combine on copy engines, where dmacoll is measured faster. One switch: ``DMACOLL_VLLM=1``; without it vLLM runs
exactly as it would. Supported: vLLM 0.26.0 - 0.33.0 (``VLLM_RANGE``; tested against 0.26.0 on the lent GPU
machines and 0.32.0 in CI). Not with ``--enable-elastic-ep``: vLLM's StatelessGroupCoordinator asserts the
communicator is exactly CudaCommunicator, so leave the switch off there.

How it plugs in (vLLM's documented extension points, no vLLM code copied or patched in place):

* vLLM calls every ``vllm.general_plugins`` entry point in each of its processes before any work
  (https://docs.vllm.ai/en/stable/design/plugin_system/). dmacoll declares ``register`` there (pyproject.toml).
* Each process group of vLLM (``GroupCoordinator``: TP, DP, EP, PP) builds its device communicator from the
  qualified name that ``current_platform.get_device_communicator_cls()`` returns (by default
  ``vllm.distributed.device_communicators.cuda_communicator.CudaCommunicator``). With the switch on, ``register``
  makes the platform return ``dmacoll.integrations.vllm.DmaCudaCommunicator``: a subclass of vLLM's
  ``CudaCommunicator`` whose ``all_reduce``, ``all_gather``, ``reduce_scatter``, ``all_gatherv``,
  ``reduce_scatterv`` (and ``reduce_scatterv_into_output`` where the installed vLLM has it: 0.33) send a call to
  a dmacoll ``Communicator`` of the same group only when (1) dmacoll can run it (CUDA, a dtype it sums, even
  per-rank sizes, contiguous, at most ``DMACOLL_VLLM_MAX_BYTES``) and (2) the committed measurements say dmacoll
  is faster for that op, size class and mode (graph while a CUDA graph is captured, else eager) at this world
  size on this GPU (``vllm_routes.py``: no data, no routing). Everything else goes to the parent class's method:
  vLLM's own path (custom all-reduce, symmetric memory, PyNccl, ...). Each decision is logged once per
  (group, op, mode, size class) with its reason; ``DMACOLL_VLLM_DECISIONS=PREFIX`` also appends them as JSON
  lines to ``PREFIX<pid>.jsonl`` (the output checks read which ops were routed).
* Expert parallel: vLLM's ``allgather_reducescatter`` all2all backend dispatches with ``all_gatherv`` and
  combines with ``reduce_scatterv`` (0.33's modular MoE finalize: ``reduce_scatterv_into_output``, which
  CudaCommunicator does not pass through ``reduce_scatterv``) of the EP/DP group's communicator, so those calls
  follow the same rules; ``naive`` combines with an all-reduce in older versions; DeepEP / pplx / FlashInfer /
  other all2all backends keep their own kernels (logged). With TP only (no DP), vLLM's expert parallel needs no
  dispatch: the MoE output is all-reduced over the TP group.

dmacoll calls are CUDA-graph capturable (``sync='reset'``), so vLLM's graph capture works unchanged. Private
tensors (vLLM's own) are staged through the communicator's staging area, so each call is bounded by
``DMACOLL_VLLM_MAX_BYTES`` (default 32 MiB). This module imports without vLLM; it says what is missing when used.
"""
from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
from dataclasses import dataclass
from typing import Optional, Sequence

from .vllm_routes import SERVED_BY  # vLLM's calls -> the dmacoll collective that serves each

VLLM_RANGE = ("0.26.0", "0.33.0")  # oldest and newest vLLM tested (pyproject extra `vllm`, envs/vllm.yaml)
VLLM_REQUIREMENT = f"vllm>={VLLM_RANGE[0]},<={VLLM_RANGE[1]}"
SWITCH = "DMACOLL_VLLM"
MAX_BYTES_ENV = "DMACOLL_VLLM_MAX_BYTES"
DECISIONS_ENV = "DMACOLL_VLLM_DECISIONS"
DEFAULT_MAX_BYTES = 32 << 20
CUDA_COMMUNICATOR = "vllm.distributed.device_communicators.cuda_communicator.CudaCommunicator"
QUALNAME = f"{__name__}.DmaCudaCommunicator"
ROUTED_GROUPS = ("tp", "ep", "dp")  # PP only sends and receives
# overrides of methods that only some supported vLLM versions have: added only where the parent defines them
OPTIONAL_OVERRIDES = ("reduce_scatterv_into_output",)  # 0.33's EP combine; absent in 0.26 - 0.32

log = logging.getLogger("dmacoll.vllm")
_logged: set[str] = set()


def log_once(key: str, message: str, level: int = logging.INFO) -> bool:
    """Log ``message`` the first time ``key`` is seen in this process; True if it was logged now."""
    if key in _logged:
        return False
    _logged.add(key)
    log.log(level, "dmacoll: %s", message)
    return True


def show_logs() -> None:
    """Make the plugin's INFO lines visible in vLLM's processes (vLLM configures only its own logger)."""
    if not any(getattr(h, "dmacoll", False) for h in log.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        handler.dmacoll = True
        log.addHandler(handler)
    if log.level == logging.NOTSET or log.level > logging.INFO:
        log.setLevel(logging.INFO)


def enabled(environ: Optional[dict] = None) -> bool:
    value = (os.environ if environ is None else environ).get(SWITCH, "").strip().lower()
    return value in ("1", "true", "yes", "on")


def max_bytes(environ: Optional[dict] = None) -> int:
    text = (os.environ if environ is None else environ).get(MAX_BYTES_ENV, "")
    if not text:
        return DEFAULT_MAX_BYTES
    from ..sizes import parse_size

    return parse_size(text)


def vllm_missing() -> str:
    """Why vLLM cannot be used here ('' when it can); never imports vLLM itself."""
    if importlib.util.find_spec("vllm") is None:
        return (f"vLLM is not installed; dmacoll's vLLM plugin supports {VLLM_REQUIREMENT}: "
                f"pip install 'dmacoll[vllm]' (or the conda env envs/vllm.yaml; without network: tools/vllm_bundle.py)")
    return ""


def release(version: str) -> Optional[tuple[int, int, int]]:
    """(major, minor, patch) of a version string such as ``0.26.0`` or ``0.33.0rc1+cu130`` (None if unreadable)."""
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    return (int(m[1]), int(m[2]), int(m[3] or 0)) if m else None


def supported(version: str) -> bool:
    got = release(version)
    return got is not None and release(VLLM_RANGE[0]) <= got <= release(VLLM_RANGE[1])


def require_vllm() -> None:
    why = vllm_missing()
    if why:
        raise ImportError(why)
    from importlib import metadata

    try:
        version = metadata.version("vllm")
    except metadata.PackageNotFoundError:  # a source checkout on the path
        version = "unknown"
    if not supported(version):
        log_once("version", f"vLLM {version} is installed, the plugin is tested with {VLLM_REQUIREMENT}; calls it "
                            "cannot route fall back to vLLM's path", logging.WARNING)


# -- which calls go to dmacoll (pure: tested without vLLM or a GPU) ---------------------------------------------
def group_reason(unique_name: str, world: int) -> str:
    """Why a vLLM group keeps its own communicator ('' if dmacoll takes its collectives)."""
    kind = unique_name.split(":")[0]
    if kind not in ROUTED_GROUPS:
        return f"{kind or 'unnamed'} group: only {'/'.join(ROUTED_GROUPS)} collectives are routed"
    if world < 2:
        return f"{kind} group of one rank: nothing to communicate"
    return ""


@dataclass(frozen=True)
class Call:
    op: str
    nbytes: int  # the larger of input and output
    dtype: str   # e.g. "bfloat16"
    device: str  # "cuda", "cpu", ...
    contiguous: bool = True
    sizes: Optional[tuple[int, ...]] = None  # all_gatherv / reduce_scatterv per-rank sizes
    dim_ok: bool = True  # the gathered / scattered dimension divides as the op needs


def fallback_reason(call: Call, limit: int) -> str:
    """Why ``call`` goes to vLLM's own path ('' when dmacoll runs it). The text is also the log-once key, so it
    names the kind of case, not the sizes."""
    if call.device != "cuda":
        return f"{call.op} on {call.device} tensors"
    if call.nbytes == 0:
        return f"{call.op} of an empty tensor"
    from .. import ops

    if ops.get(SERVED_BY[call.op]).reduces and call.dtype not in ops.REDUCE_DTYPE_NAMES:
        return f"{call.op} of {call.dtype} (dmacoll sums {', '.join(ops.REDUCE_DTYPE_NAMES)})"
    if call.sizes is not None and len(set(call.sizes)) > 1:
        return f"{call.op} with different sizes per rank"
    if not call.contiguous:
        return f"{call.op} of a non-contiguous tensor"
    if not call.dim_ok:
        return f"{call.op} whose dimension does not split evenly over the ranks"
    if call.nbytes > limit:
        return f"{call.op} above {MAX_BYTES_ENV}={limit} bytes"
    return ""


def describe_all2all(manager: object) -> str:
    """What happens to EP dispatch / combine with this all2all manager."""
    if manager is None:
        return ""
    name = type(manager).__name__
    if name.startswith("AgRs"):
        return f"{name}: EP dispatch (all_gatherv) and combine (reduce_scatterv) run on dmacoll"
    if name.startswith("Naive"):
        return f"{name}: EP combine (all_reduce) runs on dmacoll, dispatch broadcasts stay on vLLM's path"
    return f"{name}: EP dispatch / combine keep this backend's own kernels"


# -- vLLM side -------------------------------------------------------------------------------------------------
def register() -> None:
    """The ``vllm.general_plugins`` entry point: with DMACOLL_VLLM=1, make the CUDA platform build
    DmaCudaCommunicator for its process groups. Never raises: a problem is logged and vLLM runs as usual."""
    if not enabled():
        return
    show_logs()
    why = vllm_missing()
    if why:
        log_once("missing", why, logging.WARNING)
        return
    try:
        require_vllm()
        from vllm.platforms import current_platform

        cls = type(current_platform)
        current = cls.get_device_communicator_cls()
        if current == QUALNAME:
            return
        if current != CUDA_COMMUNICATOR:
            log_once("platform", f"{cls.__name__} builds {current}; dmacoll replaces only {CUDA_COMMUNICATOR}",
                     logging.WARNING)
            return
        cls.get_device_communicator_cls = classmethod(lambda c: QUALNAME)
        log_once("registered", f"{cls.__name__} process groups use {QUALNAME} ({SWITCH}=1)")
    except Exception as e:  # noqa: BLE001 - the plugin must never stop vLLM
        log_once("register", f"not enabled: {type(e).__name__}: {e}", logging.WARNING)


def record_decision(group: str, op: str, mode: str, decision, environ: Optional[dict] = None) -> bool:
    """Log a routing decision once per (group, op, mode, size class); with DMACOLL_VLLM_DECISIONS=PREFIX also
    append it to PREFIX<pid>.jsonl. True if it was new."""
    where = "dmacoll" if decision.route else "vLLM's path"
    if not log_once(f"route {group} {op} {mode} {decision.size_class}",
                    f"{group}: {op} ({mode}, {decision.size_class}) on {where}: {decision.reason}"):
        return False
    prefix = (os.environ if environ is None else environ).get(DECISIONS_ENV)
    if prefix:
        line = {"group": group, "op": op, "mode": mode, "size_class": decision.size_class, "route": decision.route,
                "reason": decision.reason}
        with open(f"{prefix}{os.getpid()}.jsonl", "a") as f:
            f.write(json.dumps(line) + "\n")
    return True


def capture_mode() -> str:
    """``graph`` while a CUDA graph is being captured on this thread's stream (vLLM's graph capture and replay),
    else ``eager``: the measurements differ by mode."""
    import torch

    return "graph" if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing() else "eager"


def _communicator_class():
    require_vllm()
    import torch
    import torch.distributed as dist
    from vllm.distributed.device_communicators.cuda_communicator import CudaCommunicator

    from .vllm_routes import Routes, policy

    class DmaCudaCommunicator(CudaCommunicator):
        """vLLM's CudaCommunicator with the collectives dmacoll is measured faster at on a dmacoll Communicator."""

        def __init__(self, cpu_group, device=None, device_group=None, unique_name: str = "", *args, **kwargs):
            super().__init__(cpu_group, device, device_group, unique_name, *args, **kwargs)
            self.dma = None
            self.dma_limit = max_bytes()
            self.dma_policy = policy()  # ValueError on a bad value: vLLM stops with it, before any work
            self.dma_routes = Routes.shipped()
            self.dma_gpu = torch.cuda.get_device_name(self.device) if torch.cuda.is_available() else "cpu"
            why = group_reason(unique_name, self.world_size) or ("" if device_group is not None
                                                                 else "no device process group")
            if not why:
                try:
                    from ..communicator import Communicator
                    from ..options import Options

                    # private (vLLM-owned) tensors are staged: an all-reduce needs about twice its size
                    variant = os.environ.get("DMACOLL_VLLM_VARIANT", "auto")
                    self.dma = Communicator(device_group, device=self.device, heap_bytes=1 << 20,
                                            staging_bytes=3 * self.dma_limit,
                                            options=Options(variant=variant, sync="reset"))
                except Exception as e:  # noqa: BLE001 - logged, then vLLM's path
                    why = f"dmacoll could not start: {type(e).__name__}: {e}"
            # every rank must route alike, or one waits in NCCL while its peer waits in dmacoll
            whys: list = [None] * self.world_size
            dist.all_gather_object(whys, why, group=cpu_group)
            why = next((w for w in whys if w), "")
            if why and self.dma is not None:
                self.dma.close()
                self.dma = None
            if self.dma is not None:  # every rank has one: where no table fits, calibrate now, not in a capture
                self.dma.calibrate(force=False)
                # compile the kernels at start, not in the first served request: in `vllm bench throughput` (no
                # warm-up requests) the plugin's first calls fell inside the timed 4 s (2.5-4% fewer tokens/s at TP2)
                try:
                    self.dma.warm_up()
                except Exception as e:  # noqa: BLE001 - a path that cannot compile says so at its first call
                    log_once(f"warm_up {type(e).__name__}", f"{unique_name}: dmacoll's kernels not compiled at start "
                                                            f"({type(e).__name__}: {e})")
            if why:
                log_once(f"group {why}", f"{unique_name}: vLLM's own collectives ({why})")
            else:
                log_once(f"group {unique_name}", f"{unique_name}: dmacoll takes the calls the measurements favour "
                                                 f"(world {self.world_size}, {self.dma_gpu}, "
                                                 f"DMACOLL_VLLM_ROUTE={self.dma_policy})")
                text = describe_all2all(getattr(self, "all2all_manager", None))
                if text:
                    log_once(text, text)

        def _reason(self, op: str, t: torch.Tensor, nbytes: Optional[int] = None,
                    sizes: Optional[Sequence[int]] = None, dim_ok: bool = True) -> str:
            """Why this call stays on vLLM's path ('' when dmacoll takes it): what dmacoll cannot run, then what
            the measurements do not favour. The same on every rank (same sizes, same table); remembered per kind of
            call, so a call pays one dictionary lookup after the first of its kind."""
            if self.dma is None:
                return "dmacoll is off for this group"
            key = (op, t.dtype, tuple(t.shape), t.device.type, t.is_contiguous(), nbytes,
                   None if sizes is None else tuple(sizes), dim_ok, capture_mode())
            cache = self.__dict__.setdefault("_dma_why", {})
            why = cache.get(key)
            if why is None:
                why = cache[key] = self._decide(op, t, key[-1], nbytes, sizes, dim_ok)
            return why

        def _decide(self, op: str, t: torch.Tensor, mode: str, nbytes: Optional[int], sizes, dim_ok: bool) -> str:
            size = t.numel() * t.element_size()
            why = fallback_reason(Call(op, size if nbytes is None else nbytes, str(t.dtype).removeprefix("torch."),
                                       t.device.type, t.is_contiguous(), None if sizes is None else tuple(sizes),
                                       dim_ok), self.dma_limit)
            if why:
                log_once(why, f"{why}: vLLM's path")
                return why
            decision = self.dma_routes.decide(SERVED_BY[op], size, mode, self.world_size, self.dma_gpu,
                                              self.dma_policy)
            record_decision(self.unique_name, op, mode, decision)
            return "" if decision.route else decision.reason

        def all_reduce(self, input_, *args, **kwargs):
            if args or kwargs or self._reason("all_reduce", input_):
                return super().all_reduce(input_, *args, **kwargs)
            out = torch.empty_like(input_)  # vLLM's all-reduce is out of place: the input stays intact
            return self.dma.all_reduce(out, input_)

        def all_gather(self, input_, dim: int = -1):
            if dim < 0:
                dim += input_.dim()
            if self._reason("all_gather", input_, input_.numel() * input_.element_size() * self.world_size):
                return super().all_gather(input_, dim)
            return self._gather(input_, dim)

        def _gather(self, input_, dim: int):
            shape = input_.shape
            out = torch.empty((self.world_size,) + tuple(shape), dtype=input_.dtype, device=input_.device)
            self.dma.all_gather(out, input_)
            return out.movedim(0, dim).reshape(shape[:dim] + (self.world_size * shape[dim],) + shape[dim + 1:])

        def reduce_scatter(self, input_, dim: int = -1):
            if dim < 0:
                dim += input_.dim()
            x = input_.movedim(dim, 0)
            if self._reason("reduce_scatter", input_, dim_ok=x.shape[0] % self.world_size == 0):
                return super().reduce_scatter(input_, dim)
            return self._scatter(input_, dim)

        def _scatter(self, input_, dim: int):
            x = input_.movedim(dim, 0).contiguous()
            out = torch.empty((x.shape[0] // self.world_size,) + tuple(x.shape[1:]), dtype=x.dtype, device=x.device)
            self.dma.reduce_scatter(out, x)
            return out.movedim(0, dim).contiguous()

        def all_gatherv(self, input_, dim: int = 0, sizes=None):
            tensors = [input_] if isinstance(input_, torch.Tensor) else list(input_)
            # one decision for the whole call: every tensor must go to dmacoll, or all go to vLLM's path
            if dim != 0 or any([self._reason("all_gatherv", t, t.numel() * t.element_size() * self.world_size,
                                             sizes) for t in tensors]):
                return super().all_gatherv(input_, dim, sizes)
            out = [self._gather(t, 0) for t in tensors]
            return out[0] if isinstance(input_, torch.Tensor) else out

        def reduce_scatterv(self, input_, dim: int = -1, sizes=None):
            if dim < 0:
                dim += input_.dim()
            if self._reason("reduce_scatterv", input_, sizes=sizes,
                            dim_ok=input_.shape[dim] % self.world_size == 0):
                return super().reduce_scatterv(input_, dim, sizes)
            return self._scatter(input_, dim)

        def reduce_scatterv_into_output(self, input_, output, dim: int = -1, sizes=None):
            # vLLM 0.33's EP combine (AgRsAll2AllManager.combine_into_output); CudaCommunicator's own version
            # goes to PyNccl directly, not through reduce_scatterv, so it needs its own override
            if dim < 0:
                dim += input_.dim()
            if self._reason("reduce_scatterv", input_, sizes=sizes,
                            dim_ok=input_.shape[dim] % self.world_size == 0):
                return super().reduce_scatterv_into_output(input_, output, dim, sizes)
            rows = input_.shape[dim] // self.world_size
            if (dim == 0 and output.is_contiguous() and output.dtype == input_.dtype
                    and tuple(output.shape) == (rows,) + tuple(input_.shape[1:])):
                self.dma.reduce_scatter(output, input_)  # straight into vLLM's output
                return output
            return output.copy_(self._scatter(input_, dim))

        def destroy(self):
            if self.dma is not None:
                self.dma.close()
                self.dma = None
            super().destroy()

    for name in OPTIONAL_OVERRIDES:  # a method this vLLM never calls stays out of the class
        if not hasattr(CudaCommunicator, name):
            delattr(DmaCudaCommunicator, name)
    DmaCudaCommunicator.__module__ = __name__
    DmaCudaCommunicator.__qualname__ = "DmaCudaCommunicator"
    return DmaCudaCommunicator


def __getattr__(name: str):
    # built on first use, because it subclasses a vLLM class: importing this module needs no vLLM
    if name == "DmaCudaCommunicator":
        cls = _communicator_class()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
