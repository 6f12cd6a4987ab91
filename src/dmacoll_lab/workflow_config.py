"""What the workflow's config schema (workflow/schemas/config.schema.yaml) leaves to the code: every list of names
the config draws from. The schema says a value is a string; which strings are allowed is the `dmacoll` command's
own (its options' choices: the op registry, the sweep's implementations, the flag modes, the probes, the models, ...),
so a new value registered in Python is accepted without an edit of the schema, and the schema holds no copy that
can drift. The Snakefile calls ``check`` right after validating the schema."""
from __future__ import annotations

import argparse
from typing import Iterator

from dmacoll.lab_api import InvalidArgument

# config section -> the `dmacoll` command whose options its keys are (the rule passes them as its flags)
SECTIONS = {"operator": ("sweep",), "native": ("sweep",), "c3": ("c3",), "e2e": ("e2e",), "e2e_phased": ("e2e",),
            "power": ("power",), "sm_usage": ("sm-usage",), "interference": ("interference",), "ficco": ("ficco",),
            "breakdown": ("breakdown",)}
# config lists whose values are a command's choices of another name: (path in the config, command, option dest);
# "*" in a path: every item of a list or every value of a mapping
NAMED = ((("probes",), ("probe",), "probe"), (("vllm", "models", "*", "spec"), ("e2e",), "models"),
         (("vllm", "benches"), ("vllm", "bench"), "bench"),
         (("amd_dmalatte", "runs", "*", "op"), ("amd-dmalatte",), "op"))


def _subparser(parser: argparse.ArgumentParser, command: tuple[str, ...]) -> argparse.ArgumentParser:
    for name in command:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[name]
    return parser


def _choices(parser: argparse.ArgumentParser, command: tuple[str, ...], dest: str):
    """The allowed values of option ``dest`` of ``command`` (None: any), or of the command's sub-commands where
    ``dest`` names them."""
    p = _subparser(parser, command)
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction) and action.dest == dest:
            return tuple(action.choices)
        if action.dest == dest:
            return tuple(action.choices) if action.choices is not None else None
    return None


def _values(node, path: tuple[str, ...]) -> Iterator[object]:
    """Every value at ``path`` below ``node`` (lists spread)."""
    if not path:
        yield from (node if isinstance(node, list) else [node])
        return
    head, rest = path[0], path[1:]
    if head == "*":
        for child in (node.values() if isinstance(node, dict) else node or ()):
            yield from _values(child, rest)
    elif isinstance(node, dict) and head in node:
        yield from _values(node[head], rest)


def problems(config: dict) -> list[str]:
    """A line per config value the `dmacoll` commands do not accept, naming what they accept."""
    from .cli import build_parser

    parser, out = build_parser(), []

    def check(where: str, values, allowed) -> None:
        wrong = [v for v in values if allowed is not None and str(v) not in map(str, allowed)]
        if wrong:
            out.append(f"config {where}: unknown value(s) {', '.join(map(str, wrong))}; "
                       f"choose from {', '.join(map(str, allowed))}")

    for section, command in SECTIONS.items():
        for key, value in (config.get(section) or {}).items():
            check(f"{section}.{key}", list(_values(value, ())), _choices(parser, command, key))
    for path, command, dest in NAMED:
        check(".".join(path).replace(".*", "[*]"), list(_values(config, path)), _choices(parser, command, dest))
    check("probe_args", list(config.get("probe_args") or {}), _choices(parser, ("probe",), "probe"))  # its keys
    return out


def check(config: dict) -> None:
    """Raise InvalidArgument naming every config value the commands do not accept (and what they accept)."""
    found = problems(config)
    if found:
        raise InvalidArgument("; ".join(found))
