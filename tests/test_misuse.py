"""Never a silent wrong answer: overlapping buffers, a closed communicator, counts that are not whole numbers and
ranks that disagree on a call each raise InvalidArgument before any work (host emulator, one process per rank)."""
import pytest
import torch

from dmacoll_lab.verify.launch import run_ranks


def _outcome(fn):
    """'ok' and what the call returned, or the InvalidArgument's message."""
    from dmacoll import InvalidArgument

    try:
        return "ok", fn()
    except InvalidArgument as e:
        return "refused", str(e)


def _overlapping_calls(rank, world):
    from dmacoll import Communicator

    comm = Communicator(backend="host", timeout_s=10)
    n = 4
    sym_out, sym_in = comm.empty(n * world), comm.empty(n * world)
    other = (rank + 1) % world
    private = torch.zeros(n * world)
    calls = {
        # the input is another rank's slot of the output: each rank would send what a peer overwrites
        "ag_other_slot_sym": lambda: comm.all_gather(sym_out, sym_out[other * n:(other + 1) * n]),
        "ag_other_slot_private": lambda: comm.all_gather(private, private[other * n:(other + 1) * n]),
        "ag_partly": lambda: comm.all_gather(private, private[1:n + 1]),
        "a2a_same_sym": lambda: comm.all_to_all(sym_out, sym_out),
        "a2a_same_private": lambda: comm.all_to_all(private, private),
        "a2a_shifted": lambda: comm.all_to_all(sym_out[:3 * world], sym_out[world:4 * world]),
        "a2av_same": lambda: comm.all_to_all_v(private, private, [[1] * world] * world),
        "rs_other_chunk": lambda: comm.reduce_scatter(private[other * n:(other + 1) * n], private),
        "ar_partly": lambda: comm.all_reduce(private[: n * world - 1], private[1:]),
        "result_into_its_input": lambda: comm.result("all_gather", stale[other * n:(other + 1) * n]),
    }
    first = comm.result("all_gather", torch.ones(n))  # region A
    comm.result("all_gather", torch.ones(n))  # region B: the next result call writes region A again
    stale = first
    outcomes = {name: _outcome(fn) for name, fn in calls.items()}
    # the rejected result() call left the alternation alone: the next one takes the other region, lean, and right
    outcomes["result_after"] = _outcome(lambda: comm.result("all_gather", torch.full((n,), float(rank))).tolist())
    outcomes["result_after_lean"] = bool(comm.last_handshake.ready_implied)
    # the op's in-place forms and two tensors of the heap (one storage, no common bytes) still run, and right
    sym_in.copy_(torch.arange(n * world) + 10 * rank)
    outcomes["two_heap_tensors"] = _outcome(lambda: comm.all_to_all(sym_out, sym_in).tolist())
    sym_out[rank * n:(rank + 1) * n] = rank + 1.0
    outcomes["ag_in_place"] = _outcome(lambda: comm.all_gather(sym_out, sym_out[rank * n:(rank + 1) * n]).tolist())
    private.fill_(rank + 1.0)
    outcomes["rs_in_place"] = _outcome(lambda: comm.reduce_scatter(private[rank * n:(rank + 1) * n], private)
                                       .tolist())
    outcomes["ar_in_place"] = _outcome(lambda: comm.all_reduce(torch.full((n,), rank + 1.0)).tolist())
    comm.close()
    return outcomes


@pytest.fixture(scope="module")
def overlapping():
    return run_ranks(_overlapping_calls, 3)


@pytest.mark.parametrize("name, says", [
    ("ag_other_slot_sym", "its in-place form is: input is this rank's chunk of the output"),
    ("ag_other_slot_private", "(16 bytes in common)"),
    ("ag_partly", "all_gather: the input and the output overlap"),
    ("a2a_same_sym", "all_to_all has no in-place form"),
    ("a2a_same_private", "all_to_all has no in-place form"),
    ("a2a_shifted", "all_to_all has no in-place form"),
    ("a2av_same", "all_to_all_v has no in-place form"),
    ("rs_other_chunk", "its in-place form is: output is this rank's chunk of the input"),
    ("ar_partly", "its in-place form is: one tensor is input and output"),
    ("result_into_its_input", "all_gather: the input and the output overlap"),
])
def test_an_overlap_that_is_not_the_in_place_form_is_refused_on_every_rank(overlapping, name, says):
    for rank, outcomes in enumerate(overlapping):
        status, message = outcomes[name]
        assert status == "refused", f"rank {rank}: {name} ran and returned {message}"
        assert says in message and "pass tensors that do not overlap" in message, message


def test_in_place_forms_and_separate_heap_tensors_still_run_right(overlapping):
    world, n = len(overlapping), 4
    for rank, o in enumerate(overlapping):
        assert o["two_heap_tensors"] == ("ok", [float(i + 10 * p) for p in range(world)
                                                for i in range(rank * n, (rank + 1) * n)])
        assert o["ag_in_place"] == ("ok", [p + 1.0 for p in range(world) for _ in range(n)])
        assert o["rs_in_place"] == ("ok", [sum(range(1, world + 1)) * 1.0] * n)
        assert o["ar_in_place"] == ("ok", [sum(range(1, world + 1)) * 1.0] * n)
        assert o["result_after"] == ("ok", [float(p) for p in range(world) for _ in range(n)])
        assert o["result_after_lean"] is True


def _closed(rank, world):
    from dmacoll import Communicator

    comm = Communicator(backend="host", timeout_s=10)
    x, out = comm.empty(4), comm.empty(4 * world)
    comm.close()
    comm.close()  # twice: nothing to do
    uses = {
        "collective": lambda: comm.collective("all_gather", out, x),
        "named": lambda: comm.all_to_all(out, torch.zeros(4 * world)),
        "result": lambda: comm.result("all_reduce", torch.zeros(4)),
        "empty": lambda: comm.empty(4),
        "reserve_results": lambda: comm.reserve_results(1024),
        "prelaunch": lambda: comm.prelaunch().__enter__(),
        "warm_up": lambda: comm.warm_up(),
    }
    return {name: _outcome(fn) for name, fn in uses.items()}


def test_a_closed_communicator_refuses_every_use():
    for outcomes in run_ranks(_closed, 2):
        for name, (status, message) in outcomes.items():
            assert status == "refused" and "this communicator is closed; create a new Communicator" in message, name


def _nccl_path_without_nccl(rank, world):
    from dmacoll import Communicator, Options

    comm = Communicator(backend="host", timeout_s=10)
    x, out = comm.empty(4), comm.empty(4 * world)
    outcomes = {"call": _outcome(lambda: comm.all_gather(out, x, path="nccl")),
                "auto": _outcome(lambda: (comm.all_gather(out, x), comm.last_options.path)[1])}
    comm.close()
    outcomes["communicator"] = _outcome(lambda: Communicator(backend="host", options=Options(path="nccl")))
    return outcomes


def test_the_nccl_path_is_refused_where_the_group_does_not_run_nccl_and_auto_never_takes_it():
    for outcomes in run_ranks(_nccl_path_without_nccl, 2):
        for name in ("call", "communicator"):
            status, message = outcomes[name]
            assert status == "refused" and "path='nccl' hands calls to torch.distributed" in message, name
            assert "backend='host'" in message, name
        assert outcomes["auto"] == ("ok", "dma")


BAD_COUNTS = {
    "float": [[1.5, 1.5], [1.5, 1.5]],
    "whole_float": [[1.0, 2.0], [2.0, 1.0]],
    "bool": [[True, False], [False, True]],
    "negative": [[1, -1], [1, 1]],
    "float_tensor": torch.ones(2, 2),
    "bool_tensor": torch.ones(2, 2, dtype=torch.bool),
    "string": ["12", "34"],
}


@pytest.mark.parametrize("name", BAD_COUNTS)
def test_send_counts_must_be_whole_numbers_of_elements(name):
    from dmacoll import InvalidArgument
    from dmacoll.validate import split_matrix

    with pytest.raises(InvalidArgument, match="send_counts holds"):
        split_matrix(BAD_COUNTS[name], 2)


def test_integer_counts_of_every_kind_are_taken():
    import numpy as np

    from dmacoll.validate import split_matrix

    want = [[1, 2], [3, 0]]
    for counts in (want, torch.tensor(want), torch.tensor(want, dtype=torch.int32), np.array(want),
                   [[np.int64(1), torch.tensor(2)], (3, 0)]):
        assert split_matrix(counts, 2) == want


def _float_counts_in_a_call(rank, world):
    from dmacoll import Communicator

    comm = Communicator(backend="host", timeout_s=10)
    x, out = torch.ones(4), torch.zeros(4)
    outcomes = {"call": _outcome(lambda: comm.all_to_all_v(out, x, [[1.5] * world] * world)),
                "result": _outcome(lambda: comm.result("all_to_all_v", x, [[1.5] * world] * world))}
    comm.close()
    return outcomes


def test_float_counts_are_refused_by_the_call_and_by_result():
    for outcomes in run_ranks(_float_counts_in_a_call, 2):
        for status, message in outcomes.values():
            assert status == "refused" and "send_counts holds 1.5, not a whole number" in message


# -- ranks that disagree: the cross-rank check of each call ------------------------------------------------------
def _disagreeing(rank, world, check_calls):
    from dmacoll import Communicator, Options

    comm = Communicator(backend="host", timeout_s=3, options=Options(check_calls=check_calls))
    counts = [[1 + (i + j) % 2 for j in range(world)] for i in range(world)]
    mine = [row[:] for row in counts]
    if rank == world - 1:
        mine[0][0] += 1  # the last rank's matrix differs in one entry
    big, small = torch.zeros(64), torch.ones(32)
    sym_in, sym_out = comm.empty(8), comm.empty(8 * world)
    calls = {
        "sizes": lambda: comm.all_gather(torch.zeros(world * (4 if rank == 0 else 8)), torch.ones(4 if rank == 0
                                                                                                  else 8)),
        "counts": lambda: comm.all_to_all_v(big, small, mine),
        "dtype": lambda: comm.all_reduce(torch.ones(4, dtype=torch.float32 if rank else torch.float64)),
        "buffers": lambda: comm.all_gather(sym_out if rank else torch.zeros(8 * world), sym_in),
        "direction": lambda: comm.all_to_all(torch.zeros(2 * world), torch.ones(2 * world),
                                             direction="pull" if rank == 1 else "push"),
        # one rank rejects its own call (an overlap): the others hear why instead of waiting for it
        "one_rejects": lambda: comm.all_to_all(big[:4 * world], big[:4 * world] if rank == 1 else small[:4 * world]),
        "result_sizes": lambda: comm.result("all_gather", torch.ones(4 if rank == 0 else 1024)),
    }
    outcomes = {}
    for name, fn in calls.items():
        outcomes[name] = _outcome(fn)
    # the same calls, agreed, run right afterwards (in place, where the ranks' input offsets differ, too)
    sym_out[rank * 8:(rank + 1) * 8] = float(rank)
    outcomes["agreed_in_place"] = _outcome(lambda: comm.all_gather(sym_out, sym_out[rank * 8:(rank + 1) * 8])
                                           .tolist())
    outcomes["agreed_result"] = _outcome(lambda: comm.result("all_to_all_v", torch.full((sum(counts[rank]),),
                                                                                         float(rank)), counts).tolist())
    comm.close()
    return outcomes


DISAGREEMENTS = {
    "sizes": "sizes (bytes): (16, False) on rank 0, (32, False) on ranks [1, 2]",
    "counts": "sizes (bytes): (((4, 8, 4), (8, 4, 8), (4, 8, 4)),) on ranks [0, 1], "
              "(((8, 8, 4), (8, 4, 8), (4, 8, 4)),) on rank 2",
    "dtype": "dtype: 'float64' on rank 0, 'float32' on ranks [1, 2]",
    "buffers": "buffers (input, output): ('symmetric at",
    "direction": "direction: 'push' on ranks [0, 2], 'pull' on rank 1",
    "one_rejects": "rank 1 rejected it (InvalidArgument: all_to_all: the input and the output overlap",
    "result_sizes": "result bytes: 48 on rank 0, 12288 on ranks [1, 2]",
}


@pytest.fixture(scope="module")
def disagreeing():
    return run_ranks(_disagreeing, 3, True)


@pytest.mark.parametrize("name", DISAGREEMENTS)
def test_with_the_check_on_every_rank_raises_naming_the_ranks_that_differ(disagreeing, name):
    for rank, outcomes in enumerate(disagreeing):
        status, message = outcomes[name]
        assert status == "refused", f"rank {rank}: {name} ran and returned {message}"
        if name == "one_rejects" and rank == 1:  # the rank that rejected it raises its own error
            assert "all_to_all has no in-place form" in message
            continue
        assert "the ranks disagree" in message and DISAGREEMENTS[name] in message, message


def test_with_the_check_on_agreed_calls_run_right_after_refused_ones(disagreeing):
    world = len(disagreeing)
    counts = [[1 + (i + j) % 2 for j in range(world)] for i in range(world)]
    for rank, outcomes in enumerate(disagreeing):
        assert outcomes["agreed_in_place"] == ("ok", [float(p) for p in range(world) for _ in range(8)])
        assert outcomes["agreed_result"] == ("ok", [float(p) for p in range(world) for _ in range(counts[p][rank])])


def test_the_check_is_off_by_default_and_on_under_either_switch(monkeypatch):
    from dmacoll import consistency

    monkeypatch.delenv("DMACOLL_CHECK_CALLS", raising=False)
    monkeypatch.delenv("TORCH_DISTRIBUTED_DEBUG", raising=False)
    assert not consistency.enabled() and consistency.enabled(True)
    monkeypatch.setenv("TORCH_DISTRIBUTED_DEBUG", "INFO")
    assert not consistency.enabled()
    monkeypatch.setenv("TORCH_DISTRIBUTED_DEBUG", "DETAIL")
    assert consistency.enabled() and not consistency.enabled(False)
    monkeypatch.delenv("TORCH_DISTRIBUTED_DEBUG")
    monkeypatch.setenv("DMACOLL_CHECK_CALLS", "1")
    assert consistency.enabled()
    monkeypatch.setenv("DMACOLL_CHECK_CALLS", "0")
    assert not consistency.enabled()


def _check_everything(rank, world, seed):
    from dmacoll import consistency
    from dmacoll.plan import VARIANTS
    from dmacoll_lab.verify.check import check_rank

    args = dict(backend="host", timeout_s=60, variants=VARIANTS, directions=("push", "pull"),
                dtypes=["float32", "int8"], counts=[1, 17], ops=("all_gather", "all_to_all", "all_to_all_v",
                                                                 "reduce_scatter", "all_reduce"),
                seed=seed, syncs=("reset", "epoch"), reference="cpu", signal="memop")
    return consistency.enabled(), check_rank(rank, world, args)


@pytest.mark.parametrize("switch", ["DMACOLL_CHECK_CALLS=1", "TORCH_DISTRIBUTED_DEBUG=DETAIL"])
def test_the_check_finds_nothing_wrong_in_every_case_of_dmacoll_check(monkeypatch, seed, switch):
    """No false alarm: in place (the ranks' input offsets differ), symmetric and private, lean pipelines, owned
    outputs, every option 'auto'."""
    name, value = switch.split("=")
    monkeypatch.setenv(name, value)
    for on, rows in run_ranks(_check_everything, 3, seed):
        assert on and rows and all(r["ok"] for r in rows), f"seed {seed}: {[r for r in rows if not r['ok']][:3]}"
        assert {r["buffers"] for r in rows} == {"sym", "private", "alternating", "owned"}


def _group_references(rank, world):
    import sys

    import torch.distributed as dist

    from dmacoll import Communicator

    group = dist.group.WORLD
    before = sys.getrefcount(group)
    comm = Communicator(backend="host", timeout_s=10)
    x, out = comm.empty(4), comm.empty(4 * world)
    comm.all_gather(out, x)
    held = sys.getrefcount(group) - before
    comm.close()
    return held, sys.getrefcount(group) - before


def test_a_closed_communicator_lets_go_of_its_process_group():
    """Held after close, the group outlives dist.destroy_process_group(): a gloo thread then released its last work
    while the interpreter finalized and the process aborted ("terminate called without an active exception"; the
    README example's continuation under load, about 1 run in 25 before, 0 in 90 after)."""
    for held, after in run_ranks(_group_references, 2):
        assert held > 0 and after == 0, (held, after)
