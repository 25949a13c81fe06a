"""texlive-paraphrase over re-set text: each window's text layer set on pages, the answer found where its page went."""
from __future__ import annotations

import dataclasses
import re
import warnings

import pytest

from arr_coc.data.paraphrase import drawable_windows, paraphrase_context_set, texlive_paraphrase, text_windows


def key(text: str) -> str:
    return re.sub(r"\W+", "", text.casefold())


@pytest.fixture(scope="module")
def items():
    found, made, folder = paraphrase_context_set(split="val", limit=6, source="text")
    assert (made["source"], folder) == ("text", "text")
    return list(found)


def test_every_answer_is_found_on_the_page_its_words_were_set_on(items):
    assert sum(len(i.questions) for i in items) == 6 and all(i.context_id.endswith("#text") for i in items)
    for item in items:
        ctx = item.load()
        for q in item.questions:
            assert q.found, q.record_id  # each of the 6 answers is on its re-set page
            page = ctx.pages[q.pages[0]]
            for occurrence in q.found:
                spelled = "".join(w.text for w in page.words if w.box in occurrence)
                # the answer's words, or the one word printed around it (code: \\def~{\\nobreakspace})
                assert any(key(a) in key(spelled) for a in q.answers), (q.record_id, spelled)


def test_an_answer_not_in_the_text_has_no_occurrence_and_keeps_its_page():
    q = texlive_paraphrase("val")[0]
    real, = [x for i in text_windows([q], 100.0) for x in i.questions]
    made_up, = [x for i in text_windows([dataclasses.replace(q, answers=("zzqx quux",))], 100.0) for x in i.questions]
    assert real.found and made_up.found == () and made_up.pages == real.pages


def test_an_unknown_source_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"unknown context source 'png'; choose one of pdf, text"):
        paraphrase_context_set(split="val", limit=1, source="png")


def test_a_window_the_font_cannot_draw_is_left_out_and_said_to_be():
    q = texlive_paraphrase("val")[0]
    thai = dataclasses.replace(q, document="thai.pdf", pages=(1, 1), id="t1")
    read = {(q.document, q.page_range): (["a page of plain words"], [1]), ("thai.pdf", "1-1"): (["สวัสดี naïve"], [1])}
    with pytest.warns(UserWarning, match=r"^1 window\(s\) left out of the re-set text \(2 questions\): the font "
                                         r"'DejaVu Sans' cannot draw their characters \(thai.pdf#1-1: 5 characters\)$"):
        kept, skipped = drawable_windows([q, thai, dataclasses.replace(thai, id="t2")], read)
    assert kept == [q]
    assert skipped == [{"window": "thai.pdf#1-1", "questions": 2, "missing_characters": 5}]
    # control: every window drawable, nothing left out and no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert drawable_windows([q], read) == ([q], [])
