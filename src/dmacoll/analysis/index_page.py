"""The report's front page: every rendered notebook and each platform's claims table, one HTML file.

    dmacoll report index --report-dir results/local/report --platform h200x2 "2x H200 (NVLink)" ...
"""
from __future__ import annotations

import html
import json
from pathlib import Path

NOTE = ("Everything here was measured on NVIDIA Hopper GPUs with the CUDA copy engines; the papers it reproduces "
        "(ConCCL, DMA-Latte, FiCCO) ran on AMD MI300X. Claims compare the papers' statements with these "
        "measurements; they are not the papers' numbers.")


def _claims_table(path: Path) -> str:
    if not path.is_file():
        return "<p>no claims for this platform</p>"
    rows = json.loads(path.read_text())
    rows = rows.get("claims", rows) if isinstance(rows, dict) else rows
    cols = ["id", "claim", "paper (MI300X)", "metric", "configuration", "n", "reproduced", "runs", "spread",
            "tolerance", "status", "note"]
    head = "".join(f"<th>{c}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(r.get(c, '')))}</td>" for c in cols) + "</tr>"
                   for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def render(report_dir: Path, platforms: list[tuple[str, str]]) -> str:
    parts = [f"<h1>dmacoll report</h1><p>{html.escape(NOTE)}</p>"]
    for name, label in platforms:
        pages = sorted((report_dir / name / "notebooks").glob("*.html"))
        links = "".join(f'<li><a href="{name}/notebooks/{p.name}">{html.escape(p.stem)}</a></li>' for p in pages)
        parts.append(f"<h2>{html.escape(label)} ({html.escape(name)})</h2><ul>{links or '<li>nothing rendered</li>'}"
                     f"</ul><h3>Claims</h3>{_claims_table(report_dir / name / 'claims.json')}")
    style = "body{font-family:sans-serif;max-width:70em;margin:2em auto}td,th{border:1px solid #ccc;padding:3px}"
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>dmacoll report</title>"
            f"<style>{style}</style></head><body>{''.join(parts)}</body></html>\n")
