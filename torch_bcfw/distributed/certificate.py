"""The exact duality-gap certificate of a sharded run (``w`` replicated, examples sharded over the ranks).

Every rank runs the batched loss-augmented oracle on its own examples at the common ``w``
(``model.hinge_terms(w, shard) -> (y_star, H)``, ``H: Tensor[n_rank]``), then ONE all-reduce sums
``[sum_i H_i, ell_rank, n_rank]`` over the ranks.  With ``S_H = sum_i H_i`` (all ``n`` examples) and ``ell = sum_i
ell_i = b^T alpha``::

    primal = lam/2 ||w||^2 + S_H / n
    dual   = ell - lam/2 ||w||^2
    gap    = primal - dual

the values of :func:`torch_bcfw.solvers.certificate.certify` on the full data.  It is a certificate only if no
update happens during the pass (all oracles at the same ``w``).

Rounding: ``certify`` takes ``H.mean()`` (on the CPU: the sum of ``H`` divided by ``n``); here the sum is a sum of
per-rank partial sums, which can differ from the one-pass sum in the last bits (relative error ~ ``P`` ulp of
``sum H``, far below 1e-12).  With one rank the two agree bit for bit: the same ``H.sum()`` is divided by the same
``n``.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..solvers.certificate import Certificate, squared_norm
from .collectives import all_reduce_packed
from .context import DistributedContext
from .errors import DistributedError

__all__ = ["global_certify"]


def global_certify(model, shard_data, w: Tensor, ell_local: float | Tensor | None, lam: float,
                   n_total: int | None, ctx: DistributedContext) -> Certificate:
    """Primal, dual and gap of ``(w, ell)`` over the examples of all ranks, in one all-reduce.

    Args:
        model: the structured model (its ``hinge_terms``).
        shard_data: this rank's examples (``Shard.data``).
        w: ``Tensor[d]``, the replicated weights (the same on every rank; see
            :func:`~torch_bcfw.distributed.assert_replicated`).
        ell_local: ``sum_{i in shard} ell_i``, this rank's part of ``ell = b^T alpha`` (float or one-element
            tensor); ``None`` for a primal-only certificate (``dual = gap = None``), on every rank.
        lam: the regularisation ``lam > 0``.
        n_total: ``n``, the number of examples of all ranks together; checked against the sum of the shard
            sizes (``None``: take that sum).
        ctx: the distributed context.

    Returns:
        The :class:`~torch_bcfw.solvers.certificate.Certificate` of the full problem, the same on every rank
        except ``y_star``, which holds the oracle answers of this rank's examples only.

    Raises:
        DistributedError: ``n_total`` is not the sum of the shard sizes (on every rank), or a collective failed.
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
    primal = 0.5 * lam * ww + sums["hinge_sum"] / n
    if ell_local is None:
        return Certificate(primal, None, None, y_star)
    dual = sums["ell"] - 0.5 * lam * ww
    return Certificate(primal, dual, primal - dual, y_star)
