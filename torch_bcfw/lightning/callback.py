"""``BCFWCallback``: solve the structured head of a LightningModule with BCFW on the current features."""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import inspect
import math
import signal
import time

import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info

from ..checks import check_bool, check_index_tensor, check_lam
from ..data.base import StructuredData
from ..data.sequences import MulticlassData, SequenceData
from ..duals.rebind import rebindable_state, rebound_state
from ..models.chain import Chain
from ..head_optimizer import BCFWHeadOptimizer
from ..nn import StructuredHead, StructuredHingeLoss
from ..runtime.signals import deferred_signals
from ..solvers.record import CheckRecord, as_records, plain_history
from ..head_solve import HeadSolve
from ..planning import continued_strategy, plan_run
from ..solvers.run import DUAL_STATE_SOLVERS, check_option_names, options_for

__all__ = ["BCFWCallback", "collect_features"]


def ddp_context(trainer):
    """The process group of a multi-process Lightning run (DDP), or ``None``."""
    if trainer is None or trainer.world_size <= 1:
        return None
    from ..distributed import current_context

    return current_context()


def checkpoint_safe(obj):
    """Checkpoint-safe copy: numpy arrays / scalars become lists / Python numbers (loads with weights_only=True)."""
    if isinstance(obj, dict):
        return {k: checkpoint_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(checkpoint_safe(v) for v in obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu().clone()
    return obj


def check_solver_device(device) -> None:
    """``ValueError`` (one line) for a solver device this machine does not have (``"cuda"`` without CUDA) or a
    string torch does not read as a device; ``None`` (the module's device) passes."""
    if device is None:
        return
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"BCFWCallback: device={device!r} is not a torch device ({exc})") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"BCFWCallback: device={device!r} but CUDA is not available on this machine; use "
                         "device='cpu' (the default: the compiled chain kernel) or None (the module's device)")


def container_hint(model, data) -> str:
    """What a head's model needs from ``bcfw_features`` when it got the wrong container (``""`` otherwise)."""
    if isinstance(model, Chain) and isinstance(data, MulticlassData):
        return ("; a chain head needs per-token features with the sequence boundaries: return (x [N_tok, F], "
                "y [N_tok], offsets [n + 1]) (packed tokens, offsets of the sequences) or a SequenceData, not "
                "(x, y), which is one example per row")
    return ""


def find_protocol_method(trainer, pl_module, name: str):
    """The method ``name`` of the feature protocol on the LightningModule, else on its datamodule, else ``None``."""
    for owner in (pl_module, None if trainer is None else trainer.datamodule):
        if callable(getattr(owner, name, None)):
            return getattr(owner, name)
    return None


def as_structured_data(out) -> StructuredData:
    """The output of ``bcfw_features(batch)`` as a data container: a :class:`~torch_bcfw.data.base.StructuredData`
    container as it is, ``(x, y)`` (one row per example) as a :class:`~torch_bcfw.data.sequences.MulticlassData`,
    ``(x, y, offsets)`` (packed sequences) as a :class:`~torch_bcfw.data.sequences.SequenceData`.  Raises ``TypeError``
    for anything else and ``ValueError`` for a container without labels."""
    if isinstance(out, (tuple, list)) and len(out) in (2, 3):
        if out[1] is None:
            raise ValueError("bcfw_features must return the labels of the training examples")
        x, y = out[0].detach(), check_index_tensor(out[1].detach(), "bcfw_features labels").to(out[0].device)
        if len(out) == 2:
            out = MulticlassData(x, y)
        else:
            out = SequenceData(x, y, check_index_tensor(torch.as_tensor(out[2]).detach(), "bcfw_features offsets"))
    elif not isinstance(out, StructuredData):
        raise TypeError("bcfw_features(batch) must return a data container (SequenceData, MulticlassData, GraphData, "
                        f"PoseData, MatchingData, ...), (x, y) or (x, y, offsets); got {type(out).__name__}")
    if out.y is None:
        raise ValueError("bcfw_features must return the labels of the training examples")
    return out


def collect_features(pl_module, batches, device="cpu", to_device=None, ctx=None) -> StructuredData:
    """Run ``pl_module.bcfw_features`` over ``batches`` in eval mode without gradient; concatenate.

    ``bcfw_features(batch)`` returns a data container or ``(x, y)`` / ``(x, y, offsets)``
    (:func:`as_structured_data`); every batch must give the same container type.  The result (``type(part).cat``
    of the parts) is on ``device`` with float64 features; ``to_device`` moves each batch first.  The train/eval
    mode of every submodule is restored afterwards.

    ``ctx``: a process group (:class:`~torch_bcfw.distributed.DistributedContext`, e.g. Lightning's DDP) whose
    ranks all pass the same ``batches``: rank ``r`` computes the features of batches ``r, r + P, r + 2P, ...`` only,
    and the parts are gathered, so that every rank returns the same data as one process computing them all.
    """
    modes = [(m, m.training) for m in pl_module.modules()]
    pl_module.eval()
    parts, seen = [], 0
    try:
        with torch.no_grad():
            for i, batch in enumerate(batches):
                seen += 1
                if ctx is not None and i % ctx.world_size != ctx.rank:
                    continue
                if to_device is not None:
                    batch = to_device(batch)
                parts.append(as_structured_data(pl_module.bcfw_features(batch)).to(device, torch.float64))
    finally:
        for m, mode in modes:
            m.training = mode
    if not seen:
        raise ValueError("bcfw_dataloader yielded no batch")
    if ctx is not None:
        parts = _gathered_parts(parts, ctx, device)
    kinds = sorted({type(p).__name__ for p in parts})
    if len(kinds) != 1:
        raise TypeError(f"bcfw_features returned different containers for different batches: {kinds}")
    return type(parts[0]).cat(parts)


def _gathered_parts(mine: list, ctx, device) -> list:
    """Every rank's parts (rank ``r`` holds those of positions ``r, r + P, ...``) on every rank, in position order,
    on ``device``."""
    from ..distributed import collective

    per_rank = [None] * ctx.world_size
    with collective("BCFWCallback feature gather", ctx):
        torch.distributed.all_gather_object(per_rank, [p.to("cpu") for p in mine])
    total = sum(len(parts) for parts in per_rank)
    return [per_rank[i % ctx.world_size][i // ctx.world_size].to(device) for i in range(total)]


class BCFWCallback(Callback):
    """Solve the linear structured head of a LightningModule with BCFW every ``every_n_epochs`` epochs.

    At the end of every ``every_n_epochs``-th training epoch (before the end-of-epoch validation, so that
    it decodes with the fresh head; and once before the first epoch, ``initial_passes``) the callback

    1. computes the training features with the module in eval mode and without gradient
       (the *feature protocol* below),
    2. re-binds its dual state to these features (:meth:`~torch_bcfw.duals.base.DualState.from_state_dict`),
    3. runs ``passes_per_call`` effective passes of BCFW (or batch FW) from there, ends with an exact
       duality-gap check, writes the certified model (the last or the averaged iterate, whichever has
       the lower primal) into the head, and
    4. logs ``{log_prefix}/gap`` (certified gap of the head's weights at the current features),
       ``/primal``, ``/dual``, ``/oracle_calls``, ``/passes`` (cumulative), ``/stale`` (``max |w_new -
       w_old|`` removed by the rebind) and ``/train_loss`` through ``pl_module.log``.

    **Feature protocol** (the LightningModule, or its datamodule, provides):

    * ``bcfw_dataloader()`` -- an iterable over *all* training examples in a fixed order (no shuffling,
      no dropped batches), the same examples on every call;
    * ``bcfw_features(batch)`` (on the LightningModule) -- the head's input for one batch, with labels: any
      data container of the head's model (:class:`~torch_bcfw.data.base.StructuredData`), or ``(x, y)`` /
      ``(x, y, offsets)`` (one row per example / packed tokens).  Batches are moved to the module's device first;
      the callback joins them with the container's ``cat`` and solves on float64 features.

    **DDP.**  Under a multi-process Trainer every rank computes the features of its share of the batches and the
    parts are gathered (:func:`collect_features`); the solve then replicates, splits each round's oracle calls over
    the ranks, or shards the rounds, as the option ``strategy`` says (``"auto"``, the default: the first solve
    calibrates with :func:`~torch_bcfw.planning.choose_strategy`, :attr:`strategy` keeps the choice).
    One head, identical on every rank.

    **Ctrl-C.**  An interrupted solve is discarded whole and the ``KeyboardInterrupt`` raised again (ending the
    training); the head, :attr:`history`, :attr:`last_record`, the dual state and the counters stay those of the
    last *finished* call, whose write is done with Ctrl-C held back; :attr:`interrupted` is set.

    **Warm starting.**  The dual variables are warm-started, not the weights: ``w`` is re-derived as ``A(x) alpha``
    from the new features (the averaged iterate likewise), so the logged gap is the exact duality gap of the
    *current* problem (see ``docs/lightning.md``).

    **Choosing ``lam`` on held-out data** (``lam_choice``, :class:`~torch_bcfw.lightning.lam_choice.LamChoice`): at
    every call the candidate ``lam`` values are solved warm from their own previous states and the one with the
    lowest task loss on held-out examples is continued and written; the record and the logs add ``lam`` and
    ``val_loss``.  Under DDP the solves then replicate.

    Args:
        lam: regularisation ``lam > 0`` of the SSVM on the head (not with ``lam_choice``).
        head_attr: attribute of the LightningModule holding the :class:`~torch_bcfw.nn.StructuredHead`.
        every_n_epochs: solve after every ``k``-th training epoch.
        passes_per_call: effective passes of the solver per call.
        initial_passes: passes of the solve before the first training epoch (on the initial features;
            ``0``: none; default ``passes_per_call``).  Skipped when resuming from a checkpoint.
        solver: ``"bcfw"`` (default), ``"fw"`` (batch Frank-Wolfe) or ``"mp-bcfw"`` (multi-plane BCFW; its
            working sets survive the rebind, its averages restart at every call).
        device: where the features go (``"cpu"``, default, the compiled chain kernel; ``None``: the module's
            device).  On a GPU the first solve moves them to the CPU when block steps are measured cheaper there, and
            later solves follow (:func:`~torch_bcfw.planning.plan_run`).  A CUDA device on a machine without CUDA
            raises ``ValueError`` here.
        log_prefix: prefix of the logged names; give every instance its own.
        name: distinguishes several instances in one Trainer (part of :attr:`state_key`; default:
            ``head_attr``).
        verbose: print one line per call.
        save_dual_state: keep the dual state (and the solver's sampler state) in Lightning checkpoints (default
            True: a resumed ``trainer.fit`` continues the head's solve exactly).  ``False``: only the history and
            counters are kept, and a resumed run re-solves the head from a fresh dual state at its next call.
        solver_options: the solver's options by name, as ``fit`` takes them (``step``, ``sampling``, ``gap_tol``,
            ``seed``, ``mp_max_planes`` ...: :func:`~torch_bcfw.solvers.run.option_defaults`), for a YAML config;
            also accepted as keyword arguments.  ``max_passes`` is ``passes_per_call``.
        lam_choice: a :class:`~torch_bcfw.lightning.lam_choice.LamChoice`: ``lam`` chosen on held-out data at every
            call instead of a fixed ``lam``.
        mode: ``"epoch"`` (default): the head moves only at the solves; ``"step"``: besides the solves, after every
            training step a :class:`~torch_bcfw.head_optimizer.BCFWHeadOptimizer` takes one BCFW block step per example
            of the batch with the decodings of the module's :class:`~torch_bcfw.nn.StructuredHingeLoss` of this head
            (a step whose hinge did not run is skipped); the batch's example ids (positions in ``bcfw_dataloader``'s
            order) come from ``bcfw_example_ids(batch)`` of the module or its datamodule.  Fixed ``lam``, solver
            ``"bcfw"``, one process.
    """

    def __init__(self, lam: float | None = None, head_attr: str = "head", every_n_epochs: int = 1, passes_per_call: float = 5.0,
                 initial_passes: float | None = None, solver: str = "bcfw", device: str | None = "cpu",
                 log_prefix: str = "ssvm", name: str | None = None, verbose: bool = False,
                 save_dual_state: bool = True, solver_options: dict | None = None, lam_choice=None,
                 mode: str = "epoch", **options):
        super().__init__()
        if mode not in ("epoch", "step"):
            raise ValueError(f"BCFWCallback: mode must be 'epoch' or 'step', got {mode!r}")
        if mode == "step" and (lam_choice is not None or solver != "bcfw"):
            raise ValueError("BCFWCallback(mode='step') takes a fixed lam and solver='bcfw'")
        self.mode = mode
        if (lam is None) == (lam_choice is None):
            raise ValueError("BCFWCallback needs exactly one of lam (fixed) or lam_choice (chosen on held-out data)")
        self.lam_choice = lam_choice
        self.lam = check_lam(lam) if lam is not None else lam_choice.lams[0]
        if solver not in DUAL_STATE_SOLVERS:
            raise ValueError(f"unknown solver {solver!r} for BCFWCallback; choose from {sorted(DUAL_STATE_SOLVERS)}")
        if int(every_n_epochs) < 1:
            raise ValueError(f"every_n_epochs must be >= 1, got {every_n_epochs}")
        if not passes_per_call > 0:
            raise ValueError(f"passes_per_call must be > 0, got {passes_per_call}")
        initial_passes = passes_per_call if initial_passes is None else initial_passes
        if initial_passes < 0:
            raise ValueError(f"initial_passes must be >= 0, got {initial_passes}")
        opts = dict(solver_options or {})
        dup = sorted(set(opts) & set(options))
        if dup:
            raise ValueError(f"solver option(s) {dup} given both in solver_options and as keywords")
        opts.update(options)
        for bad, use in self._SET_BY_CALLBACK.items():
            if bad in opts:
                raise ValueError(f"BCFWCallback sets {bad!r} itself; use {use!r}")
        opts.setdefault("gap_check", max(1, math.ceil(passes_per_call)))
        own = [n for n in inspect.signature(type(self).__init__).parameters if n not in ("self", "options")]
        check_option_names(solver, opts, arguments=own, taken=self._SET_BY_CALLBACK, who="BCFWCallback")
        check_solver_device(device)
        self.options = options_for(solver, max_passes=passes_per_call, **opts)  # another solver's option: TypeError
        if lam_choice is not None and self.options.strategy not in ("auto", "replicate"):
            raise ValueError(f"BCFWCallback: with lam_choice the solves replicate under DDP; strategy "
                             f"{self.options.strategy!r} is not available")
        if initial_passes:
            options_for(solver, **{**self.options.to_dict(), "max_passes": initial_passes})
        self.head_attr = str(head_attr)
        self.every_n_epochs = int(every_n_epochs)
        self.passes_per_call = float(passes_per_call)
        self.initial_passes = float(initial_passes)
        self.solver = solver
        self.device = device
        self.log_prefix = str(log_prefix)
        self.name = str(name) if name is not None else self.head_attr
        self.verbose = bool(verbose)
        self.save_dual_state = check_bool(save_dual_state, "save_dual_state")
        self._reset()

    #: solver options the callback sets itself, and the argument that sets each
    _SET_BY_CALLBACK = {"max_passes": "passes_per_call", "progress": "verbose"}

    def _compile_notice(self, trainer):
        """Around the first solve: announce (rank 0) when numba starts compiling the kernels (20-60 s, once; cached
        on disk afterwards), so that the first epoch does not look hung."""
        if self.calls or (trainer is not None and not trainer.is_global_zero):
            return contextlib.nullcontext()
        from ..compilation import CompileTimer

        return CompileTimer(announce=lambda notice: rank_zero_info(f"[{self.log_prefix}] {notice}"))

    def _reset(self) -> None:
        self.dual_sd = None  # dual state dict after the last call (CPU tensors)
        self.dual_trust = None  # what certifies in dual_sd when this process computed it (DualState.trust_marks)
        self.alg_sd = None  # sampler / iteration and oracle counters
        self.counters = {}
        self.history = []  # the CheckRecord of every call's final check (with extra "epoch", "stale", ...)
        self.calls = 0
        self.solved_epoch = None  # the epoch whose end-of-epoch solve is done
        self.last_record = None
        self.last_data = None
        self.interrupted = False  # a solve was cut by Ctrl-C (and discarded)
        self._state_type = None  # the class of the dual state (rebindable_state's choice for the head's model)
        self.shards = None  # under DDP, sharded: (dual state, solver state) of every rank, in rank order
        self.strategy = None  # under DDP: "replicate", "split-oracle" or "shard", decided by the first solve
        self.round_size = None  # the round size the first solve planned (batch_size="auto": the calibration's, ...)
        self.solve_device = None  # the device the first solve planned (placement_* counters: measured)
        self.calibration = {}  # the figures behind the first solve's choices (placement_* and calibration_* counters)
        self.head_optimizer = None  # mode="step": the BCFWHeadOptimizer since the last solve (built at the next step)
        self.optimizer_sd = None  # mode="step": a checkpoint's head optimizer state, loaded when it is built

    @property
    def state_key(self) -> str:
        return self._generate_state_key(name=self.name, log_prefix=self.log_prefix)

    def _head(self, pl_module) -> StructuredHead:
        head = getattr(pl_module, self.head_attr, None)
        if not isinstance(head, StructuredHead):
            found = "nothing" if head is None else type(head).__name__
            raise ValueError(
                f"BCFWCallback: {type(pl_module).__name__} has no StructuredHead attribute {self.head_attr!r} "
                f"(found {found}); set head_attr to the attribute holding the torch_bcfw.nn.StructuredHead"
            )
        return head

    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage != "fit":
            return
        self._head(pl_module)
        if self.mode == "step" and trainer is not None and trainer.world_size > 1:
            raise ValueError("BCFWCallback(mode='step') runs in one process (each rank would step other blocks of "
                             "one head); use mode='epoch' under DDP")
        if not callable(getattr(pl_module, "bcfw_features", None)):
            raise ValueError(f"BCFWCallback: {type(pl_module).__name__} must define bcfw_features(batch) "
                             "(the head's input for one batch)")
        if find_protocol_method(trainer, pl_module, "bcfw_dataloader") is None:
            raise ValueError(f"BCFWCallback: neither {type(pl_module).__name__} nor its datamodule defines "
                             "bcfw_dataloader() (all training examples in a fixed order)")
        if self.lam_choice is not None and self.lam_choice.holdout is None:
            held_out = find_protocol_method(trainer, pl_module, "bcfw_val_dataloader")
            if held_out is None:
                raise ValueError(f"BCFWCallback(lam_choice=...): neither {type(pl_module).__name__} nor its datamodule "
                                 "defines bcfw_val_dataloader() (the held-out examples); give the datamodule a "
                                 "validation split or use LamChoice(holdout=<fraction>)")
            held_out()  # a datamodule without a validation split says so now, before training
        mine = [c for c in trainer.callbacks if isinstance(c, BCFWCallback)]
        keys = [c.state_key for c in mine]
        prefixes = [c.log_prefix for c in mine]
        if len(set(keys)) != len(keys) or len(set(prefixes)) != len(prefixes):
            raise ValueError("several BCFWCallbacks in one Trainer need distinct `name`s and `log_prefix`es "
                             f"(got names {[c.name for c in mine]}, prefixes {prefixes})")

    def on_train_start(self, trainer, pl_module) -> None:
        if self.calls == 0 and self.initial_passes > 0:
            self.solve(trainer, pl_module, self.initial_passes, log=False)

    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        # the end-of-epoch validation runs before on_train_epoch_end: solve first, so that it decodes with
        # the head solved on the features it evaluates (the backbone does not change in between)
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        if trainer.fit_loop.epoch_loop.batch_progress.is_last_batch:  # not a validation in the middle of an epoch
            self._solve_if_due(trainer, pl_module)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self._solve_if_due(trainer, pl_module)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.mode == "step":
            self._take_decoding(pl_module)  # forget a decoding of another batch (a validation step's)

    @torch.no_grad()
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.mode != "step":
            return
        decoding = self._take_decoding(pl_module)
        if decoding is None:  # the structured hinge did not run in this step (a warm-up)
            return
        example_ids = find_protocol_method(trainer, pl_module, "bcfw_example_ids")
        if example_ids is None:
            raise ValueError(f"BCFWCallback(mode='step'): neither {type(pl_module).__name__} nor its datamodule "
                             "defines bcfw_example_ids(batch) (the positions of the batch's examples in "
                             "bcfw_dataloader's order)")
        if self.head_optimizer is None:
            data = self.last_data if self.last_data is not None else self.training_data(trainer, pl_module)
            self.head_optimizer = BCFWHeadOptimizer(self._head(pl_module), data, self.lam, self.dual_sd)
            if self.optimizer_sd is not None:
                self.head_optimizer.load_state_dict(self.optimizer_sd)
                self.optimizer_sd = None
        self.head_optimizer.step(example_ids(batch), decoding)

    def _take_decoding(self, pl_module):
        """The last :class:`~torch_bcfw.nn.HingeDecoding` of the module's structured hinge of this head (``None``:
        none since the last call), cleared."""
        head = self._head(pl_module)
        losses = [m for m in pl_module.modules() if isinstance(m, StructuredHingeLoss) and m.head[0] is head]
        if not losses:
            raise ValueError(f"BCFWCallback(mode='step'): {type(pl_module).__name__} has no StructuredHingeLoss of "
                             f"head {self.head_attr!r} among its submodules (its decodings are the block steps' oracle)")
        scaled = [m.scale for m in losses if m.scale != 1.0]
        if scaled:
            raise ValueError(f"BCFWCallback(mode='step'): the structured hinge scores at {scaled[0]:g} * w, so its "
                             "decodings are not the BCFW oracle's answers at the head's w; use scale=1 with mode='step'")
        found = [m.last_decoding for m in losses if m.last_decoding is not None]
        for m in losses:
            m.last_decoding = None
        if len(found) > 1:
            raise ValueError("BCFWCallback(mode='step'): several structured hinges of the head ran in one step")
        return found[0] if found else None

    def _solve_if_due(self, trainer, pl_module) -> None:
        if (trainer.current_epoch + 1) % self.every_n_epochs == 0 and self.solved_epoch != trainer.current_epoch:
            self.solve(trainer, pl_module, self.passes_per_call, log=True)
            self.solved_epoch = trainer.current_epoch

    def training_data(self, trainer, pl_module, loader: str = "bcfw_dataloader") -> StructuredData:
        """The examples of the feature protocol's ``loader`` (the training data; ``"bcfw_val_dataloader"``: the held-out
        data), float64 features on the solver's device; under DDP each rank computes the features of its share of the
        batches and every rank gets all of them (:func:`collect_features` with the process group)."""
        batches = find_protocol_method(trainer, pl_module, loader)
        if batches is None:
            raise ValueError(f"BCFWCallback: neither {type(pl_module).__name__} nor its datamodule defines {loader}()"
                             + ("; or give LamChoice(holdout=<fraction>)" if loader == "bcfw_val_dataloader" else ""))
        device = self.solve_device or self.device or pl_module.device
        to_device = trainer.strategy.batch_to_device if trainer is not None else None
        data = collect_features(pl_module, batches(), device=device, to_device=to_device, ctx=ddp_context(trainer))
        model = self._head(pl_module).model
        try:
            model.check_data(data)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"BCFWCallback: the data from bcfw_features does not fit head {self.head_attr!r} "
                            f"({type(model).__name__}): {exc}{container_hint(model, data)}") from exc
        return data

    def _dual_state(self, model, data, lam: float, saved: dict | None, n_total=None):
        """A new dual state for the head's model, or the ``saved`` state dict re-bound to ``data``."""
        if saved is None or self._state_type is None:
            state = rebindable_state(model, data, lam, n_total)
            self._state_type = type(state)
            if saved is None:
                return state
        try:
            return rebound_state(model, data, lam, saved, (self._state_type,))
        except ValueError as exc:
            raise ValueError(
                f"BCFWCallback: {exc} (head {self.head_attr!r}); bcfw_dataloader must yield the same training examples "
                "in the same order on every call (no shuffling, no dropped batches)"
            ) from exc

    # validation hooks run under torch.inference_mode: keep the solver's tensors ordinary ones
    @torch.inference_mode(False)
    def solve(self, trainer, pl_module, passes: float, log: bool = True) -> CheckRecord:
        """One call: features, rebind, ``passes`` solver passes, exact check, write the head, log; returns the
        record of the final check (with the extra columns ``epoch``, ``stale``, ``call``, ``feature_time``,
        ``wall``).  The first call announces the kernels' compilation (rank 0)."""
        if self.head_optimizer is not None:  # mode="step": the solve continues the optimizer's dual state
            self.dual_sd = checkpoint_safe(self.head_optimizer.state.state_dict())
            self.dual_trust, self.head_optimizer = self.head_optimizer.state.trust_marks(), None
        with self._compile_notice(trainer):
            return self._solve(trainer, pl_module, passes, log)

    def _solve(self, trainer, pl_module, passes: float, log: bool) -> CheckRecord:
        t0 = time.perf_counter()
        module_head = self._head(pl_module)
        model = module_head.model
        data, val = self.training_data(trainer, pl_module), None
        if self.lam_choice is not None:  # held-out data chooses lam and the state to continue (lam_choice.py)
            held = None if self.lam_choice.holdout is not None else self.training_data(
                trainer, pl_module, "bcfw_val_dataloader")
            data, val = self.lam_choice.held_out(data, held)
        t_feat = time.perf_counter() - t0
        ctx = ddp_context(trainer)
        plan = self._plan(ctx, model, data, val, passes)
        lam, saved, pick = self.lam, (self.dual_sd, self.alg_sd), None
        if self.lam_choice is not None:
            pick = self.lam_choice.choose(model, plan.data, plan.test_data, self.solver, plan.options,
                                          passes=self.passes_per_call, lam=lam,
                                          state=None if self.dual_sd is None else saved)
            lam, saved = pick.lam, pick.state
        if plan.sharded and self.shards is not None:  # each rank solves on its contiguous share, rounds all-reduced
            saved = self.shards[ctx.rank]
        dual_sd, alg_sd = saved
        state = self._dual_state(model, plan.data_here(), lam, dual_sd, len(plan.data) if plan.sharded else None)
        stale = 0.0
        if dual_sd is not None:
            stale = float((state.w - dual_sd["w"].to(state.w.device)).abs().max()) if state.d else 0.0
        head = HeadSolve(model, lam, self.solver, plan, state=state,
                         trust=None if dual_sd is None else self.dual_trust)
        # the run works on copies of the counters and history: an interrupted call leaves no trace
        head.run.load_progress(alg_sd, {**self.counters, **self.calibration}, self.history)
        out = head.run.run()
        if out.stopped_by == "interrupted":
            self.interrupted = True
            if self.verbose:
                rank_zero_info(f"[{self.log_prefix}] solve interrupted (Ctrl-C): discarded; the head keeps the "
                               f"weights of the last finished call ({self.calls} finished)")
            raise KeyboardInterrupt(
                f"BCFWCallback {self.name!r}: the solve was interrupted; the head keeps the weights of the last "
                "finished call"
            )
        history = head.run.history
        rec = history[-1]
        del history[len(self.history):-1]  # keep one record per call
        w = head.head_weights(out)
        epoch = trainer.current_epoch if trainer is not None else None
        rec.update(epoch=epoch, stale=stale, call=self.calls, feature_time=t_feat, wall=time.perf_counter() - t0)
        if pick is not None:
            rec.update(self.lam_choice.figures(pick, model, w))
        head.check_replicated(w, out, "BCFWCallback's replicated head")
        sd = head.run.algorithm.state_dict()
        dual_sd, alg_sd = checkpoint_safe(sd.pop("state")), checkpoint_safe(sd)
        shards = head.every_rank((dual_sd, alg_sd))  # sharded: any rank's checkpoint resumes all
        with deferred_signals((signal.SIGINT,)):  # the head and the callback's state change together
            module_head.set_weights(w)
            if pick is not None:
                self.lam_choice.commit(pick, epoch)
            self.lam, self.dual_sd, self.alg_sd = lam, dual_sd, alg_sd
            self.dual_trust = head.trust_marks()  # computed here
            self.shards = shards
            self.counters, self.history = head.run.counters, history
            self.calls += 1
            self.last_record = rec
            self.last_data = plan.data
            if log:
                self._log(pl_module, rec)
        if self.verbose:
            rank_zero_info(
                f"[{self.log_prefix}] epoch {epoch}: gap {rec.gap:.4g} primal "
                f"{min(p for p in (rec.primal, rec.primal_avg) if p is not None):.4g} passes {rec.passes:.1f} "
                f"stale {stale:.3g} train loss {rec.train_loss} ({rec.wall:.1f} s)"
            )
        return rec

    @staticmethod
    def figures(rec) -> dict:
        """The logged figures of a record: certified gap, primal of the head's weights, best dual."""
        out = {"gap": rec.gap, "primal": rec.model_primal, "dual": rec.best_dual, "oracle_calls": rec.oracle_calls,
               "passes": rec.passes, "stale": rec.stale}
        if rec.train_loss is not None:
            out["train_loss"] = rec.train_loss
        out.update({k: rec.extra[k] for k in ("lam", "val_loss") if k in rec.extra})
        return out

    def _log(self, pl_module, rec: dict) -> None:
        for k, v in self.figures(rec).items():
            pl_module.log(f"{self.log_prefix}/{k}", torch.tensor(float(v), dtype=torch.float64),
                          on_step=False, on_epoch=True, prog_bar=(k == "gap"), add_dataloader_idx=False)

    def _plan(self, ctx, model, data, val, passes: float):
        """This solve's :class:`~torch_bcfw.planning.RunPlan` (:func:`~torch_bcfw.planning.plan_run`): the first solve
        decides (its calibration logged once), later ones and a resumed checkpoint continue the decision
        (:func:`~torch_bcfw.planning.continued_strategy`) and its round size on the device it chose.  With
        ``lam_choice`` the solves replicate."""
        if self.shards is not None and (ctx is None or len(self.shards) != ctx.world_size):
            raise ValueError(f"BCFWCallback: the checkpoint holds the dual states of a sharded run of "
                             f"{len(self.shards)} processes: resume it under DDP with {len(self.shards)} processes")
        opts = dataclasses.replace(self.options, max_passes=passes)
        if self.lam_choice is not None:
            opts = dataclasses.replace(opts, strategy="replicate")
        saved = continued_strategy(self.shards is not None, self.dual_sd is not None, self.strategy)
        try:
            plan = plan_run(model, data, self.lam, self.solver, opts, ctx, test_data=val, saved=saved,
                            saved_round_size=self.round_size, check_data=False)
        except ValueError as exc:
            raise ValueError(f"BCFWCallback: {exc}") from exc
        self.round_size, self.solve_device = plan.round_size, str(plan.data.device)
        if ctx is not None:
            self.strategy = plan.strategy
        if plan.calibration is not None or plan.placement:
            self.calibration = {**plan.placement, **plan.record(rounds=False)}
        if plan.calibration is not None:
            rank_zero_info(f"[{self.log_prefix}] {plan.describe()} (given {opts.strategy!r})")
        return plan

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        """Record the head's model (registered name and config) in the checkpoint, so that ``torch-bcfw export``
        builds the head from the checkpoint alone (:func:`torch_bcfw.export.lightning_heads`)."""
        from ..export import HEADS_KEY
        from ..models.registry import model_name

        model = self._head(pl_module).model
        checkpoint.setdefault(HEADS_KEY, {})[self.head_attr] = {"model_class": model_name(model),
                                                                "model_config": model.config()}

    def state_dict(self) -> dict:
        return {
            "version": 1,
            "config": {"lam": self.lam, "solver": self.solver, "head_attr": self.head_attr,
                       "options": self.options.to_dict()},
            "dual_state": copy.deepcopy(self.dual_sd) if self.save_dual_state else None,
            "alg": copy.deepcopy(self.alg_sd) if self.save_dual_state else None,
            "counters": dict(self.counters),
            "history": checkpoint_safe(plain_history(self.history)),
            "calls": self.calls,
            "solved_epoch": self.solved_epoch,
            "shards": copy.deepcopy(self.shards) if self.save_dual_state else None,
            "strategy": self.strategy,
            "round_size": self.round_size,
            "solve_device": self.solve_device,
            "calibration": dict(self.calibration),
            "lam_choice": self.lam_choice.state_dict() if self.lam_choice is not None else None,
            "head_optimizer": (self.head_optimizer.state_dict() if self.head_optimizer is not None
                               and self.save_dual_state else None),
        }

    def load_state_dict(self, state_dict: dict) -> None:
        cfg = state_dict.get("config", {})
        if (self.lam_choice is None) != (state_dict.get("lam_choice") is None):
            raise ValueError("BCFWCallback: the checkpoint was written " + ("with" if self.lam_choice is None else "without")
                             + " lam_choice; resume with the callback that wrote it")
        if self.lam_choice is not None:
            self.lam_choice.load_state_dict(state_dict["lam_choice"])
            self.lam = check_lam(cfg.get("lam"))  # the lam the last call chose
        if cfg.get("lam") != self.lam or cfg.get("solver") != self.solver:
            raise ValueError(
                f"BCFWCallback: the checkpoint was written with lam = {cfg.get('lam')}, solver = {cfg.get('solver')!r} "
                f"but this callback has lam = {self.lam}, solver = {self.solver!r}"
            )
        self._reset()
        self.dual_sd = state_dict["dual_state"]
        self.alg_sd = state_dict["alg"]
        self.counters = dict(state_dict["counters"])
        self.history = as_records(state_dict["history"])
        self.calls = int(state_dict["calls"])
        self.shards = state_dict.get("shards")
        self.strategy = state_dict.get("strategy")
        self.round_size = state_dict.get("round_size", state_dict.get("shard_batch_size"))  # the older key
        self.solve_device = state_dict.get("solve_device")
        self.calibration = dict(state_dict.get("calibration", {}))
        self.solved_epoch = state_dict.get("solved_epoch")
        self.last_record = self.history[-1] if self.history else None
        self.optimizer_sd = state_dict.get("head_optimizer")
