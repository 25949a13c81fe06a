"""The ``find`` reading: OCR reads the whole view, not told where the answer is; the answer counts only if shown."""
import json
from pathlib import Path

import pytest
import torch
from test_evaluate import make_pages  # beside this file (rootdir import mode)

from arr_coc.config import ARRConfig
from arr_coc.data.datasets import load_dataset
from arr_coc.engine.pipeline import ARR
from arr_coc.engine.plan import Plan
from arr_coc.engine.query import HashingQueryEncoder
from arr_coc.eval.evaluate import evaluate
from arr_coc.eval.metrics import best_window
from arr_coc.eval.reading import make_view_reader, render, scale_boxes
from arr_coc.eval.settings import EvalSettings


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> Path:
    return make_pages(tmp_path_factory.mktemp("find_pages"), n_pages=1)


def answer_cells(box: tuple, cell: int) -> set[tuple[int, int]]:
    y0, x0, y1, x1 = box
    return {(y, x) for y in range(int(y0 // cell), int((y1 - 1) // cell) + 1)
            for x in range(int(x0 // cell), int((x1 - 1) // cell) + 1)}


def test_whole_view_finds_the_answer_only_when_its_cells_are_sent(pages):
    """Positive control: the answer's cells sent at full resolution; negative: every other cell but those."""
    records = load_dataset("jsonl", pages)
    arr = ARR(ARRConfig(), query_encoder=HashingQueryEncoder())
    canvas = arr.see(records[0].image).canvas
    cell, (h, w) = canvas.cell, canvas.sizes[0]
    pixels, grid = canvas.pixels[0, :, :h, :w], (h // cell, w // cell)
    reader = make_view_reader("tesseract", "find")
    for record in records:
        mine = answer_cells(scale_boxes(record.boxes_px, canvas.scales[0])[0], cell)
        others = [(y, x) for y in range(grid[0]) for x in range(grid[1]) if (y, x) not in mine]
        for cells, found in ((sorted(mine), True), (others, False)):
            plan = Plan("topk", "cells", grid, gestalt=(2, 2), cells=torch.tensor(cells))
            score, span = best_window(reader.read(render(plan, pixels, cell)), record.answer)
            assert (score >= 0.9) == found, (record.answer, found, score, span)


def test_find_rows_keep_the_span_that_counted_and_full_resolution_finds_every_answer(pages, tmp_path):
    records = load_dataset("jsonl", pages)
    arr = ARR(ARRConfig(), query_encoder=HashingQueryEncoder()).eval()
    settings = EvalSettings(methods=("full", "uniform_image"), budgets=("5%",), reading="find")
    rows = [json.loads(line) for line in evaluate(records, arr, tmp_path / "find", settings, progress=False)
            .read_text().splitlines()]
    full = {r["answer"]: r for r in rows if r["method"] == "full"}
    for answer, row in full.items():  # the span found, not the page: a few words, the answer among them
        assert row["reading"] >= 0.9 and len(row["prediction"].split()) <= len(answer.split()) + 1, row
        assert row["read_words"] >= 6  # every key and value on the page was read
    blurred = [r for r in rows if r["method"] == "uniform_image"]
    assert sum(r["reading"] for r in blurred) / len(blurred) < 0.5  # 30 tokens cannot show 13 px text
    # a folder of region readings refuses find rows: the reading is one of the settings a row depends on
    evaluate(records[:1], arr, tmp_path / "region", EvalSettings(methods=("full",), budgets=("5%",)), progress=False)
    with pytest.raises(ValueError, match=r"reading: 'region' -> 'find'"):
        evaluate(records[:1], arr, tmp_path / "region", settings, progress=False)
    with pytest.raises(ValueError, match=r"unknown reading 'page'; choose one of region, find"):
        EvalSettings(reading="page")
