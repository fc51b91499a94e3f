"""Linear-chain SSVM (the OCR / CoNLL model of the BCFW paper).

Joint features of a sequence ``x_1..x_L`` (``x_t in R^F``) with labels ``y_1..y_L`` in ``[0, K)``: emission
``sum_t x_t (x) e_{y_t}`` (``F*K``, stored feature-major ``We[F, K]``), per-label bias ``sum_t e_{y_t}``, start bias
``e_{y_1}`` and end bias ``e_{y_L}`` (``K`` each), transitions ``sum_t e_{y_t} (x) e_{y_{t+1}}`` (``K*K``,
``trans[a, b]`` for ``a`` followed by ``b``); ``d = F K + 3 K + K^2``.  Loss: Hamming distance normalised by the
sequence length (``L_i in [0, 1]``); loss-augmented decoding adds ``1/L`` to every wrong label's unary score.

Token features may be dense or sparse (:class:`~torch_bcfw.data.sequences.SparseFeatures`); the model never branches on
the layout (:meth:`SequenceData.x_matmul`, :meth:`SequenceData.xt_matmul`, :meth:`SequenceData.x_csr`).  The dual state
(:class:`~torch_bcfw.duals.chain.ChainDualState`) stores token and transition marginals instead of a dense ``w_i``.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..checks import check_int
from ..data.sequences import SequenceData
from ..head_ops import ChainHeadOps
from ..duals.chain import ChainDualState
from ..duals.chain_subgradient import ChainSubgradientSteps
from ..inference.forward_backward import chain_marginals
from ..inference.viterbi import viterbi_packed
from .base import StructuredModel

__all__ = ["Chain"]

#: largest ``[n, d]`` table :meth:`Chain.joint_feature` builds (2 GiB of float64)
_JOINT_FEATURE_LIMIT = 1 << 28


class Chain(StructuredModel):
    """Linear chain with emission, transition and start/end/per-label biases.

    Args:
        n_features: token feature dimension ``F``.
        n_labels: number of labels ``K`` (>= 2).
    """

    #: the chain's dual state runs every sampling, pairwise / away steps and the cache in its compiled loops
    compiled_steps = "all"

    def __init__(self, n_features: int, n_labels: int):
        self.n_inputs = check_int(n_features, "n_features", minimum=1)
        self.n_labels = check_int(n_labels, "n_labels", minimum=2)
        F, K = self.n_inputs, self.n_labels
        self.n_features = F * K + 3 * K + K * K

    def config(self) -> dict:
        return {"n_features": self.n_inputs, "n_labels": self.n_labels}

    def head_ops(self) -> ChainHeadOps:
        return ChainHeadOps(self)

    def unpack(self, w: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """Views ``(We [F, K], bias [K], start [K], end [K], trans [K, K])`` into ``w: [d]``."""
        F, K = self.n_inputs, self.n_labels
        o = F * K
        return (w[:o].view(F, K), w[o : o + K], w[o + K : o + 2 * K], w[o + 2 * K : o + 3 * K],
                w[o + 3 * K :].view(K, K))

    def check_data(self, data, require_labels: bool = True) -> None:
        if not isinstance(data, SequenceData):
            raise TypeError(f"Chain expects SequenceData, got {type(data).__name__}")
        if data.n_inputs != self.n_inputs:
            raise ValueError(f"token features have dimension {data.n_inputs} but the model expects {self.n_inputs}")
        self._check_labels(data.y, require_labels, self.n_labels)

    def unary_scores(self, w: Tensor, data: SequenceData) -> Tensor:
        """Per-token label scores ``[N_tok, K]``: ``X We`` plus the bias, start and end terms."""
        self.check_weights(w, data)
        We, b, s, e, _ = self.unpack(w)
        U = data.x_matmul(We) + b
        U[data.offsets[:-1]] += s
        U[data.offsets[1:] - 1] += e
        return U

    def loss_unaries(self, data: SequenceData, dtype=torch.float64) -> Tensor:
        """``[N_tok, K]``: ``1/L_i`` for every wrong label of a token of sequence ``i``, 0 for the true one."""
        return self.head_ops().loss_unaries(data.y, data.offsets, dtype)

    def oracle(self, w: Tensor, data: SequenceData, loss_augmented: bool = True) -> Tensor:
        U, trans = self.gibbs_parts(w, data, loss_augmented)
        return viterbi_packed(U, data.offsets, trans)[0]

    def _pairs(self, data: SequenceData) -> Tensor:
        """Indices ``j`` of tokens followed by a token of the same sequence (``LongTensor[N_tok - n]``)."""
        keep = torch.ones(data.n_tokens, dtype=torch.bool, device=data.device)
        keep[data.offsets[1:] - 1] = False
        return torch.nonzero(keep)[:, 0]

    def marginals(self, w: Tensor, data: SequenceData, loss_augmented: bool = False):
        """Marginals of ``p_i(y) ~ exp([L_i(y)] + <w, phi(x_i, y)>)`` per sequence (batched forward-backward):
        ``(log_Z [n], mu [N_tok, K], T [n, K, K])``, the log partition functions, token label marginals and
        expected transition counts (float64)."""
        U, trans = self.gibbs_parts(w, data, loss_augmented)
        return chain_marginals(U, trans, data.offsets)

    def gibbs_parts(self, w: Tensor, data: SequenceData, loss_augmented: bool = True) -> tuple[Tensor, Tensor]:
        """The (loss-augmented) score ``[L_i(y)] + <w, phi(x_i, y)>`` as ``(node [N_tok, K], trans [K, K])``."""
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

    def score_from_unary(self, U: Tensor, trans: Tensor, data: SequenceData, y: Tensor) -> Tensor:
        """Per-sequence ``<w, phi(x_i, y_i)>`` from unary scores ``U [N_tok, K]`` and ``trans [K, K]``."""
        per_tok = U.gather(1, y[:, None])[:, 0]
        j = self._pairs(data)
        seq = data.token_sequence_ids()
        out = torch.zeros(len(data), dtype=U.dtype, device=data.device)
        out.index_add_(0, seq, per_tok)
        out.index_add_(0, seq[j], trans[y[j], y[j + 1]])
        return out

    def score(self, w: Tensor, data: SequenceData, y: Tensor) -> Tensor:
        y = self._flat_labels(data, y, data.n_tokens, "token labels")
        w = w.to(torch.float64)
        return self.score_from_unary(self.unary_scores(w, data), self.unpack(w)[4], data, y)

    def hinge_terms(self, w: Tensor, data: SequenceData) -> tuple[Tensor, Tensor]:
        """As :meth:`StructuredModel.hinge_terms`, computing the unary scores once."""
        w = w.to(torch.float64)
        U = self.unary_scores(w, data)
        trans = self.unpack(w)[4]
        y_star, _ = viterbi_packed(U + self.loss_unaries(data, U.dtype), data.offsets, trans)
        H = self.loss(data, y_star) + self.score_from_unary(U, trans, data, y_star) - self.score_from_unary(U, trans, data, data.y)
        return y_star, H

    def loss(self, data: SequenceData, y: Tensor) -> Tensor:
        y = self._flat_labels(data, y, data.n_tokens, "token labels")
        wrong = torch.zeros(len(data), dtype=torch.float64, device=data.device)
        wrong.index_add_(0, data.token_sequence_ids(), (y != data.y).to(torch.float64))
        return wrong / data.lengths.to(torch.float64)

    def transition_counts(self, data: SequenceData, y: Tensor) -> Tensor:
        """Per-sequence transition counts ``[n, K, K]`` (float64)."""
        K = self.n_labels
        j = self._pairs(data)
        seq = data.token_sequence_ids()[j]
        out = torch.zeros(len(data), K, K, dtype=torch.float64, device=data.device)
        out.index_put_((seq, y[j], y[j + 1]), torch.ones(j.numel(), dtype=torch.float64, device=data.device), accumulate=True)
        return out

    def features_from_marginals(self, data: SequenceData, mu: Tensor, trans: Tensor) -> Tensor:
        """``sum_i phi(x_i, mu_i)`` for unary marginals ``mu: [N_tok, K]`` and summed transition marginals
        ``trans: [K, K]`` (``phi`` is linear in them; sparse features are never densified)."""
        return torch.cat([data.xt_matmul(mu.to(torch.float64)).reshape(-1), mu.sum(0), mu[data.offsets[:-1]].sum(0),
                          mu[data.offsets[1:] - 1].sum(0), trans.reshape(-1)])

    def one_hot(self, y: Tensor) -> Tensor:
        """The labels ``y: LongTensor[N_tok]`` as one-hot rows ``Tensor[N_tok, K]`` (float64)."""
        out = torch.zeros(y.shape[0], self.n_labels, dtype=torch.float64, device=y.device)
        return out.scatter_(1, y[:, None], 1.0)

    def joint_feature_sum(self, data: SequenceData, y: Tensor) -> Tensor:
        """``sum_i phi(x_i, y_i)``: ``Tensor[d]`` (float64), from label counts and ``X^T onehot(y)``: the numbers
        of ``features_from_marginals(data, one_hot(y), transition_counts(data, y).sum(0))`` without those tables."""
        y = self._flat_labels(data, y, data.n_tokens, "token labels")
        K = self.n_labels
        self._check_labels(y, True, K)
        j = self._pairs(data)

        def counts(labels: Tensor, n: int) -> Tensor:
            return torch.bincount(labels, minlength=n).to(torch.float64)

        return torch.cat([data.xt_one_hot(y, K).reshape(-1), counts(y, K), counts(y[data.offsets[:-1]], K),
                          counts(y[data.offsets[1:] - 1], K), counts(y[j] * K + y[j + 1], K * K)])

    def joint_feature(self, data: SequenceData, y: Tensor) -> Tensor:
        """``phi(x_i, y_i')`` for every sequence: dense ``Tensor[n, d]`` (float64); more than ``2**28`` numbers
        raise ``ValueError`` (use :meth:`joint_feature_sum` or :meth:`score`, which never build it)."""
        y = self._flat_labels(data, y, data.n_tokens, "token labels")
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

    def dual_state(self, data: SequenceData, lam: float, n_total: int | None = None) -> ChainDualState:
        """The marginal state :class:`~torch_bcfw.duals.chain.ChainDualState`."""
        return ChainDualState(self, data, lam, n_total)

    def subgradient_steps(self, data: SequenceData, lam: float, averaging: bool):
        """On CPU with the chain's own oracle the compiled steps
        (:class:`~torch_bcfw.duals.chain_subgradient.ChainSubgradientSteps`, ``O(nnz(x_i) K)`` per step), else the
        generic ones."""
        if data.device.type == "cpu" and self.builtin_oracle():
            return ChainSubgradientSteps(self, data, lam, averaging)
        return super().subgradient_steps(data, lam, averaging)

    def builtin_oracle(self) -> bool:
        """True unless a subclass overrides :meth:`oracle` (the compiled steps then call it from Python)."""
        return type(self).oracle is Chain.oracle

    def prox_geometry(self, data: SequenceData, lam: float, proj_tol: float, proj_iters: int):
        """Entropic prox steps on the marginal polytopes (:class:`~torch_bcfw.duals.prox.EntropicChainGeometry`);
        ``proj_tol`` and ``proj_iters`` are not used (the steps are exact)."""
        from ..duals.prox import EntropicChainGeometry

        return EntropicChainGeometry(self, data, lam)
