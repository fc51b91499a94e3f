"""One run per output folder: a second ``torch-bcfw fit`` into a folder held by a live run refuses in one line naming
it (and deletes none of its files); a finished ``model.safetensors`` or the checkpoint of a killed run is replaced only
with ``--overwrite``, which swaps in a fresh folder when it finishes; a deleted lock file stops the first run before
it saves over the second; a full disk keeps the last complete file and says which."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import shared_data
from torch_bcfw import FitResult
from torch_bcfw.io.output_lock import LOCK_NAME, OutputFolderBusy, claim_output, overwrite_folder

ROOT = Path(__file__).resolve().parents[1]


def _fit(out, *extra, passes=2, popen=False, pre=""):
    """``torch-bcfw fit`` of OCR (60 words) into ``out``; ``pre``: Python run first in the process."""
    start = [sys.executable, "-c", pre + "\nimport sys; from torch_bcfw.cli import main; sys.exit(main(sys.argv[1:]))"]
    args = [*start, "fit", "--config", "configs/ocr.yaml", "--set",
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
    (tmp_path / "checkpoint.safetensors").write_bytes(b"state")
    with pytest.raises(FileExistsError, match="did not finish: pass --resume .* or --overwrite"):
        with claim_output(tmp_path):
            pass
    (tmp_path / "model.safetensors").write_bytes(b"x")
    with pytest.raises(FileExistsError, match="holds a finished run: pass --overwrite"):
        with claim_output(tmp_path):
            pass
    with claim_output(tmp_path, resume=True) as claim:
        assert claim.folder == tmp_path
        assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()


def test_overwrite_swaps_in_a_fresh_folder_only_when_the_block_ends(tmp_path):
    """An ``overwrite`` claim writes into the sibling folder: an exception removes it and leaves the old folder as it
    was; a block that ends swaps the two, and the old run's files are gone (no mix of two runs)."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"old model")
    (out / "history.csv").write_bytes(b"old history")
    with pytest.raises(RuntimeError, match="failed"):
        with claim_output(out, overwrite=True) as claim:
            assert claim.folder == overwrite_folder(out) and claim.folder.is_dir()
            (claim.folder / "model.safetensors").write_bytes(b"half")
            raise RuntimeError("failed")
    assert (out / "model.safetensors").read_bytes() == b"old model" and not overwrite_folder(out).exists()
    overwrite_folder(out).mkdir()  # what a killed run leaves: the next claim removes it
    (overwrite_folder(out) / "model.safetensors").write_bytes(b"killed")
    with claim_output(out, overwrite=True) as claim:
        assert not (claim.folder / "model.safetensors").exists()
        (claim.folder / "model.safetensors").write_bytes(b"new model")
    assert (out / "model.safetensors").read_bytes() == b"new model"
    assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME, "model.safetensors"]
    assert not overwrite_folder(out).exists()


def test_a_deleted_or_replaced_lock_file_fails_the_check(tmp_path):
    with claim_output(tmp_path) as claim:
        claim.check()
        (tmp_path / LOCK_NAME).unlink()
        with pytest.raises(OutputFolderBusy, match="was deleted or replaced while this run held"):
            claim.check()
        with claim_output(tmp_path) as second:  # a second run gets in through a new lock file
            second.check()
            with pytest.raises(OutputFolderBusy, match="another run may be writing there"):
                claim.check()


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


def _files(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.name != LOCK_NAME}


def _wait_for(path: Path, proc, timeout=120):
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)


@pytest.mark.heavy
def test_a_killed_run_is_continued_or_replaced_only_when_asked(tmp_path):
    """A run killed after its first checkpoint: a restart without a flag refuses in one line naming --resume and
    --overwrite and leaves the checkpoint as it was; --resume continues it."""
    out = tmp_path / "run"
    live = _fit(out, "--checkpoint-every", "1p", passes=100000, popen=True)
    _wait_for(out / "checkpoint.safetensors", live)
    live.kill()
    live.communicate()
    before = _files(out)
    again = _fit(out, passes=2)
    err = again.stderr.strip()
    assert again.returncode == 2 and len(err.splitlines()) == 1, err
    assert "did not finish: pass --resume" in err and "--overwrite" in err
    assert _files(out) == before
    resumed = subprocess.run([sys.executable, "-m", "torch_bcfw", "fit", "--resume", str(out), "--quiet", "--set",
                              f"options.max_passes={FitResult.load(out / 'checkpoint.safetensors').passes + 1:g}"],
                             cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert (out / "model.safetensors").is_file()


@pytest.mark.heavy
def test_a_killed_overwrite_leaves_the_old_run_whole(tmp_path):
    """--overwrite killed while it saves checkpoints: the old folder is byte for byte the old run; the next
    --overwrite removes the killed run's folder and replaces the old run as a whole when it finishes."""
    out = tmp_path / "run"
    assert _fit(out).returncode == 0
    before = _files(out)
    live = _fit(out, "--overwrite", "--checkpoint-every", "1p", passes=100000, popen=True)
    _wait_for(overwrite_folder(out) / "checkpoint.safetensors", live)
    live.kill()
    live.communicate()
    assert _files(out) == before
    third = _fit(out, "--overwrite", passes=3)
    assert third.returncode == 0, third.stderr
    assert not overwrite_folder(out).exists()
    assert json.loads((out / "history.json").read_text())["history"][-1]["passes"] == 3.0
    assert FitResult.load(out / "model.safetensors").passes == 3.0
    assert sorted(_files(out)) == sorted(before)


@pytest.mark.heavy
def test_a_deleted_lock_file_does_not_let_the_first_run_replace_the_second(tmp_path):
    """The lock file deleted under a live run (no periodic saves): a second run gets in and finishes; the first,
    stopped by Ctrl-C, refuses to save in one line and the second run's files stay."""
    out = tmp_path / "run"
    first = _fit(out, "--checkpoint-every", "off", passes=100000, popen=True)
    _wait_for(out / "config.yaml", first)
    (out / LOCK_NAME).unlink()
    second = _fit(out, passes=2)
    assert second.returncode == 0, second.stderr
    assert first.poll() is None
    finished = _files(out)
    first.send_signal(signal.SIGINT)
    _, err = first.communicate(timeout=120)
    assert first.returncode == 2 and len(err.strip().splitlines()) == 1, err
    assert "was deleted or replaced while this run held" in err
    assert _files(out) == finished


@pytest.mark.heavy
def test_a_full_disk_keeps_the_last_checkpoint_and_says_so(tmp_path):
    """Saves beyond a file-size limit (RLIMIT_FSIZE, SIGXFSZ ignored: writes fail with EFBIG) in a resumed run: its
    first checkpoint fails, and the run stops in one line naming the checkpoint it kept and its pass; the file is
    unchanged and no temporary file is left.  With --overwrite the folder keeps the run it held."""
    out = tmp_path / "run"
    assert _fit(out).returncode == 0
    before = _files(out)
    size = (out / "checkpoint.safetensors").stat().st_size
    limit = ("import signal, resource; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
             f"resource.setrlimit(resource.RLIMIT_FSIZE, ({size // 2}, {size // 2}))")
    resumed = subprocess.run([sys.executable, "-c", limit + "\nimport sys; from torch_bcfw.cli import main; "
                              "sys.exit(main(sys.argv[1:]))", "fit", "--resume", str(out), "--quiet",
                              "--checkpoint-every", "1p", "--set", "options.max_passes=4"],
                             cwd=ROOT, capture_output=True, text=True, timeout=300)
    err = resumed.stderr.strip()
    assert resumed.returncode == 2 and len(err.splitlines()) == 1, err
    assert err == (f"torch-bcfw: error: disk full: cannot write {out / 'checkpoint.safetensors'} (File too large); "
                   f"kept {out / 'checkpoint.safetensors'} from pass 2"), err
    assert _files(out) == before and not list(out.glob(".*.tmp"))
    replaced = _fit(out, "--overwrite", pre=limit)
    err = replaced.stderr.strip()
    assert replaced.returncode == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("torch-bcfw: error: disk full: cannot write ") and f"{out} keeps the run it held" in err
    assert _files(out) == before and not overwrite_folder(out).exists()
