"""The report's machines come from results/ (dmacoll_lab.analysis.machines), labelled from their runs' provenance."""
import json
from pathlib import Path

from dmacoll_lab.analysis import machines

ROOT = Path(__file__).resolve().parents[1]


def test_every_committed_machine_folder_with_gpu_runs_is_found_and_labelled():
    found = machines.discover(ROOT / "results")
    assert {"h200x2", "h200x4", "h100x2"} <= set(found) and "cpu2" not in found  # cpu2: runs without GPUs
    assert found["h200x4"][1] == "4x H200 (NVLink NV18)"  # the run that saw the most GPUs, not the newest
    assert found["h100x2"][1] == "2x H100 (NVLink NV18)"
    for name, (folder, label) in found.items():
        assert Path(folder).name == name and machines.gpu_runs(Path(folder)), name


def test_operator_sweeps_fall_back_to_sweep_runs_of_other_experiments():
    h200x2 = machines.operator_sweeps(ROOT / "results/h200x2")
    assert [Path(p).parent.name for p in h200x2] == ["sweep_all_gather", "sweep_all_to_all"]
    assert all(Path(p).parent.parent.name == "operator" for p in h200x2)
    h100x2 = machines.operator_sweeps(ROOT / "results/h100x2")  # no operator/: its defaults study's sweeps
    assert [Path(p).relative_to(ROOT / "results/h100x2").parts[:2] for p in h100x2] == [
        ("defaults", "sweep_all_gather"), ("defaults", "sweep_all_to_all")]
    assert machines.operator_sweeps(ROOT / "results/h200x1") == []


def test_a_run_compares_implementations_only_where_it_measured_both():
    assert machines.compares(ROOT / "results/h200x2/e2e/e2e/data.csv")
    assert not machines.compares(ROOT / "results/h100x1/e2e/e2e/data.csv")  # NCCL alone, world 1


def test_the_runs_with_a_schedule_per_phase_are_listed_by_name():
    names = [p.parent.name for p in machines.e2e_phased_runs(ROOT / "results/h200x2")]
    assert names == sorted(names)  # three models, two runs each by the rule; not the script runs beside them
    assert set(names) == {f"phased_tp2_{m}_run{n}" for m in ("llama-3.1-8b", "llama-3.1-70b", "mixtral-8x7b")
                          for n in (1, 2)}
    assert machines.e2e_phased_runs(ROOT / "results/h100x1") == []


def test_e2e_pages_take_the_newest_complete_run_per_world(tmp_path):
    assert machines.e2e_runs(ROOT / "results/h100x1") == []  # NCCL alone
    h200x4 = [Path(p).parent.name for p in machines.e2e_runs(ROOT / "results/h200x4")]
    assert h200x4 == ["serial_prompt512_tp4_reduction_tables_run2", "serial_prompt512_tp2_reduction_tables_run2"]
    # a later run of one model (h200x2's Mixtral A/B) does not hide the run of every model
    assert [Path(p).parent.name for p in machines.e2e_runs(ROOT / "results/h200x2")] == ["e2e"]

    def run(name, world, models, created):
        d = tmp_path / "e2e" / name
        d.mkdir(parents=True)
        rows = [f"{m},{world},{impl}" for m in models for impl in ("nccl", "dma")]
        (d / "data.csv").write_text("model,world,impl\n" + "\n".join(rows) + "\n")
        (d / "data.json").write_text(json.dumps({"created_utc": created}))
    run("old", 4, ["a", "b"], "2026-01-01")
    run("new_one_model", 4, ["b"], "2026-03-01")
    run("new", 4, ["a", "b"], "2026-02-01")
    run("two", 2, ["a"], "2026-01-01")
    assert [Path(p).parent.name for p in machines.e2e_runs(tmp_path)] == ["new", "two"]


def test_a_label_names_count_model_and_link(tmp_path):
    for name, gpus, topology in (("a", ["NVIDIA H200"] * 8, "GPU0 X NV18"), ("b", ["NVIDIA H100 PCIe"], ""),
                                 ("c", ["AMD Instinct MI300X"] * 8, "")):
        run = tmp_path / name / "e2e" / "e2e"
        run.mkdir(parents=True)
        (run / "data.csv").write_text("x\n")
        (run / "data.json").write_text(json.dumps({"hardware": {"gpus": gpus, "topology": topology}}))
    found = machines.discover(tmp_path)
    assert {k: v[1] for k, v in found.items()} == {"a": "8x H200 (NVLink NV18)", "b": "1x H100", "c": "8x MI300X"}


def test_the_e2e_page_shows_the_vllm_checks_and_the_default_routes_runs():
    """Runs that routed every call (DMACOLL_VLLM_ROUTE=all) stay off the page where the default route's runs are
    named (machines.VLLM_CLAIM_RUNS); a machine without an entry shows every run."""
    shown = machines.vllm_page_runs(ROOT / "results/h200x2")
    assert any("/check_tp2/" in p for p in shown) and not any("route_all" in p for p in shown), shown
    assert set(machines.vllm_claim_runs(ROOT / "results/h200x2")) <= set(shown)
    every = sorted(str(p) for p in (ROOT / "results/h100x1").glob("vllm/*/data.csv"))
    assert machines.vllm_page_runs(ROOT / "results/h100x1") == every and every
