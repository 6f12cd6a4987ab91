"""One-shot SM collectives over the symmetric heap (the ``sm`` data path of issue 49): one kernel per call (two for a
large all_reduce: ``call_shapes``, ``default_two_shot_bytes``).

Every rank's kernel stores its data straight into each peer's heap over NVLink, tells that peer with one flag word
per block, waits for every peer's flags, then combines what arrived in its own heap into the output: copies
(all_gather, all_to_all) or a sum in rank order (all_reduce, reduce_scatter; the same arithmetic on every rank, so
every rank's all_reduce result is bit-identical). No barrier before the data: slots alternate by the call's epoch
parity, and a peer cannot get two calls ahead (its next call waits for our flags of this one).

The SM area, at the same heap offset on every rank (``area_bytes``):

* ``flags[world][MAX_BLOCKS]`` u32: the epoch sender q's block b has delivered to this rank;
* ``counts[MAX_BLOCKS]`` u32: this rank's epoch, one word per block so that no block reads a word another block
  of the same launch writes (all equal between calls: block 0 also advances the words past the grid);
* ``slots[2][world][slot_bytes]``: by parity, what sender q delivered.

Epochs live in device memory, so a captured graph replays correctly. A wait gives up after ``timeout_ns``
(``%globaltimer``), sets the silent sender's bit in a word of pinned host memory (``SmPath.silent``, read by the host
without synchronizing) and lets the kernel end: the GPU never stays hung, and the next call raises.
Each block sends and later combines the same 16-byte vectors (and block 0 all the unaligned bytes), so an
in-place all_reduce never overwrites input that another block has yet to send.
"""
from __future__ import annotations

import ctypes
import os
import string
from typing import Callable, NamedTuple, Optional, Sequence

from ..errors import InvalidArgument
from .cubins import compile_program
from .cuda_kernels import FOLD_TYPES, HELPERS

MAX_BLOCKS = 256  # the flag words' layout: the most blocks a launch may have (its grid: ``SmPath.blocks``)
MAX_WORLD = 8  # per-peer offsets travel in the kernel's arguments (``Parts``)
THREADS = 512
VECTORS_PER_THREAD = 2  # 16-byte vectors each thread sends per peer before another block is worth its launch


def per_world(variable: str, world: int, measured: dict[int, int], elsewhere: int) -> int:
    """A setting measured apart at some worlds: ``$variable`` where set (at every world, for measuring), else
    ``measured[world]`` or ``elsewhere``."""
    forced = os.environ.get(variable)
    return int(forced) if forced else measured.get(world, elsewhere)


# bytes a block sends before the grid grows by a block (``block_bytes``): 16 KB; 2 KB at world 2, where 16-64 KB calls
# then spread over 8-32 blocks and took about 1 us less, graph-replayed, in three runs on 2x H200, 1-4 KB and 256 KB
# the same (results/h200x2/sm_path/small_calls_block_bytes_*). $DMACOLL_SM_BLOCK_BYTES sets it at every world
BLOCK_BYTES = THREADS * VECTORS_PER_THREAD * 16
WORLD2_BLOCK_BYTES = 2048


def block_bytes(world: int) -> int:
    return per_world("DMACOLL_SM_BLOCK_BYTES", world, {2: WORLD2_BLOCK_BYTES}, BLOCK_BYTES)


OPS = {"all_gather": "gather", "all_to_all": "gather", "all_to_all_v": "gather", "all_reduce": "sum",
       "reduce_scatter": "sum"}  # op -> how a rank combines what arrived
# what a communicator reserves per sender and parity (the largest part the sm path takes; ``slot_bytes``): 4 MB, 8 MB
# at world 2 (an all_reduce of 16 MB there runs as two kernels of 8 MB halves: 0.91 of NCCL where the copy engines
# took 1.13, results/h200x2/sm_path/); the area is 2 x world x this (32 MB at worlds 2 and 4).
# $DMACOLL_SM_SLOT_BYTES sets it at every world, for measuring larger calls
SLOT_BYTES = 4 << 20
WORLD2_SLOT_BYTES = 8 << 20


def slot_bytes(world: int) -> int:
    """A communicator's slot size at ``world`` ranks."""
    return per_world("DMACOLL_SM_SLOT_BYTES", world, {2: WORLD2_SLOT_BYTES}, SLOT_BYTES)


# the most blocks a launch takes ($DMACOLL_SM_BLOCKS, for measuring; never more than the GPU's SMs: a block waits for
# every sender's blocks, so all must be resident at once). One block per SM was faster graph-replayed on 4x H200 (at
# world 2 from 2 MB per peer, 0.59 of NCCL against 0.65 for a 4 MB all_reduce; at world 4 from 8 MB per peer,
# results/h200x4/sm_path/sm_path_large/), but two such kernels (two communicators' calls at once) could not both be
# resident and would wait for each other until the timeout; 64 blocks of 512 threads leave room for a second.
BLOCKS = int(os.environ.get("DMACOLL_SM_BLOCKS", 64))
# all_reduce from this many bytes at world >= 3 runs two kernels, a reduce_scatter of world chunks and an all_gather of
# them: (world - 1) / world of the tensor over each link twice, where the one-shot kernel sends all of it to every
# peer. From 2 MB at world 4 two shots were faster graph-replayed (0.70 of NCCL against 0.88 at 2 MB;
# results/h200x4/sm_path/sm_path_large/); $DMACOLL_SM_TWO_SHOT_BYTES. At world 2 both move the same bytes: see
# ``default_two_shot_bytes``.
TWO_SHOT_BYTES = int(os.environ.get("DMACOLL_SM_TWO_SHOT_BYTES", 2 << 20))


def default_two_shot_bytes(world: int, slot_bytes: int) -> int:
    """The all_reduce size from which a path runs two kernels by default: ``TWO_SHOT_BYTES`` at world >= 3; at world
    2 (where one kernel and two move the same bytes over the link) only a tensor larger than a slot, which one kernel
    cannot take and two, in halves, can."""
    return TWO_SHOT_BYTES if world >= 3 else slot_bytes + 1


# LL calls (``ll_bytes``: parts of whole 16-byte vectors up to this many bytes per peer) carry the epoch beside every 4
# data bytes, in a region of their own past the slots (``ll_offset``): stale words there only ever hold older epochs,
# where the slots' raw data could hold any value. At world 2 up to 64 KB per peer: 1-64 KB calls took 0.7-1.7 us less
# than the regular kernels, graph-replayed, in two runs each on 2x H200 (all_reduce 0.41-0.52 of NCCL;
# results/h200x2/sm_path/small_calls_ll_*). At world 4 up to 16 KB: on / off in three alternating runs on 4x H200
# (results/h200x4/sm_path/small_calls_ll_{on,off}_run*), LL was faster or level for every op up to 16 KB (medians of
# the runs: all_reduce 1-4 KB 0.46-0.52 of NCCL against 0.55-0.61, all_to_all 2-16 KB 0.68-0.78 against 0.84-1.05)
# and slower for every op at 64 KB (three peers' LL words). Not measured at other worlds, so off there.
# $DMACOLL_SM_LL_BYTES sets the largest part sent that way at every world (0: none)
LL_MAX_BYTES = 64 << 10
LL_BYTES = {2: 64 << 10, 4: 16 << 10}


def ll_bytes(world: int) -> int:
    return min(LL_MAX_BYTES, per_world("DMACOLL_SM_LL_BYTES", world, LL_BYTES, 0))


def slots_offset(world: int) -> int:
    """Byte offset of the slots in the area: the flag and count words, rounded up to 16 bytes."""
    words = world * MAX_BLOCKS + MAX_BLOCKS
    return -(-4 * words // 16) * 16


def area_bytes(world: int, slot_bytes: int) -> int:
    if slot_bytes <= 0 or slot_bytes % 16:
        raise InvalidArgument(f"slot_bytes must be a positive multiple of 16, got {slot_bytes}")
    return ll_offset(world, slot_bytes) + 2 * world * 2 * LL_MAX_BYTES


def ll_offset(world: int, slot_bytes: int) -> int:
    """Byte offset of the LL region in the area: per parity and sender, lines of twice ``LL_MAX_BYTES``."""
    return slots_offset(world) + 2 * world * slot_bytes


def grid(world: int, nbytes: int, blocks: int = BLOCKS) -> int:
    """Blocks for a kernel moving up to ``nbytes`` to each of ``world - 1`` peers, at most ``blocks``: the same on
    every rank (the receivers wait for one flag per sender block)."""
    sent = (world - 1) * -(-nbytes // 16) * 16  # whole vectors to every peer
    return max(1, min(blocks, MAX_BLOCKS, -(-sent // block_bytes(world))))


COMMON = HELPERS + r"""
#define SM_MAX_BLOCKS @MAX_BLOCKS@
#define SM_MAX_WORLD @MAX_WORLD@
struct __align__(16) V16 { unsigned a, b, c, d; };
// bytes: what this rank sends to peer p (from its input) and where what sender q sent lands (in its output)
struct Parts {
    long long send_off[SM_MAX_WORLD], send_len[SM_MAX_WORLD], recv_off[SM_MAX_WORLD], recv_len[SM_MAX_WORLD];
};

__device__ __forceinline__ void store_release(unsigned* p, unsigned v) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" :: "l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ u64 now_ns() {
    u64 t;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
    return t;
}
// the widest unit (16, 8, 4, 2 or 1 bytes) that divides both addresses and the length
__device__ __forceinline__ int granule(const void* a, const void* b, long long n) {
    u64 x = ((u64)a) | ((u64)b) | (u64)n;
    return (x & 15) == 0 ? 16 : (x & 7) == 0 ? 8 : (x & 3) == 0 ? 4 : (x & 1) == 0 ? 2 : 1;
}
template <typename U>
__device__ __forceinline__ void copy_units(char* dst, const char* src, long long n, long long gt, long long gs) {
    for (long long u = gt; u < n / (long long)sizeof(U); u += gs) ((U*)dst)[u] = ((const U*)src)[u];
}
// src -> dst, n bytes, in the widest unit that divides them, over the grid (thread gt, stride gs): a thread copies
// the same units of a part whenever the part's addresses agree (what in-place calls rely on)
__device__ __forceinline__ void copy_part(char* dst, const char* src, long long n, long long gt, long long gs) {
    switch (granule(dst, src, n)) {
        case 16: copy_units<V16>(dst, src, n, gt, gs); break;
        case 8: copy_units<unsigned long long>(dst, src, n, gt, gs); break;
        case 4: copy_units<unsigned>(dst, src, n, gt, gs); break;
        case 2: copy_units<unsigned short>(dst, src, n, gt, gs); break;
        default: copy_units<unsigned char>(dst, src, n, gt, gs);
    }
}

struct Sm { char* mine; unsigned e; int parity; long long gt, gs; };

// This call's epoch (this block's count + 1), its slots' parity, the thread's place in the grid.
__device__ Sm sm_begin(const u64* bases, long long area, int me, int world) {
    __shared__ unsigned epoch;
    Sm s;
    s.mine = (char*)bases[me] + area;
    unsigned* counts = (unsigned*)s.mine + world * SM_MAX_BLOCKS;
    if (threadIdx.x == 0) epoch = *(volatile unsigned*)(counts + blockIdx.x) + 1;
    __syncthreads();
    s.e = epoch;
    s.parity = s.e & 1;
    s.gt = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    s.gs = (long long)gridDim.x * blockDim.x;
    return s;
}

// Phase 1 and 2 of every kernel: send this rank's parts to every peer's slot, flag them, wait for every peer's flags.
__device__ Sm sm_exchange(const u64* bases, long long area, long long slots_off, int me, int world,
                          long long slot_bytes, const char* in, const Parts& P, u64 timeout_ns, unsigned* silent) {
    Sm s = sm_begin(bases, area, me, world);
    for (int i = 1; i < world; ++i) {
        int p = (me + i) % world;
        char* dst = (char*)bases[p] + area + slots_off + ((long long)s.parity * world + me) * slot_bytes;
        copy_part(dst, in + P.send_off[p], P.send_len[p], s.gt, s.gs);
    }
    __syncthreads();  // every thread's stores, then one release per peer: the flag says the block's part is there
    if (threadIdx.x < world - 1) {
        int p = (me + 1 + threadIdx.x) % world;
        unsigned* flags = (unsigned*)((char*)bases[p] + area);
        store_release(flags + me * SM_MAX_BLOCKS + blockIdx.x, s.e);
    }
    unsigned* mine = (unsigned*)s.mine;
    int waits = (world - 1) * gridDim.x;
    for (int t = threadIdx.x; t < waits; t += blockDim.x) {
        int q = (me + 1 + t / gridDim.x) % world;
        unsigned* f = mine + q * SM_MAX_BLOCKS + t % gridDim.x;
        u64 start = now_ns();
        for (unsigned k = 0; (int)(load_acquire(f) - s.e) < 0; ++k) {
            if ((k & 1023) == 1023 && now_ns() - start > timeout_ns) {
                atomicOr_system(silent, 1u << q);  // pinned host memory: the host reads it without a sync
                break;
            }
        }
    }
    __syncthreads();
    return s;
}

__device__ __forceinline__ const char* slot_of(const Sm& s, long long slots_off, int world, long long slot_bytes,
                                                int q) {
    return s.mine + slots_off + ((long long)s.parity * world + q) * slot_bytes;
}

// The epoch moves on: each block its own word; block 0 also the words past the grid (unused by this launch)
__device__ __forceinline__ void sm_finish(const Sm& s, int world) {
    __syncthreads();
    unsigned* counts = (unsigned*)s.mine + world * SM_MAX_BLOCKS;
    if (threadIdx.x == 0) counts[blockIdx.x] = s.e;
    if (blockIdx.x == 0)
        for (int b = gridDim.x + threadIdx.x; b < SM_MAX_BLOCKS; b += blockDim.x) counts[b] = s.e;
}

#define SM_ARGS const u64* bases, long long area, long long slots_off, int me, int world, long long slot_bytes, \
    const char* in, char* out, u64 timeout_ns, unsigned* silent, Parts P

// all_gather, all_to_all(_v): what sender q sent (our own part from the input) lands at recv_off[q]
extern "C" __global__ void dmacoll_sm_gather(SM_ARGS) {
    Sm s = sm_exchange(bases, area, slots_off, me, world, slot_bytes, in, P, timeout_ns, silent);
    for (int q = 0; q < world; ++q) {
        const char* src = q == me ? in + P.send_off[me] : slot_of(s, slots_off, world, slot_bytes, q);
        char* dst = out + P.recv_off[q];
        if (src != dst) copy_part(dst, src, P.recv_len[q], s.gt, s.gs);  // in place: our part is there
    }
    sm_finish(s, world);
}

// LL (small calls, parts of whole 16-byte vectors): a vector travels as two 16-byte lines {a, e, b, e} {c, e, d, e},
// the epoch beside every 4 data bytes in one 8-byte word, which NVLink delivers whole. A receiver polls its own slot's
// lines until every word carries this call's epoch: no fence, no flag word, no wait for a whole block's stores.
// Which kernel runs may not hang on this rank's buffer addresses (every rank must take the same one, or each waits
// for what the other never sends): the input and output may sit anywhere, read and written bytewise off a vector.
__device__ __forceinline__ V16 load16(const char* p) {
    if (((u64)p & 15) == 0) return *(const V16*)p;
    V16 v;
    for (int k = 0; k < 16; ++k) ((char*)&v)[k] = p[k];
    return v;
}
__device__ __forceinline__ void store16(char* p, const V16& v) {
    if (((u64)p & 15) == 0) { *(V16*)p = v; return; }
    for (int k = 0; k < 16; ++k) p[k] = ((const char*)&v)[k];
}
__device__ __forceinline__ void ll_store(char* dst, const V16& v, unsigned e) {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" :: "l"(dst), "r"(v.a), "r"(e), "r"(v.b), "r"(e)
                 : "memory");
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" :: "l"(dst + 16), "r"(v.c), "r"(e), "r"(v.d),
                 "r"(e) : "memory");
}
// The vector sender q put at ``src`` this call; after timeout_ns sets q's silent bit, marks q dead (no more waits on
// it this call) and gives zeros.
__device__ __forceinline__ V16 ll_wait(const char* src, unsigned e, int q, unsigned& dead, u64 timeout_ns,
                                       unsigned* silent) {
    V16 v = {0u, 0u, 0u, 0u};
    if (dead >> q & 1) return v;
    unsigned f0, f1, f2, f3;
    u64 start = 0;
    for (unsigned k = 0;; ++k) {
        asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.a), "=r"(f0), "=r"(v.b), "=r"(f1)
                     : "l"(src) : "memory");
        asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.c), "=r"(f2), "=r"(v.d), "=r"(f3)
                     : "l"(src + 16) : "memory");
        if (f0 == e && f1 == e && f2 == e && f3 == e) return v;
        if ((k & 1023) == 0) {
            if (k == 0) start = now_ns();
            else if (now_ns() - start > timeout_ns) {
                atomicOr_system(silent, 1u << q);
                dead |= 1u << q;
                V16 z = {0u, 0u, 0u, 0u};
                return z;
            }
        }
    }
}
// Send this rank's parts as LL lines into every peer's slot (vector v of a part at 32 v): each thread sends the
// vectors it later combines (the same grid stride), so in-place calls stay safe as in sm_exchange.
__device__ __forceinline__ void ll_send(const Sm& s, const u64* bases, long long area, long long slots_off, int me,
                                        int world, long long slot_bytes, const char* in, const Parts& P) {
    for (int i = 1; i < world; ++i) {
        int p = (me + i) % world;
        char* dst = (char*)bases[p] + area + slots_off + ((long long)s.parity * world + me) * slot_bytes;
        const char* src = in + P.send_off[p];
        for (long long v = s.gt; v < P.send_len[p] / 16; v += s.gs) ll_store(dst + 32 * v, load16(src + 16 * v), s.e);
    }
}

extern "C" __global__ void dmacoll_sm_ll_gather(SM_ARGS) {
    Sm s = sm_begin(bases, area, me, world);
    ll_send(s, bases, area, slots_off, me, world, slot_bytes, in, P);
    unsigned dead = 0;
    for (int q = 0; q < world; ++q) {
        char* dst = out + P.recv_off[q];
        if (q == me) {
            const char* own = in + P.send_off[me];
            if (own != dst)
                for (long long v = s.gt; v < P.recv_len[q] / 16; v += s.gs) store16(dst + 16 * v, load16(own + 16 * v));
            continue;
        }
        const char* slot = slot_of(s, slots_off, world, slot_bytes, q);
        for (long long v = s.gt; v < P.recv_len[q] / 16; v += s.gs)
            store16(dst + 16 * v, ll_wait(slot + 32 * v, s.e, q, dead, timeout_ns, silent));
    }
    sm_finish(s, world);
}
"""

# all_reduce, reduce_scatter: out (recv_len[me] bytes) = the parts of every rank, added in rank order. Each thread
# sends and later writes the same 16-byte vectors (send_off is 0 for an all_reduce), so in place is safe.
SUM = string.Template(r"""
// one 16-byte vector of sender q (rank order: q = 0 starts the sum) into acc; acc back into a vector
__device__ __forceinline__ void fold_in_$NAME($ACC* acc, const V16& w, int q) {
    const $T* el = (const $T*)&w;
    for (int k = 0; k < 16 / (int)sizeof($T); ++k) { $T x = el[k]; $ACC y = $LOAD; acc[k] = q == 0 ? y : acc[k] + y; }
}
__device__ __forceinline__ V16 fold_out_$NAME(const $ACC* acc) {
    V16 w;
    $T* el = ($T*)&w;
    for (int k = 0; k < 16 / (int)sizeof($T); ++k) { $ACC x = acc[k]; el[k] = $STORE; }
    return w;
}
extern "C" __global__ void dmacoll_sm_sum_$NAME(SM_ARGS) {
    Sm s = sm_exchange(bases, area, slots_off, me, world, slot_bytes, in, P, timeout_ns, silent);
    const long long n = P.recv_len[me];
    const char* own = in + P.send_off[me];
    $T* o = ($T*)out;
    // in units of the send's granule (the slots are 16-byte aligned): in place, a thread adds the units it sent
    const int g = granule(own, out, n);
    const long long nvec = g == 16 ? n / 16 : 0;
    for (long long v = s.gt; v < nvec; v += s.gs) {
        $ACC acc[16 / sizeof($T)];
        for (int q = 0; q < world; ++q)  // rank order: every rank adds alike
            fold_in_$NAME(acc, ((const V16*)(q == me ? own : slot_of(s, slots_off, world, slot_bytes, q)))[v], q);
        ((V16*)o)[v] = fold_out_$NAME(acc);
    }
    const int per = g / (int)sizeof($T);  // elements per unit below 16 bytes (a dtype's element divides g)
    for (long long u = s.gt; g < 16 && u < n / g; u += s.gs) {
        for (int k = 0; k < per; ++k) {
            long long j = u * per + k;
            $ACC acc = 0;
            for (int q = 0; q < world; ++q) {
                const $T* src = (const $T*)(q == me ? own : slot_of(s, slots_off, world, slot_bytes, q));
                $T x = src[j];
                $ACC y = $LOAD;
                acc = q == 0 ? y : acc + y;
            }
            $ACC x = acc;
            o[j] = $STORE;
        }
    }
    sm_finish(s, world);
}
""")


# all_reduce, reduce_scatter over LL lines (``LL``): the same sum in rank order as SUM, whole vectors only.
SUM_LL = string.Template(r"""
extern "C" __global__ void dmacoll_sm_ll_sum_$NAME(SM_ARGS) {
    Sm s = sm_begin(bases, area, me, world);
    ll_send(s, bases, area, slots_off, me, world, slot_bytes, in, P);
    const long long nvec = P.recv_len[me] / 16;
    const char* own = in + P.send_off[me];
    unsigned dead = 0;
    for (long long v = s.gt; v < nvec; v += s.gs) {
        $ACC acc[16 / sizeof($T)];
        for (int q = 0; q < world; ++q)  // rank order: every rank adds alike
            fold_in_$NAME(acc, q == me ? load16(own + 16 * v) : ll_wait(slot_of(s, slots_off, world, slot_bytes, q)
                                                                        + 32 * v, s.e, q, dead, timeout_ns, silent), q);
        store16(out + 16 * v, fold_out_$NAME(acc));
    }
    sm_finish(s, world);
}
""")


def source() -> str:
    common = COMMON.replace("@MAX_BLOCKS@", str(MAX_BLOCKS)).replace("@MAX_WORLD@", str(MAX_WORLD))
    return common + "".join(template.substitute(NAME=name, T=t, ACC=acc, LOAD=load, STORE=store)
                            for template in (SUM, SUM_LL) for name, (t, acc, load, store) in FOLD_TYPES.items())


class Parts(ctypes.Structure):
    """The kernels' ``Parts``: per peer, the bytes this rank sends (offset in its input, length) and where what
    each sender sent lands in its output."""

    _fields_ = [(name, ctypes.c_longlong * MAX_WORLD) for name in ("send_off", "send_len", "recv_off", "recv_len")]


class Shape(NamedTuple):
    """One kernel of a call."""
    combine: str                       # "gather" or "sum"
    send: tuple[tuple[int, int], ...]  # per peer p: (input offset, bytes) sent to p (p = rank: this rank's own part)
    recv: tuple[tuple[int, int], ...]  # per sender q: (output offset, bytes) of what q sent
    largest: int                       # the largest part any rank sends any peer: the same on every rank
    out_offset: int = 0                # the kernel writes from output + out_offset
    reads_output: bool = False         # its input is the call's output (the two-shot all_reduce's gather)


def call_shape(op: str, world: int, rank: int, in_bytes: int, out_bytes: int,
               matrix: Optional[Sequence[Sequence[int]]] = None) -> Shape:
    """What ``op`` sends and receives at ``rank`` for tensors of those sizes (``matrix``: all_to_all_v's bytes from
    rank i to rank j); InvalidArgument where the sizes do not fit the op."""
    if op not in OPS:
        raise InvalidArgument(f"the sm path has no {op!r}; it runs {sorted(OPS)}")
    if world > MAX_WORLD:
        raise InvalidArgument(f"the sm path runs up to {MAX_WORLD} ranks, not {world}")
    if op == "all_to_all_v":
        if matrix is None:
            raise InvalidArgument("sm all_to_all_v needs its matrix of bytes")
        send = tuple((sum(matrix[rank][:p]), matrix[rank][p]) for p in range(world))
        recv = tuple((sum(matrix[q][rank] for q in range(p)), matrix[p][rank]) for p in range(world))
        return Shape("gather", send, recv, max(max(row) for row in matrix))
    fits = {"all_gather": out_bytes == world * in_bytes, "all_reduce": out_bytes == in_bytes,
            "all_to_all": in_bytes == out_bytes and in_bytes % world == 0,
            "reduce_scatter": in_bytes == world * out_bytes}[op]
    if not fits:
        raise InvalidArgument(f"sm {op}: input of {in_bytes} and output of {out_bytes} bytes do not fit a world of "
                              f"{world}")
    n = {"all_gather": in_bytes, "all_reduce": in_bytes, "all_to_all": in_bytes // world,
         "reduce_scatter": out_bytes}[op]
    chunked = op in ("all_to_all", "reduce_scatter")  # part p of the input goes to rank p
    send = tuple((n * p if chunked else 0, n) for p in range(world))
    recv = tuple((n * q if OPS[op] == "gather" else 0, n) for q in range(world))
    return Shape(OPS[op], send, recv, n)


def chunks(world: int, nbytes: int) -> tuple[tuple[int, int], ...]:
    """The two-shot all_reduce's split of ``nbytes``: per rank (offset, bytes), whole 16-byte vectors but the last
    part (later parts may be empty)."""
    step = -(-nbytes // (16 * world)) * 16
    return tuple((min(p * step, nbytes), max(0, min(step, nbytes - p * step))) for p in range(world))


def call_shapes(op: str, world: int, rank: int, in_bytes: int, out_bytes: int,
                matrix: Optional[Sequence[Sequence[int]]] = None,
                two_shot_bytes: Optional[int] = None) -> tuple[Shape, ...]:
    """The kernels of a call, in order: ``call_shape``'s one, or for an all_reduce of ``two_shot_bytes`` or more two:
    each rank sums its chunk into its part of the output (a reduce_scatter), then sends that part to every peer's
    output (an all_gather in place). None: always one shot (a path passes its own: ``default_two_shot_bytes``)."""
    shape = call_shape(op, world, rank, in_bytes, out_bytes, matrix)
    if op != "all_reduce" or world < 2 or two_shot_bytes is None or in_bytes < two_shot_bytes:
        return (shape,)
    parts = chunks(world, in_bytes)
    mine = parts[rank]
    largest = parts[0][1]
    return (Shape("sum", parts, ((0, mine[1]),) * world, largest, out_offset=mine[0]),
            Shape("gather", (mine,) * world, parts, largest, reads_output=True))


def sm_bytes(op: str, world: int, rank: int, in_bytes: int, out_bytes: int, dtype: str, slot_bytes: int,
             matrix: Optional[Sequence[Sequence[int]]] = None,
             two_shot_bytes: Optional[int] = None) -> Optional[int]:
    """The largest part of a call the sm path can run (its op, world, sizes, a sum of its dtype, its slots), else
    None. The same on every rank."""
    if op not in OPS or OPS[op] == "sum" and dtype not in FOLD_TYPES:
        return None
    try:
        n = max(s.largest for s in call_shapes(op, world, rank, in_bytes, out_bytes, matrix, two_shot_bytes))
    except InvalidArgument:
        return None
    return n if n <= slot_bytes else None


def ll_kernels(op: str, world: int, in_bytes: int, out_bytes: int, matrix: Optional[Sequence[Sequence[int]]],
               two_shot_bytes: Optional[int], ll_bytes: int) -> tuple[bool, ...]:
    """Per kernel of a call (``call_shapes``), whether it runs as LL lines: its largest part within ``ll_bytes`` and
    every part of every rank (offsets, lengths) whole 16-byte vectors. Nothing of one rank decides it (not its rank,
    not its buffers' addresses, which the LL kernels take anywhere): a rank that took the LL kernel while a peer took
    the regular one would wait for lines the peer never sends, and the peer for flags."""
    every = [call_shapes(op, world, r, in_bytes, out_bytes, matrix, two_shot_bytes) for r in range(world)]
    return tuple(kernel[0].largest <= ll_bytes and all(
        shape.out_offset % 16 == 0 and all(x % 16 == 0 for pair in shape.send + shape.recv for x in pair)
        for shape in kernel) for kernel in zip(*every))


class SmKernels:
    """The loaded functions of ``source()`` on one device."""

    TYPES = (ctypes.c_void_p, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_int, ctypes.c_int, ctypes.c_longlong,
             ctypes.c_void_p, ctypes.c_void_p, ctypes.c_ulonglong, ctypes.c_void_p, Parts)

    def __init__(self, drv, check: Callable[[tuple, str], tuple], arch: str):
        self._drv, self._check = drv, check
        module = check(drv.cuModuleLoadData(compile_program(source(), "dmacoll_sm.cu", arch)), "cuModuleLoadData")[0]
        self.gather = check(drv.cuModuleGetFunction(module, b"dmacoll_sm_gather"), "cuModuleGetFunction")[0]
        self.sums = {dtype: check(drv.cuModuleGetFunction(module, f"dmacoll_sm_sum_{dtype}".encode()),
                                  "cuModuleGetFunction")[0] for dtype in FOLD_TYPES}
        self.ll_gather = check(drv.cuModuleGetFunction(module, b"dmacoll_sm_ll_gather"), "cuModuleGetFunction")[0]
        self.ll_sums = {dtype: check(drv.cuModuleGetFunction(module, f"dmacoll_sm_ll_sum_{dtype}".encode()),
                                     "cuModuleGetFunction")[0] for dtype in FOLD_TYPES}

    def launch(self, fn, blocks: int, stream: int, params: int) -> None:
        """``params``: the address of a ``Launch``'s packed argument array (void**)."""
        self._check(self._drv.cuLaunchKernel(fn, blocks, 1, 1, THREADS, 1, 1, 0, stream, params, 0),
                    "cuLaunchKernel (dmacoll_sm)")


class Launch:
    """One call shape's kernel launch, its arguments packed once into a void* array (a call then passes its
    address: no argument packing per call, the eager path's cost)."""

    def __init__(self, fn, blocks: int, args: tuple):
        self.fn, self.blocks = fn, blocks
        self.values = [v if isinstance(v, ctypes.Structure) else t(v) for t, v in zip(SmKernels.TYPES, args)]
        self.array = (ctypes.c_void_p * len(self.values))(*(ctypes.addressof(v) for v in self.values))
        self.address = ctypes.addressof(self.array)


_LOADED: dict[tuple, SmKernels] = {}


class SmPath:
    """The sm data path of one cuda engine: ``run(op, output, input)`` issues one kernel on the current stream.

    ``open`` reserves nothing: the caller gives the heap offset of an ``area_bytes(world, slot_bytes)`` block that
    every rank set aside alike; ``open`` zeroes it on every rank before any rank's first call (a barrier)."""

    def __init__(self, engine, area: int, slot_bytes: int, timeout_s: float, drv, check: Callable[[tuple, str], tuple]):
        import torch

        self.engine, self.area, self.slot_bytes = engine, area, slot_bytes
        self._drv, self._check = drv, check  # the cuda backend's driver module and its error check
        self.world, self.rank = engine.world, engine.rank
        self.timeout_ns = int(timeout_s * 1e9)
        self._kernels: Optional[SmKernels] = None
        self.bases = torch.tensor(list(engine.ptrs), dtype=torch.int64, device=engine.heap.device)
        # a bit per silent sender, set by a kernel whose wait gave up: pinned, so the kernel writes it directly
        self.silent = torch.zeros(1, dtype=torch.int32, pin_memory=True)
        self._silent_host = self.silent.numpy()  # the same memory, read without torch's indexing cost
        self._launches: dict[tuple, tuple[Launch, ...]] = {}
        self._sms = min(MAX_BLOCKS, torch.cuda.get_device_properties(engine.heap.device).multi_processor_count)
        self.blocks = min(BLOCKS, self._sms)
        self.two_shot_bytes: Optional[int] = default_two_shot_bytes(self.world, slot_bytes)
        self.ll_bytes = ll_bytes(self.world)

    def configure(self, blocks: int, two_shot_bytes: Optional[int], ll: Optional[int] = None) -> None:
        """The most blocks a launch takes (kept to the GPU's SM count), the all_reduce size from which two kernels
        run (None: one always) and the largest part sent as LL lines (None: unchanged; at most ``LL_MAX_BYTES``);
        every rank alike (the probes and tests choose)."""
        blocks = max(1, min(blocks, self._sms))
        ll = self.ll_bytes if ll is None else min(ll, LL_MAX_BYTES)
        if (blocks, two_shot_bytes, ll) != (self.blocks, self.two_shot_bytes, self.ll_bytes):
            self.blocks, self.two_shot_bytes, self.ll_bytes = blocks, two_shot_bytes, ll
            self._launches.clear()

    def sm_bytes(self, op: str, in_bytes: int, out_bytes: int, dtype: str,
                 matrix: Optional[Sequence[Sequence[int]]] = None) -> Optional[int]:
        """``sm_bytes`` for this path's slots and two-shot size."""
        return sm_bytes(op, self.world, self.rank, in_bytes, out_bytes, dtype, self.slot_bytes, matrix,
                        self.two_shot_bytes)

    @classmethod
    def open(cls, engine, group, area: int, slot_bytes: int, timeout_s: float, drv,
             check: Callable[[tuple, str], tuple]) -> "SmPath":
        import torch
        import torch.distributed as dist

        engine.heap[area: area + area_bytes(engine.world, slot_bytes)].zero_()
        torch.cuda.synchronize(engine.heap.device)
        dist.barrier(group=group)
        return cls(engine, area, slot_bytes, timeout_s, drv, check)

    def kernels(self) -> SmKernels:
        """Compiled (NVRTC) and loaded on first use, once per device and process; loading a module is no stream
        operation, so it is done in relaxed capture mode (a first call inside a graph capture works)."""
        if self._kernels is None:
            import torch

            drv, check = self._drv, self._check
            device = self.engine.heap.device
            major, minor = torch.cuda.get_device_capability(device)
            key = (device.index, major, minor)
            if key not in _LOADED:
                mode = check(drv.cuThreadExchangeStreamCaptureMode(
                    drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED), "cuThreadExchangeStreamCaptureMode")[0]
                try:
                    _LOADED[key] = SmKernels(drv, check, f"sm_{major}{minor}")
                finally:
                    check(drv.cuThreadExchangeStreamCaptureMode(mode), "cuThreadExchangeStreamCaptureMode")
            self._kernels = _LOADED[key]
        return self._kernels

    def run(self, op: str, output, input, matrix: Optional[tuple] = None) -> None:
        """One call (one kernel, two for a two-shot all_reduce) on the current stream (``matrix``: all_to_all_v's bytes
        from rank i to rank j, a tuple)."""
        import torch

        stream = torch.cuda.current_stream(input.device).cuda_stream
        key = (op, input.data_ptr(), output.data_ptr(), input.numel(), output.numel(), input.dtype, stream, matrix)
        launches = self._launches.get(key)
        if launches is None:
            launches = self._launches[key] = self._prepare(op, output, input, matrix)
        kernels = self.kernels()
        for launch in launches:
            kernels.launch(launch.fn, launch.blocks, stream, launch.address)

    def _prepare(self, op: str, output, input, matrix: Optional[tuple]) -> tuple[Launch, ...]:
        """The checks of a call shape and its launches (InvalidArgument before any device work)."""
        in_bytes, out_bytes = input.numel() * input.element_size(), output.numel() * output.element_size()
        shapes = call_shapes(op, self.world, self.rank, in_bytes, out_bytes, matrix, self.two_shot_bytes)
        largest = max(shape.largest for shape in shapes)
        if largest > self.slot_bytes:
            raise InvalidArgument(f"sm {op}: {largest} bytes per peer exceed the sm path's slots of "
                                  f"{self.slot_bytes}; use path='dma'")
        dtype = str(input.dtype).removeprefix("torch.")
        if OPS[op] == "sum" and dtype not in FOLD_TYPES:
            raise InvalidArgument(f"sm {op}: no sum for {dtype}; it adds {sorted(FOLD_TYPES)}; use path='dma'")
        kernels = self.kernels()
        if len(self._launches) >= 4096:
            self._launches.clear()
        launches = []
        lines = ll_kernels(op, self.world, in_bytes, out_bytes, matrix, self.two_shot_bytes, self.ll_bytes)
        for shape, ll in zip(shapes, lines):
            parts = Parts()
            for p, ((send_off, send_len), (recv_off, recv_len)) in enumerate(zip(shape.send, shape.recv)):
                parts.send_off[p], parts.send_len[p], parts.recv_off[p], parts.recv_len[p] = \
                    send_off, send_len, recv_off, recv_len
            source = output if shape.reads_output else input
            dst = output.data_ptr() + shape.out_offset
            if ll:
                fn = kernels.ll_gather if shape.combine == "gather" else kernels.ll_sums[dtype]
                region = (ll_offset(self.world, self.slot_bytes), 2 * LL_MAX_BYTES)
            else:
                fn = kernels.gather if shape.combine == "gather" else kernels.sums[dtype]
                region = (slots_offset(self.world), self.slot_bytes)
            launches.append(Launch(fn, grid(self.world, shape.largest, self.blocks),
                                   (self.bases.data_ptr(), self.area, region[0], self.rank, self.world, region[1],
                                    source.data_ptr(), dst, self.timeout_ns, self.silent.data_ptr(), parts)))
        return tuple(launches)

    def silent_ranks(self) -> list[int]:
        """The ranks a wait gave up on since the path opened (no synchronization: the kernel wrote host memory)."""
        bits = int(self._silent_host[0]) & 0xFFFFFFFF
        return [q for q in range(self.world) if bits >> q & 1]
