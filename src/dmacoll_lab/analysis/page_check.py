"""Checks of the rendered report as a reader gets it: every notebook page shows a figure, none of its figures has a
problem ``figure_check`` names (an unlabelled axis, text over text, a legend over data), the index opens with each
machine's headline figure and table and counts every claim computed for it, and a page laid out by a real browser
(headless Chromium) has no element wider than the window and no broken image.

    dmacoll report check --report-dir results/local/report     # every page; the browser part where Chromium is
"""
from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Optional

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
WIDTH, HEIGHT = 1280, 900
FIGURE = re.compile(r"<img[^>]+src=\"(data:image/png;base64,|[^\"]+\.png\")")
HEADLINE_FIGURE = "headline-figure"  # the classes the index gives them
HEADLINE_TABLE = "headline-table"
NO_SWEEPS = "no-sweeps"  # the class of the note a machine without operator sweeps shows in their place
STRAY = re.compile(r"<pre>\s*(-?\d+(?:\.\d+)?)\s*</pre>")  # a text output that is only a number

# appended to a copy of the page: once it has loaded, the elements whose right edge passes the window's width
# (the body's elements; the window has no horizontal scroll bar then) and the images that did not load
PROBE = """<script>
window.addEventListener('load', () => {
  const width = document.documentElement.clientWidth;
  const wide = [];
  for (const el of document.body.querySelectorAll('*')) {
    const box = el.getBoundingClientRect();
    if (box.width > 0 && (box.right > width + 1 || box.left < -1)) {
      wide.push(`${el.tagName.toLowerCase()}${el.className ? '.' + String(el.className).split(' ')[0] : ''}`
                + ` ${Math.round(box.left)}-${Math.round(box.right)} px`);
    }
  }
  const broken = [...document.images].filter(i => !(i.complete && i.naturalWidth > 0))
                                     .map(i => i.getAttribute('src').slice(0, 60));
  const out = document.createElement('pre');
  out.id = 'dmacoll-probe';
  out.textContent = JSON.stringify({width, scroll: document.documentElement.scrollWidth, wide, broken,
                                    images: document.images.length});
  document.body.appendChild(out);
});
</script>"""


def figures(text: str) -> int:
    """How many PNG images a page shows (embedded or linked)."""
    return len(FIGURE.findall(text))


def page_problems(path: Path) -> list[str]:
    """A notebook page without a figure, with a bare number printed, and each problem ``figure_check`` found in its
    figures."""
    from .figure_check import PROBLEMS

    text = Path(path).read_text()
    problems = [] if figures(text) else [f"{path}: no figure"]
    problems += [f"{path}: a bare number printed ({n}): a cell's last expression leaked its value"
                 for n in STRAY.findall(text)]
    for name, items in re.findall(rf'<div class="{PROBLEMS}" data-figure="([^"]*)">(.*?)</div>', text, re.S):
        problems += [f"{path}: figure {html.unescape(name)}: {html.unescape(item)}"
                     for item in re.findall(r"<li>(.*?)</li>", items, re.S)]
    return problems


def index_problems(path: Path, platforms: list[str]) -> list[str]:
    """The index without each platform's headline figure and table, or with a list before them."""
    text = Path(path).read_text()
    first_list = text.find("<ul")
    problems = []
    for name in platforms:
        start = text.find(f'<section id="{name}"')
        if start < 0:
            problems.append(f"{path}: no section for {name}")
            continue
        section = text[start:text.find("</section>", start)]
        if f'class="{NO_SWEEPS}"' in section:  # a machine without operator sweeps says so instead
            continue
        for marker, what in ((HEADLINE_FIGURE, "headline figure"), (HEADLINE_TABLE, "headline table")):
            at = section.find(marker)
            if at < 0:
                problems.append(f"{path}: {name} has no {what}")
            elif 0 <= first_list < start + at:
                problems.append(f"{path}: a list comes before {name}'s {what}")
    return problems


def claim_rows(path: Path) -> list[dict]:
    """The claims of a platform's ``claims.json`` (a list, or {"claims": [...]}); none where it is missing."""
    if not Path(path).is_file():
        return []
    rows = json.loads(Path(path).read_text())
    return rows.get("claims", rows) if isinstance(rows, dict) else rows


COUNT = re.compile(r'<span class="status-[\w-]+">(\d+) [^<]*</span>')


def count_problems(index: Path, report_dir: Path) -> list[str]:
    """A claim computed (``<platform>/claims.json``) but not in its section's counts on the index: a status the
    counts do not list, or a section that shows fewer."""
    text = Path(index).read_text()
    problems = []
    for claims in sorted(Path(report_dir).glob("*/claims.json")):
        name, rows = claims.parent.name, claim_rows(claims)
        start = text.find(f'<section id="{name}"')
        section = text[start:text.find("</section>", start)] if start >= 0 else ""
        counted = sum(int(n) for n in COUNT.findall(section))
        if counted != len(rows):
            problems.append(f"{index}: {name} counts {counted} claims of the {len(rows)} in {claims}")
    return problems


def browser() -> Optional[str]:
    """The Chromium executable, or None where none is installed."""
    return next((p for p in map(shutil.which, BROWSERS) if p), None)


def layout(path: Path, width: int = WIDTH, height: int = HEIGHT, timeout: float = 120) -> dict:
    """What headless Chromium sees of a page in a ``width`` x ``height`` window: ``wide`` (elements past the
    window's right edge), ``broken`` (images that did not load), ``images``, ``width`` and ``scroll`` (the page's
    scroll width). Needs ``browser()``."""
    exe = browser()
    if exe is None:
        raise FileNotFoundError("no Chromium installed (apt-get install chromium)")
    path = Path(path).resolve()
    with tempfile.TemporaryDirectory() as tmp:
        probe = path.with_name(f".probe-{path.name}")  # beside the page: its relative links still resolve
        probe.write_text(path.read_text().replace("</body>", PROBE + "</body>"))
        try:
            dom = subprocess.run(
                [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 f"--user-data-dir={tmp}", f"--window-size={width},{height}", "--virtual-time-budget=10000",
                 "--dump-dom", probe.as_uri()], capture_output=True, text=True, timeout=timeout).stdout
        finally:
            probe.unlink()
    found = re.search(r'<pre id="dmacoll-probe">(.*?)</pre>', dom, re.S)
    if not found:
        raise RuntimeError(f"Chromium gave no layout for {path} (its DOM: {dom[:200]!r})")
    return json.loads(html.unescape(found.group(1)))


def layout_problems(path: Path, width: int = WIDTH) -> list[str]:
    """Elements wider than the window and broken images, as a browser lays the page out."""
    seen = layout(path, width)
    problems = [f"{path}: {len(seen['wide'])} elements past the window's {seen['width']} px, e.g. "
                f"{', '.join(seen['wide'][:3])}"] if seen["wide"] else []
    problems += [f"{path}: broken image {src}" for src in seen["broken"]]
    return problems


def machine_problems(index: Path, results_dir: Path) -> list[str]:
    """A machine folder of ``results_dir`` with GPU runs (``machines.discover``) that has no section in the index."""
    from .machines import discover

    text = Path(index).read_text()
    return [f"{index}: no section for {name} ({folder} holds results)"
            for name, (folder, _) in discover(Path(results_dir)).items() if f'<section id="{name}"' not in text]


def report_problems(report_dir: Path, use_browser: bool = True, results_dir: Optional[Path] = None) -> list[str]:
    """Every check on a rendered report folder (``<dir>/index.html``, ``<dir>/<platform>/notebooks/*.html``); the
    browser's where Chromium is installed and ``use_browser``; with ``results_dir`` (a report of the shipped
    results), a section for every machine folder there."""
    report_dir = Path(report_dir)
    index = report_dir / "index.html"
    pages = sorted(report_dir.glob("*/notebooks/*.html"))
    if not index.is_file():
        return [f"{index}: missing"]
    platforms = sorted({p.parent.parent.name for p in pages})
    problems = index_problems(index, platforms) + count_problems(index, report_dir)
    if results_dir is not None:
        problems += machine_problems(index, results_dir)
    for p in pages:
        problems += page_problems(p)
    if use_browser and browser():
        for p in [index, *pages]:
            problems += layout_problems(p)
    return problems
