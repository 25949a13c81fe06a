"""texlive-paraphrase over re-set text: each window's text layer set on pages, the answer found where its page went."""
from __future__ import annotations

import dataclasses
import re

import pytest

from arr_coc.data.paraphrase import paraphrase_context_set, texlive_paraphrase, text_windows


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
