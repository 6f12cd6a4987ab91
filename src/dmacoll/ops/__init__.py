"""The collectives, one ``OpSpec`` each (``spec.py`` says what a spec holds), and the registry that every part of
dmacoll asks instead of switching on op names or keeping a list of them. Adding a collective: its spec module
here (registered below), its plan builder (``plan.py``), its tests (docs/design.md, "Adding a collective")."""
from __future__ import annotations

from ..errors import InvalidArgument
from .all_gather import ALL_GATHER
from .all_reduce import ALL_REDUCE
from .all_to_all import ALL_TO_ALL
from .all_to_all_v import ALL_TO_ALL_V
from .reduce_scatter import REDUCE_SCATTER
from .spec import REDUCE_DTYPES, Group, OpSpec, Request, dtype_name

REGISTRY: dict[str, OpSpec] = {}
REDUCE_DTYPE_NAMES = tuple(dtype_name(d) for d in REDUCE_DTYPES)


def register(spec: OpSpec) -> OpSpec:
    """Make ``spec`` a collective of dmacoll: callable through ``Communicator.collective(spec.name, ...)``, checked
    by ``dmacoll check``, measured by every benchmark that takes ``--ops``."""
    if not isinstance(spec, OpSpec):
        raise InvalidArgument(f"register takes an OpSpec, got {type(spec).__name__}")
    if not isinstance(getattr(spec, "name", None), str) or not spec.name.isidentifier():
        raise InvalidArgument(f"an OpSpec's name must be an identifier (it names a method, a CLI choice and a "
                              f"CSV value), got {getattr(spec, 'name', None)!r}")
    if spec.name in REGISTRY:
        raise InvalidArgument(f"a collective named {spec.name!r} is already registered")
    REGISTRY[spec.name] = spec
    return spec


def names() -> tuple[str, ...]:
    """Every registered collective, in registration order (read at the time of the call)."""
    return tuple(REGISTRY)


def get(name: str) -> OpSpec:
    try:
        return REGISTRY[name]
    except KeyError:
        raise InvalidArgument(f"unknown collective {name!r}; choose one of {names()}") from None


for _spec in (ALL_GATHER, ALL_TO_ALL, ALL_TO_ALL_V, REDUCE_SCATTER, ALL_REDUCE):
    register(_spec)

__all__ = ["REGISTRY", "REDUCE_DTYPES", "REDUCE_DTYPE_NAMES", "Group", "OpSpec", "Request", "get", "names",
           "register"]
