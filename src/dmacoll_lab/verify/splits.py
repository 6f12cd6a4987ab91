"""Uneven split matrices for all_to_all_v: the shapes a mixture-of-experts layer sends.

``send_counts[i][j]``: elements rank i sends to rank j. Each named pattern is one shape a router produces (an
expert that gets no token, a rank with nothing to send, one hot expert); ``random_counts`` draws a matrix with
empty rows, columns and entries, odd sizes and a hot column from a seed, so a failure is replayed by its seed.
"""
from __future__ import annotations

import random

HUGE = 1 << 20  # elements in a 'huge' entry: a 2^20-element entry from rank 0 to rank 1 crashed 2x H200 (issue 47)

PATTERNS = ("all_zero", "zero_row", "zero_column", "diagonal", "one_huge", "very_uneven")


def pattern_counts(pattern: str, count: int, world: int) -> list[list[int]]:
    """The named split for ``world`` ranks, entries built from ``count`` elements (``one_huge``: ``HUGE``).

    * ``all_zero``: nobody sends anything;
    * ``zero_row``: rank 0 sends nothing, every other pair ``count`` (odd offsets: ``count + i + j``);
    * ``zero_column``: nobody sends to the last rank;
    * ``diagonal``: every rank only to itself;
    * ``one_huge``: one entry, ``HUGE`` elements from rank 0 to rank 1, zeros elsewhere;
    * ``very_uneven``: every rank sends rank 1 (the hot expert) ``count * world + 1`` elements and one element
      or none to the others."""
    if pattern not in PATTERNS:
        raise ValueError(f"unknown split pattern {pattern!r}; choose one of {PATTERNS}")
    hot = 1 % world

    def entry(i: int, j: int) -> int:
        if pattern == "all_zero":
            return 0
        if pattern == "zero_row":
            return 0 if i == 0 else count + i + j
        if pattern == "zero_column":
            return 0 if j == world - 1 else count + i + j
        if pattern == "diagonal":
            return count if i == j else 0
        if pattern == "one_huge":
            return HUGE if (i, j) == (0, hot) else 0
        return count * world + 1 if j == hot else (i + j) % 2  # very_uneven
    return [[entry(i, j) for j in range(world)] for i in range(world)]


def random_counts(count: int, world: int, seed: int) -> list[list[int]]:
    """A seeded random split: per entry none (a third of them), one element, an odd size up to ``2 count + 1``,
    or (one column, a hot expert) up to ``4 count``; a row or column may come out empty."""
    rng = random.Random(seed)
    hot = rng.randrange(world)
    return [[rng.choice((0, 0, 1, rng.randrange(count + 1) * 2 + 1,
                         *((rng.randrange(4 * count + 1),) * 2 if j == hot else ())))
             for j in range(world)] for _ in range(world)]


def split_counts(splits: str, count: int, world: int, seed: int) -> list[list[int]]:
    """``splits``: a name of ``PATTERNS``, or ``random`` (``random_counts`` with ``seed``)."""
    return random_counts(count, world, seed) if splits == "random" else pattern_counts(splits, count, world)
