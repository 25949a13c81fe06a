"""The OCR engine reads two lines at a time and gives exactly what RapidOCR's batches of six give."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import rapidocr  # a declared dependency: missing, it fails these tests (not skips them)
from PIL import Image
from rapidocr.ch_ppocr_rec import TextRecognizer

from arr_coc.ocr import DET_LIMIT_SIDE_LEN, LINES_AT_ONCE, PairedLinesOCR, line_groups, rapidocr_engine, rapidocr_params

EXAMPLES = Path(__file__).resolve().parents[1] / "arr_coc" / "examples"


def bgr(name: str) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(Image.open(EXAMPLES / name).convert("RGB"))[..., ::-1])


@pytest.fixture(scope="module")
def engines():
    params = rapidocr_params(DET_LIMIT_SIDE_LEN, 0.0)
    return rapidocr.RapidOCR(params=params), PairedLinesOCR(rapidocr.RapidOCR(params=params))


@pytest.mark.parametrize("name, lines", [("form.jpg", 33), ("receipt.jpg", 45)])
def test_paired_lines_read_the_examples_exactly_as_rapidocr(engines, name, lines):
    theirs, ours = (engine(bgr(name)) for engine in engines)
    assert len(ours.txts) == len(theirs.txts) == lines
    assert ours.txts == theirs.txts
    assert ours.scores == theirs.scores  # every score to the last bit, not within a tolerance
    assert np.array_equal(ours.boxes, theirs.boxes)


def test_a_row_read_alone_differs_from_its_batch_and_in_pairs_does_not(engines):
    """Why two at a time: a batch of one takes another kernel path (the control), a pair does not."""
    ocr, rec = engines[1].ocr, engines[1].rec
    pre, record = ocr.preprocess_img(ocr.load_img(bgr("receipt.jpg")))
    crops, _ = ocr.detect_and_crop(pre, record)
    group, ratio = line_groups(crops, rec.rec_batch_num, rec.rec_image_shape)[-2]
    batch = np.concatenate([rec.resize_norm_img(crops[i], ratio)[np.newaxis] for i in group]).astype(np.float32)
    together = rec.session(batch)
    assert len(group) == 6
    for start in range(0, 6, LINES_AT_ONCE):
        assert np.array_equal(rec.session(batch[start:start + 2]), together[start:start + 2])
    alone = max(float(np.abs(rec.session(batch[k:k + 1])[0] - together[k]).max()) for k in range(6))
    assert alone > 0


class Recogniser:
    """RapidOCR's TextRecognizer with a session that records each batch's shape (no model)."""

    rec_batch_num, rec_image_shape = 6, [3, 48, 320]
    resize_norm_img = TextRecognizer.resize_norm_img

    def __init__(self) -> None:
        self.shapes: list[tuple[int, ...]] = []

    def session(self, batch: np.ndarray) -> np.ndarray:
        self.shapes.append(batch.shape)
        return np.zeros((batch.shape[0], batch.shape[3] // 8, 3), np.float32)

    def postprocess_op(self, preds, word_box, wh_ratio_list, max_wh_ratio):
        return [(f"w{max_wh_ratio:g}", 1.0)] * len(preds), [None] * len(preds)


def test_lines_go_two_at_a_time_in_rapidocrs_groups_at_their_groups_width():
    engine = object.__new__(PairedLinesOCR)
    engine.rec, engine.ocr = Recogniser(), type("Ocr", (), {"return_word_box": False})()
    widths = (100, 400, 60, 200, 300, 500, 80, 1000)  # 8 lines 10 px high: groups of 6 and 2 by width / height
    out = engine.recognize([np.zeros((10, w, 3), np.uint8) for w in widths])
    # sorted: 60 80 100 200 300 400 | 500 1000; each group padded to its widest line (48 px high: x4.8)
    assert engine.rec.shapes == [(2, 3, 48, 1920)] * 3 + [(2, 3, 48, 4800)]
    assert out.txts == ("w40", "w40", "w40", "w40", "w40", "w100", "w40", "w100")
    engine.rec.shapes.clear()
    out = engine.recognize([np.zeros((10, w, 3), np.uint8) for w in widths[:7]])  # the 7th line is a group alone
    assert engine.rec.shapes == [(2, 3, 48, 1920)] * 3 + [(1, 3, 48, 2400)]
    engine.rec.shapes.clear()
    engine.recognize([np.zeros((10, w, 3), np.uint8) for w in widths[:5]])  # an odd group: the last line twice
    assert engine.rec.shapes == [(2, 3, 48, 1920)] * 3


def test_the_engine_factory_builds_the_paired_reader_once():
    assert isinstance(rapidocr_engine(), PairedLinesOCR)
    assert rapidocr_engine() is rapidocr_engine(DET_LIMIT_SIDE_LEN)


def test_an_engine_with_the_orientation_classifier_is_refused():
    with pytest.raises(ValueError, match="^PairedLinesOCR runs detection and recognition without the orientation "
                                         "classifier$"):
        PairedLinesOCR(rapidocr.RapidOCR(params={**rapidocr_params(960, 0.5), "Global.use_cls": True}))


def test_two_lines_at_a_time_hold_less_than_half_of_rapidocrs_peak():
    """One dense Letter page (49 lines) read in a process of its own each way, 3 times (the median run); RapidOCR's
    batches are the control."""
    import subprocess
    import sys

    root = EXAMPLES.parents[1]
    out = subprocess.run([sys.executable, "benchmarks/ocr_lines.py", "--skip", "identity", "--repeats", "3"], cwd=root,
                         check=True, capture_output=True, text=True).stdout
    rises = {row.split("|")[1].strip(): float(row.split("|")[-2].split()[0]) for row in out.splitlines()
             if row.startswith("| ") and row.endswith("MB |")}
    paired, batched = rises["two lines at a time (`PairedLinesOCR`)"], rises["RapidOCR, 6 lines a batch"]
    # the median of 3 runs each: single runs measured +132 to +268 MB paired, +446 to +630 MB batched
    assert paired < 300 and batched > 2 * paired, rises
