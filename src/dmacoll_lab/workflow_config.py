"""What the workflow's config schema (workflow/schemas/config.schema.yaml) leaves to the code: the collective
names, which are the op registry's (``dmacoll.ops``). The schema holds no copy of them, so a newly registered
collective is accepted without an edit there; the Snakefile calls ``check`` right after validating the schema."""
from __future__ import annotations

from dmacoll import ops
from dmacoll.errors import InvalidArgument

OP_LISTS = (("operator", "ops"), ("c3", "ops"))  # (section, key) of every list of collectives in the config


def check(config: dict) -> None:
    """Raise InvalidArgument, naming the registered collectives, where a list of collectives names another."""
    for section, key in OP_LISTS:
        unknown = [op for op in config.get(section, {}).get(key, ()) if op not in ops.REGISTRY]
        if unknown:
            raise InvalidArgument(f"config {section}.{key}: unknown collective(s) {', '.join(map(str, unknown))}; "
                                  f"the registered ones are {', '.join(ops.names())}")
