"""The README's test command (the fast tier) in one process and in two (pytest-xdist ``-n 2``): wall time under the
machine's present load, and the CPU seconds of every test process, which do not depend on the load.

On a shared machine the wall time says little; the CPU seconds say what the run costs.  A test process runs its
tests one after another, so on idle cores its wall time is about its CPU seconds (``OMP_NUM_THREADS=1``: one thread
per process): the estimate of the idle wall time is the largest CPU time of one test process (the collection and the
imports included), plus the start of the workers.

    python benchmarks/test_speed.py            # both runs, a table, benchmarks/results/test_speed.json

This file is also the pytest plugin that records the CPU seconds (``-p test_speed``).
"""
from __future__ import annotations

import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "test_speed.json"
ENV_OUT = "TEST_SPEED_OUT"

# ------------------------------------------------------------------------------------------- the plugin
_rows: list[tuple[str, float, float]] = []
_TEST_START: dict[str, tuple[float, float]] = {}


def _cpu_seconds() -> float:
    """User + system CPU seconds of this process and of the children it waited for."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def pytest_runtest_logstart(nodeid, location):  # noqa: ARG001 - pytest's hook signature
    _TEST_START[nodeid] = (_cpu_seconds(), time.perf_counter())


def pytest_runtest_logfinish(nodeid, location):  # noqa: ARG001
    cpu0, wall0 = _TEST_START.pop(nodeid, (None, None))
    if cpu0 is not None:
        _rows.append((nodeid, _cpu_seconds() - cpu0, time.perf_counter() - wall0))


def pytest_sessionfinish(session, exitstatus):  # noqa: ARG001
    out = os.environ.get(ENV_OUT)
    if out:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        own = resource.getrusage(resource.RUSAGE_SELF)
        Path(f"{out}.{worker}.json").write_text(json.dumps({
            "worker": worker, "process_cpu_s": own.ru_utime + own.ru_stime, "with_children_cpu_s": _cpu_seconds(),
            "tests": [{"id": n, "cpu_s": round(c, 3), "wall_s": round(w, 3)} for n, c, w in _rows]}))


# ------------------------------------------------------------------------------------------- the runs
def _run(workers: int, tmp: Path) -> dict:
    """One run of the fast tier with ``-n workers``: wall time, load, CPU per process, the costliest tests."""
    prefix = tmp / f"n{workers}"
    env = dict(os.environ, OMP_NUM_THREADS="1", **{ENV_OUT: str(prefix)},
               PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH", "")]))
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "test_speed",
                           "-n", str(workers)], cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    load1 = os.getloadavg()
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-500:]
    parts = [json.loads(p.read_text()) for p in sorted(tmp.glob(f"n{workers}.*.json"))]
    testers = [p for p in parts if p["worker"] != "main"] or parts  # with -n 0 the main process runs the tests
    tests = [t for p in testers for t in p["tests"]]
    per_process = [round(p["with_children_cpu_s"], 1) for p in testers]  # a CLI subprocess is waited for
    return {
        "workers": workers, "exit_code": proc.returncode, "summary": summary, "wall_s_under_load": round(wall, 1),
        "load_average_1min_start_end": [round(load0[0], 2), round(load1[0], 2)],
        "tests": len(tests), "test_cpu_s_sum": round(sum(t["cpu_s"] for t in tests), 1),
        "cpu_s_per_test_process": per_process, "estimated_idle_wall_s": round(max(per_process), 1),
        "costliest_tests_cpu_s": sorted(((t["cpu_s"], t["id"]) for t in tests), reverse=True)[:15],
    }


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        runs = [_run(n, Path(tmp)) for n in (0, 2)]
    print("| runner | tests | CPU s of the tests | CPU s per test process | idle wall estimate s | wall s (load) |")
    print("|---|---|---|---|---|---|")
    for r in runs:
        load = "-".join(f"{x:g}" for x in r["load_average_1min_start_end"])
        print(f"| -n {r['workers']} | {r['tests']} | {r['test_cpu_s_sum']} | {r['cpu_s_per_test_process']} | "
              f"{r['estimated_idle_wall_s']} | {r['wall_s_under_load']} (load {load}) |")
    result = {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": f"{platform.node()}, {os.cpu_count()} CPUs",
              "command": "python benchmarks/test_speed.py", "python": platform.python_version(), "runs": runs}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=1))
    print(f"wrote {OUT.relative_to(ROOT)}")
    if any(r["exit_code"] != 0 for r in runs):
        sys.exit(f"a run failed: {[r['summary'] for r in runs]}")


if __name__ == "__main__":
    main()
