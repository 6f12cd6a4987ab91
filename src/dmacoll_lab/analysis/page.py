"""What a notebook page shows, the same way on every page: its figures inline (saved as PNG for the HTML page and
PDF for papers), its tables without the pandas index and wrapped to the page's width, and readings: paragraphs
whose every number is computed from the data (``readings``). The notebooks display through these, never through
a bare DataFrame (index column, no wrapping) or ``plt.show()`` (the Agg backend shows nothing).
"""
from __future__ import annotations

import html
from pathlib import Path

import pandas as pd

# tables wrap inside the page (long names break anywhere rather than widen the page), text outputs wrap, images
# shrink to the page; the selectors are those of nbconvert's lab template
SHORT = 16  # characters: a cell this short is kept on one line
STYLE = """<style>
.dmacoll-table table { border-collapse: collapse; font-size: 12px; table-layout: auto; max-width: 100%; }
.dmacoll-table th, .dmacoll-table td { overflow-wrap: anywhere; word-break: normal; white-space: normal;
  padding: 2px 6px; border-bottom: 1px solid #ddd; text-align: left; vertical-align: top; max-width: none; }
.dmacoll-table td.nowrap { white-space: nowrap; overflow-wrap: normal; }
.dmacoll-table th { background: #f3f3f3; }
.jp-OutputArea-output pre, .jp-RenderedText pre { white-space: pre-wrap; overflow-wrap: anywhere; }
.jp-OutputArea-output img, .jp-RenderedImage img { max-width: 100%; height: auto; }
.dmacoll-reading { max-width: 60em; }
</style>"""


def _display(obj) -> None:
    """IPython's display (a test replaces this to see what a page shows)."""
    from IPython.display import display

    display(obj)


def setup() -> None:
    """The page's style: call once, first."""
    from IPython.display import HTML

    _display(HTML(STYLE))


def figure(fig, outdir: str | Path, name: str) -> Path:
    """Save a figure (a matplotlib figure or a seaborn grid) as ``name``.png and .pdf in ``outdir``, show the PNG
    on the page and close the figure; returns the PNG's path. What ``figure_check`` finds wrong with it is shown
    under it (``dmacoll report check`` counts those)."""
    import matplotlib.pyplot as plt
    from IPython.display import HTML, Image

    from .figure_check import problems

    fig = getattr(fig, "figure", fig)
    found = problems(fig)
    png = Path(outdir) / f"{name}.png"
    for ext in ("png", "pdf"):
        fig.savefig(Path(outdir) / f"{name}.{ext}", bbox_inches="tight")
    plt.close(fig)
    _display(Image(filename=str(png)))
    if found:
        _display(HTML(problems_html(name, found)))
    return png


def problems_html(name: str, found: list[str]) -> str:
    """What ``figure_check`` found wrong with figure ``name``, as the element ``dmacoll report check`` counts ('' if
    nothing)."""
    from .figure_check import PROBLEMS

    if not found:
        return ""
    items = "".join(f"<li>{html.escape(p)}</li>" for p in found)
    label = html.escape(name)
    return f'<div class="{PROBLEMS}" data-figure="{label}"><em>Figure check, {label}:</em><ul>{items}</ul></div>'


def grid(g) -> None:
    """A seaborn grid the way every page shows one: facet titles that name the facets without the column names
    ("ttft, time | llama-3.1-8b", not "ratio = ttft, time | model = llama-3.1-8b"), the grid's y label on the left
    column only, and the axes spaced so that no text runs into its neighbour's."""
    rows, cols = bool(g.row_names), bool(g.col_names)
    g.set_titles(template="{row_name} | {col_name}" if rows and cols else "{row_name}" if rows else "{col_name}")
    axes = g.axes if g.axes.ndim == 2 else g.axes.reshape(1, -1)
    label = axes[0, 0].get_ylabel()
    for row in axes:
        for i, ax in enumerate(row):
            ax.set_ylabel(label if i == 0 else "")
    g.tight_layout()


def _cell(value) -> str:
    return "" if value is None or (isinstance(value, float) and pd.isna(value)) else str(value)


def table_html(df: pd.DataFrame, empty: str = "nothing to show", cell_class=None) -> str:
    """A table as HTML without the index, in the wrapping style (``STYLE``): a short cell (a number, a size, a
    range) never breaks, anything longer wraps, anywhere if it must. ``empty``: the sentence shown
    instead of a table without rows; ``cell_class(column, value)``: an extra class for a cell."""
    if df.empty:
        return f"<p><em>{html.escape(empty)}</em></p>"
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in df.columns)
    rows = []
    for values in df.itertuples(index=False):
        cells = []
        for column, value in zip(df.columns, values):
            text = _cell(value)
            classes = (["nowrap"] if len(text) <= SHORT else []) + (
                [cell_class(column, value)] if cell_class else [])
            cells.append(f'<td class="{" ".join(c for c in classes if c)}">{html.escape(text)}</td>')
        rows.append("<tr>" + "".join(cells) + "</tr>")
    body = "".join(rows)
    return f'<div class="dmacoll-table"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def table(df: pd.DataFrame, empty: str = "nothing to show") -> None:
    from IPython.display import HTML

    _display(HTML(table_html(df, empty)))


def reading(text: str) -> None:
    """A paragraph of reading (Markdown) under a figure or table."""
    from IPython.display import Markdown

    _display(Markdown(text))
