"""A small CNN under a BCFW-solved chain head on the OCR words (the example of ``configs/ocr_cnn.yaml``).

:class:`OCRWordsDataModule` gives packed batches ``(images [N_tok, 1, 16, 8] float32, labels [N_tok],
offsets [B + 1])``; :class:`OCRChainCNN` trains :class:`LetterCNN` with cross-entropy, then with the chain head's
structured hinge (the head itself is solved by :class:`~torch_bcfw.lightning.BCFWCallback`).  Validation / test
report ``letter_error`` (mean over words of the fraction of wrong letters: the SSVM's task loss) and ``char_error``
(over all letters).
"""
from __future__ import annotations

import lightning.pytorch as pl
import torch
from torch import nn

from ..data.base import counts_to_offsets
from ..datasets.ocr import N_LETTERS, load_ocr, ocr_split, ocr_split_with_validation
from ..models import Chain
from ..nn import StructuredHead, StructuredHingeLoss
from .eval_hooks import EvalHooks, PackedLoaders, cosine_schedule, warmup_hinge_loss

__all__ = ["LetterCNN", "OCRChainCNN", "OCRWordsDataModule", "pack_words"]


def _words(data) -> list:
    """``[(x [L, 128] float32, y [L])]`` per word of a :class:`~torch_bcfw.data.sequences.SequenceData`."""
    lengths = data.lengths.tolist()
    return list(zip(torch.split(data.x.to(torch.float32), lengths), torch.split(data.y, lengths)))


def pack_words(items):
    """Collate ``[(x [L, 128], y [L])]`` into ``(images [N, 1, 16, 8], labels [N], offsets [B + 1])``; items ``(x, y,
    i)`` add the words' ids ``LongTensor[B]`` as a fourth element."""
    xs, ys, *ids = zip(*items)
    offsets = counts_to_offsets(torch.tensor([x.shape[0] for x in xs], dtype=torch.long))
    return (torch.cat(xs).view(-1, 1, 16, 8), torch.cat(ys), offsets, *(torch.tensor(i) for i in ids))


class OCRWordsDataModule(PackedLoaders, pl.LightningDataModule):
    """OCR words (Taskar et al. 2003) for Lightning.

    Args:
        path: folder with ``letters.pickle`` / ``letter.data`` (see :func:`~torch_bcfw.datasets.ocr.load_ocr`).
        split: ``"large"`` (train on the folds != ``fold``, test on ``fold``) or ``"small"``.
        fold: the test fold (``"large"``) / the training fold (``"small"``).
        batch_size: words per training batch (shuffled every epoch).
        eval_batch_size: words per batch of the test loader and of ``bcfw_dataloader``.
        limit: keep only the first ``limit`` training words (quick runs); ``test_limit`` likewise.
        seed: seed of the shuffling of the training batches.
        val_fold: hold this fold out of the training words as the validation split (``val_dataloader``,
            ``bcfw_val_dataloader``: the held-out data of :class:`~torch_bcfw.lightning.lam_choice.LamChoice` and of
            epoch selection); ``None`` (default): no validation split (the OCR protocol has none).
        validate_on_test: also return the test words as the validation loader (learning curves only); not
            together with ``val_fold``.
        example_ids: the training batches (and ``bcfw_dataloader``'s) carry the words' positions in the training
            set as a fourth element ``ids [B]`` (:meth:`bcfw_example_ids`, for ``BCFWCallback(mode="step")``).
    """

    collate = staticmethod(pack_words)

    def __init__(self, path: str | None = None, split: str = "large", fold: int = 0, batch_size: int = 32,
                 eval_batch_size: int = 512, limit: int | None = None, test_limit: int | None = None,
                 seed: int = 0, val_fold: int | None = None, validate_on_test: bool = False, download: bool = False,
                 example_ids: bool = False):
        super().__init__()
        if val_fold is not None and validate_on_test:
            raise ValueError("choose one validation split: val_fold or validate_on_test, not both")
        self.path, self.split, self.fold, self.val_fold = path, split, int(fold), val_fold
        self.batch_size, self.eval_batch_size = int(batch_size), int(eval_batch_size)
        self.limit, self.test_limit = limit, test_limit
        self.seed, self.validate_on_test, self.download = int(seed), bool(validate_on_test), bool(download)
        self.example_ids = bool(example_ids)
        self.train = self.val = self.test = None

    def setup(self, stage: str | None = None) -> None:
        if self.train is not None:
            return
        words = load_ocr(self.path, download=self.download)
        if self.val_fold is None:
            train, test = ocr_split(words, self.split, self.fold)
        else:
            train, val, test = ocr_split_with_validation(words, self.split, self.fold, int(self.val_fold))
            self.val_data, self.val = val, _words(val)
        if self.limit is not None:
            train = train[list(range(min(int(self.limit), len(train))))]
        if self.test_limit is not None:
            test = test[list(range(min(int(self.test_limit), len(test))))]
        self.train_data, self.test_data = train, test
        self.train, self.test = _words(train), _words(test)
        if self.example_ids:
            self.train = [(x, y, i) for i, (x, y) in enumerate(self.train)]

    def bcfw_example_ids(self, batch):
        """The positions of a training batch's words in the training set (``LongTensor[B]``)."""
        if len(batch) < 4:
            raise ValueError("OCRWordsDataModule: the batches carry no example ids; build it with example_ids=True")
        return batch[3]


class LetterCNN(nn.Module):
    """16x8 letter image -> ``feature_dim`` features.

    ``conv(c1) - conv(c1) - pool - conv(c2) - pool - dropout - linear(feature_dim) - LayerNorm`` (no affine).
    """

    def __init__(self, feature_dim: int = 64, channels: tuple[int, int] = (32, 64), dropout: float = 0.1):
        super().__init__()
        c1, c2 = channels
        self.net = nn.Sequential(
            nn.Conv2d(1, c1, 3, padding=1), nn.ReLU(),
            nn.Conv2d(c1, c1, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),  # 8 x 4
            nn.Conv2d(c1, c2, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),  # 4 x 2
            nn.Flatten(), nn.Dropout(dropout), nn.Linear(c2 * 8, feature_dim),
            nn.LayerNorm(feature_dim, elementwise_affine=False),
        )
        self.feature_dim = feature_dim

    def forward(self, images):
        return self.net(images)


class OCRChainCNN(EvalHooks, pl.LightningModule):
    """CNN backbone + chain head solved by :class:`~torch_bcfw.lightning.BCFWCallback` (attribute ``head``).

    Args:
        feature_dim: backbone output size ``F`` (the chain has ``d = 26 F + 3*26 + 26^2`` weights).
        channels: convolution widths.
        dropout: dropout before the backbone's last linear layer.
        lr: Adam learning rate (cosine-annealed over the trainer's ``max_epochs``).
        ce_epochs: epochs of cross-entropy warm-up through an auxiliary linear classifier.
        ce_weight: weight of the cross-entropy once the hinge phase started (0: pure structured hinge).
        hinge_weight: weight of the structured hinge.
    """

    def __init__(self, feature_dim: int = 64, channels: tuple[int, int] = (32, 64), dropout: float = 0.1,
                 lr: float = 2e-3, ce_epochs: int = 2, ce_weight: float = 0.0, hinge_weight: float = 1.0,
                 n_labels: int = N_LETTERS):
        super().__init__()
        self.save_hyperparameters()
        self.backbone = LetterCNN(feature_dim, tuple(channels), dropout)
        self.classifier = nn.Linear(feature_dim, n_labels)
        self.head = StructuredHead(Chain(feature_dim, n_labels))
        self.hinge = StructuredHingeLoss(self.head)
        self._eval = []

    def bcfw_features(self, batch):
        images, labels, offsets = batch[:3]  # a fourth element: the example ids (OCRWordsDataModule(example_ids=True))
        return self.backbone(images), labels, offsets

    def training_step(self, batch, batch_idx):
        images, labels, offsets = batch[:3]
        return warmup_hinge_loss(self, self.backbone(images), labels, offsets, len(labels))

    def configure_optimizers(self):
        params = list(self.backbone.parameters()) + list(self.classifier.parameters())
        return cosine_schedule(self, torch.optim.Adam(params, lr=self.hparams.lr))

    def _eval_step(self, batch):
        images, labels, offsets = batch[:3]
        pred = self.head(self.backbone(images), offsets)
        wrong = (pred != labels).double()
        lengths = offsets[1:] - offsets[:-1]
        seq = torch.repeat_interleave(torch.arange(len(lengths), device=labels.device), lengths)
        per_word = torch.zeros(len(lengths), dtype=torch.float64, device=labels.device).index_add(0, seq, wrong)
        self._eval.append(torch.stack([(per_word / lengths).sum(), per_word.sum(),
                                       torch.tensor(float(len(lengths)), device=labels.device),
                                       lengths.sum().double()]))

    def _eval_end(self, prefix):
        if not self._eval:
            return
        s = torch.stack(self._eval).sum(0)
        self._eval = []
        self.log(f"{prefix}/letter_error", s[0] / s[2])
        self.log(f"{prefix}/char_error", s[1] / s[3])
