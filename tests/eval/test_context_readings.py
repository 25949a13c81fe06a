"""Rows over contexts carry both readings (region, find), the one-saccade page hit and the strict one, and the
retrieval_pages method ranks pages by the retriever, its lines embedded once per context."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import key_pdf
from PIL import Image, ImageDraw
from word_retriever import WordRetriever

from arr_coc.app.panels import font
from arr_coc.config import MVP_CHANNELS, ARRConfig, TextureConfig
from arr_coc.data.contexts import ContextItem, ContextQuestion
from arr_coc.documents.pdf import read_pdf
from arr_coc.engine import retrieval
from arr_coc.engine.pipeline import ARR
from arr_coc.engine.plan import Plan
from arr_coc.engine.query import HashingQueryEncoder
from arr_coc.eval.context_run import measure
from arr_coc.eval.evaluate import evaluate
from arr_coc.eval.reading import make_view_reader
from arr_coc.eval.settings import EvalSettings
from arr_coc.eval.store import RowStore

CELL = 28
ANSWER = "under the mat"


@pytest.fixture(scope="module")
def page() -> tuple[torch.Tensor, tuple[float, ...]]:
    """A 224 x 336 px page (8 x 12 cells) saying the answer once, and its box (y0, x0, y1, x1) px."""
    img = Image.new("RGB", (336, 224), "white")
    draw = ImageDraw.Draw(img)
    draw.text((40, 100), ANSWER, fill="black", font=font(24))
    x0, y0, x1, y1 = draw.textbbox((40, 100), ANSWER, font=font(24))
    return torch.from_numpy(np.array(img)).permute(2, 0, 1).float() / 255, (y0, x0, y1, x1)


@pytest.fixture(scope="module")
def readers() -> dict:
    return {r: make_view_reader("tesseract", r) for r in ("region", "find")}


def cells_of(box: tuple[float, ...]) -> list[tuple[int, int]]:
    y0, x0, y1, x1 = box
    return [(y, x) for y in range(int(y0 // CELL), int((y1 - 1) // CELL) + 1)
            for x in range(int(x0 // CELL), int((x1 - 1) // CELL) + 1)]


def cells_plan(cells: list[tuple[int, int]]) -> Plan:
    return Plan("coc", "cells", (8, 12), gestalt=(1, 1), cells=torch.tensor(cells))


def test_both_readings_and_both_hits_of_one_page(page, readers):
    image, box = page
    answer = cells_of(box)
    others = [(y, x) for y in range(8) for x in range(12) if (y, x) not in answer]
    got = {name: measure(plan, image, CELL, [[box]], [ANSWER], readers, 4.0) for name, plan in (
        ("full", Plan("full", "full", (8, 12))), ("answer", cells_plan(answer)), ("one", cells_plan(answer[:1])),
        ("elsewhere", cells_plan(others)))}
    assert got["full"]["reading"] == got["full"]["found"] == 1.0 and got["full"]["found_text"] == ANSWER
    assert (got["full"]["hit"], got["full"]["strict"], got["full"]["coverage"]) == (1, 1.0, 1.0)
    assert got["answer"]["found"] == 1.0 and got["answer"]["strict"] == 1.0  # the answer's cells alone suffice
    # one saccade on the answer: a page hit, but not a strict one
    assert got["one"]["hit"] == 1 and got["one"]["strict"] == 0.0 and 0 < got["one"]["coverage"] < 0.5
    # negative control: every cell but the answer's: the page is hit, the answer is neither covered nor found
    assert got["elsewhere"]["hit"] == 1 and got["elsewhere"]["coverage"] == 0.0 and got["elsewhere"]["strict"] == 0.0
    assert got["elsewhere"]["found"] < 0.5 and got["elsewhere"]["reading"] < 0.5
    nothing = measure(None, image, CELL, [[box]], [ANSWER], readers, 4.0)
    assert nothing == {"hit": 0, "coverage": 0.0, "strict": 0.0, "reading": 0.0, "prediction": "", "found": 0.0,
                       "found_text": ""}


def test_the_strict_hit_counts_the_best_covered_occurrence_and_no_boxes_read_by_finding(page, readers):
    image, box = page
    far = (10.0, 250.0, 30.0, 320.0)  # an occurrence elsewhere, not sent
    plan = cells_plan(cells_of(box))
    got = measure(plan, image, CELL, [[far], [box]], [ANSWER], readers, 4.0)
    assert got["strict"] == 1.0 and got["coverage"] == 1.0 and got["reading"] == 1.0  # the occurrence read best
    blind = measure(plan, image, CELL, [[]], [ANSWER], readers, 4.0)  # no boxes: the region reading is the find one
    assert math.isnan(blind["coverage"]) and math.isnan(blind["strict"]) and blind["hit"] == 1
    assert blind["reading"] == blind["found"] == 1.0 and blind["prediction"] == blind["found_text"] == ANSWER


def test_a_squares_plans_full_resolution_cells_are_its_1x1_squares(page):
    image, box = page
    answer = cells_of(box)
    ones = Plan("p", "squares", (8, 12), gestalt=(1, 1), squares=torch.tensor([[y, x, 1] for y, x in answer]))
    covers = {name: measure(plan, image, CELL, [[box]], [ANSWER], {}, 4.0) for name, plan in (
        ("cells", cells_plan(answer)), ("ones", ones),
        ("twos", Plan("p", "squares", (8, 12), gestalt=(1, 1), squares=torch.tensor([[0, 0, 2], [6, 10, 2]]))))}
    assert covers["ones"] == covers["cells"] and covers["ones"]["coverage"] == 1.0 and covers["ones"]["hit"] == 1
    # control: 2 x 2 squares are one token for four cells, not full resolution: no hit, nothing covered
    assert (covers["twos"]["hit"], covers["twos"]["coverage"], covers["twos"]["strict"]) == (0, 0.0, 0.0)


class Counting:
    def __init__(self, reader) -> None:
        self.reader, self.calls = reader, 0

    def read(self, image):
        self.calls += 1
        return self.reader.read(image)


def test_a_whole_view_that_no_question_changes_is_read_once(page, readers):
    image, box = page
    find = Counting(readers["find"])
    mine, views = {"region": readers["region"], "find": find}, {}
    for plan in (Plan("full", "full", (8, 12)), Plan("full", "full", (8, 12)), Plan("u", "native", (8, 12), native=20),
                 Plan("u", "native", (8, 12), native=20), cells_plan(cells_of(box)), cells_plan(cells_of(box))):
        measure(plan, image, CELL, [[box]], [ANSWER], mine, 4.0, views, page=3)
    assert find.calls == 4 and set(views) == {(3, "full", None), (3, "native", 20)}  # saccade views: every time


def test_retrieval_pages_sends_the_retrievers_page_whole_and_embeds_the_lines_once(tmp_path, monkeypatch):
    before = WordRetriever.calls_total
    monkeypatch.setattr(retrieval, "load_retriever", lambda: WordRetriever())
    pdf = key_pdf(tmp_path / "keys.pdf", 40)  # only page index 37 holds the brass key
    qs = [ContextQuestion(f"q{i}", q, (ANSWER,), (2,)) for i, q in enumerate(("Where is the brass key?",
                                                                               "Which mat hides the key?"))]
    item = ContextItem("keys", "k", lambda: read_pdf(pdf, pages=[35, 36, 37], dpi=100), qs)
    arr = ARR(ARRConfig(texture=TextureConfig(channels=MVP_CHANNELS)), query_encoder=HashingQueryEncoder()).eval()
    settings = EvalSettings(methods=("full", "first_pages", "retrieval_pages"), budgets=("60",))
    folder = evaluate([item], arr, tmp_path / "rows", settings, progress=False).parent
    rows = {(r["record_id"], r["method"]): r for r in RowStore(folder).rows()}
    assert WordRetriever.calls_total - before == 1  # one context, two questions: its lines embedded once
    for q in ("q0", "q1"):
        full, first, found = rows[(q, "full")], rows[(q, "first_pages")], rows[(q, "retrieval_pages")]
        assert found["tokens"] <= 60 and found["page_hit"] == 1.0 and found["reading_find"] >= 0.9
        assert first["page_hit"] == 0.0 and first["reading_find"] == 0.0  # reading order: page 1 first, the key last
        assert full["reading_find"] >= 0.9 and math.isnan(full["page_hit_strict"] or math.nan)  # no boxes
    saved = json.loads(Path(folder / "settings.json").read_text())
    assert saved["per_method"] == {"retrieval_pages": {"retriever": "words"}}
    assert saved["readings"] == ["region", "find"]
