"""`dmacoll check` (every op x variant x direction x sync x dtype against the reference) and `dmacoll build` (the
native submission library)."""
from __future__ import annotations

import argparse
import random
import time

from .common import add_ranks, apply_timeout, positive

# One process per rank (~230 MB each, plus its share of the heaps in /dev/shm) on the CPU: measured on a 2-core,
# 23 GB CI machine, 16 ranks started in 90 s, 8 in 60 s; 32 fit in memory there, and a larger world only waits.
HOST_MAX_WORLD = 32


def cmd_check(a: argparse.Namespace) -> int:
    from dmacoll.lab_api import InvalidArgument, engine_class, resolve, validate
    from ..verify.check import check_rank, families
    from ..verify.launch import gpus_for, run_ranks

    validate.check_world(a.world)  # before any rank starts, like the backend (no GPU: said here, not by every rank)
    resolve(a.backend)
    if a.backend == "host" and a.world > HOST_MAX_WORLD:
        raise InvalidArgument(f"--world {a.world}: the host emulator runs one process per rank, and this command "
                              f"starts at most {HOST_MAX_WORLD} (see HOST_MAX_WORLD in dmacoll_lab/cli/verify.py); "
                              "larger worlds are for GPUs")
    known = [name for name, _ in families(engine_class(a.backend).capabilities)]
    unknown = [f for f in a.families if f not in known and f not in ("all", "none")]
    if unknown:
        raise InvalidArgument(f"--families {' '.join(unknown)}: backend {a.backend} runs {', '.join(known)}")
    wanted = known if "all" in a.families else [f for f in a.families if f != "none"]
    seed = a.seed if a.seed is not None else random.randrange(1 << 30)
    device = "cpu" if a.backend == "host" else "cuda"  # hip: torch.cuda is HIP on ROCm builds
    print(f"dmacoll check: backend={a.backend} world={a.world} seed={seed} (pass --seed {seed} to repeat)",
          flush=True)
    if device == "cuda" and a.world > gpus_for(a.world):
        print(f"  {a.world} ranks on {gpus_for(a.world)} GPU(s): ranks share a GPU (CUDA IPC heap). This checks "
              "correctness only: timings from a shared GPU are not performance results.", flush=True)
    apply_timeout(a)
    t0 = time.monotonic()
    args = dict(backend=a.backend, variants=a.variants, directions=a.directions, dtypes=a.dtypes, counts=a.counts,
                ops=a.ops, seed=seed, syncs=a.syncs, reference=a.reference, signal=a.signal, submit=a.submit,
                wait=a.wait, families=wanted)
    per_rank = run_ranks(check_rank, a.world, args, device=device, timeout_s=a.deadline_s)
    passed = failed = 0
    by_family: dict[str, list[int]] = {}
    for i, first in enumerate(per_rank[0]):
        results = [r[i] for r in per_rank]
        tally = by_family.setdefault(first["family"], [0, 0])
        if all(r["ok"] for r in results):
            passed += 1
            tally[0] += 1
        else:
            failed += 1
            tally[1] += 1
            errors = "; ".join(f"rank {r['rank']}: {r['error']}" for r in results if not r["ok"])
            splits = f" splits={first['splits']} seed={first['seed']}" if first.get("splits") else ""
            print(f"FAIL {first['op']} {first['variant']}/{first['direction']}/{first['sync']}/{first['handshake']} "
                  f"{first['dtype']} count={first['count']} {first['buffers']}"
                  f"{' in-place' if first['in_place'] else ''}{splits}: {errors}")
    for family, (ok, bad) in by_family.items():
        print(f"  {family}: {ok} passed, {bad} failed")
    print(f"({time.monotonic() - t0:.1f} s, world {a.world}, backend {a.backend})")
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


def cmd_build(a: argparse.Namespace) -> int:
    from dmacoll.lab_api import native

    record = native.build(a.out, a.cc)
    print(f"built {record['library']} with {record['compiler_version']}; self-test passed "
          f"({record['self_test_commands']} commands); toolchain in {a.out}/toolchain.json")
    return 0


def register(sub) -> None:
    from dmacoll.lab_api import DIRECTIONS, SIGNAL_MODES, SYNC_MODES, VARIANTS, WAIT_MODES, names
    from ..verify.reference import DTYPES

    c = sub.add_parser("check", help="run every op x variant on a backend and compare with the reference")
    c.add_argument("--backend", choices=("host", "cuda", "hip"), default="host")
    add_ranks(c, world_default=2, deadline_s=900.0)
    c.add_argument("--ops", nargs="+", choices=names(), default=list(names()),
                   help="reduce_scatter/all_reduce (sum) skip the dtypes they do not sum (bool, int8, uint8)")
    c.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    c.add_argument("--directions", nargs="+", choices=DIRECTIONS, default=list(DIRECTIONS))
    c.add_argument("--syncs", nargs="+", choices=SYNC_MODES, default=list(SYNC_MODES))
    c.add_argument("--dtypes", nargs="+", choices=list(DTYPES), default=["float32", "bfloat16", "int8", "int64",
                                                                        "bool"])
    c.add_argument("--counts", nargs="+", type=positive, default=[1, 17, 4096, 65537],
                   help="elements per chunk, all_reduce: per tensor (odd and power-of-two sizes)")
    c.add_argument("--seed", type=int, default=None, help="default: random, printed")
    c.add_argument("--signal", choices=SIGNAL_MODES, default="memop",
                   help="how flags reach peers: stream memory op, a 4-byte copy or a flag kernel (reset sync only)")
    c.add_argument("--wait", choices=WAIT_MODES, default="memop",
                   help="how flags are awaited: a stream wait, a polling kernel, or that and reductions that wait "
                        "for each slot themselves (cuda, host)")
    c.add_argument("--families", nargs="+", default=["all"],
                   help="option families run beyond the core grid, each on its own communicator: signal=copy, "
                        "signal=kernel, wait=spin, wait=fold, submit=native, prerecord, multi-op (every op in one "
                        "CUDA graph, or one after another), 'uneven splits' and 'random splits' (all_to_all_v on "
                        "Communicator() with every option 'auto': the named split patterns, or matrices drawn from "
                        "--seed), path=sm (every op, dtype and count the sm path takes, forced onto it; cuda); "
                        "default: all that the backend runs; 'none': only the core grid, lean pipelines and defaults")
    c.add_argument("--reference", choices=("cpu", "nccl"), default="cpu",
                   help="also compare with torch.distributed (NCCL) on the same inputs (cuda backend)")
    c.add_argument("--submit", choices=("python", "native"), default="python",
                   help="cuda: issue driver calls from Python or the native library (dmacoll build)")
    c.set_defaults(func=cmd_check)

    from ..verify import a2av_stress

    s = sub.add_parser("a2av-stress", help="all_to_all_v with uneven splits, case after case, as a crash map: a case "
                                           "that kills or hangs a rank is recorded and the next launch goes on")
    a2av_stress.add_arguments(s)
    s.set_defaults(func=a2av_stress.run)

    b = sub.add_parser("build", help="compile and self-test the native submission library (submit='native')")
    b.add_argument("--out", default="build/native", help="output folder (the library, toolchain.json)")
    b.add_argument("--cc", default=None, help="C compiler (default: $CC, else cc / gcc / clang)")
    b.set_defaults(func=cmd_build)
