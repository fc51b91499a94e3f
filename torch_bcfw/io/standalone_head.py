"""A structured SVM head trained by torch_bcfw, as plain torch modules: this file needs only ``torch``.

:func:`torch_bcfw.io.export.export_head` copies this file beside the exported weights (``head.pt``), so that a
deployment loads the head without torch_bcfw installed::

    from head import load_head              # this file, copied as head.py
    head = load_head("head.pt")             # a torch.nn.Module in eval mode
    labels = head(x, lengths)               # chain: x [N_tok, F] (the words' tokens one after the other)
    labels = head(x)                        # multiclass: x [n, F]

Its decoders (Viterbi, argmax) are a second implementation of the package's, checked against them in the tests.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["ChainHead", "MulticlassHead", "load_head", "FORMAT"]

#: the ``format`` entry of a ``head.pt`` this file reads
FORMAT = "torch_bcfw.head/1"


class ChainHead(nn.Module):
    """Linear-chain head: emission ``We [F, K]``, label bias, start and end scores ``[K]``, transitions
    ``[K, K]`` (``trans[a, b]``: label ``a`` followed by ``b``).  ``forward(x [N_tok, F], lengths [B])`` returns the
    highest-scoring label sequence of every word (``LongTensor[N_tok]``, packed like ``x``)."""

    def __init__(self, emission: Tensor, bias: Tensor, start: Tensor, end: Tensor, transitions: Tensor):
        super().__init__()
        self.register_buffer("emission", emission)
        self.register_buffer("bias", bias)
        self.register_buffer("start", start)
        self.register_buffer("end", end)
        self.register_buffer("transitions", transitions)

    def unary_scores(self, x: Tensor, lengths: Tensor) -> Tensor:
        """``[N_tok, K]``: emission and bias of every token, the start / end scores on the first / last token."""
        u = x.to(self.emission.dtype) @ self.emission + self.bias
        ends = torch.cumsum(lengths, 0)
        u[ends - lengths] += self.start
        u[ends - 1] += self.end
        return u

    def forward(self, x: Tensor, lengths: Tensor) -> Tensor:
        lengths = torch.as_tensor(lengths, dtype=torch.long, device=x.device)
        if lengths.dim() != 1 or bool((lengths < 1).any()) or int(lengths.sum()) != x.shape[0]:
            raise ValueError(f"lengths must be positive and sum to the {x.shape[0]} tokens of x")
        u = self.unary_scores(x, lengths)
        out = torch.empty(x.shape[0], dtype=torch.long, device=x.device)
        first = 0
        for n in lengths.tolist():  # Viterbi per word
            score = u[first]
            back = []
            for t in range(1, n):
                cand = score[:, None] + self.transitions  # [previous label, label]
                score, arg = cand.max(0)
                score = score + u[first + t]
                back.append(arg)
            label = int(score.argmax())
            out[first + n - 1] = label
            for t in range(n - 2, -1, -1):
                label = int(back[t][label])
                out[first + t] = label
            first += n
        return out


class MulticlassHead(nn.Module):
    """Multiclass head: class weights ``[K, F]`` (and a bias per class).  ``forward(x [n, F])`` returns the
    highest-scoring class of every example (``LongTensor[n]``)."""

    def __init__(self, weights: Tensor, bias: Tensor | None):
        super().__init__()
        self.register_buffer("weights", weights)
        self.register_buffer("bias", bias)

    def forward(self, x: Tensor) -> Tensor:
        s = x.to(self.weights.dtype) @ self.weights.T
        if self.bias is not None:
            s = s + self.bias
        return s.argmax(1)


def load_head(path, map_location="cpu") -> nn.Module:
    """The head saved in ``path`` (a ``head.pt`` written by ``torch_bcfw.io.export.export_head``), in eval mode.
    The file is read with ``weights_only=True``: nothing in it runs code."""
    d = torch.load(path, map_location=map_location, weights_only=True)
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise ValueError(f"{path}: not a head file of format {FORMAT!r}")
    kinds = {"chain": ChainHead, "multiclass": MulticlassHead}
    if d.get("kind") not in kinds:
        raise ValueError(f"{path}: unknown head kind {d.get('kind')!r}; expected one of {sorted(kinds)}")
    return kinds[d["kind"]](**d["tensors"]).eval()
