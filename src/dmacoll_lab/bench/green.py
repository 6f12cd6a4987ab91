"""Fewer SMs for the compute: a stream confined to ``num_sms`` SMs (a CUDA green context, ``green_stream``), or
GEMMs sized to leave SMs free (``SmCarveout``).

PyTorch's ``torch.cuda.green_contexts.GreenContext`` (torch >= 2.9, with ``Stream()`` from 2.10) when it is
there, else the driver API through cuda-bindings (cuDevSmResourceSplitByCount -> cuDevResourceGenerateDesc ->
cuGreenCtxCreate -> cuGreenCtxStreamCreate). Either way the stream is an ordinary torch stream: launch on it with
``torch.cuda.stream(s)`` and order it against other streams with events. Raises BackendUnavailable with the
reason when neither works, so a caller can record the reason instead of crashing.

On compute capability 9.0 the driver hands out SMs in groups of 8, so a request is rounded down to a multiple of
8 (``sm_count`` says what was granted).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dmacoll.lab_api import BackendUnavailable

SM_GRANULE = 8  # Hopper: minimum and multiple of an SM split


def round_sms(requested: int, total: int) -> int:
    """The SM count a split can give: a multiple of SM_GRANULE, at least one granule, below the total."""
    k = min(requested, total - 1) // SM_GRANULE * SM_GRANULE
    if k < SM_GRANULE:
        raise BackendUnavailable(f"cannot split {requested} of {total} SMs in groups of {SM_GRANULE}")
    return k


def sms_for_fraction(fraction: float, total: int) -> int:
    return round_sms(int(fraction * total), total)


def all_but_few(total: int) -> int:
    """The largest split that still leaves SMs free: every SM but less than one granule."""
    return round_sms(total - 1, total)


@dataclass
class GreenStream:
    stream: Any          # torch.cuda.Stream / ExternalStream
    sm_count: int        # SMs the green context was given
    total_sms: int
    how: str             # "torch" or "driver"
    _keep: Any = None    # the context object: must outlive the stream

    @property
    def split(self) -> str:
        return f"{self.sm_count}/{self.total_sms}"


def _torch_stream(num_sms: int, device: int):
    from torch.cuda import green_contexts as gc

    if not getattr(gc, "SUPPORTED", True):
        raise BackendUnavailable("torch was built without green-context support")
    cls = gc.GreenContext
    ctx = cls.create(num_sms=num_sms, device_id=device) if hasattr(cls, "create") else cls(num_sms=num_sms,
                                                                                             device_id=device)
    if not hasattr(ctx, "Stream"):  # torch 2.9: only set_context/pop_context, which swap the current stream
        raise BackendUnavailable("this torch's GreenContext has no Stream()")
    return ctx, ctx.Stream()


def _driver_stream(num_sms: int, device: int):
    import torch

    try:
        from cuda.bindings import driver as drv
    except ImportError:
        raise BackendUnavailable("green contexts need cuda-bindings >= 12.4 (pip install cuda-bindings)") from None

    def ok(result):
        err, *rest = result
        if err != drv.CUresult.CUDA_SUCCESS:
            raise BackendUnavailable(f"green context: {drv.cuGetErrorString(err)[1]!r} ({err})")
        return rest[0] if len(rest) == 1 else rest

    if not hasattr(drv, "cuGreenCtxCreate"):
        raise BackendUnavailable("cuda-bindings has no green-context API (needs >= 12.4)")
    torch.cuda.init()  # the primary context must exist
    dev = ok(drv.cuDeviceGet(device))
    sms = ok(drv.cuDeviceGetDevResource(dev, drv.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM))
    groups, n, _rest = ok(drv.cuDevSmResourceSplitByCount(1, sms, 0, num_sms))
    if n != 1:
        raise BackendUnavailable(f"split of {num_sms} SMs gave {n} groups")
    desc = ok(drv.cuDevResourceGenerateDesc([groups[0]], 1))
    ctx = ok(drv.cuGreenCtxCreate(desc, dev, drv.CUgreenCtxCreate_flags.CU_GREEN_CTX_DEFAULT_STREAM))
    raw = ok(drv.cuGreenCtxStreamCreate(ctx, drv.CUstream_flags.CU_STREAM_NON_BLOCKING, 0))
    return (ctx, raw), torch.cuda.ExternalStream(int(raw), device=torch.device("cuda", device))


def green_stream(num_sms: int, device: int) -> GreenStream:
    """A stream confined to ``num_sms`` SMs (rounded down to the split granule) of GPU ``device``."""
    import torch

    total = torch.cuda.get_device_properties(device).multi_processor_count
    k = round_sms(num_sms, total)
    errors = []
    for how, make in (("torch", _torch_stream), ("driver", _driver_stream)):
        try:
            keep, stream = make(k, device)
            return GreenStream(stream, k, total, how, keep)
        except Exception as e:  # noqa: BLE001 - try the next way, report all
            errors.append(f"{how}: {type(e).__name__}: {e}")
    raise BackendUnavailable("no green context: " + "; ".join(errors))


class SmCarveout:
    """Inside ``with SmCarveout(n):`` torch's matmuls go through cuBLASLt asked to leave ``n`` SMs free
    (``torch._C._set_sm_carveout_experimental``: cuBLASLt's SM-count target; plain cuBLAS ignores it, see
    ``results/h100x1/probes/``), so a kernel launched beside a persistent GEMM finds free SMs. Unlike a
    green context, the GEMM is sized for the SMs it keeps. The previous settings come back on exit."""

    def __init__(self, sms: int):
        import torch

        if not hasattr(torch._C, "_set_sm_carveout_experimental"):
            raise BackendUnavailable("this torch has no SM carveout (torch._C._set_sm_carveout_experimental)")
        if sms < 1:
            raise ValueError(f"an SM carveout needs at least 1 SM, got {sms}")
        self.sms = sms

    def wrap(self, fn):
        """``fn`` run inside this carveout."""
        def carved(*args, **kwargs):
            with self:
                return fn(*args, **kwargs)
        return carved

    def __enter__(self) -> "SmCarveout":
        import torch

        self._saved = (torch.backends.cuda.preferred_blas_library(), torch._C._get_sm_carveout_experimental())
        torch.backends.cuda.preferred_blas_library("cublaslt")
        torch._C._set_sm_carveout_experimental(self.sms)
        return self

    def __exit__(self, *exc) -> None:
        import torch

        library, sms = self._saved
        torch.backends.cuda.preferred_blas_library(library)
        torch._C._set_sm_carveout_experimental(sms)
