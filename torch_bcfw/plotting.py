"""PNG plots of solver histories: duality gap against effective passes and against time (log scale)."""
from __future__ import annotations

from pathlib import Path

from .io.serialization import atomic_write_stream

__all__ = ["plot_histories", "histories_figure", "pyplot", "style_axes", "save_figure"]


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
    """Lay out ``fig``, write it to ``path`` (PNG, atomically, parent folders created) and close it; returns the
    path."""
    fig.tight_layout()
    path = Path(path)
    try:  # atomically: a Ctrl-C or a full disk leaves the previous figure
        atomic_write_stream(path, lambda f: fig.savefig(f, dpi=110, format="png"))
    finally:
        pyplot().close(fig)
    return path


def _points(hist, key):
    return [(r["passes"], r["solver_time"], r[key]) for r in hist
            if r.get(key) is not None and r[key] > 0 and r.get("passes") is not None and r.get("solver_time") is not None]


def plot_histories(histories: dict, path, title: str | None = None, gap_tol: float | None = None,
                   compile_time: float | None = None) -> Path:
    """Plot ``{label: history}`` (lists of ``CheckRecord.to_dict`` dicts) to ``path`` (PNG).

    Duality gap against effective passes (left) and solver time (right): a thick line for the **certified gap**
    (``gap``, its last value written beside it), thin dashed / dotted ones for ``gap_last`` / ``gap_avg``, a
    horizontal line at ``gap_tol``; ``compile_time`` (numba compilation seconds, outside the solve) is noted on the
    time panel.  A gap of exactly 0 is written as text (no log scale for it).
    """
    return save_figure(histories_figure(histories, title, gap_tol, compile_time), path)


def histories_figure(histories: dict, title: str | None = None, gap_tol: float | None = None,
                     compile_time: float | None = None):
    """The matplotlib figure of :func:`plot_histories` (not saved)."""
    fig, axes = pyplot().subplots(1, 2, figsize=(11, 4.4))
    notes = []
    for j, (label, hist) in enumerate(histories.items()):
        color = f"C{j % 10}"
        certified = _points(hist, "gap")
        last = hist[-1] if hist else {}
        if certified:
            p, t, g = zip(*certified)
            for ax, x in zip(axes, (p, t)):
                ax.plot(x, g, "-", color=color, lw=2.4, alpha=0.6, marker="o", ms=4, label=f"{label}: certified gap")
                if last.get("gap") is not None and last["gap"] > 0:  # the final figure of the run
                    ax.annotate(f"{g[-1]:.6g}", (x[-1], g[-1]), textcoords="offset points", xytext=(5, 5),
                                fontsize=8, color=color, fontweight="bold")
        for key, style, suffix in (("gap_last", "--", "last iterate's gap"), ("gap_avg", ":", "averaged iterate's gap")):
            pts = _points(hist, key)
            if not pts:
                continue
            p, t, g = zip(*pts)
            for ax, x in zip(axes, (p, t)):
                ax.plot(x, g, style, color=color, lw=1.0, zorder=3, label=f"{label}: {suffix}")
        if last.get("gap") is not None and last["gap"] <= 0:
            notes.append(f"{label}: certified gap 0 (exact optimum)")
        elif not certified and not any(r.get("gap_last") is not None for r in hist):
            notes.append(f"{label}: no duality gap (the solver has no dual)")
    if gap_tol is not None and gap_tol > 0:
        for ax in axes:
            ax.axhline(gap_tol, color="0.35", ls="-.", lw=1.0, label=f"gap_tol = {gap_tol:g}")
    style_axes(axes, ("effective passes", "solver time (s)"), legend_size=None)
    for ax in axes:
        ax.margins(x=0.14)  # room for the final certified gap written beside the last point
    if axes[0].get_legend_handles_labels()[0]:
        axes[0].legend(fontsize=7)
    if compile_time:
        axes[1].set_xlabel(f"solver time (s); the one-off numba compilation before it took {compile_time:.1f} s")
    if notes:
        axes[0].text(0.02, 0.02, "\n".join(notes), transform=axes[0].transAxes, fontsize=8, va="bottom")
    if title:
        fig.suptitle(title)
    return fig
