"""One run per output folder: a second ``torch-bcfw fit`` into a folder held by a live run refuses in one line naming
it (and deletes none of its files); a finished ``model.safetensors`` is replaced only with ``--overwrite``."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import shared_data
from torch_bcfw.io.output_lock import LOCK_NAME, OutputFolderBusy, claim_output

ROOT = Path(__file__).resolve().parents[1]


def _fit(out, *extra, passes=2, popen=False):
    args = [sys.executable, "-m", "torch_bcfw", "fit", "--config", "configs/ocr.yaml", "--set",
            f"data.path={shared_data('ocr')}", "--set", "data.limit=60", "--set", f"options.max_passes={passes}",
            "--set", "options.gap_check=1", "--set", "options.gap_tol=0", "--output", str(out), "--quiet", *extra]
    if popen:
        return subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_a_second_claim_names_the_live_owner(tmp_path):
    """In-process: the lock refuses a second holder (a real second process is the heavy test below), a finished
    model.safetensors needs ``overwrite`` (or ``resume``), and the folder is free again once the first claim ends."""
    holder = subprocess.Popen([sys.executable, "-c", (  # a second process holding the lock as claim_output does
        "import fcntl, json, os, sys, time\n"
        f"fd = os.open(sys.argv[1] + '/{LOCK_NAME}', os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "os.write(fd, json.dumps({'pid': os.getpid(), 'host': 'h', 'start': 'then'}).encode())\n"
        "print('held', flush=True)\ntime.sleep(60)"), str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(OutputFolderBusy, match=rf"in use by a live run \(pid {holder.pid} on h, started then\)"):
            with claim_output(tmp_path):
                pass
    finally:
        holder.kill()
        holder.wait()
    (tmp_path / "model.safetensors").write_bytes(b"x")
    with pytest.raises(FileExistsError, match="holds a finished run: pass --overwrite"):
        with claim_output(tmp_path):
            pass
    with claim_output(tmp_path, overwrite=True):
        assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
    with claim_output(tmp_path, resume=True):
        pass


@pytest.mark.heavy
def test_two_complete_runs_into_one_folder(tmp_path):
    out = tmp_path / "run"
    first = _fit(out)
    assert first.returncode == 0, first.stderr
    before = (out / "model.safetensors").read_bytes()
    second = _fit(out, passes=3)
    assert second.returncode == 2 and len(second.stderr.strip().splitlines()) == 1, second.stderr
    assert "model.safetensors holds a finished run: pass --overwrite" in second.stderr
    assert (out / "model.safetensors").read_bytes() == before
    third = _fit(out, "--overwrite", passes=3)
    assert third.returncode == 0, third.stderr
    assert json.loads((out / "history.json").read_text())["history"][-1]["passes"] == 3.0


@pytest.mark.heavy
def test_a_concurrent_start_refuses_and_leaves_the_live_run_alone(tmp_path):
    """A second process started while the first runs (and saves its checkpoint every pass) into the same folder: one
    line naming the first's pid, rc 2, and the first run still finishes with its model."""
    out = tmp_path / "run"
    live = _fit(out, "--checkpoint-every", "1p", passes=400, popen=True)
    try:
        deadline = time.monotonic() + 120
        while not (out / "checkpoint.safetensors").exists():  # the live run is saving
            assert live.poll() is None and time.monotonic() < deadline, live.communicate()
            time.sleep(0.2)
        second = _fit(out, passes=2)
        assert second.returncode == 2, second.stderr
        assert len(second.stderr.strip().splitlines()) == 1 and f"in use by a live run (pid {live.pid} " in second.stderr
        assert live.poll() is None  # its temporary files were not deleted under it
    finally:
        live.send_signal(2)  # Ctrl-C: it saves and exits 130
        _, err = live.communicate(timeout=120)
    assert live.returncode == 130, err
    assert (out / "model.safetensors").is_file() and (out / "checkpoint.safetensors").is_file()
