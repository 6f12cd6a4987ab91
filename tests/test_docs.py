"""README.md and docs/results.md: every number in them is generated from the committed results."""
from pathlib import Path

import pytest

from dmacoll_lab.analysis import docs

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", ROOT / "docs/results.md", ROOT / "results/h200x2/c3/README.md",
             ROOT / "results/h200x4/c3/README.md", ROOT / "results/h100x2/defaults/README.md"]


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_generated_blocks_match_the_committed_results(path):
    assert docs.BLOCK.search(path.read_text()), f"{path} has no generated block"
    assert docs.stale(path) == [], f"run `dmacoll report docs`: {docs.stale(path)}"


@pytest.mark.parametrize("path", [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))], ids=lambda p: p.name)
def test_prose_restates_no_measurement(path):
    assert docs.restated(path) == []


def test_a_drifted_number_and_a_restated_one_are_caught(tmp_path):
    text = (ROOT / "README.md").read_text()
    block = docs.BLOCK.search(text).group(4)
    drifted = tmp_path / "README.md"
    drifted.write_text(text.replace(block, block.replace("| 0.", "| 9.", 1)))
    assert docs.stale(drifted) == ["default_call_headline h200x2"]  # the first block
    drifted.write_text(text + "\nThe all-gather is 0.52x NCCL's time, 62% less, 11.3 us and 390 GB/s; "
                              "Llama-3.1-8B on H200 stays. `0.5` in code stays.\n")
    found = [m.group(1) for m in docs.RESTATED.finditer(docs.prose(drifted.read_text()))]
    assert found == ["0.52x", "62%", "11.3 us", "390 GB/s"]  # not the names, not the code span
    assert len(docs.restated(drifted)) == 4


def test_readme_is_short():
    assert len((ROOT / "README.md").read_bytes()) <= 10_000


def test_nccl_tests_tables_print_a_machines_operator_sweeps_not_earlier_studies():
    """A machine with operator sweeps gets their tables (the 4-GPU set's old defaults/ and light-signal studies are
    not the machine's tables); one without them (2x H100) its other experiments' sweeps that measured NCCL."""
    h200x4 = docs.nccl_tests_runs("h200x4")
    assert h200x4 and all(p.startswith("results/h200x4/operator/sweep_") for p in h200x4), h200x4
    assert not [p for p in docs.nccl_tests_runs("h200x2") if "light_signals" in p]
    h100x2 = docs.nccl_tests_runs("h100x2")
    assert h100x2 and all(p.startswith("results/h100x2/defaults/") for p in h100x2), h100x2
