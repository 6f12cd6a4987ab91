"""`dmacoll probe crossing` without a GPU: the pair matrix, each side's schedule, the rows and their derived
quantities, the parent's handling of its processes, the kernels' source, and the sides' real driver calls recorded
by a fake driver and executed on CPU memory by an emulator (every send x wait, random interleavings of the two
streams; a schedule that consumes before it waits is caught)."""
import contextlib
import csv
import ctypes
import json
import queue
import random
import re
import sys
import threading
import time
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from dmacoll_lab.analysis import docs, tables
from dmacoll_lab.bench.probes import crossing, crossing_device, crossing_launch, crossing_legs
from dmacoll_lab.bench.probes.crossing_legs import Measured, Pair
from dmacoll_lab.cli import main

LEGS = 8
CFG = {"legs": LEGS, "bytes": 64, "repeats": 5, "wait_timeout_ms": 20.0}
OK, WRONG, TIMED_OUT = 1, 2, 3


# -- the pairs and the schedules --------------------------------------------------------------------------------------
def test_the_pair_matrix_has_every_send_wait_mode_but_host_waits_in_graphs():
    pairs = crossing_legs.pair_matrix(crossing.SENDS, crossing.WAITS, crossing.MODES)
    assert len(pairs) == 3 * 4 + 3 * 3 and len(set(pairs)) == len(pairs)
    assert {p.wait for p in pairs if p.mode == "graph"} == {"memop", "spin", "fold"}
    assert {(p.send, p.wait) for p in pairs if p.mode == "eager"} == {(s, w) for s in crossing.SENDS
                                                                       for w in crossing.WAITS}
    assert pairs[0] == Pair("eager", "memop", "memop") and pairs[-1] == Pair("graph", "kernel", "fold")
    assert crossing_legs.pair_matrix(["copy"], ["host"], ["graph"]) == []
    assert crossing_legs.pair_matrix(["copy"], ["host", "spin"], ["graph", "eager"]) == [
        Pair("graph", "copy", "spin"), Pair("eager", "copy", "host"), Pair("eager", "copy", "spin")]


def test_each_side_queues_its_legs_in_order():
    assert crossing_legs.half(0, "memop", 4) == [("copy", 0), ("signal", 0), ("wait", 1), ("consume", 1),
                                            ("copy", 2), ("signal", 2), ("wait", 3), ("consume", 3)]
    assert crossing_legs.half(1, "fold", 4) == [("consume", 0), ("copy", 1), ("signal", 1), ("consume", 2),
                                           ("copy", 3), ("signal", 3)]
    assert crossing_legs.half(1, "spin", 2) == [("wait", 0), ("consume", 0), ("copy", 1), ("signal", 1)]
    for wait in ("memop", "spin", "fold"):
        for legs in (2, 6, crossing.MAX_LEGS):
            ops = crossing_legs.half(0, wait, legs) + crossing_legs.half(1, wait, legs)
            assert sorted(leg for op, leg in ops if op == "consume") == list(range(legs))  # each leg consumed once
            assert sorted(leg for op, leg in ops if op == "copy") == list(range(legs))
            assert crossing_legs.half(0, wait, legs)[-1] == ("consume", legs - 1)  # side 0's events time every leg


def test_the_host_polls_for_the_legs_its_sides_receive():
    assert crossing_legs.host_legs({0: None, 1: None}, 4) == [0, 1, 2, 3]
    assert crossing_legs.host_legs((0,), 4) == [1, 3] and crossing_legs.host_legs((1,), 4) == [0, 2]
    assert [crossing_legs.sender(i) for i in range(4)] == [0, 1, 0, 1]
    assert [crossing_legs.receiver(i) for i in range(4)] == [1, 0, 1, 0]


def test_counts_are_over_the_legs_a_side_received():
    status = [1, 2, 3, 0, 7, 1]  # an unknown word counts as wrong
    assert crossing_legs.counts(status, 1, 6) == {"missing": 0, "ok": 1, "wrong": 1, "timeout": 1}  # legs 0, 2, 4
    assert crossing_legs.counts(status, 0, 6) == {"missing": 1, "ok": 1, "wrong": 1, "timeout": 0}  # legs 1, 3, 5
    assert crossing_legs.counts(status, None, 6) == {"missing": 1, "ok": 2, "wrong": 2, "timeout": 1}


# -- rows -------------------------------------------------------------------------------------------------------------
def ok_counts(runs: int, legs: int = LEGS) -> dict:
    return {"missing": 0, "ok": legs * runs, "wrong": 0, "timeout": 0}


def test_a_pair_row_is_its_leg_time_over_the_baseline():
    base = Measured([800.0, 820.0, 810.0], ok_counts(4), 4, "")
    m = Measured([1600.0, 1200.0, 1400.0], ok_counts(4), 4, "")
    r = crossing.pair_row("streams", Pair("eager", "copy", "spin"), LEGS, 64, m, base)
    assert list(r) == crossing.COLUMNS
    assert (r["leg_us"], r["leg_us_min"], r["leg_us_max"]) == (175.0, 150.0, 200.0)
    assert r["base_leg_us"] == 101.25 and r["crossing_us"] == 175.0 - 101.25
    assert r["correct"] is True and r["timeouts"] == 0 and r["note"] == ""
    b = crossing.pair_row("streams", crossing_legs.baseline("eager"), LEGS, 64, base, None)
    assert (b["send"], b["wait"], b["leg_us"], b["base_leg_us"], b["crossing_us"]) == ("none", "none", 101.25,
                                                                                       101.25, "")


def test_a_pair_without_times_or_with_bad_legs_says_so():
    base = Measured([800.0], ok_counts(2), 2, "")
    refused = Measured([], {}, 0, "memop send refused: error 801")
    r = crossing.pair_row("peer", Pair("graph", "memop", "fold"), LEGS, 64, refused, base)
    assert (r["leg_us"], r["crossing_us"], r["correct"], r["note"]) == ("", "", False, refused.note)
    timed_out = Measured([], {"missing": 0, "ok": LEGS - 3, "wrong": 0, "timeout": 3}, 1, "waits timed out")
    r = crossing.pair_row("ipc", Pair("eager", "kernel", "spin"), LEGS, 64, timed_out, base)
    assert (r["correct"], r["timeouts"], r["leg_us"]) == (False, 3, "")
    wrong = Measured([900.0], {"missing": 0, "ok": 2 * LEGS - 1, "wrong": 1, "timeout": 0}, 2, "")
    r = crossing.pair_row("ipc", Pair("eager", "kernel", "memop"), LEGS, 64, wrong, base)
    assert r["correct"] is False and r["crossing_us"] == pytest.approx(900 / LEGS - 100)
    short = Measured([900.0], {"missing": 0, "ok": LEGS, "wrong": 0, "timeout": 0}, 2, "")  # a run's legs missing
    assert crossing.pair_row("ipc", Pair("eager", "copy", "memop"), LEGS, 64, short, base)["correct"] is False
    no_base = crossing.pair_row("ipc", Pair("eager", "copy", "memop"), LEGS, 64, short, None)
    assert no_base["crossing_us"] == "" and no_base["base_leg_us"] == ""


def test_the_two_processes_of_a_pair_merge_into_one():
    side0 = Measured([1000.0, 1100.0], {"missing": 0, "ok": 12, "wrong": 0, "timeout": 0}, 3, "")
    side1 = Measured([], {"missing": 0, "ok": 11, "wrong": 0, "timeout": 1}, 3, "waits timed out")
    m = crossing_legs.merge([side0, side1])
    assert m == Measured([1000.0, 1100.0], {"missing": 0, "ok": 23, "wrong": 0, "timeout": 1}, 3, "waits timed out")
    assert crossing_legs.merge([side1, side1]).note == "waits timed out"


def test_a_placement_has_a_baseline_row_per_mode_and_a_row_per_pair():
    pairs = crossing_legs.pair_matrix(crossing.SENDS, crossing.WAITS, crossing.MODES)
    got = {crossing_legs.baseline("eager"): Measured([800.0], ok_counts(2), 2, ""),
           pairs[0]: Measured([1000.0], ok_counts(2), 2, "")}
    rows = crossing.placement_rows("ipc", pairs, LEGS, 64, got, stopped="process 1 exited with code -9")
    assert len(rows) == 2 + 21
    assert [(r["mode"], r["send"]) for r in rows[:2]] == [("eager", "none"), ("graph", "none")]
    assert rows[2]["crossing_us"] == 25.0 and rows[2]["correct"] is True
    assert rows[1]["note"] == rows[3]["note"] == "not measured: process 1 exited with code -9"
    assert all(list(r) == crossing.COLUMNS for r in rows)
    assert crossing.summary_line(rows[2]).split() == ["ipc", "eager", "memop", "->", "memop", "crossing", "25.00",
                                                      "us", "leg", "125.00", "us"]
    assert "no times" in crossing.summary_line(rows[3]) and "WRONG" in crossing.summary_line(rows[3])


# -- the parent and its processes -------------------------------------------------------------------------------------
def test_the_processes_of_each_placement():
    assert crossing_launch.processes("ipc") == [(0,), (1,)] and crossing_launch.processes("streams") == [(0, 1)]
    assert crossing_launch.devices("peer") == (0, 1) and crossing_launch.devices("ipc") == (0, 0)
    pairs = crossing_legs.pair_matrix(["memop"], ["memop", "host"], ["graph", "eager"])
    assert crossing_launch.order(pairs) == [crossing_legs.baseline("graph"), Pair("graph", "memop", "memop"),
                                            crossing_legs.baseline("eager"), Pair("eager", "memop", "memop"),
                                            Pair("eager", "memop", "host")]
    assert crossing_launch.reports_expected("ipc", pairs[0]) == 2
    assert crossing_launch.reports_expected("ipc", crossing_legs.baseline("eager")) == 1
    assert crossing_launch.reports_expected("peer", pairs[0]) == 1
    # every run may take its deadline (all waits timing out twice), and the parent waits longer than that
    assert crossing_device.run_deadline_s(CFG) == pytest.approx(2 * LEGS * 0.02 + 10)
    assert crossing_launch.pair_deadline_s(CFG) > (CFG["repeats"] + 1) * crossing_device.run_deadline_s(CFG)


class FakeProc:
    def __init__(self, exitcode=None):
        self.exitcode, self.killed = exitcode, False

    def join(self, timeout=None):
        pass

    def is_alive(self):
        return self.exitcode is None and not self.killed

    def kill(self):
        self.killed = True


def test_the_parent_keeps_what_was_reported_and_stops_on_a_failure(capsys):
    p, m = Pair("eager", "copy", "memop"), Measured([1.0], ok_counts(1), 1, "")
    q = queue.Queue()
    for msg in (("pair", 0, p, m), ("pair", 1, p, m), ("done", 1, None, None), ("done", 0, None, None)):
        q.put(msg)
    assert crossing_launch.collect([FakeProc(), FakeProc()], q, 60) == ({p: [m, m]}, "")
    q.put(("pair", 0, p, m))
    q.put(("fatal", 1, None, "Stuck: sides [1] did not finish\nTraceback ..."))
    procs = [FakeProc(), FakeProc()]
    assert crossing_launch.collect(procs, q, 60) == ({p: [m]}, "Stuck: sides [1] did not finish")
    assert all(x.killed for x in procs)  # the other process is stopped too
    assert "process 1: Stuck" in capsys.readouterr().err
    reports, stopped = crossing_launch.collect([FakeProc(), FakeProc(exitcode=-9)], queue.Queue(), 60)
    assert (reports, stopped) == ({}, "process 1 exited with code -9")


def test_processes_agree_only_when_both_say_yes():
    page = SimpleNamespace(words=torch.zeros(128, dtype=torch.int32).numpy())
    barrier = threading.Barrier(2)
    got = {}

    def vote(me, answers):
        link = crossing_device.Link(barrier, page, me, timeout_s=10)
        got[me] = [link.agree(a) for a in answers]

    threads = [threading.Thread(target=vote, args=(0, [True, True, False])),
               threading.Thread(target=vote, args=(1, [True, False, False]))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == {0: [True, False, False], 1: [True, False, False]}
    assert crossing_device.Link(None, page, 0, 1).agree(False) is False  # one process: its own answer


def test_peer_needs_two_gpus_before_any_process_starts(monkeypatch, capsys):
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(crossing, "driver", lambda: None)
    monkeypatch.setattr(crossing_launch, "measure_placement", lambda *a: pytest.fail("a process started"))
    assert main(["probe", "crossing", "--placements", "streams", "peer"]) == 2
    assert capsys.readouterr().err == "dmacoll probe: crossing --placements peer needs 2 CUDA GPUs, found 1\n"


# -- the kernels ------------------------------------------------------------------------------------------------------
def test_the_source_defines_every_kernel_launched_with_its_arguments():
    src = crossing_device.SOURCE
    found = {m.group(1): [a.strip() for a in m.group(2).split(",")]
             for m in re.finditer(r'extern "C" __global__ void (\w+)\(([^)]*)\)', src)}
    assert set(found) == set(crossing_device.KERNELS)
    for name, (threads, types) in crossing_device.KERNELS.items():
        assert len(found[name]) == len(types), name
        assert ["*" in a for a in found[name]] == [t is ctypes.c_void_p for t in types], name
        assert all(("long long" in a) == (t is ctypes.c_ulonglong) for a, t in zip(found[name], types)), name
    for needed in ("ld.acquire.sys", "%%globaltimer", "__threadfence_system()", "volatile unsigned int*)flag",
                   "__syncthreads_and"):
        assert needed in src, needed
    codes = dict(re.findall(r"#define (\w+) (\d+)", src))
    assert {int(v): k for k, v in codes.items()} == {1: "OK", 2: "WRONG", 3: "TIMED_OUT"}
    assert {int(v): crossing_legs.STATUS[int(v)] for v in codes.values()} == {1: "ok", 2: "wrong", 3: "timeout"}


def test_kernel_arguments_are_packed_once(monkeypatch):
    monkeypatch.setattr(crossing_device, "driver", lambda: FakeDriver())
    k = crossing_device.Kernel("consume", 256, crossing_device.KERNELS["consume"][1])
    args = (0x7F0012345678, 1024, 5 * 1024, 0x7F0000000010, 0, 6, 20_000_000)
    addr = k.params(args)
    assert k.params(args) == addr and k.params(args[:-1] + (1,)) != addr
    assert unpack("consume", addr) == args


# -- the sides' driver calls, executed on CPU memory ------------------------------------------------------------------
def unpack(name: str, params: int) -> tuple:
    types = crossing_device.KERNELS[name][1]
    ptrs = (ctypes.c_void_p * len(types)).from_address(params)
    return tuple(t.from_address(p).value or 0 for t, p in zip(types, ptrs))


class FakeDriver:
    """Records each call on its stream, as the commands the emulator runs."""

    class CUstreamWaitValue_flags:
        CU_STREAM_WAIT_VALUE_GEQ = 3

    CU_MEMHOSTREGISTER_PORTABLE, CU_MEMHOSTREGISTER_DEVICEMAP = 1, 2

    def __init__(self, refuse=()):
        self.streams = defaultdict(list)
        self.capturing = {}  # stream -> the graph capturing it
        self.refuse = refuse  # addresses a memop write into fails

    def queue(self, stream, cmd):
        graph = self.capturing.get(stream)
        (graph.cmds if graph is not None else self.streams[stream]).append(cmd)
        return (0,)

    def cuMemcpyAsync(self, dst, src, n, stream):
        return self.queue(stream, ("copy", dst, src, n))

    def cuStreamWriteValue32(self, stream, addr, value, flags):
        assert flags == 0  # with the default memory barrier
        return (801,) if addr in self.refuse else self.queue(stream, ("write", addr, value))

    def cuStreamWaitValue32(self, stream, addr, value, flags):
        assert flags == 3
        return self.queue(stream, ("wait", addr, value))

    def cuMemsetD32Async(self, addr, value, n, stream):
        return self.queue(stream, ("write", addr, value))

    def cuLaunchKernel(self, fn, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        assert (gx, gy, gz, by, bz, shared, extra) == (1, 1, 1, 1, 1, 0, 0)
        return self.queue(stream, ("kernel", fn, unpack(fn, params)))

    def cuMemHostRegister(self, p, size, flags):
        assert flags == 3
        return (0,)

    def cuMemHostGetDevicePointer(self, p, flags):
        return (0, p)  # unified addressing: the host address


def u32(addr: int):
    return ctypes.c_uint32.from_address(addr)


class Emulator:
    """Runs the recorded streams on CPU memory: each step executes the first command of one stream that can go on
    (a wait or a polling kernel only once its flag is there), picked at random, or always the last stream."""

    def __init__(self, drv: FakeDriver, seed=None):
        self.drv, self.pc = drv, defaultdict(int)
        self.rng = random.Random(seed) if seed is not None else None

    def ready(self, cmd) -> bool:
        if cmd[0] == "wait":
            return u32(cmd[1]).value >= cmd[2]
        if cmd[0] == "kernel" and cmd[1] == "spin_wait":
            return u32(cmd[2][0]).value >= cmd[2][1]
        if cmd[0] == "kernel" and cmd[1] == "consume" and cmd[2][4]:
            return u32(cmd[2][4]).value >= cmd[2][5]
        return True

    def execute(self, cmd) -> None:
        if cmd[0] == "copy":
            ctypes.memmove(cmd[1], cmd[2], cmd[3])
        elif cmd[0] == "write":
            u32(cmd[1]).value = cmd[2]
        elif cmd[0] == "kernel" and cmd[1] == "send_flag":
            u32(cmd[2][0]).value = cmd[2][1]
        elif cmd[0] == "kernel" and cmd[1] == "consume":
            data, words, first, status = cmd[2][:4]
            ok = all(u32(data + 4 * w).value == first + w for w in range(words))
            u32(status).value = TIMED_OUT if u32(status).value == TIMED_OUT else OK if ok else WRONG

    def step(self) -> bool:
        """One command run; False when no stream can go on."""
        heads = [(s, cmds[self.pc[s]]) for s, cmds in sorted(self.drv.streams.items())
                 if self.pc[s] < len(cmds) and self.ready(cmds[self.pc[s]])]
        if not heads:
            return False
        s, cmd = self.rng.choice(heads) if self.rng else heads[-1]
        self.execute(cmd)
        self.pc[s] += 1
        return True

    def run(self, until=lambda: False) -> None:
        while not until() and self.step():
            pass

    def drained(self) -> bool:
        return all(self.pc[s] == len(cmds) for s, cmds in self.drv.streams.items())


def cpu_sides(monkeypatch, legs=LEGS, nbytes=64):
    """Both sides on CPU memory with the fake driver: side i's stream is handle i + 1; the host page a CPU tensor."""
    drv = FakeDriver()
    monkeypatch.setattr(crossing_device, "driver", lambda: drv)
    cfg = {**CFG, "legs": legs, "bytes": nbytes}
    page_t = torch.zeros(crossing_device.PAGE_BYTES // 4, dtype=torch.int32)
    page = SimpleNamespace(words=page_t.numpy(), ptr=lambda w: page_t.data_ptr() + 4 * w, keep=page_t)
    kernels = {name: crossing_device.Kernel(name, *spec) for name, spec in crossing_device.KERNELS.items()}
    sides = {i: crossing_device.Side(i, "cpu", crossing_device.make_inbox(legs, nbytes // 4, "cpu"),
                                     SimpleNamespace(cuda_stream=i + 1), SimpleNamespace(cuda_stream=i + 11), cfg,
                                     page, kernels) for i in (0, 1)}
    sides[0].connect(*sides[1].shared(), other=1)
    sides[1].connect(*sides[0].shared(), other=0)
    return drv, sides, page


def statuses(sides, legs=LEGS):
    total = {name: 0 for name in crossing_legs.STATUS.values()}
    for s in sides.values():
        for k, v in crossing_legs.counts(s.status.tolist(), s.index, legs).items():
            total[k] += v
    return total


SIGNAL_COMMAND = {"memop": "write", "copy": "copy", "kernel": "kernel"}


@pytest.mark.parametrize("draw", [0, 1, 2])  # three interleavings each
@pytest.mark.parametrize("wait", ["memop", "spin", "fold"])
@pytest.mark.parametrize("send", crossing.SENDS)
def test_every_gated_pair_delivers_each_leg_to_its_consumer(send, wait, draw, seed, monkeypatch):
    drv, sides, _ = cpu_sides(monkeypatch)
    for s in sides.values():
        s.queue(Pair("eager", send, wait), LEGS)
    emu = Emulator(drv, seed + draw)
    emu.run()
    assert emu.drained(), f"seed {seed + draw}"
    assert statuses(sides) == {"missing": 0, "ok": LEGS, "wrong": 0, "timeout": 0}, f"seed {seed + draw}"
    for s in sides.values():
        cmds = drv.streams[s.index + 1]
        flag_sends = [c for c in cmds if c[0] == SIGNAL_COMMAND[send] and (c[0] != "copy" or c[3] == 4)]
        flag_sends = [c for c in flag_sends if c[0] != "kernel" or c[1] == "send_flag"]
        assert len(flag_sends) == LEGS // 2  # one send per leg sent, into the other side's device flag
        assert all((c[2][0] if c[0] == "kernel" else c[1]) == sides[1 - s.index].flag_ptr for c in flag_sends)
    assert drv.streams[1][-1][:2] == ("kernel", "consume")  # side 0's stream ends with the last leg's consumer
    assert drv.streams[1][-1][2][2] == LEGS * (64 // 4)


@pytest.mark.parametrize("send", crossing.SENDS)
def test_host_waits_deliver_each_leg_to_a_consumer_the_cpu_launches(send, monkeypatch, seed):
    drv, sides, page = cpu_sides(monkeypatch)
    emu = Emulator(drv, seed)

    def poll(word, value):
        emu.run(until=lambda: page.words[word] >= value)
        return bool(page.words[word] >= value)

    assert crossing_device.drive_host_legs(sides, Pair("eager", send, "host"), LEGS, poll,
                                           lambda s: contextlib.nullcontext())
    emu.run()
    assert emu.drained() and statuses(sides) == {"missing": 0, "ok": LEGS, "wrong": 0, "timeout": 0}, \
        f"seed {seed}"
    assert page.words[crossing_device.HOST_FLAG[0]] == LEGS and page.words[crossing_device.HOST_FLAG[1]] == LEGS - 1
    assert not any(c[0] == "wait" for cmds in drv.streams.values() for c in cmds)  # the CPU waited, no stream


def test_one_process_of_an_ipc_pair_polls_only_for_its_own_legs(monkeypatch):
    drv, sides, page = cpu_sides(monkeypatch)
    polled = []

    def never(word, value):
        polled.append((word, value))
        return False

    assert not crossing_device.drive_host_legs({1: sides[1]}, Pair("eager", "memop", "host"), LEGS, never,
                                               lambda s: contextlib.nullcontext())
    assert polled == [(crossing_device.HOST_FLAG[1], 1)] and not drv.streams  # side 1 sends nothing before leg 0


def test_the_baseline_consumes_every_leg_on_one_stream(monkeypatch, seed):
    drv, sides, _ = cpu_sides(monkeypatch)
    sides[0].queue_baseline(LEGS)
    emu = Emulator(drv, seed)
    emu.run()
    assert emu.drained() and list(drv.streams) == [1], f"seed {seed}"
    assert crossing_legs.counts(sides[0].status.tolist(), None, LEGS) == {"missing": 0, "ok": LEGS, "wrong": 0,
                                                                     "timeout": 0}, f"seed {seed}"


def test_a_consumer_queued_ahead_of_its_wait_is_caught(monkeypatch):
    drv, sides, _ = cpu_sides(monkeypatch)
    no_waits = crossing_legs.half
    monkeypatch.setattr(crossing_legs, "half", lambda *a: [op for op in no_waits(*a) if op[0] != "wait"])
    for s in sides.values():
        s.queue(Pair("eager", "memop", "memop"), LEGS)
    Emulator(drv).run()  # the receiver's stream first, whenever it can go on
    assert statuses(sides)["wrong"] > 0


def test_a_leg_with_another_legs_data_is_caught(monkeypatch, seed):
    drv, sides, _ = cpu_sides(monkeypatch)
    monkeypatch.setattr(sides[0], "src_ptr", sides[0].src_ptr + sides[0].nbytes)  # side 0 sends the next leg's
    for s in sides.values():
        s.queue(Pair("eager", "copy", "fold"), LEGS)
    Emulator(drv, seed).run()
    assert statuses(sides)["wrong"] == LEGS // 2, f"seed {seed}"


# -- the summary table and the docs block -----------------------------------------------------------------------------
def synthetic_rows(seed: int) -> list[dict]:
    pairs = crossing_legs.pair_matrix(crossing.SENDS, crossing.WAITS, crossing.MODES)
    rng = random.Random(seed)
    got = {crossing_legs.baseline(m): Measured([800.0 + rng.random()], ok_counts(6), 6, "") for m in crossing.MODES}
    for p in pairs:
        got[p] = Measured([LEGS * (100.0 + 10 * rng.random()) for _ in range(5)], ok_counts(6), 6, "")
    got[pairs[3]] = Measured([], {}, 0, "memop send refused")
    rows = crossing.placement_rows("streams", pairs, LEGS, 64, got)
    return rows + crossing.placement_rows("ipc", pairs[:2], LEGS, 64, {})


def test_the_crossing_table_has_a_row_per_pair_in_the_probes_order(seed):
    import pandas as pd

    rows = synthetic_rows(seed)
    t = tables.crossing(pd.DataFrame(rows))
    assert len(t) == 21 + 2 and "none" not in set(t["send"])
    assert list(t.columns) == ["placement", "mode", "send", "wait", "leg_us", "base_leg_us", "crossing_us",
                               "correct", "timeouts", "note"]
    assert list(t["placement"][:21]) == ["streams"] * 21 and list(t["placement"][21:]) == ["ipc"] * 2
    assert list(zip(t["mode"], t["send"], t["wait"]))[:4] == [("eager", "memop", w) for w in crossing.WAITS]
    row = t[(t["placement"] == "streams") & (t["send"] == "copy") & (t["wait"] == "fold") & (t["mode"] == "graph")]
    src = next(r for r in rows if (r["placement"], r["mode"], r["send"], r["wait"]) == ("streams", "graph", "copy",
                                                                                         "fold"))
    assert float(row["crossing_us"].iloc[0]) == round(src["crossing_us"], 2), f"seed {seed}"
    refused = t[t["note"] == "memop send refused"]
    assert len(refused) == 1 and refused["crossing_us"].iloc[0] == ""


def test_the_probes_block_shows_the_crossing_table_when_its_results_exist(tmp_path, monkeypatch, seed):
    monkeypatch.setattr(docs, "ROOT", tmp_path)
    assert docs.probes("m") == ""
    run = tmp_path / "results/m/probes/crossing"
    run.mkdir(parents=True)
    with open(run / "data.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=crossing.COLUMNS)
        w.writeheader()
        w.writerows(synthetic_rows(seed))
    (run / "data.json").write_text(json.dumps({"git_sha": "0123456789abc", "hardware": {"gpus": ["NVIDIA H100"]},
                                               "software": {"torch": "2.11.0", "nccl": "2.28.9"}}))
    block = docs.probes("m")
    assert block.startswith("Source: `results/m/probes/crossing/data.csv` (code 0123456789, 1x NVIDIA H100")
    assert block.count("\n| streams") == 21 and "memop send refused" in block, f"seed {seed}"


# -- the runs of a pair, in one process or two (threads here), on an emulated GPU ----------------------------------
class FakeGPU:
    """The emulator stepping in a thread of its own, as a GPU runs beside the host, and the torch.cuda pieces the
    Runner uses (events, graphs, stream and device contexts, synchronize) over it."""

    def __init__(self, drv: FakeDriver, seed: int):
        self.drv, self.emu, self.lock, self.stopped = drv, Emulator(drv, seed), threading.Lock(), False
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def loop(self):
        while not self.stopped:
            with self.lock:
                moved = self.emu.step()
            if not moved:
                time.sleep(1e-4)

    def synchronize(self, *_):
        with self.lock:
            self.emu.run()

    def patch(self, monkeypatch):
        gpu = self

        class Event:
            def __init__(self, enable_timing=False):
                self.at = None

            def record(self, stream):
                self.at = (stream.cuda_stream, len(gpu.drv.streams[stream.cuda_stream]))

            def query(self):
                return gpu.emu.pc[self.at[0]] >= self.at[1]

            def elapsed_time(self, end):
                assert self.at[0] == end.at[0]  # one stream's clock
                return 1.0

        class Graph:
            def __init__(self):
                self.cmds, self.stream = [], None

            def replay(self):
                gpu.drv.streams[self.stream].extend(self.cmds)

        @contextlib.contextmanager
        def capture(graph, stream):
            graph.stream = stream.cuda_stream
            gpu.drv.capturing[stream.cuda_stream] = graph
            yield
            del gpu.drv.capturing[stream.cuda_stream]

        for name, value in (("Event", Event), ("CUDAGraph", Graph), ("graph", capture),
                            ("stream", lambda s: contextlib.nullcontext()),
                            ("device", lambda d: contextlib.nullcontext()), ("synchronize", self.synchronize)):
            monkeypatch.setattr(torch.cuda, name, value)


def run_pairs(monkeypatch, processes, pairs, seed, refuse_memop=False):
    """Every pair of ``pairs`` measured by Runners as the placement's processes (threads) run them: the rows."""
    cfg = {**CFG, "repeats": 2, "wait_timeout_ms": 5000.0}
    drv, sides, page = cpu_sides(monkeypatch)
    for s in sides.values():
        s.timeout_ns = int(cfg["wait_timeout_ms"] * 1e6)
    if refuse_memop:
        drv.refuse = {sides[0].flag_ptr, sides[1].flag_ptr}
    gpu = FakeGPU(drv, seed)
    gpu.patch(monkeypatch)
    monkeypatch.setattr(sys, "getswitchinterval", sys.getswitchinterval)
    sys.setswitchinterval(1e-4)
    barrier = threading.Barrier(len(processes)) if len(processes) > 1 else None
    reports, errors = defaultdict(list), []

    def process(me, here):
        try:
            runner = crossing_device.Runner({i: sides[i] for i in here}, crossing_device.Link(barrier, page, me, 60),
                                            page, cfg)
            for pair in crossing_launch.order(pairs):
                if pair.send == "none" and 0 not in here:
                    continue
                reports[pair].append(runner.measure(pair))
        except BaseException as e:  # noqa: BLE001
            errors.append(e)
            if barrier is not None:
                barrier.abort()

    threads = [threading.Thread(target=process, args=(me, here)) for me, here in enumerate(processes)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        sys.setswitchinterval(0.005)
        gpu.stopped = True
    assert not errors, errors
    assert all(len(ms) == (1 if p.send == "none" else len(processes)) for p, ms in reports.items())
    return crossing.placement_rows("x", pairs, LEGS, 64, {p: crossing_legs.merge(ms) for p, ms in reports.items()})


@pytest.mark.parametrize("processes", [[(0, 1)], [(0,), (1,)]], ids=["one process", "two processes"])
def test_every_pair_runs_in_step_and_checks_out(processes, monkeypatch, seed):
    pairs = crossing_legs.pair_matrix(crossing.SENDS, crossing.WAITS, crossing.MODES)
    rows = run_pairs(monkeypatch, processes, pairs, seed)
    assert len(rows) == 23
    for r in rows:
        assert (r["correct"], r["timeouts"], r["note"], r["leg_us"]) == (True, 0, "", 1000.0 / LEGS), (seed, r)
        assert r["crossing_us"] == ("" if r["send"] == "none" else 0.0)


@pytest.mark.parametrize("processes", [[(0, 1)], [(0,), (1,)]], ids=["one process", "two processes"])
def test_a_refused_send_is_a_row_with_its_reason_and_the_rest_still_run(processes, monkeypatch, seed):
    pairs = crossing_legs.pair_matrix(crossing.SENDS, ["memop", "host"], ["eager"])
    rows = {(r["send"], r["wait"]): r for r in run_pairs(monkeypatch, processes, pairs, seed, refuse_memop=True)}
    refused = rows[("memop", "memop")]
    assert refused["leg_us"] == "" and refused["correct"] is False
    assert refused["note"].startswith("memop send refused: cuStreamWriteValue32: error 801")
    assert rows[("memop", "host")]["correct"] is True  # the write into the host flag is taken
    assert all(rows[(s, w)]["correct"] for s in ("copy", "kernel") for w in ("memop", "host"))


def test_a_page_is_one_memory_for_every_process_that_maps_it(tmp_path, monkeypatch):
    monkeypatch.setattr(crossing_device, "driver", lambda: FakeDriver())
    path = tmp_path / "page"
    path.write_bytes(bytes(crossing_device.PAGE_BYTES))
    a, b = crossing_device.Page(str(path)), crossing_device.Page(str(path))
    a.words[crossing_device.GATE] = 1
    u32(b.ptr(crossing_device.HOST_FLAG[1])).value = 7  # a device write through b's mapping
    assert b.words[crossing_device.GATE] == 1 and a.words[crossing_device.HOST_FLAG[1]] == 7
    assert a.ptr(0) == a.host and a.ptr(16) == a.host + 64


@pytest.mark.parametrize("wait", ["memop", "spin", "fold"])
def test_a_stalled_side_is_released_and_its_legs_count_as_wrong(wait, monkeypatch, seed):
    drv, sides, page = cpu_sides(monkeypatch)
    sides[1].queue(Pair("eager", "copy", wait), LEGS)  # side 0 never sends: side 1 waits for leg 0 for good
    emu = Emulator(drv, seed)
    emu.run()
    assert not emu.drained()
    sides[1].release()
    emu.run()
    assert emu.drained() and page.words[crossing_device.GATE] == 1
    assert crossing_legs.counts(sides[1].status.tolist(), 1, LEGS)["wrong"] == LEGS // 2, f"seed {seed}"


def test_host_polls_give_up_later_than_gpu_waits():
    assert crossing_device.Runner({}, None, None, CFG).host_timeout_s == crossing_device.HOST_TIMEOUT_MIN_S
    assert crossing_device.Runner({}, None, None, {**CFG, "wait_timeout_ms": 5000.0}).host_timeout_s == 5.0
