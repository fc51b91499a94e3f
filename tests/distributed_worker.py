"""One rank of the multi-process tests of torch_bcfw.distributed (tests/test_distributed_layer.py runs it).

``python distributed_worker.py SCENARIO OUT_DIR`` under torchrun (or with RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT set); writes ``OUT_DIR/<scenario>_rank<r>.json``.  Scenarios:

* ``suite`` -- context, sharding of real containers, the packed all-reduce, broadcast and the replicated check,
  the global certificate against ``certify`` on the full data, and mismatched datasets (every rank must raise).
* ``dead`` -- rank 1 dies (``os._exit(1)``) before a collective; rank 0 records the error and how long it took.
* ``stalled`` -- rank 1 stays alive but never reaches the collective; rank 0 must raise after the timeout.
* ``certify`` -- the global certificate only (the two-node rendezvous test).
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from conftest import random_chain_problem, random_multiclass_problem  # noqa: E402
from torch_bcfw.distributed import (  # noqa: E402
    DistributedError, all_reduce_packed, all_reduce_sum, assert_replicated, broadcast_from_rank0, current_context,
    gather_shards, global_certify, init_from_env, shard)
from torch_bcfw.certificate import certify  # noqa: E402

LAM = 0.1


def _same(a, b) -> bool:
    """Whether two containers hold the same tensors (every public attribute, recursively)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b))
    if hasattr(a, "__dict__") and not isinstance(a, (int, float, str)):
        ka = sorted(k for k in vars(a) if not k.startswith("_"))
        return type(a) is type(b) and ka == sorted(k for k in vars(b) if not k.startswith("_")) and all(
            _same(getattr(a, k), getattr(b, k)) for k in ka)
    return a == b


def certificate_problem():
    """A Chain problem, a non-zero ``w`` and per-example ``ell_i`` (the same on every rank)."""
    model, data = random_chain_problem(n=11, F=3, K=3, max_len=4, seed=3)
    g = torch.Generator().manual_seed(7)
    w = torch.randn(model.n_features, generator=g, dtype=torch.float64)
    ell_i = torch.rand(len(data), generator=g, dtype=torch.float64) / len(data)
    return model, data, w, ell_i


def run_certify(ctx) -> dict:
    model, data, w, ell_i = certificate_problem()
    part = shard(data, ctx)
    cert = global_certify(model, part.data, w, ell_i[part.indices].sum(), LAM, part.n_total, ctx)
    full = certify(model, data, w, float(ell_i.sum()), LAM)
    return {"primal": cert.primal, "dual": cert.dual, "gap": cert.gap,
            "full": [full.primal, full.dual, full.gap], "n_local": len(part.data),
            "y_star_is_local": bool(torch.equal(cert.y_star, model.oracle(w, part.data)))}


def run_suite(ctx) -> dict:
    out: dict = {"rank": ctx.rank, "world_size": ctx.world_size, "backend": ctx.backend, "device": str(ctx.device),
                 "timeout_s": ctx.timeout_s, "local_rank": ctx.local_rank,
                 "current_context_same": current_context() == ctx}
    # sharding real containers: the shards concatenated in rank order give the dataset back
    problems = {"chain": random_chain_problem(n=7, seed=1), "multiclass": random_multiclass_problem(n=9)}
    for name, (_, data) in problems.items():
        part = shard(data, ctx)
        out[f"{name}_indices"] = part.indices.tolist()
        out[f"{name}_gathered_equal"] = _same(gather_shards(part.data, ctx), data)
    # one collective for a vector and named scalars
    pg = dist.group.WORLD
    before = pg._get_sequence_number_for_group()
    vec, sums = all_reduce_packed(torch.full((5,), float(ctx.rank + 1)),
                                  {"delta_ell": 0.5 * (ctx.rank + 1), "n_blocks": torch.tensor(ctx.rank + 2)}, ctx)
    out["packed_collectives"] = pg._get_sequence_number_for_group() - before
    out["packed_vector"], out["packed_scalars"] = vec.tolist(), sums
    out["packed_dtype"] = str(vec.dtype)
    out["sum"] = all_reduce_sum(torch.arange(3, dtype=torch.float32) * (ctx.rank + 1), ctx).tolist()
    # broadcast and the replicated check
    w = broadcast_from_rank0(torch.full((4,), float(ctx.rank)), ctx)
    out["broadcast"] = w.tolist()
    assert_replicated(w, ctx)
    bad = w.clone()
    if ctx.rank == 1:
        bad[2] += 0.25
    try:
        assert_replicated(bad, ctx)
        out["replicated_error"] = None
    except DistributedError as exc:
        out["replicated_error"] = str(exc)
    assert_replicated(bad, ctx, tol=0.5)  # within the tolerance: no error
    # the global certificate equals certify on the full data
    out["certify"] = run_certify(ctx)
    # different datasets on the ranks: every rank raises the same error
    _, data = random_multiclass_problem(n=9, seed=ctx.rank)
    try:
        shard(data, ctx)
        out["mismatch_error"] = None
    except DistributedError as exc:
        out["mismatch_error"] = str(exc)
    # still usable after the errors above (they are raised by agreement, not by a broken group)
    out["after"] = all_reduce_sum(torch.ones(1), ctx).tolist()
    return out


def run_failure(ctx, scenario: str) -> dict:
    all_reduce_sum(torch.ones(1), ctx)  # both ranks are connected
    if ctx.rank == 1:
        if scenario == "dead":
            os._exit(1)
        time.sleep(4 * ctx.timeout_s)
        os._exit(0)
    t0 = time.monotonic()
    try:
        all_reduce_sum(torch.ones(3), ctx)
        return {"error": None, "seconds": time.monotonic() - t0}
    except DistributedError as exc:
        return {"error": str(exc), "seconds": time.monotonic() - t0}


def main() -> None:
    scenario, out_dir = sys.argv[1], Path(sys.argv[2])
    torch.set_num_threads(1)
    timeout = {"dead": 20.0, "stalled": 3.0}.get(scenario, 60.0)
    ctx = init_from_env(timeout_s=timeout)
    if scenario == "suite":
        result = run_suite(ctx)
    elif scenario == "certify":
        result = run_certify(ctx) | {"rank": ctx.rank, "world_size": ctx.world_size}
    else:
        result = run_failure(ctx, scenario)
    (out_dir / f"{scenario}_rank{ctx.rank}.json").write_text(json.dumps(result))
    if scenario in ("dead", "stalled"):
        os._exit(0)  # the group is broken: skip the teardown, which could wait for the peer
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
