"""``python -m dmacoll_lab.vllm.entry latency|throughput ARGS``: what ``vllm bench latency|throughput ARGS``
runs (the benchmark module's own argument parser and ``main``), without the ``vllm`` CLI's imports of its API
server. Beside ``--output-json X`` it writes ``X.info.json``: the vLLM and torch versions and the GPU."""
from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path
from typing import Optional, Sequence

BENCHES = ("latency", "throughput")


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in BENCHES:
        print(f"usage: python -m dmacoll_lab.vllm.entry {{{'|'.join(BENCHES)}}} [vllm bench arguments]",
              file=sys.stderr)
        return 2
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")  # as `vllm`'s CLI does
    bench, args = parse(argv[0], argv[1:])
    bench.main(args)
    if getattr(args, "output_json", None):
        Path(args.output_json).with_suffix(".info.json").write_text(json.dumps(info(), indent=1) + "\n")
    return 0


def parse(name: str, argv: Sequence[str]):
    """The benchmark module and its arguments, parsed by its own parser (what `vllm bench NAME` builds)."""
    bench = importlib.import_module(f"vllm.benchmarks.{name}")
    from vllm import platforms
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    if platforms.current_platform.is_unspecified():  # no GPU: vLLM's `bench` takes its CPU platform, so do we
        from vllm.platforms.cpu import CpuPlatform

        platforms.current_platform = CpuPlatform()

    parser = FlexibleArgumentParser(prog=f"vllm bench {name}")
    bench.add_cli_args(parser)
    return bench, parser.parse_args(list(argv))


def info() -> dict:
    from importlib import metadata

    import torch

    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return {"vllm": metadata.version("vllm"), "torch": torch.__version__, "gpu": gpus[0] if gpus else "",
            "gpus": len(gpus), "python": sys.version.split()[0]}


if __name__ == "__main__":
    sys.exit(main())
