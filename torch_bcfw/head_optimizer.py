"""BCFW as the optimizer of a structured head: one block step per example of every training batch.

The structured hinge of a batch (:class:`~torch_bcfw.nn.StructuredHingeLoss`) already decodes ``y*_i = argmax_y
L_i(y) + <w, phi(x_i, y)>`` for every example of the batch at the current features: the BCFW block oracle.
:meth:`BCFWHeadOptimizer.step` re-binds these blocks to the batch's features
(:meth:`~torch_bcfw.duals.base.DualState.rebind_blocks`: their dual variables kept, their ``w_i`` recomputed), takes
one plain BCFW block step with the exact line search towards each ``y*_i``
(:meth:`~torch_bcfw.duals.base.DualState.block_step`) and writes the state's ``w`` into the head: the head moves at
every training step, with no learning rate.  :meth:`BCFWHeadOptimizer.certify` re-binds every block to the features
of the whole training set and gives the certified duality gap there.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import torch
from torch import Tensor

from .certificate import Certificate, certify
from .checks import check_index_tensor
from .data.sequences import MulticlassData, SequenceData
from .duals.rebind import rebindable_state, rebound_state
from .duals.stepsize import LINE_SEARCH
from .duals.working_set import block_labelings
from .nn import HingeDecoding, StructuredHead

__all__ = ["BCFWHeadOptimizer"]


class BCFWHeadOptimizer:
    """Plain BCFW on the blocks of each training batch, with the hinge's decodings as oracle answers.

    Args:
        head: the :class:`~torch_bcfw.nn.StructuredHead` whose weights it writes (``w`` of the dual state after every
            step).
        data: all ``n`` training examples, example ``i`` at position ``i`` (the ids :meth:`step` takes): their labels
            and sequence boundaries, with features (any: a fresh state is at ``w = 0`` whatever the features; a
            ``state_dict`` is re-bound to them).
        lam: the SSVM's regularisation ``lam > 0``.
        state_dict: a dual state to continue (:meth:`~torch_bcfw.duals.base.DualState.state_dict`, e.g. the last solve
            of :class:`~torch_bcfw.lightning.BCFWCallback`); default: a fresh one.

    Attributes:
        state: the dual state (:func:`~torch_bcfw.duals.rebind.rebindable_state`'s class for the head's model), on
            ``data``'s device; its data holds, per block, the features of the block's last step.
        steps: the number of :meth:`step` calls.
    """

    def __init__(self, head: StructuredHead, data, lam: float, state_dict: dict | None = None):
        if not isinstance(head, StructuredHead):
            raise TypeError(f"BCFWHeadOptimizer needs a StructuredHead, got {type(head).__name__}")
        data = data.to(data.device, torch.float64)
        state = rebindable_state(head.model, data, lam)
        if state_dict is not None:
            state = rebound_state(head.model, data, lam, state_dict, (type(state),))
        if state.working_set is not None:
            raise ValueError("BCFWHeadOptimizer takes plain block steps, which do not keep a working set: continue a "
                             "state of a solve without one (no pairwise / away steps, cache or MP-BCFW)")
        self.head, self.state, self.steps = head, state, 0
        head.set_weights(state.w)

    def step(self, example_ids: Tensor, decoding: HingeDecoding) -> np.ndarray:
        """One block step per example of a batch, in the batch's order.

        Args:
            example_ids: ``LongTensor[B]``, the distinct positions of the batch's examples in ``data``.
            decoding: the batch's :class:`~torch_bcfw.nn.HingeDecoding` (``StructuredHingeLoss.last_decoding``):
                features ``[N, F]``, labels, offsets and loss-augmented decodings ``y_star [N]``.

        Returns the step numerators ``lam <w_i - w_s, w> - l_i + l_s`` (``float64[B]``; the block gaps when ``y_star``
        is the oracle's answer at the current ``w``)."""
        ids = check_index_tensor(example_ids, "example_ids").reshape(-1).cpu()
        x = decoding.x.detach()
        sub = MulticlassData(x, decoding.y) if decoding.offsets is None else SequenceData(x, decoding.y,
                                                                                         decoding.offsets)
        if len(ids) != len(sub):
            raise ValueError(f"BCFWHeadOptimizer.step: {len(ids)} example ids for a batch of {len(sub)} examples")
        state = self.state
        state.rebind_blocks(ids, sub)
        dev = state.w.device
        nums = [state.block_step(i, torch.from_numpy(y).to(dev), LINE_SEARCH)[0]
                for i, y in zip(ids.tolist(), block_labelings(decoding.y_star, decoding.offsets))]
        self.head.set_weights(state.w)
        self.steps += 1
        return np.array(nums, dtype=np.float64)

    def certify(self, data) -> Certificate:
        """Re-bind every block to ``data`` (the training examples, as in the constructor, at the current features),
        write the re-derived ``w = A(x) alpha`` into the head and return its certificate there: ``gap = P(w) -
        D(alpha) >= P(w) - P*``."""
        self.state.rebind(data.to(self.state.w.device, torch.float64))
        state = self.state
        self.head.set_weights(state.w)
        return certify(state.model, state.data, state.w, state.dual_ell(), state.lam)

    def state_dict(self) -> dict:
        """The dual state and the features each block was last bound to (``features``: CPU float64), and ``steps``."""
        return {"state": self.state.state_dict(), "features": self.state.data.x.cpu().clone(), "steps": self.steps}

    def load_state_dict(self, sd: dict) -> None:
        """Continue exactly from :meth:`state_dict`'s output (the same examples; checked as
        :meth:`~torch_bcfw.duals.base.DualState.load_state_dict` checks)."""
        old = self.state
        data = dataclasses.replace(old.data, x=sd["features"].to(old.w.device, torch.float64))
        state = type(old)(old.model, data, old.lam, old.n_total)
        state.load_state_dict(sd["state"])
        self.state, self.steps = state, int(sd["steps"])
        self.head.set_weights(state.w)
