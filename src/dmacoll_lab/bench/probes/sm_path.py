"""The sm data path's one-shot kernels (``dmacoll.backends.cuda_sm``) against NCCL, a GPU per rank (issue 49).

Per world, op and size (bytes per rank: all_gather's input, all_to_all's and reduce_scatter's chunk, all_reduce's
tensor), bfloat16, through ``Communicator``: ``path='sm'``, ``path='dma'`` (the copy engines, the table's choice),
the default call (``path='auto'``: the ``path`` column says which ran), beside NCCL and, for all_reduce, PyTorch
symmetric memory's ``one_shot_all_reduce`` on a view of the communicator's heap, each graph-replayed (``--calls``
calls per graph, the slowest rank per replay) and eager (``--calls`` calls issued back to back). Per (op, size, mode)
every implementation is made ready first (captured, warmed up), then their samples are taken in turns
(``dmacoll.timing.interleave``), so a drift of the machine during the point weighs on each alike; runs before
2026-11-28 (tenth session) timed one implementation's samples after another's. After timing, each
implementation runs once more on fresh random data into a poisoned output, checked: gathers exactly against NCCL's
all_gather of the inputs; the sm path's sums exactly against the inputs added in float32 in rank order and rounded
once (its arithmetic), in place for all_reduce too; other sums (NCCL's adds in bfloat16 along its ring) within two
bfloat16 steps at the inputs' scale.

Usage: dmacoll probe sm_path [--worlds 2 4] [--sizes 1K 4K 16K 64K 256K] [--calls 10] [--repeats 30]
"""
from __future__ import annotations

import argparse

from .common import Table, add_repeats, count, driver, quantiles, size_multiple_of

NAME = "sm_path"
HELP = "one-shot SM collectives over the heap (the sm path) against NCCL and torch symmetric memory, a GPU per rank"
GPUS = 2
COLUMNS = ["world", "op", "impl", "path", "sm_blocks", "mode", "bytes", "per_call_us", "per_call_us_p10",
           "per_call_us_p90", "calls", "correct", "error"]
EXTRA: dict[str, list[str]] = {}
OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
# sm_one_shot / sm_two_shot: all_reduce as one kernel or as two (reduce_scatter, all_gather)
IMPLS = ("sm", "sm_one_shot", "sm_two_shot", "default", "dma", "nccl", "symm_mem_one_shot")
MODES = ("graph", "eager")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--worlds", type=count, nargs="+", default=[2, 4], help="ranks, a GPU each (default 2 4)")
    p.add_argument("--sizes", type=size_multiple_of(2), nargs="+", default=[1024, 4096, 16384, 65536, 262144],
                   help="bytes per rank, whole bfloat16 values (default 1K 4K 16K 64K 256K; sizes that are not whole "
                        "16-byte vectors time the kernels' narrower copies, e.g. 24588: three 8196-byte MoE rows)")
    p.add_argument("--ops", nargs="+", choices=OPS, default=list(OPS))
    p.add_argument("--calls", type=count, default=10, help="calls per graph, and per eager sample (default 10)")
    p.add_argument("--blocks", type=count, nargs="+", default=None,
                   help="the sm rows' most blocks per launch, each timed (default: the path's own; at most the SMs)")
    add_repeats(p, 30, "samples (the median of the slowest rank's per-call time is reported)")




def row(world: int, op: str, impl: str, mode: str, nbytes: int, samples: list[float], calls: int,
        correct: object = "", error: str = "", path: str = "", sm_blocks: object = "") -> dict:
    med, p10, p90 = quantiles(samples)
    return {"world": world, "op": op, "impl": impl, "path": path, "sm_blocks": sm_blocks, "mode": mode, "bytes": nbytes,
            "per_call_us": med,
            "per_call_us_p10": p10, "per_call_us_p90": p90, "calls": calls, "correct": correct, "error": error}


def shapes(op: str, world: int, nbytes: int) -> tuple[int, int]:
    """(input, output) bytes of ``op`` at ``nbytes`` per rank."""
    return {"all_reduce": (nbytes, nbytes), "all_gather": (nbytes, world * nbytes),
            "reduce_scatter": (world * nbytes, nbytes), "all_to_all": (world * nbytes, world * nbytes)}[op]


def expected(op: str, world: int, rank: int, inputs: list):
    """What rank ``rank`` must hold, from every rank's input (sums: float32 in rank order, rounded once)."""
    import torch

    if op == "all_gather":
        return torch.cat(inputs)
    if op == "all_to_all":
        return torch.cat([x.chunk(world)[rank] for x in inputs])
    parts = inputs if op == "all_reduce" else [x.chunk(world)[rank] for x in inputs]
    acc = parts[0].float()
    for x in parts[1:]:
        acc = acc + x.float()
    return acc.to(inputs[0].dtype)


def _rank(rank: int, world: int, cfg: dict) -> list[dict]:
    import torch
    import torch.distributed as dist
    import torch.distributed._symmetric_memory  # noqa: F401 - registers torch.ops.symm_mem

    from dmacoll import Communicator
    from dmacoll.lab_api import cuda_sm, interleave, prepare

    torch.manual_seed(cfg["seed"] + rank)
    top = max(cfg["sizes"])
    # the heap: the two buffers below; staging: the copy-engine sums' chunks (reduce_scatter's world * top)
    comm = Communicator(timeout_s=30, heap_bytes=max(64 << 20, 2 * world * top + (4 << 20)),
                        staging_bytes=max(16 << 20, world * top))
    sm = comm.engine.sm  # larger calls than its slots: no sm row ($DMACOLL_SM_SLOT_BYTES)
    defaults = (sm.blocks, sm.two_shot_bytes)
    dtype = torch.bfloat16
    big = world * top // 2  # elements of the largest buffer
    inp_all, out_all = comm.empty(big, dtype=dtype), comm.empty(big, dtype=dtype)
    stream = torch.cuda.Stream()
    out = []

    def callers(op: str, x, y):
        """(impl, call, the sm path's (blocks, two-shot bytes) while it runs, or None: its defaults)."""
        nccl = {"all_reduce": lambda: (y.copy_(x), dist.all_reduce(y)),
                "all_gather": lambda: dist.all_gather_into_tensor(y, x),
                "reduce_scatter": lambda: dist.reduce_scatter_tensor(y, x),
                "all_to_all": lambda: dist.all_to_all_single(y, x)}[op]
        shots = {"sm_one_shot": None, "sm_two_shot": 0} if op == "all_reduce" else {"sm": defaults[1]}
        in_bytes, out_bytes = x.numel() * 2, y.numel() * 2
        for impl, two_shot in shots.items():
            if cuda_sm.sm_bytes(op, world, rank, in_bytes, out_bytes, "bfloat16", sm.slot_bytes, None, two_shot):
                for blocks in cfg["blocks"] or [defaults[0]]:
                    yield impl, lambda: comm.collective(op, y, x, path="sm"), (blocks, two_shot)
        yield "default", lambda: comm.collective(op, y, x), None
        yield "dma", lambda: comm.collective(op, y, x, path="dma"), None
        yield "nccl", nccl, None
        if op == "all_reduce":
            yield "symm_mem_one_shot", lambda: y.copy_(torch.ops.symm_mem.one_shot_all_reduce(
                x, "sum", comm.group.group_name)), None

    def configure(settings) -> None:
        sm.configure(*(settings or defaults))

    def path_of(impl: str) -> str:
        return comm.last_options.path if impl not in ("nccl", "symm_mem_one_shot") and comm.last_options else ""

    for op in cfg["ops"]:
        for nbytes in cfg["sizes"]:
            n_in, n_out = (b // 2 for b in shapes(op, world, nbytes))
            x, y = inp_all[:n_in], out_all[:n_out]
            x.normal_()
            impls = list(callers(op, x, y))
            labels = [f"{impl}/{i}" for i, (impl, _, _) in enumerate(impls)]  # one impl may time several blocks
            settings_of = {label: settings for label, (_, _, settings) in zip(labels, impls)}
            for mode in MODES:
                # every implementation ready (captured, warmed up), then sampled in turns (``interleave``)
                runs, made = {}, {}
                for label, (impl, fn, settings) in zip(labels, impls):
                    configure(settings)
                    error = ""
                    try:
                        runs[label] = prepare(fn, cfg["calls"], mode=mode, warmup=2, stream=stream)[0]
                    except Exception as e:  # noqa: BLE001 - recorded; the ranks go on
                        error = f"{type(e).__name__}: {e}"[:300]
                    path = "" if error else path_of(impl)
                    made[label] = {"op": op, "impl": impl, "mode": mode, "bytes": nbytes, "samples": [],
                                   "error": error, "path": path, "sm_blocks": sm.blocks if path == "sm" else ""}
                    torch.cuda.synchronize()
                    dist.barrier()
                ready = [None] * world  # the runs every rank made: the turns must be the same everywhere
                dist.all_gather_object(ready, sorted(runs))
                common = [label for label in labels if all(label in r for r in ready)]
                try:
                    times = interleave({label: runs[label] for label in common}, cfg["calls"], cfg["repeats"],
                                       stream=stream, each=dist.barrier,
                                       before={label: (lambda s=settings_of[label]: configure(s))
                                               for label in common})
                except Exception as e:  # noqa: BLE001 - recorded for every run of this point
                    times = {}
                    for label in common:
                        made[label]["error"] = f"{type(e).__name__}: {e}"[:300]
                for label in labels:
                    if label in times:
                        made[label]["samples"] = times[label]
                    elif not made[label]["error"]:
                        made[label]["error"] = "not ready on every rank"
                    out.append(made[label])
                del runs
                configure(None)
                torch.cuda.synchronize()
                dist.barrier()
            point = out[-len(labels) * len(MODES):]  # this (op, size): the graph rows, then the eager rows
            for i, (impl, fn, settings) in enumerate(impls):
                mine = point[i::len(labels)]
                # correctness: fresh data, poisoned output, one eager call (all_reduce also in place for sm)
                configure(settings)
                x.normal_()
                y.fill_(float("nan"))
                inputs = [torch.empty_like(x) for _ in range(world)]
                dist.all_gather(inputs, x)
                ok = False
                stream.wait_stream(torch.cuda.current_stream())  # the fresh input and the poison first
                try:
                    with torch.cuda.stream(stream):
                        fn()
                    torch.cuda.synchronize()
                    want = expected(op, world, rank, inputs)
                    exact = op in ("all_gather", "all_to_all") or mine[-1]["path"] == "sm"
                    ok = torch.equal(y.view(torch.int16), want.view(torch.int16)) if exact else \
                        torch.allclose(y.float(), want.float(), rtol=2e-2, atol=0.125)  # NCCL adds in bf16: ulps
                    if impl.startswith("sm") and op == "all_reduce":
                        z = x.clone()
                        comm.all_reduce(x, x, path="sm")
                        torch.cuda.synchronize()
                        ok = ok and torch.equal(x.view(torch.int16), want.view(torch.int16))
                        x.copy_(z)
                except Exception as e:  # noqa: BLE001
                    mine[-1]["error"] = mine[-1]["error"] or f"check: {type(e).__name__}: {e}"[:300]
                for r in mine:
                    r["correct"] = bool(ok)
                configure(None)
                dist.barrier()
    torch.cuda.synchronize()
    dist.barrier()
    comm.close()
    return out


def run(args: argparse.Namespace) -> dict[str, Table]:
    import os

    from ...verify.launch import run_ranks

    driver()
    seed = int(os.environ.get("DMACOLL_SEED", "1234"))
    print(f"seed {seed} (DMACOLL_SEED)", flush=True)
    rows = []
    for world in args.worlds:
        cfg = {"sizes": args.sizes, "ops": args.ops, "calls": args.calls, "repeats": args.repeats, "seed": seed,
               "blocks": args.blocks}
        try:
            per_rank = run_ranks(_rank, world, cfg, device="cuda", timeout_s=500)
        except Exception as e:  # noqa: BLE001 - recorded, the other worlds go on
            rows.append(row(world, "", "", "", 0, [], args.calls, error=f"{type(e).__name__}: {e}"[:300]))
            continue
        for i, first in enumerate(per_rank[0]):
            mine = [r[i] for r in per_rank]
            error = next((m["error"] for m in mine if m["error"]), "")
            samples = [] if error else [max(s) for s in zip(*(m["samples"] for m in mine))]
            rows.append(row(world, first["op"], first["impl"], first["mode"], first["bytes"], samples, args.calls,
                            all(m.get("correct") for m in mine), error, first.get("path", ""), first["sm_blocks"]))
            r = rows[-1]
            print(f"w{world} {r['op']:14s} {r['impl']:18s} {r['path']:3s} {r['sm_blocks']!s:>3} {r['mode']:5s} "
                  f"{r['bytes']:>9} "
                  f"{r['per_call_us']:8.2f} us "
                  f"(p10 {r['per_call_us_p10']:.2f}, p90 {r['per_call_us_p90']:.2f}) correct={r['correct']} "
                  f"{r['error']}", flush=True)
    config = {k: getattr(args, k) for k in ("worlds", "sizes", "ops", "calls", "repeats", "blocks")}
    config["seed"] = seed
    config["timing"] = "interleaved"  # the samples of one point's implementations taken in turns (``interleave``)
    return {NAME: Table(rows, config)}
