"""all_to_all_v with uneven splits on GPUs, one case after another on one communicator, as a user calls it (issue 47):
a crash map. Each case is announced in a progress file before it runs, so when a rank dies (SIGSEGV) or hangs, the
case in flight is known; the launcher records it and goes on from the next case in a new launch.

Usage (a GPU machine; `dmacoll a2av-stress --help`):
    dmacoll a2av-stress --world 2 --out $OUT/w2 [--options submit=python prerecord=False]
Writes <out>/data.csv (a row per case: ok / wrong / raised / crash / hang, the ranks, the options it ran with) with
its provenance sidecar <out>/data.json, and beside them <out>.jsonl (every rank's report) and <out>.log (the ranks'
output, a faulthandler traceback where a rank died).
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

SRC = Path(__file__).resolve().parents[2]  # the folder dmacoll_lab is in: a launch's child imports it from there
CHILD = "dmacoll_lab.verify.a2av_stress"  # what a launch runs (``python -m``)

VARIANTS = ("auto", "pcpy", "b2b", "multi")
DIRECTIONS = ("auto", "push", "pull")
BUFFERS = ("heap", "private")
DTYPES = ("int8", "int32", "bfloat16")
COUNT = 4099


def all_cases(world: int, seeds: int, only: tuple = ()) -> list[dict]:
    from dmacoll_lab.verify.splits import PATTERNS

    splits = [s for s in (*PATTERNS, *(f"random:{s}" for s in range(seeds))) if not only or s in only]
    return [dict(splits=s, variant=v, direction=d, buffers=b, dtype=t)
            for s, v, d, b, t in itertools.product(splits, VARIANTS, DIRECTIONS, BUFFERS, DTYPES)]


def counts_of(case: dict, world: int) -> list[list[int]]:
    from dmacoll_lab.verify.splits import split_counts

    name, _, seed = case["splits"].partition(":")
    return split_counts(name, COUNT, world, int(seed or 0))


def parse_options(items: list[str]) -> dict:
    out = {}
    for item in items:
        k, v = item.split("=", 1)
        out[k] = {"True": True, "False": False}.get(v, v)
    return out


def rank_main(rank: int, world: int, cfg: dict) -> str:
    import torch

    from dmacoll import Communicator, Options
    from dmacoll.lab_api import get
    from dmacoll_lab.verify.reference import DTYPES as TORCH_DTYPES, draw, mismatch, poison

    spec = get("all_to_all_v")
    cases = all_cases(world, cfg["seeds"], tuple(cfg["only"]))
    log = open(f"{cfg['progress']}.{rank}", "a", buffering=1)
    if cfg.get("no_empty_cache"):
        torch.cuda.empty_cache = lambda: None
    from dmacoll.lab_api import stream_engine
    original = stream_engine.StreamEngine.replay_recorded

    def replay_recorded(self, key, work, label, sync, *words):  # which prerecorded graphs are new, which again
        log.write(f"graph {'hit' if key in self._graphs else 'new'} {json.dumps(repr(key[2:]))}\n")
        if cfg.get("no_hits") and key in self._graphs:
            self._graphs.pop(key).reset()
        return original(self, key, work, label, sync, *words)
    stream_engine.StreamEngine.replay_recorded = replay_recorded
    kept = []
    comm = Communicator(heap_bytes=512 << 20, staging_bytes=64 << 20, timeout_s=15, backend=cfg["backend"],
                        options=Options(**cfg["options"]))
    sync = torch.cuda.synchronize if comm.device.type == "cuda" else (lambda: None)
    heap_in, heap_out = comm.empty(64 << 20, dtype=torch.uint8), comm.empty(64 << 20, dtype=torch.uint8)
    for i in range(cfg["start"], len(cases)):
        case = cases[i]
        log.write(f"start {i}\n")
        counts = counts_of(case, world)
        dtype = TORCH_DTYPES[case["dtype"]]
        inputs = [draw(spec, sum(counts[r]), dtype, 1009 * i + r) for r in range(world)]
        n_out = sum(row[rank] for row in counts)
        if case["buffers"] == "heap":
            size = dtype.itemsize
            inp = heap_in[: inputs[rank].numel() * size].view(dtype)
            out = heap_out[: n_out * size].view(dtype)
        else:
            inp = torch.empty(inputs[rank].numel(), dtype=dtype, device=comm.device)
            out = torch.empty(n_out, dtype=dtype, device=comm.device)
            if cfg.get("keep_private"):
                kept.append((inp, out))
        inp.copy_(inputs[rank].to(comm.device))
        poison(spec, out)
        opts = {k: case[k] for k in ("variant", "direction") if case[k] != "auto"}
        try:
            comm.all_to_all_v(out, inp, counts, **opts)
            sync()
            error = mismatch(spec, out.cpu(), inputs, rank, counts, "CPU reference")
        except Exception as e:  # noqa: BLE001 - recorded, then this launch ends (the communicator may be unusable)
            import traceback
            said = {"error": f"{type(e).__name__}: {e}"[:1500], "trace": traceback.format_exc()[-3000:]}
            log.write(f"raised {i} {json.dumps(said)}\n")
            raise
        last = comm.last_options
        ran = {k: getattr(last, k) for k in ("variant", "direction", "signal", "wait", "prerecord", "submit")}
        log.write(f"{'ok' if error is None else 'wrong'} {i} {json.dumps({'ran': ran, 'error': error})}\n")
    comm.close()
    return "done"


def child(cfg: dict) -> None:
    from dmacoll_lab.verify.launch import run_ranks

    run_ranks(rank_main, cfg["world"], cfg, device="cpu" if cfg["backend"] == "host" else "cuda",
              timeout_s=cfg["deadline_s"])


def read_progress(path: str, world: int) -> dict[int, dict]:
    """Per rank: the last case started and what each case ended with."""
    out = {}
    for r in range(world):
        started, ended = -1, {}
        p = Path(f"{path}.{r}")
        for line in p.read_text().splitlines() if p.exists() else []:
            word, i, *rest = line.split(" ", 2)
            if word == "graph":
                continue
            if word == "start":
                started = int(i)
            else:
                ended[int(i)] = (word, json.loads(rest[0]) if rest else {})
        out[r] = {"started": started, "ended": ended}
    return out


COLUMNS = ["case", "splits", "variant", "direction", "buffers", "dtype", "world", "result", "ranks", "ran_variant",
           "ran_direction", "signal", "wait", "prerecord", "submit", "error"]
RESULTS = ("crash", "hang", "raised", "wrong", "ok")  # worst first


def tidy(rows, world: int) -> list[dict]:
    """A row per case: the worst result over the ranks (a case a rank never ended is 'crash' or 'hang'), the ranks
    that had it, the options the call ran with (from a rank that ended it) and the first error."""
    out = []
    for row in sorted(rows, key=lambda r: r["case"]):
        ranks = row["ranks"]
        worst = min((v["result"] for v in ranks.values()), key=RESULTS.index)
        ran = next((v["ran"] for v in ranks.values() if v.get("ran")), {})
        error = next((v.get("error") for v in ranks.values() if v.get("error")), "") or ""
        out.append({**{k: row[k] for k in ("case", "splits", "variant", "direction", "buffers", "dtype")},
                    "world": world, "result": worst,
                    "ranks": " ".join(str(r) for r, v in sorted(ranks.items()) if v["result"] == worst),
                    "ran_variant": ran.get("variant", ""), "ran_direction": ran.get("direction", ""),
                    **{k: ran.get(k, "") for k in ("signal", "wait", "prerecord", "submit")},
                    "error": error.splitlines()[0][:300] if error else ""})
    return out


def in_flight(state: dict[int, dict], start: int) -> tuple[int, bool]:
    """(the case a rank died or hung in, True), or (the last case started, False) when every rank ended its cases:
    the lowest case started and not ended (a rank that moves no data in a case can run ahead of a dead peer)."""
    stuck = [s["started"] for s in state.values() if s["started"] >= 0 and s["started"] not in s["ended"]]
    if stuck:
        return min(stuck), True
    return max([start - 1, *(s["started"] for s in state.values())]), False


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--out", required=True)
    ap.add_argument("--options", nargs="*", default=[])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--backend", default="cuda", choices=("cuda", "host"))
    ap.add_argument("--only", nargs="*", default=[], help="split patterns to run (default: all)")
    ap.add_argument("--keep-private", action="store_true", help="keep every private tensor alive (no address reuse)")
    ap.add_argument("--no-empty-cache", action="store_true", help="torch.cuda.empty_cache does nothing")
    ap.add_argument("--no-hits", action="store_true", help="a prerecorded graph is recorded again at every call")
    ap.add_argument("--table", action="store_true", help="write <out>/data.csv and data.json on the host backend too")
    ap.add_argument("--stall-s", type=float, default=45.0)
    ap.add_argument("--budget-s", type=float, default=240.0)
    ap.add_argument("--child", help=argparse.SUPPRESS)


def run(a: argparse.Namespace) -> int:
    """The crash map (module docstring): launches, each from the case after the last one that ended, until every case
    ran or the budget is spent."""
    if a.child:
        child(json.loads(a.child))
        return 0
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    progress = str(out) + ".progress"
    cases = all_cases(a.world, a.seeds, tuple(a.only))
    # what every launch runs, and what the table's sidecar records
    settings = dict(world=a.world, options=parse_options(a.options), seeds=a.seeds, only=a.only,
                    keep_private=a.keep_private, no_empty_cache=a.no_empty_cache, no_hits=a.no_hits)
    rows: dict[int, dict] = {}
    start, t0 = 0, time.monotonic()
    env = {**os.environ, "PYTHONFAULTHANDLER": "1", "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")]))}
    with open(f"{out}.log", "a") as logf:
        while start < len(cases) and time.monotonic() - t0 < a.budget_s:
            for r in range(a.world):
                p = Path(f"{progress}.{r}")
                if p.exists():
                    p.rename(f"{progress}.{r}.from{start}")
            cfg = dict(settings, backend=a.backend, start=start, progress=progress,
                       deadline_s=max(30.0, a.budget_s - (time.monotonic() - t0)))
            logf.write(f"=== launch from case {start}: {cases[start]}\n")
            logf.flush()
            proc = subprocess.Popen([sys.executable, "-m", CHILD, "--out", a.out, "--child", json.dumps(cfg)],
                                    stdout=logf, stderr=subprocess.STDOUT, env=env, start_new_session=True)
            last_change, seen, how = time.monotonic(), None, "exit"
            while proc.poll() is None:
                time.sleep(0.5)
                state = read_progress(progress, a.world)
                mark = tuple((s["started"], len(s["ended"])) for s in state.values())
                if mark != seen:
                    seen, last_change = mark, time.monotonic()
                elif time.monotonic() - last_change > a.stall_s or time.monotonic() - t0 > a.budget_s:
                    how = "hang"
                    os.killpg(proc.pid, 9)
                    proc.wait()
            state = read_progress(progress, a.world)
            for r, s in state.items():
                for i, (word, detail) in s["ended"].items():
                    rows.setdefault(i, {"case": i, **cases[i], "ranks": {}})["ranks"][r] = {"result": word, **detail}
            inflight, stuck = in_flight(state, start)
            if stuck:
                row = rows.setdefault(inflight, {"case": inflight, **cases[inflight], "ranks": {}})
                for r, s in state.items():
                    if inflight not in s["ended"] and s["started"] >= inflight:
                        row["ranks"][r] = {"result": "crash" if how == "exit" else "hang",
                                           "exit": proc.returncode}
            logf.write(f"=== launch ended ({how}, exit {proc.returncode}) at case {inflight}\n")
            logf.flush()
            start = inflight + 1 if proc.returncode != 0 or how == "hang" else len(cases)
    with open(f"{out}.jsonl", "w") as f:
        for i in sorted(rows):
            f.write(json.dumps(rows[i]) + "\n")
    table = tidy(rows.values(), a.world)
    if a.backend == "cuda" or a.table:  # the experiment's table and its provenance sidecar (run.log beside them)
        from dmacoll_lab.bench import harness

        harness.write(out.parent / out.name / "data.csv", table, COLUMNS,
                      {**settings, "tuning_table": os.environ.get("DMACOLL_TUNING", ""), "count": COUNT})
    tally: dict[str, int] = {}
    for row in table:
        tally[row["result"]] = tally.get(row["result"], 0) + 1
    print(f"{a.out}: {len(rows)} of {len(cases)} cases ran in {time.monotonic() - t0:.0f} s: {tally}", flush=True)
    for row in rows.values():
        bad = {r: v for r, v in row["ranks"].items() if v["result"] != "ok"}
        if bad:
            print(f"  case {row['case']} {row['splits']} {row['variant']}/{row['direction']} {row['buffers']} "
                  f"{row['dtype']}: {json.dumps(bad)[:400]}", flush=True)
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(ap)
    return run(ap.parse_args(argv))


if __name__ == "__main__":  # a launch's child (``run``)
    sys.exit(main())
