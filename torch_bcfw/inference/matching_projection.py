"""Euclidean projection onto the bipartite matching polytope, batched, with a certified distance to the exact answer.

For an ``m x f`` matrix ``a`` the projection solves ``min_z 1/2 ||z - a||^2`` s.t. ``z >= 0`` and every row and
column sum ``<= 1`` (the fractional matchings).  With row and column multipliers ``p, q >= 0`` the minimiser is
``z(p, q)_jk = max(0, a_jk - p_j - q_k)``; the negated dual ``f(p, q) = 1/2 ||z(p, q)||^2 + sum p + sum q`` is
minimised by projected Newton steps (:func:`project_matching_polytope`).

**Certificate.**  The point returned is ``z(p, q) / max(1, row sum, column sum)`` entrywise, always exactly
feasible; ``1/2 ||z - z*||^2 <= gap = 1/2 ||z - z(p, q)||^2 + sum_j p_j (1 - sum_k z_jk) + sum_k q_k (1 - sum_j
z_jk)`` (a sum of non-negative terms, no cancellation).  The solve stops when ``sqrt(2 gap) <= tol`` for every
matrix of the batch, or at the iteration caps.  Matrices of different sizes share a padded batch whose padding
(:data:`PAD_VALUE`) is never in a support.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["project_matching_polytope", "capped_simplex_threshold", "MatchingProjection", "PAD_VALUE"]

#: the value of padded entries (far below any real entry: never in a support)
PAD_VALUE = -1e200


def capped_simplex_threshold(v: Tensor) -> Tensor:
    """The smallest ``tau >= 0`` with ``sum_k max(0, v_k - tau) <= 1`` along the last dimension (by sorting).

    ``max(0, v - tau)`` is then the Euclidean projection of ``v`` onto ``{x >= 0, sum x <= 1}``.
    """
    s, _ = torch.sort(v, dim=-1, descending=True)
    cs = torch.cumsum(s, dim=-1)
    k = torch.arange(1, v.shape[-1] + 1, dtype=v.dtype, device=v.device)
    cond = s * k > cs - 1.0  # s_k > (cs_k - 1) / k: true on a prefix (k = 1 always, up to rounding)
    cond[..., 0] = True
    rho = (cond * k).amax(-1, keepdim=True).long()  # the last k where it holds
    tau = (cs.gather(-1, rho - 1) - 1.0) / rho.to(v.dtype)
    return tau.squeeze(-1).clamp_min(0.0)


@dataclass
class MatchingProjection:
    """The result of :func:`project_matching_polytope`.

    Attributes:
        z: ``[B, M, F]`` the feasible point (zeros at padded entries).
        p: ``[B, M]`` row multipliers (for a warm start).
        q: ``[B, F]`` column multipliers.
        dist: ``[B]`` certified bound on ``||z - z*||`` (``sqrt(2 gap)``) per matrix.
        iters: Newton iterations done (both phases).
    """

    z: Tensor
    p: Tensor
    q: Tensor
    dist: Tensor
    iters: int


def _feasible_and_gap(a: Tensor, p: Tensor, q: Tensor) -> tuple[Tensor, Tensor]:
    """The feasible point ``z(p, q) / max(1, row sum, column sum)`` (entrywise) and the duality gap of the QP.

    A slack of a row or column within rounding of 0 (``<= 8 eps (support size + 1) (1 + max |a|)``: each entry of
    ``z(p, q) = max(0, a - p - q)`` is itself rounded by about ``eps |a|``) counts as 0: the bound holds up to the
    floating-point rounding of the sums (without this, ``p_j x rounding`` would floor the certified distance at about
    ``sqrt(p eps |a|)``)."""
    zpq = _zpq(a, p, q)
    scale = torch.maximum(zpq.sum(2)[:, :, None], zpq.sum(1)[:, None, :]).clamp_min(1.0)
    z = zpq / scale
    eps = torch.finfo(a.dtype).eps
    nz = z > 0
    mag = 1.0 + torch.where(a > PAD_VALUE / 2, a.abs(), torch.zeros_like(a)).amax((1, 2))

    def slack(total, count):
        s = 1.0 - total
        return torch.where(s > 8.0 * eps * (count + 1) * mag[:, None], s, torch.zeros_like(s))

    gap = (0.5 * (z - zpq).square().sum((1, 2)) + (p * slack(z.sum(2), nz.sum(2))).sum(1)
           + (q * slack(z.sum(1), nz.sum(1))).sum(1))
    return z, gap


def _zpq(a: Tensor, p: Tensor, q: Tensor) -> Tensor:
    return (a - p[:, :, None] - q[:, None, :]).clamp_min(0.0)


def _bcd_sweep(a: Tensor, p: Tensor, q: Tensor) -> tuple[Tensor, Tensor]:
    """One exact block-coordinate sweep on the dual: the rows' thresholds, then the columns' (Dykstra)."""
    p = capped_simplex_threshold(a - q[:, None, :])
    q = capped_simplex_threshold(a.transpose(1, 2) - p[:, None, :])
    return p, q


def _interior_point(a: Tensor, maskz: Tensor, iters: int = 80) -> tuple[Tensor, Tensor]:
    """Row and column multipliers of the projection QP by a batched primal-dual interior-point method (Mehrotra's
    predictor-corrector): ``min 1/2 ||z - a||^2`` s.t. ``A z + s = 1``, ``z, s >= 0`` (``A``: row and column sums),
    with Newton systems ``A D^-1 A^T + diag(s / y)`` solved by Cholesky."""
    B, M, F = a.shape
    a = torch.where(maskz, a, torch.zeros_like(a))
    big_all = a.abs().amax((1, 2)).clamp_min(1.0)
    P = torch.zeros(B, M + F, dtype=a.dtype, device=a.device)
    z_all = 0.5 * maskz.to(a.dtype) + (~maskz).to(a.dtype)
    u_all = big_all[:, None, None] * torch.ones_like(a)
    s_all = torch.ones(B, M + F, dtype=a.dtype, device=a.device)
    y_all = big_all[:, None] * torch.ones_like(s_all)
    live = torch.ones(B, dtype=torch.bool, device=a.device)

    def At(v):  # A^T v: [b, M, F]
        return v[:, :M, None] + v[:, None, M:]

    def Az(w):  # A w: [b, M + F]
        return torch.cat([w.sum(2), w.sum(1)], 1)

    def max_step(v, dv):
        ratio = torch.where(dv < 0, -v / dv, torch.full_like(v, float("inf")))
        return ratio.flatten(1).amin(1)

    for _ in range(iters):
        idx = torch.nonzero(live)[:, 0]
        if idx.numel() == 0:
            break
        ab, mz, big = a[idx], maskz[idx], big_all[idx]
        z, u, s, y = z_all[idx], u_all[idx], s_all[idx], y_all[idx]
        mk = mz.to(a.dtype)
        real = torch.cat([mz.any(2), mz.any(1)], 1).to(a.dtype)
        count = mk.sum((1, 2)) + real.sum(1)
        rd = (z - ab + At(y) - u) * mk
        rp = (Az(z * mk) + s - 1.0) * real
        mu = ((z * u * mk).sum((1, 2)) + (s * y * real).sum(1)) / count
        done = (mu <= 1e-15 * big) & (rd.abs().amax((1, 2)) <= 1e-13 * big) & (rp.abs().amax(1) <= 1e-13)
        Dinv = mk / (1.0 + u / z)
        K = torch.diag_embed(torch.cat([Dinv.sum(2), Dinv.sum(1)], 1) + s / y)
        K[:, :M, M:] = Dinv
        K[:, M:, :M] = Dinv.transpose(1, 2)
        L, info = torch.linalg.cholesky_ex(K)
        done |= (info != 0) | ~torch.isfinite(mu)  # numerically at the end: keep the last multipliers

        def solve(r1, r_sy):
            rhs = Az(Dinv * r1) + r_sy / y + rp
            dy = torch.cholesky_solve(rhs[:, :, None], L)[:, :, 0]
            return Dinv * (r1 - At(dy)), dy

        def steps(r_zu, r_sy):
            dz, dy = solve(-rd + r_zu / z, r_sy)
            du = (r_zu - u * dz) / z * mk
            ds = (r_sy - s * dy) / y
            alpha = torch.stack([max_step(z, dz), max_step(u, du), max_step(s, ds), max_step(y, dy)], 1).amin(1)
            return dz, du, ds, dy, alpha

        dz, du, ds, dy, alpha = steps(-z * u, -s * y)  # predictor (affine scaling)
        alpha = alpha.clamp(max=1.0)
        al = alpha[:, None, None]
        mu_aff = ((((z + al * dz) * (u + al * du)) * mk).sum((1, 2))
                  + ((s + alpha[:, None] * ds) * (y + alpha[:, None] * dy) * real).sum(1)) / count
        sigma = (mu_aff / mu).clamp(0.0, 1.0) ** 3
        r_zu = sigma[:, None, None] * mu[:, None, None] - z * u - dz * du  # corrector
        r_sy = sigma[:, None] * mu[:, None] - s * y - ds * dy
        dz, du, ds, dy, alpha = steps(r_zu, r_sy)
        alpha = (0.995 * alpha).clamp(max=1.0)
        ok = ~done & torch.isfinite(alpha)
        al = alpha[:, None, None]
        go = idx[ok]
        z_all[go] = torch.where(mz, z + al * dz, z)[ok]
        u_all[go] = torch.where(mz, u + al * du, u)[ok]
        s_all[go] = (s + alpha[:, None] * ds)[ok]
        y_all[go] = (y + alpha[:, None] * dy)[ok]
        live[idx[~ok]] = False
    real_all = torch.cat([maskz.any(2), maskz.any(1)], 1)
    y = torch.where(real_all, y_all, P)
    return y[:, :M], y[:, M:]


def _newton(a: Tensor, p: Tensor, q: Tensor, tol: float, max_iters: int) -> MatchingProjection:
    """Projected Newton on the dual from ``(p, q)`` (see :func:`project_matching_polytope`)."""
    a = a.to(torch.float64)
    B, M, F = a.shape
    n = M + F
    p, q = p.clone(), q.clone()
    real = torch.cat([(a > PAD_VALUE / 2).any(2), (a > PAD_VALUE / 2).any(1)], 1)  # padded rows / columns stay 0
    eye = torch.eye(n, dtype=a.dtype, device=a.device)
    z, gap = _feasible_and_gap(a, p, q)
    dist = (2.0 * gap).sqrt()
    it = 0
    while it < max_iters:
        todo = dist > tol
        if not bool(todo.any()):
            break
        it += 1
        idx = torch.nonzero(todo)[:, 0]
        ab, rb = a[idx], real[idx]
        x = torch.cat([p[idx], q[idx]], 1)
        zb = ab - x[:, :M, None] - x[:, None, M:]
        S = (zb > 0).to(a.dtype)
        zb = zb.clamp_min(0.0)
        g = torch.cat([1.0 - zb.sum(2), 1.0 - zb.sum(1)], 1)
        g = torch.where(rb, g, torch.zeros_like(g))
        eps_act = torch.minimum((x - (x - g).clamp_min(0.0)).abs().sum(1, keepdim=True), x.new_tensor(1e-3))
        free = ((x > eps_act) | (g <= 0)) & rb
        fm = free.to(a.dtype)
        deg = torch.cat([S.sum(2), S.sum(1)], 1)
        H = torch.diag_embed(deg)
        H[:, :M, M:] = S
        H[:, M:, :M] = S.transpose(1, 2)
        H = H * fm[:, :, None] * fm[:, None, :] + torch.diag_embed(1.0 - fm)
        H = H + eye * (1e-12 * (1.0 + deg.amax(1)))[:, None, None]
        d = -torch.linalg.solve(H, g[:, :, None])[:, :, 0] * rb
        # Armijo search on f along the projection arc; a full step whose decrease of f is below the rounding of
        # the decrease itself (the end game) is kept when it halves the natural residual |x - max(0, x - g)|
        resid = (x - (x - g).clamp_min(0.0)).abs().amax(1)
        size = ab.clamp_min(0.0).amax((1, 2)) + x.amax(1) + 1.0
        noise = 8.0 * torch.finfo(a.dtype).eps * size * (zb.sum((1, 2)) + n)
        step = torch.ones(len(idx), dtype=a.dtype, device=a.device)
        accepted = torch.zeros(len(idx), dtype=torch.bool, device=a.device)
        x_new = x.clone()
        for trial in range(30):
            xt = (x + step[:, None] * d).clamp_min(0.0)
            zt = _zpq(ab, xt[:, :M], xt[:, M:])
            change = 0.5 * ((zt - zb) * (zt + zb)).sum((1, 2)) + (xt - x).sum(1)  # f(xt) - f(x)
            predicted = (g * (xt - x)).sum(1)
            ok = (predicted < 0) & (change <= 1e-4 * predicted)
            if trial == 0:
                gt = torch.cat([1.0 - zt.sum(2), 1.0 - zt.sum(1)], 1) * rb
                resid_t = (xt - (xt - gt).clamp_min(0.0)).abs().amax(1)
                ok |= (predicted.abs() <= 1e3 * noise) & (resid_t <= 0.5 * resid)
            ok &= ~accepted
            x_new = torch.where(ok[:, None], xt, x_new)
            accepted |= ok
            if bool(accepted.all()):
                break
            step = torch.where(accepted, step, 0.5 * step)
        if not bool(accepted.all()):
            pb, qb = _bcd_sweep(ab[~accepted], x[~accepted, :M], x[~accepted, M:])
            x_new[~accepted] = torch.cat([pb, qb], 1)
        p[idx], q[idx] = x_new[:, :M], x_new[:, M:]
        zf, gf = _feasible_and_gap(ab, x_new[:, :M], x_new[:, M:])
        z[idx], gap[idx] = zf, gf
        dist[idx] = (2.0 * gf).sqrt()
    return MatchingProjection(z=z, p=p, q=q, dist=dist, iters=it)


def project_matching_polytope(a: Tensor, p0: Tensor | None = None, q0: Tensor | None = None, tol: float = 1e-9,
                              warm_iters: int = 10, max_iters: int = 50) -> MatchingProjection:
    """Project every ``a[b]`` (``[B, M, F]``, float64; padded entries ``<= PAD_VALUE / 2``) onto the matching polytope.

    Projected Newton steps on the negated dual ``f`` (Bertsekas 1982; generalised Hessian ``[[D_r, S], [S^T, D_c]]``,
    ``S`` the support of ``z(p, q)``, ``D`` its row and column counts; an Armijo search along the projection arc, with
    decreases of ``f`` summed entry by entry to stay exact below the rounding of ``f``; where no step is found, one
    exact block-coordinate sweep).  They start from the warm start ``(p0, q0)`` when given; the matrices not
    certified after ``warm_iters`` steps restart from a primal-dual interior-point solve (:func:`_interior_point`,
    robust for large ``|a|``, where the dual is degenerate).

    Args:
        a: the points to project.
        p0, q0: optional warm-start multipliers ``[B, M]`` / ``[B, F]`` (clamped at 0).
        tol: stop once every certified distance ``sqrt(2 gap)`` is ``<= tol``.
        warm_iters: most Newton steps from the warm start.
        max_iters: most Newton steps after the interior-point start.

    Returns a :class:`MatchingProjection` (``z`` is feasible in every case; ``dist`` bounds its distance to the exact
    projection; ``iters`` counts the Newton steps of both phases).
    """
    a = a.to(torch.float64)
    if p0 is None or q0 is None:
        p, q = _interior_point(a, a > PAD_VALUE / 2)
        return _newton(a, p, q, tol, max_iters)
    res = _newton(a, p0.to(a).clamp_min(0.0), q0.to(a).clamp_min(0.0), tol, warm_iters)
    todo = res.dist > tol
    if bool(todo.any()):
        idx = torch.nonzero(todo)[:, 0]
        ab = a[idx]
        p, q = _interior_point(ab, ab > PAD_VALUE / 2)
        r2 = _newton(ab, p, q, tol, max_iters)
        res.iters += r2.iters
        better = r2.dist < res.dist[idx]  # keep whichever is certified closer
        sel = idx[better]
        res.z[sel], res.p[sel], res.q[sel], res.dist[sel] = (r2.z[better], r2.p[better], r2.q[better],
                                                              r2.dist[better])
    return res
