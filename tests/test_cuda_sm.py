"""The sm path's GPU-free parts (``dmacoll.backends.cuda_sm``): the area's layout, the grid every rank agrees on,
the ops' shapes and their refusals, the kernels' source (compiled by NVRTC where cuda-bindings is installed)."""
import ctypes

import pytest

from dmacoll.backends import cuda_sm
from dmacoll.errors import InvalidArgument


@pytest.mark.parametrize("world", range(2, 9))
def test_area_layout_keeps_slots_aligned_and_past_the_words(world):
    words = world * cuda_sm.MAX_BLOCKS + cuda_sm.MAX_BLOCKS  # flags per sender and block, an epoch per block
    assert cuda_sm.slots_offset(world) % 16 == 0 and 4 * words <= cuda_sm.slots_offset(world) < 4 * words + 16
    # then the slots (per parity and sender), then the LL region (lines: twice LL_MAX_BYTES per parity and sender)
    assert cuda_sm.ll_offset(world, 4096) == cuda_sm.slots_offset(world) + 2 * world * 4096
    assert cuda_sm.area_bytes(world, 4096) == cuda_sm.ll_offset(world, 4096) + 2 * world * 2 * cuda_sm.LL_MAX_BYTES


@pytest.mark.parametrize("slot", [0, -16, 24])
def test_area_refuses_slots_that_are_not_positive_multiples_of_16(slot):
    with pytest.raises(InvalidArgument, match="multiple of 16"):
        cuda_sm.area_bytes(4, slot)


def test_grid_grows_with_the_bytes_and_stays_within_the_flags():
    assert cuda_sm.grid(2, 16) == 1 and cuda_sm.grid(4, 1024) == 1
    sizes = [1 << k for k in range(4, 28)]
    for cap in (cuda_sm.BLOCKS, 132, 10 * cuda_sm.MAX_BLOCKS):
        grids = [cuda_sm.grid(8, n, cap) for n in sizes]
        assert grids == sorted(grids) and max(grids) == min(cap, cuda_sm.MAX_BLOCKS)
    assert cuda_sm.grid(4, 65536) == -(-3 * 4096 // (cuda_sm.THREADS * cuda_sm.VECTORS_PER_THREAD))
    assert cuda_sm.grid(2, 65536) == 65536 // cuda_sm.WORLD2_BLOCK_BYTES  # world 2: smaller blocks


def test_ll_kernels_take_only_parts_of_whole_vectors_on_every_rank():
    ll = 64 << 10
    assert cuda_sm.ll_kernels("all_to_all", 2, 64, 64, None, None, ll) == (True,)
    assert cuda_sm.ll_kernels("all_reduce", 2, 34, 34, None, None, ll) == (False,)  # not whole vectors
    assert cuda_sm.ll_kernels("all_gather", 4, 2 * ll, 8 * ll, None, None, ll) == (False,)  # too large
    # two-shot: the sum's chunks are whole vectors, the gather's last part is not
    assert cuda_sm.ll_kernels("all_reduce", 4, 4096 + 32, 4096 + 32, None, 0, ll) == (True, True)
    assert cuda_sm.ll_kernels("all_reduce", 4, 4096 + 34, 4096 + 34, None, 0, ll) == (False, False)
    # all_to_all_v: rank 0 sends and receives nothing (all its parts whole), rank 1 keeps 17 bytes: no rank takes LL
    # lines, or rank 0 would finish at once and rank 1 wait for rank 0's flag (the 2026-11-28 hang)
    assert cuda_sm.ll_kernels("all_to_all_v", 2, 17, 17, ((0, 0), (0, 17)), None, ll) == (False,)
    assert cuda_sm.ll_kernels("all_to_all_v", 2, 32, 48, ((0, 32), (16, 0)), None, ll) == (True,)


def test_ll_kernels_take_any_buffer_address():
    # what decides the kernel has no addresses in it: the kernels read and write bytewise off a vector
    source = cuda_sm.source()
    assert "load16(src + 16 * v)" in source and "store16(out + 16 * v" in source


@pytest.mark.parametrize("setting, variable, world2, elsewhere", [
    (cuda_sm.block_bytes, "DMACOLL_SM_BLOCK_BYTES", cuda_sm.WORLD2_BLOCK_BYTES, cuda_sm.BLOCK_BYTES),
    (cuda_sm.slot_bytes, "DMACOLL_SM_SLOT_BYTES", cuda_sm.WORLD2_SLOT_BYTES, cuda_sm.SLOT_BYTES),
])
def test_world_2_settings_and_their_variables(monkeypatch, setting, variable, world2, elsewhere):
    monkeypatch.delenv(variable, raising=False)
    assert (setting(2), setting(4), setting(8)) == (world2, elsewhere, elsewhere)
    monkeypatch.setenv(variable, "4096")
    assert setting(2) == setting(4) == 4096


def test_ll_bytes_is_measured_at_worlds_2_and_4_and_capped_by_its_region(monkeypatch):
    monkeypatch.delenv("DMACOLL_SM_LL_BYTES", raising=False)
    assert cuda_sm.ll_bytes(2) == cuda_sm.LL_MAX_BYTES and cuda_sm.ll_bytes(4) == 16 << 10
    assert cuda_sm.ll_bytes(3) == cuda_sm.ll_bytes(8) == 0  # not measured there
    monkeypatch.setenv("DMACOLL_SM_LL_BYTES", str(1 << 30))
    assert cuda_sm.ll_bytes(4) == cuda_sm.LL_MAX_BYTES
    monkeypatch.setenv("DMACOLL_SM_LL_BYTES", "0")
    assert cuda_sm.ll_bytes(2) == 0


@pytest.mark.parametrize("op, inp, out, want", [
    ("all_gather", 100, 400, ("gather", ((0, 100),) * 4, ((0, 100), (100, 100), (200, 100), (300, 100)), 100)),
    ("all_to_all", 400, 400, ("gather", ((0, 100), (100, 100), (200, 100), (300, 100)),
                              ((0, 100), (100, 100), (200, 100), (300, 100)), 100)),
    ("all_reduce", 256, 256, ("sum", ((0, 256),) * 4, ((0, 256),) * 4, 256)),
    ("reduce_scatter", 1024, 256, ("sum", ((0, 256), (256, 256), (512, 256), (768, 256)), ((0, 256),) * 4, 256)),
])
def test_call_shape_per_op(op, inp, out, want):
    shape = cuda_sm.call_shape(op, 4, 2, inp, out)
    assert tuple(shape)[:4] == want and (shape.out_offset, shape.reads_output) == (0, False)


@pytest.mark.parametrize("world, nbytes", [(3, 48), (4, 4096), (4, 4100), (8, 34), (4, 2), (5, 1 << 20)])
def test_chunks_cover_the_tensor_in_whole_vectors(world, nbytes):
    parts = cuda_sm.chunks(world, nbytes)
    assert len(parts) == world and sum(n for _, n in parts) == nbytes
    assert all(off == sum(n for _, n in parts[:p]) for p, (off, _) in enumerate(parts))  # back to back, in order
    full = [n for _, n in parts if n]
    assert all(n % 16 == 0 for n in full[:-1]) and max(full) == parts[0][1]  # the first part is the largest


@pytest.mark.parametrize("rank", range(4))
def test_two_shot_all_reduce_is_a_reduce_scatter_then_an_all_gather_in_place(rank):
    nbytes = 4 * 1000 + 40  # 4040 bytes: parts of 1024, 1024, 1024, 968
    one = cuda_sm.call_shapes("all_reduce", 4, rank, nbytes, nbytes, two_shot_bytes=nbytes + 1)
    assert one == (cuda_sm.call_shape("all_reduce", 4, rank, nbytes, nbytes),)
    rs, ag = cuda_sm.call_shapes("all_reduce", 4, rank, nbytes, nbytes, two_shot_bytes=nbytes)
    parts = ((0, 1024), (1024, 1024), (2048, 1024), (3072, 968))
    assert (rs.combine, rs.send, rs.largest, rs.out_offset, rs.reads_output) == ("sum", parts, 1024, parts[rank][0],
                                                                               False)
    assert rs.recv[rank] == (0, parts[rank][1])  # the sum's length: this rank's part from every sender
    assert (ag.combine, ag.send, ag.recv, ag.largest, ag.reads_output) == ("gather", (parts[rank],) * 4, parts, 1024,
                                                                          True)
    assert cuda_sm.sm_bytes("all_reduce", 4, rank, nbytes, nbytes, "float32", 1024, two_shot_bytes=0) == 1024
    assert cuda_sm.sm_bytes("all_reduce", 4, rank, nbytes, nbytes, "float32", 1024, two_shot_bytes=None) is None


def test_two_shots_are_for_all_reduce_only():
    assert len(cuda_sm.call_shapes("all_gather", 4, 0, 1 << 24, 1 << 26, two_shot_bytes=0)) == 1
    assert len(cuda_sm.call_shapes("all_reduce", 4, 0, 1 << 24, 1 << 24)) == 1  # no threshold: one shot


def test_at_world_2_two_shots_take_only_what_one_slot_cannot_hold():
    # both ways send the whole tensor over the one link, so one kernel while it fits a slot; two carry halves
    slot = 1 << 20
    first = cuda_sm.default_two_shot_bytes(2, slot)
    assert cuda_sm.default_two_shot_bytes(4, slot) == cuda_sm.TWO_SHOT_BYTES
    assert len(cuda_sm.call_shapes("all_reduce", 2, 0, slot, slot, two_shot_bytes=first)) == 1
    assert cuda_sm.sm_bytes("all_reduce", 2, 0, 2 * slot, 2 * slot, "bfloat16", slot, two_shot_bytes=first) == slot
    assert cuda_sm.sm_bytes("all_reduce", 2, 0, 2 * slot + 32, 2 * slot + 32, "bfloat16", slot, None, first) is None
    rs, ag = cuda_sm.call_shapes("all_reduce", 2, 1, 2 * slot, 2 * slot, two_shot_bytes=first)
    assert rs.out_offset == slot and ag.send == ((slot, slot),) * 2 and ag.reads_output


def test_all_to_all_v_shape_follows_the_matrix():
    matrix = ((1, 2, 3), (4, 5, 6), (7, 8, 9))  # bytes from rank i to rank j
    shape = cuda_sm.call_shape("all_to_all_v", 3, 1, 15, 15, matrix)
    assert shape.send == ((0, 4), (4, 5), (9, 6))  # row 1, back to back in the input
    assert shape.recv == ((0, 2), (2, 5), (7, 8))  # column 1, in rank order in the output
    assert shape.largest == 9  # the largest entry: the same on every rank
    with pytest.raises(InvalidArgument, match="matrix"):
        cuda_sm.call_shape("all_to_all_v", 3, 1, 15, 15)


@pytest.mark.parametrize("op, inp, out", [("all_gather", 100, 300), ("all_reduce", 256, 128), ("all_to_all", 402, 402),
                                          ("reduce_scatter", 1000, 256), ("broadcast", 4, 4)])
def test_call_shape_refuses_what_does_not_fit(op, inp, out):
    with pytest.raises(InvalidArgument):
        cuda_sm.call_shape(op, 4, 0, inp, out)


def test_call_shape_refuses_more_ranks_than_the_arguments_hold():
    with pytest.raises(InvalidArgument, match="up to 8 ranks"):
        cuda_sm.call_shape("all_reduce", cuda_sm.MAX_WORLD + 1, 0, 64, 64)


@pytest.mark.parametrize("op, inp, out, dtype, want", [
    ("all_reduce", 1024, 1024, "bfloat16", 1024),
    ("all_reduce", 1024, 1024, "int8", None),  # no sum for int8
    ("all_gather", 1024, 4096, "int8", 1024),  # gathers move bytes of any dtype
    ("broadcast", 1024, 1024, "float32", None),  # not an sm op
    ("reduce_scatter", 4 * cuda_sm.SLOT_BYTES, cuda_sm.SLOT_BYTES, "float32", cuda_sm.SLOT_BYTES),
    ("reduce_scatter", 8 * cuda_sm.SLOT_BYTES, 2 * cuda_sm.SLOT_BYTES, "float32", None),  # beyond the slots
    ("all_gather", 1000, 3000, "float32", None),  # sizes that do not fit the op
])
def test_sm_bytes_says_which_calls_the_path_runs(op, inp, out, dtype, want):
    assert cuda_sm.sm_bytes(op, 4, 0, inp, out, dtype, cuda_sm.SLOT_BYTES) == want


def test_sm_bytes_of_all_to_all_v_is_its_largest_entry():
    matrix = ((0, 64, 0, 0), (16, 0, 0, 0), (0, 0, 0, 1 << 20), (0, 0, 0, 0))
    assert cuda_sm.sm_bytes("all_to_all_v", 4, 3, 64, 1 << 20, "int8", cuda_sm.SLOT_BYTES, matrix) == 1 << 20


def test_parts_hold_a_row_per_rank_up_to_the_largest_world():
    parts = cuda_sm.Parts()
    assert len(parts.send_off) == cuda_sm.MAX_WORLD and ctypes.sizeof(parts) == 4 * 8 * cuda_sm.MAX_WORLD


def test_source_has_a_gather_and_a_sum_per_dtype_and_compiles_where_nvrtc_is():
    src = cuda_sm.source()
    assert "@MAX_BLOCKS@" not in src and f"#define SM_MAX_BLOCKS {cuda_sm.MAX_BLOCKS}" in src
    assert src.count("extern \"C\" __global__ void dmacoll_sm_sum_") == len(cuda_sm.FOLD_TYPES)
    assert src.count("extern \"C\" __global__ void dmacoll_sm_ll_sum_") == len(cuda_sm.FOLD_TYPES)
    assert "@MAX_WORLD@" not in src and f"#define SM_MAX_WORLD {cuda_sm.MAX_WORLD}" in src
    pytest.importorskip("cuda.bindings.nvrtc")
    from dmacoll.backends.cubins import compile_program
    try:
        cubin = compile_program(src, "dmacoll_sm.cu", "sm_90")
    except Exception as e:  # noqa: BLE001 - NVRTC's library may be missing beside the bindings
        if "could not compile" in str(e):
            raise
        pytest.skip(f"NVRTC unavailable: {e}")
    assert len(cubin) > 0


@pytest.mark.parametrize("op, inp, out, matrix", [
    ("all_to_all", 4 * 8196 * 33, 4 * 8196 * 33, None),  # Mixtral's dispatch rows: 33 x 8196 bytes per peer
    ("all_reduce", 34, 34, None),
    ("all_to_all_v", 64, 64, ((16, 48), (30, 2))),  # one rank's odd part: every rank says the same
])
def test_parts_that_are_not_whole_vectors_take_the_sm_path(op, inp, out, matrix):
    # the kernels copy them in the widest unit that divides them (results/h200x2/sm_path/sm_path_unaligned/)
    world = 2 if matrix else 4
    assert cuda_sm.sm_bytes(op, world, 0, inp, out, "bfloat16", 1 << 30, matrix) is not None


def test_the_library_docs_say_how_many_sms_the_path_occupies():
    """docs/library.md's count of the sm path's blocks is the code's (a block per SM where SMs are free)."""
    from pathlib import Path

    text = " ".join((Path(__file__).resolve().parents[1] / "docs/library.md").read_text().split())
    kb = 1024
    said = (f"a block of {cuda_sm.THREADS} threads per {cuda_sm.BLOCK_BYTES // kb} KB it sends "
            f"({cuda_sm.WORLD2_BLOCK_BYTES // kb} KB at two ranks), at most {cuda_sm.BLOCKS} blocks")
    assert said in text
    examples = (f"a 1 KB call takes {cuda_sm.grid(4, kb)}, a 64 KB all_reduce {cuda_sm.grid(2, 64 * kb)} at two "
                f"ranks and {cuda_sm.grid(4, 64 * kb)} at four, 1 MB per peer {cuda_sm.grid(4, 1 << 20)}")
    assert examples in text and cuda_sm.grid(2, kb) == cuda_sm.grid(4, kb)
