"""Plots written next to results: training curves, and the placement helpers of the report's plots.

``label_hlines`` draws reference lines with their labels on the lines, inside the axes;
``place_legend`` puts a legend where it covers no data point (nor any artist it is told
to avoid), else outside the axes. Both work in display coordinates, after a draw, so
they see the final limits and the markers' real sizes.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

from compress.core.formats.writes import atomic_path


def _pyplot():
    # deferred: a heavy import, paid only where it is used
    import matplotlib

    matplotlib.use("Agg")  # files only; no display on servers
    # deferred: a heavy import, paid only where it is used
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path) -> Path:
    """Save a figure atomically as PNG (temporary file, then rename)."""
    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight")
    return path


def plot_curves(
    history: Sequence[dict[str, Any]],
    panels: Sequence[tuple[str, Sequence[str]]],
    path: Path,
    title: str = "",
    phase_key: str = "phase",
) -> Path:
    """One panel per (ylabel, keys) pair, each key plotted against ``step``.

    Keys are looked up in a history entry, then in its ``eval`` dict (eval points are
    drawn as markers). Phase changes (e.g. sequence length 128 -> 512) are marked.
    """
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.6), squeeze=False)
    for ax, (ylabel, keys) in zip(axes[0], panels):
        for key in keys:
            train = [(h["step"], h[key]) for h in history if key in h]
            evals = [(h["step"], h["eval"][key]) for h in history if key in h.get("eval", {})]
            if train:
                ax.plot(*zip(*train), label=f"{key} (train, running mean)")
            if evals:
                ax.plot(*zip(*evals), "o-", label=f"{key} (held out)")
        phased = [h for h in history if phase_key in h]
        changes = [h["step"] for prev, h in zip(phased, phased[1:]) if h[phase_key] != prev[phase_key]]
        for x in changes:
            ax.axvline(x, color="grey", linestyle="--", linewidth=0.8)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    out = save_figure(fig, path)
    plt.close(fig)
    return out


# ---------------------------------------------------------------------------- placement

# Tried in this order; the first that covers nothing wins.
LEGEND_LOCATIONS = ("lower right", "upper left", "lower left", "upper right", "center right", "center left",
                    "lower center", "upper center")


def marker_radius(ax, size: float) -> float:
    """Radius in display pixels of a scatter marker of area ``size`` (points^2)."""
    return math.sqrt(size) / 2 * ax.figure.dpi / 72


def covers(box, centres: Sequence[tuple[float, float]], radii: Sequence[float]) -> bool:
    """Whether the display-coordinate box touches any circle (centre, radius) in display pixels."""
    for (x, y), r in zip(centres, radii):
        dx = max(box.x0 - x, 0.0, x - box.x1)  # distance from the centre to the box, per axis
        dy = max(box.y0 - y, 0.0, y - box.y1)
        if dx * dx + dy * dy <= r * r:
            return True
    return False


def _free(box, centres, radii, avoid, renderer) -> bool:
    """No circle and no artist of ``avoid`` under ``box``."""
    return not covers(box, centres, radii) and not any(box.overlaps(a.get_window_extent(renderer)) for a in avoid)


def label_hlines(ax, lines: Sequence[tuple[float, str]], points: Sequence[tuple[float, float]] = (),
                 sizes: Sequence[float] = (), avoid: Sequence[Any] = (), fontsize: float = 6.5) -> list:
    """Dashed horizontal reference lines at data y, each labelled on itself inside the axes; the label texts.

    A label sits across its own line, in the line's colour: at the right end if that covers no
    point (``points`` in data coordinates, marker areas ``sizes``), no artist of ``avoid`` and
    no earlier label, else at the first free place further left (so close lines get their
    labels side by side), else where it overlaps least. The y limits grow until every label
    is inside the axes.
    """
    # deferred: a heavy import, paid only where it is used
    from matplotlib import colormaps

    if not lines:
        return []
    fig = ax.figure
    lines = sorted(lines, reverse=True)  # the highest line is labelled first: it gets the right end
    palette = colormaps["Dark2"].colors
    colours = [palette[i % len(palette)] for i in range(len(lines))]
    for (y, _), colour in zip(lines, colours):
        ax.axhline(y, linestyle="--", linewidth=0.9, color=colour, zorder=1)
    renderer = fig.canvas.get_renderer()
    texts: list = []
    for _ in range(4):  # place, then widen the y limits if a label sticks out, and place again
        for text in texts:
            text.remove()
        fig.canvas.draw()
        texts = _place_labels(ax, lines, colours, points=points, sizes=sizes, avoid=avoid, renderer=renderer,
                              fontsize=fontsize)
        inside, boxes = ax.get_window_extent(renderer), [t.get_window_extent(renderer) for t in texts]
        over = max(0.0, max(b.y1 for b in boxes) - inside.y1)
        under = max(0.0, inside.y0 - min(b.y0 for b in boxes))
        if not over and not under:
            break
        low, high = ax.get_ylim()
        per_pixel = (high - low) / inside.height
        ax.set_ylim(low - (under + 2) * per_pixel if under else low, high + (over + 2) * per_pixel if over else high)
    return texts


def _place_labels(ax, lines, colours, *, points, sizes, avoid, renderer, fontsize) -> list:
    """Each line's label at the rightmost free place along it (right-aligned at x = 0.99, 0.97, ... in axes units)."""
    # deferred: a heavy import, paid only where it is used
    from matplotlib.transforms import blended_transform_factory

    centres = [tuple(c) for c in ax.transData.transform(points)] if len(points) else []
    radii = [marker_radius(ax, s) for s in sizes]
    transform = blended_transform_factory(ax.transAxes, ax.transData)
    inside = ax.get_window_extent(renderer)
    texts: list = []
    for (y, label), colour in zip(lines, colours):
        text = ax.text(0.99, y, f"{label} {y:.1f}", transform=transform, ha="right", va="center", fontsize=fontsize,
                       color=colour, zorder=4,
                       bbox={"boxstyle": "round,pad=0.1", "facecolor": "white", "edgecolor": "none", "alpha": 0.85})
        best, best_overlap = 0.99, None
        for step in range(50):
            x = 0.99 - 0.02 * step
            text.set_x(x)
            box = text.get_window_extent(renderer)
            if box.x0 < inside.x0 + 2:
                break
            others = [*texts, *avoid]
            if _free(box, centres, radii, others, renderer):
                best, best_overlap = x, 0.0
                break
            overlap = sum(_overlap(box, o.get_window_extent(renderer)) for o in others) + \
                sum(1e6 for c, r in zip(centres, radii) if covers(box, [c], [r]))  # a point is worse than a label
            if best_overlap is None or overlap < best_overlap:
                best, best_overlap = x, overlap
        text.set_x(best)
        texts.append(text)
    return texts


def _overlap(a, b) -> float:
    """Area shared by two display boxes."""
    return max(0.0, min(a.x1, b.x1) - max(a.x0, b.x0)) * max(0.0, min(a.y1, b.y1) - max(a.y0, b.y0))


def place_legend(ax, points: Sequence[tuple[float, float]] = (), sizes: Sequence[float] = (),
                 avoid: Sequence[Any] = (), **legend_kw):
    """A legend inside the axes where it covers no point (data coordinates, marker areas ``sizes``) and no
    artist of ``avoid``; outside the axes, at the right, when every location inside covers something."""
    fig = ax.figure
    fig.canvas.draw()  # final limits and layout before anything is measured
    renderer = fig.canvas.get_renderer()
    centres = [tuple(c) for c in ax.transData.transform(points)] if len(points) else []
    radii = [marker_radius(ax, s) for s in sizes]
    for loc in LEGEND_LOCATIONS:
        legend = ax.legend(loc=loc, **legend_kw)
        fig.canvas.draw()
        if _free(legend.get_window_extent(renderer), centres, radii, avoid, renderer):
            return legend
    return ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, **legend_kw)
