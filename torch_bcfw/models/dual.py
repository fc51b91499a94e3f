"""Per-block dual state of the BCFW family.

The SSVM dual variable ``alpha`` has one simplex block per example.  BCFW never needs
``alpha`` itself, only its images ``w_i = A alpha_[i]`` and ``l_i = b^T alpha_[i]``
(Lacoste-Julien et al. 2013, Alg. 4), with ``w = sum_i w_i`` and ``l = sum_i l_i``.

:class:`DualState` holds the bookkeeping every storage shares: ``w`` (float64), ``l``, the
per-block ``l_i``, the global step counter ``k`` and the weighted average of the iterates.

Weighted averaging (``wbar_T = 2/(T(T+1)) sum_{t=1..T} t w_t``, eq. 14 of the BCFW paper) is done
*in the dual, per block and lazily*: block ``i``'s state is constant between two visits, so its
contribution to ``sum_t t w_t`` over such a stretch is its state times ``sum t`` over the
stretch.  Each block keeps an accumulator and the clock of its last change; a step only touches
the visited block (``O(size of block i)``, not ``O(d)``), and ``wbar`` is assembled on demand.
``lbar`` uses the scalar identity ``lbar_T = l_T - 2/(T(T+1)) sum_t t(t+1)/2 (l_{t+1} - l_t)``.

Subclasses decide how ``w_i`` (and its average accumulator) is stored:

* :class:`DenseDualState` keeps a dense ``Tensor[n, d]`` table (generic, any model, any device);
* a model can supply a compact state (:class:`torch_bcfw.models.chain.ChainDualState` keeps
  label marginals) as long as it implements :meth:`DualState.block_direction`,
  :meth:`DualState._move_block` and :meth:`DualState.block_w`.

A solver talks to the state through :meth:`block_step`, :meth:`run_steps`,
:meth:`batch_step`, :meth:`averaged`, :meth:`refresh` and :meth:`state_dict`.

Moving a state to new features (:meth:`DualState.rebind`, :meth:`DualState.from_state_dict`).
When the token / example features ``x`` change (a backbone network is being trained under a
structured head), the same dual variables ``alpha`` map to a different ``w = A(x) alpha``: every
stored ``w_i`` is stale.  A state whose storage holds the dual variables themselves (label
marginals for the chain, the labelings of the active set for :class:`ActiveSetDualState`) can be
re-bound: the blocks are kept, ``w``, the dense caches and the averaged iterate are recomputed from
them under the new features, and ``l = b^T alpha`` is unchanged because the task loss does not
depend on the features.  So after a rebind ``w = A(x_new) alpha`` holds exactly, ``(w, l)`` is a
feasible primal-dual pair *of the problem at the new features*, and the certificate computed from it
is the exact duality gap at those features.  :class:`DenseDualState` stores only ``w_i = A(x_old)
alpha_[i]``, from which ``alpha`` cannot be recovered: it refuses to rebind (use
:class:`ActiveSetDualState`, which also keeps the labelings).
"""
from __future__ import annotations

import hashlib

import numpy as np
import torch
from torch import Tensor

from ..stepsize import average_weight, step_size

__all__ = ["DualState", "DenseDualState", "ActiveSetDualState", "labels_fingerprint"]


def check_lam(lam: float) -> float:
    lam = float(lam)
    if not np.isfinite(lam) or lam <= 0.0:
        raise ValueError(f"lam must be a finite number > 0, got {lam}")
    return lam


def labels_fingerprint(data) -> str:
    """A short hash of ``data``'s labels and (for sequences) its sequence boundaries.

    Saved with a state so a state is never loaded onto other examples (or the same examples in
    another order) without an error.
    """
    h = hashlib.sha1()
    h.update(np.ascontiguousarray(data.y.detach().cpu().numpy().astype(np.int64)).tobytes())
    offsets = getattr(data, "offsets", None)
    if offsets is not None:
        h.update(b"|")
        h.update(np.ascontiguousarray(offsets.detach().cpu().numpy().astype(np.int64)).tobytes())
    return h.hexdigest()[:16]


class DualState:
    """Shared bookkeeping of a primal-dual BCFW state (see the module docstring).

    Attributes:
        w: ``Tensor[d]`` float64, ``sum_i w_i``.
        ell: float, ``sum_i l_i`` (the linear part of the dual).
        block_ell: ``Tensor[n]`` float64, ``l_i``.
        k: int, number of block steps taken (the global counter of the fixed step size).
        avg_t: int, number of iterates produced so far (the clock of the weighted average).
        avg_last: ``LongTensor[n]`` (CPU), clock of each block's last change.
        avg_ell_u: scalar accumulator of the averaged ``l``.
    """

    #: True when the stored blocks are the dual variables themselves (label marginals, active
    #: sets) and not feature-space images ``w_i``, so that the state can be moved to new features
    #: (:meth:`rebind`).  A subclass storing feature-space vectors must set this to False.  The
    #: ``_load_storage`` of a rebindable state must derive any feature-space cache at ``self.data``'s
    #: features (a label-marginal storage has none: :meth:`_w_from_blocks` evaluates the marginals).
    rebindable = True

    def __init__(self, model, data, lam: float):
        model.check_data(data)
        self.model = model
        self.data = data
        self.lam = check_lam(lam)
        self.n = len(data)
        self.d = model.n_features
        dev = data.device
        self.w = torch.zeros(self.d, dtype=torch.float64, device=dev)
        self.ell = 0.0
        self.block_ell = torch.zeros(self.n, dtype=torch.float64, device=dev)
        self.k = 0
        self.avg_t = 0
        self.avg_last = torch.zeros(self.n, dtype=torch.long)
        self.avg_ell_u = 0.0

    # ------------------------------------------------------------ storage hooks
    def block_direction(self, i: int, y: Tensor) -> tuple[Tensor, float]:
        """``(v, l_s)``: ``v = w_i - w_s`` (``Tensor[d]``) and ``l_s = L_i(y)/n`` for labeling ``y`` of block ``i``."""
        raise NotImplementedError

    def _move_block(self, i: int, y: Tensor, gamma: float, v: Tensor) -> None:
        """Move block ``i``'s stored state: ``alpha_i <- (1 - gamma) alpha_i + gamma e_y``.

        ``v = w_i - w_s`` is the direction :meth:`block_direction` returned for ``y``.
        """
        raise NotImplementedError

    def block_w(self, i: int) -> Tensor:
        """``w_i`` as a dense ``Tensor[d]``."""
        raise NotImplementedError

    def _move_all(self, y: Tensor, gamma: float) -> None:
        """Batch move: ``alpha <- (1 - gamma) alpha + gamma s`` with ``s`` the corners ``y`` (all blocks)."""
        raise NotImplementedError

    def _w_from_blocks(self) -> Tensor:
        """``sum_i w_i`` recomputed from the stored blocks (``Tensor[d]``)."""
        raise NotImplementedError

    def _avg_accumulate(self, i: int | None, S) -> None:
        """Add ``S`` times block ``i``'s current state to its average accumulator (``i=None``: all
        blocks, ``S: Tensor[n]``)."""
        raise NotImplementedError

    def _avg_w(self, S: Tensor, total: float) -> Tensor:
        """``sum_i (acc_i + S_i state_i) / total`` mapped to weights: the averaged ``w`` (``Tensor[d]``)."""
        raise NotImplementedError

    def _avg_touch(self, i: int) -> None:
        """Block ``i`` is about to change at clock ``avg_t``: bring its accumulator up to date."""
        last = int(self.avg_last[i])
        S = 0.5 * (self.avg_t * (self.avg_t + 1.0) - last * (last + 1.0))
        if S != 0.0:
            self._avg_accumulate(i, S)
        self.avg_last[i] = self.avg_t

    # ------------------------------------------------------------ solver API
    def block_step(self, i: int, y: Tensor, step_code: int, averaging: bool = True) -> tuple[float, float]:
        """One Frank-Wolfe step on block ``i`` towards the corner of labeling ``y``.

        Returns ``(num, gamma)``: ``num = lam <w_i - w_s, w> - l_i + l_s`` is the block gap when
        ``y`` is an exact oracle answer at the current ``w``; ``gamma`` is the step taken.
        """
        v, ell_s = self.block_direction(i, y)
        ell_i = float(self.block_ell[i])
        num = self.lam * float(v @ self.w) - ell_i + ell_s
        den = self.lam * float(v @ v)
        gamma = step_size(step_code, num, den, self.k, self.n)
        if gamma != 0.0:
            if averaging:
                self._avg_touch(i)
            self._move_block(i, y, gamma, v)
            new_ell_i = (1.0 - gamma) * ell_i + gamma * ell_s
            self.block_ell[i] = new_ell_i
            self.w.add_(v, alpha=-gamma)
            self.ell += new_ell_i - ell_i
            self.avg_ell_u += average_weight(self.avg_t) * (new_ell_i - ell_i)
        self.k += 1
        self.avg_t += 1
        return num, gamma

    def run_steps(self, order: np.ndarray, step_code: int, averaging: bool = True) -> np.ndarray:
        """Sequential BCFW steps on the blocks in ``order`` (``int64[m]``), each after an exact oracle call.

        Returns the ``m`` block gaps observed (``float64[m]``).  Compact states override this with
        a fused kernel; the result must be identical.
        """
        gaps = np.empty(len(order), dtype=np.float64)
        for j, i in enumerate(order):
            i = int(i)
            y = self.model.oracle(self.w, self.block_data(i), loss_augmented=True)
            gaps[j], _ = self.block_step(i, y, step_code, averaging)
        return gaps

    def batch_step(self, y: Tensor, step_code: int, fw_iter: int, averaging: bool = True) -> tuple[float, float]:
        """One batch Frank-Wolfe step towards the corners ``y`` (oracle answers for all blocks).

        Returns ``(gap, gamma)``, ``gap`` being the exact duality gap of the state *before* the step
        (when ``y`` are exact oracle answers at the current ``w``).
        """
        n, lam = self.n, self.lam
        w_s = (self.model.joint_feature_sum(self.data, self.data.y) - self.model.joint_feature_sum(self.data, y)) / (lam * n)
        ell_s = float(self.model.loss(self.data, y).sum()) / n
        v = self.w - w_s
        gap = lam * float(v @ self.w) - self.ell + ell_s
        den = lam * float(v @ v)
        gamma = step_size(step_code, gap, den, fw_iter, 1)
        if gamma != 0.0:
            old_ell = self.ell
            if averaging:
                last = self.avg_last.to(torch.float64)
                S = 0.5 * (self.avg_t * (self.avg_t + 1.0) - last * (last + 1.0))
                self._avg_accumulate(None, S.to(self.w.device))
                self.avg_last.fill_(self.avg_t)
            self._move_all(y, gamma)
            self.block_ell.mul_(1.0 - gamma).add_(self.model.loss(self.data, y) / n, alpha=gamma)
            self.w.add_(v, alpha=-gamma)
            self.ell = (1.0 - gamma) * old_ell + gamma * ell_s
            self.avg_ell_u += average_weight(self.avg_t) * (self.ell - old_ell)
        self.k += n
        self.avg_t += 1
        return gap, gamma

    def averaged(self) -> tuple[Tensor, float]:
        """The weighted average ``(wbar, lbar)`` of the iterates (weights ``t``, eq. 14 of the BCFW paper).

        Only meaningful when every step ran with ``averaging=True``.
        """
        T = self.avg_t
        if T == 0:
            return self.w.clone(), self.ell
        total = 0.5 * T * (T + 1.0)
        last = self.avg_last.to(torch.float64)
        S = (total - 0.5 * last * (last + 1.0)).to(self.w.device)
        return self._avg_w(S, total), self.ell - self.avg_ell_u / total

    def refresh(self) -> float:
        """Recompute ``w = sum_i w_i`` and ``l = sum_i l_i`` from the blocks; return the drift removed."""
        w = self._w_from_blocks()
        drift = float((w - self.w).abs().max()) if self.d else 0.0
        self.w = w
        self.ell = float(self.block_ell.sum())
        return drift

    # ------------------------------------------------------------ new features
    @classmethod
    def _check_rebindable(cls) -> None:
        if not cls.rebindable:
            raise NotImplementedError(
                f"{cls.__name__} stores w_i = A(x) alpha_[i] in feature space and not the dual variables "
                "alpha, so it cannot be moved to new features; use a state that keeps the dual variables "
                "(ChainDualState for chains, ActiveSetDualState for any model)"
            )

    @classmethod
    def from_state_dict(cls, model, data, lam: float, sd: dict) -> "DualState":
        """A state on ``data`` carrying the dual variables saved in ``sd`` (from :meth:`state_dict`).

        ``data`` must hold the same examples with the same labels in the same order as the data the
        state was saved from, but its *features* may differ: ``w``, the dense caches and the average
        are re-derived from the stored blocks under ``data``'s features (see the module docstring),
        so ``w = A(x) alpha`` holds exactly for the current ``x``.
        """
        cls._check_rebindable()
        state = cls(model, data, lam)
        state.load_state_dict(sd)  # a rebindable storage derives its feature-space caches at data's features
        state.refresh()
        return state

    def rebind(self, data) -> float:
        """Move this state to new features ``data`` (same examples and labels, in the same order).

        The dual variables (blocks), the per-block ``l_i``, the step counter, the averaging clocks and
        the averaged dual variables are kept; ``w = sum_i w_i`` and every feature-dependent cache are
        recomputed under ``data``'s features.  Returns ``max |w_new - w_old|``, the staleness removed.
        Raises ``NotImplementedError`` for states that do not store the dual variables
        (:class:`DenseDualState`) and ``ValueError`` when ``data`` holds other examples.
        """
        self._check_rebindable()
        self.model.check_data(data)
        if len(data) != self.n:
            raise ValueError(f"rebind: the state has n = {self.n} examples but the new data has {len(data)}")
        if labels_fingerprint(data) != labels_fingerprint(self.data):
            raise ValueError(
                "rebind: the new data has other labels or sequence boundaries than the state's data "
                "(same examples in the same order are required; only the features may change)"
            )
        old_w = self.w.to(data.device)
        fresh = type(self).from_state_dict(self.model, data, self.lam, self.state_dict())
        self.__dict__.clear()
        self.__dict__.update(fresh.__dict__)
        return float((self.w - old_w).abs().max()) if self.d else 0.0

    def block_data(self, i: int):
        """Example ``i`` as a one-example dataset (cached)."""
        cache = self.__dict__.setdefault("_block_cache", {})
        if i not in cache:
            cache[i] = self.data[[i]]
        return cache[i]

    # ------------------------------------------------------------ checkpointing
    def _storage_dict(self) -> dict:
        raise NotImplementedError

    def _load_storage(self, sd: dict) -> None:
        raise NotImplementedError

    def state_dict(self) -> dict:
        """Everything needed to continue exactly (tensors on CPU)."""
        sd = {
            "kind": type(self).__name__,
            "lam": self.lam,
            "n": self.n,
            "d": self.d,
            "w": self.w.cpu().clone(),
            "ell": self.ell,
            "block_ell": self.block_ell.cpu().clone(),
            "k": self.k,
            "avg_t": self.avg_t,
            "avg_last": self.avg_last.clone(),
            "avg_ell_u": self.avg_ell_u,
            "labels": labels_fingerprint(self.data),
        }
        sd["storage"] = self._storage_dict()
        return sd

    def load_state_dict(self, sd: dict) -> None:
        if sd["kind"] != type(self).__name__:
            raise ValueError(f"cannot load a {sd['kind']} state into a {type(self).__name__}")
        if sd["n"] != self.n or sd["d"] != self.d:
            raise ValueError(
                f"state was saved for n = {sd['n']}, d = {sd['d']} but this problem has n = {self.n}, d = {self.d}"
            )
        if "labels" in sd and sd["labels"] != labels_fingerprint(self.data):
            raise ValueError(
                "state was saved for other examples (labels or sequence boundaries differ, or their order changed)"
            )
        dev = self.w.device
        self.lam = float(sd["lam"])
        self.w = sd["w"].to(dev, torch.float64).clone()
        self.ell = float(sd["ell"])
        self.block_ell = sd["block_ell"].to(dev, torch.float64).clone()
        self.k = int(sd["k"])
        self.avg_t = int(sd["avg_t"])
        self.avg_last = sd["avg_last"].to(torch.long).clone()
        self.avg_ell_u = float(sd["avg_ell_u"])
        self._load_storage(sd["storage"])


class DenseDualState(DualState):
    """Stores ``w_i`` as a dense ``Tensor[n, d]`` (float64).  Works for any model and device.

    Not :attr:`~DualState.rebindable`: the table holds ``A(x) alpha_[i]`` for the features it was
    built with, and ``alpha`` is not kept (see :class:`ActiveSetDualState`).
    """

    rebindable = False

    def __init__(self, model, data, lam: float):
        super().__init__(model, data, lam)
        self.w_blocks = torch.zeros(self.n, self.d, dtype=torch.float64, device=data.device)
        self.w_blocks_acc = torch.zeros_like(self.w_blocks)
        self._phi_true = None

    def _true_features(self, i: int) -> Tensor:
        if self._phi_true is None:
            self._phi_true = self.model.joint_feature(self.data, self.data.y)
        return self._phi_true[i]

    def block_direction(self, i: int, y: Tensor) -> tuple[Tensor, float]:
        blk = self.block_data(i)
        phi_y = self.model.joint_feature(blk, y)[0]
        w_s = (self._true_features(i) - phi_y) / (self.lam * self.n)
        ell_s = float(self.model.loss(blk, y)[0]) / self.n
        return self.w_blocks[i] - w_s, ell_s

    def _move_block(self, i: int, y: Tensor, gamma: float, v: Tensor) -> None:
        self.w_blocks[i] -= gamma * v

    def _move_all(self, y: Tensor, gamma: float) -> None:
        w_s = (self.model.joint_feature(self.data, self.data.y) - self.model.joint_feature(self.data, y)) / (
            self.lam * self.n
        )
        self.w_blocks.mul_(1.0 - gamma).add_(w_s, alpha=gamma)

    def block_w(self, i: int) -> Tensor:
        return self.w_blocks[i].clone()

    def _w_from_blocks(self) -> Tensor:
        return self.w_blocks.sum(0)

    def _avg_accumulate(self, i, S) -> None:
        if i is None:
            self.w_blocks_acc.add_(S[:, None] * self.w_blocks)
        else:
            self.w_blocks_acc[i].add_(self.w_blocks[i], alpha=S)

    def _avg_w(self, S: Tensor, total: float) -> Tensor:
        return (self.w_blocks_acc.sum(0) + S @ self.w_blocks) / total

    def _storage_dict(self) -> dict:
        return {"w_blocks": self.w_blocks.cpu().clone(), "w_blocks_acc": self.w_blocks_acc.cpu().clone()}

    def _load_storage(self, sd: dict) -> None:
        self.w_blocks = sd["w_blocks"].to(self.w.device, torch.float64).clone()
        self.w_blocks_acc = sd["w_blocks_acc"].to(self.w.device, torch.float64).clone()


def _block_labels(data, i: int) -> Tensor:
    """Labels of example ``i`` (a slice for sequences, a length-1 tensor otherwise)."""
    offsets = getattr(data, "offsets", None)
    if offsets is not None:
        return data.y[int(offsets[i]) : int(offsets[i + 1])]
    return data.y[i : i + 1]


class ActiveSetDualState(DenseDualState):
    """Dense ``w_i`` plus the dual variables themselves: per block, the labelings with non-zero
    weight (the active set) and their weights.  Works for any model; can be re-bound to new features.

    ``alpha_i`` is a dict ``labeling -> [labels (CPU LongTensor), weight, averaged weight]``; the dense
    ``w_i`` table of :class:`DenseDualState` is kept as a cache for the solver steps and recomputed from
    the active sets by :meth:`_rebuild_blocks` (``w_i = sum_y alpha_i(y) psi_i(y) / (lam n)``, one
    batched :meth:`~torch_bcfw.models.base.StructuredModel.joint_feature` call).  A BCFW step adds at
    most one labeling to one block, so the memory grows with the number of distinct oracle answers
    (at most ``K`` per example for a multiclass model).
    """

    rebindable = True

    def __init__(self, model, data, lam: float):
        super().__init__(model, data, lam)
        ycpu = data.y.detach().cpu()
        self.active = []
        for i in range(self.n):
            y = _block_labels(SimpleLabels(ycpu, getattr(data, "offsets", None)), i).clone()
            self.active.append({tuple(y.tolist()): [y, 1.0, 0.0]})

    def _add(self, i: int, y: Tensor, gamma: float) -> None:
        blk = self.active[i]
        for e in blk.values():
            e[1] *= 1.0 - gamma
        y = y.detach().cpu().reshape(-1)
        key = tuple(y.tolist())
        if key in blk:
            blk[key][1] += gamma
        else:
            blk[key] = [y.clone(), gamma, 0.0]
        for k in [k for k, e in blk.items() if e[1] == 0.0 and e[2] == 0.0]:
            del blk[k]

    def _move_block(self, i: int, y: Tensor, gamma: float, v: Tensor) -> None:
        super()._move_block(i, y, gamma, v)
        self._add(i, y, gamma)

    def _move_all(self, y: Tensor, gamma: float) -> None:
        super()._move_all(y, gamma)
        ycpu = y.detach().cpu()
        lab = SimpleLabels(ycpu, getattr(self.data, "offsets", None))
        for i in range(self.n):
            self._add(i, _block_labels(lab, i), gamma)

    def _avg_accumulate(self, i, S) -> None:
        super()._avg_accumulate(i, S)
        if i is None:
            Sc = S.detach().cpu().tolist()
            for j, blk in enumerate(self.active):
                for e in blk.values():
                    e[2] += Sc[j] * e[1]
        else:
            for e in self.active[i].values():
                e[2] += float(S) * e[1]

    def active_set_sizes(self) -> Tensor:
        """``LongTensor[n]``: number of stored labelings per block."""
        return torch.tensor([len(b) for b in self.active], dtype=torch.long)

    def _flat(self):
        blocks, labels, weights, accs = [], [], [], []
        for i, blk in enumerate(self.active):
            for y, a, acc in blk.values():
                blocks.append(i)
                labels.append(y)
                weights.append(a)
                accs.append(acc)
        return (torch.tensor(blocks, dtype=torch.long), labels,
                torch.tensor(weights, dtype=torch.float64), torch.tensor(accs, dtype=torch.float64))

    def _rebuild_blocks(self, chunk: int = 4096) -> None:
        blocks, labels, weights, accs = self._flat()
        dev = self.w.device
        self._phi_true = None
        self.w_blocks = torch.zeros(self.n, self.d, dtype=torch.float64, device=dev)
        self.w_blocks_acc = torch.zeros_like(self.w_blocks)
        scale = 1.0 / (self.lam * self.n)
        for s in range(0, blocks.numel(), chunk):
            idx = blocks[s : s + chunk]
            sub = self.data[idx]
            y = torch.cat(labels[s : s + chunk]).to(dev)
            psi = self.model.joint_feature(sub, sub.y) - self.model.joint_feature(sub, y)
            ii = idx.to(dev)
            self.w_blocks.index_add_(0, ii, psi * (weights[s : s + chunk].to(dev) * scale)[:, None])
            self.w_blocks_acc.index_add_(0, ii, psi * (accs[s : s + chunk].to(dev) * scale)[:, None])

    def _storage_dict(self) -> dict:
        blocks, labels, weights, accs = self._flat()
        return {
            "blocks": blocks, "weights": weights, "accs": accs,
            "labels": torch.cat(labels) if labels else torch.zeros(0, dtype=torch.long),
            "label_lengths": torch.tensor([y.numel() for y in labels], dtype=torch.long),
        }

    def _load_storage(self, sd: dict) -> None:
        self.active = [{} for _ in range(self.n)]
        parts = torch.split(sd["labels"].long(), sd["label_lengths"].tolist())
        for i, y, a, acc in zip(sd["blocks"].tolist(), parts, sd["weights"].tolist(), sd["accs"].tolist()):
            self.active[i][tuple(y.tolist())] = [y.clone(), float(a), float(acc)]
        self._rebuild_blocks()


class SimpleLabels:
    """Labels plus (optional) sequence boundaries: enough for :func:`_block_labels`."""

    def __init__(self, y: Tensor, offsets: Tensor | None):
        self.y = y
        self.offsets = None if offsets is None else offsets.detach().cpu()
