"""The OCR loader and the acceptance run on OCR-large."""
import numpy as np
import pytest
import torch

from conftest import shared_data
from torch_bcfw import fit
from torch_bcfw.datasets.ocr import load_ocr, load_ocr_split, ocr_split
from torch_bcfw.models import Chain


@pytest.fixture(scope="module")
def words():
    return load_ocr(shared_data("ocr"))


def test_counts_and_splits(words):
    assert len(words) == 6877
    assert np.bincount(words.folds).tolist() == [626, 704, 684, 698, 693, 651, 739, 717, 690, 675]
    train, test = ocr_split(words, "large", 0)
    assert (len(train), len(test)) == (6251, 626)
    assert train.x.shape[1] == 128 and int(train.y.max()) <= 25
    small_train, small_test = ocr_split(words, "small", 0)
    assert (len(small_train), len(small_test)) == (626, 6251)
    assert torch.equal(small_train.x, test.x)


def test_reads_taskar_letter_data_format(words, tmp_path):
    """Write three words in the original letter.data layout and read them back."""
    lines, lid = [], 1
    for w in range(3):
        img, lab = words.images[w], words.labels[w]
        for t in range(len(lab)):
            nxt = lid + 1 if t + 1 < len(lab) else -1
            pix = "\t".join(str(int(v)) for v in img[t])
            lines.append(f"{lid}\t{chr(97 + lab[t])}\t{nxt}\t{w + 1}\t{t + 1}\t{words.folds[w]}\t{pix}")
            lid += 1
    (tmp_path / "letter.data").write_text("\n".join(lines) + "\n")
    txt = load_ocr(tmp_path)
    assert len(txt) == 3
    for w in range(3):
        assert np.array_equal(txt.images[w], words.images[w])
        assert np.array_equal(txt.labels[w], words.labels[w])
        assert txt.folds[w] == words.folds[w]


def test_missing_data_says_where_it_looked(tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        load_ocr(tmp_path / "nowhere")
    assert "nowhere" in str(e.value) and "letters.pickle" in str(e.value)
    with pytest.raises(FileNotFoundError, match="cache"):
        load_ocr(None, cache_dir=tmp_path / "cache", download=False)


def test_bad_split_arguments(words):
    with pytest.raises(ValueError, match="split"):
        ocr_split(words, "medium")
    with pytest.raises(ValueError, match="fold 12"):
        ocr_split(words, "large", 12)


def test_ocr_large_acceptance():
    """BCFW at lam = 0.01 certifies a gap < 0.01 within 100 passes; per-letter test error <= 0.13 on fold 0."""
    train, test = load_ocr_split(shared_data("ocr"), "large", 0)
    r = fit(Chain(128, 26), train, 0.01, test_data=test, max_passes=100, gap_check=10, gap_tol=0.01)
    assert r.stopped_by == "gap_tol"
    assert r.gap < 0.01 and r.passes <= 100
    last = r.history[-1]
    assert last.gap_last == pytest.approx(last.primal - last.dual)
    assert last.test_loss <= 0.13
    letter_err = float((r.predict(test) != test.y).double().mean())
    assert letter_err <= 0.13


def test_datamodule_serves_a_validation_fold_for_lam_choice():
    """``OCRWordsDataModule(val_fold=1)``: fold 1 leaves training and is the validation split (the held-out data of
    ``LamChoice``); without it there is none and ``bcfw_val_dataloader`` says how to get one."""
    pytest.importorskip("lightning", reason="the [lightning] extra is not installed")
    from torch_bcfw.tasks.ocr import OCRWordsDataModule

    dm = OCRWordsDataModule(shared_data("ocr"), val_fold=1, eval_batch_size=1000)
    dm.setup()
    words = load_ocr(shared_data("ocr"))
    assert (len(dm.train), len(dm.val), len(dm.test)) == (6251 - 704, 704, 626)
    held = torch.cat([b[1] for b in dm.bcfw_val_dataloader()])
    assert torch.equal(held, words.subset(words.folds == 1).y)
    plain = OCRWordsDataModule(shared_data("ocr"))
    plain.setup()
    assert plain.val is None and len(plain.train) == 6251
    with pytest.raises(ValueError, match="no validation split"):
        plain.bcfw_val_dataloader()
    with pytest.raises(ValueError, match="not both"):
        OCRWordsDataModule(shared_data("ocr"), val_fold=1, validate_on_test=True)
