"""Reading results: `dmacoll report` (tables, the README's results block, claims, docs/results.md, the index page)
and `dmacoll rules` (the learned C3 strategy and FiCCO schedule rules)."""
from __future__ import annotations

import argparse
from pathlib import Path

from dmacoll.lab_api import InvalidArgument
from .common import existing_dir, existing_file


# the files with generated blocks; the results READMEs are lab notes: only their blocks are checked, not their prose
DOCUMENTS = ("README.md", "docs/results.md", "results/h200x2/c3/README.md", "results/h200x4/c3/README.md",
             "results/h100x2/defaults/README.md")


def cmd_docs(a: argparse.Namespace) -> int:
    """Rewrite (or --check) every generated block of the documents; report prose that restates a number."""
    from ..analysis import docs

    problems = []
    for path in [Path(f) for f in a.files] or [docs.ROOT / f for f in DOCUMENTS]:
        name = path.name
        if a.check:
            problems += [f"{name}: block '{b}' is stale" for b in docs.stale(path)]
        else:
            print(f"{name}: {'updated' if docs.update(path) else 'already up to date'}")
        if "results" not in path.parts:
            problems += [f"restated by hand: {r}" for r in docs.restated(path)]
    for p in problems:
        print(p)
    if problems and a.check:
        print("run `dmacoll report docs` to regenerate the blocks; move measurements out of the prose")
    return 1 if problems else 0


def cmd_report(a: argparse.Namespace) -> int:
    if a.what == "docs":
        return cmd_docs(a)
    if a.what == "check":
        from ..analysis import page_check

        if not a.report_dir:
            raise InvalidArgument("check needs --report-dir (a rendered report: index.html, <platform>/notebooks/)")
        if not page_check.browser():
            print("no Chromium installed: the layout in a browser is not checked (apt-get install chromium)")
        problems = page_check.report_problems(Path(a.report_dir), results_dir=a.results_dir)
        for p in problems:
            print(p)
        print(f"{a.report_dir}: {len(problems)} problems")
        return 1 if problems else 0
    if a.what == "index":
        from ..analysis import index_page

        if not a.report_dir or not a.platform:
            raise InvalidArgument("index needs --report-dir and --platform NAME LABEL")
        out = Path(a.out or Path(a.report_dir) / "index.html")
        out.write_text(index_page.render(Path(a.report_dir), [tuple(x) for x in a.platform]))
        print(f"wrote {out}")
        return 0
    if not a.csv:
        raise InvalidArgument(f"{a.what} needs --csv (the operator sweep CSVs)")
    if a.what == "claims":
        from ..analysis import claims

        out = Path(a.out or "results/local/claims.json")
        rows = claims.write(a.csv, out, out.with_suffix(".md"), a.power, a.c3, a.e2e, a.ficco, a.vllm)
        for r in rows:
            print(f"{r['status']:12s} {r['id']} ({r['configuration']}): {r['reproduced']} "
                  f"(spread {r['spread'] or 'none'}, tolerance {r['tolerance']})")
        return 0
    from ..analysis.report import table

    block = table(a.csv)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(block + "\n")
        print(f"wrote {a.out}")
    else:
        print(block)
    return 0


def cmd_rules(a: argparse.Namespace) -> int:
    if a.experiment == "c3":
        from ..analysis import c3_rules as rules

        res = rules.fit_and_evaluate(rules.collapse(rules.load(a.csv)), a.depth, a.min_leaf or 3, a.min_gain)
    else:
        from ..analysis import ficco_rules as rules

        res = rules.fit_and_evaluate(rules.collapse(rules.load(a.csv)), a.depth, a.min_leaf or 2, a.min_gain,
                                     holdout=a.holdout)
    print(rules.summary(res))
    return 0


def register(sub) -> None:
    r = sub.add_parser("report", help="tables from result CSVs: table, claims, docs (the generated blocks of the "
                                      "README and docs/results.md), index (the report's front page), check (a "
                                      "rendered report as a reader sees it: figures, headline, every claim counted, "
                                      "layout in Chromium)")
    r.add_argument("what", choices=("table", "claims", "docs", "index", "check"))
    r.add_argument("files", nargs="*", help="docs: the documents (default: README.md docs/results.md)")
    r.add_argument("--check", action="store_true", help="docs: only say what is stale (exit 1 if any)")
    r.add_argument("--csv", nargs="+", type=existing_file, help="operator sweep CSV(s)")
    r.add_argument("--out", help="table: write the Markdown here; claims: the JSON (Markdown beside it); index: "
                                 "the HTML page (default REPORT_DIR/index.html)")
    r.add_argument("--power", type=existing_file,
                   help="claims: the power CSV of `dmacoll power` (its claims are 'not run' without)")
    r.add_argument("--c3", nargs="+", type=existing_file, default=[],
                   help="claims: `dmacoll c3` tables, one per run (its claims are 'not run' without; several runs: "
                        "the worst decides, the spread is reported)")
    r.add_argument("--e2e", nargs="+", type=existing_file, default=[],
                   help="claims: `dmacoll e2e` tables, one per run (its claims are 'not run' without; several runs: "
                        "each point's ratio is the median over its runs, the spread their range)")
    r.add_argument("--vllm", nargs="+", type=existing_file, default=[],
                   help="claims: `dmacoll vllm results csv` tables of `vllm bench` with the plugin off and on, one "
                        "per run (its claims are 'not run' without; each point the median over its runs)")
    r.add_argument("--ficco", nargs="+", type=existing_file, default=[],
                   help="claims: `dmacoll ficco` tables, one per run (its claim is 'not run' without)")
    r.add_argument("--report-dir", type=existing_dir, help="index, check: the folder of rendered platforms")
    r.add_argument("--platform", nargs=2, action="append", metavar=("NAME", "LABEL"),
                   help="index: a rendered platform (repeat)")
    r.add_argument("--results-dir", type=existing_dir,
                   help="check, for a report of the shipped results: every machine folder there with GPU runs must "
                        "have a section on the index")
    r.set_defaults(func=cmd_report)

    u = sub.add_parser("rules", help="learn and score the rule that picks a C3 strategy or a FiCCO schedule")
    u.add_argument("experiment", choices=("c3", "ficco"))
    u.add_argument("csv", nargs="+", type=existing_file, help="tables of `dmacoll c3` / `dmacoll ficco`")
    u.add_argument("--depth", type=int, default=2)
    u.add_argument("--min-leaf", type=int, default=None, help="default: 3 (c3), 2 (ficco)")
    u.add_argument("--min-gain", type=float, default=0.005)
    u.add_argument("--holdout", default=None, help="ficco: the model to hold out (default: the first by name)")
    u.set_defaults(func=cmd_rules)
