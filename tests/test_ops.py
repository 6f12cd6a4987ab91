"""The OpSpec registry: every collective described once, and everything else asks it."""
import inspect
from pathlib import Path

import pytest
import torch
import yaml

from dmacoll import Communicator, ops
from dmacoll_lab.verify.launch import run_ranks
from dmacoll_lab.verify.reference import draw, expected

ROOT = Path(__file__).resolve().parents[1]


def test_registry_names_every_collective_and_the_communicator_has_a_method_each():
    assert ops.names() == ("all_gather", "all_to_all", "all_to_all_v", "reduce_scatter", "all_reduce")
    for name, spec in ops.REGISTRY.items():
        method = Communicator.__dict__[name]  # written out in the class (tests/test_options.py: its signature)
        assert method.__doc__ and list(inspect.signature(method).parameters) == list(spec.signature().parameters)
    assert list(inspect.signature(Communicator.all_reduce).parameters) == ["self", "tensor", "input", "options"]
    assert list(inspect.signature(Communicator.all_to_all_v).parameters) == [
        "self", "output", "input", "send_counts", "options"]
    with pytest.raises(ops.spec.InvalidArgument, match="unknown collective 'broadcast'"):
        ops.get("broadcast")


@pytest.mark.parametrize("world", [2, 3, 8])
def test_sizes_and_bus_factors_follow_nccl_tests(world):
    mb = 1 << 20
    for name, (total, bus) in {"all_gather": (world * mb, (world - 1) / world),
                               "all_to_all": (mb, (world - 1) / world), "all_to_all_v": (mb, (world - 1) / world),
                               "reduce_scatter": (mb, (world - 1) / world),
                               "all_reduce": (mb, 2 * (world - 1) / world)}.items():
        spec = ops.get(name)
        assert spec.total_bytes(mb, world) == total and spec.bus_factor(world) == pytest.approx(bus)
        assert spec.bus_bytes(mb, world) == pytest.approx(total * bus)
    # a chunk of 5 elements: the inputs and outputs of every rank
    assert ops.get("all_gather").numels(5, world, 0) == (5, 5 * world)
    assert ops.get("reduce_scatter").numels(5, world, 0) == (5 * world, 5)
    a2av = ops.get("all_to_all_v")
    skew = a2av.counts(5, world)
    assert all(sum(row) <= 5 * world for row in skew) and len({c for row in skew for c in row}) > 1
    assert a2av.numels(5, world, 1, skew) == (sum(skew[1]), sum(row[1] for row in skew))


def test_in_place_forms_and_dtypes():
    assert {n for n, s in ops.REGISTRY.items() if s.in_place} == {"all_gather", "reduce_scatter", "all_reduce"}
    assert {n for n, s in ops.REGISTRY.items() if s.reduces} == {"reduce_scatter", "all_reduce"}
    assert not ops.get("all_reduce").accepts(torch.int8) and ops.get("all_gather").accepts(torch.bool)
    out, inp = torch.zeros(12), torch.zeros(12)
    o, i = ops.get("all_gather").in_place_views(out, inp[:4], 1)
    assert o is out and i.data_ptr() == out.data_ptr() + 4 * 4
    o, i = ops.get("reduce_scatter").in_place_views(out[:4], inp, 2)
    assert i is inp and o.data_ptr() == inp.data_ptr() + 8 * 4


def _torch_matches_reference(rank, world, seed):
    """Every spec's torch.distributed call (gloo here) against its reference, on seeded inputs."""
    bad = []
    for name, spec in ops.REGISTRY.items():
        for dtype in (torch.float32, torch.int32, torch.bfloat16):
            chunk = 7
            counts = spec.counts(chunk, world, seed=seed)
            inputs = [draw(spec, spec.numels(chunk, world, r, counts)[0], dtype, seed + 1 + r, exact_sums=True)
                      for r in range(world)]
            out = torch.empty(spec.numels(chunk, world, rank, counts)[1], dtype=dtype)
            spec.torch_call(out, inputs[rank].clone(), counts=counts)
            want = expected(spec, inputs, rank, counts)[0].to(dtype)
            if not torch.equal(out, want):
                bad.append((name, str(dtype)))
    return bad


@pytest.mark.parametrize("world", [2, 3])
def test_torch_call_and_reference_agree(world, seed):
    assert run_ranks(_torch_matches_reference, world, seed) == [[]] * world, f"seed {seed}"


def test_the_workflow_schema_keeps_no_list_of_names():
    """The config's lists of names (collectives among them) are checked against the dmacoll commands' choices
    (dmacoll_lab.workflow_config; tests/test_workflow.py runs it through the Snakefile): the schema holds no copy to
    drift, only the workflow's own list of platforms."""
    schema = (ROOT / "workflow/schemas/config.schema.yaml").read_text()
    assert schema.count("enum:") == 1 and "enum: [auto, cuda, rocm, host, none]" in schema
    parsed = yaml.safe_load(schema)
    for section in ("operator", "c3"):
        assert parsed["properties"][section]["properties"]["ops"]["items"] == {"type": "string"}


def test_the_config_holds_the_defaults_and_the_schema_copies_none():
    """config/config.yaml is the one copy of the workflow's defaults (the Snakefile always loads it): the schema
    gives no default of its own for what the config sets, so no copy can drift (two had: the schema's
    operator.submit and operator.handshakes had fallen behind the config's); what the rules read directly, the
    schema requires instead."""
    import jsonschema

    schema = yaml.safe_load((ROOT / "workflow/schemas/config.schema.yaml").read_text())
    config = yaml.safe_load((ROOT / "config/config.yaml").read_text())
    copies = []

    def walk(node: dict, values: dict, path: str) -> None:
        for key, value in values.items():
            described = node.get("properties", {}).get(key)
            if described is None:
                continue
            if described.get("default", {}) != {}:
                copies.append(f"{path}{key}")
            if isinstance(value, dict):
                walk(described, value, f"{path}{key}.")

    walk(schema, config, "")
    assert not copies, f"defaults the schema copies from config/config.yaml: {copies}"
    jsonschema.validate(config, schema)
    with pytest.raises(jsonschema.ValidationError, match="'operator' is a required property"):
        jsonschema.validate({k: v for k, v in config.items() if k != "operator"}, schema)
