"""FiCCO: finer-grain compute-communication overlap of a collective and its dependent GEMM.

Patterns (bf16, per rank; ``tokens`` global, world = process count):

* ``ag_gemm``: each rank holds tokens/world rows of A (tokens x hidden); all-gather A, multiply by this
  rank's weight shard (hidden x intermediate/world);
* ``gemm_rs``: partial C = A[:, K slice] @ W[K slice, :] (K = intermediate/world, N = hidden), then
  reduce-scatter C's rows;
* ``a2a_gemm``: MoE dispatch (balanced top-k routing: an equal-split all-to-all of the routed rows, grouped
  per destination expert) then each local expert's up-projection (one bmm over local experts per source).

Schedules: ``serial`` (collective then GEMM, or GEMM then collective, on one stream) and ``d`` pieces
(d = factor x world row slices, ``ficco_grid.split_rows``): the collective of piece i runs on a communication
stream and GEMM piece i waits for its event on the compute stream (gemm_rs: GEMM piece i, then its
reduce-scatter on the communication stream after an event). Pieces are laid out contiguously (piece-major,
``ficco_grid.piece_major_order``), so each piece's collective is one call on a contiguous range.
Communication: ``nccl`` (torch.distributed, private buffers) or ``dma`` (dmacoll Communicator, its symmetric
heap).

Each schedule is one CUDA graph; times are medians of ``repeats`` graph replays (CUDA events, released after
a GPU sleep; ``harness.Rank.time_parts``). Isolated times from the same run: the whole GEMM, the d GEMM pieces back to back,
the collective (pieces) alone. Metrics: ``ficco_grid.metrics``.

Check: inputs are integers in {-1, 0, 1}, A with at most BAND nonzeros per row, so every product and sum is
an exact integer in bf16 (|value| <= BAND x world <= 256) whatever the order: outputs must equal, byte for
byte, a reference each rank computes locally from every rank's seeded inputs (no communication), which is
also the serial result. Outputs are poisoned before the check replay. Rows are per rank.
"""
from __future__ import annotations

from typing import Callable, Optional

from dmacoll.lab_api import capture, ops
from ..verify.reference import POISON
from .harness import PURE_DMA, Rank
from .ficco_grid import (BAND, FICCO_COLUMNS, NAN, Scenario, heap_top, metrics, option_label, piece_major_order,
                         scenarios, schedules, skipped_row, split_rows)

__all__ = ["FICCO_COLUMNS", "run_ficco"]


def int_matrix(shape: tuple, seed: int, device, banded: bool = False):
    """bf16 integers in {-1, 0, 1}; banded: row r nonzero only in the column band r mod (bands)."""
    import torch

    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randint(-1, 2, shape, generator=gen, device=device, dtype=torch.int8)
    if banded:
        cols = shape[-1]
        rows = x.numel() // cols
        nb = -(-cols // BAND)
        keep = (torch.arange(rows, device=device)[:, None] % nb) == (torch.arange(cols, device=device)[None] // BAND)
        x = x * keep.view(shape)
    return x.to(torch.bfloat16)


def collective(rk: Rank, impl: str, op: str, out, inp) -> Callable[[], None]:
    """One call of ``op`` on dmacoll (its symmetric heap) or NCCL (torch.distributed)."""
    if impl == "dma":  # the copy engines, as the paper offloads it (harness.PURE_DMA)
        return lambda: rk.comm.collective(op, out, inp, **PURE_DMA)
    return lambda: ops.get(op).torch_call(out, inp)


class Problem:
    """One scenario on this rank: seeded data, the reference, and per (impl, d) the piece closures."""

    def __init__(self, rk: Rank, sc: Scenario, seed: int):
        import torch

        self.rk, self.sc = rk, sc
        w, r, dev = rk.world, rk.rank, rk.device
        m, n, k = sc.mnk
        a_seed = lambda q: seed * 7919 + q  # noqa: E731 - rank q's activations
        w_seed = lambda q: seed * 7919 + 1000 + q  # noqa: E731 - rank q's weights
        self.rows = sc.rows_per_block
        if sc.pattern == "ag_gemm":
            shards = [int_matrix((self.rows, k), a_seed(q), dev, banded=True) for q in range(w)]
            self.a, self.w = shards[r], int_matrix((k, n), w_seed(r), dev)
            self.ref = torch.mm(torch.cat(shards), self.w)                       # [world*rows, N/world]
            self.c = torch.empty(m * n, device=dev, dtype=torch.bfloat16)
        elif sc.pattern == "gemm_rs":
            self.a, self.w = int_matrix((m, k), a_seed(r), dev, banded=True), int_matrix((k, n), w_seed(r), dev)
            lo, hi = r * self.rows, (r + 1) * self.rows
            acc = torch.zeros(self.rows, n, device=dev)
            for q in range(w):  # every rank's partial for my rows, rounded to bf16 as the GEMM does
                aq = self.a if q == r else int_matrix((m, k), a_seed(q), dev, banded=True)
                wq = self.w if q == r else int_matrix((k, n), w_seed(q), dev)
                acc += torch.mm(aq[lo:hi], wq).float()
            self.ref = acc.to(torch.bfloat16)
            self.a_perm = torch.empty_like(self.a)
        else:
            el, h, inter = sc.experts_local, k, n
            xs = [int_matrix((w, el, self.rows, h), a_seed(q), dev, banded=True) for q in range(w)]
            self.a, self.w = xs[r], int_matrix((el, h, inter), w_seed(r), dev)
            got = torch.stack([x[r] for x in xs])                                 # [src, el, rows, h]
            self.ref = torch.stack([torch.bmm(got[s], self.w) for s in range(w)])  # [src, el, rows, inter]
            self.y = torch.empty(m * n, device=dev, dtype=torch.bfloat16)

    def pools(self, impl: str):
        rk = self.rk
        return (rk.sym_in, rk.sym_out) if impl == "dma" else (rk.priv_in, rk.priv_out)

    def pieces(self, impl: str, d: int) -> tuple[list, list, Callable[[], bool], Callable[[], None]]:
        """(collectives, GEMMs, check, poison) for d pieces, inputs copied into ``impl``'s buffers."""
        import torch

        sc, rk, w, dt = self.sc, self.rk, self.rk.world, torch.bfloat16
        m, n, k = sc.mnk
        p_in, p_out = self.pools(impl)
        flat_in, flat_out = p_in.view(dt), p_out.view(dt)
        cuts = split_rows(self.rows, d)
        colls, gemms = [], []
        if sc.pattern == "ag_gemm":
            flat_in[: self.a.numel()].copy_(self.a.view(-1))
            for off, rows in cuts:
                inp = flat_in[off * k:(off + rows) * k]
                out = flat_out[w * off * k: w * (off + rows) * k]
                c = self.c[w * off * n: w * (off + rows) * n].view(w * rows, n)
                colls.append(collective(rk, impl, sc.op, out, inp))
                gemms.append(lambda o=out, c=c, r=rows: torch.mm(o.view(w * r, k), self.w, out=c))
            idx = torch.tensor(piece_major_order(self.rows, w, d), device=rk.device)
            want = self.ref[idx]
            outputs = [self.c, flat_out[: w * self.rows * k]]
            check = lambda: torch.equal(self.c.view(w * self.rows, n), want)  # noqa: E731
        elif sc.pattern == "gemm_rs":
            idx = torch.tensor(piece_major_order(self.rows, w, d), device=rk.device)
            self.a_perm.copy_(self.a[idx])  # piece i's rows for every destination, contiguous
            for off, rows in cuts:
                part = flat_in[w * off * n: w * (off + rows) * n]
                out = flat_out[off * n:(off + rows) * n]
                gemms.append(lambda p=part, lo=w * off, hi=w * (off + rows):
                             torch.mm(self.a_perm[lo:hi], self.w, out=p.view(hi - lo, n)))
                colls.append(collective(rk, impl, sc.op, out, part))
            outputs = [flat_in[: m * n], flat_out[: self.rows * n]]
            check = lambda: torch.equal(flat_out[: self.rows * n].view(self.rows, n), self.ref)  # noqa: E731
        else:
            el = sc.experts_local
            views = []
            for off, rows in cuts:
                lo, hi = w * el * off * k, w * el * (off + rows) * k
                inp, out = flat_in[lo:hi], flat_out[lo:hi]
                inp.view(w, el, rows, k).copy_(self.a[:, :, off:off + rows])
                y = self.y[w * el * off * n: w * el * (off + rows) * n].view(w, el, rows, n)
                colls.append(collective(rk, impl, sc.op, out, inp))
                gemms.append(lambda o=out, y=y, r=rows: [torch.bmm(o.view(w, el, r, k)[s], self.w, out=y[s])
                                                         for s in range(w)])
                views.append((y, off, rows))
            outputs = [self.y, flat_out[: w * el * self.rows * k]]
            check = lambda: all(torch.equal(y, self.ref[:, :, off:off + r]) for y, off, r in views)  # noqa: E731

        def poison() -> None:
            for t in outputs:
                t.view(torch.uint8).fill_(POISON)

        return colls, gemms, check, poison


def schedule(pattern: str, d: int, colls: list, gemms: list, comm_stream) -> Callable[[], None]:
    """Serial on the current stream, or the pieces overlapped across the current and ``comm_stream``."""
    import torch

    def run_all(fns):
        for f in fns:
            f()

    if d == 1:
        order = gemms + colls if pattern == "gemm_rs" else colls + gemms
        return lambda: run_all(order)

    def overlapped() -> None:
        comp = torch.cuda.current_stream()
        if pattern == "gemm_rs":  # GEMM i, then its reduce-scatter after an event
            for g, c in zip(gemms, colls):
                g()
                ev = torch.cuda.Event()
                ev.record(comp)
                comm_stream.wait_event(ev)
                with torch.cuda.stream(comm_stream):
                    c()
        else:  # every collective queued on the comm stream; GEMM i waits for collective i's event
            fork = torch.cuda.Event()
            fork.record(comp)
            comm_stream.wait_event(fork)
            done = []
            with torch.cuda.stream(comm_stream):
                for c in colls:
                    c()
                    done.append(torch.cuda.Event())
                    done[-1].record(comm_stream)
            for g, ev in zip(gemms, done):
                comp.wait_event(ev)
                g()
        comp.wait_stream(comm_stream)  # join: the schedule ends when both streams have

    return overlapped


class FiccoRank(Rank):
    """The harness's rank, its communicator and buffers sized for the largest collective input, with a compute
    and a communication stream."""

    def __init__(self, rank: int, world: int, cfg: dict, top: int):
        import torch

        super().__init__(rank, world, pool_bytes=top, hold_us=cfg["hold_us"])
        self.cfg, self.comp_stream, self.comm_stream = cfg, torch.cuda.Stream(), torch.cuda.Stream()


def measure(rk: Rank, sc: Scenario, seed: int) -> list[dict]:
    import torch

    cfg = rk.cfg
    sch = schedules(rk.world, cfg["factors"], cfg["impls"])
    prob, err = rk.agreed(lambda: Problem(rk, sc, seed))
    if err:
        return [{**sc.fields(rk.world, rk.rank), "impl": i, "pieces": d, "option": option_label(i, d),
                 **skipped_row(err)} for i, d in sch]
    t_gemm: dict[int, float] = {}
    results: dict[tuple[str, int], dict] = {}
    for d in sorted({d for _, d in sch}):
        for impl in [i for i, dd in sch if dd == d]:
            def setup(impl=impl, d=d):
                colls, gemms, check, poison = prob.pieces(impl, d)
                g_coll = capture(lambda: [c() for c in colls], 1, rk.comm_stream)
                g_sched = capture(schedule(sc.pattern, d, colls, gemms, rk.comm_stream), 1, rk.comp_stream)
                g_gemm = None if d in t_gemm else capture(lambda: [g() for g in gemms], 1, rk.comp_stream)
                return g_coll, g_sched, g_gemm, check, poison

            got, why = rk.agreed(setup)
            if why:
                results[(impl, d)] = {"skipped": why}
                continue
            g_coll, g_sched, g_gemm, check, poison = got
            if g_gemm is not None:
                t_gemm[d] = rk.alone(g_gemm.replay, rk.comp_stream, cfg["repeats"])
            t_coll = rk.alone(g_coll.replay, rk.comm_stream, cfg["repeats"])
            t = rk.alone(g_sched.replay, rk.comp_stream, cfg["repeats"])
            poison()
            torch.cuda.synchronize()
            rk.barrier()
            with torch.cuda.stream(rk.comp_stream):
                g_sched.replay()
            torch.cuda.synchronize()
            rk.barrier()  # peers' writes into us are complete
            results[(impl, d)] = {"t": t, "t_coll": t_coll, "correct": bool(check()), "skipped": ""}
            del g_coll, g_sched, g_gemm
    rows = []
    serial_nccl = results.get(("nccl", 1), {}).get("t", NAN)
    for impl, d in sch:
        res, base = results[(impl, d)], {**sc.fields(rk.world, rk.rank), "impl": impl, "pieces": d,
                                         "option": option_label(impl, d)}
        serial = results.get((impl, 1), {})
        if res["skipped"] or serial.get("skipped", "missing") or 1 not in t_gemm or d not in t_gemm:
            rows.append({**base, **skipped_row(res["skipped"] or serial.get("skipped") or "no serial time")})
            continue
        rows.append({**base, **metrics(sc.pattern, d, res["t"], serial["t"], serial_nccl, t_gemm[1], t_gemm[d],
                                       serial["t_coll"], res["t_coll"]),
                     "correct": res["correct"], "skipped": ""})
    return rows


def run_ficco(rank: int, world: int, cfg: dict) -> Optional[list[dict]]:
    import torch

    scs = scenarios(cfg["models"], cfg["tokens"], cfg["patterns"], world)
    top = heap_top(scs)
    rk = FiccoRank(rank, world, cfg, top)
    rows: list[dict] = []
    for i, sc in enumerate(scs):
        got = measure(rk, sc, 1000 * (i + 1))
        rows += got
        if rank == 0:
            for r in got:
                note = r["skipped"] or ("ok" if r["correct"] else "WRONG")
                print(f"{sc.model:13s} {sc.pattern:8s} {sc.tokens:6d} {r['option']:12s} {r['t_us']:10.1f} us "
                      f"x{r['speedup_vs_serial']:.3f} vs serial, x{r['speedup_vs_nccl_serial']:.3f} vs NCCL serial, "
                      f"decomp {r['decomposition_loss']:.3f}, contention {r['contention_loss']:.3f}, {note}",
                      flush=True)
        torch.cuda.empty_cache()
    return rk.finish(rows)
