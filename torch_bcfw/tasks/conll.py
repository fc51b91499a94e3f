"""Word, POS and character embeddings under a BCFW-solved chain head on CoNLL-2000 chunking.

The embedding route of the CoNLL experiment (``examples/conll_embeddings_lightning.py``,
``configs/conll_embeddings.yaml``); the sparse linear chain of :mod:`torch_bcfw.datasets.conll_chain` is the
baseline it is compared with.  :class:`ConllVocab` holds the input vocabularies (id ``0`` is padding and ``1``
``<unk>`` in each), :class:`ConllChunkingDataModule` the packed batches (:class:`ChunkBatch`),
:class:`TokenEncoder` the plain-torch encoder and :class:`ConllChainTagger` the LightningModule.  The embedding
sizes depend on the vocabulary, which the datamodule builds in ``setup``: the module creates its encoder in
``configure_model`` (or with :meth:`ConllChainTagger.build`) and stores the vocabulary in its checkpoints.
"""
from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from typing import NamedTuple

import lightning.pytorch as pl
import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from ..data.base import counts_to_offsets
from ..datasets.conll import CHUNK_TAGS, Sentence, load_conll2000_splits
from ..datasets.conll_chain import chunk_f1_from_ids, tags_to_ids
from ..models import Chain
from ..nn import StructuredHead, StructuredHingeLoss
from .eval_hooks import EvalHooks, PackedLoaders, cosine_schedule, warmup_hinge_loss

__all__ = ["ENCODERS", "ChunkBatch", "ConllChainTagger", "ConllChunkingDataModule", "ConllVocab", "TokenEncoder",
           "pack_sentences"]

#: sentence encoders of :class:`TokenEncoder`
ENCODERS = ("bilstm", "cnn")
PAD, UNK = 0, 1
_DIGITS = re.compile(r"\d")


class ConllVocab:
    """Word, character and POS vocabularies (id 0: padding, id 1: ``<unk>``).

    Build with :meth:`fit` on the training sentences; :meth:`encode` maps a sentence to ids.
    ``state_dict()`` / ``from_state_dict()`` round-trip it (plain lists: checkpoint safe).
    """

    def __init__(self, words: Sequence[str], chars: Sequence[str], pos: Sequence[str], lowercase: bool = True,
                 normalize_digits: bool = True, max_word_chars: int = 20):
        if int(max_word_chars) < 1:
            raise ValueError(f"max_word_chars must be >= 1, got {max_word_chars}")
        self.words, self.chars, self.pos = list(words), list(chars), list(pos)
        self.lowercase, self.normalize_digits = bool(lowercase), bool(normalize_digits)
        self.max_word_chars = int(max_word_chars)
        self.word_ids = {w: i + 2 for i, w in enumerate(self.words)}
        self.char_ids = {c: i + 2 for i, c in enumerate(self.chars)}
        self.pos_ids = {p: i + 2 for i, p in enumerate(self.pos)}
        self.n_words: int = len(self.words) + 2  # vocabulary sizes, padding and <unk> included
        self.n_chars: int = len(self.chars) + 2
        self.n_pos: int = len(self.pos) + 2

    def normalize(self, word: str) -> str:
        if self.lowercase:
            word = word.lower()
        if self.normalize_digits:
            word = _DIGITS.sub("0", word)
        return word

    @classmethod
    def fit(cls, sentences: Sequence[Sentence], min_word_count: int = 2, lowercase: bool = True,
            normalize_digits: bool = True, max_word_chars: int = 20) -> ConllVocab:
        """Words seen at least ``min_word_count`` times (after normalisation), all characters and POS tags."""
        if int(min_word_count) < 1:
            raise ValueError(f"min_word_count must be >= 1, got {min_word_count}")
        if len(sentences) == 0:
            raise ValueError("ConllVocab.fit needs at least one sentence")
        probe = cls([], [], [], lowercase, normalize_digits, max_word_chars)
        wc = Counter(probe.normalize(w) for s in sentences for w in s.words)
        words = sorted(w for w, c in wc.items() if c >= int(min_word_count))
        chars = sorted({ch for s in sentences for w in s.words for ch in w})
        pos = sorted({p for s in sentences for p in s.pos})
        return cls(words, chars, pos, lowercase, normalize_digits, max_word_chars)

    def encode(self, sentence: Sentence) -> tuple[Tensor, Tensor, Tensor]:
        """``(word ids [T], POS ids [T], char ids [T, C])``; ``C`` = the longest word (capped), 0-padded."""
        w = torch.tensor([self.word_ids.get(self.normalize(x), UNK) for x in sentence.words], dtype=torch.long)
        p = torch.tensor([self.pos_ids.get(x, UNK) for x in sentence.pos], dtype=torch.long)
        C = min(self.max_word_chars, max(len(x) for x in sentence.words))
        c = torch.zeros(len(sentence), C, dtype=torch.long)
        for t, x in enumerate(sentence.words):
            ids = [self.char_ids.get(ch, UNK) for ch in x[:C]]
            c[t, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        return w, p, c

    def state_dict(self) -> dict:
        return {"words": self.words, "chars": self.chars, "pos": self.pos, "lowercase": self.lowercase,
                "normalize_digits": self.normalize_digits, "max_word_chars": self.max_word_chars}

    @classmethod
    def from_state_dict(cls, sd: dict) -> ConllVocab:
        return cls(sd["words"], sd["chars"], sd["pos"], sd["lowercase"], sd["normalize_digits"], sd["max_word_chars"])

    def __repr__(self) -> str:
        return f"ConllVocab(words={self.n_words}, chars={self.n_chars}, pos={self.n_pos})"


class ChunkBatch(NamedTuple):
    """A packed batch of ``B`` sentences with ``N`` tokens in all."""

    words: Tensor  # [N] word ids
    pos: Tensor  # [N] POS ids
    chars: Tensor  # [N, C] character ids, 0-padded
    labels: Tensor  # [N] chunk label ids (tags unseen in training -> O)
    offsets: Tensor  # [B + 1]
    tags: tuple  # B tuples of gold chunk tag strings


def pack_sentences(items) -> ChunkBatch:
    """Collate ``[(words [T], pos [T], chars [T, C], labels [T], tags)]`` into a packed :class:`ChunkBatch`."""
    words, pos, chars, labels, tags = zip(*items)
    offsets = counts_to_offsets(torch.tensor([w.numel() for w in words], dtype=torch.long))
    C = max(c.shape[1] for c in chars)
    ch = torch.zeros(int(offsets[-1]), C, dtype=torch.long)
    for c, a, b in zip(chars, offsets[:-1].tolist(), offsets[1:].tolist()):
        ch[a:b, : c.shape[1]] = c
    return ChunkBatch(torch.cat(words), torch.cat(pos), ch, torch.cat(labels), offsets, tuple(tags))


class ConllChunkingDataModule(PackedLoaders, pl.LightningDataModule):
    """CoNLL-2000 chunking (8936 training, 2012 test sentences) for Lightning.

    Args:
        path: ``conll2000.zip`` or a folder with it or ``train.txt`` / ``test.txt``
            (see :func:`~torch_bcfw.datasets.conll.load_conll2000`).
        batch_size: sentences per training batch (shuffled every epoch).
        eval_batch_size: sentences per batch of the test loader and of ``bcfw_dataloader``.
        limit: keep only the first ``limit`` training sentences (the vocabulary is built on them);
            ``test_limit`` likewise for the test split.
        holdout: hold the last ``holdout`` of these training sentences out as the validation split
            (for choosing ``lam`` and the schedule without the test set; they are neither trained on
            nor in the vocabulary).
        min_word_count: words seen fewer times in the training sentences map to ``<unk>``.
        lowercase, normalize_digits: word normalisation before the vocabulary lookup (characters keep
            the original spelling).
        max_word_chars: characters of a word seen by the character encoder.
        seed: seed of the shuffling of the training batches.
        validate_on_test: return the test sentences as the validation loader (learning curves only;
            CoNLL-2000 has no separate validation split); not together with ``holdout``.
    """

    collate = staticmethod(pack_sentences)

    def __init__(self, path: str, batch_size: int = 32, eval_batch_size: int = 256,
                 limit: int | None = None, test_limit: int | None = None, holdout: int = 0, min_word_count: int = 2,
                 lowercase: bool = True, normalize_digits: bool = True, max_word_chars: int = 20, seed: int = 0,
                 validate_on_test: bool = False):
        super().__init__()
        for name, v in (("batch_size", batch_size), ("eval_batch_size", eval_batch_size),
                        ("min_word_count", min_word_count), ("max_word_chars", max_word_chars)):
            if int(v) < 1:
                raise ValueError(f"{name} must be >= 1, got {v}")
        for name, v in (("limit", limit), ("test_limit", test_limit)):
            if v is not None and int(v) < 1:
                raise ValueError(f"{name} must be >= 1 or None, got {v}")
        if int(holdout) < 0:
            raise ValueError(f"holdout must be >= 0, got {holdout}")
        if int(holdout) and validate_on_test:
            raise ValueError("choose one validation split: holdout > 0 or validate_on_test, not both")
        self.path = path
        self.batch_size, self.eval_batch_size = int(batch_size), int(eval_batch_size)
        self.limit, self.test_limit, self.holdout = limit, test_limit, int(holdout)
        self.min_word_count, self.lowercase, self.normalize_digits = int(min_word_count), bool(lowercase), bool(normalize_digits)
        self.max_word_chars = int(max_word_chars)
        self.seed, self.validate_on_test = int(seed), bool(validate_on_test)
        self.vocab = self.train = self.val = self.test = None
        self.train_sentences = self.val_sentences = self.test_sentences = None

    def setup(self, stage: str | None = None) -> None:
        if self.train is not None:
            return
        train_s, test_s = load_conll2000_splits(self.path, self.limit, self.test_limit)
        val_s = []
        if self.holdout:
            if self.holdout >= len(train_s):
                raise ValueError(f"holdout = {self.holdout} leaves no training sentence (of {len(train_s)})")
            train_s, val_s = train_s[: -self.holdout], train_s[-self.holdout:]
        self.train_sentences, self.val_sentences, self.test_sentences = train_s, val_s, test_s
        self.vocab = ConllVocab.fit(train_s, self.min_word_count, self.lowercase, self.normalize_digits,
                                    self.max_word_chars)
        self.train, self.test = self._encode(train_s), self._encode(test_s)
        self.val = self._encode(val_s) if val_s else None

    def _encode(self, sentences: Sequence[Sentence]) -> list:
        """``[(words, pos, chars, labels, tags)]`` per sentence (the items :func:`pack_sentences` collates)."""
        return [(*self.vocab.encode(s), tags_to_ids(s.chunks), tuple(s.chunks)) for s in sentences]


def _positions(offsets: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(sentence index [N], position in the sentence [N], lengths [B])`` of packed tokens."""
    lengths = offsets[1:] - offsets[:-1]
    seq = torch.repeat_interleave(torch.arange(lengths.numel(), device=offsets.device), lengths)
    pos = torch.arange(int(offsets[-1]), device=offsets.device) - offsets[:-1][seq]
    return seq, pos, lengths


class CharCNN(nn.Module):
    """Character ids ``[N, C]`` -> ``[N, channels]``: embedding, convolution, ReLU, max over the characters."""

    def __init__(self, n_chars: int, char_dim: int = 16, channels: int = 32, kernel_size: int = 3):
        super().__init__()
        self.embed = nn.Embedding(n_chars, char_dim, padding_idx=PAD)
        self.conv = nn.Conv1d(char_dim, channels, kernel_size, padding=kernel_size // 2)

    def forward(self, chars: Tensor) -> Tensor:
        h = F.relu(self.conv(self.embed(chars).transpose(1, 2)))  # [N, channels, C]
        h = h.masked_fill((chars == PAD)[:, None, :], float("-inf")).amax(2)
        return torch.nan_to_num(h, neginf=0.0)  # a word of no characters (cannot happen in CoNLL)


class TokenEncoder(nn.Module):
    """Packed token ids -> ``[N, feature_dim]`` token features.

    ``[word embedding ; POS embedding ; char-CNN]`` per token, dropout, a sentence encoder over each
    sentence (``"bilstm"``: ``layers`` bidirectional LSTM layers of ``hidden`` units per direction;
    ``"cnn"``: ``layers`` convolutions of width ``kernel_size`` with ``2 * hidden`` channels and ReLU,
    each sentence zero-padded on its own), dropout, a linear map to ``feature_dim`` and a LayerNorm
    without affine parameters.
    """

    def __init__(self, n_words: int, n_pos: int, n_chars: int, encoder: str = "bilstm", word_dim: int = 64,
                 pos_dim: int = 16, char_dim: int = 16, char_channels: int = 32, hidden: int = 128, layers: int = 1,
                 kernel_size: int = 3, feature_dim: int = 64, dropout: float = 0.3):
        super().__init__()
        _check_encoder_args(encoder, word_dim, pos_dim, char_dim, char_channels, hidden, layers, kernel_size,
                            feature_dim, dropout)
        for name, v in (("n_words", n_words), ("n_pos", n_pos), ("n_chars", n_chars)):
            if int(v) < 3:
                raise ValueError(f"{name} must be >= 3 (padding, <unk> and at least one entry), got {v}")
        self.encoder_type = encoder
        self.word = nn.Embedding(n_words, word_dim, padding_idx=PAD)
        self.pos = nn.Embedding(n_pos, pos_dim, padding_idx=PAD) if pos_dim else None
        self.chars = CharCNN(n_chars, char_dim, char_channels) if char_dim else None
        d_in = word_dim + pos_dim + (char_channels if char_dim else 0)
        self.drop = nn.Dropout(dropout)
        if encoder == "bilstm":
            self.rnn = nn.LSTM(d_in, hidden, num_layers=layers, batch_first=True, bidirectional=True,
                               dropout=dropout if layers > 1 else 0.0)
        else:
            self.convs = nn.ModuleList(
                nn.Conv1d(d_in if k == 0 else 2 * hidden, 2 * hidden, kernel_size, padding=kernel_size // 2)
                for k in range(layers))
        self.proj = nn.Linear(2 * hidden, feature_dim)
        self.norm = nn.LayerNorm(feature_dim, elementwise_affine=False)
        self.feature_dim = int(feature_dim)

    def token_inputs(self, words: Tensor, pos: Tensor, chars: Tensor) -> Tensor:
        parts = [self.word(words)]
        if self.pos is not None:
            parts.append(self.pos(pos))
        if self.chars is not None:
            parts.append(self.chars(chars))
        return torch.cat(parts, 1)

    def forward(self, words: Tensor, pos: Tensor, chars: Tensor, offsets: Tensor) -> Tensor:
        n_tok = words.shape[0]
        if pos.shape != (n_tok,) or chars.dim() != 2 or chars.shape[0] != n_tok:
            raise ValueError(f"words [N], pos [N] and chars [N, C] must agree on N; got {tuple(words.shape)}, "
                             f"{tuple(pos.shape)}, {tuple(chars.shape)}")
        if offsets.dim() != 1 or offsets.numel() < 2 or int(offsets[0]) != 0 or int(offsets[-1]) != n_tok:
            raise ValueError(f"offsets must be [B + 1], start at 0 and end at N = {n_tok}")
        x = self.drop(self.token_inputs(words, pos, chars))
        seq, at, lengths = _positions(offsets)
        B, T = lengths.numel(), int(lengths.max())
        padded = x.new_zeros(B, T, x.shape[1])
        padded[seq, at] = x
        if self.encoder_type == "bilstm":
            packed = pack_padded_sequence(padded, lengths.cpu(), batch_first=True, enforce_sorted=False)
            out, _ = pad_packed_sequence(self.rnn(packed)[0], batch_first=True, total_length=T)
            h = out[seq, at]
        else:
            mask = (torch.arange(T, device=x.device)[None, :] < lengths[:, None])[:, None, :]  # [B, 1, T]
            h = padded.transpose(1, 2)
            for conv in self.convs:
                h = F.relu(conv(h)).masked_fill(~mask, 0.0)  # padding stays zero: sentences do not mix
            h = h.transpose(1, 2)[seq, at]
        return self.norm(self.proj(self.drop(h)))


def _check_encoder_args(encoder, word_dim, pos_dim, char_dim, char_channels, hidden, layers, kernel_size,
                        feature_dim, dropout) -> None:
    if encoder not in ENCODERS:
        raise ValueError(f"unknown encoder type {encoder!r}; choose from {list(ENCODERS)}")
    for name, v in (("word_dim", word_dim), ("hidden", hidden), ("layers", layers), ("feature_dim", feature_dim),
                    ("kernel_size", kernel_size)):
        if int(v) < 1:
            raise ValueError(f"{name} must be >= 1, got {v}")
    for name, v in (("pos_dim", pos_dim), ("char_dim", char_dim)):
        if int(v) < 0:
            raise ValueError(f"{name} must be >= 0 (0: no {name.split('_')[0]} input), got {v}")
    if char_dim and int(char_channels) < 1:
        raise ValueError(f"char_channels must be >= 1 when char_dim > 0, got {char_channels}")
    if int(kernel_size) % 2 == 0:
        raise ValueError(f"kernel_size must be odd (the convolutions keep the length), got {kernel_size}")
    if not 0.0 <= float(dropout) < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {dropout}")


class ConllChainTagger(EvalHooks, pl.LightningModule):
    """Embedding encoder + chain head over the 22 chunk tags, solved by :class:`~torch_bcfw.lightning.BCFWCallback`.

    Args:
        encoder: ``"bilstm"`` or ``"cnn"`` (see :class:`TokenEncoder`, which also documents
            ``word_dim``, ``pos_dim``, ``char_dim``, ``char_channels``, ``hidden``, ``layers``,
            ``kernel_size``, ``feature_dim`` and ``dropout``).  The chain has
            ``d = 22 feature_dim + 3*22 + 22^2`` weights.
        lr, weight_decay: AdamW (learning rate cosine-annealed over the trainer's ``max_epochs``).
        ce_epochs: epochs of cross-entropy warm-up through an auxiliary linear classifier.
        ce_weight: weight of the cross-entropy once the hinge phase started (0: pure structured hinge).
        hinge_weight: weight of the structured hinge of the chain head.

    The head (attribute ``head``) exists from construction; the encoder is created by :meth:`build`
    (called from ``configure_model`` with the datamodule's vocabulary).
    """

    def __init__(self, encoder: str = "bilstm", word_dim: int = 64, pos_dim: int = 16, char_dim: int = 16,
                 char_channels: int = 32, hidden: int = 128, layers: int = 1, kernel_size: int = 3,
                 feature_dim: int = 64, dropout: float = 0.3, lr: float = 2e-3, weight_decay: float = 0.0,
                 ce_epochs: int = 2, ce_weight: float = 0.0, hinge_weight: float = 1.0):
        super().__init__()
        _check_encoder_args(encoder, word_dim, pos_dim, char_dim, char_channels, hidden, layers, kernel_size,
                            feature_dim, dropout)
        if not lr > 0:
            raise ValueError(f"lr must be > 0, got {lr}")
        if int(ce_epochs) < 0 or ce_weight < 0 or hinge_weight < 0:
            raise ValueError("ce_epochs, ce_weight and hinge_weight must be >= 0")
        self.save_hyperparameters()
        self.n_labels = len(CHUNK_TAGS)
        self.encoder = None
        self.vocab = None
        self.classifier = nn.Linear(feature_dim, self.n_labels)
        self.head = StructuredHead(Chain(feature_dim, self.n_labels))
        self.hinge = StructuredHingeLoss(self.head)
        self._eval = []

    def build(self, vocab: ConllVocab) -> None:
        """Create the encoder for ``vocab`` (once; a second call must bring a vocabulary of the same sizes)."""
        if self.encoder is not None:
            if (vocab.n_words, vocab.n_pos, vocab.n_chars) != (self.vocab.n_words, self.vocab.n_pos, self.vocab.n_chars):
                raise ValueError(f"ConllChainTagger was built for {self.vocab}, got {vocab}")
            return
        h = self.hparams
        self.vocab = vocab
        self.encoder = TokenEncoder(vocab.n_words, vocab.n_pos, vocab.n_chars, h.encoder, h.word_dim, h.pos_dim,
                                    h.char_dim, h.char_channels, h.hidden, h.layers, h.kernel_size, h.feature_dim,
                                    h.dropout).to(self.device)

    def configure_model(self) -> None:
        if self.encoder is not None or self._trainer is None:
            return  # built already, or load_from_checkpoint: on_load_checkpoint builds from the saved vocabulary
        dm = getattr(self._trainer, "datamodule", None)
        vocab = getattr(dm, "vocab", None)
        if not isinstance(vocab, ConllVocab):
            raise ValueError("ConllChainTagger needs a datamodule with a ConllVocab `vocab` (ConllChunkingDataModule), "
                             "or an explicit build(vocab) before training")
        self.build(vocab)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        if self.vocab is not None:
            checkpoint["conll_vocab"] = self.vocab.state_dict()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        if self.encoder is None and "conll_vocab" in checkpoint:
            self.build(ConllVocab.from_state_dict(checkpoint["conll_vocab"]))

    def _encoder(self) -> TokenEncoder:
        if self.encoder is None:
            raise RuntimeError("ConllChainTagger: the encoder is not built yet; call build(vocab) "
                               "(Lightning does it in configure_model from the datamodule's vocabulary)")
        return self.encoder

    def features(self, batch: ChunkBatch) -> Tensor:
        """Token features ``[N, feature_dim]`` of a packed batch."""
        return self._encoder()(batch.words, batch.pos, batch.chars, batch.offsets)

    def bcfw_features(self, batch: ChunkBatch):
        return self.features(batch), batch.labels, batch.offsets

    def training_step(self, batch: ChunkBatch, batch_idx):
        feats = self.features(batch)
        return warmup_hinge_loss(self, feats, batch.labels, batch.offsets, batch.offsets.numel() - 1)

    def configure_optimizers(self):
        params = list(self._encoder().parameters()) + list(self.classifier.parameters())
        return cosine_schedule(self, torch.optim.AdamW(params, lr=self.hparams.lr,
                                                       weight_decay=self.hparams.weight_decay))

    def predict_tags(self, batch: ChunkBatch) -> Tensor:
        """Viterbi decoding of the chain head on the batch's features: label ids ``[N]``."""
        return self.head(self.features(batch), batch.offsets)

    def _eval_step(self, batch: ChunkBatch):
        pred = self.predict_tags(batch)
        self._eval.append((pred.cpu(), batch.offsets.cpu(), batch.labels.cpu(), batch.tags))

    def _eval_end(self, prefix: str):
        if not self._eval:
            return
        preds, offs, labels, tags = [], [0], [], []
        for p, o, y, t in self._eval:
            preds.append(p)
            offs.extend((o[1:] + offs[-1]).tolist())
            labels.append(y)
            tags.extend(t)
        self._eval = []
        pred, y = torch.cat(preds), torch.cat(labels)
        scores = chunk_f1_from_ids(pred, torch.tensor(offs), tags)
        for k in ("f1", "precision", "recall"):
            self.log(f"{prefix}/{k}", float(scores[k]))
        self.log(f"{prefix}/error", float((pred != y).double().mean()))
