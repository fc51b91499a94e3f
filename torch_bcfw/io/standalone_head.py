"""A structured SVM head trained by torch_bcfw, as plain torch modules: this file needs only ``torch`` and
``safetensors``.

:func:`torch_bcfw.export.export_head` copies this file beside the exported weights (``head.safetensors``), so that a
deployment loads the head without torch_bcfw installed::

    from head import load_head              # this file, copied as head.py
    head = load_head("head.safetensors")    # a torch.nn.Module in eval mode
    labels = head(x, lengths)               # chain: x [N_tok, F] (the words' tokens one after the other)
    labels = head(x, lengths)               # chain, padded: x [B, T, F], lengths [B] (None: all T) -> [B, T], -1 pads
    labels = head(x)                        # multiclass: x [n, F]

Its decoders (Viterbi, argmax) are a second implementation of the package's, checked against them in the tests.
"""
from __future__ import annotations

import torch
from safetensors import SafetensorError, safe_open
from torch import Tensor, nn

__all__ = ["ChainHead", "MulticlassHead", "load_head", "read_head", "check_head", "HEAD_TENSORS", "FORMAT"]

#: the ``format`` entry of the metadata of a head file this file reads
FORMAT = "torch_bcfw.head/2"

#: entries of the ``[K, K, words]`` table of moves the Viterbi forward pass builds at once (about 6 MB of float64;
#: measured on a 2-core x86 VM: faster than a max over the previous label in ``K`` steps at every word count)
MOVE_TABLE_ENTRIES = 3 << 18


class ChainHead(nn.Module):
    """Linear-chain head: emission ``We [F, K]``, label bias, start and end scores ``[K]``, transitions
    ``[K, K]`` (``trans[a, b]``: label ``a`` followed by ``b``).  ``forward(x [N_tok, F], lengths [B])`` returns the
    highest-scoring label sequence of every word (``LongTensor[N_tok]``, packed like ``x``); padded words
    ``forward(x [B, T, F], lengths [B] or None)`` give ``LongTensor[B, T]`` with ``-1`` past each word's length."""

    def __init__(self, emission: Tensor, bias: Tensor, start: Tensor, end: Tensor, transitions: Tensor):
        super().__init__()
        # column-major [F, K] (a contiguous [K, F] transposed): ``x @ emission`` takes BLAS's faster path for this
        # layout (measured 1.5x on OCR's [4617, 128] x [128, 26])
        self.register_buffer("emission", emission.T.contiguous().T)
        self.register_buffer("bias", bias)
        self.register_buffer("start", start)
        self.register_buffer("end", end)
        self.register_buffer("transitions", transitions)

    def unary_scores(self, x: Tensor, lengths: Tensor) -> Tensor:
        """``[N_tok, K]``: emission and bias of every token, the start / end scores on the first / last token."""
        u = torch.addmm(self.bias, x.to(self.emission.dtype), self.emission)
        ends = torch.cumsum(lengths, 0)
        u[ends - lengths] += self.start
        u[ends - 1] += self.end
        return u

    def forward(self, x: Tensor, lengths: Tensor | None = None) -> Tensor:
        F = self.emission.shape[0]
        if x.dim() not in (2, 3) or x.shape[-1] != F:
            raise ValueError(f"x must be packed tokens [N_tok, {F}] with lengths [B], or padded words [B, T, {F}] with "
                             f"lengths [B] (or None: all of length T); got shape {tuple(x.shape)}")
        if x.dim() == 3:
            B, T, _ = x.shape
            lengths = torch.full((B,), T, dtype=torch.long) if lengths is None else lengths
            lengths = torch.as_tensor(lengths, dtype=torch.long, device=x.device)
            if lengths.shape != (B,) or bool((lengths < 1).any()) or bool((lengths > T).any()):
                raise ValueError(f"lengths of padded words [{B}, {T}, {F}] must be [{B}] with values in [1, {T}]")
            mask = torch.arange(T, device=x.device)[None, :] < lengths[:, None]
            out = torch.full((B, T), -1, dtype=torch.long, device=x.device)
            out[mask] = self(x[mask], lengths)
            return out
        if lengths is None:
            raise ValueError(f"packed tokens x [{x.shape[0]}, {F}] need lengths [B] (the words' token counts)")
        lengths = torch.as_tensor(lengths, dtype=torch.long, device=x.device)
        if lengths.dim() != 1 or bool((lengths < 1).any()) or int(lengths.sum()) != x.shape[0]:
            raise ValueError(f"lengths must be positive and sum to the {x.shape[0]} tokens of x")
        return self.viterbi(self.unary_scores(x, lengths), lengths)

    def viterbi(self, u: Tensor, lengths: Tensor) -> Tensor:
        """The best label sequence of every word from its unary scores ``u [N_tok, K]`` (packed) and the
        transitions, all words at once.  The words are taken longest first, so that step ``t`` works on the
        ``n_t`` words longer than ``t`` (a prefix), and the tokens are laid out step-major and label-major once
        (``[K, N_tok]``, step ``t`` in columns ``at_t : at_t + n_t``).  The forward pass turns these columns into
        the best prefix scores ending in each label (a max over the previous label of a ``[K, K, words]`` table of
        moves, built for at most :data:`MOVE_TABLE_ENTRIES` entries at once);
        the backward pass takes each word's argmax over its previous label for the label chosen after it.
        Returns ``LongTensor[N_tok]``, packed like ``u``."""
        B, T, K = lengths.shape[0], int(lengths.max()), u.shape[1]
        order = torch.argsort(lengths, descending=True, stable=True)
        sorted_len = lengths[order]
        steps = torch.arange(T, device=u.device)[:, None]
        inside = sorted_len[None, :] > steps  # [T, B]: word b (sorted) has a token at step t
        active = inside.sum(1).tolist()  # n_t per step
        starts = torch.cumsum(lengths, 0)[order] - sorted_len  # first token of each (sorted) word
        tokens = (starts[None, :] + steps)[inside]  # step-major token order (row-major over [T, B])
        scores_all = u.index_select(0, tokens).T.contiguous()  # [K, N_tok]
        scores, at = [], 0  # scores[t]: [K, n_t], best prefix scores ending in each label (after the forward pass)
        for n in active:
            scores.append(scores_all[:, at:at + n])
            at += n
        trans = self.transitions  # [previous label, label]
        work = u.new_empty(2, K * active[0])
        chunk = max(1, MOVE_TABLE_ENTRIES // (K * K))  # words per [K, K, chunk] table of moves
        table = u.new_empty(K * K * min(chunk, active[0]))

        def buffer(i: int, n: int) -> Tensor:
            return work[i, :K * n].view(K, n)

        for t in range(1, T):  # best[k] = max_p prev[p] + trans[p, k], a table of moves per chunk of words
            n = active[t]
            best = buffer(0, n)
            for s in range(0, n, chunk):
                e = min(n, s + chunk)
                moves = torch.add(scores[t - 1][:, None, s:e], trans[:, :, None],
                                  out=table[:K * K * (e - s)].view(K, K, e - s))
                torch.amax(moves, 0, out=best[:, s:e])
            scores[t].add_(best)
        last = buffer(0, B)  # each word's scores at its last token
        for t in range(T):
            done = slice(active[t + 1] if t + 1 < T else 0, active[t])  # the words of length t + 1
            last[:, done] = scores[t][:, done]
        cur = last.max(0).indices  # [B] (sorted order): each word's last label
        labels = torch.empty_like(tokens)  # step-major, like tokens
        at = tokens.shape[0]
        for t in range(T - 1, -1, -1):
            n = active[t]
            if t + 1 < T:  # the words longer than t + 1 step back from their label at t + 1
                m = active[t + 1]
                into = torch.index_select(trans, 1, cur[:m], out=buffer(1, m))  # [previous label, m]
                cur[:m] = into.add_(scores[t][:, :m]).max(0).indices  # the first maximum, as argmax
            at -= n
            labels[at:at + n] = cur[:n]
        out = torch.empty_like(tokens)
        out[tokens] = labels
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


def load_head(path) -> nn.Module:
    """The head saved in ``path`` (a ``head.safetensors`` written by ``torch_bcfw.export.export_head``), in eval
    mode (:func:`read_head`)."""
    kind, tensors = read_head(path)
    return {"chain": ChainHead, "multiclass": MulticlassHead}[kind](**tensors).eval()


def read_head(path) -> tuple[str, dict]:
    """``(kind, tensors)`` of the head file at ``path``: a safetensors file (nothing in it runs code) whose metadata
    names the format and the kind, holding exactly the tensors of that kind, checked by :func:`check_head`
    (``ValueError`` in one line naming the file and the entry)."""
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
            spec = HEAD_TENSORS.get(metadata.get("kind"), {})
            unknown = sorted(set(f.keys()) - set(spec))
            if unknown and spec:
                raise ValueError(f"{path}: a {metadata['kind']} head holds the tensors {sorted(spec)}, this file "
                                 f"also {unknown}")
            tensors = {name: f.get_tensor(name) for name in f.keys() if name in spec}
    except (SafetensorError, OSError) as exc:
        raise ValueError(f"{path}: not a readable head file ({str(exc).strip().splitlines()[0][:200]})") from None
    return check_head(metadata, {**dict.fromkeys(spec), **tensors}, path)


#: the tensors of each kind of head: name -> shape in the letters ``K`` (labels) and ``F`` (features); ``?``: may be
#: ``None`` (a multiclass head without biases)
HEAD_TENSORS = {
    "chain": {"emission": "FK", "bias": "K", "start": "K", "end": "K", "transitions": "KK"},
    "multiclass": {"weights": "KF", "bias": "K?"},
}


def check_head(metadata: dict, tensors, path="head file") -> tuple[str, dict]:
    """``(kind, tensors)`` of a head file's ``metadata`` (``format`` and ``kind``) and ``tensors`` (name -> tensor,
    ``None`` for an absent optional one) once its format, kind, tensor names, shapes (consistent sizes ``K`` and
    ``F``), dtypes (one floating dtype) and values (finite) are those :data:`HEAD_TENSORS` lists, else ``ValueError``
    (one line naming ``path`` and what is wrong)."""
    if not isinstance(metadata, dict) or metadata.get("format") != FORMAT:
        raise ValueError(f"{path}: not a head file of format {FORMAT!r}")
    kind = metadata.get("kind")
    if not isinstance(kind, str) or kind not in HEAD_TENSORS:
        raise ValueError(f"{path}: unknown head kind {kind!r}; expected one of {sorted(HEAD_TENSORS)}")
    spec = HEAD_TENSORS[kind]
    if not isinstance(tensors, dict) or set(tensors) != set(spec):
        got = sorted(tensors) if isinstance(tensors, dict) else type(tensors).__name__
        raise ValueError(f"{path}: a {kind} head holds the tensors {sorted(spec)}, this file {got}")
    sizes, dtype = {}, None
    for name, dims in spec.items():
        t = tensors[name]
        if t is None and dims.endswith("?"):
            continue
        if t is None:
            raise ValueError(f"{path}: head tensor {name!r} is missing")
        if not isinstance(t, Tensor) or t.layout != torch.strided:
            raise ValueError(f"{path}: head tensor {name!r} is not a dense tensor ({type(t).__name__})")
        if t.dtype not in (torch.float32, torch.float64) or (dtype is not None and t.dtype != dtype):
            raise ValueError(f"{path}: head tensor {name!r} has dtype {t.dtype}; a head's tensors share one of "
                             "float32 / float64")
        dtype = t.dtype
        want = dims.rstrip("?")
        if t.dim() != len(want):
            raise ValueError(f"{path}: head tensor {name!r} has shape {tuple(t.shape)}, expected {len(want)} "
                             f"dimension(s) ({', '.join(want)})")
        for letter, n in zip(want, t.shape):
            if sizes.setdefault(letter, n) != n or n < 1:
                raise ValueError(f"{path}: head tensor {name!r} has shape {tuple(t.shape)}, but the head's {letter} "
                                 f"is {sizes[letter]}")
        if not bool(torch.isfinite(t).all()):
            raise ValueError(f"{path}: head tensor {name!r} holds NaN or infinite values")
    return kind, tensors
