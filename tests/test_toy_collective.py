"""A collective added from this file alone: a broadcast (rank 0's input on every rank), its spec and its plan builder
(an exchange) written here and nowhere else. Registered for a test, in the test's process and in every rank's
(``registered``: what its line in ``dmacoll/ops/__init__.py`` would do), and removed after it, it runs through
everything that asks the op registry, and is refused clearly where it does not apply (no vLLM call maps to it).
docs/design.md, "Adding a collective", names the places a collective touches; this test keeps that true."""
import contextlib

import pandas as pd
import pytest
import torch

from dmacoll import Communicator, ops
from dmacoll.errors import InvalidArgument
from dmacoll.ops.spec import OpSpec, Request, exchange_plans, nbytes
from dmacoll.plan import Exchange
from dmacoll_lab.verify import launch
from dmacoll_lab.verify.launch import run_ranks

NAME = "broadcast"


# -- the new collective: its plan builder and its spec ----------------------------------------------------------
def broadcast_exchange(world: int, size: int) -> Exchange:
    """Rank 0 sends its ``size`` input bytes to offset 0 of every rank's output (its own included: the exchange's
    self-copy); nobody else sends."""
    sends = tuple(tuple(size if r == 0 else 0 for _ in range(world)) for r in range(world))
    zeros = tuple(tuple(0 for _ in range(world)) for _ in range(world))
    return Exchange(sends, zeros, zeros)


class Broadcast(OpSpec):
    """``output`` = rank 0's ``input`` on every rank (every rank passes an input of the output's size)."""

    name = NAME

    def chunks(self, world: int) -> tuple[int, int]:
        return 1, 1

    def bus_factor(self, world: int) -> float:
        return 1.0  # nccl-tests' broadcast: busbw = algbw

    def bind(self, group, output, input=None) -> Request:
        input = self.check_pair(group, output, input)
        if output.numel() != input.numel():
            raise InvalidArgument(f"broadcast output has {output.numel()} elements but input has {input.numel()}")
        size = nbytes(input)
        return Request(output, input, (size,), size, False,
                       exchange_plans(lambda: broadcast_exchange(group.world, size), group.rank))

    def reference(self, inputs, rank, counts=None) -> torch.Tensor:
        return inputs[0].reshape(-1).clone()

    def torch_call(self, output, input, group=None, counts=None) -> None:
        import torch.distributed as dist

        if output.data_ptr() != input.data_ptr():
            output.copy_(input)
        dist.broadcast(output, 0, group=group)


BROADCAST = Broadcast()


@contextlib.contextmanager
def registered():
    """The broadcast in the registry for the block, and out of it after, whatever happens."""
    ops.register(BROADCAST)
    try:
        yield BROADCAST
    finally:
        ops.REGISTRY.pop(NAME, None)


def _with_broadcast(rank, world, fn, *args):
    """A rank of a command: the broadcast registered in this rank's process, then the command's own rank function."""
    with registered():
        return fn(rank, world, *args)


@pytest.fixture
def toy(monkeypatch):
    """The broadcast registered here and, through the launcher, in every rank a command starts; gone after."""
    real = launch.run_ranks
    monkeypatch.setattr(launch, "run_ranks", lambda fn, world, *args, **kw: real(_with_broadcast, world, fn, *args,
                                                                                   **kw))
    with registered():
        yield BROADCAST
    assert NAME not in ops.REGISTRY and NAME not in ops.names()  # no leak into the tests after this one


# -- the registry ----------------------------------------------------------------------------------------------------
def test_registration_is_checked_and_undone():
    shipped = ops.names()
    with registered():
        assert ops.names() == (*shipped, NAME) and ops.get(NAME) is BROADCAST
        with pytest.raises(InvalidArgument, match="'broadcast' is already registered"):
            ops.register(Broadcast())
    assert ops.names() == shipped
    with pytest.raises(InvalidArgument, match="unknown collective 'broadcast'"):
        ops.get(NAME)
    with pytest.raises(InvalidArgument, match="takes an OpSpec"):
        ops.register("broadcast")

    class Unnamed(Broadcast):
        name = "two words"
    with pytest.raises(InvalidArgument, match="must be an identifier"):
        ops.register(Unnamed())


# -- `dmacoll check` on the host emulator ------------------------------------------------------------------------
@pytest.mark.parametrize("world", [2, 3, 4])
def test_dmacoll_check_runs_its_cases_against_its_reference(toy, world, seed, capsys):
    """The command end to end: the core grid (torch.distributed's broadcast on gloo as a second reference), the
    lean pipelines (a push exchange), every option family of the host engine, the multi-op sequence (every
    registered op) and the defaults."""
    from dmacoll_lab.cli import main
    from dmacoll_lab.verify.check import cases

    argv = ["check", "--backend", "host", "--world", str(world), "--ops", NAME, "--dtypes", "float32", "int8",
            "--counts", "1", "33", "--syncs", "reset", "--reference", "nccl", "--seed", str(seed)]
    rc = main(argv)
    out = capsys.readouterr().out
    assert rc == 0 and out.rstrip().endswith(" passed, 0 failed"), (seed, out[-3000:])
    families = {line.split(":")[0].strip(): line for line in out.splitlines() if line.endswith(" failed")
                and line.startswith("  ")}
    core = next(v for k, v in families.items() if k.startswith("core"))
    want = len(cases(["pcpy", "b2b", "multi"], ["push", "pull"], ["float32", "int8"], [1, 33], ops=[NAME]))
    assert f": {want} passed, 0 failed" in core, (seed, core)
    for family in ("lean pipelines", "signal=copy", "signal=kernel", "wait=spin", "wait=fold", "multi-op",
                   "defaults"):
        assert family in families and families[family].endswith(" 0 failed") and " 0 passed" not in families[
            family], (seed, family, out[-3000:])


# -- the benchmarks -------------------------------------------------------------------------------------------------
def test_the_sweep_measures_and_checks_it(toy, tmp_path):
    from dmacoll_lab.bench.sweep import SweepConfig, points
    from dmacoll_lab.cli import main

    dma = [p for p in points(SweepConfig(handshakes=("full", "lean")), NAME, 2) if p.impl == "dma"]
    assert {p.place for p in dma} == {"out"}  # no in-place form
    assert {(p.direction, p.handshake) for p in dma} == {("push", "full"), ("pull", "full"), ("push", "lean")}
    out = tmp_path / "sweep" / "data.csv"
    assert main(["sweep", "--backend", "host", "--world", "2", "--ops", NAME, "--impls", "nccl", "dma_default",
                 "dma", "peer_copy", "--variants", "b2b", "--handshakes", "full", "lean", "--min-bytes", "1K",
                 "--max-bytes", "2K", "--modes", "eager", "--calls", "2", "--repeats", "2", "--warmup", "1",
                 "--out", str(out)]) == 0
    df = pd.read_csv(out)
    assert set(df["op"]) == {NAME} and set(df["impl"]) == {"nccl", "dma_default", "dma", "peer_copy"}
    assert (df["status"] == "ok").all() and df["correct"].all(), df[["impl", "direction", "handshake", "error"]]
    assert (df["busbw_GBps"] == df["algbw_GBps"]).all()  # its bus factor, from its spec


def _library_c3_and_e2e(rank, world):
    """The Communicator's calls (symmetric buffers; private ones, pulled), C3's collective (dmacoll and the
    torch.distributed baseline, checked after a call) and the e2e model's interface (world 1, gloo, dmacoll)."""
    from dmacoll_lab.bench import c3, harness
    from dmacoll_lab.e2e.collectives import make

    with registered():
        comm = Communicator(backend="host", timeout_s=60)
        try:
            x, y = comm.empty(5).fill_(rank + 1), comm.empty(5)
            private = torch.full((5,), -1.0)
            comm.collective(NAME, y, x)
            comm.collective(NAME, private, x.clone(), variant="b2b", direction="pull")
            library = y.tolist(), private.tolist()
        finally:
            comm.close()
        rk = harness.Rank(rank, world, pool_bytes=4096)
        try:
            c3_ok = [b.check(b.run) for b in (c3.collective(rk, NAME, impl, 4096, 11) for impl in ("dma", "nccl"))]
        finally:
            rk.close()
        e2e = {}
        for impl in ("none", "nccl", "dma"):
            coll = make(impl, "cpu", {"x": 6, "y": 6}, torch.float32)
            try:
                x = coll.buffer("x", 2, 3).fill_(rank + 1)
                e2e[impl] = coll.collective(NAME, coll.buffer("y", 2, 3), x).tolist()
            finally:
                coll.close()
        return library, c3_ok, e2e


def test_the_communicator_c3_and_the_e2e_interface_run_it(toy):
    from dmacoll_lab.cli import main

    assert main(["c3", "--ops", NAME, "--dry-run"]) == 0  # the C3 command offers it
    for rank, (library, c3_ok, e2e) in enumerate(run_ranks(_library_c3_and_e2e, 3)):
        assert library == ([1.0] * 5, [1.0] * 5) and c3_ok == [True, True]
        assert e2e == {"none": [[rank + 1.0] * 3] * 2, "nccl": [[1.0] * 3] * 2, "dma": [[1.0] * 3] * 2}


# -- the workflow's config and vLLM ---------------------------------------------------------------------------------
def test_the_workflow_config_accepts_it_while_registered():
    from dmacoll_lab import workflow_config

    config = {"operator": {"ops": ["all_gather", NAME]}, "c3": {"ops": [NAME]}}
    with registered():
        workflow_config.check(config)
    with pytest.raises(InvalidArgument, match=r"operator\.ops: unknown value\(s\) broadcast; choose from all_gather, "):
        workflow_config.check(config)


def test_vllm_never_routes_it(toy):
    from dmacoll.integrations.vllm_routes import SERVED_BY, Routes

    assert NAME not in SERVED_BY.values()
    routes = Routes.shipped()
    for policy in ("measured", "moves", "all"):
        d = routes.decide(NAME, 1 << 20, "graph", 2, "NVIDIA H200", policy)
        assert not d.route and d.reason == "no vLLM call is served by dmacoll's broadcast (vllm_routes.SERVED_BY)"
