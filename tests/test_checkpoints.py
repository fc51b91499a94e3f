"""Checkpoints and resume: periodic atomic saves, SIGKILL at random times, SIGTERM handled like Ctrl-C,
and ``--resume`` finishing with exactly the result of an uninterrupted run."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from conftest import random_chain_problem, shared_data
from torch_bcfw import FitResult, fit
from torch_bcfw.checkpoint import Checkpoint, parse_interval
from torch_bcfw.io.serialization import atomic_write_stream, atomic_write_text
from torch_bcfw.io.tree_file import load_tree, save_tree
from torch_bcfw.solvers.callbacks import Callback

ROOT = Path(__file__).resolve().parents[1]


def _cli(*args, wait=True):
    cmd = [sys.executable, "-m", "torch_bcfw", *args]
    if wait:
        return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600)
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT)


def _config(tmp_path, max_passes=200, **options) -> Path:
    cfg = {"data": {"name": "ocr", "path": str(shared_data("ocr")), "split": "small", "fold": 0},
           "lam": 0.01, "solver": "bcfw", "options": {"max_passes": max_passes, "gap_check": 10, **options}}
    p = tmp_path / "cfg.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return p


def _same_run(a: FitResult, b: FitResult) -> None:
    assert torch.equal(a.w, b.w) and torch.equal(a.w_avg, b.w_avg)
    keys = ("passes", "primal", "dual", "gap_last", "primal_avg", "dual_avg", "gap", "train_loss", "test_loss")
    assert [[getattr(r, k) for k in keys] for r in a.history] == [[getattr(r, k) for k in keys] for r in b.history]
    assert a.stopped_by == b.stopped_by


def _wait_for(path: Path, proc, timeout=300.0) -> None:
    t0 = time.monotonic()
    while not path.exists():
        assert proc.poll() is None, f"the run ended before writing {path}: {proc.stderr.read()}"
        assert time.monotonic() - t0 < timeout
        time.sleep(0.02)


@pytest.mark.heavy
def test_sigkill_at_random_times_never_corrupts_and_resume_is_exact(tmp_path):
    cfg = _config(tmp_path)
    ref = _cli("fit", "--config", str(cfg), "--output", str(tmp_path / "ref"), "--quiet", "--checkpoint-every", "off")
    assert ref.returncode == 0, ref.stderr
    out = tmp_path / "killed"
    rng = random.Random(0)
    args = ["fit", "--config", str(cfg), "--output", str(out), "--quiet", "--checkpoint-every", "2p"]
    for attempt in range(3):
        proc = _cli(*args, wait=False)
        _wait_for(out / ("checkpoint.safetensors" if attempt == 0 else "config.yaml"), proc)
        time.sleep(rng.uniform(0.0, 0.6))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        # whatever the moment of the kill: the newest state on disk is complete and loads
        state = FitResult.load(out / "checkpoint.safetensors")
        assert state.history and state.gap is not None and state.has_state
        args = ["fit", "--resume", str(out), "--quiet", "--checkpoint-every", "2p"]
    done = _cli(*args)
    assert done.returncode == 0, done.stderr
    _same_run(FitResult.load(tmp_path / "ref" / "model.safetensors"), FitResult.load(out / "model.safetensors"))
    # the model file holds no dual state; the checkpoint the final one, the same as the uninterrupted run's
    assert not FitResult.load(out / "model.safetensors").has_state
    _same_run(FitResult.load(tmp_path / "ref" / "checkpoint.safetensors"), FitResult.load(out / "checkpoint.safetensors"))
    again = _cli(*args)  # nothing left to do
    assert again.returncode == 0 and "is finished" in again.stderr


@pytest.mark.heavy
def test_sigterm_is_handled_like_ctrl_c_and_the_run_resumes(tmp_path):
    cfg = _config(tmp_path)
    out = tmp_path / "run"
    proc = _cli("fit", "--config", str(cfg), "--output", str(out), "--quiet", "--checkpoint-every", "1p", wait=False)
    _wait_for(out / "checkpoint.safetensors", proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 143, err
    assert "interrupted by SIGTERM" in err and "--resume" in err
    cut = FitResult.load(out / "model.safetensors")
    assert cut.stopped_by == "interrupted" and cut.gap is not None and cut.passes < 200
    done = _cli("fit", "--resume", str(out), "--quiet")
    assert done.returncode == 0, done.stderr
    assert FitResult.load(out / "model.safetensors").passes == 200


def test_api_checkpoint_resumes_exactly_at_any_pass(tmp_path):
    model, data = random_chain_problem(n=12, seed=4)
    whole = fit(model, data, 0.05, max_passes=17, gap_check=4)

    class Keep(Callback):  # copy the checkpoint file as it was after some passes
        def __init__(self):
            self.chunk = 0

        def on_chunk(self, passes, seconds):
            self.chunk += 1
            src = tmp_path / "ck.pt"
            if src.exists():
                (tmp_path / f"at{self.chunk - 1}.pt").write_bytes(src.read_bytes())

    fit(model, data, 0.05, max_passes=17, gap_check=4, callbacks=[Keep()],
        checkpoint=Checkpoint(tmp_path / "ck.pt", every_passes=1))
    for k in (1, 4, 7, 13):
        part = FitResult.load(tmp_path / f"at{k}.pt")
        assert part.counters["work"] == k * len(data)
        _same_run(whole, fit(model, data, 0.05, max_passes=17 - k, gap_check=4, init=part))


def test_interrupted_save_keeps_the_previous_file(tmp_path):
    target = tmp_path / "m.safetensors"
    save_tree({"v": torch.arange(3)}, target)

    def boom(f):
        f.write(b"half a file")
        raise KeyboardInterrupt  # a kill in the middle of writing

    with pytest.raises(KeyboardInterrupt):
        atomic_write_stream(target, boom)
    assert torch.equal(load_tree(target)["v"], torch.arange(3))
    assert [p.name for p in tmp_path.iterdir()] == ["m.safetensors"]


@pytest.mark.parametrize("text,expected", [("60s", {"every_seconds": 60.0}), ("2m", {"every_seconds": 120.0}),
                                           ("5p", {"every_passes": 5.0}), ("0.5 passes", {"every_passes": 0.5}),
                                           ("off", {})])
def test_parse_interval(text, expected):
    assert parse_interval(text) == expected


@pytest.mark.parametrize("text", ["60", "-1s", "0p", "5 parsecs", ""])
def test_parse_interval_rejects(text):
    with pytest.raises(ValueError, match="checkpoint interval"):
        parse_interval(text)


def test_saved_files_get_the_permissions_open_would_give(tmp_path):
    """Atomic writes honour the umask (a run folder shared with a group stays readable) and keep the mode of a file
    they replace."""
    model, data = random_chain_problem(n=4, seed=2)
    res = fit(model, data, 0.1, max_passes=2, gap_check=2)
    old = os.umask(0o022)
    try:
        res.save(tmp_path / "model.safetensors")
        atomic_write_text(tmp_path / "config.yaml", "lam: 0.1\n")
        os.umask(0o027)
        save_tree({"a": 1}, tmp_path / "other.safetensors")
        (tmp_path / "config.yaml").chmod(0o600)
        atomic_write_text(tmp_path / "config.yaml", "lam: 0.2\n")
    finally:
        os.umask(old)
    mode = {p.name: p.stat().st_mode & 0o777 for p in tmp_path.iterdir()}
    assert mode == {"model.safetensors": 0o644, "config.yaml": 0o600, "other.safetensors": 0o640}


def test_unusable_save_paths_are_refused_up_front(tmp_path):
    """A checkpoint path that cannot be written fails when the Checkpoint is made, not at its first save; a folder
    given as the file to save to is named as such; ``init`` and ``checkpoint`` of the wrong type are refused."""
    model, data = random_chain_problem(n=4, seed=2)
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(NotADirectoryError, match="a_file is not a folder"):
        Checkpoint(tmp_path / "a_file" / "run" / "checkpoint.safetensors")
    with pytest.raises(IsADirectoryError, match="is a folder"):
        Checkpoint(tmp_path)
    res = fit(model, data, 0.1, max_passes=1, gap_check=1)
    with pytest.raises(IsADirectoryError, match="is a folder"):
        res.save(tmp_path)
    with pytest.raises(TypeError, match="init must be a FitResult"):
        fit(model, data, 0.1, max_passes=1, init=res.to_dict())
    with pytest.raises(TypeError, match="checkpoint must be"):
        fit(model, data, 0.1, max_passes=1, checkpoint=str(tmp_path / "c.pt"))
