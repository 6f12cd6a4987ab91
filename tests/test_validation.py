"""Bad input is rejected before any work, with a message that says what to change."""
import pytest
import torch

from dmacoll_lab.verify.launch import run_ranks


def _bad_calls(rank, world):
    from dmacoll import Communicator, InvalidArgument

    comm = Communicator(backend="host", staging_bytes=4096, heap_bytes=1 << 16, timeout_s=5)
    x = torch.zeros(8)
    out = torch.zeros(8 * world)
    calls = {
        "dtype": lambda: comm.all_gather(out, x.to(torch.float64)),
        "size": lambda: comm.all_gather(torch.zeros(8 * world + 1), x),
        "contiguous": lambda: comm.all_gather(out, torch.zeros(8, 2)[:, 0]),
        "device": lambda: comm.all_gather(out, torch.zeros(8, device="meta")),
        "not_tensor": lambda: comm.all_gather(out, [1.0] * 8),
        "a2a_divisible": lambda: comm.all_to_all(torch.zeros(7), torch.zeros(7)),
        "a2a_sizes": lambda: comm.all_to_all(torch.zeros(8), torch.zeros(10)),
        "a2av_shape": lambda: comm.all_to_all_v(out, x, [[1, 2]]),
        "a2av_negative": lambda: comm.all_to_all_v(out, x, [[-1] * world] * world),
        "a2av_input_short": lambda: comm.all_to_all_v(out, x, [[8] * world] * world),
        "capacity": lambda: comm.all_gather(torch.zeros(4096 * world), torch.zeros(4096)),
        "variant": lambda: comm.all_gather(out, x, variant="bcst"),
        "option": lambda: comm.all_gather(out, x, engine=3),
        "heap": lambda: comm.empty(1 << 20),
        "rs_int8": lambda: comm.reduce_scatter(x.to(torch.int8), out.to(torch.int8)),
        "ar_bool": lambda: comm.all_reduce(x.bool()),
        "rs_size": lambda: comm.reduce_scatter(x, torch.zeros(8 * world + 1)),
        "rs_dtype": lambda: comm.reduce_scatter(x, out.double()),
        "ar_size": lambda: comm.all_reduce(x, torch.zeros(9)),
        "rs_capacity": lambda: comm.reduce_scatter(torch.zeros(1024), torch.zeros(1024 * world)),
        "ar_capacity": lambda: comm.all_reduce(torch.zeros(2048)),
        "ar_option": lambda: comm.all_reduce(x, direction="sideways"),
        "submit": lambda: comm.all_gather(out, x, submit="c++"),
        "submit_host": lambda: comm.all_gather(out, x, submit="native"),
    }
    messages = {}
    for name, fn in calls.items():
        try:
            fn()
            messages[name] = None
        except InvalidArgument as e:
            messages[name] = str(e)
    ok = comm.all_gather(out, x + rank)  # the communicator still works afterwards
    messages["still_works"] = ok.tolist() == [float(r) for r in range(world) for _ in range(8)]
    messages["reduce_still_works"] = comm.all_reduce(x + rank).tolist() == [float(sum(range(world)))] * 8
    comm.close()
    return messages


@pytest.fixture(scope="module")
def messages():
    return run_ranks(_bad_calls, 2)[0]


@pytest.mark.parametrize("name,fragment", [
    ("dtype", "use the same dtype"),
    ("size", "needs world x input = 2 x 8 = 16"),
    ("contiguous", "pass input.contiguous()"),
    ("device", "move it with input.to('cpu')"),
    ("not_tensor", "must be a torch.Tensor"),
    ("a2a_divisible", "not divisible by the world size 2"),
    ("a2a_sizes", "equal-split all_to_all needs the same number"),
    ("a2av_shape", "must be 2 x 2"),
    ("a2av_negative", "negative count"),
    ("a2av_input_short", "sends 16 elements"),
    ("capacity", "larger staging_bytes"),
    ("variant", "variant='bcst' is not one of"),
    ("option", "unknown option(s) ['engine']"),
    ("heap", "larger heap_bytes"),
    ("rs_int8", "reduce_scatter does not sum torch.int8; supported dtypes: float32, float64, float16, bfloat16"),
    ("ar_bool", "cast the tensors first (e.g. bool/int8/uint8 to torch.int32)"),
    ("rs_size", "reduce_scatter input has 17 elements but needs world x output = 2 x 8 = 16"),
    ("rs_dtype", "use the same dtype"),
    ("ar_size", "all_reduce output has 8 elements but input has 9"),
    ("rs_capacity", "reduce_scatter (push) needs 8192 bytes but only 4096 are available"),
    ("rs_capacity", "larger staging_bytes (>= 8192)"),
    ("ar_capacity", "reduce collectives receive every rank's chunk there"),
    ("ar_option", "direction='sideways' is not one of"),
    ("submit", "submit='c++' is not one of ('python', 'native', 'auto')"),
    ("submit_host", "submit='native' issues CUDA driver calls: it needs backend='cuda', not 'host'"),
])
def test_message_says_what_to_change(messages, name, fragment):
    assert messages[name] is not None, f"{name} was accepted"
    assert fragment in messages[name]


def test_communicator_survives_rejected_calls(messages):
    assert messages["still_works"] is True
    assert messages["reduce_still_works"] is True


def _single_rank(rank, world):
    from dmacoll import Communicator, InvalidArgument

    try:
        Communicator(backend="host")
    except InvalidArgument as e:
        return str(e)


def test_world_of_one_is_rejected():
    assert "at least 2 ranks" in run_ranks(_single_rank, 1)[0]


def test_unknown_backend_is_rejected():
    from dmacoll.backends import resolve
    from dmacoll.errors import BackendUnavailable

    with pytest.raises(BackendUnavailable, match="unknown backend"):
        resolve("tpu")
    with pytest.raises(BackendUnavailable, match="hip backend unavailable"):  # no hip-python / ROCm torch here
        resolve("hip")
    assert resolve("auto") in ("cuda", "hip", "host")
