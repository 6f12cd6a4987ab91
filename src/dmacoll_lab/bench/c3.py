"""C3 (ConCCL): a compute operator and a collective at the same time, on separate streams, per strategy.

Compute: a bf16 GEMM ``(M x K) @ (K x N)`` over a grid of LLM shapes, or a memory-bound elementwise add of two
``M x N`` bf16 tensors; repeated back to back ``comp_reps`` times so the compute phase lasts at least
``min_comp_us`` (a 25 us GEMM would otherwise be shorter than the smallest collective). Communication:
``comm_calls`` back-to-back calls of one collective (all_gather, all_to_all, reduce_scatter, all_reduce) of
``bytes_per_rank``, captured in a CUDA graph. The size and the count are chosen per (shape, op, target ratio):
one NCCL call is timed (graph-replayed) for each size of a ladder first, then ``choose_comm`` takes the largest
size whose rounded call count lands within 15% of ``target x T_comp`` (else the closest); the choice uses the
slowest rank's times, so every rank issues the same collectives. Every strategy moves the same bytes.

Strategies (each a switch):

* ``baseline``: NCCL; compute and collective on two default-priority streams, compute launched first;
* ``priority``: NCCL (a process group with high-priority internal streams) captured on and replayed from a
  stream of the device's greatest priority, launched first (PyTorch instantiates graphs with per-node
  priorities, so the priority of the stream a kernel is captured on is what counts);
* ``partition``: NCCL; the compute on a green context of k SMs (k from ``sm_fractions`` of the SMs, rounded
  down to the split granule of 8), leaving the other SMs to NCCL;
* ``carveout``: NCCL, and the compute's GEMMs through cuBLASLt asked to leave ``carveout_sms`` SMs free
  (``green.SmCarveout``: cuBLASLt's SM-count target, what PyTorch offers for FSDP-style overlap); NCCL's kernels
  find those SMs free; unlike a green context the GEMM's grid is sized for the SMs it keeps;
* ``dma``: the dmacoll Communicator's collective (variant auto) on copy engines (its reduce_scatter and
  all_reduce add the received chunks to the own one with a small kernel, so they do use SMs briefly);
* ``dma_priority``: dma captured on and replayed from the greatest-priority stream, launched first (as
  ``priority``): the reduce ops' sum kernel, queued behind the copies, then takes SMs as the compute's blocks
  retire instead of after the compute;
* ``dma_partition``: dma, and the compute on a green context of all SMs but fewer than 8 (ConCCL measures it).
* ``dma_carveout``: dma with the compute as in ``carveout``: the dma collective's own SM work (the all-to-all's
  device-local copy of its own chunk, the reduce ops' sum) finds free SMs at once instead of waiting for a
  persistent GEMM (``results/h100x1/probes/``). A carveout does nothing to the memory-bound add.

Times are medians of ``repeats``, CUDA events, each repeat released by one event after a short GPU sleep (so
the host has queued both sides before either starts: ``harness.Rank.time_parts``). Metrics (``c3_grid.c3_metrics``):

* T_comp: the compute alone on the whole GPU, default priority; T_comm: the strategy's collective alone
  (its implementation, stream priority); T_c3: both launched together, until the later one ends;
* serial = T_comp + T_comm; ideal speedup = serial / max(T_comp, T_comm); realized = serial / T_c3;
* fraction of ideal = (serial - T_c3) / (serial - max(T_comp, T_comm));
* speedup_vs_nccl_serial = (T_comp + T_comm of NCCL) / T_c3: one yardstick for every strategy (the best
  strategy of a scenario is the one with the smallest T_c3);
* slowdowns: each side's time together / its time alone (so a partition's lost SMs count against it).

Every op is called in place where it has an in-place form (``OpSpec.in_place``), for NCCL and dma alike.
After the strategies of a (shape, op, target) are timed, every collective graph is checked (``harness.Bound``):
outputs poisoned, replayed once, compared with the op spec's reference of every rank's seeded input (sums use
small integers, exact in bf16 in any order; an in-place sum whose graph holds several calls, which would sum
again, is checked with a one-call graph: ``dmacoll.timing.check_after``). Rows are per rank.

``sizes`` (the ``dmacoll interference`` view) replaces the targets: each of those collective sizes, called
often enough to span the compute (target 1).
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from dmacoll.lab_api import capture, check_after, ops
from . import harness
from .c3_grid import (C3_COLUMNS, CARVEOUT, CARVEOUT_STRATEGIES, COMM_FIRST, GRAPH_OF, NAN, NCCL_STRATEGIES, Shape,
                      comm_points, comp_reps, compute_setting, metrics_row, option_fields, options, scenario_fields,
                      skipped_row)

__all__ = ["C3_COLUMNS", "run_c3"]


def compute_op(shape: Shape, device) -> Callable[[], None]:
    bf = dict(device=device, dtype=torch.bfloat16)
    if shape.compute == "gemm":
        a, b = torch.randn(shape.M, shape.K, **bf), torch.randn(shape.K, shape.N, **bf)
        c = torch.empty(shape.M, shape.N, **bf)
        return lambda: torch.mm(a, b, out=c)
    x, y = torch.randn(shape.M, shape.N, **bf), torch.randn(shape.M, shape.N, **bf)
    z = torch.empty_like(x)
    return lambda: torch.add(x, y, out=z)


def greatest_priority_stream(device):
    """A stream of the device's greatest priority, created through cuda-bindings because torch's stream pool
    may stop short of it; else torch's highest (the ``comm_priority`` column says which was had)."""
    try:
        from cuda.bindings import driver as drv

        err, _least, greatest = drv.cuCtxGetStreamPriorityRange()
        if err == drv.CUresult.CUDA_SUCCESS:
            err, raw = drv.cuStreamCreateWithPriority(drv.CUstream_flags.CU_STREAM_NON_BLOCKING.value, greatest)
            if err == drv.CUresult.CUDA_SUCCESS:
                return torch.cuda.ExternalStream(int(raw), device=device)
    except Exception:  # noqa: BLE001 - no cuda-bindings, or an old one: torch's stream
        pass
    return torch.cuda.Stream(device=device, priority=-1000)  # clamped to torch's greatest


def collective(rk: harness.Rank, op: str, impl: str, nbytes: int, seed: int, group=None) -> harness.Bound:
    """One (op, impl) on this rank's buffers, in place where the op has the form: dmacoll on its symmetric
    heap, NCCL (``group``, default the world) on private memory."""
    spec = ops.get(op)
    # the copy engines, as ConCCL offloads it (harness.PURE_DMA)
    caller = harness.dma_caller(rk.comm, spec, **harness.PURE_DMA) if impl == "dma" \
        else harness.torch_caller(spec, group)
    return harness.Bound(rk, spec, nbytes, seed, caller, symmetric=impl == "dma", in_place=True)


# -- GPU: the run -------------------------------------------------------------------------------------------------
class Rank(harness.Rank):
    """The harness's rank (communicator, buffers sized for the largest collective, host agreement) plus C3's
    streams, green contexts, SM carveout and high-priority NCCL group."""

    def __init__(self, rank: int, world: int, cfg: dict):
        top = max(cfg["sizes"] or cfg["ladder"])
        super().__init__(rank, world, pool_bytes=top, hold_us=cfg["hold_us"])
        self.cfg = cfg
        self.comp_stream, self.comm_stream = torch.cuda.Stream(), torch.cuda.Stream()
        self.comm_hi = greatest_priority_stream(self.device)
        self.hi_group = None
        if "priority" in cfg["strategies"]:
            import torch.distributed as dist

            # NCCL kernels take the priority of the stream they are captured on: the caller's stream for a
            # synchronous collective in recent torch, an internal one before; that one is high priority too
            opts = dist.ProcessGroupNCCL.Options()
            opts.is_high_priority_stream = True
            self.hi_group = dist.new_group(backend="nccl", pg_options=opts)
        self.greens: dict[float, object] = {}
        self.green_errors: dict[float, str] = {}
        for _, frac in options(cfg["strategies"], cfg["sm_fractions"]):
            if frac is not None and frac not in self.greens and frac not in self.green_errors:
                gs, err = self.agreed(lambda f=frac: self._green(f))
                if err:
                    self.green_errors[frac] = err
                else:
                    self.greens[frac] = gs
        self.carveout, self.carveout_error, self.carveout_split = None, "", ""
        if any(s in CARVEOUT_STRATEGIES for s in cfg["strategies"]):
            self.carveout, self.carveout_error = self.agreed(lambda: self._carveout(cfg["carveout_sms"]))
            total = torch.cuda.get_device_properties(self.device).multi_processor_count
            self.carveout_split = f"{total - cfg['carveout_sms']}/{total}"

    def _green(self, frac: float):
        from .green import all_but_few, green_stream, sms_for_fraction

        total = torch.cuda.get_device_properties(self.device).multi_processor_count
        k = all_but_few(total) if frac >= 1.0 else sms_for_fraction(frac, total)
        gs = green_stream(k, self.device.index)
        # smoke test of what timing does with it (cross-context event wait, record, elapsed time), so that a
        # failure becomes a recorded reason now rather than a crash later
        x = torch.ones(1 << 20, device=self.device)
        self.time_parts([("x", lambda: x.add_(1), gs.stream)], 1)
        return gs

    def _carveout(self, sms: int):
        from .green import SmCarveout

        carveout = SmCarveout(sms)
        a = torch.ones(256, 256, device=self.device, dtype=torch.bfloat16)
        carveout.wrap(torch.mm)(a, a)  # smoke test: cuBLASLt takes the setting here, or the reason is recorded
        torch.cuda.synchronize(self.device)
        return carveout

    def setting_error(self, setting) -> str:
        """Why a compute setting (compute_setting) is unavailable, or ''."""
        if setting == CARVEOUT:
            return self.carveout_error if self.carveout is None else ""
        if setting is not None and setting not in self.greens:
            return self.green_errors.get(setting, "green context unavailable")
        return ""


def probe_ladder(rk: Rank, op: str) -> dict[int, float]:
    """One NCCL call's time per ladder size (10 calls graph-replayed, median of 3), slowest rank."""
    sizes = rk.cfg["sizes"] or rk.cfg["ladder"]
    per_rank = {}
    for i, size in enumerate(sizes):
        b = collective(rk, op, "nccl", size, 31 * (i + 1))
        graph = capture(b.run, 10, rk.comm_stream)
        per_rank[size] = rk.alone(graph.replay, rk.comm_stream, 3) / 10
    merged = rk.gather(per_rank)
    return {s: max(r[s] for r in merged) for s in sizes}


def run_c3(rank: int, world: int, cfg: dict) -> Optional[list[dict]]:
    rk = Rank(rank, world, cfg)
    ladders = {op: probe_ladder(rk, op) for op in cfg["ops"]}
    if rank == 0:
        for op, lad in ladders.items():
            print(f"{op:14s} NCCL us/call: " + ", ".join(f"{s >> 10}K {t:.1f}" for s, t in lad.items()), flush=True)
        for frac, err in rk.green_errors.items():
            print(f"green context for fraction {frac:g} unavailable: {err}", flush=True)
        if rk.carveout_error:
            print(f"SM carveout unavailable: {rk.carveout_error}", flush=True)
    rows: list[dict] = []
    for i, text in enumerate(cfg["shapes"]):
        rows += measure_shape(rk, Shape.parse(text), ladders, 1000 * (i + 1))
        torch.cuda.empty_cache()
    return rk.finish(rows)


def measure_shape(rk: Rank, shape: Shape, ladders: dict, seed: int) -> list[dict]:
    cfg = rk.cfg
    one = compute_op(shape, rk.device)
    # compute setting -> how the compute is issued: (wrapper of a function, stream)
    issue = {None: (lambda fn: fn, rk.comp_stream), **{f: (lambda fn: fn, g.stream) for f, g in rk.greens.items()}}
    if rk.carveout is not None:
        issue[CARVEOUT] = (rk.carveout.wrap, rk.comp_stream)
    for wrap, s in issue.values():  # cuBLAS(Lt) picks its kernels (and workspace) per stream and setting
        with torch.cuda.stream(s):
            wrap(one)(), wrap(one)()
    first = rk.alone(one, rk.comp_stream, 3)
    reps = rk.most(comp_reps(first, cfg["min_comp_us"]))

    def comp() -> None:
        for _ in range(reps):
            one()

    t_comp = rk.alone(comp, rk.comp_stream, cfg["repeats"])
    placements = {k: (wrap(comp), s) for k, (wrap, s) in issue.items()}
    comp_here = {k: (rk.alone(fn, s, cfg["repeats"]) if k is not None else t_comp)
                 for k, (fn, s) in placements.items()}
    t_comp_max = rk.most(t_comp)
    rows = []
    for op in cfg["ops"]:
        for size, calls, target in comm_points(cfg, ladders[op], t_comp_max):
            base = scenario_fields(shape, reps, op, rk.world, rk.rank, size, calls, target)
            rows += measure_point(rk, op, size, calls, base, placements, t_comp, comp_here,
                                  seed + 17 * len(rows) + 1)
            if rk.rank == 0:
                for r in rows[-len(options(cfg["strategies"], cfg["sm_fractions"])):]:
                    note = r["skipped"] or ("ok" if r["correct"] else "WRONG")
                    print(f"{shape.compute}:{shape.M}x{shape.N}x{shape.K} {op:14s} r={target:<5g} "
                          f"{size >> 10:>7d}K x{calls:<3d} {r['option']:22s} T_c3 {r['t_c3_us']:10.1f} us, "
                          f"{r['fraction_of_ideal']:6.2f} of ideal, {note}", flush=True)
    return rows


def measure_point(rk: Rank, op: str, size: int, calls: int, base: dict, placements: dict, t_comp: float,
                  comp_here: dict, seed: int) -> list[dict]:
    """Every strategy for one (shape, op, size, calls): graphs, times alone, times together, checks.
    ``placements``: compute setting -> (compute function, stream); ``comp_here``: setting -> its time alone."""
    cfg = rk.cfg
    opts = options(cfg["strategies"], cfg["sm_fractions"])
    graphs: dict[str, tuple] = {}  # name -> (bound, graph, stream)
    reason: dict[str, str] = {}
    wanted = {GRAPH_OF[s] for s, _ in opts} | {"nccl"}  # NCCL's serial time is every strategy's yardstick
    for impl, name, stream in (("nccl", "nccl", rk.comm_stream), ("nccl", "nccl_hi", rk.comm_hi),
                               ("dma", "dma", rk.comm_stream), ("dma", "dma_hi", rk.comm_hi)):
        if name not in wanted:
            continue

        def setup(impl=impl, name=name, stream=stream):
            b = collective(rk, op, impl, size, seed, rk.hi_group if name == "nccl_hi" else None)
            return b, capture(b.run, calls, stream), stream

        got, err = rk.agreed(setup)
        if err:
            reason[name] = err
        else:
            graphs[name] = got
    variant = f"{rk.comm.last_options.variant}/{rk.comm.last_options.direction}" if "dma" in graphs else ""
    t_comm = {name: rk.alone(g.replay, s, cfg["repeats"]) for name, (_, g, s) in graphs.items()}
    rows = []
    for strategy, frac in opts:
        name, setting = GRAPH_OF[strategy], compute_setting(strategy, frac)
        green = rk.greens.get(frac) if frac is not None else None
        split = green.split if green else (rk.carveout_split if setting == CARVEOUT else "")
        row = {**base, **option_fields(strategy, frac, split, variant,
                                       graphs[name][2].priority if name in graphs else "")}
        why = rk.setting_error(setting) or ("" if name in graphs else reason.get(name, f"{name} not set up"))
        if why:
            rows.append({**row, **skipped_row(why)})
            continue
        _, graph, stream = graphs[name]
        comp, comp_stream = placements[setting]
        parts = [("comp", comp, comp_stream), ("comm", graph.replay, stream)]
        together = rk.time_parts(parts[::-1] if strategy in COMM_FIRST else parts, cfg["repeats"])
        rows.append({**row, **metrics_row(t_comp, t_comm[name], t_comm.get("nccl", NAN), comp_here[setting],
                                          together), "correct": None, "skipped": ""})
    checks = {}
    for name, (b, graph, stream) in graphs.items():
        checks[name] = check_after(b, b.run, calls, graph, stream)
    for r in rows:
        if not r["skipped"]:
            r["correct"] = checks[GRAPH_OF[r["strategy"]]]
    return rows
