"""PNG plots of solver histories: duality gap against effective passes and against time (log scale)."""
from __future__ import annotations

from pathlib import Path

__all__ = ["plot_histories"]


def plot_histories(histories: dict, path, title: str | None = None) -> Path:
    """Plot ``{label: history}`` (lists of history records) to ``path`` (PNG).

    Left panel: gap against effective passes; right: gap against solver time (seconds).  The
    averaged iterate's gap, when recorded, is drawn dashed in the same colour.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for j, (label, hist) in enumerate(histories.items()):
        color = f"C{j % 10}"
        for key, style, suffix in (("gap", "-", ""), ("gap_avg", "--", " (avg)")):
            pts = [(r["passes"], r["solver_time"], r[key]) for r in hist if r.get(key) is not None and r[key] > 0]
            if not pts:
                continue
            p, t, g = zip(*pts)
            axes[0].plot(p, g, style, color=color, marker=".", label=label + suffix)
            axes[1].plot(t, g, style, color=color, marker=".", label=label + suffix)
    for ax, xlabel in zip(axes, ("effective passes", "solver time (s)")):
        ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("duality gap")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
