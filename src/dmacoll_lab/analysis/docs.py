"""The generated parts of README.md and docs/*.md: every number in them is computed here from the committed
results, and a test fails when one drifts (``stale``) or when prose around them restates one (``restated``).

A generated block sits between ``<!-- generated: NAME MACHINE -->`` and ``<!-- end generated -->``;
``dmacoll report docs`` rewrites every block of the files named, ``--check`` only says which are stale. NAME is
one of ``BLOCKS``; MACHINE a folder under results/. Hand-written prose around the blocks interprets them but
restates no measurement: no decimals, percentages, or numbers with a unit of time, bandwidth, power or energy
outside blocks and code (``restated`` finds them).
"""
from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Callable, Optional

import pandas as pd

from dmacoll.lab_api import human, options

from . import c3_rules, claims, load, machines, report, tables

ROOT = Path(__file__).resolve().parents[3]  # the checkout whose results/ the blocks read (a source install)
BLOCK = re.compile(r"(<!-- generated: ([\w-]+) ([\w/]+) -->\n)(.*?)(<!-- end generated -->)", re.S)
HEADLINE_SIZES = (4 << 10, 64 << 10, 1 << 20, 64 << 20)


def run(machine: str, experiment: str, name: str) -> str:
    """A committed run's data.csv, as a path from the repository root."""
    return f"results/{machine}/{experiment}/{name}/data.csv"


def sweeps(machine: str) -> list[str]:
    return [run(machine, "operator", n) for n in ("sweep_all_gather", "sweep_all_to_all", "nccl_ce")]


@functools.lru_cache(maxsize=None)
def sweep_table(machine: str) -> pd.DataFrame:
    """A machine's operator sweeps, read once per process (several blocks show them)."""
    return report.load(_abs(sweeps(machine)))


def _abs(paths: list[str]) -> list[str]:
    return [str(ROOT / p) for p in paths]


def machine_runs(machine: str, finder: Callable[[Path], list]) -> list[str]:
    """The runs a ``machines`` finder picks in a machine's folder, as paths from the repository root."""
    return [str(Path(p).relative_to(ROOT)) for p in finder(ROOT / "results" / machine)]


def source_line(paths: list[str]) -> str:
    return report.source_line(paths, ROOT)


def _table(df: pd.DataFrame, paths: list[str]) -> str:
    return source_line(paths) + "\n\n" + report.markdown(df)


def _spread(lo, hi) -> str:
    return f"{lo}-{hi}" if lo != "" else "none recorded"


def _with_n(t: pd.DataFrame) -> pd.DataFrame:
    """Each configuration's ratio to NCCL with its spread (p10-p90 of the repeats) and the N it was picked from,
    in one column; NCCL's time with its p10-p90."""
    t = t.copy()
    t["NCCL us (p10-p90)"] = [f"{v} ({_spread(lo, hi)})" for v, lo, hi in zip(t["nccl_us"], t["nccl_p10_us"],
                                                                                t["nccl_p90_us"])]
    # a default not measured as such (no dma_default row) is the table's pick from the same sweep: in-sample
    t["default / NCCL (p10-p90)"] = [
        v if not isinstance(v, float) else f"{v} ({_spread(lo, hi)})" + ("" if measured else " (derived)")
        for v, lo, hi, measured in zip(t["default_over_nccl"], t["default_lo"], t["default_hi"], t["default_measured"])]
    for name in ("tuned", "oracle"):
        t[f"{name} / NCCL (p10-p90; of N)"] = [
            f"{v} ({_spread(lo, hi)}; of {n})" if isinstance(v, float) else v
            for v, lo, hi, n in zip(t[f"{name}_over_nccl"], t[f"{name}_lo"], t[f"{name}_hi"], t[f"{name}_n"])]
    return t


HEADLINE_COLUMNS = ["op", "size", "NCCL us (p10-p90)", "default / NCCL (p10-p90)", "tuned / NCCL (p10-p90; of N)",
                    "oracle / NCCL (p10-p90; of N)"]


def headline_table(df: pd.DataFrame, mode: str = "graph") -> pd.DataFrame:
    """The README's headline table of a machine's sweeps (the index page shows it too): ``mode`` (graph-replayed;
    the host emulator's sweeps have eager calls alone), the headline sizes, NCCL's time and each configuration's
    ratio to it, with spreads."""
    t = _with_n(report.ratio_table(df, sizes=HEADLINE_SIZES))
    return t[t["mode"] == mode][HEADLINE_COLUMNS].reset_index(drop=True)


# -- the blocks ----------------------------------------------------------------------------------------------------
def headline(machine: str) -> str:
    """The README's table: dmacoll's default, tuned and best-of-N configurations against NCCL, graph mode."""
    return _table(headline_table(sweep_table(machine)), sweeps(machine))


OPERATOR_COLUMNS = ["op", "mode", "size", "NCCL us (p10-p90)", "nccl_ce_us", "default / NCCL (p10-p90)",
                    "tuned / NCCL (p10-p90; of N)", "oracle / NCCL (p10-p90; of N)", "oracle_config",
                    "oracle_minus_peer_copy_us"]


def operator_columns(ratios: pd.DataFrame) -> pd.DataFrame:
    """A ``report.ratio_table`` as docs/results.md and the operator page show it (spreads and N in the cells)."""
    return _with_n(ratios)[OPERATOR_COLUMNS]


def operator(machine: str) -> str:
    paths = sweeps(machine)
    df = sweep_table(machine)
    return (_table(operator_columns(report.ratio_table(df, sizes=report.TABLE_SIZES)), paths) + "\n\n" +
            report.failures_line(df))


def claims_block(machine: str) -> str:
    paths = sweeps(machine)
    c3 = machine_runs(machine, lambda folder: c3_rules.runs(folder / "c3"))
    power = run(machine, "power", "power")
    e2e = machine_runs(machine, machines.e2e_claim_runs)
    ficco = run(machine, "ficco", "ficco")
    vllm = machine_runs(machine, machines.vllm_claim_runs)
    rows = pd.DataFrame(claims.evaluate(_abs(paths), str(ROOT / power), _abs(c3), _abs(e2e), _abs([ficco]),
                                        _abs(vllm)))
    cols = ["id", "paper (MI300X)", "metric", "configuration", "n", "reproduced", "spread", "over runs", "tolerance",
            "status", "note"]
    rows["reproduced"] = rows["reproduced"].astype(object).where(rows["reproduced"].notna(), "")  # 'not run': blank
    return _table(rows[cols], paths + [power] + c3 + e2e + [ficco] + vllm)


def calibration(machine: str) -> str:
    """The calibration replayed on a machine's sweeps as if it had no table: the targets, then per mode and pick the
    regrets (``calibration_replay``)."""
    from . import calibration_replay

    paths = sweeps(machine)[:2]
    s, plan, seconds, regrets = calibration_replay.replay(_abs(paths))
    candidates = sum(len(choices) for choices in s.space.values()) * len(s.sizes)
    head = (f"{len(plan.measured)} points measured of the {candidates} the sweep holds for what 'auto' may choose; "
            f"{s.fixed_s * 1e3:.1f} ms per point besides its calls (the sweep's own, from its run.log).")
    targets = calibration_replay.targets(regrets, seconds).round(3)
    targets["floor"] = targets["floor"].map(lambda v: "" if pd.isna(v) else v)  # the budget has none
    return "\n\n".join([source_line(paths), head, report.markdown(targets),
                        report.markdown(calibration_replay.summary(regrets).round(3))])


def breakdown(machine: str) -> str:
    paths = [run(machine, "breakdown", "breakdown")]
    wide = tables.breakdown_wide(load.read("breakdown", _abs(paths))).round(2)
    return _table(wide.reset_index(names="size"), paths)


def power(machine: str) -> str:
    paths = [run(machine, "power", "power")]
    s = tables.power_summary(load.read("power", _abs(paths)))
    return _table(s[["op", "impl", "size", "avg_power_w", "idle_power_w", "dynamic_energy_per_call_uj",
                     "energy_vs_nccl"]], paths)


def interference(machine: str) -> str:
    paths = [run(machine, "power", "interference")]
    return _table(tables.interference_summary(load.read("interference", _abs(paths))), paths)


def c3(machine: str) -> str:
    paths = [run(machine, "c3", "c3")]
    coll = c3_rules.collapse(c3_rules.load(_abs(paths)))
    summary = c3_rules.summary_table(coll)
    per_op = coll.pivot_table(index="option", columns="op", values="fraction_of_ideal", aggfunc="mean").round(3)
    res = c3_rules.fit_and_evaluate(coll)
    return "\n\n".join([_table(summary, paths), report.markdown(per_op.reset_index()),
                        "Learned strategy rule:", report.markdown(res["scores"].round(3))])


def c3_runs(machine: str) -> str:
    """Every C3 run of a machine, per option: the mean fraction of ideal clipped and not, and over the held-out
    scenarios (the claims' spread over runs comes from the options measured in several)."""
    paths = machine_runs(machine, lambda folder: c3_rules.runs(folder / "c3"))
    return _table(c3_rules.run_means(_abs(paths)), paths)


def ficco(machine: str) -> str:
    from . import ficco_rules

    paths = [run(machine, "ficco", "ficco")]
    coll = ficco_rules.collapse(ficco_rules.load(_abs(paths)))
    res = ficco_rules.fit_and_evaluate(coll)
    return "\n\n".join([_table(ficco_rules.summary_table(coll), paths), report.markdown(ficco_rules.losses(coll)),
                        f"Learned schedule rule (held out: {res['held_out']}):",
                        report.markdown(res["scores"].round(3))])


def e2e(machine: str) -> str:
    paths = [run(machine, "e2e", "e2e")]
    return _table(tables.e2e_overview(load.read("e2e", _abs(paths))), paths)


def e2e_phased(machine: str) -> str:
    """The runs with a schedule per phase (``machines.e2e_phased_runs``), per model and batch over the runs."""
    from . import e2e_tables

    paths = machine_runs(machine, machines.e2e_phased_runs)
    rows = e2e_tables.phased(load.read("e2e", _abs(paths))) if paths else pd.DataFrame()
    return _table(e2e_tables.phased_summary(rows), paths)


def native(machine: str) -> str:
    paths = [run(machine, "native", "native")]
    return _table(tables.native_speedup(load.read("operator", _abs(paths))), paths)


def probes(machine: str) -> str:
    parts = []
    for name, summary in (("flag_latency", tables.flag_latency), ("crossing", tables.crossing),
                          ("submit_cost", tables.submit_cost), ("few_sm_kernels", tables.few_sm_best),
                          ("sm_carveout", tables.carveout_effect)):
        path = run(machine, "probes", name)
        if (ROOT / path).exists():
            parts.append(_table(summary(load.read("probe", _abs([path]))), [path]))
    return "\n\n".join(parts)


def call_cost(machine: str) -> str:
    after, before = run(machine, "probes", "call_cost"), run(machine, "probes", "call_cost_serial_ready")
    rows = load.read("probe", _abs([after]))
    return "\n\n".join([_table(tables.call_cost_structure(rows, load.read("probe", _abs([before]))), [after, before]),
                        _table(tables.call_cost_shared(rows), [after])])


def check_cost(machine: str) -> str:
    paths = [run(machine, "check_calls", "check_cost")]
    return _table(tables.check_cost(load.read("check_cost", _abs(paths))), paths)


def nccl_tests_runs(machine: str) -> list[str]:
    """A machine's operator sweeps (``operator/sweep_*``, the runs its operator page shows) that measured NCCL beside
    dmacoll; where it has none, every sweep of its other experiments that did (2x H100's ``defaults/``). The sweeps
    of earlier studies (``operator/light_signals_*``, a 4-GPU machine's ``defaults/``: code since changed) stay
    under ``results/`` with their commands (the "Every run" table), not printed as the machine's tables."""
    folder = ROOT / "results" / machine
    runs = sorted(folder.glob("operator/sweep_*/data.csv")) or sorted(
        p for p in folder.glob("*/*/data.csv") if p.parent.parent.name != "operator")
    return [str(data.relative_to(ROOT)) for data in runs
            if machines.is_sweep(data) and machines.compares(data, values=("nccl",))]


def nccl_tests(machine: str) -> str:
    """Per run, nccl-tests' table (``tables.nccl_tests``), graph-replayed, at the operator table's sizes."""
    parts = []
    for path in nccl_tests_runs(machine):
        table = tables.nccl_tests(report.load(_abs([path])), sizes=report.TABLE_SIZES)
        parts.append(_table(table, [path]))
    return "\n\n".join(parts) + ("\n\nGraph-replayed, median per call of the slowest rank; busbw as nccl-tests "
                                  "defines it; sizes are bytes per rank; 'not run': the run did not measure it.")


def _default_call_runs(machine: str) -> tuple[list[str], Optional[pd.DataFrame], str]:
    """The runs of the current defaults on ``machine``: their paths, their rows, and the source line."""
    paths = machine_runs(machine, machines.default_call_runs)
    if not paths:
        return paths, None, f"No runs of the current defaults on {machine} (`machines.DEFAULT_CALL_RUNS`)."
    codes = ", ".join(str(load.provenance(ROOT / p).get("git_sha"))[:10] for p in paths)
    return paths, load.read("probe", _abs(paths)), source_line(paths) + f" Code per run: {codes}."


def default_call(machine: str) -> str:
    """``Communicator()`` with its current defaults against NCCL, run by run (``tables.default_call``), graph-replayed
    and eager."""
    paths, rows, source = _default_call_runs(machine)
    if rows is None:
        return source
    tables_ = [f"{mode.capitalize()}:\n\n" + report.markdown(tables.default_call(rows, mode))
               for mode in ("graph", "eager")]
    return "\n\n".join([source, *tables_])


def default_call_nccl_tests(machine: str) -> str:
    """The runs of the current defaults as nccl-tests prints a run (``tables.default_call_nccl_tests``)."""
    paths, rows, source = _default_call_runs(machine)
    if rows is None:
        return source
    return (source + "\n\n" + report.markdown(tables.default_call_nccl_tests(rows, "graph")) +
            "\n\nGraph-replayed; per implementation the median over the runs of its per-call time (the slowest rank "
            "per replay); algbw and busbw (GB/s) as nccl-tests defines them from that time; sizes are the probe's "
            "bytes per rank (all_gather's input, all_to_all's and reduce_scatter's chunk, all_reduce's tensor); "
            "'not run': no correct row (a copy-engine call that needed more staging than the probe's communicator "
            "has, or a size the run did not measure).")


def default_call_headline(machine: str) -> str:
    """The README's first table: ``Communicator()`` / NCCL at the headline sizes, graph-replayed, run by run."""
    paths, rows, source = _default_call_runs(machine)
    if rows is None:
        return source
    return source + "\n\n" + report.markdown(tables.default_call(rows[rows["bytes"].isin(HEADLINE_SIZES)], "graph"))


def dma_auto(machine: str) -> str:
    """Where 'auto' takes the copy engines above the sm path (``tables.dma_auto_sizes`` of ``machines.DMA_AUTO_RUNS``),
    beside what ``options.DMA_AUTO_MIN_BYTES`` gives at each size (tests/test_report.py holds the two equal)."""
    paths = machine_runs(machine, machines.dma_auto_runs)
    if not paths:
        return f"No runs on {machine} (`machines.DMA_AUTO_RUNS`)."
    table = tables.dma_auto_sizes(load.read("probe", _abs(paths)))
    ratio = "{:.2f}".format
    shown = pd.DataFrame({
        "op": table["op"], "size": table["size"].map(human), "input": table["input bytes"].map(human),
        "copy engines / NCCL, graph": table["graph"].map(ratio), "eager": table["eager"].map(ratio),
        "faster (< %.2f both)" % tables.DMA_AUTO_MARGIN: table["faster"],
        "auto takes": ["dma" if not options.nccl_auto(w, op, n) else "nccl"
                       for w, op, n in zip(table["world"], table["op"], table["input bytes"])]})
    return (_table(shown, paths) + "\n\nMedian over the runs of the copy engines' per-call time (`path='dma'`, "
            "the sums staged) over NCCL's, at the sizes above the sm path; size: the probe's bytes per rank, input: "
            "the call's input (`DMA_AUTO_MIN_BYTES`' sizes). 'auto' takes the copy engines from the smallest size "
            "at which they are faster and stay faster at every larger size measured.")


def path_replay(machine: str) -> str:
    """The path calibration replayed on the runs of the current defaults (``analysis.path_replay``): each run
    calibrates, the others score."""
    from . import path_replay as replay

    paths, rows, source = _default_call_runs(machine)
    if rows is None:
        return source
    return (source + "\n\n" + report.markdown(replay.summary(rows)) + "\n\nEach run's "
            f"forced-path rows answer the path search (`dmacoll.calibration.paths`); its table (margin "
            f"{options.PATH_MARGIN:.0%} for NCCL) picks the path at every op and size of each other run, among the "
            "paths that ran there; points: (calibrating run, scored run, op, size). The picked path's time over "
            "NCCL's in the scored run, beside the path the constants took there (its forced row, scored alike).")


def sources(machine: str) -> str:
    """Every committed run of a machine: its code, when it ran, and its GPUs."""
    rows = []
    for data in sorted((ROOT / "results" / machine).rglob("data.csv")):
        side = data.with_suffix(".json")
        if not side.exists():
            continue
        prov = load.provenance(data)
        rows.append({"run": str(data.parent.relative_to(ROOT / "results" / machine)),
                     "code": str(prov.get("git_sha"))[:10], "created (UTC)": prov.get("created_utc", ""),
                     "GPUs": len(prov.get("hardware", {}).get("gpus", []))})
    return report.markdown(pd.DataFrame(rows))


def defaults_study(folder: str) -> str:
    """The 2x H100 defaults study's tables (``defaults_study.summary``) of a results folder."""
    from . import defaults_study as study

    return study.summary(ROOT / "results" / folder)


BLOCKS: dict[str, Callable[[str], str]] = {
    "headline": headline, "operator": operator, "claims": claims_block, "calibration": calibration,
    "breakdown": breakdown, "power": power, "interference": interference, "c3": c3, "c3_runs": c3_runs,
    "ficco": ficco, "e2e": e2e, "e2e_phased": e2e_phased, "native": native, "probes": probes, "call_cost": call_cost,
    "check_cost": check_cost,
    "nccl_tests": nccl_tests, "default_call": default_call, "default_call_headline": default_call_headline,
    "default_call_nccl_tests": default_call_nccl_tests, "dma_auto": dma_auto, "path_replay": path_replay,
    "sources": sources, "defaults_study": defaults_study,
}


# -- files -----------------------------------------------------------------------------------------------------------
def render(text: str) -> str:
    """``text`` with every generated block recomputed."""
    def block(m: re.Match) -> str:
        name, machine = m.group(2), m.group(3)
        if name not in BLOCKS:
            raise ValueError(f"unknown generated block {name!r}; known: {', '.join(BLOCKS)}")
        return m.group(1) + BLOCKS[name](machine).rstrip("\n") + "\n" + m.group(5)
    return BLOCK.sub(block, text)


def stale(path: Path) -> list[str]:
    """The blocks of ``path`` whose committed text differs from what the results give now."""
    text = Path(path).read_text()
    fresh = {(m.group(2), m.group(3)): m.group(4) for m in BLOCK.finditer(render(text))}
    return [f"{name} {machine}" for m in BLOCK.finditer(text)
            for name, machine in [(m.group(2), m.group(3))] if fresh[(name, machine)] != m.group(4)]


def update(path: Path) -> bool:
    text = Path(path).read_text()
    new = render(text)
    Path(path).write_text(new)
    return new != text


# a measurement restated in prose: a decimal, a percentage, or a number with a unit of time, bandwidth, power
# or energy (not inside a name such as Llama-3.1-8B or H200)
RESTATED = re.compile(r"(?<![\w.-])(\d+(?:\.\d+)?\s*(?:%|us\b|ms\b|s\b|GB/s|W\b|uJ\b|pJ\b)|\d+\.\d+x?)(?![\w-])")


def prose(text: str) -> str:
    """``text`` without its generated blocks, code blocks and code spans."""
    text = BLOCK.sub("", text)
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def restated(path: Path) -> list[str]:
    """Measurements written by hand in ``path``'s prose: the lines and what they restate."""
    return [f"{Path(path).name}: {m.group(1)!r} in {line.strip()[:100]!r}"
            for line in prose(Path(path).read_text()).splitlines() for m in RESTATED.finditer(line)]
