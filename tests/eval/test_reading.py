"""Reading: views of what the VLM sees and real OCR on them (scored by ``contains_score``)."""
from __future__ import annotations

import math
import os
from pathlib import Path

import matplotlib
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image, ImageDraw, ImageFont

from arr_coc.eval.metrics import contains_score
from arr_coc.eval.reading import (
    READERS,
    Reader,
    TesseractReader,
    crop_px,
    downsampled_grid,
    downsampled_view,
    foveated_view,
    gestalt_view,
    make_reader,
    read_region,
    scale_boxes,
    union_box,
)
from arr_coc.registry import UnknownNameError

CELL = 28
FONTS = Path(matplotlib.get_data_path()) / "fonts" / "ttf"
MARGIN = 6  # px around the answer box when reading


@pytest.fixture(scope="module")
def page() -> tuple[torch.Tensor, dict[str, tuple[str, tuple[float, float, float, float]]]]:
    """A 560x840 px canvas (20x30 cells): a large bold total and a small date, at measured boxes."""
    img = Image.new("RGB", (840, 560), "white")
    draw = ImageDraw.Draw(img)
    words = {}
    for key, text, xy, font in (
        ("total", "TOTAL 42.00", (60, 80), ImageFont.truetype(str(FONTS / "DejaVuSans-Bold.ttf"), 40)),
        ("date", "Date: 21/11/2026", (400, 400), ImageFont.truetype(str(FONTS / "DejaVuSans.ttf"), 16)),
    ):
        draw.text(xy, text, font=font, fill="black")
        x0, y0, x1, y1 = draw.textbbox(xy, text, font=font)
        words[key] = (text, (float(y0), float(x0), float(y1), float(x1)))  # (y0, x0, y1, x1) px
    pixels = torch.from_numpy(np.array(img)).permute(2, 0, 1).float() / 255  # [3, 560, 840]
    return pixels, words


@pytest.fixture(scope="module")
def tesseract() -> TesseractReader:
    return TesseractReader()


def cells_covering(box, margin, cell=CELL) -> torch.Tensor:
    """All (y, x) cells that the crop of ``box`` grown by ``margin`` touches: [K, 2]."""
    y0, x0, y1, x1 = box
    ys = range(math.floor((y0 - margin) / cell), math.ceil((y1 + margin) / cell))
    xs = range(math.floor((x0 - margin) / cell), math.ceil((x1 + margin) / cell))
    return torch.tensor([(y, x) for y in ys for x in xs])


# ----------------------------------------------------------------------------- OCR on views
@pytest.mark.slow
def test_tesseract_reads_both_words_at_full_resolution(page, tesseract):
    pixels, words = page
    for text, box in words.values():
        reading = read_region(tesseract, pixels, [box], margin_px=MARGIN)
        assert contains_score(reading, text) >= 0.9, (text, reading)


@pytest.mark.slow
def test_downsampled_view_with_5_percent_of_the_tokens_destroys_the_small_date(page, tesseract):
    pixels, words = page
    full = (pixels.shape[1] // CELL) * (pixels.shape[2] // CELL)  # 600 tokens
    view, used = downsampled_view(pixels, round(0.05 * full), CELL)  # 30 tokens: text shrinks ~5x
    text, box = words["date"]
    assert used <= 30
    assert contains_score(read_region(tesseract, view, [box], margin_px=MARGIN), text) < 0.5


@pytest.mark.slow
def test_foveated_view_reads_the_date_like_full_resolution_and_gestalt_alone_does_not(page, tesseract):
    pixels, words = page
    text, box = words["date"]
    saccades = cells_covering(box, MARGIN)  # [K, 2] (y, x) cells
    fov = foveated_view(pixels, saccades, CELL, (4, 6))
    # Every pixel the reader sees is at full resolution, so the crop is bit-identical to the canvas's.
    assert torch.equal(crop_px(fov, box, MARGIN), crop_px(pixels, box, MARGIN))
    full_reading = read_region(tesseract, pixels, [box], margin_px=MARGIN)
    assert read_region(tesseract, fov, [box], margin_px=MARGIN) == full_reading
    assert contains_score(full_reading, text) >= 0.9
    gestalt_reading = read_region(tesseract, gestalt_view(pixels, CELL, (4, 6)), [box], margin_px=MARGIN)
    assert contains_score(gestalt_reading, text) < 0.5


@pytest.mark.slow
def test_rapidocr_reads_the_rendered_total(page):
    pixels, words = page
    text, box = words["total"]
    reader = make_reader("rapidocr")
    assert isinstance(reader, Reader)
    assert contains_score(read_region(reader, pixels, [box], margin_px=MARGIN), text) >= 0.9


# ----------------------------------------------------------------------------- views
def test_foveated_view_is_the_canvas_when_every_cell_is_a_saccade():
    pixels = torch.rand(3, 56, 84)
    every = torch.cartesian_prod(torch.arange(2), torch.arange(3))  # [6, 2] (y, x) cells
    assert torch.equal(foveated_view(pixels, every, CELL, (1, 1)), pixels)


def test_foveated_view_is_the_gestalt_view_when_there_are_no_saccades():
    pixels = torch.rand(3, 84, 56)
    none = torch.zeros(0, 2, dtype=torch.long)
    assert torch.equal(foveated_view(pixels, none, CELL, (2, 1)), gestalt_view(pixels, CELL, (2, 1)))


def test_foveated_view_pastes_only_the_saccade_cells():
    pixels = torch.rand(3, 56, 84)
    view = foveated_view(pixels, torch.tensor([[1, 2]]), CELL, (1, 1))
    gestalt = gestalt_view(pixels, CELL, (1, 1))
    assert torch.equal(view[:, 28:, 56:], pixels[:, 28:, 56:])
    assert torch.equal(view[:, :28], gestalt[:, :28]) and torch.equal(view[:, :, :56], gestalt[:, :, :56])


def test_views_of_a_batch_equal_the_views_of_each_image():
    pixels = torch.rand(2, 3, 56, 84)
    positions = torch.tensor([[[0, 0], [1, 2]], [[1, 1], [0, 2]]])  # [B, K, 2]
    batch = foveated_view(pixels, positions, CELL, (1, 2))
    down, used = downsampled_view(pixels, 3, CELL)
    for b in range(2):
        assert torch.equal(batch[b], foveated_view(pixels[b], positions[b], CELL, (1, 2)))
        assert torch.equal(down[b], downsampled_view(pixels[b], 3, CELL)[0])
    assert used == 3


def test_gestalt_view_at_the_canvas_grid_is_the_canvas_and_coarser_loses_detail():
    pixels = torch.rand(3, 56, 84)
    assert torch.equal(gestalt_view(pixels, CELL, (2, 3)), pixels)
    coarse = gestalt_view(pixels, CELL, (1, 1))
    assert coarse.shape == pixels.shape and coarse.std() < pixels.std() / 3
    assert 0 <= coarse.min() and coarse.max() <= 1


@pytest.mark.parametrize(
    "hc, wc, tokens, grid",
    [
        (10, 10, 50, (7, 7)),  # sqrt(0.5) * 10 = 7.07 -> 7x7 = 49; 8x7 = 56 does not fit
        (36, 27, 529, (26, 20)),  # 26.6 x 19.9 -> 26x19 = 494; +1 column (1.30 vs 4/3) beats +1 row (1.42)
        (20, 30, 30, (4, 7)),  # 4.47 x 6.71 -> 4x6 = 24; +1 col (0.571) beats +1 row (0.833) vs 0.667; 5x7 > 30
        (4, 40, 8, (1, 8)),  # 0.89 x 8.9 -> rows clamp to 1, cols cut to 8 by the budget
        (6, 8, 48, (6, 8)),  # the full budget is the canvas itself
        (6, 8, 1000, (6, 8)),  # more than the canvas: never upsample
        (5, 7, 1, (1, 1)),
        (40, 2, 3, (3, 1)),  # sqrt(3 * 20) = 7.7 rows wanted, but only 3 tokens: 3x1
    ],
)
def test_downsampled_grid_matches_hand_computed_cases(hc, wc, tokens, grid):
    assert downsampled_grid(hc, wc, tokens) == grid


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 60), st.integers(1, 60), st.integers(1, 4000))
def test_downsampled_grid_fits_the_budget_and_cannot_grow(hc, wc, tokens):
    rows, cols = downsampled_grid(hc, wc, tokens)
    assert 1 <= rows <= hc and 1 <= cols <= wc and rows * cols <= max(tokens, 1)
    if tokens >= hc * wc:
        assert (rows, cols) == (hc, wc)
    else:  # maximal: neither one more row nor one more column fits
        assert (rows + 1) * cols > tokens or rows == hc
        assert rows * (cols + 1) > tokens or cols == wc


def test_downsampled_view_keeps_the_canvas_size_and_reports_tokens_used():
    pixels = torch.rand(3, 280, 420)  # 10x15 = 150 cells
    view, used = downsampled_view(pixels, 40, CELL)
    assert view.shape == pixels.shape and used == 40  # 5.16 x 7.75 -> 5x7 = 35, +1 col -> 5x8 = 40
    full, used_full = downsampled_view(pixels, 150, CELL)
    assert torch.equal(full, pixels) and used_full == 150


def test_views_reject_a_canvas_that_is_not_cell_aligned_and_bad_positions():
    with pytest.raises(ValueError, match="multiples of cell=28"):
        gestalt_view(torch.rand(3, 50, 56), CELL, (1, 1))
    with pytest.raises(ValueError, match=r"\[K, 2\]"):
        foveated_view(torch.rand(3, 56, 56), torch.zeros(1, 1, 2, dtype=torch.long), CELL, (1, 1))
    with pytest.raises(ValueError, match="out of bounds"):
        foveated_view(torch.rand(3, 56, 56), torch.tensor([[2, 0]]), CELL, (1, 1))
    with pytest.raises(ValueError, match="tokens must be a positive int"):
        downsampled_view(torch.rand(3, 56, 56), 0, CELL)


# ----------------------------------------------------------------------------- boxes and crops
def test_crop_px_grows_the_box_by_the_margin_and_clips_to_the_image():
    image = torch.arange(20 * 30.0).view(1, 20, 30)
    crop = crop_px(image, (5.5, 10, 8, 12.2), margin_px=2)
    assert crop.shape == (1, 7, 7) and crop[0, 0, 0] == image[0, 3, 8]  # rows 3..9, cols 8..14
    assert crop_px(image, (0, 0, 20, 30), margin_px=50).shape == (1, 20, 30)


def test_crop_px_of_a_box_outside_the_image_says_so():
    with pytest.raises(ValueError, match="outside the 20x30 px image"):
        crop_px(torch.zeros(3, 20, 30), (25, 0, 40, 10), margin_px=4)
    with pytest.raises(ValueError, match="y1 < y0"):
        crop_px(torch.zeros(3, 20, 30), (10, 0, 5, 10))


def test_scale_boxes_and_union_box():
    assert scale_boxes([(10, 20, 30, 40), (0, 0, 1, 1)], (2.0, 0.5)) == [(20.0, 10.0, 60.0, 20.0), (0.0, 0.0, 2.0, 0.5)]
    assert union_box([(10, 20, 30, 40), (5, 30, 12, 60)]) == (5.0, 20.0, 30.0, 60.0)
    with pytest.raises(ValueError, match="at least one"):
        union_box([])


# ----------------------------------------------------------------------------- readers
def test_unknown_reader_lists_the_known_ones():
    assert set(READERS.names()) >= {"tesseract", "rapidocr"}
    with pytest.raises(UnknownNameError, match="known: tesseract, rapidocr"):
        make_reader("easyocr")


def test_missing_tesseract_binary_says_what_to_install():
    with pytest.raises(RuntimeError, match=r"apt-get install tesseract-ocr tesseract-ocr-eng.*--reader rapidocr"):
        TesseractReader(cmd="tesseract-that-is-not-installed")


def test_tesseract_thread_limit_goes_to_its_own_process_only(monkeypatch, tmp_path):
    monkeypatch.delenv("OMP_THREAD_LIMIT", raising=False)
    # a stand-in binary that prints the limit it was started with, as the reading
    fake = tmp_path / "tesseract"
    fake.write_text("#!/bin/sh\ncat > /dev/null\necho limit $OMP_THREAD_LIMIT args $@\n")
    fake.chmod(0o755)
    reader = TesseractReader(psm=7, cmd=str(fake), threads=1)
    assert reader.read(torch.ones(3, 50, 60)) == f"limit 1 args stdin stdout -l eng --psm 7"
    assert "OMP_THREAD_LIMIT" not in os.environ  # the caller's process is untouched
    assert TesseractReader(cmd=str(fake), threads=3).read(torch.ones(3, 50, 60)).startswith("limit 3 ")
    with pytest.raises(ValueError, match="psm"):
        TesseractReader(psm=14)
    with pytest.raises(ValueError, match="threads"):
        TesseractReader(threads=0)


def test_tesseract_failure_is_reported_with_its_message(tmp_path):
    fake = tmp_path / "tesseract"
    fake.write_text("#!/bin/sh\necho 'Error opening data file eng.traineddata' >&2\nexit 1\n")
    fake.chmod(0o755)
    with pytest.raises(RuntimeError, match="tesseract exited with 1: Error opening data file eng.traineddata"):
        TesseractReader(cmd=str(fake)).read(torch.ones(3, 20, 20))


def test_read_region_rejects_an_object_without_read():
    with pytest.raises(TypeError, match="read"):
        read_region(object(), torch.zeros(3, 28, 28), [(0, 0, 10, 10)])
