"""One rank of the sharded-BCFW tests (tests/test_distributed_fit.py runs it): ``torch_bcfw.fit`` inside a gloo
process group, every rank passing the full dataset.

``python distributed_fit_worker.py SCENARIO OUT_DIR PROBLEM`` under torchrun (or with torchrun's variables set);
writes ``OUT_DIR/<scenario>_<problem>_rank<r>.json``.  Scenarios:

* ``fit`` -- a mini-batch run (batch_size 4, checkpoints every 5 passes; ``chain-gap-cache``: gap sampling and
  the cache): weights, history and this rank's dual
  state (its blocks' ``l_i`` and ``w_i`` sum) for the independent checks of the test.
* ``resume`` -- 6 passes then 6 more from each rank's checkpoint, against 12 passes in one run.
* ``kill`` -- rank 1 dies after its second chunk; rank 0 records the error and how long it took to raise.
"""
from __future__ import annotations

import json
import os
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from conftest import random_chain_problem, random_multiclass_problem  # noqa: E402
from torch_bcfw import FitResult, fit  # noqa: E402
from torch_bcfw.checkpoint import Checkpoint, manifest_path, shard_path
from torch_bcfw.distributed import DistributedError, init_from_env  # noqa: E402
from torch_bcfw.solvers.callbacks import Callback  # noqa: E402

LAM = 0.1
OPTIONS = {"batch_size": 4, "gap_check": 5, "seed": 3, "strategy": "shard"}
#: a replicated run: plain BCFW on every rank
REPLICATE = {"gap_check": 5, "seed": 3, "strategy": "replicate"}
#: a replicated run whose rounds' oracle calls are split over the ranks
SPLIT = {"gap_check": 2, "seed": 3, "strategy": "split-oracle", "batch_size": 3}


#: options beyond OPTIONS per problem name (``chain-gap-cache``: the chain problem, gap sampling and the cache)
EXTRA = {"chain-gap-cache": {"sampling": "gap", "cache": True}}


def options(name: str) -> dict:
    return OPTIONS | EXTRA.get(name, {})


def problem(name: str):
    if name.startswith("chain"):
        return random_chain_problem(n=13, F=3, K=3, max_len=4, seed=5)
    return random_multiclass_problem(n=15, F=4, K=4, seed=2)


def _record(res: FitResult) -> dict:
    st = res.solver_state["state"]
    return {"w": res.w.tolist(), "w_avg": res.w_avg.tolist(), "history": [r.to_dict() for r in res.history],
            "ell_local": float(st["block_ell"].sum()), "n_local": int(st["n"]), "n_total": int(st["n_total"]),
            "stopped_by": res.stopped_by}


class DieAfter(Callback):
    """Kill this process (no cleanup, like a crash) after ``chunks`` chunks."""

    def __init__(self, chunks: int):
        self.chunks = chunks

    def on_chunk(self, passes: float, elapsed: float) -> None:
        self.chunks -= 1
        if self.chunks == 0:
            os._exit(1)


def main() -> None:
    scenario, out_dir, name = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    torch.set_num_threads(1)
    ctx = init_from_env(timeout_s=30.0)
    model, data = problem(name)
    if scenario == "fit":
        ck = Checkpoint(out_dir / f"{name}.pt", every_passes=5, every_seconds=None)
        res = fit(model, data, LAM, max_passes=40, checkpoint=ck, **options(name))
        members = sorted(str(p) for p in out_dir.glob(f"{name}.rank{ctx.rank}-of-2.w*.pt"))
        out = _record(res) | {"checkpoint": str(shard_path(ck.path, ctx.rank, ctx.world_size, res.counters["work"])),
                              "members": members, "manifest": json.loads(manifest_path(ck.path).read_text())}
    elif scenario == "resume":
        ck = Checkpoint(out_dir / f"resume_{name}.pt", every_passes=3, every_seconds=None)
        fit(model, data, LAM, max_passes=6, checkpoint=ck, **options(name))
        first = FitResult.load_sharded(ck.path)
        cont = fit(model, data, LAM, max_passes=6, init=first, **options(name))
        whole = fit(model, data, LAM, max_passes=12, **options(name))
        out = {"resumed": _record(cont), "whole": _record(whole)}
        try:  # another rank's file: refused
            other = shard_path(ck.path, 1 - ctx.rank, 2, first.counters["work"])
            fit(model, data, LAM, max_passes=1, init=FitResult.load(other),
                **options(name))
            out["wrong_rank_error"] = None
        except ValueError as exc:
            out["wrong_rank_error"] = str(exc)
    elif scenario == "replicate":
        ck = Checkpoint(out_dir / f"rep_{name}.pt", every_passes=3, every_seconds=None)
        res = fit(model, data, LAM, max_passes=6, checkpoint=ck, **REPLICATE)
        auto = fit(model, data, LAM, max_passes=2, gap_check=2, seed=3)
        forced = fit(model, data, LAM, max_passes=2, gap_check=2, seed=3, strategy="shard", batch_size=4)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fit(model, data, LAM, max_passes=1, gap_check=1, seed=3, strategy="shard", batch_size=1)
        ck = Checkpoint(out_dir / f"split_{name}.pt", every_passes=2, every_seconds=None)
        split = fit(model, data, LAM, max_passes=4, checkpoint=ck, **SPLIT)
        calib = {k: v for k, v in auto.counters.items() if k.startswith("calibration_")}
        out = _record(res) | {"split": _record(split), "split_strategy": split.options.strategy,"strategy": res.options.strategy, "auto": auto.options.strategy, "calibration": calib,
                              "forced": forced.options.strategy, "forced_n_local": int(forced.solver_state["state"]["n"]),
                              "files": sorted(p.name for p in out_dir.glob(f"rep_{name}*")),
                              "warnings": [str(w.message) for w in caught if "slower per pass" in str(w.message)]}
    else:  # kill
        cbs = [DieAfter(2)] if ctx.rank == 1 else []
        t0 = time.monotonic()
        try:
            fit(model, data, LAM, max_passes=1000, callbacks=cbs, **OPTIONS)
            out = {"error": None}
        except DistributedError as exc:
            out = {"error": str(exc)}
        out["seconds"] = time.monotonic() - t0
        (out_dir / f"{scenario}_{name}_rank{ctx.rank}.json").write_text(json.dumps(out))
        os._exit(0)  # the group is broken: no teardown
    (out_dir / f"{scenario}_{name}_rank{ctx.rank}.json").write_text(json.dumps(out))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
