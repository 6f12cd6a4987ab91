"""The HIP runtime as the hip backend sees it: one loader, one checked call path.

hip-python's layouts (checked against ROCm/hip-python):

* hip-python 6.x / 7.x: ``from hip import hip`` (Cython bindings; every function returns a
  tuple whose first element is the ``hipError_t`` IntEnum);
* the ``rocm.bindings`` split (``rocm-bindings-hip``, behind the hip-python >= 10 metapackage):
  ``from rocm.bindings import hip``; ``hip`` re-exports it, so both spellings import.

Nothing here imports at module import time: a machine without ROCm imports dmacoll fine and
learns why the backend is unavailable only when it asks for it (``load()``).
"""
from __future__ import annotations

import ctypes
import importlib
from typing import Any, Callable, Optional

from ..errors import BackendUnavailable, DmaCollError

INSTALL_HINT = "install hip-python matching your ROCm, see envs/rocm.yaml"
LAYOUTS = ("hip", "rocm.bindings")  # tried in this order
IPC_HANDLE_BYTES = 64  # sizeof(hipIpcMemHandle_t)

# Values from the HIP headers, used when a binding does not export the name.
DEFAULTS = {
    "hipStreamWaitValueGte": 0,
    "hipStreamWaitValueEq": 1,
    "hipDeviceMallocFinegrained": 0x1,
    "hipMallocSignalMemory": 0x2,  # an 8-byte HSA signal; any other size is hipErrorInvalidValue
    "hipIpcMemLazyEnablePeerAccess": 0x1,
    "hipMemcpyDeviceToHost": 2,
    "hipMemcpyHostToDevice": 1,
    "hipMemcpyDeviceToDevice": 3,
    "hipMemcpyDeviceToDeviceNoCU": 1024,  # routes the copy to an SDMA engine, never a blit kernel
    "hipStreamCaptureModeRelaxed": 2,
}

_loaded: Optional[tuple[Any, str]] = None
_load_error: Optional[str] = None


class HipError(DmaCollError):
    """A HIP call returned an error: ``function`` and ``code`` say which and what."""

    def __init__(self, function: str, code: int, name: str):
        self.function, self.code, self.name = function, code, name
        detail = name if name == f"hipError {code}" else f"{name} (hipError {code})"
        super().__init__(f"{function} failed: {detail}")


def _import_layout(layout: str):
    if layout == "hip":  # what `from hip import hip` does: the package's attribute, else its submodule
        pkg = importlib.import_module("hip")
        mod = getattr(pkg, "hip", None)
        return mod if mod is not None else importlib.import_module("hip.hip")
    return importlib.import_module("rocm.bindings.hip")


def probe() -> Optional[str]:
    """None if hip-python imports, else why not (every layout's reason); cached."""
    global _loaded, _load_error
    if _loaded is None and _load_error is None:
        reasons = []
        for layout in LAYOUTS:
            try:
                _loaded = (_import_layout(layout), layout)
                break
            except (ImportError, AttributeError, OSError, RuntimeError) as e:  # OSError: libamdhip64 missing
                spelling = "from hip import hip" if layout == "hip" else "from rocm.bindings import hip"
                reasons.append(f"{spelling}: {e}")
        else:
            _load_error = "hip-python is not importable (" + "; ".join(reasons) + ")"
    return _load_error


def unavailable(reason: str) -> BackendUnavailable:
    return BackendUnavailable(f"hip backend unavailable: {reason}; {INSTALL_HINT}")


def load() -> tuple[Any, str]:
    """hip-python's ``hip`` module and the layout it came from (``hip`` or ``rocm.bindings``)."""
    reason = probe()
    if reason:
        raise unavailable(reason)
    return _loaded


def reset_loader() -> None:
    """Forget the cached import result (tests; a process that installs hip-python late)."""
    global _loaded, _load_error
    _loaded, _load_error = None, None


def address(ptr: Any) -> int:
    """An int address from what a binding returns for a pointer (int, hip-python's Pointer or
    DeviceArray, ctypes.c_void_p)."""
    if isinstance(ptr, int):
        return ptr
    value = getattr(ptr, "value", None)  # ctypes.c_void_p
    if isinstance(value, int) or (value is None and isinstance(ptr, ctypes.c_void_p)):
        return int(value or 0)
    return int(ptr)  # hip-python's pointer types convert to their address


def error_name(module: Any, code: int) -> str:
    """``hipErrorInvalidValue`` for 1, from the binding's enum if it has one."""
    name = getattr(code, "name", None)
    if isinstance(name, str):
        return name
    enum = getattr(module, "hipError_t", None)
    try:
        return enum(int(code)).name
    except Exception:  # noqa: BLE001 - any binding without the enum, or an unknown code
        return f"hipError {int(code)}"


class HipApi:
    """Every HIP call of the hip backend goes through here: ``api.hipMemcpyAsync(...)`` calls the
    binding, raises HipError on a non-zero status and returns the outputs (None, one value, or a
    tuple). Tests hand in a recording module instead of hip-python's."""

    # what ``ipc.share`` needs to know of a driver
    backend, get_name, open_name, error = "hip", "hipIpcGetMemHandle", "hipIpcOpenMemHandle", HipError

    def __init__(self, module: Any):
        self.module = module
        self._checked: dict[str, Callable] = {}

    def __getattr__(self, name: str) -> Callable:
        if not name.startswith("hip"):
            raise AttributeError(name)
        fn = self._checked.get(name)
        if fn is None:
            raw = getattr(self.module, name)  # AttributeError: this binding lacks the function
            fn = self._checked[name] = self._wrap(name, raw)
        return fn

    def _wrap(self, name: str, raw: Callable) -> Callable:
        module = self.module

        def call(*args: Any) -> Any:
            result = raw(*args)
            status, outs = (result[0], result[1:]) if isinstance(result, tuple) else (result, ())
            if int(status) != 0:
                raise HipError(name, int(status), error_name(module, status))
            return None if not outs else outs[0] if len(outs) == 1 else outs
        return call

    def has(self, name: str) -> bool:
        return hasattr(self.module, name)

    def const(self, name: str) -> Any:
        """A constant or enum member by its HIP name: the binding's own object where it has one
        (hip-python type-checks enum arguments such as a hipMemcpyKind, so an int would not do),
        else the header value from DEFAULTS."""
        value = getattr(self.module, name, None)
        if value is None:
            for enum in ("hipMemcpyKind", "hipStreamCaptureMode"):
                value = getattr(getattr(self.module, enum, None), name, None)
                if value is not None:
                    break
        return DEFAULTS[name] if value is None else value

    # -- calls whose Python shape differs between binding generations ------------------
    # hip-python returns C out-arguments as extra tuple elements (cuda-python style); some
    # generations take a pointer-like argument to fill instead. Each helper tries the first
    # shape and falls back to the second on a TypeError (wrong arity), so either works.
    def malloc_flags(self, nbytes: int, flags: int) -> int:
        return address(self.hipExtMallocWithFlags(nbytes, flags))

    def address_range(self, ptr: int) -> tuple[int, int]:
        """(base, size) of the allocation holding ``ptr``."""
        try:
            base, size = self.hipMemGetAddressRange(ptr)
            return address(base), int(size)
        except TypeError:
            base, size = ctypes.c_void_p(), ctypes.c_size_t()
            self.hipMemGetAddressRange(ctypes.addressof(base), ctypes.addressof(size), ptr)
            return int(base.value or 0), int(size.value)

    def ipc_get_handle(self, ptr: int) -> bytes:
        buf = bytearray(IPC_HANDLE_BYTES)
        try:
            out = self.hipIpcGetMemHandle(buf, ptr)  # the record is built over our buffer and filled
        except TypeError:
            out = self.hipIpcGetMemHandle(ptr)  # the handle comes back as an out-argument
        return bytes(buf) if out is None else self.handle_bytes(out)

    def ipc_open(self, data: bytes) -> int:
        flags = self.const("hipIpcMemLazyEnablePeerAccess")
        try:
            return address(self.hipIpcOpenMemHandle(self.handle_arg(data), flags))
        except TypeError:
            out = ctypes.c_void_p()
            self.hipIpcOpenMemHandle(ctypes.addressof(out), self.handle_arg(data), flags)
            return int(out.value or 0)

    # -- IPC handles travel between processes as 64 plain bytes ----------------------
    @staticmethod
    def handle_bytes(handle: Any) -> bytes:
        """The 64 bytes of a hipIpcMemHandle_t returned by the binding. hip-python's record type
        has no setter for its ``reserved`` char array and converting it stops at the first NUL,
        so the bytes are read from the record's address instead."""
        if isinstance(handle, (bytes, bytearray, memoryview)):
            data = bytes(handle)
        else:
            data = ctypes.string_at(int(handle), IPC_HANDLE_BYTES)
        if len(data) != IPC_HANDLE_BYTES:
            raise DmaCollError(f"an IPC handle has {len(data)} bytes, expected {IPC_HANDLE_BYTES}")
        return data

    @staticmethod
    def handle_arg(data: bytes) -> bytearray:
        """What hipIpcOpenMemHandle takes for a handle: bindings build the record from any object
        with the buffer protocol, and a bytearray is one."""
        return bytearray(data)
