"""The library alone: with the artifact (dmacoll_lab) and what only the artifact needs made unimportable (pandas,
pyyaml, packaging, seaborn, matplotlib, snakemake, papermill, IPython, vLLM), every module of dmacoll imports and
two ranks run collectives on the host backend. (numpy is the library's: torch.distributed's object collectives
need it.) Run by tests/test_layering.py:

    python tests/library_alone.py STORE_FILE          # starts rank 0 and 1 of itself; exit 0 when both checked
    python tests/library_alone.py STORE_FILE RANK     # one rank
"""
import importlib.abc
import subprocess
import sys

REFUSED = {"dmacoll_lab", "pandas", "yaml", "packaging", "seaborn", "matplotlib", "snakemake", "papermill",
           "IPython", "vllm"}
WORLD = 2


class Refuse(importlib.abc.MetaPathFinder):
    """An import of anything in REFUSED fails as if it were not installed."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in REFUSED:
            raise ModuleNotFoundError(f"No module named {name!r} (refused: the library must work without it)",
                                      name=name)
        return None


def rank_main(store: str, rank: int) -> None:
    import pkgutil
    import importlib

    import torch
    import torch.distributed as dist

    import dmacoll
    from dmacoll import Communicator

    for m in pkgutil.walk_packages(dmacoll.__path__, "dmacoll."):
        importlib.import_module(m.name)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    comm = Communicator(backend="host", timeout_s=60)
    x = comm.empty(4, dtype=torch.float32)
    x.fill_(rank + 1)
    out = comm.empty(WORLD * 4, dtype=torch.float32)
    comm.all_gather(out, x)
    assert out.tolist() == [float(r + 1) for r in range(WORLD) for _ in range(4)], out
    total = torch.full((8,), float(rank + 1))
    comm.all_reduce(total)
    assert total.tolist() == [float(sum(range(1, WORLD + 1)))] * 8, total
    comm.close()
    dist.destroy_process_group()
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in REFUSED)
    assert not loaded, loaded
    print(f"rank {rank}: ok")


if __name__ == "__main__":
    sys.meta_path.insert(0, Refuse())
    if len(sys.argv) == 3:
        rank_main(sys.argv[1], int(sys.argv[2]))
    else:
        ranks = [subprocess.Popen([sys.executable, "-W", "ignore", __file__, sys.argv[1], str(r)]) for r in range(WORLD)]
        sys.exit(max(p.wait(timeout=240) for p in ranks))
