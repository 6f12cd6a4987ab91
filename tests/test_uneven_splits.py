"""all_to_all_v with uneven splits (issue 47): what crashed 2x / 4x H200, shown without a GPU.

The cause: ``prerecord`` recorded a CUDA graph per call shape keyed by the buffers' addresses, private tensors too.
``torch.cuda.graph`` empties the caching allocator on entry, so a freed private tensor's memory went back to the
driver, a new tensor got the same address, the key matched, and the old graph was replayed on memory it was not
recorded for: the copy engine faulted ("unspecified launch failure", once "invalid argument"), and a later graph
launch crashed the process (SIGSEGV in cudaGraphLaunch). Large entries (a 2^20-element hot expert) are what get a
segment of their own that goes back to the driver. Now only calls whose buffers are in the symmetric heap (which
lives as long as the communicator) are prerecorded. A rank with nothing to move records and launches nothing.
"""
from __future__ import annotations

import pytest
import torch

from dmacoll_lab.verify.launch import run_ranks
from dmacoll_lab.verify.splits import HUGE, PATTERNS, pattern_counts, random_counts


def _recording_engine(recorded: list, issued: list):
    """The host engine, saying it has graphs and 'replaying' by running the call, counting what it records and
    issues (a stand-in for the cuda engine's prerecording)."""
    import dataclasses

    from dmacoll.backends import host

    def replay_recorded(self, key, work, label, sync, words=()):
        recorded.append(key)
        work()

    copy, memops = host.HostEngine.copy, host.HostEngine.memops

    def counted_copy(self, *args, **kwargs):
        issued.append("copy")
        return copy(self, *args, **kwargs)

    def counted_memops(self, *args, **kwargs):
        issued.append("memops")
        return memops(self, *args, **kwargs)

    host.HostEngine.capabilities = dataclasses.replace(host.HostEngine.capabilities, graphs=True)
    host.HostEngine.replay_recorded = replay_recorded
    host.HostEngine.copy, host.HostEngine.memops = counted_copy, counted_memops


def _prerecorded_buffers(rank, world):
    from dmacoll import Communicator, Options

    recorded, issued = [], []
    _recording_engine(recorded, issued)
    comm = Communicator(backend="host", timeout_s=10, options=Options(prerecord=True))
    counts = [[0, HUGE // 64], [0, 0]]  # one hot entry, rank 0 to rank 1, zeros elsewhere
    sends, receives = sum(counts[rank]), sum(row[rank] for row in counts)
    seen = {}
    for buffers in ("private", "heap", "private"):
        if buffers == "heap":
            n = HUGE // 64  # every rank allocates alike (the heap is symmetric); each uses its part
            x, out = comm.empty(n, dtype=torch.int32)[:sends], comm.empty(n, dtype=torch.int32)[:receives]
        else:
            x, out = torch.empty(sends, dtype=torch.int32), torch.empty(receives, dtype=torch.int32)
        x.copy_(torch.arange(sends, dtype=torch.int32))
        before = len(recorded)
        comm.all_to_all_v(out, x, counts)
        seen.setdefault(buffers, []).append((len(recorded) - before, comm.last_options.prerecord,
                                             out.tolist() == list(range(receives))))
    comm.close()
    return seen


def test_only_heap_buffers_are_prerecorded():
    """A graph keyed by a private tensor's address may be replayed on a new tensor that got the address after the
    old one's memory was freed: private buffers are never prerecorded, even with prerecord=True (fails on the code
    of issue 47, which recorded them)."""
    for seen in run_ranks(_prerecorded_buffers, 2):
        assert seen["private"] == [(0, False, True)] * 2
        assert seen["heap"] == [(1, True, True)]


def _nothing_to_move(rank, world, sync):
    from dmacoll import Communicator, Options

    recorded, issued = [], []
    _recording_engine(recorded, issued)
    comm = Communicator(backend="host", timeout_s=10, options=Options(prerecord=sync == "reset", sync=sync))
    x, out = comm.empty(world * 5, dtype=torch.float32), comm.empty(world * 5, dtype=torch.float32)
    out.fill_(-1.0)
    comm.all_to_all_v(out, x, [[0] * world] * world)  # all zero: nobody moves anything
    empty = (len(recorded), len(issued), out.tolist() == [-1.0] * (world * 5))
    # diagonal only: each rank keeps its own part, no peer to signal: nothing to issue beyond the local copy
    x.fill_(float(rank))
    comm.all_to_all_v(out, x, [[5 if i == j else 0 for j in range(world)] for i in range(world)])
    diagonal = out[:5].tolist() == [float(rank)] * 5
    # then an exchange with every peer: the epochs stayed in step on every rank (sync='epoch' sends them)
    x.copy_(torch.arange(world * 5, dtype=torch.float32) + 100 * rank)
    comm.all_to_all(out, x)
    exchanged = out.tolist() == [100.0 * p + rank * 5 + i for p in range(world) for i in range(5)]
    comm.close()
    return empty, diagonal, exchanged


@pytest.mark.parametrize("world,sync", [(2, "reset"), (3, "epoch"), (4, "reset")])
def test_a_rank_with_nothing_to_move_records_and_launches_nothing(world, sync):
    for empty, diagonal, exchanged in run_ranks(_nothing_to_move, world, sync):
        assert empty == (0, 0, True)  # no graph recorded, no command issued, the output untouched
        assert diagonal and exchanged


def test_split_patterns_are_the_shapes_they_say():
    for world in range(2, 9):
        m = {p: pattern_counts(p, 7, world) for p in PATTERNS}
        assert all(x == 0 for row in m["all_zero"] for x in row)
        assert sum(m["zero_row"][0]) == 0 and all(sum(row) > 0 for row in m["zero_row"][1:])
        assert all(row[-1] == 0 for row in m["zero_column"]) and all(row[0] > 0 for row in m["zero_column"])
        assert all((x > 0) == (i == j) for i, row in enumerate(m["diagonal"]) for j, x in enumerate(row))
        assert sum(map(sum, m["one_huge"])) == m["one_huge"][0][1] == HUGE
        hot = [row[1] for row in m["very_uneven"]]
        assert min(hot) > 10 * max(x for row in m["very_uneven"] for j, x in enumerate(row) if j != 1)
    drawn = [random_counts(9, 4, s) for s in range(50)]
    assert drawn == [random_counts(9, 4, s) for s in range(50)]  # replayable from the seed
    entries = [x for m in drawn for row in m for x in row]
    assert 0 in entries and 1 in entries and any(x % 2 for x in entries if x > 1)


def _split_families(rank, world, seed):
    from dmacoll import Communicator
    from dmacoll_lab.verify.check import run_split_family

    comm = Communicator(backend="host", timeout_s=30)
    try:
        rows = []
        for family in ("patterns", "random"):
            rows += run_split_family(comm, family, ("pcpy", "b2b", "multi"), ("push", "pull"),
                                     ("int8", "int32", "bfloat16"), seed, count=37)
        return rows
    finally:
        comm.close()


@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_every_split_pattern_and_random_split_matches_the_reference(world, seed):
    """What `dmacoll check` runs as its 'uneven splits' and 'random splits' families, on the emulator."""
    rows = run_ranks(_split_families, world, seed)
    bad = [r for rank_rows in rows for r in rank_rows if not r["ok"]]
    assert len(rows[0]) == len(PATTERNS) * 4 * 3 * 2 * 3 + 4 * 3 * 2 * 4
    assert not bad, (seed, bad[:3])
