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


FANCYBOX = "/usr/share/doc/texlive-doc/latex/fancybox/fancybox-doc.pdf"  # texlive-latex-recommended-doc (make test)


def test_find_reads_the_saccades_alone_where_the_whole_view_loses_them_in_the_gestalt():
    """A real manual page, one line's cells sent beside a 1 x 1 gestalt: Tesseract binarises the whole view at one
    threshold, the gestalt's blurred paragraphs fall dark and swallow the sharp line; its cells alone read."""
    from arr_coc.contexts import load_context
    from arr_coc.eval.reading import find_reading, saccades_view

    page = load_context(FANCYBOX, pages="7", dpi=100).pages[0]
    cell, answer = 28, "an equation, but"
    hc, wc = page.image.shape[-2] // cell, page.image.shape[-1] // cell
    pixels = page.image[:, : hc * cell, : wc * cell]
    word = next(w for w in page.words if w.text == "equation,")
    plan = Plan("coc", "cells", (hc, wc), gestalt=(1, 1), cells=torch.tensor([(int(word.box[0] // cell), x)
                                                                              for x in range(10)]))
    reader = make_view_reader("tesseract", "find")
    view = render(plan, pixels, cell)
    assert best_window(reader.read(view), answer)[0] < 0.5  # the whole view alone: the line is lost
    alone = saccades_view(plan, pixels, cell)
    sent = torch.zeros(hc, wc, dtype=torch.bool)
    sent[plan.cells[:, 0], plan.cells[:, 1]] = True
    sent = sent.repeat_interleave(cell, 0).repeat_interleave(cell, 1)
    assert torch.equal(alone[:, sent], pixels[:, sent]) and torch.equal(alone[:, sent], view[:, sent])  # the cells
    assert bool((alone[:, ~sent] == 1).all()) and not bool((view[:, ~sent] == 1).all())  # white, not the gestalt
    score, span, words = find_reading(reader, plan, pixels, cell, answer, view)
    assert score >= 0.9 and "equation" in span and 3 <= words <= 10, (score, span, words)


class Scripted:
    """A reader that answers from a script by the view's kind: a gestalt left in it, or white around the cells."""

    def __init__(self, view: str, alone: str) -> None:
        self.texts, self.calls = {"view": view, "alone": alone}, []

    def read(self, image: torch.Tensor) -> str:
        kind = "alone" if bool(((image == 1) | (image == 0.25)).all()) else "view"
        self.calls.append(kind)
        return self.texts[kind]


@pytest.mark.parametrize("view_text, alone_text, want, calls", [
    ("noise", "the total 9.00", (1.0, "total 9.00"), ["view", "alone"]),  # the cells alone find it
    ("total 9.00", "noise", (1.0, "total 9.00"), ["view"]),  # found whole in the view: not read again
    ("total 9.0", "nothing", (0.9, "total 9.0"), ["view", "alone"]),  # the better of the two is kept
])
def test_find_reading_keeps_the_better_of_the_view_and_the_cells_alone(view_text, alone_text, want, calls):
    from arr_coc.eval.reading import find_reading

    pixels = torch.full((3, 56, 84), 0.25)
    cells = Plan("coc", "cells", (2, 3), gestalt=(1, 1), cells=torch.tensor([[1, 2]]))
    view = torch.rand(3, 56, 84)  # a view with a gestalt in it
    reader = Scripted(view_text, alone_text)
    score, span, words = find_reading(reader, cells, pixels, 28, "total 9.00", view)
    assert (round(score, 2), span) == want and reader.calls == calls
    assert words == len((view_text if span in view_text else alone_text).split())
    reader = Scripted(view_text, alone_text)  # a plan without cells (full resolution): the view alone, once
    assert find_reading(reader, Plan("full", "full", (2, 3)), pixels, 28, "total 9.00", view)[:2] == best_window(
        view_text, "total 9.00") and reader.calls == ["view"]
    reader = Scripted(view_text, alone_text)  # a view's text read before (a page shared by questions) is not re-read
    assert find_reading(reader, cells, pixels, 28, "total 9.00", text="total 9.00")[0] == 1.0 and reader.calls == []
