"""Prelaunch: collectives prepared ahead and held behind a gate until one release."""
import time

import torch

from dmacoll_lab.verify.launch import run_ranks


def _prelaunched(rank, world):
    import torch.distributed as dist

    from dmacoll import Communicator, InvalidArgument

    comm = Communicator(backend="host", timeout_s=10)
    x = comm.empty(4, dtype=torch.float32)
    out = comm.empty(4 * world, dtype=torch.float32)
    a2a_in = torch.empty(2 * world)
    a2a_out = torch.empty(2 * world)
    x.fill_(-1.0)  # stale data: what the collectives must NOT see
    out.fill_(float("nan"))
    with comm.prelaunch() as gate:
        comm.all_gather(out, x, variant="b2b")
        comm.all_to_all(a2a_out, a2a_in, direction="pull")
    report = {}
    try:
        comm.all_gather(out, x)
    except InvalidArgument as e:
        report["before_wait"] = str(e)
    time.sleep(0.2)  # the "producer" runs; nothing may have moved yet
    report["untouched"] = bool(torch.isnan(out).all())
    x.copy_(torch.arange(4, dtype=torch.float32) + 100 * rank)  # produce the input...
    a2a_in.copy_(torch.arange(2 * world, dtype=torch.float32) + 100 * rank)
    gate.release()  # ...then one write starts the prepared collectives
    gate.wait()
    report["gathered"] = out.tolist()
    report["a2a"] = a2a_out.tolist()
    comm.all_gather(out, x)  # the communicator goes on normally afterwards
    dist.barrier()
    comm.close()
    return report


def test_prelaunched_collectives_run_after_release_with_the_released_data():
    for rank, rep in enumerate(run_ranks(_prelaunched, 3)):
        assert rep["gathered"] == [float(r * 100 + i) for r in range(3) for i in range(4)]
        assert rep["a2a"] == [float(p * 100 + 2 * rank + i) for p in range(3) for i in range(2)]
        assert "still pending; call gate.wait() first" in rep["before_wait"]
        assert rep["untouched"]


def _never_released(rank, world):
    from dmacoll import Communicator, DmaCollTimeoutError

    comm = Communicator(backend="host", timeout_s=1.0)
    x = comm.empty(4, dtype=torch.float32)
    out = comm.empty(4 * world, dtype=torch.float32)
    with comm.prelaunch() as gate:
        comm.all_gather(out, x)
    try:
        gate.wait()
    except DmaCollTimeoutError as e:
        return str(e)
    finally:
        comm.close()


def test_a_gate_never_released_times_out():
    messages = run_ranks(_never_released, 2)
    assert all("nobody called Gate.release()" in m for m in messages)
