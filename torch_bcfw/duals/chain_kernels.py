"""The chain's compiled block operations, for its marginal dual state: what a block step is made of.

The arrays cross the compiled boundary in named groups (:class:`ChainFeatures`, :class:`ChainWeights`,
:class:`ChainMarginals`, :class:`ChainAverages`, :class:`StepScratch`), read by name.  The step driver
(:mod:`.chain_driver`) and the mini-batch rounds (:mod:`.chain_rounds`) compose these operations; tests check them
against the generic torch steps.

Layout (see :class:`torch_bcfw.models.chain.Chain`): emission ``We[F, K]``, per-label bias, start and end biases
``[K]``, transitions ``trans[K, K]``.  Token features are CSR (``indptr[N_tok+1], indices[nnz], values[nnz]``); ids,
values and Gram entries may come in any narrower exact type.  Kernels that allocate nothing compile without numba's
runtime (``_nrt=False``: no reference counting of their array arguments, ``docs/results/driver_speed.md``).

Block state: token marginals ``mu[N_tok, K]`` and transition marginals ``T[n, K, K]`` with ``w_i = (phi_i(y_i) -
phi_i(mu_i)) / (lam n)``.  For a direction ``delta = e_{y*} - mu_i``, ``||phi_i(delta)||^2 = sum_{t,t'} G_i[t,t']
<delta_t, delta_t'> + ||delta_0||^2 + ||delta_{L-1}||^2 + ||delta_T||^2`` with ``G_i = X_i X_i^T + 1``.  Scores are
of labelings under ``w`` without the block constant: with ``h(y) = L_i(y)/n + score(y)/n`` and ``h_i = l_i +
score(mu_i)/n``, ``h(y*) - h_i`` is a block gap.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
from llvmlite import ir
from llvmlite.binding import llvm_version_info
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from ..inference.viterbi import viterbi_numba
from .stepsize import PAIRWISE_RULE, clipped_step, commit_ell, fw_commit, move_bound, touch_average
from .working_set import ALPHA, LOSS, SCORE, ws_away_update, ws_pairwise_update

__all__ = ["ChainFeatures", "ChainWeights", "ChainMarginals", "ChainAverages", "StepScratch", "Corner",
           "step_scratch", "fw_move", "move_block", "active_set_step", "block_corner", "corner_base", "add_corner",
           "decode_block", "unary_scores", "loss_augmented_decode", "add_direction"]


class ChainFeatures(NamedTuple):
    """The data: CSR token features, labels, sequence offsets and the per-sequence Gram matrices ``G_i = X_i X_i^T +
    1`` (row-major at ``gram[gram_off[i]:]``; :func:`~torch_bcfw.duals.chain.sequence_grams`)."""

    indptr: np.ndarray
    indices: np.ndarray
    values: np.ndarray
    y: np.ndarray
    offsets: np.ndarray
    gram: np.ndarray
    gram_off: np.ndarray


class ChainWeights(NamedTuple):
    """Views of ``w`` (or of a vector in its layout): emission ``We[F, K]``, ``bias``, ``start``, ``end`` ``[K]``,
    transitions ``trans[K, K]``."""

    We: np.ndarray
    bias: np.ndarray
    start: np.ndarray
    end: np.ndarray
    trans: np.ndarray


class ChainMarginals(NamedTuple):
    """The dual variables: ``mu[N_tok, K]``, ``T[n, K, K]``, ``block_ell[n]`` (``l_i``) and ``totals`` (one
    :data:`~.stepsize.TOTALS` record: ``l`` and ``avg_l_u``)."""

    mu: np.ndarray
    T: np.ndarray
    block_ell: np.ndarray
    totals: np.ndarray


class ChainAverages(NamedTuple):
    """The lazy weighted average: ``mu_acc[N_tok, K]``, ``T_acc[K, K]`` (summed over blocks) and ``last[n]``, each
    block's clock of its last change."""

    mu_acc: np.ndarray
    T_acc: np.ndarray
    last: np.ndarray


class StepScratch(NamedTuple):
    """The scratch of one block step: unary scores ``U``, loss-augmented unaries ``Ua``, the direction's unary part
    ``D`` (``[Lmax, K]`` each), the corner ``ystar`` (int64), Viterbi messages ``delta``, the transition direction
    ``dT [K, K]``, the away corner ``ya`` (int64) and the corner as a working set stores it ``yh`` (int32)."""

    U: np.ndarray
    Ua: np.ndarray
    D: np.ndarray
    ystar: np.ndarray
    delta: np.ndarray
    dT: np.ndarray
    ya: np.ndarray
    yh: np.ndarray


class Corner(NamedTuple):
    """An FW step's corner: the scores of ``y*`` and ``mu_i`` under ``w`` (transitions included), ``l_i``, ``l_s =
    L_i(y*) / n`` and the transition part ``sq_T`` of ``||phi_i(delta)||^2``."""

    score: float
    score_mu: float
    ell_i: float
    ell_s: float
    sq_T: float


# the intrinsic's mangled name: "p0" with the opaque pointers of LLVM >= 15, "p0i8" before
_PREFETCH_NAME = "llvm.prefetch.p0" if llvm_version_info >= (15,) else "llvm.prefetch.p0i8"


@intrinsic
def _prefetch(typingctx, arr, idx):
    """Hint the CPU to fetch the cache line holding flat element ``idx`` of the C-contiguous ``arr`` (``llvm.prefetch``,
    read, high locality): no effect on results."""
    def codegen(context, builder, sig, args):
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        ptr = builder.bitcast(builder.gep(data, [args[1]]), cgutils.voidptr_t)
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [cgutils.voidptr_t, i32, i32, i32]), _PREFETCH_NAME)
        builder.call(fn, [ptr, i32(0), i32(3), i32(1)])
        return context.get_dummy_value()
    return types.void(arr, types.intp), codegen


@njit(cache=True, _nrt=False)
def _prefetch_range(a, lo, hi):
    """Prefetch the flat elements ``lo:hi`` of the C-contiguous array ``a`` (one hint per 64-byte line)."""
    step = max(64 // a.itemsize, 1)
    for p in range(lo, hi, step):
        _prefetch(a, p)
    if hi > lo:
        _prefetch(a, hi - 1)


@njit(cache=True, _nrt=False)
def prefetch_block(i, offsets, indptr, indices, values, gram, gram_off, mu, T, mu_acc, averaging):
    """Prefetch block ``i``'s ``T_i``, ``mu_i``, features and Gram matrix while the current block is processed."""
    K = mu.shape[1]
    s = offsets[i]
    e = offsets[i + 1]
    _prefetch_range(T, i * K * K, (i + 1) * K * K)
    _prefetch_range(mu, s * K, e * K)
    if averaging:
        _prefetch_range(mu_acc, s * K, e * K)
    _prefetch_range(indices, indptr[s], indptr[e])
    _prefetch_range(values, indptr[s], indptr[e])
    _prefetch_range(gram, gram_off[i], gram_off[i] + (e - s) * (e - s))


@njit(cache=True)
def max_length(offsets) -> int:
    """Longest sequence of the packing ``offsets[n+1]`` (scratch sizes of the step kernels)."""
    Lmax = 0
    for i in range(offsets.shape[0] - 1):
        if offsets[i + 1] - offsets[i] > Lmax:
            Lmax = offsets[i + 1] - offsets[i]
    return Lmax


@njit(cache=True)
def step_scratch(offsets, K):
    """The :class:`StepScratch` of one block step, sized for the longest sequence of ``offsets``."""
    Lmax = max_length(offsets)
    return StepScratch(np.empty((Lmax, K)), np.empty((Lmax, K)), np.empty((Lmax, K)), np.empty(Lmax, dtype=np.int64),
                       np.empty((Lmax, K)), np.empty((K, K)), np.empty(Lmax, dtype=np.int64),
                       np.empty(Lmax, dtype=np.int32))


@njit(cache=True, _nrt=False)
def loss_augmented_decode(U, Ua, L, s, y, inv_L, trans, ystar, delta):
    """``ystar[:L] <- argmax_y sum_t (U[t, y_t] + inv_L [y_t != y_{s+t}]) + transitions`` (normalised Hamming
    loss folded into the unaries ``Ua``; ``delta``: scratch of :func:`viterbi_numba`)."""
    K = U.shape[1]
    for t in range(L):
        for c in range(K):
            Ua[t, c] = U[t, c] + inv_L
        Ua[t, y[s + t]] = U[t, y[s + t]]
    viterbi_numba(Ua[:L], trans, ystar[:L], delta)


@njit(cache=True)
def decode_block(i, feats, w, ystar):
    """The compiled steps' oracle alone: loss-augmented decoding of block ``i`` at ``w`` into ``ystar[:L]`` (int64)."""
    s = feats.offsets[i]
    L = feats.offsets[i + 1] - s
    scr = step_scratch(feats.offsets, w.We.shape[1])
    unary_scores(s, L, feats.indptr, feats.indices, feats.values, w.We, w.bias, w.start, w.end, scr.U)
    loss_augmented_decode(scr.U, scr.Ua, L, s, feats.y, 1.0 / L, w.trans, ystar, scr.delta)


@njit(cache=True, fastmath=True, _nrt=False)
def unary_scores(s, L, indptr, indices, values, We, bias, start, end, U):
    """``U[t] = x_{s+t}^T We + bias`` (plus the start / end biases at ``t = 0`` / ``L-1``) from the CSR features;
    four non-zeros per sweep over the labels (a quarter of the loads and stores of ``U[t]``)."""
    K = We.shape[1]
    for t in range(L):
        tok = s + t
        for c in range(K):
            U[t, c] = bias[c]
        p = indptr[tok]
        e = indptr[tok + 1]
        while p + 4 <= e:
            f0, f1, f2, f3 = indices[p], indices[p + 1], indices[p + 2], indices[p + 3]
            v0, v1, v2, v3 = values[p], values[p + 1], values[p + 2], values[p + 3]
            for c in range(K):
                U[t, c] += (v0 * We[f0, c] + v1 * We[f1, c]) + (v2 * We[f2, c] + v3 * We[f3, c])
            p += 4
        for q in range(p, e):
            f = indices[q]
            v = values[q]
            for c in range(K):
                U[t, c] += v * We[f, c]
    for c in range(K):
        U[0, c] += start[c]
    for c in range(K):
        U[L - 1, c] += end[c]


@njit(cache=True, fastmath={"contract"}, _nrt=False)
def add_direction(a, s, L, indptr, indices, values, D, We, bias, start, end):
    """``w += a * phi_i(delta)`` for the unary part ``D[L, K]`` of the direction (emission and biases), over the
    non-zeros of each ``D[t]`` only.  Only multiply-adds are contracted (no reassociation): each entry gets the same
    ``(a x) d + w`` as a dense sweep."""
    K = We.shape[1]
    for t in range(L):
        tok = s + t
        lo = indptr[tok]
        hi = indptr[tok + 1]
        for c in range(K):
            d = D[t, c]
            if d != 0.0:
                for p in range(lo, hi):
                    We[indices[p], c] += (a * values[p]) * d
                bias[c] += a * d
    for c in range(K):
        start[c] += a * D[0, c]
        end[c] += a * D[L - 1, c]


@njit(cache=True, fastmath=True, _nrt=False)
def direction_sqnorm(i, L, D, gram, gram_off):
    """Unary part of ``||phi_i(delta)||^2`` from ``G_i = X_i X_i^T + 1`` plus the start/end terms."""
    K = D.shape[1]
    sq = 0.0
    g0 = gram_off[i]
    for t in range(L):
        Dt = D[t]
        dot = 0.0
        for c in range(K):
            dot += Dt[c] * Dt[c]
        sq += gram[g0 + t * L + t] * dot
        for t2 in range(t + 1, L):
            Dt2 = D[t2]
            dot = 0.0
            for c in range(K):
                dot += Dt[c] * Dt2[c]
            sq += 2.0 * gram[g0 + t * L + t2] * dot
    for c in range(K):
        sq += D[0, c] * D[0, c] + D[L - 1, c] * D[L - 1, c]
    return sq


@njit(cache=True, fastmath=True, _nrt=False)
def transition_stats(Ti, trans, ystar):
    """``(<T_i, trans>, ||counts(y*) - T_i||^2)`` in one sweep over ``T_i`` (``dT`` is never formed)."""
    K = trans.shape[0]
    L = ystar.shape[0]
    score = 0.0
    sq = 0.0
    # one flat loop over the K^2 entries (vectorises without a remainder per row)
    tf = Ti.reshape(K * K)
    wf = trans.reshape(K * K)
    for q in range(K * K):
        v = tf[q]
        score += v * wf[q]
        sq += v * v
    # - 2 <T_i, counts> + ||counts||^2, counting repeated pairs once per pair of occurrences
    for t in range(1, L):
        a, b = ystar[t - 1], ystar[t]
        sq -= 2.0 * Ti[a, b]
        for u in range(1, L):
            if ystar[u - 1] == a and ystar[u] == b:
                sq += 1.0
    return score, sq


@njit(cache=True, _nrt=False)
def transition_score(Ti, trans):
    """``<T_i, trans>``, the transition part of ``mu_i``'s score."""
    K = trans.shape[0]
    score = 0.0
    for p in range(K):
        for c in range(K):
            score += Ti[p, c] * trans[p, c]
    return score


@njit(cache=True, fastmath=True, _nrt=False)
def labels_score(U, trans, lab, base, L):
    """The score of the labeling ``lab[base : base + L]`` from the block's unary scores ``U``."""
    sc = 0.0
    for t in range(L):
        sc += U[t, lab[base + t]]
    for t in range(1, L):
        sc += trans[lab[base + t - 1], lab[base + t]]
    return sc


@njit(cache=True, fastmath=True, _nrt=False)
def _transition_update(Ti, trans, Ta, ystar, a, gamma, S):
    """``trans += a (counts - T_i)``, ``Ta += S T_i`` (when ``S != 0``), ``T_i <- (1-gamma) T_i + gamma counts``."""
    K = trans.shape[0]
    keep = 1.0 - gamma
    tf = Ti.reshape(K * K)
    wf = trans.reshape(K * K)
    if S != 0.0:
        af = Ta.reshape(K * K)
        for q in range(K * K):
            v = tf[q]
            wf[q] -= a * v
            af[q] += S * v
            tf[q] = keep * v
    else:
        for q in range(K * K):
            v = tf[q]
            wf[q] -= a * v
            tf[q] = keep * v
    for t in range(1, ystar.shape[0]):
        trans[ystar[t - 1], ystar[t]] += a
        Ti[ystar[t - 1], ystar[t]] += gamma


@njit(cache=True, fastmath=True, _nrt=False)
def fw_move(i, s, L, step_code, averaging, lam, k, clock, corner, ystar, D, feats, w, marg, avg):
    """The FW step of block ``i`` towards ``ystar`` from the direction's unary part ``D[:L] = e_{y*} - mu_i`` and its
    :class:`Corner`: block gap, the step and its commit (:func:`~.stepsize.fw_commit`), the moves (:func:`move_block`).
    Returns ``(gap, gamma)``."""
    n = feats.offsets.shape[0] - 1
    lam_n = lam * n
    sq = direction_sqnorm(i, L, D, feats.gram, feats.gram_off) + corner.sq_T
    num = (corner.score - corner.score_mu) / n - corner.ell_i + corner.ell_s
    den = sq / (lam_n * n)
    gamma, S = fw_commit(step_code, num, den, k, n, corner.ell_s, averaging, clock, avg.last, marg.block_ell, i,
                         marg.totals)
    if gamma != 0.0:
        move_block(i, s, L, gamma, -gamma / lam_n, S, D, ystar[:L], feats, w, marg, avg, w.trans)
    return num, gamma


@njit(cache=True, fastmath=True, inline="always")
def move_block(i, s, L, gamma, a, S, D, ystar, feats, w, marg, avg, trans):
    """Block ``i`` (tokens ``s .. s+L-1``) moves by ``gamma`` towards ``ystar`` once its step is committed
    (:func:`~.stepsize.commit_fw_move`, ``S`` the weight of its old value in the lazy average): ``w += a phi_i(delta)``
    with ``a = -gamma / (lam n)`` (``a = 0`` and ``trans`` a scratch when ``w`` moves elsewhere), ``T_i`` and
    ``mu_i``, accumulating ``S`` times their old values."""
    mu, mu_acc = marg.mu, avg.mu_acc
    K = mu.shape[1]
    if a != 0.0:
        add_direction(a, s, L, feats.indptr, feats.indices, feats.values, D, w.We, w.bias, w.start, w.end)
    _transition_update(marg.T[i], trans, avg.T_acc, ystar, a, gamma, S)
    for t in range(L):
        if S != 0.0:
            for c in range(K):
                mu_acc[s + t, c] += S * mu[s + t, c]
        for c in range(K):
            mu[s + t, c] += gamma * D[t, c]


@njit(cache=True, inline="always")
def corner_base(s, L, feats, w, mu, U, D):
    """Before the corner is known: the unary scores ``U`` of the block whose ``L`` tokens start at ``s``, and ``D[:L]
    = -mu_i`` (:func:`add_corner` adds the one-hot).  Returns the unary score of ``mu_i``."""
    K = w.We.shape[1]
    unary_scores(s, L, feats.indptr, feats.indices, feats.values, w.We, w.bias, w.start, w.end, U)
    score_mu = 0.0
    for t in range(L):
        for c in range(K):
            m = mu[s + t, c]
            score_mu += U[t, c] * m
            D[t, c] = -m
    return score_mu


@njit(cache=True, inline="always")
def add_corner(s, L, y, trans, U, ystar, D):
    """The corner ``ystar[:L]`` of the block whose tokens start at ``s``: ``D[t, y*_t] += 1`` (``D = e_{y*} - mu_i``).
    Returns ``(score of y*, mistakes of y*)``."""
    score_star = 0.0
    mistakes = 0
    for t in range(L):
        score_star += U[t, ystar[t]]
        if ystar[t] != y[s + t]:
            mistakes += 1
        D[t, ystar[t]] += 1.0
    for t in range(1, L):
        score_star += trans[ystar[t - 1], ystar[t]]
    return score_star, mistakes


@njit(cache=True, inline="always")
def block_corner(s, L, feats, w, mu, U, Ua, ystar, delta, D):
    """:func:`corner_base`, the loss-augmented decoding into ``ystar[:L]`` and :func:`add_corner`.  Returns ``(score
    of y*, unary score of mu_i, mistakes of y*)``."""
    score_mu = corner_base(s, L, feats, w, mu, U, D)
    loss_augmented_decode(U, Ua, L, s, feats.y, 1.0 / L, w.trans, ystar, delta)
    score_star, mistakes = add_corner(s, L, feats.y, w.trans, U, ystar, D)
    return score_star, score_mu, mistakes


# ---------------------------------------------------------------- pairwise and away steps (Osokin et al. 2016)
@njit(cache=True, fastmath=True, _nrt=False)
def _general_direction(s, L, p, ys, q, ya, r, mu, Ti, D, dT):
    """``D = r mu_i + p onehot(ys) + q onehot(ya)``, ``dT = r T_i + p counts(ys) + q counts(ya)``; ``||dT||^2``."""
    K = D.shape[1]
    for t in range(L):
        for c in range(K):
            D[t, c] = r * mu[s + t, c]
        D[t, ys[t]] += p
        D[t, ya[t]] += q
    for a in range(K):
        for b in range(K):
            dT[a, b] = r * Ti[a, b]
    for t in range(1, L):
        dT[ys[t - 1], ys[t]] += p
        dT[ya[t - 1], ya[t]] += q
    sq = 0.0
    for a in range(K):
        for b in range(K):
            sq += dT[a, b] * dT[a, b]
    return sq


@njit(cache=True, fastmath=True, _nrt=False)
def _general_move(gamma, lam_n, s, L, feats, D, dT, w, mu, Ti):
    """``mu_i += gamma D``, ``T_i += gamma dT`` and the matching ``w -= gamma phi(D, dT) / (lam n)``."""
    a = -gamma / lam_n
    add_direction(a, s, L, feats.indptr, feats.indices, feats.values, D, w.We, w.bias, w.start, w.end)
    trans = w.trans
    K = trans.shape[0]
    for p in range(K):
        for c in range(K):
            v = dT[p, c]
            if v != 0.0:
                trans[p, c] += a * v
                Ti[p, c] += gamma * v
    for t in range(L):
        for c in range(K):
            mu[s + t, c] += gamma * D[t, c]


@njit(cache=True, fastmath=True, _nrt=False)
def _avg_accumulate(i, s, L, clock, marg, avg):
    S = touch_average(True, clock, avg.last, i)
    if S != 0.0:
        mu, mu_acc, T_acc = marg.mu, avg.mu_acc, avg.T_acc
        K = mu.shape[1]
        for t in range(L):
            for c in range(K):
                mu_acc[s + t, c] += S * mu[s + t, c]
        for p in range(K):
            for c in range(K):
                T_acc[p, c] += S * marg.T[i, p, c]


@njit(cache=True, _nrt=False)
def active_set_step(kind, i, s, L, j_s, j_a, h_i, h_s, ell_i, ell_s, clock, averaging, lam, ws, feats, w, marg, avg,
                    scr):
    """A pairwise (``mu_i += gamma (e_s - e_a)``) or away (``mu_i += gamma (mu_i - e_a)``) step of block ``i`` against
    plane ``j_a`` of the :class:`~.working_set.Pool` ``ws``, clipped exact line search, ``alpha`` following;
    ``scr.ystar`` holds the FW corner (plane ``j_s``), ``h_i, h_s`` the values of ``mu_i`` and of the corner."""
    n = feats.offsets.shape[0] - 1
    lam_n = lam * n
    Ti = marg.T[i]
    D, dT, ya = scr.D, scr.dT, scr.ya
    sa = ws.start[i] + j_a
    base = ws.lab_start[i] + j_a * L
    for t in range(L):
        ya[t] = ws.plane_labels[base + t]
    alpha_a = ws.plane_values[sa, ALPHA]
    ell_a = ws.plane_values[sa, LOSS]
    h_a = ws.plane_values[sa, SCORE]
    if kind == PAIRWISE_RULE:
        num = h_s - h_a
        sqT = _general_direction(s, L, 1.0, scr.ystar, -1.0, ya, 0.0, marg.mu, Ti, D, dT)
        dl = ell_s - ell_a
    else:
        num = h_i - h_a
        sqT = _general_direction(s, L, 0.0, scr.ystar, -1.0, ya, 1.0, marg.mu, Ti, D, dT)
        dl = ell_i - ell_a
    den = (direction_sqnorm(i, L, D, feats.gram, feats.gram_off) + sqT) / (lam_n * n)
    gamma, drop = clipped_step(num, den, move_bound(kind, alpha_a))
    if gamma != 0.0:
        if averaging:
            _avg_accumulate(i, s, L, clock, marg, avg)
        commit_ell(marg.totals, marg.block_ell, i, ell_i, ell_i + gamma * dl, clock)
        _general_move(gamma, lam_n, s, L, feats, D, dT, w, marg.mu, Ti)
        if kind == PAIRWISE_RULE:
            ws_pairwise_update(ws, i, j_s, j_a, gamma, drop)
        else:
            ws_away_update(ws, i, j_a, gamma, drop)
