"""The collectives, one ``OpSpec`` each (``spec.py`` says what a spec holds), and the registry that every part of
dmacoll asks instead of switching on op names. Adding a collective: its spec module here (registered below),
its plan builder (``plan.py``), its tests."""
from __future__ import annotations

from ..errors import InvalidArgument
from .all_gather import ALL_GATHER
from .all_reduce import ALL_REDUCE
from .all_to_all import ALL_TO_ALL
from .all_to_all_v import ALL_TO_ALL_V
from .reduce_scatter import REDUCE_SCATTER
from .spec import REDUCE_DTYPES, Group, OpSpec, Request, dtype_name

REGISTRY: dict[str, OpSpec] = {s.name: s for s in (ALL_GATHER, ALL_TO_ALL, ALL_TO_ALL_V, REDUCE_SCATTER, ALL_REDUCE)}
NAMES = tuple(REGISTRY)
REDUCE_DTYPE_NAMES = tuple(dtype_name(d) for d in REDUCE_DTYPES)


def get(name: str) -> OpSpec:
    try:
        return REGISTRY[name]
    except KeyError:
        raise InvalidArgument(f"unknown collective {name!r}; choose one of {NAMES}") from None


__all__ = ["REGISTRY", "NAMES", "REDUCE_DTYPES", "REDUCE_DTYPE_NAMES", "Group", "OpSpec", "Request", "get"]
