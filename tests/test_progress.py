"""The "preparing features" bar of the slow data loaders: silent for a quick load, a line with the stage running
once the work takes longer than ``SHOW_AFTER_S``; the CoNLL loader drives it through every stage."""
from __future__ import annotations

import time

import pytest

from conftest import shared_data
from torch_bcfw.runtime import progress
from torch_bcfw.runtime.progress import StageBar


def test_a_quick_load_prints_nothing_and_a_slow_one_shows_the_running_stage(capsys, monkeypatch):
    with StageBar(["read", "features"]) as bar:
        bar.done("read")
        bar.done("features")
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(progress, "SHOW_AFTER_S", 0.05)
    with StageBar(["read", "features"]) as bar:
        time.sleep(0.1)
        bar.done("read")
        bar.done("features")
    err = capsys.readouterr().err
    assert "preparing features" in err and "1/2" in err and "features" in err.split("1/2")[1]


def test_stages_must_finish_in_order():
    with StageBar(["read", "features"], enabled=False) as bar:
        with pytest.raises(ValueError, match="'features' finished out of order; expected 'read'"):
            bar.done("features")
        bar.done("read")
        bar.done("features")
        with pytest.raises(ValueError, match="expected 'none"):
            bar.done("features")


def test_the_conll_loader_reports_every_stage(capsys, monkeypatch):
    from torch_bcfw.datasets.registry import load_problem

    monkeypatch.setattr(progress, "SHOW_AFTER_S", 0.0)
    load_problem({"name": "conll", "path": str(shared_data("conll2000")), "limit": 30, "test_limit": 10},
                 progress=True)
    err = capsys.readouterr().err
    assert "preparing features" in err and "4/4" in err
    load_problem({"name": "conll", "path": str(shared_data("conll2000")), "limit": 30, "test_limit": 10})
    assert capsys.readouterr().err == ""
