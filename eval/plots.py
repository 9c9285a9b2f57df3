"""Plots written next to results: training curves (more plots join the report stage)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from compress.core.artifacts import atomic_path


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
