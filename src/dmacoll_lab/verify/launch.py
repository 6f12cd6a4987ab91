"""Run a function on N ranks, one process each, and collect what rank 0..N-1 return.

Used by the CLI (check, sweep) and the tests. Under ``torchrun`` (RANK and
WORLD_SIZE set) the function runs in the current process instead.
"""
from __future__ import annotations

import faulthandler
import multiprocessing as mp
import os
import pickle
import queue
import tempfile
import time
import traceback
from typing import Any, Callable

from dmacoll.lab_api import DmaCollError, DmaCollTimeoutError, InvalidArgument

# Never let anything started from here use NVLink multicast (shared hosts; see README).
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def seconds_from_env(name: str, default: str) -> float:
    """A positive number of seconds from ``$name`` (``default`` where unset); a clear error for anything else."""
    text = os.environ.get(name) or default
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise InvalidArgument(f"${name} must be a positive number of seconds, got {text!r}")
    return value


def set_safe_env() -> None:
    for k, v in SAFE_ENV.items():
        os.environ[k] = v


GPUS_VARIABLE = "DMACOLL_GPUS"  # spread the ranks over this many of the visible GPUs (e.g. 1: all on one)


def gpus_for(world: int) -> int:
    """How many GPUs ``world`` ranks spread over (rank r on GPU r % n): $DMACOLL_GPUS, at most the visible
    ones, else every visible one. Fewer GPUs than ranks: several ranks share a GPU (the cuda backend's IPC
    heap; correctness, not performance)."""
    import torch

    visible = torch.cuda.device_count()
    wanted = os.environ.get(GPUS_VARIABLE, "").strip()
    if wanted and not (wanted.isdigit() and int(wanted) >= 1):
        raise ValueError(f"{GPUS_VARIABLE}={wanted!r} must be a positive integer")
    return min(int(wanted), visible) if wanted else visible


def nccl_usable(world: int) -> bool:
    """Whether NCCL (a baseline or reference) can run ``world`` ranks here: one GPU each (NCCL refuses two ranks
    on one GPU)."""
    return 0 < world <= gpus_for(world)


def init_rank(rank: int, world: int, init_method: str, device: str) -> None:
    """Join the process group: gloo for host objects, NCCL too when every rank has a GPU of its own (ranks that
    share a GPU get gloo only: NCCL refuses them)."""
    set_safe_env()
    import torch
    import torch.distributed as dist

    kwargs = {}
    if device == "cuda":
        gpus = gpus_for(world)
        if gpus == 0:
            raise RuntimeError(f"rank {rank} was started for {device} but this machine shows no GPU")
        torch.cuda.set_device(rank % gpus)
        if "OMP_NUM_THREADS" not in os.environ:  # the ranks' CPU work (references, checks) shares the cores
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
        backend = "cpu:gloo,cuda:nccl" if world <= gpus else "gloo"
        if world <= gpus:
            kwargs["device_id"] = torch.device("cuda", torch.cuda.current_device())
    else:
        torch.set_num_threads(1)  # many ranks share few cores
        backend = "gloo"
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world, **kwargs)


def _child(fn: Callable, rank: int, world: int, init_method: str, device: str, args: tuple, results,
           timeout_s: float) -> None:
    # a rank still running shortly before the parent gives up prints where every thread is
    faulthandler.dump_traceback_later(max(1.0, timeout_s - 5), exit=False)
    try:
        init_rank(rank, world, init_method, device)
        out = fn(rank, world, *args)
        # by value: torch's queue pickler would pass tensors as file descriptors that the parent fetches
        # from this process, which may have exited by then
        results.put((rank, "ok", pickle.dumps(out)))
    except DmaCollError as e:  # the library's own error: handed back as itself (a clear message, no traceback)
        results.put((rank, "dmacoll", pickle.dumps(e)))
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        results.put((rank, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
    finally:
        try:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            pass


class RankFailed(RuntimeError):
    """A rank crashed, died or ran past its deadline: every rank's traceback is in the message."""


class RanksTimedOut(RankFailed, DmaCollTimeoutError):
    """The ranks did not all finish (or start) within the deadline: a library timeout, said in one line."""


def _finished(out: dict[int, tuple]) -> str:
    """What the ranks that did finish reported, for a timeout's message: an error there (e.g. a rank's own
    collective timeout, which names the call) is often why the others still wait."""
    said = {"ok": lambda v: "finished", "dmacoll": lambda v: f"raised {type(v).__name__}: {v}", "error": str}
    return "".join(f"\n--- rank {r}: {said[s](v)}" for r, (s, v) in sorted(out.items()))


def run_ranks(fn: Callable[..., Any], world: int, *args: Any, device: str = "cpu",
              timeout_s: float | None = None) -> list:
    """Start ``world`` processes running ``fn(rank, world, *args)``; return the results by rank.

    ``fn`` must be importable (a module-level function). A ``DmaCollError`` raised on a rank is raised here as
    itself (the lowest rank's, its message prefixed with the rank); any other failure, and a rank that dies or
    runs past ``timeout_s`` (default $DMACOLL_RANK_TIMEOUT_S, else 900; never past $DMACOLL_RANK_DEADLINE_S, a
    launcher's own limit), raises RankFailed with every rank's traceback; a rank that is still running then has
    printed its threads' stacks to stderr. The deadline counts
    from the first process's start (starting many ranks takes seconds each): past it, RanksTimedOut."""
    if timeout_s is None:
        timeout_s = seconds_from_env("DMACOLL_RANK_TIMEOUT_S", "900")
    # the caller will kill us then: say where the ranks are first
    timeout_s = min(timeout_s, seconds_from_env("DMACOLL_RANK_DEADLINE_S", "inf"))
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # under torchrun: this process is one rank
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        init_rank(rank, world, "env://", device)
        return [fn(rank, world, *args)]
    set_safe_env()
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    deadline = time.monotonic() + timeout_s
    with tempfile.TemporaryDirectory(prefix="dmacoll-rdv-") as tmp:
        init_method = f"file://{os.path.join(tmp, 'store')}"
        procs = []
        for r in range(world):
            left = deadline - time.monotonic()
            if left <= 0:
                for p in procs:
                    p.kill()
                raise RanksTimedOut(f"the {world} ranks did not start within the deadline of {timeout_s:g} s "
                                    f"(--deadline-s, $DMACOLL_RANK_TIMEOUT_S): {r} were started")
            procs.append(ctx.Process(target=_child, args=(fn, r, world, init_method, device, args, results, left),
                                     daemon=False))
            procs[-1].start()
        out: dict[int, tuple] = {}
        while len(out) < world:
            try:
                rank, status, value = results.get(timeout=1.0)
                out[rank] = (status, pickle.loads(value) if status in ("ok", "dmacoll") else value)
            except queue.Empty:
                dead = [i for i, p in enumerate(procs) if p.exitcode not in (None, 0) and i not in out]
                if dead or time.monotonic() > deadline:
                    for p in procs:
                        p.kill()
                    if dead:
                        raise RankFailed(f"ranks {dead} died; results so far: {out}")
                    late = sorted(set(range(world)) - set(out))
                    raise RanksTimedOut(f"ranks {late} of {world} did not finish within the deadline of "
                                        f"{timeout_s:g} s (--deadline-s, $DMACOLL_RANK_TIMEOUT_S); a rank that was "
                                        "running 5 s before it has printed its threads' stacks above"
                                        + _finished(out))
        for p in procs:
            p.join(timeout=30)
    library = sorted((r, v) for r, (s, v) in out.items() if s == "dmacoll")
    if library:  # e.g. InvalidArgument on every rank: raise rank 0's (the first) as the library raised it
        rank, error = library[0]
        raise type(error)(f"rank {rank}: {error}")
    errors = {r: v for r, (s, v) in out.items() if s == "error"}
    if errors:
        raise RankFailed("\n".join(f"--- rank {r} ---\n{v}" for r, v in sorted(errors.items())))
    return [out[r][1] for r in range(world)]
