"""Link features for word alignment, built from parallel *text only* (never from gold links).

:class:`AlignmentFeaturizer` is fitted on sentence pairs and reads nothing but their lower-cased tokens.  It gathers
sentence co-occurrence counts (the Dice coefficient), token frequencies, and three pairs of translation models
trained by EM in both directions (:mod:`torch_bcfw.features.translation`): IBM Model 1, Model 1 with fast_align's
diagonal prior (Dyer et al. 2013; ``diagonal_tension=0`` drops it) and the HMM aligner (Vogel et al. 1996, NULL
states of Och & Ney 2003; ``hmm_iterations=0`` drops it).

Features of the link between English word ``e_j`` and French word ``f_k`` (:attr:`AlignmentFeaturizer.names` lists
them in order): a bias; Dice, its bins and its diagonal neighbours; Dice ranks in both directions; the distortion
``|(j + 1/2)/m - (k + 1/2)/f|``, its square and bins; orthography (identical tokens, common prefixes, punctuation,
numbers, the log length ratio); frequency bins; and per model pair (prefixes ``ibm1_``, ``diag_``, ``hmm_``) the
posteriors of both directions, their product, minimum and maximum, the best links of each direction with their
intersection and union, the translation probabilities on a log scale and the diagonal neighbours' posterior
products.  Every feature lies in ``[0, 1]`` (so one ``lam`` suits them all).
"""
from __future__ import annotations

import math
import os
import unicodedata
from typing import Sequence

import numpy as np
import torch
from torch import Tensor

from .translation import train_hmm, train_ibm

__all__ = ["AlignmentFeaturizer", "dice_competitive_linking", "symmetrize", "run_eflomal", "link_indicator_features",
           "LINK_FEATURE_NAMES"]

_DICE_BINS = (0.05, 0.1, 0.2, 0.3, 0.5)
_DIST_BINS = (0.05, 0.1, 0.2, 0.3)
_FREQ_BINS = (1, 3, 10, 50, 500)  # counts <= each bound, then > the last
_LOG_FLOOR = 1e-6


def _lower(tokens) -> list[str]:
    return [t.lower() for t in tokens]


def _is_punct(tok: str) -> bool:
    return all(unicodedata.category(ch).startswith("P") or unicodedata.category(ch).startswith("S") for ch in tok)


def _is_number(tok: str) -> bool:
    t = tok.replace(",", "").replace(".", "")
    return t.isdigit() if t else False


class AlignmentFeaturizer:
    """Link features from text statistics (see the module docstring).

    Args:
        ibm_iterations: EM iterations of every IBM model.
        diagonal_tension: fast_align's diagonal tension for the second model pair (0: no second pair).
        null_prob: NULL alignment probability of the diagonal model.
        hmm_iterations: EM iterations of the HMM aligners (0: no HMM features).
    """

    def __init__(self, ibm_iterations: int = 5, diagonal_tension: float = 4.0, null_prob: float = 0.08,
                 hmm_iterations: int = 5):
        from ..checks import check_int

        self.ibm_iterations = check_int(ibm_iterations, "ibm_iterations", minimum=1)
        self.hmm_iterations = check_int(hmm_iterations, "hmm_iterations", minimum=0)
        if not (isinstance(diagonal_tension, (int, float)) and not isinstance(diagonal_tension, bool)
                and math.isfinite(diagonal_tension) and diagonal_tension >= 0):
            raise ValueError(f"diagonal_tension must be a finite number >= 0, got {diagonal_tension!r}")
        if not (isinstance(null_prob, (int, float)) and not isinstance(null_prob, bool) and 0 < null_prob < 1):
            raise ValueError(f"null_prob must lie in (0, 1), got {null_prob!r}")
        self.diagonal_tension = float(diagonal_tension)
        self.null_prob = float(null_prob)
        self.fitted = False

    @property
    def names(self) -> list[str]:
        n = ["bias", "dice"]
        n += [f"dice>={b}" for b in _DICE_BINS]
        n += ["dice_prev_diag", "dice_next_diag", "dice_max_diag"]
        n += ["rank_e1", "rank_e2", "rank_f1", "rank_f2", "rank_mutual"]
        n += ["dist", "dist2"] + [f"dist<{b}" for b in _DIST_BINS]
        n += ["identical", "identical_long", "prefix3", "prefix4", "prefix5", "prefix_ratio", "both_punct",
              "same_punct", "one_punct", "both_number", "same_number", "len_ratio"]
        n += [f"freq_e<={b}" for b in _FREQ_BINS] + [f"freq_e>{_FREQ_BINS[-1]}"]
        n += [f"freq_f<={b}" for b in _FREQ_BINS] + [f"freq_f>{_FREQ_BINS[-1]}"]
        for tag in self._ibm_tags():
            n += [f"{tag}_{s}" for s in ("post_fe", "post_ef", "post_prod", "post_min", "post_max", "vit_fe",
                                         "vit_ef", "vit_inter", "vit_union", "logt_fe", "logt_ef", "prod_prev_diag",
                                         "prod_next_diag", "prod_max_diag")]
        return n

    @property
    def n_features(self) -> int:
        return len(self.names)

    def _ibm_tags(self) -> list[str]:
        return ["ibm1"] + (["diag"] if self.diagonal_tension > 0 else []) + (["hmm"] if self.hmm_iterations else [])

    def fit_stages(self) -> list[str]:
        """The names of the stages of :meth:`fit`, in order (for a progress bar)."""
        return ["vocabulary"] + [f"{tag} {d}" for tag in self._ibm_tags() for d in ("e->f", "f->e")]

    def fit(self, pairs: Sequence, on_stage=None) -> "AlignmentFeaturizer":
        """Gather the statistics from the tokens of ``pairs`` (their links, if any, are never read).  ``on_stage``:
        called with the name of each of :meth:`fit_stages` when it is done."""
        done = on_stage if on_stage is not None else (lambda name: None)
        if len(pairs) == 0:
            raise ValueError("AlignmentFeaturizer.fit needs at least one sentence pair")
        texts = [(_lower(p.english), _lower(p.french)) for p in pairs]
        self.e_vocab = {w: i for i, w in enumerate(sorted({w for e, _ in texts for w in e}))}
        self.f_vocab = {w: i for i, w in enumerate(sorted({w for _, f in texts for w in f}))}
        Ve, Vf = len(self.e_vocab), len(self.f_vocab)
        e_ids = [np.array([self.e_vocab[w] for w in e], dtype=np.int64) for e, _ in texts]
        f_ids = [np.array([self.f_vocab[w] for w in f], dtype=np.int64) for _, f in texts]
        self.e_count = np.bincount(np.concatenate(e_ids), minlength=Ve)
        self.f_count = np.bincount(np.concatenate(f_ids), minlength=Vf)
        ue = [np.unique(a) for a in e_ids]
        uf = [np.unique(a) for a in f_ids]
        self.e_sent = np.bincount(np.concatenate(ue), minlength=Ve)
        self.f_sent = np.bincount(np.concatenate(uf), minlength=Vf)
        co = torch.from_numpy(np.concatenate([(a[:, None] * Vf + b[None, :]).reshape(-1) for a, b in zip(ue, uf)]))
        self.co_keys, self.co_counts = torch.unique(co, return_counts=True)
        done("vocabulary")
        self.ibm = {}
        for tag, tension in zip(("ibm1", "diag"), (0.0, self.diagonal_tension)):
            if tag not in self._ibm_tags():
                continue
            fe = train_ibm(e_ids, f_ids, Ve, Vf, self.ibm_iterations, tension, self.null_prob)  # t(f | e)
            done(f"{tag} e->f")
            ef = train_ibm(f_ids, e_ids, Vf, Ve, self.ibm_iterations, tension, self.null_prob)  # t(e | f)
            done(f"{tag} f->e")
            self.ibm[tag] = (fe, ef)
        if self.hmm_iterations:
            fe1, ef1 = self.ibm["ibm1"]
            fe_hmm = train_hmm(e_ids, f_ids, fe1, self.hmm_iterations)
            done("hmm e->f")
            self.ibm["hmm"] = (fe_hmm, train_hmm(f_ids, e_ids, ef1, self.hmm_iterations))
            done("hmm f->e")
        self.fitted = True
        return self

    def _ids(self, pair) -> tuple[np.ndarray, np.ndarray]:
        if not self.fitted:
            raise RuntimeError("fit the AlignmentFeaturizer on the text first")
        e, f = _lower(pair.english), _lower(pair.french)
        missing = [w for w in e if w not in self.e_vocab] + [w for w in f if w not in self.f_vocab]
        if missing:
            raise ValueError(f"pair {getattr(pair, 'snum', '?')}: words not in the fitted text ({missing[:5]}); fit "
                             "the featurizer on a corpus that includes this pair's text")
        return (np.array([self.e_vocab[w] for w in e], dtype=np.int64),
                np.array([self.f_vocab[w] for w in f], dtype=np.int64))

    def dice(self, pair) -> np.ndarray:
        """``[m, f]`` Dice coefficients of the pair's word pairs."""
        e, f = self._ids(pair)
        q = torch.from_numpy((e[:, None] * len(self.f_vocab) + f[None, :]).reshape(-1))
        pos = torch.searchsorted(self.co_keys, q).clamp_max(self.co_keys.numel() - 1)
        c = torch.where(self.co_keys[pos] == q, self.co_counts[pos], torch.zeros((), dtype=torch.long)).numpy()
        c = c.reshape(len(e), len(f)).astype(np.float64)
        return 2.0 * c / (self.e_sent[e][:, None] + self.f_sent[f][None, :])

    def ibm_posteriors(self, pair, tag: str = "ibm1") -> dict:
        """Posteriors and best links of the model pair ``tag`` (``"ibm1"``, ``"diag"`` or ``"hmm"``), each
        ``[m, f]``: ``post_fe`` (``p(a_k = j)``), ``post_ef`` (``p(b_j = k)``), ``vit_fe``, ``vit_ef`` (0/1: each
        word's most probable partner, when it beats NULL; for the HMM the maximum-posterior links), ``t_fe``,
        ``t_ef`` (the translation tables)."""
        e, f = self._ids(pair)
        fe, ef = self.ibm[tag]
        p_fe, null_fe = fe.posteriors(e, f)  # [f, m]
        p_ef, null_ef = ef.posteriors(f, e)  # [m, f]
        m, n = len(e), len(f)
        vit_fe, vit_ef = np.zeros((n, m)), np.zeros((m, n))  # vit_fe transposed below
        for vit, p, null in ((vit_fe, p_fe, null_fe), (vit_ef, p_ef, null_ef)):
            best = p.argmax(1)
            ok = p[np.arange(len(p)), best] > null
            vit[np.arange(len(p))[ok], best[ok]] = 1.0
        t_fe = fe.lookup(np.broadcast_to(e[:, None], (m, n)), np.broadcast_to(f[None, :], (m, n)))
        t_ef = ef.lookup(np.broadcast_to(f[None, :], (m, n)), np.broadcast_to(e[:, None], (m, n)))
        return {"post_fe": p_fe.T, "post_ef": p_ef, "vit_fe": vit_fe.T, "vit_ef": vit_ef, "t_fe": t_fe, "t_ef": t_ef}

    def pair_features(self, pair) -> Tensor:
        """``[m, f, F]`` float64 link features of one pair."""
        e_ids, f_ids = self._ids(pair)
        e, f = _lower(pair.english), _lower(pair.french)
        m, n = len(e), len(f)
        D = self.dice(pair)
        cols = [np.ones((m, n)), D]
        cols += [(D >= b).astype(np.float64) for b in _DICE_BINS]
        Dp = np.pad(D, 1)
        prev, nxt = Dp[:-2, :-2], Dp[2:, 2:]
        cols += [prev, nxt, np.maximum(prev, nxt)]
        # rank of f_k in e_j's row (0 = best), ties counted pessimistically by order
        row_rank = (D[:, None, :] > D[:, :, None]).sum(2)  # number of strictly better partners of (j, k) in row j
        col_rank = (D[None, :, :] > D[:, None, :]).sum(1)  # strictly better partners of (j, k) in column k
        cols += [(row_rank == 0).astype(float), (row_rank == 1).astype(float), (col_rank == 0).astype(float),
                 (col_rank == 1).astype(float), ((row_rank == 0) & (col_rank == 0)).astype(float)]
        dist = np.abs((np.arange(m)[:, None] + 0.5) / m - (np.arange(n)[None, :] + 0.5) / n)
        cols += [dist, dist ** 2] + [(dist < b).astype(np.float64) for b in _DIST_BINS]
        orth = np.zeros((m, n, 12))
        pe = [_is_punct(w) for w in e]
        pf = [_is_punct(w) for w in f]
        ne = [_is_number(w) for w in e]
        nf = [_is_number(w) for w in f]
        for j, a in enumerate(e):
            for k, b in enumerate(f):
                same = a == b
                lcp = len(os.path.commonprefix([a, b]))
                orth[j, k] = (same, same and len(a) > 3, lcp >= 3, lcp >= 4, lcp >= 5, lcp / min(len(a), len(b)),
                              pe[j] and pf[k], pe[j] and pf[k] and same, pe[j] != pf[k], ne[j] and nf[k],
                              ne[j] and nf[k] and same, min(abs(math.log(len(a) / len(b))), 3.0) / 3.0)
        cols += [orth[..., i] for i in range(orth.shape[-1])]
        for counts, ids, axis in ((self.e_count, e_ids, 0), (self.f_count, f_ids, 1)):
            c = counts[ids]
            bins = np.searchsorted(np.array(_FREQ_BINS), c, side="left")  # 0: c <= 1, ..., 5: c > 500
            onehot = np.eye(len(_FREQ_BINS) + 1)[bins]  # [len, 6]
            full = onehot[:, None, :] if axis == 0 else onehot[None, :, :]
            full = np.broadcast_to(full, (m, n, onehot.shape[1]))
            cols += [full[..., i] for i in range(full.shape[-1])]
        for tag in self._ibm_tags():
            s = self.ibm_posteriors(pair, tag)
            a, b = s["post_fe"], s["post_ef"]
            cols += [a, b, a * b, np.minimum(a, b), np.maximum(a, b), s["vit_fe"], s["vit_ef"],
                     s["vit_fe"] * s["vit_ef"], np.maximum(s["vit_fe"], s["vit_ef"])]
            for t in (s["t_fe"], s["t_ef"]):
                cols.append(1.0 - np.log(np.maximum(t, _LOG_FLOOR)) / math.log(_LOG_FLOOR))
            pp = np.pad(a * b, 1)
            prev, nxt = pp[:-2, :-2], pp[2:, 2:]
            cols += [prev, nxt, np.maximum(prev, nxt)]
        return torch.from_numpy(np.stack([np.asarray(c, dtype=np.float64) for c in cols], -1))

    def transform(self, pairs: Sequence) -> list[Tensor]:
        """``[m_i, f_i, F]`` link features of every pair."""
        return [self.pair_features(p) for p in pairs]


def dice_competitive_linking(dice: np.ndarray, threshold: float = 0.0) -> np.ndarray:
    """Competitive linking (Melamed 2000) on a ``[m, f]`` Dice matrix: repeatedly link the highest-Dice pair of
    still-free words while its Dice exceeds ``threshold``.  Returns a 0/1 ``int64 [m, f]`` matching."""
    D = np.asarray(dice, dtype=np.float64)
    m, n = D.shape
    y = np.zeros((m, n), dtype=np.int64)
    order = np.argsort(-D, axis=None, kind="stable")
    used_e = np.zeros(m, bool)
    used_f = np.zeros(n, bool)
    for flat in order:
        j, k = divmod(int(flat), n)
        if D[j, k] <= threshold:
            break
        if not used_e[j] and not used_f[k]:
            y[j, k] = 1
            used_e[j] = used_f[k] = True
    return y


def symmetrize(forward: np.ndarray, reverse: np.ndarray, method: str = "grow-diag") -> np.ndarray:
    """Combine two directional alignments (0/1 ``[m, f]`` matrices) into one (Koehn et al. 2003).

    ``method``: ``"intersection"``, ``"union"``, ``"grow-diag"`` (start from the intersection and repeatedly add
    union links that neighbour an alignment link, horizontally, vertically or diagonally, and touch a word not
    yet aligned), ``"grow-diag-final"`` (then add the remaining union links of a word still unaligned) or
    ``"grow-diag-final-and"`` (... of two words still unaligned).  Returns ``int64 [m, f]``.
    """
    a = np.asarray(forward) > 0
    b = np.asarray(reverse) > 0
    if a.shape != b.shape:
        raise ValueError(f"the two alignments have shapes {a.shape} and {b.shape}")
    if method == "intersection":
        return (a & b).astype(np.int64)
    if method == "union":
        return (a | b).astype(np.int64)
    if method not in ("grow-diag", "grow-diag-final", "grow-diag-final-and"):
        raise ValueError(f"unknown symmetrization {method!r}; use intersection, union, grow-diag, grow-diag-final "
                         "or grow-diag-final-and")
    union = a | b
    A = a & b
    m, n = A.shape
    steps = [(-1, 0), (0, -1), (1, 0), (0, 1), (-1, -1), (-1, 1), (1, -1), (1, 1)]
    grown = True
    while grown:
        grown = False
        for j, k in zip(*np.nonzero(A)):
            for dj, dk in steps:
                jj, kk = j + dj, k + dk
                if 0 <= jj < m and 0 <= kk < n and union[jj, kk] and not A[jj, kk] and (
                        not A[jj].any() or not A[:, kk].any()):
                    A[jj, kk] = True
                    grown = True
    if method != "grow-diag":
        both = method == "grow-diag-final-and"
        for d in (a, b):
            for j, k in zip(*np.nonzero(d & ~A)):
                free_e, free_f = not A[j].any(), not A[:, k].any()
                if (free_e and free_f) if both else (free_e or free_f):
                    A[j, k] = True
    return A.astype(np.int64)


#: names of the columns :func:`link_indicator_features` adds per aligner
LINK_FEATURE_NAMES = ("fwd", "rev", "intersection", "grow_diag", "union", "fwd_neighbour", "rev_neighbour")


def run_eflomal(pairs: Sequence, model: int = 3, n_samplers: int = 3, rel_iterations: float = 1.0,
                null_prior: float = 0.2) -> tuple[list, list]:
    """Align the (lower-cased) texts of ``pairs`` with eflomal (Ostling & Tiedemann 2016; ``pip install eflomal``,
    GPLv3, kept out of the library's dependencies): ``(forward, reverse)``, per pair a 0/1 ``int64 [m, f]`` matrix
    (English ``j``, French ``k``).  eflomal samples (Gibbs) without a seed: two runs may differ slightly."""
    try:
        from eflomal import Aligner
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("run_eflomal needs the eflomal package (pip install eflomal; GPLv3, an optional extra: "
                          "pip install torch_bcfw[eflomal])") from exc
    import tempfile
    from pathlib import Path

    src = [" ".join(_lower(p.english)) + "\n" for p in pairs]
    trg = [" ".join(_lower(p.french)) + "\n" for p in pairs]
    with tempfile.TemporaryDirectory() as tmp:
        fwd, rev = Path(tmp) / "fwd", Path(tmp) / "rev"
        Aligner(model=model, n_samplers=n_samplers, rel_iterations=rel_iterations, null_prior=null_prior).align(
            src, trg, links_filename_fwd=str(fwd), links_filename_rev=str(rev), quiet=True)
        out = []
        for path in (fwd, rev):
            lines = path.read_text().split("\n")[: len(pairs)]
            mats = []
            for p, line in zip(pairs, lines):
                y = np.zeros(p.sizes, dtype=np.int64)
                for tok in line.split():
                    j, k = tok.split("-")
                    y[int(j), int(k)] = 1
                mats.append(y)
            out.append(mats)
    return out[0], out[1]


def link_indicator_features(forward: np.ndarray, reverse: np.ndarray) -> Tensor:
    """``[m, f, 7]`` features of a pair from two directional alignments (:data:`LINK_FEATURE_NAMES`): each
    direction, their intersection, grow-diag and union, and whether a diagonal neighbour ``(j +- 1, k +- 1)`` is
    linked in each direction."""
    a = np.asarray(forward, dtype=np.float64)
    b = np.asarray(reverse, dtype=np.float64)

    def neighbour(t):
        p = np.pad(t, 1)
        return np.maximum(p[:-2, :-2], p[2:, 2:])

    cols = [a, b, a * b, symmetrize(a, b, "grow-diag").astype(np.float64), np.maximum(a, b), neighbour(a),
            neighbour(b)]
    return torch.from_numpy(np.stack(cols, -1))
