"""Failures of the command line are one line with exit code 2 (130 for Ctrl-C, in any phase of the command), and say
what is there: a sharded set resumed without torchrun, a manifest with numbers beyond 64 bits or nested deep, a full
disk (the model still written when it fits), a saved counter that is NaN, a model file whose weights were changed."""
from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import random_chain_problem, shared_data
from torch_bcfw import FitResult, cli, fit
from torch_bcfw.io.tree_file import save_tree

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = "checkpoint.shards.json"


def _one_line_error(capsys, rc, expected_rc=2) -> str:
    err = capsys.readouterr().err.strip()
    assert rc == expected_rc and len(err.splitlines()) == 1 and err.startswith("torch-bcfw: "), (rc, err)
    return err


def _sharded_folder(tmp_path, manifest=True) -> Path:
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "config.yaml").write_text("data: {name: ocr}\nlam: 0.01\n")
    for r in range(2):
        (folder / f"checkpoint.rank{r}-of-2.w120.safetensors").write_bytes(b"member")
    if manifest:
        (folder / MANIFEST).write_text(json.dumps({"format": "torch_bcfw.shards/1", "world_size": 2, "work": 120}))
    return folder


@pytest.mark.parametrize("manifest", [True, False], ids=["committed", "manifest-missing"])
def test_a_sharded_set_resumed_without_torchrun_says_how_to_resume_it(tmp_path, capsys, manifest):
    folder = _sharded_folder(tmp_path, manifest)
    err = _one_line_error(capsys, cli.main(["fit", "--resume", str(folder)]))
    assert "sharded set" in err and "2 processes" in err and "after 120 block iterations" in err
    assert f"torchrun --nproc-per-node 2 -m torch_bcfw fit --resume {folder}" in err
    assert "nothing to resume" not in err


@pytest.mark.parametrize("text, message", [
    (json.dumps({"format": "torch_bcfw.shards/1", "world_size": 2, "work": 2**70}), r"in \[0, 2\^63\)"),
    (json.dumps({"format": "torch_bcfw.shards/1", "world_size": 2**64, "work": 1}), r"in \[0, 2\^63\)"),
    ("[" * 2000 + "]" * 2000, "nested too deeply"),
    ("[" * 100_000 + "]" * 100_000, "not a readable manifest"),
])
def test_a_manifest_beyond_64_bits_or_nested_deep_is_one_line(tmp_path, capsys, text, message):
    folder = _sharded_folder(tmp_path)
    (folder / MANIFEST).write_text(text)
    err = _one_line_error(capsys, cli.main(["fit", "--resume", str(folder)]))
    assert MANIFEST in err
    import re

    assert re.search(message, err), err


def test_a_nan_counter_is_refused_on_load_naming_it(tmp_path):
    model, data = random_chain_problem(n=4, seed=1)
    d = fit(model, data, 0.1, max_passes=1).to_dict()
    d["counters"]["work"] = float("nan")
    save_tree(d, tmp_path / "r.safetensors")
    with pytest.raises(ValueError, match=r"counters\['work'\] = nan must be a whole number >= 0"):
        FitResult.load(tmp_path / "r.safetensors")


def _ocr_cfg(limit=20) -> dict:
    return {"name": "ocr", "path": str(shared_data("ocr")), "split": "small", "fold": 0, "limit": limit}


def test_evaluate_names_a_model_file_whose_weights_were_changed(tmp_path, capsys):
    """The weights changed after the fit no longer give the file's primal value on the data it was fitted on: the
    file is blamed, not the training data."""
    import yaml

    from torch_bcfw.datasets.registry import load_problem

    cfg = {"data": _ocr_cfg(), "lam": 0.01}
    model, train, _ = load_problem(cfg["data"], progress=False)
    d = fit(model, train, 0.01, max_passes=1).to_dict(state=False)
    d["w"] = d["w"] * 1.5
    folder = tmp_path / "run"
    folder.mkdir()
    save_tree(d, folder / "model.safetensors")
    (folder / "config.yaml").write_text(yaml.safe_dump(cfg))
    err = _one_line_error(capsys, cli.main(["evaluate", "--model", str(folder / "model.safetensors")]))
    assert "its weights do not give its saved primal value on the data they were fitted on" in err
    assert "other training data" not in err


def _fit_args(out, passes=1, limit=20):
    cfg = _ocr_cfg(limit)
    return ["fit", "--config", str(ROOT / "configs" / "ocr.yaml"), *[a for k, v in cfg.items() if k != "name"
                                                                    for a in ("--set", f"data.{k}={v}")],
            "--set", f"options.max_passes={passes}", "--set", "options.gap_check=1", "--output", str(out), "--quiet"]


@pytest.mark.parametrize("phase", ["load_problem", "precompile", "plot_histories"])
def test_ctrl_c_in_each_phase_of_fit_exits_130_keeping_what_was_written(tmp_path, capsys, monkeypatch, phase):
    import torch_bcfw.cli as cli_module
    import torch_bcfw.compilation
    import torch_bcfw.datasets.registry
    import torch_bcfw.plotting

    module = {"load_problem": torch_bcfw.datasets.registry, "precompile": torch_bcfw.compilation,
              "plot_histories": torch_bcfw.plotting}[phase]

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(module, phase, interrupted)
    out = tmp_path / "run"
    out.mkdir()
    (out / "gap.png").write_bytes(b"the previous figure")
    rc = cli_module.main(_fit_args(out))
    err = _one_line_error(capsys, rc, 130)
    assert "interrupted (Ctrl-C)" in err
    assert (out / "gap.png").read_bytes() == b"the previous figure"
    if phase == "plot_histories":  # the model and checkpoint were written before the plot
        assert (out / "model.safetensors").is_file() and (out / "checkpoint.safetensors").is_file()


def test_ctrl_c_while_the_command_imports_exits_130(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "torch_bcfw", *_fit_args(tmp_path / "run")], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.3)  # inside the imports of torch and torch_bcfw
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert len(err.strip().splitlines()) == 1 and "interrupted (Ctrl-C)" in err, err


def _mounted_tmpfs(path: Path, size: str) -> bool:
    path.mkdir()
    if os.geteuid() != 0:
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True).returncode == 0


@pytest.mark.heavy
def test_a_full_disk_gives_one_line_and_still_writes_the_model(tmp_path):
    """The output folder on a small file system (a 3 MB tmpfs, filled until the model fits but the checkpoint does
    not; without root a file-size limit): one line, rc 2, and model.safetensors written."""
    disk = tmp_path / "disk"
    mounted = _mounted_tmpfs(disk, "3m")
    try:
        out = disk / "run"
        pre = ("import signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
               "import resource; resource.setrlimit(resource.RLIMIT_FSIZE, (300_000, 300_000))\n")
        if mounted:
            free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
            (disk / "filler").write_bytes(b"\0" * (free - 400_000))
            pre = ""
        code = pre + "from torch_bcfw.cli import main; sys.exit(main(sys.argv[1:]))" if pre else \
            "import sys; from torch_bcfw.cli import main; sys.exit(main(sys.argv[1:]))"
        proc = subprocess.run([sys.executable, "-c", code, *_fit_args(out, passes=2, limit=150),
                               "--checkpoint-every", "off"], cwd=ROOT, capture_output=True, text=True, timeout=600)
        err = proc.stderr.strip()
        assert proc.returncode == 2 and len(err.splitlines()) == 1, err
        assert "cannot write" in err and "checkpoint.safetensors" in err and "Traceback" not in err
        assert FitResult.load(out / "model.safetensors").weights is not None
        assert not list(out.glob(".*.tmp"))  # no temporary file left behind
    finally:
        if mounted:
            gc.collect()  # a loaded file's tensors map it: drop them before the unmount
            if subprocess.run(["umount", str(disk)], check=False).returncode:
                subprocess.run(["umount", "-l", str(disk)], check=False)
