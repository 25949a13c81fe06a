"""The texlive evaluation dataset: single manual pages as records with answer boxes, split by document family."""
from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from arr_coc.data import texlive
from arr_coc.data.datasets import DATASETS, load_dataset
from arr_coc.documents import corpus

FLOAT_PDF = corpus.DOC_ROOT / "latex/float/float.pdf"  # a 12-page manual of texlive-latex-recommended-doc


@pytest.fixture(scope="module")
def float_records(tmp_path_factory: pytest.TempPathFactory) -> tuple[list, Path]:
    folder = tmp_path_factory.mktemp("texlive")
    (doc,) = corpus.documents(paths=[FLOAT_PDF])  # fails (never skips) without the texlive doc packages
    return texlive._records_of(doc, folder, seed=0), folder


def test_pages_are_drawn_past_the_title_page_by_the_documents_name() -> None:
    assert texlive.chosen_pages("latex/float/float.pdf", 12) == [9, 10]
    assert texlive.chosen_pages("latex/float/float.pdf", 12, seed=1) == [10, 11]
    assert texlive.chosen_pages("x.pdf", 2) == [1] and texlive.chosen_pages("x.pdf", 1) == []


def test_a_manuals_pages_give_records_whose_answers_are_where_the_boxes_are(float_records) -> None:
    records, folder = float_records
    assert [(r.record_id, r.question, r.answer) for r in records] == [
        ("latex/float/float.pdf#p10#page_number", "What is the page number?", "10"),
        ("latex/float/float.pdf#p10#section_title", "What is the title of section 5?", "The Float Styles"),
        ("latex/float/float.pdf#p10#next_words",
         'What comes after "the main text (\\float@addtolists{\\protect\\addvspace{10pt}}),"?', "without knowing exactly"),
        ("latex/float/float.pdf#p11#page_number", "What is the page number?", "11"),
        ("latex/float/float.pdf#p11#next_words", 'What comes after "than the \\floatc@plain macro."?', "The caption is"),
    ]
    for r in records:
        assert r.answer.casefold() not in r.question.casefold()  # no answer copied into its question
        assert r.group == "latex/float/float" and r.image.parent == folder / "pages" and r.dataset == "texlive"
        with Image.open(r.image) as im:
            w, h = im.size
        assert (h, w) == (1755, 1240)  # A4 at 150 dpi
        for y0, x0, y1, x1 in r.boxes_px:
            assert 0 <= y0 < y1 <= h and 0 <= x0 < x1 <= w
    folio = records[0].boxes_px[0]
    assert folio[0] > 0.85 * 1755  # the page number sits at the foot of these pages


def test_texlive_is_registered_with_the_corpus_split(tmp_path: Path) -> None:
    spec = DATASETS.get("texlive")
    assert spec.splits == "official" and spec.metric == "anls" and spec.reader == "tesseract"
    with pytest.raises(ValueError, match=r"unknown split 'dev'; choose one of train, val, test"):
        load_dataset("texlive", tmp_path, split="dev")
    assert corpus.split_of("latex/float/float") == "train"  # so this manual never appears in val or test
