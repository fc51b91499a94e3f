"""The exact duality-gap certificate of a sharded run: each rank's oracle pass on its examples at the common ``w``,
then ONE all-reduce of ``[sum_i H_i, ell_rank, n_rank]``.  The values of
:func:`torch_bcfw.solvers.certificate.certify` on the full data, up to the last bits of the per-rank partial sums
(bit for bit with one rank).
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..solvers.certificate import Certificate, squared_norm, with_dual
from .collectives import all_reduce_packed
from .context import DistributedContext
from .errors import DistributedError

__all__ = ["global_certify"]


def global_certify(model, shard_data, w: Tensor, ell_local: float | Tensor | None, lam: float,
                   n_total: int | None, ctx: DistributedContext) -> Certificate:
    """Primal, dual and gap of ``(w, ell)`` over the examples of all ranks, in one all-reduce: the same
    :class:`~torch_bcfw.solvers.certificate.Certificate` on every rank but ``y_star`` (this rank's answers).

    Args:
        shard_data: this rank's examples (``Shard.data``).
        w: ``Tensor[d]``, the replicated weights (the same on every rank).
        ell_local: this rank's part of ``ell = b^T alpha`` (float or one-element tensor); ``None`` on every rank
            for a primal-only certificate.
        n_total: ``n``, checked against the sum of the shard sizes (``DistributedError``); ``None``: that sum.
    """
    if not lam > 0:
        raise ValueError(f"lam must be > 0, got {lam}")
    w64 = w.to(torch.float64)
    y_star, H = model.hinge_terms(w64, shard_data)
    scalars = {"hinge_sum": H.sum(), "n_blocks": float(len(shard_data))}
    if ell_local is not None:
        scalars["ell"] = ell_local
    _, sums = all_reduce_packed(None, scalars, ctx)
    n = int(sums["n_blocks"])
    if n_total is not None and int(n_total) != n:
        raise DistributedError(f"global_certify (rank {ctx.rank}): n_total = {n_total} but the shards of the "
                               f"{ctx.world_size} ranks hold {n} examples together")
    ww = squared_norm(w64)
    return with_dual(0.5 * lam * ww + sums["hinge_sum"] / n, sums.get("ell"), lam, ww, y_star)
