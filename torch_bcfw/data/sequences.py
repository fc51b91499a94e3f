"""Feature rows and sequences: :class:`MulticlassData` (one feature vector and one label per example) and
:class:`SequenceData` (variable-length sequences), with :class:`SparseFeatures` for sparse token features.

* :class:`SequenceData` stores sequences *packed*: ``x: [N_tok, F]``, ``y: LongTensor[N_tok]`` and
  ``offsets: LongTensor[n + 1]``.  Token features are dense or a :class:`SparseFeatures` CSR matrix (e.g. the
  ~75k indicator attributes of CoNLL-2000); models use :meth:`SequenceData.x_matmul`,
  :meth:`SequenceData.xt_matmul` and :meth:`SequenceData.x_csr` and never branch on the layout.

Containers check their inputs eagerly (shapes, finiteness, non-empty, ids in range).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

from ..checks import check_finite, check_index_tensor, check_input_tensor, check_int, check_not_meta, check_offsets
from .base import as_index, cat_field, cat_offsets, check_cat_parts, counts_to_offsets, dense_features, segment_rows

__all__ = ["MulticlassData", "SequenceData", "SparseFeatures"]


#: largest dense padded feature tensor :meth:`SequenceData.padded` builds from sparse features
_PADDED_SPARSE_LIMIT = 1 << 27

#: stored entries per call of the gather-and-sum products: bounds their ``[entries]`` temporaries
_BAG_CHUNK = 1 << 20


def _sparse_err(msg: str) -> ValueError:
    return ValueError(f"SparseFeatures: {msg}")


class SparseFeatures:
    """A sparse ``[n_rows, n_features]`` feature matrix in compressed sparse row (CSR) form.

    Row ``t`` is ``sum_p values[p] * e_{indices[p]}`` over ``p in indptr[t] : indptr[t+1]``; a row may be empty
    and may name a column more than once (the entries add up).  The sparse layout of :attr:`SequenceData.x`.
    Treat it as immutable: :meth:`t_matmul` caches the transposed entries.

    Args:
        indptr: ``LongTensor[n_rows + 1]``: non-decreasing, ``indptr[0] = 0``, ``indptr[-1] = nnz``.
        indices: ``LongTensor[nnz]``: column (attribute) ids in ``[0, n_features)``.
        values: ``Tensor[nnz]``, floating point (integers become float64); ``None``: all ones (float64).
        n_features: the number of columns ``F``.
        check: validate the arrays (default; matrices derived from a valid one skip it).

    Raises:
        ValueError: malformed ``indptr``, an id outside ``[0, n_features)``, a NaN or infinite value, or arrays
            on different devices.
    """

    def __init__(self, indptr, indices, values, n_features: int, check: bool = True):
        for name, t in (("indptr", indptr), ("indices", indices), ("values", values)):
            check_not_meta(t, f"SparseFeatures.{name}")
        self.indptr = torch.as_tensor(indptr)
        self.indices = torch.as_tensor(indices)
        if values is None:
            values = torch.ones(self.indices.shape, dtype=torch.float64, device=self.indices.device)
        self.values = torch.as_tensor(values)
        self.n_features = check_int(n_features, "SparseFeatures.n_features")
        if check:
            self._validate()

    def _validate(self) -> None:
        for name in ("indptr", "indices"):
            t = getattr(self, name)
            if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
                raise _sparse_err(f"{name} must hold integers, got {t.dtype}")
            setattr(self, name, t.long())
        check_input_tensor(self.values, "SparseFeatures.values")
        if not self.values.is_floating_point():
            self.values = self.values.double()
        devices = {self.indptr.device, self.indices.device, self.values.device}
        if len(devices) != 1:
            raise _sparse_err(f"indptr, indices and values are on different devices: {sorted(map(str, devices))}")
        if self.n_features < 1:
            raise _sparse_err(f"n_features must be >= 1, got {self.n_features}")
        if self.indices.dim() != 1 or self.values.shape != self.indices.shape:
            raise _sparse_err(
                f"indices and values must be 1-D of the same length, got shapes "
                f"{tuple(self.indices.shape)} and {tuple(self.values.shape)}"
            )
        nnz = self.indices.numel()
        check_offsets(self.indptr, nnz, "SparseFeatures: indptr", "nnz", "row", empty_ok=True, min_len=1)
        if nnz:
            lo, hi = int(self.indices.min()), int(self.indices.max())
            if lo < 0 or hi >= self.n_features:
                bad = int(((self.indices < 0) | (self.indices >= self.n_features)).sum())
                raise _sparse_err(
                    f"attribute ids must lie in [0, {self.n_features - 1}] (n_features = {self.n_features}); "
                    f"found {bad} id(s) outside, range [{lo}, {hi}]"
                )
        check_finite(self.values, "SparseFeatures.values")

    @classmethod
    def from_dense(cls, x: Tensor) -> "SparseFeatures":
        """The non-zeros of a dense ``[n_rows, F]`` tensor, row by row in column order."""
        x = torch.as_tensor(x)
        if x.dim() != 2:
            raise _sparse_err(f"from_dense needs a 2-D tensor, got shape {tuple(x.shape)}")
        nz = torch.nonzero(x)
        indptr = counts_to_offsets(torch.bincount(nz[:, 0], minlength=x.shape[0]))
        values = x[nz[:, 0], nz[:, 1]]
        return cls(indptr, nz[:, 1].contiguous(), values if values.is_floating_point() else values.double(),
                   x.shape[1], check=False)

    @classmethod
    def from_attribute_ids(cls, ids: Tensor, n_features: int, values: Tensor | None = None,
                           pad_id: int = -1) -> "SparseFeatures":
        """Rows from a padded id matrix ``ids: LongTensor[n_rows, A]`` (``A`` attribute slots per row).

        Slots equal to ``pad_id`` (``PAD_ID`` of :mod:`torch_bcfw.features.chunking`) are dropped; ``values:
        [n_rows, A]`` gives the slots' values (default 1).  Any other id outside ``[0, n_features)`` raises
        ``ValueError``.
        """
        n_features = check_int(n_features, "n_features")
        pad_id = check_int(pad_id, "pad_id")
        check_not_meta(ids, "attribute ids")
        ids = torch.as_tensor(ids)
        if ids.dim() != 2 or ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            raise _sparse_err(f"attribute ids must be an integer [n_rows, A] tensor, got {ids.dtype} of shape {tuple(ids.shape)}")
        ids = ids.long()
        keep = ids != pad_id
        bad = keep & ((ids < 0) | (ids >= int(n_features)))
        if bool(bad.any()):
            r, c = (int(v) for v in torch.nonzero(bad)[0])
            raise _sparse_err(
                f"attribute id {int(ids[r, c])} at row {r}, slot {c} is outside [0, {int(n_features) - 1}] "
                f"(n_features = {int(n_features)}; pad_id {pad_id} marks an empty slot); {int(bad.sum())} bad id(s) in all"
            )
        indptr = counts_to_offsets(keep.sum(1))
        if values is not None:
            values = torch.as_tensor(values, device=ids.device)
            if values.shape != ids.shape:
                raise _sparse_err(f"values must have the shape of ids {tuple(ids.shape)}, got {tuple(values.shape)}")
            values = values[keep]
        return cls(indptr, ids[keep], values, n_features)

    @classmethod
    def from_torch(cls, x: Tensor) -> "SparseFeatures":
        """From a torch sparse 2-D tensor (COO, CSR or any layout :meth:`torch.Tensor.to_sparse_csr` accepts)."""
        if x.dim() != 2:
            raise _sparse_err(f"sparse token features must be 2-D [N_tok, F], got shape {tuple(x.shape)}")
        if x.layout == torch.sparse_coo:
            x = x.coalesce()
            rows, cols = x.indices()
            return cls(counts_to_offsets(torch.bincount(rows, minlength=x.shape[0])), cols, x.values(), x.shape[1])
        if x.layout != torch.sparse_csr:
            x = x.to_sparse_csr()
        return cls(x.crow_indices(), x.col_indices(), x.values(), x.shape[1])

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.indptr.numel() - 1, self.n_features))

    @property
    def n_rows(self) -> int:
        return self.indptr.numel() - 1

    @property
    def nnz(self) -> int:
        return self.indices.numel()

    @property
    def device(self) -> torch.device:
        return self.values.device

    @property
    def dtype(self) -> torch.dtype:
        return self.values.dtype

    def __repr__(self) -> str:
        return f"SparseFeatures(shape={tuple(self.shape)}, nnz={self.nnz}, dtype={self.dtype}, device={self.device})"

    def row_ids(self) -> Tensor:
        """``LongTensor[nnz]``: the row of every stored entry."""
        return torch.repeat_interleave(torch.arange(self.n_rows, device=self.device), self.indptr.diff())

    def __getitem__(self, rows) -> "SparseFeatures":
        """The rows ``rows`` (a ``LongTensor`` or list of row indices, repeats allowed), in that order."""
        rows = torch.as_tensor(rows, dtype=torch.long, device=self.device).reshape(-1)
        pos, indptr = segment_rows(self.indptr, rows)
        return SparseFeatures(indptr, self.indices[pos], self.values[pos], self.n_features, check=False)

    def to(self, *args, **kwargs) -> "SparseFeatures":
        """Move to a device and/or cast the values (``to(device)``, ``to(dtype)``, ``to(device, dtype)``)."""
        values = self.values.to(*args, **kwargs)
        if values is self.values:
            return self
        dev = values.device
        return SparseFeatures(self.indptr.to(dev), self.indices.to(dev), values, self.n_features, check=False)

    @classmethod
    def cat(cls, parts: Sequence["SparseFeatures"]) -> "SparseFeatures":
        """The rows of ``parts`` (same ``n_features`` and device) one after another."""
        if len(parts) == 0 or len({(p.n_features, str(p.device)) for p in parts}) != 1:
            raise ValueError("SparseFeatures.cat needs at least one matrix, all with the same n_features and device")
        return cls(cat_offsets([p.indptr for p in parts]), torch.cat([p.indices for p in parts]),
                   torch.cat([p.values for p in parts]), parts[0].n_features, check=False)

    def to_dense(self) -> Tensor:
        """The dense ``Tensor[n_rows, n_features]`` (duplicate entries of a row add up)."""
        out = torch.zeros(self.n_rows, self.n_features, dtype=self.dtype, device=self.device)
        out.index_put_((self.row_ids(), self.indices), self.values, accumulate=True)
        return out

    def matmul(self, W: Tensor) -> Tensor:
        """``X W`` for ``W: [n_features, K]``: each row gathers and sums its rows of ``W`` (``[n_rows, K]``, ``W``'s dtype)."""
        if W.dim() != 2 or W.shape[0] != self.n_features:
            raise ValueError(f"SparseFeatures.matmul: expected W of shape [{self.n_features}, K], got {tuple(W.shape)}")
        return _bag_sums(self.indices, W, self.indptr, self.values)

    def t_matmul(self, M: Tensor) -> Tensor:
        """``X^T M`` for ``M: [n_rows, K]`` (``[n_features, K]``, ``M``'s dtype): a gather-and-sum over the
        cached column-major entries, never densifying ``X``."""
        if M.dim() != 2 or M.shape[0] != self.n_rows:
            raise ValueError(f"SparseFeatures.t_matmul: expected M of shape [{self.n_rows}, K], got {tuple(M.shape)}")
        if self.nnz == 0:
            return M.new_zeros(self.n_features, M.shape[1])
        indptr_t, rows_t, values_t = self._transposed()
        return _bag_sums(rows_t, M, indptr_t, values_t)

    def t_matmul_one_hot(self, labels: Tensor, n_labels: int, dtype: torch.dtype = torch.float64) -> Tensor:
        """``X^T onehot(labels)`` for ``labels: LongTensor[n_rows]`` in ``[0, n_labels)``: ``Tensor[n_features,
        n_labels]`` in ``dtype``, entry ``[f, k]`` the sum of column ``f``'s values over the rows labelled ``k``.

        Scatter-adds the stored entries in row order: the terms of ``t_matmul(one_hot)`` in the same order,
        without the one-hot table or the transposed entries.
        """
        out = torch.zeros(self.n_features * n_labels, dtype=dtype, device=self.device)
        slot = labels.to(torch.long).repeat_interleave(self.indptr.diff(), output_size=self.nnz)
        slot.add_(self.indices, alpha=n_labels)  # entry (f, k) of the [F, K] output
        out.index_add_(0, slot, self.values.to(dtype))
        return out.view(self.n_features, n_labels)

    def _transposed(self) -> tuple[Tensor, Tensor, Tensor]:
        """CSC form ``(indptr [F + 1], row ids [nnz], values [nnz])`` (cached): the entries stably sorted by column;
        int32 ids where ``n_rows``, ``F`` and ``nnz`` fit, and all-ones values are the stored ones (order-free)."""
        cache = self.__dict__.get("_csc")
        if cache is None:
            narrow = max(self.n_rows, self.n_features, self.nnz) <= torch.iinfo(torch.int32).max
            id_dtype = torch.int32 if narrow else torch.long
            order = torch.sort(self.indices.to(id_dtype), stable=True).indices
            indptr = counts_to_offsets(torch.bincount(self.indices, minlength=self.n_features), id_dtype)
            rows = torch.repeat_interleave(torch.arange(self.n_rows, dtype=id_dtype, device=self.device),
                                           self.indptr.diff(), output_size=self.nnz)[order]
            values = self.values if bool((self.values == 1).all()) else self.values[order]
            cache = (indptr, rows, values)
            self._csc = cache
        return cache


def _bag_sums(ids: Tensor, table: Tensor, offsets: Tensor, weights: Tensor) -> Tensor:
    """``out[j] = sum_p weights[p] * table[ids[p]]`` over ``p in offsets[j] : offsets[j+1]``: ``Tensor[n_bags, K]``
    in ``table``'s dtype, by :func:`~torch.nn.functional.embedding_bag` over runs of whole bags of at most
    :data:`_BAG_CHUNK` entries (a larger bag alone); each bag is summed within one call, so runs do not matter.
    """
    n_bags = offsets.numel() - 1
    out = table.new_zeros(n_bags, table.shape[1])
    a = 0
    while a < n_bags:
        # the last bag boundary at most _BAG_CHUNK entries after bag a starts, at least one bag on
        b = min(max(int(torch.searchsorted(offsets, offsets[a] + _BAG_CHUNK, right=True)) - 1, a + 1), n_bags)
        s, e = int(offsets[a]), int(offsets[b])
        if e > s:
            out[a:b] = torch.nn.functional.embedding_bag(
                ids[s:e], table, offsets[a : b + 1] - offsets[a], mode="sum",
                per_sample_weights=weights[s:e].to(table.dtype), include_last_offset=True,
            )
        a = b
    return out


def _as_token_features(x) -> Tensor | SparseFeatures:
    """Normalise ``SequenceData.x``: a validated dense floating tensor or a :class:`SparseFeatures`."""
    if isinstance(x, SparseFeatures):
        check_input_tensor(x.values, "SequenceData.x")
        return x
    check_not_meta(x, "SequenceData.x")
    if isinstance(x, Tensor) and x.layout != torch.strided:
        check_input_tensor(x, "SequenceData.x")
        return SparseFeatures.from_torch(x)
    return dense_features(x, "SequenceData.x", "[N_tok, F]")


def _checked_labels(y, x: Tensor, name: str, per: str) -> Tensor:
    """``y`` as a ``LongTensor`` with one integer label per row of ``x`` (``per`` names a row), on ``x``'s device."""
    y = torch.as_tensor(y)
    if y.is_floating_point() or y.is_complex():
        raise ValueError(f"{name} must hold integer labels, got {y.dtype}")
    y = y.long()
    if y.shape != (x.shape[0],):
        raise ValueError(f"{name} must have shape [{x.shape[0]}] (one label per {per}), got {tuple(y.shape)}")
    if y.device != x.device:
        raise ValueError(f"x is on {x.device} but y is on {y.device}")
    return y


def _sequence_offsets(rows: Sequence[Tensor], ys: Sequence[Tensor] | None,
                      what: str = "feature rows") -> tuple[Tensor, Tensor | None]:
    """``(offsets, packed labels or None)`` of sequences with ``rows[i].shape[0]`` tokens (``what``) and labels
    ``ys[i]``, on ``rows[0]``'s device."""
    dev = rows[0].device
    offsets = counts_to_offsets(torch.tensor([r.shape[0] for r in rows], dtype=torch.long)).to(dev)
    if ys is None:
        return offsets, None
    if len(ys) != len(rows):
        raise ValueError(f"got {len(rows)} feature sequences but {len(ys)} label sequences")
    ys = [torch.as_tensor(v).reshape(-1) for v in ys]
    for i, (r, v) in enumerate(zip(rows, ys)):
        if v.shape[0] != r.shape[0]:
            raise ValueError(f"sequence {i}: {r.shape[0]} {what} but {v.shape[0]} labels")
    return offsets, torch.cat(ys).to(dev)


@dataclass
class MulticlassData:
    """Examples with a single label each.

    Attributes:
        x: ``Tensor[n, F]`` features (floating point).
        y: ``LongTensor[n]`` labels in ``[0, n_labels)``; may be ``None`` for prediction-only data.
    """

    x: Tensor
    y: Tensor | None = None

    def __post_init__(self) -> None:
        check_not_meta(self.x, "MulticlassData.x")
        self.x = dense_features(self.x, "MulticlassData.x", "[n, F]")
        if self.x.shape[0] == 0:
            raise ValueError("MulticlassData is empty (n = 0 examples)")
        if self.y is not None:
            self.y = _checked_labels(self.y, self.x, "MulticlassData.y", "example")

    def __len__(self) -> int:
        return self.x.shape[0]

    @property
    def device(self) -> torch.device:
        return self.x.device

    def __getitem__(self, idx) -> "MulticlassData":
        idx = as_index(idx, len(self)).to(self.x.device)
        return MulticlassData(self.x[idx], None if self.y is None else self.y[idx])

    def to(self, *args, **kwargs) -> "MulticlassData":
        """Move to a device and / or cast the features (``to(device)``, ``to(dtype)``, ``to(device, dtype)``)."""
        x = self.x.to(*args, **kwargs)
        return MulticlassData(x, None if self.y is None else self.y.to(x.device))

    @classmethod
    def cat(cls, parts: Sequence["MulticlassData"]) -> "MulticlassData":
        """The examples of ``parts`` one after another (same ``F`` and device; labelled all or none)."""
        check_cat_parts(cls, parts, lambda p: (p.x.shape[1], str(p.device)))
        return cls(torch.cat([p.x for p in parts]), cat_field(parts, "y"))


@dataclass
class SequenceData:
    """Variable-length sequences in packed form.

    Attributes:
        x: token features of all sequences concatenated, ``[N_tok, F]``: a dense ``Tensor`` or a
            :class:`SparseFeatures` (a torch sparse COO/CSR tensor given here is converted to one).
        y: ``LongTensor[N_tok]`` token labels (or ``None`` for prediction-only data).
        offsets: ``LongTensor[n + 1]``; sequence ``i`` is ``x[offsets[i]:offsets[i+1]]``.
    """

    x: Tensor | SparseFeatures
    y: Tensor | None
    offsets: Tensor

    def __post_init__(self) -> None:
        self.x = _as_token_features(self.x)
        self.offsets = check_index_tensor(self.offsets, "SequenceData.offsets", device=self.x.device)
        check_offsets(self.offsets, self.x.shape[0], "SequenceData.offsets", "N_tok", "sequence")
        if self.y is not None:
            self.y = _checked_labels(self.y, self.x, "SequenceData.y", "token")

    @classmethod
    def from_sequences(cls, xs: Sequence[Tensor], ys: Sequence[Tensor] | None = None) -> "SequenceData":
        """Build from per-sequence tensors ``xs[i]: [L_i, F]`` and ``ys[i]: [L_i]``."""
        if len(xs) == 0:
            raise ValueError("SequenceData is empty (no sequences given)")
        xs = [torch.as_tensor(x) for x in xs]
        for i, x in enumerate(xs):
            if x.dim() != 2:
                raise ValueError(f"sequence {i}: features must be [L, F], got shape {tuple(x.shape)}")
        offsets, y = _sequence_offsets(xs, ys)
        return cls(torch.cat(xs), y, offsets)

    @classmethod
    def from_attribute_ids(
        cls,
        ids: Sequence[Tensor],
        n_attributes: int,
        ys: Sequence[Tensor] | None = None,
        values: Sequence[Tensor] | None = None,
        pad_id: int = -1,
    ) -> "SequenceData":
        """Sparse token features from per-sequence attribute ids ``ids[i]: LongTensor[L_i, A]`` (the output of
        :meth:`torch_bcfw.features.chunking.AttributeVocabulary.transform`): token ``t`` gets the attributes
        ``ids[i][t, :]`` other than ``pad_id`` (value 1, or ``values[i][t, :]``) of ``n_attributes`` columns."""
        if len(ids) == 0:
            raise ValueError("SequenceData is empty (no sequences given)")
        n_attributes = check_int(n_attributes, "n_attributes")
        ids = [torch.as_tensor(a) for a in ids]
        for i, a in enumerate(ids):
            if a.dim() != 2 or a.shape[1] != ids[0].shape[1]:
                raise ValueError(f"sequence {i}: attribute ids must be [L, A] with a common A, got shape {tuple(a.shape)}")
        if values is not None:
            if len(values) != len(ids):
                raise ValueError(f"got {len(ids)} id sequences but {len(values)} value sequences")
            values = torch.cat([torch.as_tensor(v) for v in values])
        x = SparseFeatures.from_attribute_ids(torch.cat(ids), n_attributes, values, pad_id)
        offsets, y = _sequence_offsets(ids, ys, "tokens")
        return cls(x, y, offsets)

    @classmethod
    def from_padded(cls, x: Tensor, lengths: Tensor, y: Tensor | None = None) -> "SequenceData":
        """Build from a padded batch ``x: [B, T, F]``, ``lengths: [B]`` and ``y: [B, T]``."""
        check_not_meta(x, "SequenceData.from_padded x")
        x = torch.as_tensor(x)
        lengths = check_index_tensor(lengths, "lengths", device=x.device)
        if x.dim() != 3:
            raise ValueError(f"padded features must be [B, T, F], got shape {tuple(x.shape)}")
        if lengths.shape != (x.shape[0],):
            raise ValueError(f"lengths must have shape [{x.shape[0]}], got {tuple(lengths.shape)}")
        if x.shape[0] and (int(lengths.max()) > x.shape[1] or int(lengths.min()) < 1):
            raise ValueError(f"lengths must lie in [1, T = {x.shape[1]}]")
        if y is not None:
            y = torch.as_tensor(y, device=x.device)
            if y.shape != x.shape[:2]:
                raise ValueError(f"padded labels must be [B, T] = {tuple(x.shape[:2])}, got {tuple(y.shape)}")
        mask = torch.arange(x.shape[1], device=x.device)[None, :] < lengths[:, None]
        return cls(x[mask], None if y is None else y[mask], counts_to_offsets(lengths))

    def __len__(self) -> int:
        return self.offsets.numel() - 1

    @property
    def device(self) -> torch.device:
        return self.x.device

    @property
    def lengths(self) -> Tensor:
        """``LongTensor[n]`` sequence lengths."""
        return self.offsets[1:] - self.offsets[:-1]

    @property
    def n_tokens(self) -> int:
        return self.x.shape[0]

    @property
    def n_inputs(self) -> int:
        """Token feature dimension ``F``."""
        return self.x.shape[1]

    @property
    def is_sparse(self) -> bool:
        """Whether the token features are a :class:`SparseFeatures` matrix."""
        return isinstance(self.x, SparseFeatures)

    def x_matmul(self, W: Tensor) -> Tensor:
        """``X W`` for ``W: [F, K]``: ``Tensor[N_tok, K]`` in ``W``'s dtype (sparse rows: gather-and-sum)."""
        if self.is_sparse:
            return self.x.matmul(W)
        return self.x.to(W.dtype) @ W

    def xt_matmul(self, M: Tensor) -> Tensor:
        """``X^T M`` for ``M: [N_tok, K]``: ``Tensor[F, K]`` in ``M``'s dtype (sparse: a gather-and-sum over the
        cached column-major entries, never densified)."""
        if self.is_sparse:
            return self.x.t_matmul(M)
        return self.x.to(M.dtype).T @ M

    def xt_one_hot(self, labels: Tensor, n_labels: int) -> Tensor:
        """``X^T onehot(labels)`` for ``labels: LongTensor[N_tok]``: ``Tensor[F, n_labels]`` (float64); sparse
        features never build the one-hot table."""
        if self.is_sparse:
            return self.x.t_matmul_one_hot(labels, n_labels)
        one_hot = torch.zeros(self.n_tokens, n_labels, dtype=torch.float64, device=self.device)
        return self.xt_matmul(one_hot.scatter_(1, labels[:, None], 1.0))

    def x_csr(self) -> tuple[Tensor, Tensor, Tensor]:
        """``(indptr [N_tok + 1], indices [nnz], values [nnz])``: the token features in CSR form (dense ones: their
        non-zeros in column order)."""
        x = self.x if self.is_sparse else SparseFeatures.from_dense(self.x)
        return x.indptr, x.indices, x.values

    def to_dense(self) -> "SequenceData":
        """The same data with dense token features (a no-op for dense data; ``N_tok * F`` numbers, so small data only)."""
        if not self.is_sparse:
            return self
        return SequenceData(self.x.to_dense(), self.y, self.offsets)

    def token_sequence_ids(self) -> Tensor:
        """``LongTensor[N_tok]``: the sequence index of every token."""
        return torch.repeat_interleave(torch.arange(len(self), device=self.device), self.lengths)

    def __getitem__(self, idx) -> "SequenceData":
        tok, offsets = segment_rows(self.offsets.cpu(), as_index(idx, len(self)))
        tok = tok.to(self.device)
        return SequenceData(self.x[tok], None if self.y is None else self.y[tok], offsets.to(self.device))

    def to(self, *args, **kwargs) -> "SequenceData":
        """Move to a device and / or cast the token features (``to(device)``, ``to(dtype)``, ``to(device, dtype)``)."""
        x = self.x.to(*args, **kwargs)
        return SequenceData(x, None if self.y is None else self.y.to(x.device), self.offsets.to(x.device))

    @classmethod
    def cat(cls, parts: Sequence["SequenceData"]) -> "SequenceData":
        """The sequences of ``parts`` one after another (same ``F``, layout and device; labelled all or none)."""
        check_cat_parts(cls, parts, lambda p: (p.n_inputs, p.is_sparse, str(p.device)))
        x = SparseFeatures.cat([p.x for p in parts]) if parts[0].is_sparse else torch.cat([p.x for p in parts])
        return cls(x, cat_field(parts, "y"), cat_offsets([p.offsets for p in parts]))

    def padded(self, pad_label: int = -1) -> tuple[Tensor, Tensor, Tensor | None]:
        """Return ``(x [B, T, F], lengths [B], y [B, T] or None)`` padded with zeros / ``pad_label``; ``x`` is
        dense (``ValueError`` for sparse features when it would exceed ``2**27`` numbers)."""
        n, T = len(self), int(self.lengths.max())
        F = self.n_inputs
        if self.is_sparse and n * T * F > _PADDED_SPARSE_LIMIT:
            raise ValueError(
                f"padded() would materialise dense token features [{n}, {T}, {F}] ({n * T * F:,} numbers) "
                "from sparse data; select fewer sequences (data[idx]) or use x_matmul / xt_matmul"
            )
        x = self.x.to_dense() if self.is_sparse else self.x
        mask = torch.arange(T, device=self.device)[None, :] < self.lengths[:, None]
        xp = x.new_zeros(n, T, F)
        xp[mask] = x
        yp = None
        if self.y is not None:
            yp = torch.full((n, T), pad_label, dtype=torch.long, device=self.device)
            yp[mask] = self.y
        return xp, self.lengths, yp
