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
  persistent GEMM (``results/reference/h100x1/evidence/``). A carveout does nothing to the memory-bound add.

Times are medians of ``repeats``, CUDA events, each repeat released by one event after a short GPU sleep (so
the host has queued both sides before either starts). Metrics (``overlap.c3_metrics``):

* T_comp: the compute alone on the whole GPU, default priority; T_comm: the strategy's collective alone
  (its implementation, stream priority); T_c3: both launched together, until the later one ends;
* serial = T_comp + T_comm; ideal speedup = serial / max(T_comp, T_comm); realized = serial / T_c3;
* fraction of ideal = (serial - T_c3) / (serial - max(T_comp, T_comm));
* speedup_vs_nccl_serial = (T_comp + T_comm of NCCL) / T_c3: one yardstick for every strategy (the best
  strategy of a scenario is the one with the smallest T_c3);
* slowdowns: each side's time together / its time alone (so a partition's lost SMs count against it).

After the strategies of a (shape, op, target) are timed, every collective graph is checked: outputs poisoned,
replayed once, compared byte for byte with the sum/concatenation of every rank's seeded input (sums use small
integers, exact in bf16 in any order; a one-call graph checks the in-place all-reduce). Rows are per rank.
"""
from __future__ import annotations

import statistics
from typing import Callable, Optional

from .c3_grid import C3_COLUMNS, CARVEOUT, CARVEOUT_STRATEGIES, COMM_FIRST, GRAPH_OF, NAN, NCCL_STRATEGIES, Shape, \
    choose_comm, comp_reps, compute_setting, metrics_row, option_fields, options, scenario_fields, skipped_row

__all__ = ["C3_COLUMNS", "run_c3"]


# -- GPU: one collective bound to buffers and seeded inputs ----------------------------------------------------
def draw_inputs(op: str, nbytes: int, world: int, seed: int, device, dtype) -> list:
    """Every rank's input: normal bf16 for data movement, small integers for sums (exact in any order)."""
    import torch

    numel = nbytes // torch.empty((), dtype=dtype).element_size()
    out = []
    for r in range(world):
        gen = torch.Generator(device=device).manual_seed(seed * 7919 + r)
        if op in ("reduce_scatter", "all_reduce"):
            out.append(torch.randint(-4, 5, (numel,), generator=gen, device=device).to(dtype))
        else:
            out.append(torch.randn(numel, generator=gen, device=device).to(dtype))
    return out


def expected_output(op: str, inputs: list, rank: int):
    import torch

    world = len(inputs)
    if op == "all_gather":
        return torch.cat(inputs)
    if op == "all_to_all":
        return torch.cat([x.chunk(world)[rank] for x in inputs])
    total = torch.stack([x.float() for x in inputs]).sum(0).to(inputs[0].dtype)
    return total.chunk(world)[rank] if op == "reduce_scatter" else total


class Bound:
    """One (op, impl) on this rank's buffers: dma uses the communicator's symmetric heap (all-gather in place),
    NCCL private memory; all-reduce is in place for both."""

    def __init__(self, runner, op: str, impl: str, nbytes: int, inputs: list, group=None):
        import torch

        self.runner, self.op, self.impl, self.inputs, self.group = runner, op, impl, inputs, group
        world, rank, dt = runner.world, runner.rank, runner.dtype
        size = torch.empty((), dtype=dt).element_size()
        numel = nbytes // size
        pool_in, pool_out = (runner.sym_in, runner.sym_out) if impl == "dma" else (runner.priv_in, runner.priv_out)
        out_numel = {"all_gather": numel * world, "all_to_all": numel, "reduce_scatter": numel // world,
                     "all_reduce": numel}[op]
        self.out = pool_out[: out_numel * size].view(dt)
        if op == "all_reduce":
            self.inp = self.out
        elif op == "all_gather" and impl == "dma":
            self.inp = self.out[rank * numel:(rank + 1) * numel]
        else:
            self.inp = pool_in[:nbytes].view(dt)
        self.inp.copy_(inputs[rank])
        self.run = self._call()

    def _call(self) -> Callable[[], None]:
        import torch.distributed as dist

        out, inp = self.out, self.inp
        if self.impl == "dma":
            comm = self.runner.comm
            return {"all_gather": lambda: comm.all_gather(out, inp), "all_to_all": lambda: comm.all_to_all(out, inp),
                    "reduce_scatter": lambda: comm.reduce_scatter(out, inp),
                    "all_reduce": lambda: comm.all_reduce(out)}[self.op]
        g = self.group
        return {"all_gather": lambda: dist.all_gather_into_tensor(out, inp, group=g),
                "all_to_all": lambda: dist.all_to_all_single(out, inp, group=g),
                "reduce_scatter": lambda: dist.reduce_scatter_tensor(out, inp, group=g),
                "all_reduce": lambda: dist.all_reduce(out, group=g)}[self.op]

    def check(self, replay: Callable[[], None], stream) -> bool:
        """Poison the output, restore the input, replay once, compare byte for byte."""
        import torch

        from ..verify.check import POISON

        self.out.view(torch.uint8).fill_(POISON)
        self.inp.copy_(self.inputs[self.runner.rank])  # an in-place input lies inside the poisoned output
        torch.cuda.synchronize()
        self.runner.barrier()
        with torch.cuda.stream(stream):
            replay()
        torch.cuda.synchronize()
        self.runner.barrier()  # peers' writes into us are complete
        want = expected_output(self.op, self.inputs, self.runner.rank)
        return bool(torch.equal(self.out.view(torch.uint8), want.view(torch.uint8)))


def dma_reason(comm, op: str) -> str:
    """Why the dma strategies cannot run ``op`` ('' when they can)."""
    return "" if hasattr(comm, op) else f"Communicator has no {op}"  # the methods are named after the ops


# -- GPU: timing -----------------------------------------------------------------------------------------------
def capture_on(fn: Callable[[], None], calls: int, stream, warmup: int = 1):
    """A graph of ``calls`` calls captured on ``stream`` (its priority goes into the kernel nodes)."""
    import torch

    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):  # NCCL wants an eager call before capture
            fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(calls):
            fn()
    torch.cuda.synchronize()
    return graph


def sleep_cycles_per_us() -> float:
    import torch

    torch.cuda._sleep(1000)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(1_000_000)
    end.record()
    end.synchronize()
    return 1_000_000 / (start.elapsed_time(end) * 1e3)


def timed(parts: list, repeats: int, barrier: Callable[[], None], hold_cycles: int) -> dict:
    """Medians over repeats of each part's end (name -> us) and of the last end ('total'), from one start.

    ``parts``: (name, fn, stream) in launch order. A GPU sleep before the start event keeps every stream
    waiting until the host has queued all parts, so launch latency is not timed."""
    import torch

    gate = torch.cuda.current_stream()
    samples: dict[str, list[float]] = {name: [] for name, _, _ in parts}
    samples["total"] = []
    for _ in range(repeats):
        barrier()
        with torch.cuda.stream(gate):
            torch.cuda._sleep(hold_cycles)
        start = torch.cuda.Event(enable_timing=True)
        start.record(gate)
        ends = {}
        for name, fn, stream in parts:
            stream.wait_event(start)
            with torch.cuda.stream(stream):
                fn()
            ends[name] = torch.cuda.Event(enable_timing=True)
            ends[name].record(stream)
        for name, ev in ends.items():  # per event: a device sync need not cover green-context streams
            ev.synchronize()
            samples[name].append(start.elapsed_time(ev) * 1e3)
        samples["total"].append(max(samples[n][-1] for n in ends))
    return {k: statistics.median(v) for k, v in samples.items()}


def compute_op(shape: Shape, device) -> Callable[[], None]:
    import torch

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
    import torch

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


# -- GPU: the run -------------------------------------------------------------------------------------------------
class Rank:
    """This rank's communicator, buffers, streams, green contexts and SM carveout, and rank agreement."""

    def __init__(self, rank: int, world: int, cfg: dict):
        import torch

        from ..communicator import Communicator
        from .sweep import Runner, SweepConfig

        self.cfg, self.rank, self.world = cfg, rank, world
        top = max(cfg["ladder"])
        torch.cuda.set_stream(torch.cuda.Stream())  # never the legacy stream
        # staging: reduce_scatter stages world x chunk (= its input), all_reduce about the tensor
        comm = Communicator(heap_bytes=top * (world + 1) + (1 << 20), staging_bytes=2 * top + (1 << 20),
                            timeout_s=120)
        self.runner = Runner(SweepConfig(max_bytes=top), comm, world, rank)
        self.device = self.runner.device
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
        self.hold = int(sleep_cycles_per_us() * cfg["hold_us"])
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
        import torch

        from .green import all_but_few, green_stream, sms_for_fraction

        total = torch.cuda.get_device_properties(self.device).multi_processor_count
        k = all_but_few(total) if frac >= 1.0 else sms_for_fraction(frac, total)
        gs = green_stream(k, self.device.index)
        # smoke test of what timing does with it (cross-context event wait, record, elapsed time), so that a
        # failure becomes a recorded reason now rather than a crash later
        x = torch.ones(1 << 20, device=self.device)
        timed([("x", lambda: x.add_(1), gs.stream)], 1, lambda: None, 1000)
        return gs

    def _carveout(self, sms: int):
        import torch

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

    def barrier(self) -> None:
        self.runner.barrier()

    def gather(self, value) -> list:
        import torch.distributed as dist

        out: list = [None] * self.world
        dist.all_gather_object(out, value, group=self.runner.cpu_group)
        return out

    def agreed(self, fn: Callable[[], object]) -> tuple[object, str]:
        """Run ``fn`` on every rank; its value, or the first rank's error on all ranks if any failed."""
        try:
            value, err = fn(), ""
        except Exception as e:  # noqa: BLE001 - a failure is a recorded reason, the same on every rank
            value, err = None, f"{type(e).__name__}: {e}".replace("\n", " ")[:300]
        errors = [e for e in self.gather(err) if e]
        return (None, errors[0]) if errors else (value, "")

    def alone(self, fn, stream, repeats: Optional[int] = None) -> float:
        return timed([("x", fn, stream)], repeats or self.cfg["repeats"], self.barrier, self.hold)["x"]


def probe_ladder(rk: Rank, op: str) -> dict[int, float]:
    """One NCCL call's time per ladder size (10 calls graph-replayed, median of 3), slowest rank."""
    per_rank = {}
    for i, size in enumerate(rk.cfg["ladder"]):
        inputs = draw_inputs(op, size, rk.world, 31 * (i + 1), rk.device, rk.runner.dtype)
        b = Bound(rk.runner, op, "nccl", size, inputs)
        graph = capture_on(b.run, 10, rk.comm_stream)
        per_rank[size] = rk.alone(graph.replay, rk.comm_stream, 3) / 10
    merged = rk.gather(per_rank)
    return {s: max(r[s] for r in merged) for s in rk.cfg["ladder"]}


def run_c3(rank: int, world: int, cfg: dict) -> Optional[list[dict]]:
    import torch

    from .sweep import gather_rows

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
    return gather_rows(rk.runner, rows)


def measure_shape(rk: Rank, shape: Shape, ladders: dict, seed: int) -> list[dict]:
    import torch

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
    reps = max(rk.gather(comp_reps(first, cfg["min_comp_us"])))

    def comp() -> None:
        for _ in range(reps):
            one()

    t_comp = rk.alone(comp, rk.comp_stream)
    placements = {k: (wrap(comp), s) for k, (wrap, s) in issue.items()}
    comp_here = {k: (rk.alone(fn, s) if k is not None else t_comp) for k, (fn, s) in placements.items()}
    t_comp_max = max(rk.gather(t_comp))
    rows = []
    for op in cfg["ops"]:
        for target in cfg["targets"]:
            size, calls = choose_comm(ladders[op], target * t_comp_max, cfg["max_calls"])
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
    inputs = draw_inputs(op, size, rk.world, seed, rk.device, rk.runner.dtype)
    impls = {"nccl": any(s in NCCL_STRATEGIES for s, _ in opts),
             "dma": any(s not in NCCL_STRATEGIES for s, _ in opts)}
    reason = {"nccl": "", "dma": dma_reason(rk.runner.comm, op)}
    graphs: dict[str, tuple] = {}  # name -> (bound, graph, stream)
    wanted = {GRAPH_OF[s] for s, _ in opts} | {"nccl"}  # NCCL's serial time is every strategy's yardstick
    for impl, name, stream in (("nccl", "nccl", rk.comm_stream), ("nccl", "nccl_hi", rk.comm_hi),
                               ("dma", "dma", rk.comm_stream), ("dma", "dma_hi", rk.comm_hi)):
        if not impls[impl] or reason[impl] or name not in wanted:
            continue

        def setup(impl=impl, name=name, stream=stream):
            b = Bound(rk.runner, op, impl, size, inputs, rk.hi_group if name == "nccl_hi" else None)
            return b, capture_on(b.run, calls, stream), stream

        got, err = rk.agreed(setup)
        if err:
            reason[name] = err
        else:
            graphs[name] = got
    variant = "/".join(getattr(rk.runner.comm, "last_choice", ("",))[:2]) if "dma" in graphs else ""
    t_comm = {name: rk.alone(g.replay, s) for name, (_, g, s) in graphs.items()}
    rows = []
    for strategy, frac in opts:
        name, setting = GRAPH_OF[strategy], compute_setting(strategy, frac)
        green = rk.greens.get(frac) if frac is not None else None
        split = green.split if green else (rk.carveout_split if setting == CARVEOUT else "")
        row = {**base, **option_fields(strategy, frac, split, variant,
                                       graphs[name][2].priority if name in graphs else "")}
        why = rk.setting_error(setting) or (
            "" if name in graphs else (reason.get(name) or reason.get(row["impl"]) or f"{name} not set up"))
        if why:
            rows.append({**row, **skipped_row(why)})
            continue
        _, graph, stream = graphs[name]
        comp, comp_stream = placements[setting]
        parts = [("comp", comp, comp_stream), ("comm", graph.replay, stream)]
        together = timed(parts[::-1] if strategy in COMM_FIRST else parts, cfg["repeats"], rk.barrier, rk.hold)
        rows.append({**row, **metrics_row(t_comp, t_comm[name], t_comm.get("nccl", NAN), comp_here[setting],
                                          together), "correct": None, "skipped": ""})
    checks = {}
    for name, (b, graph, stream) in graphs.items():
        replay = graph.replay
        if op == "all_reduce" and calls > 1:  # in place: repeated calls keep summing; check one call
            replay = capture_on(b.run, 1, stream, warmup=0).replay
        checks[name] = b.check(replay, stream)
    for r in rows:
        if not r["skipped"]:
            r["correct"] = checks[GRAPH_OF[r["strategy"]]]
    return rows
