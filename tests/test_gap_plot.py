"""gap.png (torch_bcfw.plotting.plot_histories): the certified gap the run reports, the iterates' gaps, gap_tol."""
import warnings

import pytest

from conftest import random_chain_problem
from torch_bcfw import fit
from torch_bcfw.cli import _fmt
from torch_bcfw.plotting import histories_figure, plot_histories, pyplot
from torch_bcfw.solvers.record import plain_history


def _lines(ax):
    return {line.get_label(): line for line in ax.get_lines()}


def test_the_certified_gap_of_the_run_is_drawn_and_its_final_value_written():
    model, data = random_chain_problem(n=10, seed=2)
    res = fit(model, data, 0.05, max_passes=8, gap_check=2, gap_tol=1e-9)
    fig = histories_figure({"run": plain_history(res.history)}, title="t", gap_tol=0.01)
    try:
        for ax, xkey in zip(fig.axes, ("passes", "solver_time")):
            lines = _lines(ax)
            cert = lines["run: certified gap"]
            assert list(cert.get_ydata()) == [r.gap for r in res.history]
            assert list(lines["run: last iterate's gap"].get_ydata()) == [r.gap_last for r in res.history]
            assert list(lines["run: averaged iterate's gap"].get_ydata()) == [r.gap_avg for r in res.history]
            assert list(lines["gap_tol = 0.01"].get_ydata()) == [0.01, 0.01]
            # the final table's "duality gap (certified)" appears on the plot, beside the last point
            (note,) = ax.texts
            assert note.get_text() == _fmt(res.gap)
            assert tuple(note.xy) == (getattr(res.history[-1], xkey), res.gap)
        assert fig.axes[1].get_xlabel() == "solver time (s)"
    finally:
        pyplot().close(fig)


def test_compile_time_is_named_on_the_time_axis_and_no_gap_cases_draw():
    model, data = random_chain_problem(n=6, seed=1)
    res = fit(model, data, 0.05, max_passes=2, gap_check=1)
    fig = histories_figure({"run": plain_history(res.history)}, compile_time=6.04)
    try:
        assert "6.0 s" in fig.axes[1].get_xlabel() and "compilation" in fig.axes[1].get_xlabel()
    finally:
        pyplot().close(fig)
    ssg_like = [{"passes": 1.0, "solver_time": 0.1, "primal": 1.0, "gap_last": None, "gap": None}]
    done = [{"passes": 1.0, "solver_time": 0.1, "gap_last": 0.0, "gap_avg": 0.0, "gap": 0.0}]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. no "No artists with labels found to put in legend"
        fig = histories_figure({"ssg": ssg_like, "exact": done})
    try:
        notes = " ".join(t.get_text() for t in fig.axes[0].texts)
        assert "ssg: no duality gap" in notes and "exact: certified gap 0" in notes
    finally:
        pyplot().close(fig)


def test_plot_histories_writes_a_png(tmp_path):
    model, data = random_chain_problem(n=6, seed=1)
    res = fit(model, data, 0.05, max_passes=2, gap_check=1)
    path = plot_histories({"a": plain_history(res.history)}, tmp_path / "sub" / "gap.png", title="x", gap_tol=0.5, compile_time=1.0)
    assert path.read_bytes()[:4] == b"\x89PNG"
    assert not any(pytest.importorskip("matplotlib.pyplot").get_fignums())  # closed
