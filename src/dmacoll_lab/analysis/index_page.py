"""The report's front page, one HTML file: per machine its headline (the time-per-call figure with p10-p90 bands
and the README's headline table, both made by the operator notebook), a coloured count of the claims by status and
the claims table, and which pages were rendered and which experiments were not run on it (a machine without
operator sweeps says so in place of the headline and claims); then the list of every rendered notebook page.

    dmacoll report index --report-dir results/local/report --platform h200x2 "2x H200 (NVLink)" ...
"""
from __future__ import annotations

import html
from pathlib import Path

import pandas as pd

from . import figures, page
from .claims import STATUSES
from .page_check import NO_SWEEPS, claim_rows

NOTE = ("Everything here was measured on NVIDIA Hopper GPUs with the CUDA copy engines; the papers it reproduces "
        "(ConCCL, DMA-Latte, FiCCO) ran on AMD MI300X. Claims compare the papers' statements with these "
        "measurements; they are not the papers' numbers.")
HEADLINE = "figures/operator/headline"  # the operator notebook's headline figure (.png) and table (.csv)
RATIOS = "figures/operator/ratios.csv"  # the operator notebook's table of every size
MACHINES = "machines"  # the front page's figure of the machines side by side (.png)
# every page the report renders per machine (notebooks/<name>.py), in the order the workflow lists them
PAGES = ("operator", "speedup", "breakdown", "resources", "c3", "ficco", "e2e")
CLAIM_COLUMNS = ["id", "claim", "paper (MI300X)", "metric", "configuration", "n", "reproduced", "spread", "runs",
                 "over runs", "tolerance", "status", "note"]
COLOURS = {"pass": "#d7f0d2", "within noise": "#fff1c2", "fail": "#f8d3d0", "not run": "#e6e6e6"}
STYLE = ("body{font-family:sans-serif;max-width:78em;margin:2em auto;padding:0 1em}"
         ".headline-figure{max-width:100%;height:auto}"
         ".counts span{display:inline-block;padding:3px 10px;margin-right:6px;border-radius:3px;font-weight:bold}"
         + "".join(f".status-{s.replace(' ', '-')}{{background:{c}}}" for s, c in COLOURS.items()))


def _status_class(status: str) -> str:
    return "status-" + str(status).replace(" ", "-")


def _counts(rows: list[dict]) -> str:
    spans = [f'<span class="{_status_class(s)}">{sum(r.get("status") == s for r in rows)} {html.escape(s)}</span>'
             for s in STATUSES]
    return f'<p class="counts">Claims: {"".join(spans)}</p>'


# what the claims table's words mean, shown under it (claims.py and report.picks define them)
CLAIMS_LEGEND = (
    "<p class=\"legend\">Configurations: <b>default</b>, what <code>Communicator()</code> does with no options: in "
    "the operator and power claims on the copy engines (<code>path='dma'</code>, the papers' reproduction; a sweep "
    "without such rows shows the row its tuning table picks, marked <em>derived</em>), end to end on every path, "
    "SM kernels and NCCL included, as in the headline; <b>tuned</b>, options that need no promise from the caller, "
    "from the shipped table (end to end: the schedule per phase the benchmark chose, in-sample); "
    "<b>oracle</b>, the best of all N measured configurations, "
    "picked after the fact; <b>pcpy</b>, the unoptimised DMA collective. Status: <b>within noise</b> when the "
    "tolerance lies inside the claim's range over several runs (or, for a C3 value from one run, a strategy's "
    "run-to-run range); a claim resting on one run is decided by its median, and <em>spread</em> then shows the "
    "p10-p90 of its repeats, which decides nothing.</p>")


def _claims_table(rows: list[dict]) -> str:
    if not rows:
        return "<p>no claims for this platform</p>"
    table = pd.DataFrame(rows).reindex(columns=CLAIM_COLUMNS)
    return (page.table_html(table, cell_class=lambda column, value: _status_class(value) if column == "status" else "")
            + CLAIMS_LEGEND)


def _headline(report_dir: Path, name: str) -> str:
    png, csv = report_dir / name / f"{HEADLINE}.png", report_dir / name / f"{HEADLINE}.csv"
    if not png.is_file() or not csv.is_file():
        return "<p>no headline: the operator page was not rendered for this machine</p>"
    table = page.table_html(pd.read_csv(csv, keep_default_na=False)).replace(
        'class="dmacoll-table"', 'class="dmacoll-table headline-table"', 1)
    return (f'<img class="headline-figure" src="{name}/{HEADLINE}.png" alt="time per call against size, {name}">'
            f"<p>dmacoll over NCCL, graph-replayed (below 1: dmacoll faster); brackets: the p10-p90 of the repeats "
            f"as a ratio, and N, the measured configurations a pick was made from; (derived): no call with no "
            f"options was measured at that point, so the default shown is the shipped table's pick from the same "
            f"sweep.</p>{table}")


def _coverage(report_dir: Path, name: str) -> str:
    """Which pages this machine has, and which experiments its results lack."""
    have = {p.stem for p in (report_dir / name / "notebooks").glob("*.html")}
    rendered = ", ".join(p for p in PAGES if p in have) or "none"
    missing = ", ".join(p for p in PAGES if p not in have)
    return (f"<p>Pages: {html.escape(rendered)}." + (f" No page (not run on this machine, or nothing to compare): "
                                                       f"{html.escape(missing)}." if missing else "") + "</p>")


def _section(report_dir: Path, name: str, label: str) -> str:
    head = f'<section id="{html.escape(name)}"><h2>{html.escape(label)} ({html.escape(name)})</h2>'
    if not (report_dir / name / "claims.json").is_file():  # no operator sweeps: no headline, nothing to claim from
        return (f'{head}<p class="{NO_SWEEPS}">No operator sweep was committed for this machine: no headline and no '
                f"claims (a claim rests on the sweeps); its other results are in docs/results.md.</p>"
                f"{_coverage(report_dir, name)}</section>")
    rows = claim_rows(report_dir / name / "claims.json")
    return (f"{head}{_headline(report_dir, name)}{_counts(rows)}{_coverage(report_dir, name)}"
            f"<h3>Claims</h3>{_claims_table(rows)}</section>")


def _machines(report_dir: Path, platforms: list[tuple[str, str]]) -> str:
    """The machines side by side (``figures.machines``), where two or more have an operator page; what
    ``figure_check`` finds wrong with the figure is shown under it, as on the notebook pages."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .figure_check import problems

    ratios = {label: pd.read_csv(report_dir / name / RATIOS) for name, label in platforms
              if (report_dir / name / RATIOS).is_file()}
    if len(ratios) < 2:
        return ""
    fig = figures.machines(ratios)
    found = problems(fig)
    fig.savefig(report_dir / f"{MACHINES}.png", bbox_inches="tight")
    plt.close(fig)
    return (f'<section id="machines"><h2>The machines side by side</h2>'
            f'<img class="headline-figure" src="{MACHINES}.png" alt="NCCL and the copy engines on every machine">'
            f"<p>Per op swept on two or more machines, graph-replayed: NCCL's time per call (top) and the best "
            f"measured copy-engine configuration's time over NCCL's (bottom, below 1: the copy engines faster), a "
            f"line per machine: two and four GPUs, H100 and H200 where both were measured. From each machine's "
            f"operator page (`{RATIOS}`).</p>"
            + page.problems_html(MACHINES, found) + "</section>")


def render(report_dir: Path, platforms: list[tuple[str, str]]) -> str:
    parts = [f"<h1>dmacoll report</h1><p>{html.escape(NOTE)}</p>"]
    parts += [_section(report_dir, name, label) for name, label in platforms]
    parts.append(_machines(report_dir, platforms))
    pages = []
    for name, label in platforms:
        found = sorted((report_dir / name / "notebooks").glob("*.html"))
        links = "".join(f'<li><a href="{name}/notebooks/{p.name}">{html.escape(p.stem)}</a></li>' for p in found)
        pages.append(f"<h3>{html.escape(label)}</h3><ul>{links or '<li>nothing rendered</li>'}</ul>")
    parts.append(f'<section id="pages"><h2>Every page</h2>{"".join(pages)}</section>')
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>dmacoll report</title>"
            f"<style>{STYLE}</style>{page.STYLE}</head><body>{''.join(parts)}</body></html>\n")
