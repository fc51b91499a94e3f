"""The epsilon-approximate regularization path of Osokin et al. 2016 (Sec. 4, Algs. 6-7) and the grid searches it
is compared with.

**Path.**  Breakpoints ``lam_1 = lam_inf > lam_2 > ... > lam_J`` give, for every ``lam`` down to a stopping point,
weights with a certified duality gap ``<= eps``: above ``lam_inf``, ``w(lam) = psi~ / lam`` (Alg. 6; ``psi~`` the mean
joint feature of the max-loss labelings); on ``[lam_{j+1}, lam_j]``, ``w_j`` optimised at ``lam_j`` to ``kappa eps``.
Moving to ``rho lam_j`` keeps ``w`` and rescales the dual variables (Prop. 1,
:meth:`~torch_bcfw.duals.base.DualState.rescale_lam`); the gap grows as ``g_j + (1 - rho) Delta_j``, so the next
breakpoint is ``rho = 1 - (eps - g_j) / Delta_j`` (eq. 13), and when ``Delta_j <= eps - g_j`` (inverted in the paper's
Alg. 7) the path is complete.  :meth:`RegularizationPath.certificate` recomputes the gap at any ``lam``.  Losses are
constant on every piece (scaling ``w`` keeps the predictions), so model selection over the path is exact.

**Grid search** (the paper's baseline, Sec. 5.2): ``lam = 2^15 ... 2^-15`` solved in turn to gap ``<= eps``, cold or
warm (rescaled dual variables).  Both report cumulative effective passes (gap passes included) and time.

**Ctrl-C**: the cut inner solve is dropped and the finished points are returned with ``stopped_by ==
"interrupted"``; before the path's first point, ``KeyboardInterrupt`` propagates.
"""
from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from .bcfw import BCFW
from ..certificate import Certificate, certify, task_loss
from .run import run_solver, options_for
from .options import SolverOptions

__all__ = [
    "regularization_path", "grid_search", "RegularizationPath", "LambdaSweep", "SweepPoint", "default_grid",
    "path_options", "path_start", "PathStart", "breakpoint_ratio",
]


def default_grid() -> list[float]:
    """``[2^15, 2^14, ..., 2^-15]`` (31 values), the grid of Osokin et al. 2016, Sec. 5.2."""
    return [2.0 ** k for k in range(15, -16, -1)]


@dataclass
class SweepPoint:
    """One ``lam`` of a path or a grid search.

    Attributes:
        lam: the regularisation value the weights were optimised at.
        w: ``Tensor[d]`` float64 (CPU), the weights.
        dual_ell: the linear part of the dual value at ``lam`` (``D = dual_ell - lam/2 ||w||^2``).
        gap: the certified duality gap at ``lam`` (exact batch pass).
        primal: the primal value at ``lam``.
        passes: cumulative effective passes (oracle calls / n, batch gap passes included) when certified.
        time: cumulative seconds of the sweep (solver and gap passes; evaluation excluded) when certified.
        stopped_by: how the inner solve ended (``gap_tol``, ``converged``, ``init``, ``max_passes``...).
        train_loss / val_loss: mean task loss of the predictions (``None`` when not evaluated).
    """

    lam: float
    w: Tensor
    dual_ell: float
    gap: float
    primal: float
    passes: float
    time: float
    stopped_by: str = ""
    train_loss: float | None = None
    val_loss: float | None = None

    def to_dict(self, with_weights: bool = False) -> dict:
        d = {k: getattr(self, k) for k in ("lam", "dual_ell", "gap", "primal", "passes", "time", "stopped_by",
                                           "train_loss", "val_loss")}
        if with_weights:
            d["w"] = self.w.tolist()
        return d


@dataclass
class LambdaSweep:
    """A sequence of solved ``lam`` values (a grid search, or the breakpoints of a path), largest first.

    Attributes:
        kind: ``"grid-warm"``, ``"grid-cold"`` or ``"path"``.
        points: the :class:`SweepPoint` s in the order they were solved (decreasing ``lam``).
        eps: the target gap.
        n: number of training examples.
        stopped_by: why the sweep ended.
        options: the inner solver's options (dict).
        eval_time: seconds spent evaluating train / validation losses (not in the points' ``time``).
    """

    kind: str
    points: list = field(default_factory=list)
    eps: float = 0.1
    n: int = 0
    stopped_by: str = ""
    options: dict = field(default_factory=dict)
    eval_time: float = 0.0

    @property
    def lams(self) -> list[float]:
        return [p.lam for p in self.points]

    def best(self, key: str = "val_loss") -> SweepPoint:
        """The point with the lowest ``key`` (``"val_loss"`` or ``"train_loss"``); ties go to the larger ``lam``."""
        pts = [p for p in self.points if getattr(p, key) is not None]
        if not pts:
            raise ValueError(f"no point has a {key}: pass val_data (or evaluate the sweep) first")
        return min(pts, key=lambda p: getattr(p, key))

    def evaluate(self, model, data, key: str = "val_loss") -> None:
        """Record the mean task loss of every point's predictions on ``data`` under ``key``."""
        t0 = time.perf_counter()
        for p in self.points:
            setattr(p, key, task_loss(model, data, p.w.to(data.device)))
        self.eval_time += time.perf_counter() - t0

    def to_dict(self, with_weights: bool = False) -> dict:
        return {"kind": self.kind, "eps": self.eps, "n": self.n, "stopped_by": self.stopped_by,
                "options": self.options, "eval_time": self.eval_time,
                "points": [p.to_dict(with_weights) for p in self.points]}

    def save_json(self, path, with_weights: bool = False) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(with_weights), indent=1))
        return path


@dataclass
class RegularizationPath(LambdaSweep):
    """An ``eps``-approximate regularization path (see the module docstring).

    ``points[0]`` is the start ``lam_inf`` (weights ``psi~ / lam_inf``), ``points[j]`` the breakpoint
    ``lam_{j+1}`` with the weights valid on ``[lam_{j+2}, lam_{j+1}]``; the last point's weights are valid
    down to :attr:`lower_limit` (0 when the path is complete).

    Attributes (besides :class:`LambdaSweep`'s):
        kappa: the inner solver's target is ``kappa eps``.
        lower_limit: the smallest ``lam`` covered (``None`` when the last point is not certified ``<= eps``).
        predicted_gaps: for every breakpoint after the first, the gap at its ``lam`` predicted by Prop. 1 from
            the previous point before re-optimising (``g_j + (1 - rho) Delta_j``; ``<= eps`` by construction).
    """

    kappa: float = 0.9
    lower_limit: float | None = None
    predicted_gaps: list = field(default_factory=list)

    @property
    def lam_inf(self) -> float:
        return self.points[0].lam

    def _segment(self, lam: float) -> int:
        lam = float(lam)
        if not lam > 0 or not math.isfinite(lam):
            raise ValueError(f"lam must be a positive finite number, got {lam}")
        if lam >= self.points[0].lam:
            return -1
        lams = self.lams
        for j in range(1, len(lams)):
            if lam >= lams[j]:
                return j - 1
        if self.lower_limit is None or lam < self.lower_limit:
            raise ValueError(
                f"lam = {lam:g} is below the part of the path that was computed and certified "
                f"(down to {self.lower_limit if self.lower_limit is not None else lams[-1]:g}); "
                f"rerun regularization_path with a smaller lam_min"
            )
        return len(lams) - 1

    def weights_at(self, lam: float) -> Tensor:
        """The ``eps``-approximate weights at ``lam`` (``Tensor[d]``): ``(lam_inf / lam) w_1`` above ``lam_inf``,
        else the weights of the piece containing ``lam``."""
        j = self._segment(lam)
        if j < 0:
            p = self.points[0]
            return p.w * (p.lam / float(lam))
        return self.points[j].w.clone()

    def dual_ell_at(self, lam: float) -> float:
        """The linear dual part of the path's dual point at ``lam``: ``dual_ell_j lam / lam_j`` on a piece
        (Prop. 1: ``l`` scales with ``rho``; with box constraints their term scales the same way), and the
        unchanged ``dual_ell_1`` above ``lam_inf`` (the same ``alpha``, only ``A`` scales)."""
        j = self._segment(lam)
        if j < 0:
            return self.points[0].dual_ell
        p = self.points[j]
        return p.dual_ell * float(lam) / p.lam

    def certificate(self, model, data, lam: float) -> Certificate:
        """Exact primal, dual and gap at ``lam`` of the path's primal-dual pair (one oracle pass)."""
        w = self.weights_at(lam).to(data.device)
        return certify(model, data, w, self.dual_ell_at(lam), float(lam))

    def to_dict(self, with_weights: bool = False) -> dict:
        d = super().to_dict(with_weights)
        d.update(kappa=self.kappa, lower_limit=self.lower_limit, lam_inf=self.lam_inf,
                 predicted_gaps=self.predicted_gaps)
        return d


# ----------------------------------------------------------------------------------------------- drivers
def path_options(target: float, **options) -> SolverOptions:
    """The inner BCFW's options of a path or grid search, ``gap_tol = target``: no averaging (the rescaling needs the
    iterate's dual variables), ``early_gap_check = 0.8``, ``preset="gap-fw"`` unless the combination is given,
    one-block steps unless a ``batch_size`` is."""
    for k in ("gap_tol", "averaging", "check_averaged"):
        if k in options:
            raise ValueError(f"the path sets {k!r} itself (gap_tol = kappa * eps, no averaging)")
    if not any(k in options for k in ("preset", "sampling", "step_rule", "cache")):
        options["preset"] = "gap-fw"
    options.setdefault("early_gap_check", 0.8)
    options.setdefault("max_passes", 1000)
    options.setdefault("batch_size", 1)
    options.setdefault("track_train_loss", False)
    return options_for("bcfw", gap_tol=float(target), averaging=False, check_averaged=False, **options)


def _check_inputs(model, data, eps: float, kappa: float | None = None) -> None:
    model.check_data(data)
    if len(data) == 0:
        raise ValueError("the training data is empty")
    if not (isinstance(eps, (int, float)) and eps > 0 and math.isfinite(eps)):
        raise ValueError(f"eps must be a positive finite number, got {eps!r}")
    if kappa is not None and not 0 < kappa < 1:
        raise ValueError(f"kappa must lie in (0, 1), got {kappa!r}")
    own = model.loss(data, data.y)
    if bool((own.abs() > 1e-12).any()):
        raise ValueError("the regularization path needs L_i(y_i) = 0 for every example (Osokin et al. 2016, Prop. 1)")


class _Clock:
    """Cumulative effective passes and seconds of a sweep (the inner solvers' counters plus extra work)."""

    def __init__(self, n: int):
        self.n = n
        self.oracle = 0
        self.seconds = 0.0

    @property
    def passes(self) -> float:
        return self.oracle / self.n


def _solve(model, data, lam, opts, state, clock: _Clock, budget_end, bounds, block_gaps=None, callbacks=()):
    """Run BCFW at ``lam`` on ``state`` to ``opts.gap_tol``; returns ``(alg, record, stopped_by)``
    (``stopped_by == "interrupted"``: cut by Ctrl-C, the record may be older than the state)."""
    if budget_end is not None:
        left = budget_end - time.perf_counter()
        if left <= 0:
            return None, None, "time_budget"
        opts = dataclasses.replace(opts, time_budget=left)
    alg = BCFW(model, data, lam, opts, state=state, bounds=bounds)
    if block_gaps is not None and alg.estimates is not None:
        alg.set_exact_block_gaps(block_gaps)
    counters: dict = {}
    out = run_solver(alg, opts, callbacks=callbacks or (), counters=counters)
    clock.oracle += alg.oracle_calls + counters["gap_oracle_calls"]
    clock.seconds += counters["solver_time"] + counters["gap_time"]
    return alg, (out.history[-1] if out.history else None), out.stopped_by


def _point(lam, state, rec, clock, stopped_by) -> SweepPoint:
    """The breakpoint of the state's ``w``; ``rec``: its check's record, or the initial point's ``Certificate``."""
    gap = rec.gap if isinstance(rec, Certificate) else rec.gap_last
    return SweepPoint(lam=float(lam), w=state.w.detach().cpu().clone(), dual_ell=state.dual_ell(), gap=float(gap),
                      primal=float(rec.primal), passes=clock.passes, time=clock.seconds, stopped_by=stopped_by)


def _predicted_block_gaps(alg, rho: float):
    """Exact block gaps after rescaling by ``rho`` (``rho g_i + (1 - rho) H_i / n``, Prop. 1 per block) from the last
    exact gap pass of ``alg``; ``None`` when it kept none."""
    eg = getattr(alg, "exact_block_gaps", None) if alg is not None else None
    if eg is None:
        return None
    g, H = eg
    return (rho * g + (1.0 - rho) * H / alg.n).clamp_min(0.0).detach().cpu().numpy()


def breakpoint_ratio(gap: float, delta: float, eps: float) -> float | None:
    """Eq. (13) of Osokin et al. 2016 (with Alg. 7's test the right way round): the ratio ``rho = lam_next / lam``
    at which a point of gap ``gap`` and gap growth ``delta`` (:meth:`~torch_bcfw.duals.base.DualState.path_delta`)
    reaches ``eps``, ``1 - (eps - gap) / delta``; ``None`` when ``delta <= eps - gap``: the point is
    ``eps``-approximate for every smaller ``lam`` and the path is complete."""
    tau = eps - gap
    if delta <= tau:
        return None
    return 1.0 - tau / delta


@dataclass
class PathStart:
    """The start of a path (Alg. 6): ``lam = lam_inf``, the dual state there (``alpha_i = e_{y~_i}``, ``y~_i`` the
    max-loss labelings) and the BCFW :attr:`algorithm` bound to it, the exact :attr:`certificate` of that point
    (its gap is ``<= kappa eps`` without box constraints) and the work it took (``3 n`` oracle calls, seconds)."""

    lam: float
    state: object
    algorithm: BCFW
    certificate: Certificate
    oracle_calls: int
    seconds: float


def path_start(model, data, eps: float, kappa: float, options: SolverOptions, bounds=None) -> PathStart:
    """Alg. 6 of Osokin et al. 2016: ``lam_inf`` and its dual point, certified (one exact gap pass); ``options``
    (e.g. :func:`path_options`) configure the returned algorithm.  Shared by :func:`regularization_path` and
    variants of it (the benchmarks' heuristic path)."""
    _check_inputs(model, data, eps, kappa)
    n = len(data)
    t0 = time.perf_counter()
    w0 = torch.zeros(model.n_features, dtype=torch.float64, device=data.device)
    y_tilde = model.oracle(w0, data, loss_augmented=True)
    psi_t = (model.joint_feature_sum(data, data.y) - model.joint_feature_sum(data, y_tilde)).to(torch.float64) / n
    y_hat = model.decode(psi_t, data)
    theta = model.score(psi_t, data, y_hat) - model.score(psi_t, data, data.y)
    lam_inf = (float(psi_t @ psi_t) + float(theta.clamp_min(0.0).mean())) / (kappa * eps)
    if not lam_inf > 0:
        raise ValueError("every labeling has zero loss: the problem is trivial (lam_inf = 0)")
    state = model.dual_state(data, lam_inf)
    alg = BCFW(model, data, lam_inf, options, state=state, bounds=bounds)  # sets bounds, working set
    state.set_corners(y_tilde)
    cert = alg.certificate()
    return PathStart(lam=lam_inf, state=state, algorithm=alg, certificate=cert, oracle_calls=3 * n,
                     seconds=time.perf_counter() - t0)


def regularization_path(
    model, data, *, eps: float = 0.1, kappa: float = 0.9, lam_min: float = 1e-5, val_data=None,
    track_train_loss: bool = True, time_budget: float | None = None, max_breakpoints: int | None = None,
    bounds=None, progress: bool = False, callbacks=None, **options,
) -> RegularizationPath:
    """The ``eps``-approximate regularization path from ``lam_inf`` down to ``lam_min`` (see the module docstring).

    Args:
        model, data: the structured model and its training data (``L_i(y_i) = 0`` is required).
        eps: the gap every ``lam`` of the path is certified to (default 0.1, the paper's experiments).
        kappa: each breakpoint is optimised to ``kappa eps`` (default 0.9, the paper's choice).
        lam_min: stop at this ``lam`` (default 1e-5, the authors' code); the last breakpoint is ``lam_min``
            itself unless the path completes above it.
        val_data: labelled data whose task loss is recorded at every breakpoint (model selection).
        track_train_loss: also record the training loss at every breakpoint (default True).
        time_budget: seconds for the whole path; the path computed so far is returned (``stopped_by``).
        max_breakpoints: stop after this many breakpoints.
        bounds: box constraints on the weights (default: the model's).
        progress: print one line per breakpoint.
        callbacks: :class:`~torch_bcfw.solvers.callbacks.Callback` s of every inner solve.
        **options: the inner BCFW's :class:`SolverOptions` (``preset``, ``max_passes`` per breakpoint, default
            1000, ``gap_check``, ``seed``...).  ``gap_tol`` and averaging are set by the path.
    """
    _check_inputs(model, data, eps, kappa)
    if not lam_min > 0:
        raise ValueError(f"lam_min must be > 0, got {lam_min}")
    opts = path_options(kappa * eps, **options)
    n = len(data)
    clock = _Clock(n)
    budget_end = None if time_budget is None else time.perf_counter() + float(time_budget)

    # ---- Alg. 6: the start lam_inf, alpha_i = e_{y~_i}
    start = path_start(model, data, eps, kappa, opts, bounds)
    clock.oracle += start.oracle_calls
    clock.seconds += start.seconds
    state, init_alg, cert, lam_inf = start.state, start.algorithm, start.certificate, start.lam
    path = RegularizationPath(kind="path", eps=float(eps), n=n, options=opts.to_dict(), kappa=float(kappa))
    alg = init_alg
    rec = cert
    stopped = "init"
    lam = lam_inf
    if cert.gap > kappa * eps:  # box constraints can break the bound of Alg. 6: optimise at lam_inf
        alg, rec, stopped = _solve(model, data, lam, opts, state, clock, budget_end, bounds, callbacks=callbacks)
        if stopped == "interrupted":  # no point of the path is finished
            raise KeyboardInterrupt("regularization path interrupted before its first breakpoint was certified")
        if alg is None:
            alg, rec = init_alg, cert
    path.points.append(_point(lam, state, rec, clock, stopped))

    # ---- Alg. 7: rescale to the next breakpoint, re-optimise to kappa eps
    path.stopped_by = ""
    try:
        while True:
            last = path.points[-1]
            if last.stopped_by not in ("init", "gap_tol", "converged"):
                path.stopped_by = last.stopped_by
                break
            delta = state.path_delta()
            if progress:
                print(f"[path] lam {lam:.4g}  gap {last.gap:.3g}  passes {clock.passes:.1f}  time {clock.seconds:.1f}s  "
                      f"breakpoints {len(path.points)}", flush=True)
            rho = breakpoint_ratio(last.gap, delta, eps)
            if rho is None:
                path.lower_limit = 0.0
                path.stopped_by = "complete"
                break
            lam_next = rho * lam
            if lam <= lam_min:
                path.stopped_by = "lam_min"
            elif max_breakpoints is not None and len(path.points) >= max_breakpoints:
                path.stopped_by = "max_breakpoints"
            elif budget_end is not None and time.perf_counter() >= budget_end:
                path.stopped_by = "time_budget"
            if path.stopped_by:
                path.lower_limit = lam_next
                break
            if lam_next < lam_min:
                lam_next, rho = lam_min, lam_min / lam
            gaps_next = _predicted_block_gaps(alg, rho)
            state.rescale_lam(lam_next)
            path.predicted_gaps.append(last.gap + (1.0 - rho) * delta)
            lam = lam_next
            new_alg, rec, stopped = _solve(model, data, lam, opts, state, clock, budget_end, bounds, gaps_next,
                                           callbacks=callbacks)
            if new_alg is None or stopped == "interrupted":
                # out of time before solving, or the solve was cut by Ctrl-C (dropped): the previous point,
                # rescaled to lam, is certified <= eps there (Prop. 1), not kappa eps
                path.lower_limit = lam
                path.stopped_by = stopped
                path.predicted_gaps.pop()
                break
            alg = new_alg
            path.points.append(_point(lam, state, rec, clock, stopped))
    except KeyboardInterrupt:  # Ctrl-C outside an inner solve: keep the finished points
        path.stopped_by = "interrupted"
        path.lower_limit = None  # set below from the last point's own certificate
        del path.predicted_gaps[len(path.points) - 1:]
    if path.lower_limit is None and path.points[-1].gap <= eps:
        path.lower_limit = path.points[-1].lam
    _evaluate(path, model, data, val_data, track_train_loss)
    return path


def grid_search(
    model, data, lams=None, *, eps: float = 0.1, warm_start: bool = True, val_data=None,
    track_train_loss: bool = True, time_budget: float | None = None, bounds=None, progress: bool = False,
    callbacks=None, **options,
) -> LambdaSweep:
    """Solve every ``lam`` of a grid (default :func:`default_grid`, solved largest first) to a gap ``<= eps``.

    ``warm_start=True`` keeps ``w`` from the previous ``lam`` and rescales the dual variables (Prop. 1, the
    paper's warm start); ``False`` starts every ``lam`` from ``alpha_i = e_{y_i}``.  Other arguments as in
    :func:`regularization_path`.
    """
    _check_inputs(model, data, eps)
    grid = sorted((float(v) for v in (default_grid() if lams is None else lams)), reverse=True)
    if not grid or any(not (v > 0 and math.isfinite(v)) for v in grid):
        raise ValueError(f"lams must be a non-empty list of positive finite values, got {lams!r}")
    opts = path_options(eps, **options)
    n = len(data)
    clock = _Clock(n)
    budget_end = None if time_budget is None else time.perf_counter() + float(time_budget)
    sweep = LambdaSweep(kind="grid-warm" if warm_start else "grid-cold", eps=float(eps), n=n, options=opts.to_dict())
    state, alg = None, None
    try:
        for lam in grid:
            gaps = None
            if warm_start and state is not None:
                rho = lam / state.lam
                gaps = _predicted_block_gaps(alg, rho)
                state.rescale_lam(lam)
            else:
                state = model.dual_state(data, lam)
            new_alg, rec, stopped = _solve(model, data, lam, opts, state, clock, budget_end, bounds, gaps,
                                           callbacks=callbacks)
            if new_alg is None or stopped == "interrupted":  # out of time, or the cut solve is dropped
                sweep.stopped_by = stopped
                break
            alg = new_alg
            sweep.points.append(_point(lam, state, rec, clock, stopped))
            if progress:
                print(f"[{sweep.kind}] lam {lam:.4g}  gap {sweep.points[-1].gap:.3g}  passes {clock.passes:.1f}  "
                      f"time {clock.seconds:.1f}s", flush=True)
            if stopped not in ("gap_tol", "converged"):
                sweep.stopped_by = stopped
                break
        else:
            sweep.stopped_by = "grid_done"
    except KeyboardInterrupt:  # Ctrl-C outside an inner solve: keep the finished points
        sweep.stopped_by = "interrupted"
    _evaluate(sweep, model, data, val_data, track_train_loss)
    return sweep


def _evaluate(sweep: LambdaSweep, model, data, val_data, track_train_loss: bool) -> None:
    if track_train_loss:
        sweep.evaluate(model, data, "train_loss")
    if val_data is not None:
        model.check_data(val_data)
        sweep.evaluate(model, val_data, "val_loss")


def plot_sweep(sweeps: dict, path, title: str | None = None) -> Path:
    """PNG of training and validation loss against ``lam`` (log scale) for ``{label: LambdaSweep}``; a path's
    breakpoints are marked (its losses are constant between breakpoints: drawn as steps), grids as points."""
    from ..plotting import pyplot, save_figure, style_axes

    fig, ax = pyplot().subplots(figsize=(8, 4.5))
    for j, (label, sw) in enumerate(sweeps.items()):
        color = f"C{j % 10}"
        lams = np.array(sw.lams)
        for key, style in (("train_loss", "--"), ("val_loss", "-")):
            vals = [getattr(p, key) for p in sw.points]
            if any(v is None for v in vals) or not vals:
                continue
            name = f"{label} {key.replace('_loss', '')}"
            if isinstance(sw, RegularizationPath):
                lo = sw.lower_limit if sw.lower_limit else lams[-1] / 2
                xs = np.concatenate([[lams[0] * 4], lams, [max(lo, 1e-300)]])
                ys = np.concatenate([[vals[0]], vals, [vals[-1]]])
                ax.step(xs, ys, where="post", linestyle=style, color=color, label=name)
                ax.plot(lams, vals, "|", color=color, markersize=9)
            else:
                ax.plot(lams, vals, style, marker="o", markersize=3, color=color, label=name)
        if isinstance(sw, RegularizationPath) and any(p.val_loss is not None for p in sw.points):
            b = sw.best()
            ax.axvline(b.lam, color=color, alpha=0.3)
    style_axes([ax], ["lambda"], ylabel="task loss", log="x")
    if title:
        ax.set_title(title)
    return save_figure(fig, path)
