"""Linear-chain SSVM (the OCR / CoNLL model of the BCFW paper).

Joint features of a sequence ``x_1..x_L`` (``x_t in R^F``) with labels ``y_1..y_L`` in ``[0, K)``:

* emission ``sum_t x_t (x) e_{y_t}`` (``F*K``, stored feature-major ``We[F, K]``);
* per-label bias ``sum_t e_{y_t}`` (``K``), start bias ``e_{y_1}`` and end bias ``e_{y_L}`` (``K`` each);
* transitions ``sum_t e_{y_t} (x) e_{y_{t+1}}`` (``K*K``, ``trans[a, b]`` for ``a`` followed by ``b``).

``d = F K + 3 K + K^2`` (4082 on OCR: F = 128 pixels, K = 26).  Loss: Hamming distance
normalised by the sequence length, so ``L_i in [0, 1]``; loss-augmented decoding adds ``1/L``
to every wrong label's unary score and runs the same Viterbi.

The dual state (:class:`ChainDualState`) stores per-position label marginals and per-sequence
transition marginals instead of a dense ``w_i`` per example: memory grows with the number of
tokens, not with ``n * d``.

Token features may be dense (OCR pixels) or sparse (:class:`~torch_bcfw.data.SparseFeatures`,
e.g. the ~75k indicator attributes of CoNLL-2000 chunking, ``d = 1,643,026``).  The model never
branches on the layout: unary scores are ``X We`` (:meth:`SequenceData.x_matmul`, a
gather-and-sum over each token's attributes when sparse), the emission block of a feature sum
is ``X^T mu`` (:meth:`SequenceData.xt_matmul`, summed per attribute), joint features are scattered
from the CSR entries (:meth:`SequenceData.x_csr`), and the compiled BCFW kernel takes the CSR
arrays of either layout.
"""
from __future__ import annotations

import numpy as np
import torch
from numba import njit
from torch import Tensor

from ..data import SequenceData, check_int
from ..inference.forward_backward import chain_marginals
from ..inference.viterbi import viterbi_packed
from .base import StructuredModel
from .dual import DualState

__all__ = ["Chain", "ChainDualState", "sequence_grams"]

#: largest ``[n, d]`` table :meth:`Chain.joint_feature` builds (2 GiB of float64)
_JOINT_FEATURE_LIMIT = 1 << 28


class Chain(StructuredModel):
    """Linear chain with emission, transition and start/end/per-label biases.

    Args:
        n_features: token feature dimension ``F``.
        n_labels: number of labels ``K`` (>= 2).
    """

    def __init__(self, n_features: int, n_labels: int):
        n_features, n_labels = check_int(n_features, "n_features"), check_int(n_labels, "n_labels")
        if n_labels < 2:
            raise ValueError(f"n_labels must be >= 2, got {n_labels}")
        if n_features < 1:
            raise ValueError(f"n_features must be >= 1, got {n_features}")
        self.n_inputs = n_features
        self.n_labels = n_labels
        F, K = self.n_inputs, self.n_labels
        self.n_features = F * K + 3 * K + K * K

    def config(self) -> dict:
        return {"n_features": self.n_inputs, "n_labels": self.n_labels}

    # ------------------------------------------------------------ layout
    def unpack(self, w: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """Views ``(We [F, K], bias [K], start [K], end [K], trans [K, K])`` into ``w: [d]``."""
        F, K = self.n_inputs, self.n_labels
        o = F * K
        return (
            w[:o].view(F, K),
            w[o : o + K],
            w[o + K : o + 2 * K],
            w[o + 2 * K : o + 3 * K],
            w[o + 3 * K :].view(K, K),
        )

    # ------------------------------------------------------------ checks
    def check_data(self, data, require_labels: bool = True) -> None:
        if not isinstance(data, SequenceData):
            raise TypeError(f"Chain expects SequenceData, got {type(data).__name__}")
        if data.n_inputs != self.n_inputs:
            raise ValueError(f"token features have dimension {data.n_inputs} but the model expects {self.n_inputs}")
        if data.y is None:
            if require_labels:
                raise ValueError("training data needs labels (y is None)")
            return
        lo, hi = int(data.y.min()), int(data.y.max())
        if lo < 0 or hi >= self.n_labels:
            raise ValueError(f"labels must lie in [0, {self.n_labels - 1}], got range [{lo}, {hi}]")

    def _check_y(self, data: SequenceData, y: Tensor) -> Tensor:
        y = torch.as_tensor(y, device=data.device).long().reshape(-1)
        if y.shape[0] != data.n_tokens:
            raise ValueError(f"expected {data.n_tokens} token labels, got {y.shape[0]}")
        return y

    # ------------------------------------------------------------ scores
    def unary_scores(self, w: Tensor, data: SequenceData) -> Tensor:
        """Per-token label scores ``[N_tok, K]`` with the bias, start and end terms folded in.

        The emission part is ``X We`` (:meth:`SequenceData.x_matmul`): a dense product, or for
        sparse token features a gather-and-sum of the rows of ``We`` named by each token's attributes.
        """
        self.check_weights(w, data)
        We, b, s, e, _ = self.unpack(w)
        U = data.x_matmul(We) + b
        U[data.offsets[:-1]] += s
        U[data.offsets[1:] - 1] += e
        return U

    def loss_unaries(self, data: SequenceData, dtype=torch.float64) -> Tensor:
        """``[N_tok, K]``: ``1/L_i`` for every wrong label of a token of sequence ``i``, 0 for the true one."""
        inv_len = (1.0 / data.lengths.to(dtype)).repeat_interleave(data.lengths)
        aug = inv_len[:, None].expand(-1, self.n_labels).clone()
        aug[torch.arange(data.n_tokens, device=data.device), data.y] = 0.0
        return aug

    def oracle(self, w: Tensor, data: SequenceData, loss_augmented: bool = True) -> Tensor:
        U = self.unary_scores(w, data)
        if loss_augmented:
            U = U + self.loss_unaries(data, U.dtype)
        labels, _ = viterbi_packed(U, data.offsets, self.unpack(w)[4])
        return labels

    def _pairs(self, data: SequenceData) -> Tensor:
        """Indices ``j`` of tokens followed by a token of the same sequence (``LongTensor[N_tok - n]``)."""
        keep = torch.ones(data.n_tokens, dtype=torch.bool, device=data.device)
        keep[data.offsets[1:] - 1] = False
        return torch.nonzero(keep)[:, 0]

    def marginals(self, w: Tensor, data: SequenceData, loss_augmented: bool = False):
        """Marginals of ``p_i(y) ~ exp([L_i(y)] + <w, phi(x_i, y)>)`` per sequence (forward-backward in log space,
        batched, CPU or CUDA).

        Returns:
            ``(log_Z [n], mu [N_tok, K], T [n, K, K])``: the log partition functions, the token label marginals
            and the expected transition counts of every sequence (float64).
        """
        U = self.unary_scores(w, data)
        if loss_augmented:
            U = U + self.loss_unaries(data, U.dtype)
        return chain_marginals(U, self.unpack(w)[4], data.offsets)

    # ------------------------------------------------------------ Gibbs parts (online EG)
    def gibbs_parts(self, w: Tensor, data: SequenceData, loss_augmented: bool = True) -> tuple[Tensor, Tensor]:
        """The loss-augmented score ``[L_i(y)] + <w, phi(x_i, y)>`` as parts: ``(node [N_tok, K], trans [K, K])``
        (start, end and bias folded into the node part).  Online EG adds ``eta`` times these to a block's
        log-potentials."""
        U = self.unary_scores(w, data)
        if loss_augmented:
            U = U + self.loss_unaries(data, U.dtype)
        return U, self.unpack(w)[4]

    def expected_loss(self, data: SequenceData, mu: Tensor) -> Tensor:
        """``E_p[L_i(y)]`` per sequence from token marginals ``mu [N_tok, K]`` (the normalised Hamming loss is
        linear in them): ``1/L_i sum_t (1 - mu_t(y_t))``."""
        right = mu.gather(1, data.y[:, None])[:, 0]
        out = torch.zeros(len(data), dtype=torch.float64, device=data.device)
        out.index_add_(0, data.token_sequence_ids(), 1.0 - right)
        return out / data.lengths.to(torch.float64)

    def _score_from_unary(self, U: Tensor, trans: Tensor, data: SequenceData, y: Tensor) -> Tensor:
        """Per-sequence ``<w, phi(x_i, y_i)>`` from unary scores ``U [N_tok, K]`` and ``trans [K, K]``."""
        per_tok = U.gather(1, y[:, None])[:, 0]
        j = self._pairs(data)
        seq = data.token_sequence_ids()
        out = torch.zeros(len(data), dtype=U.dtype, device=data.device)
        out.index_add_(0, seq, per_tok)
        out.index_add_(0, seq[j], trans[y[j], y[j + 1]])
        return out

    def score(self, w: Tensor, data: SequenceData, y: Tensor) -> Tensor:
        y = self._check_y(data, y)
        w = w.to(torch.float64)
        return self._score_from_unary(self.unary_scores(w, data), self.unpack(w)[4], data, y)

    def hinge_terms(self, w: Tensor, data: SequenceData) -> tuple[Tensor, Tensor]:
        """As :meth:`StructuredModel.hinge_terms`, computing the unary scores once."""
        w = w.to(torch.float64)
        U = self.unary_scores(w, data)
        trans = self.unpack(w)[4]
        y_star, _ = viterbi_packed(U + self.loss_unaries(data, U.dtype), data.offsets, trans)
        H = self.loss(data, y_star) + self._score_from_unary(U, trans, data, y_star) - self._score_from_unary(U, trans, data, data.y)
        return y_star, H

    def loss(self, data: SequenceData, y: Tensor) -> Tensor:
        y = self._check_y(data, y)
        wrong = torch.zeros(len(data), dtype=torch.float64, device=data.device)
        wrong.index_add_(0, data.token_sequence_ids(), (y != data.y).to(torch.float64))
        return wrong / data.lengths.to(torch.float64)

    # ------------------------------------------------------------ joint features
    def transition_counts(self, data: SequenceData, y: Tensor) -> Tensor:
        """Per-sequence transition counts ``[n, K, K]`` (float64)."""
        K = self.n_labels
        j = self._pairs(data)
        seq = data.token_sequence_ids()[j]
        out = torch.zeros(len(data), K, K, dtype=torch.float64, device=data.device)
        out.index_put_((seq, y[j], y[j + 1]), torch.ones(j.numel(), dtype=torch.float64, device=data.device), accumulate=True)
        return out

    def features_from_marginals(self, data: SequenceData, mu: Tensor, trans: Tensor) -> Tensor:
        """``sum_i phi(x_i, mu_i)`` for unary marginals ``mu: [N_tok, K]`` and summed transition marginals ``trans: [K, K]``.

        ``phi`` is linear in the marginals, so one-hot ``mu`` gives the joint feature of labelings.
        The emission block ``X^T mu`` sums, per attribute, the marginals of the tokens holding it
        (sparse features are never densified).
        """
        return torch.cat(
            [
                data.xt_matmul(mu.to(torch.float64)).reshape(-1),
                mu.sum(0),
                mu[data.offsets[:-1]].sum(0),
                mu[data.offsets[1:] - 1].sum(0),
                trans.reshape(-1),
            ]
        )

    def one_hot(self, y: Tensor) -> Tensor:
        return torch.nn.functional.one_hot(y, self.n_labels).to(torch.float64)

    def joint_feature_sum(self, data: SequenceData, y: Tensor) -> Tensor:
        y = self._check_y(data, y)
        return self.features_from_marginals(data, self.one_hot(y), self.transition_counts(data, y).sum(0))

    def joint_feature(self, data: SequenceData, y: Tensor) -> Tensor:
        """``phi(x_i, y_i')`` for every sequence: ``Tensor[n, d]`` (float64), scattered from the CSR entries.

        The output is dense, ``n * d`` numbers (13 MB per sequence on CoNLL); a request for more
        than ``2**28`` numbers (2 GiB) raises ``ValueError`` -- use :meth:`joint_feature_sum`,
        :meth:`score` or :meth:`features_from_marginals`, which never build it.
        """
        y = self._check_y(data, y)
        n, K, d = len(data), self.n_labels, self.n_features
        if n * d > _JOINT_FEATURE_LIMIT:
            raise ValueError(
                f"joint_feature would materialise a dense [{n}, {d}] table ({n * d:,} numbers); use it on "
                "fewer sequences (data[idx]) or use joint_feature_sum / score, which stay O(d)"
            )
        dev = data.device
        seq = data.token_sequence_ids()
        out = torch.zeros(n, d, dtype=torch.float64, device=dev)
        indptr, indices, values = data.x_csr()
        tok = torch.repeat_interleave(torch.arange(data.n_tokens, device=dev), indptr.diff())
        out.index_put_((seq[tok], indices * K + y[tok]), values.to(torch.float64), accumulate=True)
        o = self.n_inputs * K
        ones = torch.ones(data.n_tokens, dtype=torch.float64, device=dev)
        out.index_put_((seq, o + y), ones, accumulate=True)
        first, last = data.offsets[:-1], data.offsets[1:] - 1
        idx = torch.arange(n, device=dev)
        out[idx, o + K + y[first]] = 1.0
        out[idx, o + 2 * K + y[last]] = 1.0
        out[:, o + 3 * K :] = self.transition_counts(data, y).reshape(n, -1)
        return out

    def dual_state(self, data: SequenceData, lam: float) -> "ChainDualState":
        return ChainDualState(self, data, lam)


class ChainDualState(DualState):
    """Marginal dual state of the chain: ``mu [N_tok, K]`` and ``T [n, K, K]``.

    ``w_i = (phi_i(y_i) - phi_i(mu_i, T_i)) / (lam n)``; the initial state is the ground truth
    (``mu`` one-hot, ``T`` the true transition counts), i.e. ``w_i = 0``.  On CPU the steps run in
    the compiled kernel :func:`~torch_bcfw.models.chain_kernels.chain_bcfw_steps`; elsewhere in
    torch through :meth:`DualState.block_step`.
    """

    def __init__(self, model: Chain, data: SequenceData, lam: float):
        super().__init__(model, data, lam)
        self.mu = model.one_hot(data.y)
        self.T = model.transition_counts(data, data.y)
        self.mu_acc = torch.zeros_like(self.mu)
        # only the sum over blocks of the averaged transition marginals enters wbar: one K x K accumulator
        self.T_acc = torch.zeros_like(self.T[0])
        self._phi_true_sum = model.joint_feature_sum(data, data.y)
        self._kernel_inputs = None

    # ------------------------------------------------------------ storage hooks
    def _block_marginal_direction(self, i: int, y: Tensor) -> tuple[Tensor, Tensor]:
        blk = self.block_data(i)
        s, e = int(self.data.offsets[i]), int(self.data.offsets[i + 1])
        D = self.model.one_hot(y) - self.mu[s:e]
        dT = self.model.transition_counts(blk, y)[0] - self.T[i]
        return D, dT

    def block_direction(self, i: int, y: Tensor) -> tuple[Tensor, float]:
        blk = self.block_data(i)
        D, dT = self._block_marginal_direction(i, y)
        v = self.model.features_from_marginals(blk, D, dT) / (self.lam * self.n)
        return v, float(self.model.loss(blk, y)[0]) / self.n

    def _move_block(self, i: int, y: Tensor, gamma: float, v: Tensor) -> None:
        D, dT = self._block_marginal_direction(i, y)
        s, e = int(self.data.offsets[i]), int(self.data.offsets[i + 1])
        self.mu[s:e] += gamma * D
        self.T[i] += gamma * dT

    def _move_block_general(self, i, y_s, y_a, coeffs, gamma, d, drop) -> None:
        p, q, r = coeffs
        blk = self.block_data(i)
        s, e = int(self.data.offsets[i]), int(self.data.offsets[i + 1])
        D = r * self.mu[s:e] + p * self.model.one_hot(y_s) + q * self.model.one_hot(y_a)
        dT = r * self.T[i] + p * self.model.transition_counts(blk, y_s)[0] + q * self.model.transition_counts(blk, y_a)[0]
        self.mu[s:e] += gamma * D
        self.T[i] += gamma * dT

    def set_block_marginals(self, i: int, mu: Tensor, T: Tensor, ell_i: float) -> None:
        """Move block ``i`` to the (interior) dual point with token marginals ``mu [L_i, K]``, expected transition
        counts ``T [K, K]`` and ``l_i = ell_i`` (online EG): ``w`` and ``l`` follow exactly (``phi`` is linear in
        the marginals).  The weighted average is not kept for such moves."""
        blk = self.block_data(i)
        s, e = int(self.data.offsets[i]), int(self.data.offsets[i + 1])
        dv = self.model.features_from_marginals(blk, self.mu[s:e] - mu, self.T[i] - T) / (self.lam * self.n)
        self.mu[s:e] = mu
        self.T[i] = T
        self.v = self.v + dv
        self._sync_w()
        self.ell += ell_i - float(self.block_ell[i])
        self.block_ell[i] = ell_i

    def block_value(self, i: int) -> float:
        """``l_i - lam <w_i, w> = l_i + (score(mu_i) - score(y_i)) / n`` from the block's unary scores."""
        blk = self.block_data(i)
        s, e = int(self.data.offsets[i]), int(self.data.offsets[i + 1])
        U = self.model.unary_scores(self.w, blk)
        trans = self.model.unpack(self.w)[4]
        s_mu = float((U * self.mu[s:e]).sum() + (self.T[i] * trans).sum())
        s_true = float(self.model._score_from_unary(U, trans, blk, blk.y)[0])
        return float(self.block_ell[i]) + (s_mu - s_true) / self.n

    def block_gaps(self) -> tuple[Tensor, Tensor, Tensor]:
        """All exact block gaps ``(score(y*) - score(mu_i)) / n - l_i + l_s`` from one unary pass and one
        batched Viterbi (see :meth:`DualState.block_gaps`)."""
        model, data = self.model, self.data
        w = self.w
        U = model.unary_scores(w, data)
        trans = model.unpack(w)[4]
        y_star, _ = viterbi_packed(U + model.loss_unaries(data, U.dtype), data.offsets, trans)
        s_true = model._score_from_unary(U, trans, data, data.y)
        H = model.loss(data, y_star) + model._score_from_unary(U, trans, data, y_star) - s_true
        s_mu = torch.zeros(self.n, dtype=torch.float64, device=w.device)
        s_mu.index_add_(0, data.token_sequence_ids(), (U * self.mu).sum(1))
        s_mu += (self.T * trans).sum((1, 2))
        dots = (s_true - s_mu) / self.n  # lam <w_i, w>
        return H / self.n - (self.block_ell - dots), H, y_star

    def _move_all(self, y: Tensor, gamma: float) -> None:
        self.mu.mul_(1.0 - gamma).add_(self.model.one_hot(y), alpha=gamma)
        self.T.mul_(1.0 - gamma).add_(self.model.transition_counts(self.data, y), alpha=gamma)

    def block_w(self, i: int) -> Tensor:
        blk = self.block_data(i)
        s, e = int(self.data.offsets[i]), int(self.data.offsets[i + 1])
        true = self.model.joint_feature_sum(blk, blk.y)
        return (true - self.model.features_from_marginals(blk, self.mu[s:e], self.T[i])) / (self.lam * self.n)

    def _w_from_blocks(self) -> Tensor:
        cur = self.model.features_from_marginals(self.data, self.mu, self.T.sum(0))
        return (self._phi_true_sum - cur) / (self.lam * self.n)

    def _avg_accumulate(self, i, S) -> None:
        if i is None:
            self.mu_acc.add_(S.repeat_interleave(self.data.lengths)[:, None] * self.mu)
            self.T_acc.add_((S[:, None, None] * self.T).sum(0))
        else:
            s, e = int(self.data.offsets[i]), int(self.data.offsets[i + 1])
            self.mu_acc[s:e].add_(self.mu[s:e], alpha=S)
            self.T_acc.add_(self.T[i], alpha=S)

    def _avg_w(self, S: Tensor, total: float) -> Tensor:
        mu = (self.mu_acc + S.repeat_interleave(self.data.lengths)[:, None] * self.mu) / total
        T = (self.T_acc + (S[:, None, None] * self.T).sum(0)) / total
        return (self._phi_true_sum - self.model.features_from_marginals(self.data, mu, T)) / (self.lam * self.n)

    def _rescale_storage(self, rho: float) -> None:
        """``mu <- rho mu + (1 - rho) onehot(y)``, ``T <- rho T + (1 - rho) T(y)`` (see :meth:`DualState.rescale_lam`)."""
        self.mu.mul_(rho).add_(self.model.one_hot(self.data.y), alpha=1.0 - rho)
        self.T.mul_(rho).add_(self.model.transition_counts(self.data, self.data.y), alpha=1.0 - rho)

    def _avg_reset_storage(self) -> None:
        self.mu_acc.zero_()
        self.T_acc.zero_()

    # ------------------------------------------------------------ compiled path
    def _prepare_kernel(self) -> dict:
        """CSR token features and per-sequence Gram matrices ``X_i X_i^T + 1`` (built once).

        The CSR arrays come straight from :meth:`SequenceData.x_csr` (stored sparse features,
        or the non-zeros of dense ones), and the Gram matrices are computed from them by
        :func:`sequence_grams`, so dense data and the same data stored sparse give identical
        kernel inputs.  Feature ids, values and Gram entries go to the kernels in the narrowest types
        that hold them exactly (:func:`_narrow_ids`, :func:`_narrow_exact`: one byte each for OCR's
        binary pixels): a step reads them for every token of its block, a cache miss per line on a
        random block order, and widening them back inside the kernels is exact.
        """
        if self._kernel_inputs is None:
            indptr, indices, values = (t.cpu().contiguous() for t in self.data.x_csr())
            values = values.to(torch.float64)
            off = self.data.offsets.cpu()
            gram, gram_off = sequence_grams(indptr, indices, values, off, self.data.n_inputs)
            self._kernel_inputs = {
                "indptr": indptr.numpy(),
                "indices": _narrow_ids(indices, self.data.n_inputs),
                "values": _narrow_exact(values),
                "y": self.data.y.cpu().numpy(),
                "offsets": off.numpy(),
                "gram": _narrow_exact(gram),
                "gram_off": gram_off.numpy(),
            }
        return self._kernel_inputs

    def run_steps(self, order: np.ndarray, step_code: int, averaging: bool = True) -> np.ndarray:
        if self.w.device.type != "cpu" or self.has_bounds:  # box constraints: the generic (torch) steps
            return super().run_steps(order, step_code, averaging)
        from .chain_kernels import chain_bcfw_steps

        kin = self._prepare_kernel()
        gaps = np.empty(len(order), dtype=np.float64)
        ells = np.array([self.ell, self.avg_ell_u])
        w_views = [t.numpy() for t in self.model.unpack(self.v)]
        self.k, self.avg_t = chain_bcfw_steps(
            np.ascontiguousarray(order, dtype=np.int64), step_code, averaging, self.lam, self.k,
            kin["indptr"], kin["indices"], kin["values"], kin["y"], kin["offsets"], kin["gram"], kin["gram_off"],
            *w_views, self.mu.numpy(), self.T.numpy(), self.block_ell.numpy(), ells, gaps,
            self.avg_t, self.mu_acc.numpy(), self.T_acc.numpy(), self.avg_last.numpy(),
        )
        self.ell, self.avg_ell_u = float(ells[0]), float(ells[1])
        return gaps

    def can_run_plan(self) -> bool:
        """The fused kernel :meth:`run_plan` applies: CPU tensors and no box constraints."""
        return self.w.device.type == "cpu" and not self.has_bounds

    def run_plan(self, plan) -> "PlanResult":
        """Run a :class:`~torch_bcfw.models.plan.StepPlan` in the compiled loop
        :func:`~torch_bcfw.models.chain_variant_kernels.chain_plan_steps` (same trajectory as the generic
        step loop; only when :meth:`can_run_plan`)."""
        from .chain_variant_kernels import NEED_GAP_PASS, chain_plan_steps
        from .plan import PlanResult

        kin = self._prepare_kernel()
        m = int(plan.m)
        gaps = np.full(m, np.nan)
        blocks = np.full(m, -1, dtype=np.int64)
        ells = np.array([self.ell, self.avg_ell_u])
        counters = np.zeros(6, dtype=np.int64)
        w_views = [t.numpy() for t in self.model.unpack(self.v)]
        ws = self.working_set if plan.use_ws else None
        if ws is not None:
            wsa = ws.arrays()
        else:
            z = np.zeros(1, dtype=np.int64)
            wsa = (z, z.copy(), z.copy(), z.copy(), z.copy(), np.zeros(2, dtype=np.int64), np.zeros(1, dtype=np.uint64),
                   np.zeros((1, 3)), np.zeros(1, dtype=np.int32), np.zeros(1, dtype=np.uint8))
        order = plan.order if plan.order is not None else np.zeros(0, dtype=np.int64)
        uniforms = plan.uniforms if plan.uniforms is not None else np.zeros(0)
        key, fl, lab = chain_plan_steps(
            m, int(plan.sample_mode), np.ascontiguousarray(order, dtype=np.int64), np.ascontiguousarray(uniforms, dtype=np.float64),
            plan.queue, plan.smeta, plan.est, plan.tree, int(plan.tsize), float(plan.power), bool(plan.track_est),
            int(plan.rule), bool(plan.use_ws), bool(plan.cache), float(plan.F), float(plan.glob_thr), int(plan.max_size),
            bool(plan.keep_inactive), *wsa,
            int(plan.step_code), bool(plan.averaging), self.lam, self.k,
            kin["indptr"], kin["indices"], kin["values"], kin["y"], kin["offsets"], kin["gram"], kin["gram_off"],
            *w_views, self.mu.numpy(), self.T.numpy(), self.block_ell.numpy(), ells, gaps, blocks,
            self.avg_t, self.mu_acc.numpy(), self.T_acc.numpy(), self.avg_last.numpy(), counters,
        )
        if ws is not None:
            ws.set_pool(key, fl, lab)
        self.ell, self.avg_ell_u = float(ells[0]), float(ells[1])
        done = int(counters[0])
        self.k, self.avg_t = int(counters[4]), int(counters[5])
        return PlanResult(steps=done, oracle_calls=int(counters[1]), cache_hits=int(counters[2]),
                          need_gap_pass=int(counters[3]) == NEED_GAP_PASS, blocks=blocks[:done], gaps=gaps[:done])

    def _storage_dict(self) -> dict:
        return {name: getattr(self, name).cpu().clone() for name in ("mu", "T", "mu_acc", "T_acc")}

    def _load_storage(self, sd: dict) -> None:
        dev = self.w.device
        for name in ("mu", "T", "mu_acc", "T_acc"):
            setattr(self, name, sd[name].to(dev, torch.float64).clone())


def _narrow_ids(ids: Tensor, n: int) -> np.ndarray:
    """``ids`` (in ``[0, n)``) as the narrowest of uint8, uint16, uint32 that holds ``n - 1`` (int64 beyond)."""
    dtype = next((t for t in (np.uint8, np.uint16, np.uint32) if n - 1 <= np.iinfo(t).max), np.int64)
    return ids.numpy().astype(dtype)


def _narrow_exact(x: Tensor) -> np.ndarray:
    """The float64 ``x`` as uint8 when its entries are integers in ``[0, 255]``, else as float32 when that is exact,
    else unchanged."""
    if bool(((x >= 0) & (x <= 255) & (x == x.round())).all()):
        return x.to(torch.uint8).numpy()
    y = x.to(torch.float32)
    return y.numpy() if torch.equal(y.to(torch.float64), x) else x.numpy()


def sequence_grams(indptr: Tensor, indices: Tensor, values: Tensor, offsets: Tensor, n_features: int) -> tuple[Tensor, Tensor]:
    """Per-sequence Gram matrices ``G_i = X_i X_i^T + 1`` of CSR token features (CPU).

    ``G_i`` is ``L_i x L_i``, stored row-major at ``gram[gram_off[i] : gram_off[i+1]]``.  Each
    entry is a sparse dot product (the ``+1`` is the per-label bias feature), so the cost is
    ``sum_i L_i^2 * nnz per token`` and the features are never densified.

    Returns:
        ``(gram Tensor[sum_i L_i^2] float64, gram_off LongTensor[n + 1])``.
    """
    offsets = offsets.cpu().long()
    lengths = offsets.diff()
    gram_off = torch.zeros(lengths.numel() + 1, dtype=torch.long)
    gram_off[1:] = torch.cumsum(lengths**2, 0)
    gram = torch.empty(int(gram_off[-1]), dtype=torch.float64)
    _sequence_grams(
        indptr.cpu().long().numpy(), indices.cpu().long().numpy(), values.cpu().to(torch.float64).numpy(),
        offsets.numpy(), gram_off.numpy(), int(n_features), gram.numpy(),
    )
    return gram, gram_off


@njit(cache=True)
def _sequence_grams(indptr, indices, values, offsets, gram_off, n_features, gram):
    scratch = np.zeros(n_features)
    for i in range(offsets.shape[0] - 1):
        s = offsets[i]
        L = offsets[i + 1] - s
        g0 = gram_off[i]
        for t in range(L):
            a = s + t
            for p in range(indptr[a], indptr[a + 1]):
                scratch[indices[p]] += values[p]
            for t2 in range(t, L):
                b = s + t2
                dot = 0.0
                for p in range(indptr[b], indptr[b + 1]):
                    dot += scratch[indices[p]] * values[p]
                gram[g0 + t * L + t2] = dot + 1.0
                gram[g0 + t2 * L + t] = dot + 1.0
            for p in range(indptr[a], indptr[a + 1]):
                scratch[indices[p]] = 0.0
