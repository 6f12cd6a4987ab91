"""`dmacoll e2e`'s schedules on a CPU: the micro-batch split, seqpar's token layout, the calls each schedule must
issue and the check that catches a dropped, added, resized or reordered collective, the no-communication
stand-in, the whole runner (every schedule, its compute and communication alone, the floors) on dmacoll's host
emulator, and old result tables read as the serial schedule. (Logits of every schedule at worlds 1, 2 and 4:
tests/test_e2e.py.)"""
import math

import pandas as pd
import pytest
import torch

from dmacoll import ops
from dmacoll.errors import InvalidArgument
from dmacoll_lab.analysis import load
from dmacoll_lab.e2e import calls as k
from dmacoll_lab.e2e import config as c
from dmacoll_lab.e2e.bench import run_e2e
from dmacoll_lab.e2e.collectives import Collectives, make
from dmacoll_lab.e2e.model import Model
from dmacoll_lab.e2e.schedule import NoComm, Schedule
from dmacoll_lab.verify.launch import run_ranks
from test_e2e import synthetic_rows, tiny


# -- pure layout -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("batch,length,parts", [
    (3, 8, [(0, 2, 0, 8), (2, 3, 0, 8)]), (2, 5, [(0, 1, 0, 5), (1, 2, 0, 5)]),
    (1, 9, [(0, 1, 0, 5), (0, 1, 5, 9)]), (1, 1, [(0, 1, 0, 1)]), (4, 1, [(0, 2, 0, 1), (2, 4, 0, 1)])])
def test_micro_batches_split_sequences_else_one_prompt_by_tokens(batch, length, parts):
    got = k.split(batch, length)
    assert [(p.seq0, p.seq1, p.tok0, p.tok1) for p in got] == parts
    assert sum(p.tokens for p in got) == batch * length
    assert sum(k.logits_rows(p, length) for p in got) == batch  # every sequence's last token in exactly one part


@pytest.mark.parametrize("tokens,world,pieces", [(7, 2, 3), (24, 4, 3), (2048, 4, 4), (1, 8, 2), (129, 2, 1)])
def test_seqpar_rows_are_each_held_by_one_rank_and_pieces_gather_in_order(tokens, world, pieces):
    P, Tp = k.piece_rows(tokens, world, pieces), k.padded_tokens(tokens, world, pieces)
    assert Tp >= tokens and Tp - tokens < pieces * world and Tp == pieces * world * P
    # rank r's shard row i*P + j is global row i*w*P + r*P + j; the head's owner formula inverts it
    held = {(i * world * P + r * P + j): (r, i * P + j) for r in range(world) for i in range(pieces) for j in range(P)}
    assert sorted(held) == list(range(Tp))
    for g in range(Tp):
        assert (g % (world * P) // P, g // (world * P) * P + g % P) == held[g]
    # an all-gather of piece i concatenates every rank's rows of piece i: rows i*w*P .. (i+1)*w*P in order
    for i in range(pieces):
        order = [i * world * P + r * P + j for r in range(world) for j in range(P)]
        assert order == list(range(i * world * P, (i + 1) * world * P))


@pytest.mark.parametrize("moe", [False, True], ids=["llama", "mixtral"])
@pytest.mark.parametrize("world", [1, 2, 4])
def test_each_schedule_issues_serial_collectives_rewritten(moe, world):
    s = tiny(moe, layers=3)
    serial = k.expected_calls(s, world, "serial", 3, 7, 2)[0]
    # a prefill's expert exchange: the counts' all-gather, then all_to_all_v each way; a decode step's: padded
    per_layer = (1 + (4 if world > 1 else 0)) if moe else 2
    assert len(serial) == 1 + 3 * per_layer + 1 and serial[0].site == "embed" and serial[-1].site == "logits"
    step = k.expected_calls(s, world, "serial", 3, 1, 2, decode=True)[0]
    assert len(step) == 1 + 3 * ((1 + (3 if world > 1 else 0)) if moe else 2) + 1
    if moe and world > 1:
        assert [e.op for e in serial if e.site.endswith("0") and e.site != "attn0"] == [
            "all_gather", "all_to_all_v", "all_to_all_v", "all_gather"]
        assert serial[2] == k.Expected("counts0", "all_gather", world * world)
        assert [e.op for e in step if e.site in ("dispatch0", "combine0")] == ["all_to_all", "all_to_all"]
    micro = k.expected_calls(s, world, "microbatch", 3, 7, 2)
    assert micro == {0: k.serial_calls(s, world, 14, 2, uneven=True), 1: k.serial_calls(s, world, 7, 1, uneven=True)}
    one = k.expected_calls(s, world, "microbatch", 1, 7, 2)  # a prompt split by tokens: only the second has logits
    assert one[0] == k.serial_calls(s, world, 4, 0, uneven=True) and one[0][-1].site != "logits" \
        and one[1][-1].site == "logits"
    assert k.expected_calls(s, world, "seqpar", 3, 1, 2, decode=True) == \
        k.expected_calls(s, world, "serial", 3, 1, 2, decode=True)  # decode: seqpar is a prefill schedule
    seq = k.expected_calls(s, world, "seqpar", 3, 7, 2)[0]
    ops = pd.Series([(e.site.split(".")[0], e.op) for e in seq]).value_counts()
    T, H = 21, s.hidden
    Tp, P = k.padded_tokens(T, world, 2), k.piece_rows(T, world, 2)
    for e in seq:  # every serial all-reduce of T x H became pieces that move the same (padded) rows
        if e.op == "reduce_scatter":
            assert e.numel == P * H
        if e.op == "all_gather" and e.site != "logits" and not e.site.startswith("counts"):
            assert e.numel == world * P * H
    blocks = 3 * (1 if moe else 2)
    assert ops[("embed", "reduce_scatter")] == 2 and sum(v for (site, op), v in ops.items()
                                                         if op == "reduce_scatter") == 2 * (1 + blocks)
    assert sum(v for (site, op), v in ops.items() if op == "all_gather" and site != "logits"
               and not site.startswith("counts")) == 2 * blocks
    assert sum(v for (site, op), v in ops.items() if site.startswith("counts")) == (3 if moe and world > 1 else 0)
    assert [e.op for e in seq[-2:]] == ["all_reduce", "all_gather"] and seq[-2].numel == 3 * H
    if not moe:  # an MLP pipelines: gather 0, gather 1, scatter 0, scatter 1
        mlp = [e.op for e in seq if e.site.startswith("mlp0")]
        assert mlp == ["all_gather", "all_gather", "reduce_scatter", "reduce_scatter"]


def _recorded(seed: int, schedule: str, batch: int = 3, length: int = 7, drop=None):
    """A world-1 prefill's logits and recorded calls (``drop``: a call the schedule skips)."""
    s = tiny(False)
    m = Model(s, 0, 1, "cpu", torch.float32, seed=seed)
    coll = make("none", "cpu", k.schedule_buffers(s, 1, batch * length, batch, schedule, 2), torch.float32)
    sched = Schedule(schedule, 2, log=[])
    if drop:
        issue = sched._issue

        def skipping(coll_, call, main, side):
            if (call.mb, call.site) == drop:
                from dmacoll_lab.e2e.steps import Handle
                return Handle(call)  # never issued, never recorded
            return issue(coll_, call, main, side)
        sched._issue = skipping
    ids = torch.randint(0, s.vocab, (batch, length), generator=torch.Generator().manual_seed(seed))
    logits = sched.prefill(m, coll, ids, m.new_cache(batch, length), 0)
    return logits, [c.record() for c in sched.log], k.expected_calls(s, 1, schedule, batch, length, 2)


def test_the_calls_check_catches_a_dropped_added_resized_or_reordered_collective(seed):
    _, rec, want = _recorded(seed, "microbatch")
    assert k.check_calls(rec, want) == ""
    assert [r[0] for r in rec[:4]] == [0, 1, 0, 1]  # interleaved: each micro-batch's collective under the other
    mb1 = [i for i, r in enumerate(rec) if r[0] == 1]
    assert "micro-batch 1 call 2: expected all_reduce at mlp0" in k.check_calls(rec[:mb1[2]] + rec[mb1[2] + 1:], want)
    assert "1 call(s) missing, first all_gather at logits" in k.check_calls(rec[:mb1[-1]] + rec[mb1[-1] + 1:], want)
    assert "extra" in k.check_calls(rec + [rec[-1]], want)
    swapped = list(rec)
    swapped[mb1[1]], swapped[mb1[2]] = swapped[mb1[2]], swapped[mb1[1]]
    assert "micro-batch 1 call 1: expected" in k.check_calls(swapped, want)
    resized = list(rec)
    resized[0] = (*rec[0][:3], rec[0][3] + 1)
    assert "call 0" in k.check_calls(resized, want)
    assert "micro-batch 1: 1 call(s) missing" in k.check_calls([(2, *r[1:]) if r is rec[-1] else r for r in rec], want)
    # the interleaving of the two micro-batches is free (every rank runs the same code, so the same order)
    assert k.check_calls(sorted(rec, key=lambda r: r[0]), want) == ""


def test_a_schedule_that_drops_a_collective_fails_where_one_rank_logits_cannot_tell(seed):
    ref, _, _ = _recorded(seed, "serial")
    logits, rec, want = _recorded(seed, "microbatch", drop=(1, "mlp1"))
    # at world 1 an all-reduce changes nothing...
    assert torch.allclose(logits, ref, atol=1e-5), f"seed {seed}: {(logits - ref).abs().max()}"
    assert "micro-batch 1" in k.check_calls(rec, want) and "mlp1" in k.check_calls(rec, want)  # ...the check sees it


def test_schedule_names_and_pieces_are_checked():
    k.check_schedules(["serial", "seqpar"], 4)
    for bad, msg in ((["async"], "unknown"), ([], "unknown"), (["serial", "serial"], "twice")):
        with pytest.raises(ValueError, match=msg):
            k.check_schedules(bad, 2)
    with pytest.raises(ValueError, match="pieces"):
        k.check_schedules(["seqpar"], 0)
    s = tiny(False)
    m = Model(s, 0, 1, "cpu", torch.float32)
    coll = make("none", "cpu", k.schedule_buffers(s, 1, 8, 2, "serial", 1), torch.float32)
    with pytest.raises(ValueError, match="prefill only"):
        Schedule("seqpar").decode(m, coll, torch.zeros(2, dtype=torch.long), torch.zeros(1, dtype=torch.long),
                                  m.new_cache(2, 4))


def test_no_comm_keeps_the_buffers_and_moves_nothing():
    coll = make("none", "cpu", {"reduce": 8, "logits": 8}, torch.float32)
    quiet = NoComm(coll)
    assert quiet.buffer("reduce", 2, 4).data_ptr() == coll.buffer("reduce", 8).data_ptr()
    x = quiet.buffer("logits", 8).fill_(3.0)
    y = quiet.buffer("reduce", 8).fill_(1.0)
    for op in ops.names():  # every collective of the registry, in place (no input) and not
        for out in (quiet.collective(op, x), quiet.collective(op, x, y)):
            assert out.data_ptr() == x.data_ptr() and torch.equal(x, torch.full((8,), 3.0)), op
    with pytest.raises(InvalidArgument, match="unknown collective 'broadcast'"):
        quiet.collective("broadcast", x)


class _Recording(Collectives):
    """World-1 collectives that note whether each call came overlapped."""

    def __init__(self):
        super().__init__(torch.device("cpu"))
        self.seen: list[tuple[str, bool]] = []

    def collective(self, op, out, x=None, overlapped=False, counts=None):
        self.seen.append((op, overlapped))
        return super().collective(op, out, x)


@pytest.mark.parametrize("schedule", ["serial", "microbatch", "seqpar"])
def test_a_schedule_marks_its_calls_overlapped_except_serial_and_replays_them_so(schedule, seed):
    """An overlapped schedule's calls reach the collectives as overlapped (where dmacoll takes its overlap path), in
    line on the host too, and the communication-alone replay takes them the same way; serial's never are."""
    from dmacoll_lab.e2e.schedule import replay

    m = Model(tiny(False), 0, 1, torch.device("cpu"), torch.float32, seed=seed)
    tokens = torch.randint(0, m.spec.vocab, (2, 6), generator=torch.Generator().manual_seed(seed))
    coll = _Recording()
    coll.reserve(k.schedule_buffers(m.spec, 1, 12, 2, schedule, 2), torch.float32)
    sched = Schedule(schedule, 2)
    sched.log = []
    sched.prefill(m, coll, tokens, m.new_cache(2, 8))
    assert coll.seen and {o for _, o in coll.seen} == {schedule != "serial"}, f"seed {seed}: {coll.seen}"
    coll.seen.clear()
    replay(coll, sched.log)
    assert {o for _, o in coll.seen} == {schedule != "serial"}


def test_dmacolls_overlapped_calls_take_the_overlap_path_and_the_others_the_default():
    """DmaCollectives hands an overlapped call its ``overlap_path`` ('dma': the copy engines) and every other call
    no path (the communicator's 'auto'); with overlap_path 'auto' no call names a path."""
    from collections import Counter

    from dmacoll_lab.e2e.collectives import DmaCollectives

    class Comm:
        def __init__(self):
            self.calls = []
            self.last_options = type("O", (), {"path": "sm"})()

        def collective(self, op, out, x=None, **options):
            self.calls.append((op, options))

    for overlap_path, want in (("dma", {"path": "dma"}), ("auto", {})):
        d = DmaCollectives.__new__(DmaCollectives)  # the forwarding alone: no process group, no heap
        d.comm, d.paths, d.overlap_path = Comm(), Counter(), overlap_path
        y = torch.zeros(4)
        d.collective("all_reduce", y)
        d.collective("all_reduce", y, overlapped=True)
        assert d.comm.calls == [("all_reduce", {}), ("all_reduce", want)], overlap_path


# -- the runner on the host emulator ---------------------------------------------------------------------------
def _run(world: int, impls):
    cfg = {**c.DEFAULTS, "models": [tiny(True)], "batches": [1, 3], "prompts": [5], "decode_steps": 2,
           "repeats": 2, "chunk_tokens": 16, "impls": impls, "pieces": 2}
    return pd.DataFrame(run_ranks(run_e2e, world, cfg, timeout_s=300)[0])


@pytest.mark.parametrize("world,impls", [(1, ["nccl"]), (2, ["nccl", "dma"])])
def test_the_runner_measures_every_schedule_and_where_the_time_goes(world, impls):
    df = _run(world, impls)
    assert list(df.columns) == c.E2E_COLUMNS and len(df) == 2 * len(impls) * 4
    phased, df = df[df["schedule"] == "phased"], df[df["schedule"] != "phased"]  # one per (point, impl)
    n = len(impls) * 3  # every other point measures its variants in reverse order
    assert df.groupby("batch")["measured_order"].apply(list).tolist() == [list(range(n)), list(range(n))[::-1]]
    for _, row in phased.iterrows():
        same = df[(df["impl"] == row["impl"]) & (df["batch"] == row["batch"])].set_index("schedule")
        assert row["decode_ms"] == same.loc["serial", "decode_ms"] and row["decode_schedule"] == "serial"
        assert row["ttft_ms"] == same.loc[row["prefill_schedule"], "ttft_ms"] <= same.loc["serial", "ttft_ms"]
        assert row["phase_reason"].startswith(f"prefill {row['prefill_schedule']}: ") and row["data_paths"] == ""
    ours = df["impl"] == "dma"  # the data path of every op its calls took (the host emulator's: the copy engines')
    assert df[~ours]["data_paths"].eq("").all()
    assert df[ours]["data_paths"].map(lambda p: "all_to_all_v dma x" in p and "all_reduce dma x" in p).all()
    assert (df["status"] == "ok").all() and df["calls_ok"].all(), df[["schedule", "calls_ok", "status"]]
    checked = df[df["logits_ok"] != ""]
    assert len(checked) == len(df) - 2 and checked["logits_ok"].all()  # all but the reference (nccl serial)
    assert (checked["check_max_abs_diff"] < 1e-4).all() and (checked["argmax_agree"] == 1).all()
    seq = df["schedule"] == "seqpar"
    assert df[seq]["decode_ms"].isna().all() and df[~seq]["decode_ms"].gt(0).all()
    assert set(df[seq]["pieces"]) == {2} and set(df[~seq]["pieces"]) == {1}
    micro = df[df["schedule"] == "microbatch"]
    assert list(micro["microbatches"]) == [1] * len(impls) + [2] * len(impls)  # a decode step of batch 1 cannot split
    for col in ("ttft_compute_ms", "ttft_comm_ms", "ttft_ideal_speedup", "ttft_fraction_of_ideal_raw",
                "prefill_floor_ms", "prefill_compute_over_floor", "copy_GBps", "gemm_TFLOPs"):
        assert df[col].map(math.isfinite).all(), col
    for col in ("decode_compute_ms", "decode_comm_ms", "decode_fraction_of_ideal", "decode_compute_over_floor"):
        assert df[~seq][col].map(math.isfinite).all() and df[seq][col].isna().all(), col
    assert (df["ttft_fraction_of_ideal"] <= 1).all() and (df["ttft_ideal_speedup"] >= 1).all()
    per_forward = df[(df["schedule"] == "serial")]["decode_calls"]
    assert set(per_forward) == {1 + (4 if world > 1 else 1) * 2 + 1}  # embedding, 2 MoE layers, logits


def test_old_tables_read_as_the_serial_schedule(tmp_path):
    new = pd.DataFrame(synthetic_rows(schedules=("serial", "microbatch")))
    old = new[new["schedule"] == "serial"].drop(columns=["schedule", "pieces", "microbatches", "calls_ok"])
    (tmp_path / "old.csv").write_text(old.to_csv(index=False))
    (tmp_path / "new.csv").write_text(new.to_csv(index=False))
    df = load.read("e2e", [tmp_path / "old.csv", tmp_path / "new.csv"])
    assert set(df[df["source"].str.endswith("old.csv")]["schedule"]) == {"serial"}
    assert set(df["schedule"]) == {"serial", "microbatch"} and df["pieces"].notna().all()
    from dmacoll_lab.analysis import tables
    assert len(tables.e2e_ratios(df)) == 24  # the serial points, both files' rows pivoted together


def _timed(schedule: str, ttft: float, compute: float, comm: float) -> dict:
    return {"schedule": schedule, "ttft_ms": ttft, "ttft_compute_ms": compute, "ttft_comm_ms": comm}


def test_a_prefill_overlaps_only_where_its_breakdown_predicts_a_gain_and_its_ttft_shows_it():
    from dmacoll_lab.e2e.phases import MARGIN, choose_prefill

    serial = _timed("serial", 100.0, 80.0, 20.0)
    wins, loses = _timed("microbatch", 90.0, 84.0, 21.0), _timed("seqpar", 101.0, 85.0, 20.0)
    row, why = choose_prefill(serial, [loses, wins])
    assert row is wins and why.startswith("microbatch: ") and "measured 101.00 >= 100.00" in why
    # the split costs what the overlap could hide: not taken although its one measured TTFT came out lower
    costly = _timed("microbatch", 99.0, 100.0 - MARGIN * 100 + 0.5, 20.0)
    row, why = choose_prefill(serial, [costly])
    assert row is serial and "would hide at most" in why
    # predicted, but the measured TTFT does not show it (interference of the overlapped collectives)
    row, why = choose_prefill(serial, [_timed("microbatch", 100.5, 81.0, 20.0)])
    assert row is serial and "predicted to hide" in why
    # the faster of two that both win
    fast, faster = _timed("microbatch", 92.0, 81.0, 20.0), _timed("seqpar", 88.0, 82.0, 20.0)
    assert choose_prefill(serial, [fast, faster])[0] is faster
    # no breakdown (--no-breakdown), or a candidate that did not run
    assert choose_prefill(_timed("serial", 100.0, float("nan"), float("nan")), [wins])[0]["schedule"] == "serial"
    assert choose_prefill(serial, [_timed("microbatch", float("nan"), 1.0, 1.0)]) == (serial,
                                                                                     "serial: microbatch not measured")
