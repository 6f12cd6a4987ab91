"""CUDA C compiled by NVRTC into a cubin, kept in the user's cache (``cache_dir.directory()/kernels``) so that a
process after the first loads its kernels instead of compiling them again: each rank of each process paid NVRTC
for both of dmacoll's modules at its first call or ``warm_up``. A cubin is keyed by all that makes it (source, name,
architecture, options, NVRTC's version). The cache is best effort: where it cannot be read or written, the kernels
are compiled as without it."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Sequence

from .. import cache_dir
from ..errors import BackendUnavailable

log = logging.getLogger("dmacoll")


def compile_program(code: str, name: str, arch: str, options: Sequence[str] = ()) -> bytes:
    """A cubin for ``arch`` (e.g. sm_90) from CUDA C ``code``: the cached one, else NVRTC's, cached for the next
    process; the compiler's log on failure."""
    nvrtc = _nvrtc()
    path = cached_path(code, name, arch, options, _version(nvrtc))
    try:
        cubin = path.read_bytes()
        if cubin:
            return cubin
    except OSError:
        pass
    cubin = _compile(nvrtc, code, name, arch, options)
    _store(path, cubin)
    return cubin


def cached_path(code: str, name: str, arch: str, options: Sequence[str], version: tuple) -> Path:
    key = hashlib.sha256(json.dumps([code, name, arch, list(options), list(version)]).encode()).hexdigest()[:24]
    return cache_dir.directory() / "kernels" / f"{Path(name).stem}-{arch}-{key}.cubin"


def _nvrtc():
    try:
        from cuda.bindings import nvrtc
    except ImportError as e:
        raise BackendUnavailable(f"NVRTC is needed to build dmacoll's kernels (pip install cuda-bindings): {e}")
    return nvrtc


def _ok(result, what: str):
    err = result[0] if isinstance(result, tuple) else result
    if int(err) != 0:
        raise BackendUnavailable(f"NVRTC {what} failed: {err}")
    return result[1] if isinstance(result, tuple) and len(result) == 2 else None


def _version(nvrtc) -> tuple:
    result = nvrtc.nvrtcVersion()
    _ok(result[0], "nvrtcVersion")
    return tuple(int(v) for v in result[1:])


def _compile(nvrtc, code: str, name: str, arch: str, options: Sequence[str]) -> bytes:
    prog = _ok(nvrtc.nvrtcCreateProgram(code.encode(), name.encode(), 0, [], []), "nvrtcCreateProgram")
    opts = [f"--gpu-architecture={arch}".encode(), *(o.encode() for o in options)]
    if int(nvrtc.nvrtcCompileProgram(prog, len(opts), opts)[0]) != 0:
        logs = b" " * _ok(nvrtc.nvrtcGetProgramLogSize(prog), "log size")
        nvrtc.nvrtcGetProgramLog(prog, logs)
        raise BackendUnavailable(f"NVRTC could not compile {name}: {logs.decode(errors='replace').strip()}")
    cubin = b" " * _ok(nvrtc.nvrtcGetCUBINSize(prog), "cubin size")
    _ok(nvrtc.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
    return cubin


def _store(path: Path, cubin: bytes) -> None:
    """Write ``cubin`` atomically (ranks compiling the same module at once each replace the file whole)."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(cubin)
        os.replace(tmp, path)
    except OSError as e:
        log.debug("dmacoll: compiled kernels not cached in %s: %s", path.parent, e)
        if tmp and os.path.exists(tmp):
            os.unlink(tmp)
