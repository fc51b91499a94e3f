"""The compiled block operations a dual state supplies to the step driver (:func:`~torch_bcfw.duals.driver.plan_steps`).

The driver is written once; what differs between dual states is how a block is scored, decoded and moved.  A
state that runs plans in the driver packs its arrays into a **kernel bundle** of four groups ``(data, wts, store,
avg)``: the data (features, labels, offsets: an instance of a :class:`~typing.NamedTuple` class of the state's own,
which identifies the state), the weights ``w``, the state's storage and its averaging accumulators.  The functions
below are the contract: plain Python stubs here; each state's module registers its compiled implementations with
numba's ``overload``, guarded by :func:`bundle_of` so that an implementation applies to its state's data class only.
The driver is compiled once per state (and cached on disk like every kernel).  The driver unpacks the bundle once
and every operation takes the four groups: an operation extracting arrays from the whole bundle at every block
would pay reference counting on all of them, measurably (about 10% of an OCR pass).

Notation: block ``i`` has ``L`` positions starting at ``s`` (tokens of a chain, nodes of a graph); ``n`` blocks.
Scores are of labelings under ``w`` without the block constant (``h(y) = L_i(y)/n + score(y)/n`` up to it), so
``h(y*) - h_i`` is the block gap.  The corner of a step (the labeling it moves towards) and the direction are kept
in the scratch ``scr`` between :func:`oracle_corner` / :func:`plane_corner` and the step.  The scratch is allocated
by the driver (:func:`block_scratch`), not passed in, so the compiler knows that it aliases none of the state's
arrays.

Operations (``G``: the four groups ``data, wts, store, avg``):

* :func:`block_scratch` ``(G) -> scr``: the scratch of one block step (a tuple of arrays, sized for the largest
  block);
* :func:`n_blocks` ``(G) -> n``; :func:`block_span` ``(G, i) -> (s, L)``; :func:`block_loss` ``(G, i) -> l_i``;
  :func:`dual_loss` ``(G) -> l`` (the sum of the ``l_i``);
* :func:`prefetch` ``(G, i, averaging)``: start loading block ``i``'s state (the next block of a pre-drawn order);
* :func:`begin_block` ``(G, scr, i, s, L, measure) -> score``: what a step needs before its corner, at the current
  ``w`` (e.g. the unary scores); returns the score of the block's current point ``mu_i`` -- complete when
  ``measure`` (then ``h_i = l_i + score / n``), else whatever :func:`fw_step` expects back;
* :func:`plane_score` ``(G, scr, s, L, lab, base) -> score`` of the stored labeling ``lab[base : base + L]``;
* :func:`plane_corner` ``(G, scr, s, L, lab, base) -> score``: that stored labeling becomes the corner;
* :func:`oracle_corner` ``(G, scr, i, s, L, ylab) -> (score, l_s, ok)``: the loss-augmented oracle's answer
  (``ylab`` when it is not empty: an answer given by the caller) becomes the corner; ``ok`` False when the oracle
  cannot run at the current ``w`` (the driver stops with :data:`~torch_bcfw.duals.driver.ORACLE_REFUSED`);
* :func:`corner_labels` ``(G, scr, L) -> int32[L]``: the corner's labeling, to be stored in the working set;
* :func:`fw_step` ``(G, scr, i, s, L, step, clock, corner) -> (gap, gamma)``: the FW step towards the corner with
  ``step = (step_code, averaging, lam, k)`` and ``corner = (score, score_mu, measure, l_i, l_s)``: line search,
  lazy averaging, the moves of ``w``, the block's storage and ``l_i``;
* :func:`active_set_step` ``(G, scr, kind, i, s, L, j_s, j_a, values, clock, step, planes)``: a pairwise or away
  step against the working-set plane ``j_a`` (``values = (h_i, h_s, l_i, l_s)``, ``step = (averaging, lam)``,
  ``planes = (start, size, lab_start, fl, lab)``), the working set's ``alpha`` following.

Round operations, for the mini-batch rounds (:func:`~torch_bcfw.duals.driver.round_steps`; ``R``: the state's
round accumulators, e.g. the summed direction ``P`` in the layout of ``w``):

* :func:`round_scratch` ``(G, R, order, roffsets, by_gap) -> rscr``: the scratch of the rounds
  ``order[roffsets[j]:roffsets[j + 1]]`` (with ``by_gap`` the rounds are drawn later: sized for the largest blocks);
* :func:`round_directions` ``(G, R, rscr, blocks, n_total, bgaps) -> (num, sum l_i, sum l_s)``: every block's corner
  at the same ``w``, its block gap in ``bgaps``, and ``P += phi_i(e_{y*} - mu_i)``;
* :func:`round_sqnorm` ``(G, R) -> ||P||^2``; :func:`round_apply` ``(G, R, a)``: ``w += a P``;
  :func:`round_clear` ``(G, R)``: ``P <- 0``;
* :func:`round_move` ``(G, R, rscr, blocks, gamma, n_total, clock, averaging)``: every block's storage and ``l_i``
  move by ``gamma`` towards its corner (with the lazy average), ``w`` left to :func:`round_apply`.

A state implements what the plans it accepts need (:meth:`~torch_bcfw.duals.base.DualState.can_run_plan`); an
operation it cannot perform raises when called.
"""
from __future__ import annotations

from numba import types

__all__ = ["bundle_of", "block_scratch", "n_blocks", "block_span", "block_loss", "dual_loss", "prefetch", "begin_block",
           "plane_score", "plane_corner", "oracle_corner", "corner_labels", "fw_step", "active_set_step",
           "round_scratch", "round_directions", "round_sqnorm", "round_apply", "round_clear", "round_move"]


def bundle_of(cls):
    """The guard of an implementation: ``bundle_of(MyData)(data)`` is True when the numba type ``data`` is the
    :class:`~typing.NamedTuple` class ``MyData`` (a state's data group)."""

    def applies(data) -> bool:
        return isinstance(data, types.BaseNamedTuple) and data.instance_class is cls

    return applies


def _stub(name: str):
    def op(*args):
        raise NotImplementedError(f"{name} is a compiled block operation: call it from the step driver")

    op.__name__ = op.__qualname__ = name
    return op


block_scratch = _stub("block_scratch")
n_blocks = _stub("n_blocks")
block_span = _stub("block_span")
block_loss = _stub("block_loss")
dual_loss = _stub("dual_loss")
prefetch = _stub("prefetch")
begin_block = _stub("begin_block")
plane_score = _stub("plane_score")
plane_corner = _stub("plane_corner")
oracle_corner = _stub("oracle_corner")
corner_labels = _stub("corner_labels")
fw_step = _stub("fw_step")
active_set_step = _stub("active_set_step")
round_scratch = _stub("round_scratch")
round_directions = _stub("round_directions")
round_sqnorm = _stub("round_sqnorm")
round_apply = _stub("round_apply")
round_clear = _stub("round_clear")
round_move = _stub("round_move")
