"""Contexts: one image is today's path, totals are exact over any pages, detail goes to the page the question names."""
from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tolerances import assert_close_reduction, assert_far

from arr_coc import ARR, ARRConfig
from arr_coc.budget import split_budget
from arr_coc.config import MVP_CHANNELS, GestaltConfig, TextureConfig
from arr_coc.contexts import allocate_context, load_context, split_context, text_tokens, tokenizer_name
from arr_coc.documents.text_pages import TextLayout, render_text
from arr_coc.engine.query import HashingQueryEncoder

SMALL = TextLayout(size=14, width=280, height=224, margin=14)  # 10 x 8 cells of 28 px


def _arr(channels=MVP_CHANNELS) -> ARR:
    return ARR(ARRConfig(texture=TextureConfig(channels=channels)), query_encoder=HashingQueryEncoder()).eval()


def _without_times(d: dict) -> dict:
    return {k: v for k, v in d.items() if k not in ("timings_ms", "channel_ms")}


@pytest.mark.parametrize("budget", [{"saccades": 64}, {"tokens": 192}])
def test_one_image_is_todays_path(budget):
    arr, image = _arr(), torch.rand(3, 560, 448)
    ctx = allocate_context(arr, image, "Where is the total?", **budget)
    grid, k = split_budget(budget["tokens"], (20, 16)) if "tokens" in budget else (None, budget["saccades"])
    cfg = ARRConfig(texture=TextureConfig(channels=MVP_CHANNELS), gestalt=GestaltConfig(grid=grid))
    today = ARR(cfg, query_encoder=HashingQueryEncoder())(image, "Where is the total?", saccades=k)  # as look runs
    assert torch.equal(ctx.pages[0].plan.cells, today.positions[0])
    assert json.dumps(_without_times(ctx.allocation.to_json(0))) == json.dumps(_without_times(today.to_json(0)))
    assert ctx.tokens == today.tokens_sent == k + 8 * 8 and ctx.text_tokens is None and ctx.compression is None


def test_one_image_path_differs_from_a_wrong_k():  # negative control for the equality above
    arr, image = _arr(), torch.rand(3, 330, 270)
    ctx = allocate_context(arr, image, "Where is the total?", saccades=64)
    assert not torch.equal(ctx.pages[0].plan.cells, arr(image, "Where is the total?", saccades=63).positions[0])


@settings(max_examples=12, deadline=None)
@given(sizes=st.lists(st.tuples(st.integers(2, 7), st.integers(2, 7)), min_size=1, max_size=6),
       share=st.floats(0.05, 1.0), by_tokens=st.booleans())
def test_totals_are_exact_for_any_pages(sizes, share, by_tokens):
    arr = _arr()
    images = [torch.rand(3, 28 * h, 28 * w, generator=torch.Generator().manual_seed(i)) for i, (h, w) in enumerate(sizes)]
    n, cells = len(sizes), sum(h * w for h, w in sizes)
    if by_tokens:
        total = max(2 * n, round(share * cells))
        gestalts, k = split_context(sizes, tokens=total)
        if k > cells:
            return
        out = allocate_context(arr, images, "What is here?", tokens=total)
        assert out.tokens == total
    else:
        k = max(n, round(share * cells) // 2)
        gestalts, k2 = split_context(sizes, saccades=k)
        out = allocate_context(arr, images, "What is here?", saccades=k)
        assert k2 == k and out.tokens == k + sum(g[0] * g[1] for g in gestalts)
    assert out.saccades == k and [p.plan.gestalt for p in out.pages] == gestalts
    for p, (h, w) in zip(out.pages, sizes):
        assert p.plan.grid == (h, w) and p.image.shape[-2:] == (28 * h, 28 * w)
        c = p.plan.cells
        assert ((c[:, 0] < h) & (c[:, 1] < w) & (c >= 0).all(1)).all()
        assert len({tuple(x) for x in c.tolist()}) == len(c)  # distinct cells
    if n > 1:  # one ranking: every sent cell scores at least as high as every cell left out
        sent = torch.cat([p.plan.scores for p in out.pages])
        left = torch.cat([p.relevance.reshape(-1) for p in out.pages])
        assert sent.numel() == k and float(sent.min()) >= float(left.sort(descending=True).values[k - 1]) - 1e-6


def test_budget_rule_for_many_pages_and_its_limits():
    assert split_context([(40, 32)] * 20, tokens=1300) == ([(4, 4)] * 20, 980)
    assert split_context([(40, 32)] * 60, tokens=300) == ([(1, 1)] * 60, 240)
    with pytest.raises(ValueError, match=r"100 tokens cannot give 60 pages a 1x1 gestalt each.*at least 120 tokens"):
        split_context([(40, 32)] * 60, tokens=100)
    with pytest.raises(ValueError, match=r"each page needs at least a 1x1 gestalt, so K >= 5"):
        split_context([(4, 4)] * 5, saccades=4)
    with pytest.raises(ValueError, match=r"exceed the 8 cells"):
        split_context([(2, 2)] * 2, saccades=10)


def test_page_limit_is_one_clear_line():
    with pytest.raises(ValueError, match=r"has 5 pages; a context holds at most 4 .*raise --max-pages / max_pages="):
        load_context([torch.rand(3, 56, 56)] * 5, max_pages=4)


def _story(pages: int, needle_page: int) -> str:
    filler = "lorem ipsum dolor sit amet consectetur " * 12
    return "\n".join(filler + ("the zanzibar harbour opens at dawn " if i == needle_page else "") + "\n" * 12
                     for i in range(pages))


def test_detail_goes_to_the_page_holding_the_question_words():
    ctx = render_text(_story(5, 3), SMALL)
    holding = [i for i, p in enumerate(ctx.pages) if any(w.text == "zanzibar" for w in p.words)]
    assert len(holding) == 1
    needle = holding[0]
    arr = _arr()
    out = allocate_context(arr, ctx, "When does the zanzibar harbour open?", tokens=40)
    per_page = [p.saccades for p in out.pages]
    assert out.tokens == 40 and per_page[needle] == max(per_page)
    top = max(out.pages, key=lambda p: float(p.plan.scores[0]) if p.saccades else -1e9)
    y, x = top.plan.cells[0].tolist()
    boxes = [b for w, b in top.words if w in ("zanzibar", "harbour")]
    assert top.index == needle and any(b[0] < 28 * (y + 1) and b[2] > 28 * y and b[1] < 28 * (x + 1) and b[3] > 28 * x
                                       for b in boxes)
    blind = allocate_context(arr, ctx, "When does the zanzibar harbour open?", tokens=40, text_weight=0, page_weight=0)
    assert [p.saccades for p in blind.pages] != per_page  # without the text layer the ranking differs


def test_text_tokens_are_counted_and_named():
    ctx = render_text("one two three four five six seven eight nine ten " * 40, SMALL)
    out = allocate_context(_arr(), ctx, "What follows seven?", tokens=2 * len(ctx) + 10)
    words = " ".join(w.text for p in ctx.pages for w in p.words)
    assert out.text_tokens == text_tokens("\n\n".join(" ".join(w.text for w in p.words) for p in ctx.pages))
    assert out.text_tokens == 400 and text_tokens(words) == 400  # one WordPiece token per English number word
    assert out.compression == pytest.approx(400 / out.tokens) and out.tokenizer == tokenizer_name()

    class Chars:  # a tokenizer that counts characters, as the tiny VLMs' does
        name_or_path = "chars"

        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": list(text)}

    assert text_tokens("abc de", Chars()) == 6 and tokenizer_name(Chars()) == "chars"


def test_text_layer_channel_equals_the_matching_words_rasterised():
    from arr_coc.engine.cache import ImageCache
    from arr_coc.engine.channels.text_layer import WORDS_ENTRY
    from arr_coc.engine.texture import compute_texture, pool_to_cells

    ctx = render_text("the quick brown fox jumps over a lazy dog and the brown cat naps " * 3, SMALL)
    page = ctx.pages[0]
    words = [(w.text, w.box) for w in page.words]
    cache = ImageCache()
    cache.get(WORDS_ENTRY, page.image, lambda: words)
    question = 'What comes after "quick brown"?'
    got = pool_to_cells(compute_texture(page.image[None], ("text_layer",), queries=[question], cache=cache), 28)[0, 0]

    def raster(values: dict[str, float]) -> torch.Tensor:
        ref = torch.zeros(page.size)
        for i, (w, (y0, x0, y1, x1)) in enumerate(words):
            v = values.get(w, 0.0)
            if w == "brown" and i > 0 and words[i - 1][0] == "quick":
                v = 1.0  # the quote found verbatim: 3 x its two terms' weights (normalised to 1); "brown" alone 1 / 6
            ref[int(y0):int(y1), int(x0):int(x1)] = torch.maximum(ref[int(y0):int(y1), int(x0):int(x1)], torch.tensor(v))
        return torch.nn.functional.avg_pool2d(ref[None, None], 28)[0, 0]

    assert all(float(b[k]).is_integer() for _, b in words for k in range(4))  # rendered boxes are whole pixels
    atol = assert_close_reduction(got, raster({"quick": 1.0, "brown": 1 / 6}), reduction_len=28 * 28, depth=2)  # a cell
    assert_far(got, raster({"quick": 1.0, "brown": 1 / 6, "fox": 1 / 6}), atol=atol)  # control: one more word


def test_allocation_hands_the_rendered_words_to_the_channel():
    ctx = render_text("alpha beta gamma delta " * 30, SMALL)
    out = allocate_context(_arr(), ctx, "Where is gamma?", tokens=2 * len(ctx) + 8)
    for page, p in zip(ctx.pages, out.pages):
        assert p.text_from == "text layer" and p.words == [(w.text, w.box) for w in page.words]  # canvas = page


def test_a_seen_context_serves_several_questions_as_fresh_calls_do():
    from arr_coc.contexts import see_context

    ctx = render_text(_story(4, 2), SMALL)
    arr = _arr()
    seen = see_context(arr, ctx)
    for q in ("When does the zanzibar harbour open?", "What is lorem?"):
        a, b = allocate_context(arr, seen, q, tokens=40), allocate_context(_arr(), ctx, q, tokens=40)
        assert [p.plan.cells.tolist() for p in a.pages] == [p.plan.cells.tolist() for p in b.pages]
