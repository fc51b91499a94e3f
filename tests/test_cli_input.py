"""Bad command-line input gives one ``torch-bcfw: error:`` line before any work, never a traceback.  The command runs
in this process (``torch_bcfw.cli.main``, what ``python -m torch_bcfw`` runs; ``tests/test_cli.py`` runs the real
entry point in subprocesses)."""
from __future__ import annotations

import contextlib
import io
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import DATA_ROOT, shared_data
from torch_bcfw.cli import main

ROOT = Path(__file__).resolve().parents[1]


def _cli(*args) -> subprocess.CompletedProcess:
    """``torch-bcfw ARGS`` in this process, from the repository root: its exit code, stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.chdir(ROOT), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse's own errors
            code = exc.code if isinstance(exc.code, int) else 1
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def _config(tmp_path, **changes) -> Path:
    cfg = {"data": {"name": "ocr", "path": str(shared_data("ocr")), "split": "small", "fold": 0, "limit": 20},
           "lam": 0.01, "options": {"max_passes": 2}, "output": str(tmp_path / "out")}
    for k, v in changes.items():
        cfg[k] = v
    p = tmp_path / "cfg.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return p


def _one_line_error(proc, *fragments):
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("torch-bcfw: error:"), proc.stderr
    for f in fragments:
        assert f in lines[0], lines[0]


def test_output_that_is_a_file_is_refused_before_training(tmp_path):
    (tmp_path / "taken").write_text("x")
    proc = _cli("fit", "--config", str(_config(tmp_path)), "--output", str(tmp_path / "taken"))
    _one_line_error(proc, "exists and is not a folder")
    assert (tmp_path / "taken").read_text() == "x"


def test_unwritable_output_is_refused(tmp_path):
    proc = _cli("fit", "--config", str(_config(tmp_path)), "--output", "/proc/torch_bcfw_out")
    _one_line_error(proc, "cannot write to the output folder")


def test_malformed_yaml_names_file_and_line(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("data:\n  name: ocr\nlam: [0.01\noptions: {}\n")
    proc = _cli("fit", "--config", str(p))
    _one_line_error(proc, str(p), "line ", "malformed YAML")


def test_malformed_set_value(tmp_path):
    proc = _cli("fit", "--config", str(_config(tmp_path)), "--set", "options.max_passes=[1")
    _one_line_error(proc, "--set options.max_passes=[1", "malformed YAML")


def test_a_set_option_typo_is_answered_with_the_closest_name(tmp_path):
    proc = _cli("fit", "--config", str(_config(tmp_path)), "--set", "options.cache_sise=5")
    _one_line_error(proc, "unknown solver option(s) ['cache_sise']; did you mean 'cache_size'?")


@pytest.mark.parametrize("section,value,fragment", [
    ("data", {"name": "ocr", "path": str(DATA_ROOT / "ocr"), "spilt": "small"}, "unknown data key(s) ['spilt']"),
    ("data", {"name": "ocr", "path": str(DATA_ROOT / "ocr"), "fold": 0.5}, "data.fold must be an integer"),
    ("data", {"name": "ocr", "path": "x", "download": "no"}, "data.download must be true or false"),
    ("options", {"max_pases": 3}, "unknown solver option(s) ['max_pases']; did you mean 'max_passes'?"),
    ("solver", "bcfv", "unknown solver 'bcfv'"),
    ("lam", -1, "lam must be a finite number > 0"),
    ("extra", 1, "unknown config section(s) ['extra']"),
])
def test_bad_config_entries_fail_before_the_data_is_loaded(tmp_path, section, value, fragment):
    proc = _cli("fit", "--config", str(_config(tmp_path, **{section: value})))
    _one_line_error(proc, fragment)
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_evaluate_without_config_explains_what_it_needs(tmp_path):
    fitted = _cli("fit", "--config", str(_config(tmp_path)), "--quiet")
    assert fitted.returncode == 0, fitted.stderr
    moved = tmp_path / "elsewhere.pt"
    moved.write_bytes((tmp_path / "out" / "model.safetensors").read_bytes())
    _one_line_error(_cli("evaluate", "--model", str(moved)), "evaluate needs the data", "--config")
    beside = _cli("evaluate", "--model", str(tmp_path / "out" / "model.safetensors"))  # config.yaml beside the model
    assert beside.returncode == 0 and "test_error" in beside.stdout, beside.stderr


def test_resume_errors(tmp_path):
    _one_line_error(_cli("fit", "--resume", str(tmp_path)), "no config.yaml there")
    _one_line_error(_cli("fit"), "fit needs --config FILE")
    _one_line_error(_cli("fit", "--config", str(_config(tmp_path)), "--checkpoint-every", "60"),
                    "bad checkpoint interval")


def test_resume_with_nothing_saved_is_refused_before_the_data_is_read(tmp_path):
    """A folder with its config but no checkpoint or model: refused at once, not after loading the data (the
    config's data path does not exist, so reading it would fail with another message)."""
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "config.yaml").write_text(yaml.safe_dump(
        {"data": {"name": "ocr", "path": str(tmp_path / "absent")}, "lam": 0.01, "options": {"max_passes": 2}}))
    _one_line_error(_cli("fit", "--resume", str(folder)), "nothing to resume there")


def test_a_deeply_nested_config_and_a_missing_device_are_one_line_errors(tmp_path):
    deep = tmp_path / "deep.yaml"
    deep.write_text("a: " + "[" * 20000 + "]" * 20000 + "\n")
    _one_line_error(_cli("fit", "--config", str(deep)), "nested too deeply")
    if not __import__("torch").cuda.is_available():
        _one_line_error(_cli("fit", "--config", str(_config(tmp_path)), "--set", "data.device=cuda"),
                        "CUDA is not available")
    _one_line_error(_cli("fit", "--config", str(_config(tmp_path)), "--set", "data.device=tpu"),
                    "data.device must be 'cpu', 'cuda' or 'cuda:N'")


def test_exponent_floats_are_numbers_and_integral_floats_say_how_to_write_an_integer(tmp_path):
    """``lam: 1e-3`` (a string under YAML 1.1) is a number, in a file and in --set; ``gap_check: 1e1`` where an
    integer is expected is refused with the integer to write."""
    from torch_bcfw.cli import load_config

    cfg = tmp_path / "c.yaml"
    cfg.write_text("lam: 1e-3\noptions: {max_passes: 2E0, gap_tol: 5e-2, gap_check: 1}\nname: 1e3x\n")
    loaded = load_config(cfg, ["options.time_budget=1e2"])
    assert loaded["lam"] == 0.001 and loaded["options"] == {"max_passes": 2.0, "gap_tol": 0.05, "gap_check": 1,
                                                           "time_budget": 100.0}
    assert loaded["name"] == "1e3x"
    out = tmp_path / "out"
    p = _cli("fit", "--config", str(_config(tmp_path)), "--set", "lam=1e-3", "--output", str(out), "--quiet")
    assert p.returncode == 0, p.stderr
    _one_line_error(_cli("fit", "--config", str(_config(tmp_path)), "--set", "options.gap_check=1e1"),
                    "gap_check must be an integer >= 1, got the float 10.0: write it as 10")


def test_version_is_printed():
    from torch_bcfw import __version__

    p = _cli("--version")
    assert p.returncode == 0 and p.stdout.strip() == f"torch-bcfw {__version__}"


def test_data_paths_resolve_beside_the_config_and_a_missing_one_names_both_places(tmp_path, monkeypatch):
    """A relative ``data.path`` not found from the working directory is taken relative to the config file (and saved
    that way, so ``--resume`` works from anywhere); found nowhere, the error names both places."""
    import shutil

    from torch_bcfw.cli import load_config

    project = tmp_path / "project"
    (project / "configs").mkdir(parents=True)
    shutil.copytree(shared_data("ocr"), project / "data" / "ocr")
    cfg = project / "configs" / "ocr.yaml"
    cfg.write_text("data: {name: ocr, path: ../data/ocr, split: small, fold: 0, limit: 20}\nlam: 0.1\n"
                   f"options: {{max_passes: 2}}\noutput: {tmp_path / 'out'}\n")
    monkeypatch.chdir(tmp_path)  # ../data/ocr does not exist from here
    assert load_config(cfg)["data"]["path"] == str((project / "data" / "ocr").resolve())
    out = tmp_path / "out"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["fit", "--config", str(cfg), "--quiet"]) == 0
    assert yaml.safe_load((out / "config.yaml").read_text())["data"]["path"] == str((project / "data" / "ocr").resolve())
    monkeypatch.chdir(project / "configs")  # found from the working directory: kept as written
    assert load_config("ocr.yaml")["data"]["path"] == "../data/ocr"
    monkeypatch.chdir(tmp_path)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["fit", "--config", str(cfg), "--set", "data.path=../nowhere", "--quiet"])
    assert code == 2
    assert f"looked at {tmp_path.parent / 'nowhere'} (relative to the working directory) and " \
           f"{project / 'nowhere'} (relative to the config {cfg})" in err.getvalue()


def test_evaluate_refuses_to_change_the_fitted_data_with_set(tmp_path):
    """``evaluate --set data.split=...`` on a fit's output folder would swap the training and test parts under the
    saved model (and its certificate): refused, naming the entry; other overrides still work."""
    out = tmp_path / "out"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["fit", "--config", str(_config(tmp_path)), "--quiet"]) == 0
    _one_line_error(_cli("evaluate", "--model", str(out / "model.safetensors"), "--set", "data.split=large"),
                    "--set changes the data the model was fitted on (data.split)", "pass --config FILE")
    p = _cli("evaluate", "--model", str(out / "model.safetensors"), "--set", "lam=0.5")
    assert p.returncode == 0 and "train_error" in p.stdout, p.stderr


def test_the_bar_and_the_table_count_the_passes_max_passes_counts(tmp_path):
    """With the cache, some block steps need no oracle call: the bar and the table count block steps / n (what
    max_passes counts) and name the oracle's own count apart; without it the table has the one row."""
    out = tmp_path / "out"
    p = _cli("fit", "--config", str(_config(tmp_path)), "--set", "options.preset=gap-pairwise-cache",
             "--set", "options.max_passes=4", "--set", "options.gap_check=2", "--output", str(out))
    assert p.returncode == 0, p.stderr
    assert "4/4 passes" in p.stderr.replace("4.0/4", "4/4") and "oracle passes=" in p.stderr
    rows = dict(line.strip("| ").split("|")[:2] for line in p.stdout.splitlines() if line.startswith("| "))
    rows = {k.strip(): v.strip() for k, v in rows.items()}
    assert rows["passes (block steps / n)"] == "4" and float(rows["oracle calls / n"]) < 4
    plain = _cli("fit", "--config", str(_config(tmp_path)), "--output", str(tmp_path / "plain"), "--quiet")
    assert "passes (block steps / n)" in plain.stdout and "oracle calls / n" not in plain.stdout
