"""Native submission for the cuda backend (``submit='native'``): a collective's driver commands
are worked out once per (program, buffers, stream) and then issued by one call into a small C
library (``csrc/dmacoll_submit.c``), instead of one Python-level driver call per copy, flag and
event. Eager calls then cost about one foreign call plus the watchdog's event.

The library takes the driver's entry points as a table (found with ``cuGetProcAddress``), so it
builds with any C compiler and needs no CUDA headers; ``dmacoll build`` (the workflow's build
rule) compiles it, checks it against a recording table of test doubles and records the
toolchain. Reductions (torch kernels) stay in Python, between the native segments.
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import os
import platform
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

from .. import cache_dir
from ..errors import BackendUnavailable, DmaCollError, InvalidArgument
from ..executor import MemOp, Program, run
from ..plan import Copy, Reduce, Ref

SOURCE = Path(__file__).resolve().parents[1] / "csrc" / "dmacoll_submit.c"
LIBRARY_NAME = "libdmacoll_submit.so"
ABI = 1
CFLAGS = ["-O2", "-std=c11", "-shared", "-fPIC", "-Wall", "-Werror"]
COPY, WRITE, WAIT, RECORD, WAIT_EVENT = range(5)
KIND_NAMES = ("cuMemcpyAsync", "cuStreamWriteValue32", "cuStreamWaitValue32", "cuEventRecord", "cuStreamWaitEvent")
EPOCH_MARK = 0xFFFF_FFFF  # the epoch run() fills in while recording: marks sequence-number values
log = logging.getLogger("dmacoll")


class Cmd(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int32), ("use_epoch", ctypes.c_int32), ("stream", ctypes.c_void_p),
                ("event", ctypes.c_void_p), ("dst", ctypes.c_uint64), ("src", ctypes.c_uint64),
                ("nbytes", ctypes.c_uint64), ("value", ctypes.c_uint32), ("flags", ctypes.c_uint32)]


class Api(ctypes.Structure):
    """The driver entry points, in the C struct's order (function pointers as addresses)."""
    _fields_ = [(name, ctypes.c_void_p) for name in ("copy", "write_value", "wait_value", "record", "wait_event")]


# ctypes types of the entry points, for test doubles (CUresult is an int)
COPY_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p)
VALUE_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint)
RECORD_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
WAIT_EVENT_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint)


# -- the library ---------------------------------------------------------------------------------
def library_path() -> Path:
    """$DMACOLL_NATIVE_LIB, else build/native/ of the checkout this package runs from."""
    env = os.environ.get("DMACOLL_NATIVE_LIB")
    return Path(env) if env else SOURCE.parents[3] / "build" / "native" / LIBRARY_NAME


def cache_path() -> Path:
    """Where a library built on first use goes: dmacoll's cache directory (``cache_dir``)/native/<source hash>/."""
    return cache_dir.directory() / "native" / hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16] / LIBRARY_NAME


def ensure_built() -> Path:
    """The library to load: $DMACOLL_NATIVE_LIB or the checkout's build/native/ where one was built, else one
    built now (once per source version) into ``cache_path()``, said in one log line. No C compiler:
    BackendUnavailable, saying that eager calls then issue their driver calls from Python."""
    chosen = library_path()
    if chosen.is_file() or "DMACOLL_NATIVE_LIB" in os.environ:
        return chosen
    cached = cache_path()
    if not cached.is_file():
        try:
            record = build(cached.parent)
        except BackendUnavailable as e:
            raise BackendUnavailable(f"{e}; without the native library eager calls issue their driver calls "
                                     "from Python (submit='python')") from None
        log.info("dmacoll: built the native submission library %s with %s", record["library"],
                 record["compiler_version"])
    return cached


def load(path: Optional[Path] = None) -> ctypes.CDLL:
    path = Path(path or library_path())
    if not path.is_file():
        raise BackendUnavailable(f"submit='native' needs {path}: build it with `dmacoll build` (the workflow's "
                                 "build rule), or point DMACOLL_NATIVE_LIB at a built copy")
    lib = ctypes.CDLL(str(path))
    if lib.dmacoll_submit_abi() != ABI or lib.dmacoll_cmd_size() != ctypes.sizeof(Cmd):
        raise BackendUnavailable(f"{path} was built from another version of dmacoll_submit.c: rebuild it "
                                 "with `dmacoll build`")
    lib.dmacoll_submit.argtypes = [ctypes.POINTER(Api), ctypes.POINTER(Cmd), ctypes.c_int, ctypes.c_uint32,
                                   ctypes.POINTER(ctypes.c_int)]
    lib.dmacoll_submit.restype = ctypes.c_int
    return lib


def build(out_dir: str | Path, cc: Optional[str] = None) -> dict:
    """Compile the library into ``out_dir``, check it with :func:`self_test`, and write
    ``toolchain.json`` (compiler, version, flags, source hash) beside it."""
    names = [cc] if cc else [os.environ["CC"]] if os.environ.get("CC") else ["cc", "gcc", "clang"]
    cc = next((shutil.which(n) for n in names if shutil.which(n)), None)
    if not cc:
        raise BackendUnavailable(f"no C compiler found ({' / '.join(names)}; set CC or install gcc/clang) to build "
                                 "the native library")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lib_path = out / LIBRARY_NAME
    # a temporary name of this process's own: the ranks of a machine build on first use at the same time, and
    # each must load a whole library (os.replace is atomic), never one another rank's compiler is still writing
    tmp = lib_path.with_suffix(f".so.{os.getpid()}.tmp")
    done = subprocess.run([cc, *CFLAGS, str(SOURCE), "-o", str(tmp)], capture_output=True, text=True)
    if done.returncode != 0:
        raise DmaCollError(f"{cc} could not build {SOURCE.name}:\n{done.stdout}{done.stderr}")
    os.replace(tmp, lib_path)
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout.splitlines()
    issued = self_test(load(lib_path))
    record = {"library": str(lib_path), "abi": ABI, "compiler": shutil.which(cc) or cc,
              "compiler_version": version[0] if version else "unknown", "flags": CFLAGS,
              "source": str(SOURCE), "source_sha256": hashlib.sha256(SOURCE.read_bytes()).hexdigest(),
              "machine": platform.machine(), "system": platform.platform(), "self_test_commands": issued}
    (out / "toolchain.json").write_text(json.dumps(record, indent=1) + "\n")
    return record


# -- test doubles: a driver table that records what it is asked to do ----------------------------
class RecordingApi:
    """Driver entry points that log their calls (and can fail at a chosen call)."""

    def __init__(self, fail_at: int = -1, code: int = 1):
        self.calls: list[tuple] = []
        self._fail_at, self._code = fail_at, code

        def log(*call) -> int:
            self.calls.append(call)
            return self._code if len(self.calls) - 1 == self._fail_at else 0

        # keep the callbacks alive as long as this object: C holds only their addresses
        self._callbacks = (COPY_FN(lambda d, s, n, st: log("copy", d, s, n, st or 0)),
                           VALUE_FN(lambda st, a, v, f: log("write", a, v, f, st or 0)),
                           VALUE_FN(lambda st, a, v, f: log("wait", a, v, f, st or 0)),
                           RECORD_FN(lambda ev, st: log("record", ev or 0, st or 0)),
                           WAIT_EVENT_FN(lambda st, ev, f: log("wait_event", ev or 0, st or 0)))
        self.table = Api(*(ctypes.cast(cb, ctypes.c_void_p).value for cb in self._callbacks))


def self_test(lib: ctypes.CDLL) -> int:
    """Issue one command of each kind through recording doubles; raise unless each arrives
    intact, in order, with the epoch filled in where asked and the failing index reported."""
    cmds = (Cmd * 5)(Cmd(COPY, 0, 7, None, 0x1000, 0x2000, 4096, 0, 0), Cmd(WRITE, 1, 7, None, 0x3000, 0, 0, 1, 0),
                     Cmd(WAIT, 0, 8, None, 0x3004, 0, 0, 5, 1), Cmd(RECORD, 0, 8, 0x99, 0, 0, 0, 0, 0),
                     Cmd(WAIT_EVENT, 0, 7, 0x99, 0, 0, 0, 0, 0))
    api, failed = RecordingApi(), ctypes.c_int(-1)
    rc = lib.dmacoll_submit(ctypes.byref(api.table), cmds, 5, 42, ctypes.byref(failed))
    expected = [("copy", 0x1000, 0x2000, 4096, 7), ("write", 0x3000, 42, 0, 7), ("wait", 0x3004, 5, 1, 8),
                ("record", 0x99, 8), ("wait_event", 0x99, 7)]
    if rc != 0 or api.calls != expected:
        raise DmaCollError(f"native library self-test failed: rc={rc}, calls {api.calls} != {expected}")
    api = RecordingApi(fail_at=2, code=700)
    rc = lib.dmacoll_submit(ctypes.byref(api.table), cmds, 5, 42, ctypes.byref(failed))
    if (rc, failed.value, len(api.calls)) != (700, 2, 3):
        raise DmaCollError(f"native library self-test: a failing call gave rc={rc}, index {failed.value}, "
                           f"{len(api.calls)} calls issued (want 700, 2, 3)")
    return len(expected)


def driver_api() -> Api:
    """The real entry points, from the driver's cuGetProcAddress (ABI of CUDA 12.0 and later)."""
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
        get = libcuda.cuGetProcAddress_v2
    except (OSError, AttributeError) as e:
        raise BackendUnavailable(f"submit='native': cannot load the CUDA driver's cuGetProcAddress_v2 ({e})")
    get.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_uint64,
                    ctypes.POINTER(ctypes.c_int)]
    pointers = []
    for symbol in ("cuMemcpyAsync", "cuStreamWriteValue32", "cuStreamWaitValue32", "cuEventRecord",
                   "cuStreamWaitEvent"):
        pfn, status = ctypes.c_void_p(), ctypes.c_int()
        rc = get(symbol.encode(), ctypes.byref(pfn), 12000, 0, ctypes.byref(status))
        if rc != 0 or not pfn.value:
            raise BackendUnavailable(f"submit='native': the driver has no {symbol} (CUresult {rc}, status "
                                     f"{status.value})")
        pointers.append(pfn.value)
    return Api(*pointers)


# -- recording a program into command lists ------------------------------------------------------
class _Recorder:
    """Stands in for the engine while executor.run walks a program, writing down the driver
    commands the cuda engine would issue; reductions become Python segments between them."""

    def __init__(self, engine, new_event: Callable[[], object]):
        self.engine, self.new_event = engine, new_event
        self.main_queue = engine.main_queue
        self.segments: list = [[]]  # lists of Cmd, and (queue, Reduce) pairs between them
        self.events: list = []  # kept alive with the compiled program

    def _cmd(self, kind: int, stream, **fields) -> None:
        self.segments[-1].append(Cmd(kind=kind, stream=stream.cuda_stream or None, **fields))

    def copy(self, queue, src: Ref, dst: Ref, nbytes: int, bases: Mapping[str, object]) -> None:
        self._cmd(COPY, queue, dst=self.engine._addr(dst, bases), src=self.engine._addr(src, bases), nbytes=nbytes)

    def copies(self, queue, run: Sequence[Copy], bases: Mapping[str, object]) -> None:
        for c in run:
            self.copy(queue, c.src, c.dst, c.nbytes, bases)

    def reduce(self, queue, step: Reduce, bases: Mapping[str, object]) -> None:
        self.segments += [(queue, step), []]

    def memops(self, queue, ops: Sequence[MemOp]) -> None:
        eng = self.engine
        for op in ops:
            addr = eng.ptrs[op.rank] + 4 * op.index
            epoch = int(op.value == EPOCH_MARK)
            if op.via in ("kernel", "spin"):
                raise InvalidArgument("submit='native' issues driver calls only: use signal='memop' or 'copy' "
                                      "and wait='memop' (signal='kernel' and wait='spin' launch kernels)")
            if op.via == "copy":  # a 4-byte copy of the ONE word, queued behind the data
                self._cmd(COPY, queue, dst=addr, src=eng.ptrs[eng.rank] + 4 * eng._one, nbytes=4)
            elif op.wait:
                self._cmd(WAIT, queue, dst=addr, value=op.value, use_epoch=epoch,
                          flags=eng._geq if op.geq else eng._eq)
            else:  # flags 0: a memory barrier orders the data written before the flag
                self._cmd(WRITE, queue, dst=addr, value=op.value, use_epoch=epoch)

    def _event(self):
        event = self.new_event()
        self.events.append(event)
        return event.cuda_event

    def parallel(self, tasks: Sequence[Callable[[object], None]]) -> None:
        """The cuda engine's fork/join, as event records and waits."""
        sides = self.engine.side_streams_for(len(tasks) - 1)
        fork = self._event()
        self._cmd(RECORD, self.main_queue, event=fork)
        joins = []
        for task, stream in zip(tasks[1:], sides):
            self._cmd(WAIT_EVENT, stream, event=fork)
            task(stream)
            joins.append(self._event())
            self._cmd(RECORD, stream, event=joins[-1])
        tasks[0](self.main_queue)
        for join in joins:
            self._cmd(WAIT_EVENT, self.main_queue, event=join)


class NativeSubmitter:
    """Compiled command lists per (program, buffers, stream) for one cuda engine."""

    def __init__(self, engine, lib: Optional[ctypes.CDLL] = None, api: Optional[Api] = None,
                 new_event: Optional[Callable[[], object]] = None):
        self.engine = engine
        self.lib = lib or load(ensure_built())
        self.api = api or driver_api()
        self.new_event = new_event or _cuda_event
        self._compiled: dict[tuple, _Compiled] = {}

    def compile(self, program: Program, bases: Mapping[str, object]) -> "_Compiled":
        rec = _Recorder(self.engine, self.new_event)
        run(program, rec, bases, EPOCH_MARK)
        segments: list = []
        for seg in rec.segments:
            if isinstance(seg, tuple):
                segments.append(seg)  # (queue, Reduce): a torch kernel, issued from Python
            elif seg:
                segments.append((len(seg), (Cmd * len(seg))(*seg)))
        return _Compiled(program, segments, rec.events)

    def run(self, program: Program, bases: Mapping[str, object], epoch: int) -> None:
        key = (id(program), bases["input"], bases["output"], self.engine.main_queue.cuda_stream)
        compiled = self._compiled.get(key)
        if compiled is None or compiled.program is not program:  # ids can be reused after a program is freed
            if len(self._compiled) >= 4096:
                self._compiled.clear()
            compiled = self._compiled[key] = self.compile(program, bases)
        failed = ctypes.c_int(-1)
        for first, second in compiled.segments:
            if isinstance(second, Reduce):
                self.engine.reduce(first, second, bases)
                continue
            rc = self.lib.dmacoll_submit(ctypes.byref(self.api), second, first, epoch, ctypes.byref(failed))
            if rc != 0:
                raise DmaCollError(f"{KIND_NAMES[second[failed.value].kind]} failed with CUresult {rc} (native "
                                   f"submission, command {failed.value} of {first})")


@dataclass
class _Compiled:
    program: Program
    segments: list  # (count, Cmd array) to submit, or (queue, Reduce) to run in Python
    events: list  # fork/join events the commands name: alive as long as the commands


def _cuda_event():
    import torch

    event = torch.cuda.Event()
    event.record()  # the driver event is created lazily, on the first record
    return event
