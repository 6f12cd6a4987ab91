"""Sizes and counts as people write them on a command line (``256M``, ``15``, ``2.5``) and read them (``256 MB``)."""
from __future__ import annotations

import argparse

UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = t[-1] if t and t[-1] in UNITS else ""
    try:
        value = int(t[: len(t) - len(unit)]) * UNITS[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 4096, 1K, 256M)") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"size must be positive: {text!r}")
    return value


def human(nbytes: int) -> str:
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def positive(cast, what: str):
    """An argparse type: ``cast(text)`` that must be > 0."""
    def parse(text: str):
        try:
            value = cast(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
        return value
    return parse


count = positive(int, "a whole number")
seconds = positive(float, "a number of seconds")
