"""`dmacoll <command>`: correctness (check, build), measurements (sweep, tune, power, sm-usage, breakdown, c3,
interference, ficco, e2e, probe, amd-dmalatte), results (report, rules), vLLM (vllm model|bench|results|check|routes).

Every command turns the library's own errors (``dmacoll.DmaCollError``: a bad argument, a backend that cannot run
here, a timeout), a missing file and a missing package of the artifact's extras into one line on stderr and exit
code 2; a bad option prints the command's own usage and one line, exit code 2 (argparse); ``--help`` on each says
what it takes.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence

from ..vllm import cli as vllm
from . import analysis, bench, e2e, probe, verify

# what the artifact imports beyond the library: dmacoll-lab's own requirements ("") or the extra that installs it
EXTRA_OF = {"pandas": "", "yaml": "", "packaging": "", "matplotlib": "workflow", "seaborn": "workflow",
            "IPython": "workflow"}


def build_parser() -> argparse.ArgumentParser:
    from dmacoll.lab_api import __version__

    p = argparse.ArgumentParser(prog="dmacoll", description=__doc__.split("\n\n")[0])
    p.add_argument("--version", action="version", version=f"dmacoll {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="command")
    for family in (verify, bench, e2e, vllm, probe, analysis):
        family.register(sub)
    return p


def _command_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub-)command's own parser that ``args`` went through: the deepest, whose usage fits an error."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and getattr(args, action.dest, None) in action.choices:
            return _command_parser(action.choices[getattr(args, action.dest)], args)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    from dmacoll.lab_api import DmaCollError

    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # said with the command's usage, not the top level's
        _command_parser(parser, args).error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        return int(args.func(args) or 0)
    except DmaCollError as e:
        print(f"dmacoll {args.cmd}: {e}", file=sys.stderr)
        return 2
    except (FileNotFoundError, NotADirectoryError) as e:  # a file that a command reads: named, no traceback
        print(f"dmacoll {args.cmd}: {e.strerror}: {e.filename}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as e:
        extra = EXTRA_OF.get((e.name or "").split(".")[0])
        if extra is None:
            raise
        which = f"dmacoll-lab's extra '{extra}'" if extra else "dmacoll-lab"
        print(f"dmacoll {args.cmd}: needs {e.name}, which {which} installs (from the repository root: pip install "
              f"-e './lab{f'[{extra}]' if extra else ''}')", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
