"""What a reader would trip over in a figure, found before it is saved: an axis with ticks but no label, a label that
is a raw column name, text drawn over other text (titles, labels, tick labels, legends), a legend over plotted data.

``page.figure`` runs ``problems`` on every figure and shows what it finds on the page (class ``PROBLEMS``), where
``dmacoll report check`` counts it. Checked on the figure as matplotlib draws it (text extents from its renderer), so
it needs no browser.
"""
from __future__ import annotations

import math
from itertools import combinations

PROBLEMS = "figure-problems"  # the class of the page element that lists a figure's problems
# labels that are a data column's name, not a reader's label (seaborn's defaults)
RAW_LABELS = {"value", "bytes", "per_call_us", "time_us", "ratio", "variable", "size", "count"}
SLACK_PX = 1.0  # boxes that overlap by less than this (antialiasing, touching edges) are not overlapping


def _visible_text(artist) -> bool:
    return artist.get_visible() and bool(artist.get_text().strip())


def _tick_labels(axis) -> list:
    """The tick labels an axis draws: those of its ticks inside the view (a log axis also holds ticks past its
    limits, never drawn) that are switched on."""
    ticks = axis._update_ticks()  # what Axis.draw draws
    return [label for tick in ticks for label in (tick.label1, tick.label2) if label.get_visible()]


def _texts(fig) -> list:
    """Every visible, non-empty text of the figure: suptitle, titles, axis labels, tick labels, legend entries and
    titles, free text."""
    found = [t for t in fig.texts if _visible_text(t)]
    found += [lg.get_title() for lg in fig.legends] + [t for lg in fig.legends for t in lg.get_texts()]
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        found += [ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label]
        found += _tick_labels(ax.xaxis) + _tick_labels(ax.yaxis)
        found += [t for t in ax.texts]
        legend = ax.get_legend()
        if legend is not None and legend.get_visible():
            found += [legend.get_title(), *legend.get_texts()]
    return [t for t in found if _visible_text(t)]


def _outline(text, renderer) -> list[tuple[float, float]]:
    """The four corners of a text's box on the canvas: rotated with the text (a rotated tick label's upright
    extent covers its neighbours' though the letters do not touch)."""
    box = text.get_window_extent(renderer)
    angle = text.get_rotation() % 90
    if angle == 0:
        return [(box.x0, box.y0), (box.x1, box.y0), (box.x1, box.y1), (box.x0, box.y1)]
    rotation = text.get_rotation()
    text.set_rotation(0)
    flat = text.get_window_extent(renderer)
    text.set_rotation(rotation)
    c, s = math.cos(math.radians(rotation)), math.sin(math.radians(rotation))
    corners = [(u * c - v * s, u * s + v * c) for u, v in ((0, 0), (flat.width, 0), (flat.width, flat.height),
                                                           (0, flat.height))]
    dx, dy = box.x0 - min(x for x, _ in corners), box.y0 - min(y for _, y in corners)
    return [(x + dx, y + dy) for x, y in corners]


def _overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> bool:
    """Whether two convex outlines overlap by more than ``SLACK_PX`` (separating axes: none of their edges'
    normals separates them)."""
    for poly in (a, b):
        for (x0, y0), (x1, y1) in zip(poly, poly[1:] + poly[:1]):
            nx, ny = y0 - y1, x1 - x0
            norm = math.hypot(nx, ny) or 1.0
            pa = [(x * nx + y * ny) / norm for x, y in a]
            pb = [(x * nx + y * ny) / norm for x, y in b]
            if min(max(pa), max(pb)) - max(min(pa), min(pb)) <= SLACK_PX:
                return False
    return True


def _labels(fig) -> list[str]:
    """Axes whose ticks have labels but whose axis has none, and labels that are raw column names. A grid's inner
    axes share their neighbours' labels (seaborn labels only the outer ones): an axis counts as labelled where any
    axes of the figure in its row (y) or column (x) carries a label."""
    problems = []
    axes = [ax for ax in fig.axes if ax.get_visible() and ax.axison]
    for which in ("x", "y"):
        labelled = set()
        for ax in axes:
            label = getattr(ax, f"get_{which}label")().strip()
            if label:
                labelled.add(_line(ax, which))
                if label.lower() in RAW_LABELS:
                    problems.append(f"{which} axis labelled {label!r}, a column's name (say what it is, and its unit)")
        for ax in axes:
            ticks = [t for t in _tick_labels(getattr(ax, f"{which}axis")) if _visible_text(t)]
            if ticks and _line(ax, which) not in labelled:
                title = ax.get_title() or "an axes"
                problems.append(f"{which} axis of {title!r} has tick labels but no label")
    return sorted(set(problems))


def _line(ax, which: str) -> float:
    """Where the axes that share a label line up: a grid labels y once per row (its bottom edge), x once per column
    (its left edge)."""
    box = ax.get_position()
    return round(box.y0 if which == "y" else box.x0, 3)


def _legends_over_data(fig, renderer) -> list[str]:
    """Legends drawn inside an axes over its lines' or markers' points."""
    problems = []
    for ax in fig.axes:
        legend = ax.get_legend()
        if legend is None or not legend.get_visible():
            continue
        box = legend.get_window_extent(renderer)
        data = [line.get_xydata() for line in ax.get_lines() if line.get_visible() and len(line.get_xdata())]
        data += [coll.get_offsets() for coll in ax.collections if len(coll.get_offsets())]
        points = sum(1 for xy in data for x, y in ax.transData.transform(xy)
                     if box.x0 < x < box.x1 and box.y0 < y < box.y1)
        if points:
            title = ax.get_title() or "an axes"
            problems.append(f"the legend of {title!r} covers {points} plotted point(s)")
    return problems


def problems(fig) -> list[str]:
    """Everything the module docstring names, for one matplotlib figure (a seaborn grid: its ``.figure``)."""
    fig = getattr(fig, "figure", fig)
    fig.canvas.draw()  # lays the text out: extents are real after this
    renderer = fig.canvas.get_renderer()
    found = _labels(fig)
    texts = _texts(fig)
    outlines = [(t, _outline(t, renderer)) for t in texts]
    for (a, box_a), (b, box_b) in combinations(outlines, 2):
        if _overlap(box_a, box_b):
            found.append(f"text {a.get_text()[:40]!r} overlaps {b.get_text()[:40]!r}")
    return found + _legends_over_data(fig, renderer)
