"""`dmacoll <command>`: correctness (check, build), measurements (sweep, tune, power, sm-usage, breakdown, c3,
interference, ficco, e2e, probe, amd-dmalatte), results (report, rules, vllm-results).

Every command turns the library's own errors (``dmacoll.DmaCollError``: a bad argument, a backend that cannot run
here, a timeout) and a missing file into one line on stderr and exit code 2; a bad option prints the command's
own usage and one line, exit code 2 (argparse); ``--help`` on each says what it takes.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence

from . import analysis, bench, e2e, probe, verify


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    p = argparse.ArgumentParser(prog="dmacoll", description=__doc__.split("\n\n")[0])
    p.add_argument("--version", action="version", version=f"dmacoll {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="command")
    for family in (verify, bench, e2e, probe, analysis):
        family.register(sub)
    for command in sub.choices.values():  # an unknown option is reported with its command's usage
        command.set_defaults(command_parser=command)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    from ..errors import DmaCollError

    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    args, unknown = build_parser().parse_known_args(argv)
    if unknown:
        args.command_parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        return int(args.func(args) or 0)
    except DmaCollError as e:
        print(f"dmacoll {args.cmd}: {e}", file=sys.stderr)
        return 2
    except (FileNotFoundError, NotADirectoryError) as e:  # a file that a command reads: named, no traceback
        print(f"dmacoll {args.cmd}: {e.strerror}: {e.filename}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
