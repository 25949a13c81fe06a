"""Questions over a whole context: each points at one page, never quotes its answer, spreads over the pages."""
from __future__ import annotations

import random

import pytest

from arr_coc.documents.questions import context_questions, leaks
from arr_coc.documents.text_pages import TextLayout, render_text

WORDS = ("harbour lantern copper meadow violet engine quiet marble falcon river orchard silver candle "
         "thunder garden bridge velvet compass winter saddle").split()


@pytest.fixture(scope="module")
def ctx():
    rng = random.Random(3)
    lines = [" ".join(rng.choice(WORDS) for _ in range(9)) for _ in range(400)]
    return render_text("\n".join(lines), TextLayout(size=14, width=560, height=448, margin=28), "story")


def test_context_questions_point_at_one_page_and_never_quote_their_answer(ctx):
    qs = context_questions(ctx, 6)
    text = " ".join(w.text for p in ctx.pages for w in p.words).casefold()
    assert len(ctx) >= 6 and len(qs) == 6 and len({q.page for q in qs}) == 6  # one per page while pages remain
    for q in qs:
        assert not leaks(q) and text.count(q.answers[0].casefold()) == 1  # the answer is on one page only
        page = ctx.pages[q.page]
        assert q.answers[0] in page.text.replace("\n", " ")
    assert [q.page for q in qs] == sorted(q.page for q in qs)
    assert context_questions(ctx, 6) == qs and context_questions(ctx, 6, seed=1) != qs  # seeded


def test_context_questions_refuse_the_page_number_kind(ctx):
    with pytest.raises(ValueError, match=r"kind\(s\) \['page_number'\] do not point at one page"):
        context_questions(ctx, 3, kinds=("page_number",))
