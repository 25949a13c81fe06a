"""The microscope over a context, through its service layer: a PDF's pages, the strip, the opened page, bad input."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import key_pdf

from arr_coc.app.context_tab import context_summary, open_page, run_context, strip
from arr_coc.app.service import Microscope
from arr_coc.engine.query import HashingQueryEncoder


@pytest.fixture(scope="module")
def scope() -> Microscope:
    return Microscope(query_encoder=HashingQueryEncoder())


@pytest.fixture(scope="module")
def pdf(tmp_path_factory) -> Path:
    return key_pdf(tmp_path_factory.mktemp("app") / "doc.pdf", 40)


def test_a_pdf_context_gets_one_budget_a_strip_and_an_opened_page(scope, pdf):
    alloc = run_context(scope, [str(pdf)], "Where is the brass key?", 60, pages="36-40", dpi=60)
    assert [p.index + 1 for p in alloc.pages] == [36, 37, 38, 39, 40] and alloc.tokens == 60
    text = context_summary(alloc)
    assert "sent **60** visual tokens" in text and "compression" in text and text.count("| text layer |") == 5
    s = strip(alloc, height=120)
    assert s.shape[0] == 120 and s.shape[1] > 5 * 60
    page = open_page(alloc, 38)  # page 38 holds the brass key (index 37)
    assert alloc.pages[2].saccades > 0 and page.shape[0] == 900
    red = (page[..., 0] > 200) & (page[..., 1] < 40) & (page[..., 2] < 40)
    assert red.sum() > 0  # the saccades are outlined
    blank = open_page(alloc, 36) if alloc.pages[0].saccades == 0 else None
    if blank is not None:
        assert not ((blank[..., 0] > 200) & (blank[..., 1] < 40)).any()


@pytest.mark.parametrize("args, message", [
    (([], "q", 10), "upload a PDF or several images first"),
    ((["a.png"], "", 10), "the question is empty"),
    ((["a.pdf"], "q", 1.5), "the tokens T must be a whole number of at least 2"),
    ((["a.pdf", "b.png"], "q", 10), "upload one PDF, or several images, not both"),
])
def test_bad_context_requests_raise_one_readable_line(scope, args, message):
    with pytest.raises(ValueError, match=message):
        run_context(scope, *args)


def test_opening_a_page_outside_the_context_says_which_exist(scope, pdf):
    alloc = run_context(scope, [str(pdf)], "Where is the brass key?", 30, pages="1-3", dpi=60)
    with pytest.raises(ValueError, match=r"page 9 is not in this context; open one of 1-3"):
        open_page(alloc, 9)
    assert isinstance(strip(alloc), np.ndarray)
