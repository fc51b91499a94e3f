"""PNG plots of solver histories: duality gap against effective passes and against time (log scale)."""
from __future__ import annotations

from pathlib import Path

__all__ = ["plot_histories", "pyplot", "style_axes", "save_figure"]


def pyplot():
    """``matplotlib.pyplot`` on the non-interactive Agg backend (PNG files, no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def style_axes(axes, xlabels, ylabel: str = "duality gap", log: str = "y", legend_size: int | None = 8) -> None:
    """Log scale on ``log`` (``"x"``, ``"y"`` or ``""``), labels and a light grid for each axis of ``axes`` (with
    its entry of ``xlabels``); a legend of font size ``legend_size`` on the first axis (``None``: no legend)."""
    for ax, xlabel in zip(axes, xlabels):
        if "x" in log:
            ax.set_xscale("log")
        if "y" in log:
            ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    if legend_size is not None:
        axes[0].legend(fontsize=legend_size)


def save_figure(fig, path) -> Path:
    """Lay out ``fig``, write it to ``path`` (PNG, parent folders created) and close it; returns the path."""
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    pyplot().close(fig)
    return path


def plot_histories(histories: dict, path, title: str | None = None) -> Path:
    """Plot ``{label: history}`` (lists of history records) to ``path`` (PNG).

    Left panel: gap against effective passes; right: gap against solver time (seconds).  The
    averaged iterate's gap, when recorded, is drawn dashed in the same colour.
    """
    fig, axes = pyplot().subplots(1, 2, figsize=(11, 4.2))
    for j, (label, hist) in enumerate(histories.items()):
        color = f"C{j % 10}"
        for key, style, suffix in (("gap", "-", ""), ("gap_avg", "--", " (avg)")):
            pts = [(r["passes"], r["solver_time"], r[key]) for r in hist if r.get(key) is not None and r[key] > 0]
            if not pts:
                continue
            p, t, g = zip(*pts)
            axes[0].plot(p, g, style, color=color, marker=".", label=label + suffix)
            axes[1].plot(t, g, style, color=color, marker=".", label=label + suffix)
    style_axes(axes, ("effective passes", "solver time (s)"))
    if title:
        fig.suptitle(title)
    return save_figure(fig, path)
