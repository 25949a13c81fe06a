"""Contexts: one image is the ARR's own allocation, totals are exact over any pages and budgets, detail goes to the
page the question names."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tolerances import assert_close_reduction, assert_far

from arr_coc import ARR, ARRConfig
from arr_coc.budget import Budget
from arr_coc.config import MVP_CHANNELS, GestaltConfig, SamplerConfig, TextureConfig
from arr_coc.contexts import allocate, load_context, text_tokens, tokenizer_name
from arr_coc.documents.text_pages import TextLayout, render_text
from arr_coc.engine.query import HashingQueryEncoder

SMALL = TextLayout(size=14, width=280, height=224, margin=14)  # 10 x 8 cells of 28 px


def _arr(channels=MVP_CHANNELS, sampler="topk") -> ARR:
    return ARR(ARRConfig(texture=TextureConfig(channels=channels), sampler=SamplerConfig(name=sampler)),
               query_encoder=HashingQueryEncoder()).eval()


def _without_times(d: dict) -> dict:
    return {k: v for k, v in d.items() if k not in ("timings_ms", "channel_ms")}


SAMPLER_NAMES = ("topk", "nms", "stratified", "uniform", "random", "adaptive_stratified", "log_polar")


@pytest.mark.parametrize("sampler", SAMPLER_NAMES)
@pytest.mark.parametrize("budget", [Budget.saccades(64), Budget.parse("192"), Budget.parse("25%")])
def test_one_image_is_the_arrs_own_allocation_on_every_sampler(sampler, budget):
    """One image is a context of one page: its page is what ARR()(image, question) gives (same computation)."""
    arr, image = _arr(sampler=sampler), torch.rand(3, 560, 448, generator=torch.Generator().manual_seed(3))
    ctx = allocate(arr, image, "Where is the total?", budget)
    (grid,), k = budget.split([(20, 16)])
    cfg = ARRConfig(texture=TextureConfig(channels=MVP_CHANNELS), gestalt=GestaltConfig(grid=grid),
                    sampler=SamplerConfig(name=sampler))
    today = ARR(cfg, query_encoder=HashingQueryEncoder())(image, "Where is the total?", saccades=k)  # as look ran
    page = ctx.pages[0]
    assert torch.equal(page.plan.cells, today.positions[0]) and torch.equal(page.plan.scores, today.scores[0])
    assert page.plan.gestalt == today.gestalt.grid and torch.equal(page.placing, today.relevance.map[0])
    mine, theirs = _without_times(ctx.to_json()), _without_times(today.to_json(0))
    assert {key: mine[key] for key in theirs} == theirs  # every field look --json printed for an image, same values
    want = {"saccades": 64 + 8 * 8, "tokens": 192, "share": 80}[budget.kind]  # 25% of the 20 x 16 = 320 cells
    assert ctx.tokens == today.tokens_sent == want
    assert ctx.text_tokens is None and ctx.compression is None


def test_one_image_differs_from_a_wrong_k_or_sampler():  # negative controls for the equalities above
    arr, image = _arr(), torch.rand(3, 330, 270)
    ctx = allocate(arr, image, "Where is the total?", Budget.saccades(64))
    assert not torch.equal(ctx.pages[0].plan.cells, arr(image, "Where is the total?", saccades=63).positions[0])
    nms = allocate(_arr(sampler="nms"), image, "Where is the total?", Budget.saccades(64))
    assert not torch.equal(ctx.pages[0].plan.cells, nms.pages[0].plan.cells)


def test_shares_and_totals_over_a_context_by_share_and_compression():
    """"25%" and "10x" work over a context: T from the pages' full resolution or from the counted text."""
    ctx = render_text(_story(3, 1), SMALL)
    arr = _arr()
    quarter = allocate(arr, ctx, "When does the zanzibar harbour open?", "25%")
    full = sum(h * w for h, w in (p.plan.grid for p in quarter.pages))
    n = len(ctx.pages)
    assert full == n * 80 and quarter.tokens == round(0.25 * full) == n * 20  # 10 x 8 cells a page
    tenth = allocate(arr, ctx, "When does the zanzibar harbour open?", "10x")
    assert tenth.text_tokens > 0 and tenth.tokens == max(2 * n, round(tenth.text_tokens / 10))
    assert tenth.tokens != quarter.tokens  # control: the two rules give different totals here
    with pytest.raises(ValueError, match=r"budget 10x is a compression of the context's text, and this context has "
                                         r"no text"):
        allocate(arr, torch.rand(3, 280, 280), "What is here?", "10x")  # an image alone is not read by OCR


@settings(max_examples=12, deadline=None)
@given(sizes=st.lists(st.tuples(st.integers(2, 7), st.integers(2, 7)), min_size=1, max_size=6),
       share=st.floats(0.05, 1.0), by_tokens=st.booleans())
def test_totals_are_exact_for_any_pages(sizes, share, by_tokens):
    arr = _arr()
    images = [torch.rand(3, 28 * h, 28 * w, generator=torch.Generator().manual_seed(i)) for i, (h, w) in enumerate(sizes)]
    n, cells = len(sizes), sum(h * w for h, w in sizes)
    if by_tokens:
        total = max(2 * n, round(share * cells))
        gestalts, k = Budget.parse(total).split(sizes)
        out = allocate(arr, images, "What is here?", total)
        assert out.tokens == total
    else:
        k = max(n, round(share * cells) // 2)
        gestalts, k2 = Budget.saccades(k).split(sizes)
        out = allocate(arr, images, "What is here?", Budget.saccades(k))
        assert k2 == k and out.tokens == k + sum(g[0] * g[1] for g in gestalts)
    assert out.saccades == k and [p.plan.gestalt for p in out.pages] == gestalts
    for p, (h, w) in zip(out.pages, sizes):
        assert p.plan.grid == (h, w) and p.image.shape[-2:] == (28 * h, 28 * w)
        c = p.plan.cells
        assert ((c[:, 0] < h) & (c[:, 1] < w) & (c >= 0).all(1)).all()
        assert len({tuple(x) for x in c.tolist()}) == len(c)  # distinct cells
    if n > 1:  # one ranking: every sent cell scores at least as high as every cell left out
        sent = torch.cat([p.relevance[p.plan.cells[:, 0], p.plan.cells[:, 1]] for p in out.pages])
        left = torch.cat([p.relevance.reshape(-1) for p in out.pages])
        assert sent.numel() == k and float(sent.min()) >= float(left.sort(descending=True).values[k - 1]) - 1e-6


def test_budget_rule_for_many_pages_and_its_limits():
    assert Budget.parse(1300).split([(40, 32)] * 20) == ([(1, 1)] * 20, 1280)  # 4x4 is below LEGIBLE_SIDE: 1x1
    assert Budget.parse(1300).split([(40, 32)] * 20, legible=0) == ([(4, 4)] * 20, 980)  # control: the square rule
    assert Budget.parse(3000).split([(40, 32)] * 20) == ([(8, 8)] * 20, 1720)  # 8x8 is legible: kept
    assert Budget.parse(100).split([(40, 32)]) == ([(6, 6)], 64)  # one image keeps a small gestalt
    assert Budget.saccades(400).split([(40, 32)] * 20) == ([(1, 1)] * 20, 400)  # K: the same rule (4x4 -> 1x1)
    assert Budget.saccades(1280).split([(40, 32)] * 20) == ([(8, 8)] * 20, 1280)
    assert Budget.parse(300).split([(40, 32)] * 60) == ([(1, 1)] * 60, 240)
    with pytest.raises(ValueError, match=r"100 tokens cannot give 60 pages a 1x1 gestalt each.*at least 120 tokens"):
        Budget.parse(100).split([(40, 32)] * 60)
    with pytest.raises(ValueError, match=r"each page needs at least a 1x1 gestalt, so K >= 5"):
        Budget.saccades(4).split([(4, 4)] * 5)
    with pytest.raises(ValueError, match=r"exceed the 8 cells"):
        Budget.saccades(10).split([(2, 2)] * 2)


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
    out = allocate(arr, ctx, "When does the zanzibar harbour open?", 40)
    per_page = [p.saccades for p in out.pages]
    assert out.tokens == 40 and per_page[needle] == max(per_page)
    top = max(out.pages, key=lambda p: float(p.relevance[tuple(p.plan.cells[0])]) if p.saccades else -1e9)
    y, x = top.plan.cells[0].tolist()
    boxes = [b for w, b in top.words if w in ("zanzibar", "harbour")]
    assert top.index == needle and any(b[0] < 28 * (y + 1) and b[2] > 28 * y and b[1] < 28 * (x + 1) and b[3] > 28 * x
                                       for b in boxes)
    blind = allocate(arr, ctx, "When does the zanzibar harbour open?", 40, text_weight=0, page_weight=0)
    assert [p.saccades for p in blind.pages] != per_page  # without the text layer the ranking differs


def test_text_tokens_are_counted_and_named():
    ctx = render_text("one two three four five six seven eight nine ten " * 40, SMALL)
    out = allocate(_arr(), ctx, "What follows seven?", 2 * len(ctx) + 10)
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
    out = allocate(_arr(), ctx, "Where is gamma?", 2 * len(ctx) + 8)
    for page, p in zip(ctx.pages, out.pages):
        assert p.text_from == "text layer" and p.words == [(w.text, w.box) for w in page.words]  # canvas = page


def test_a_seen_context_serves_several_questions_as_fresh_calls_do():
    from arr_coc.contexts import see_context

    ctx = render_text(_story(4, 2), SMALL)
    arr = _arr()
    seen = see_context(arr, ctx)
    for q in ("When does the zanzibar harbour open?", "What is lorem?"):
        a, b = allocate(arr, seen, q, 40), allocate(_arr(), ctx, q, 40)
        assert [p.plan.cells.tolist() for p in a.pages] == [p.plan.cells.tolist() for p in b.pages]


def test_page_text_reaches_the_text_channels_as_an_argument_not_through_ocr(monkeypatch):
    """A scene's known text (ARR.see(..., text=)) is what text_match reads: no OCR runs, whatever the cache holds."""
    from arr_coc.engine.channel_registry import PageText
    from arr_coc.engine.channels import text as text_channel

    calls: list[int] = []
    monkeypatch.setattr(text_channel, "detect_lines", lambda *a, **k: calls.append(1) or pytest.fail("OCR ran"))
    ctx = render_text("alpha beta gamma delta " * 30, SMALL)
    page = ctx.pages[0]
    words = [(w.text, w.box) for w in page.words]
    lines = [(page.line_text(i), page.line_box(i)) for i in range(len(page.lines))]
    arr = _arr(MVP_CHANNELS + ("text_match",))
    scene = arr.see([page.image], text=[PageText(words, lines)])
    arr.cell_stack(scene, ["Where is gamma?"])
    read = arr.cache.get(text_channel.lines_entry(arr.query_encoder), page.image, lambda: pytest.fail("not read"))
    assert calls == [] and read.texts == tuple(t for t, _ in lines)  # the known lines, no OCR
    fresh = _arr(MVP_CHANNELS + ("text_match",))  # control: without the text the channel reads the page by OCR
    with pytest.raises(pytest.fail.Exception, match="OCR ran"):
        fresh.cell_stack(fresh.see([page.image]), ["Where is gamma?"])


def test_over_pages_the_ranking_decides_the_shares_and_each_pages_sampler_places_them():
    from arr_coc.contexts import rank_cells

    ctx, q = render_text(_story(3, 1), SMALL), "When does the zanzibar harbour open?"
    top = allocate(_arr(), ctx, q, 60)
    want = rank_cells([p.relevance for p in top.pages], top.saccades)  # top-K: the context's top K itself
    assert [p.plan.cells.tolist() for p in top.pages] == [c.tolist() for c in want]
    page = top.pages[0].to_json()
    assert page["scores"] == [round(float(s), 5) for s in top.pages[0].ranking_scores()]
    assert page["sampler_scores"] == [round(float(s), 5) for s in top.pages[0].plan.scores]
    nms = allocate(_arr(sampler="nms"), ctx, q, 60)
    assert [p.saccades for p in nms.pages] == [p.saccades for p in top.pages] and nms.tokens == 60
    assert [p.plan.cells.tolist() for p in nms.pages] != [c.tolist() for c in want]  # placed by nms's own rule
    for p in nms.pages:  # nms keeps a page's saccades apart (min distance 2 cells, Chebyshev) where they fit with room
        c = p.plan.cells  # (at 4 cells a saccade only a perfect 2 x 2 lattice fits, which a greedy placement rarely is)
        d = (c[:, None] - c[None]).abs().amax(-1) + 2 * torch.eye(len(c), dtype=torch.long)
        assert len(c) < 2 or int(d.min()) >= 2 or p.saccades * 4 >= p.plan.full_tokens
    spaced = allocate(_arr(sampler="nms"), ctx, q, 20)  # with room: 10 saccades on one page of 80 cells
    assert [p.saccades for p in spaced.pages] == [0, 0, 0, 0, 10, 0, 0, 0, 0, 0]
    c = spaced.pages[4].plan.cells
    assert int(((c[:, None] - c[None]).abs().amax(-1) + 2 * torch.eye(10, dtype=torch.long)).min()) == 2


def test_seeing_a_context_embeds_each_pages_lines_once_and_a_question_only_itself():
    from arr_coc.contexts import see_context

    class Counting(HashingQueryEncoder):
        texts: list[str] = []

        def encode(self, queries):
            self.texts.extend(queries)
            return super().encode(queries)

    ctx = render_text(_story(3, 1), SMALL)
    enc = Counting()
    arr = ARR(ARRConfig(texture=TextureConfig(channels=MVP_CHANNELS + ("text_match", "key_value"))),
              query_encoder=enc).eval()
    seen = see_context(arr, ctx)
    lines = {page.line_text(i) for page in ctx.pages for i in range(len(page.lines))}
    assert set(enc.texts) == lines  # the pages' lines, and no question (a page drawn twice is embedded once)
    enc.texts.clear()
    q = "When does the zanzibar harbour open?"
    a = allocate(arr, seen, q, 40)
    assert set(enc.texts) == {q}  # the question alone: every page's lines came from the cache
    fresh = ARR(ARRConfig(texture=TextureConfig(channels=MVP_CHANNELS + ("text_match", "key_value"))),
                query_encoder=HashingQueryEncoder()).eval()
    b = allocate(fresh, ctx, q, 40)  # control for the values: a fresh ARR on the context itself
    assert [p.plan.cells.tolist() for p in a.pages] == [p.plan.cells.tolist() for p in b.pages]


def test_a_fixed_gestalt_sends_page_thumbnails_the_legible_rule_would_drop():
    """Over several pages the split sends a side below LEGIBLE_SIDE as 1x1; K saccades with a fixed gestalt grid (the
    CLI's --saccades K --gestalt N) still send each page its N x N, and the totals stay exact both ways."""
    images = [torch.rand(3, 280, 224, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    by_rule = allocate(_arr(), images, "Where is the total?", Budget.saccades(40))
    # 3 x 2x2 fits in K = 40, but 2 is below LEGIBLE_SIDE: 1x1 each
    assert [p.plan.gestalt for p in by_rule.pages] == [(1, 1)] * 3 and by_rule.tokens == 40 + 3
    cfg = ARRConfig(texture=TextureConfig(channels=MVP_CHANNELS), gestalt=GestaltConfig(grid=(4, 4)))
    fixed = allocate(ARR(cfg, query_encoder=HashingQueryEncoder()).eval(), images, "Where is the total?",
                     Budget.saccades(40))
    assert [p.plan.gestalt for p in fixed.pages] == [(4, 4)] * 3 and fixed.tokens == 40 + 3 * 16
    assert fixed.saccades == by_rule.saccades == 40


def test_one_image_gets_a_gestalt_of_its_aspect_where_its_text_stays_legible():
    """One image whose lines (median height in px) stay >= LEGIBLE_TEXT_PX tall in a gestalt of its aspect holding
    LEGIBLE_SHARE of the total gets that gestalt; small print, an unknown height, K saccades and many pages keep the
    square rule. Totals exact every way."""
    # a receipt-sized canvas of 53 x 36 cells at 210 tokens: 40 px lines are 10.8 px in 14 x 10
    assert Budget.parse(210).split([(53, 36)], text_height=40.0) == ([(14, 10)], 70)
    assert Budget.parse(210).split([(53, 36)], text_height=21.0) == ([(8, 8)], 146)  # control: 5.7 px, square rule
    assert Budget.parse(210).split([(53, 36)]) == ([(8, 8)], 146)  # height unknown: the square rule
    assert Budget.saccades(146).split([(53, 36)], text_height=40.0) == ([(12, 12)], 146)  # K given: its square
    assert Budget.parse(1300).split([(40, 32)] * 20, text_height=40.0) == ([(1, 1)] * 20, 1280)  # many pages
    assert Budget.parse("11%").split([(20, 20)], text_height=40.0) == ([(6, 5)], 14)  # 44 tokens: 30 of them


def _printed(size: int, skip: int = 0) -> torch.Tensor:
    """A white 560 x 784 page (20 x 28 cells) with eight lines printed at ``size`` px (DejaVu Sans), the first
    ``skip`` of them left out -> [3, H, W]."""
    import matplotlib
    import numpy as np
    from PIL import Image, ImageDraw, ImageFont

    page = Image.new("RGB", (560, 784), "white")
    draw = ImageDraw.Draw(page)
    font = ImageFont.truetype(str(Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf"), size)
    for i, line in enumerate(["CORNER SHOP", "Bread 2.10", "Milk 1.40", "Eggs 3.20", "Tea 2.75", "Jam 4.10",
                              "Salt 0.90", "TOTAL 14.45"][skip:]):
        draw.text((30, 30 + i * int(size * 1.6)), line, fill="black", font=font)
    return torch.from_numpy(np.asarray(page).copy()).permute(2, 0, 1).float() / 255


def _cells(page) -> set[tuple[int, int]]:
    """The (y, x) cells a page allocation sends at full resolution."""
    return {tuple(c) for c in page.plan.cells.tolist()}


def _top_cells(scores: torch.Tensor, k: int) -> set[tuple[int, int]]:
    """The (y, x) cells of the k largest values of a [Hc, Wc] map."""
    width = scores.shape[1]
    return {(int(i) // width, int(i) % width) for i in torch.topk(scores.flatten(), k).indices}


def test_allocate_reads_the_text_channels_lines_for_one_images_gestalt():
    """allocate (and allocate_images, and the eval's MethodInputs) give large print the legible gestalt of its
    aspect and small print the square rule's, from the median height of the lines the text channels read."""
    from arr_coc.allocators.methods import MethodInputs
    from arr_coc.contexts import allocate_images
    from arr_coc.engine.channels.text import text_heights

    arr = _arr(MVP_CHANNELS + ("text_match", "key_value"))
    large, small = _printed(56), _printed(14)
    heights = [text_heights(arr, arr.see(img))[0] for img in (large, small)]
    # 28 x 20 cells: 11 % is 62 tokens; 70 % of them in 8 x 5 (40), where a line must be 37.4 px tall to stay 10
    assert heights[0] > 10.0 / (40 / 560) ** 0.5 > heights[1] > 0
    out = allocate(arr, large, "What is the total?", "11%")
    assert out.pages[0].plan.gestalt == (8, 5) and out.saccades == 22 and out.tokens == 62
    control = allocate(arr, small, "What is the total?", "11%")
    assert control.pages[0].plan.gestalt == (4, 4) and control.saccades == 46 and control.tokens == 62
    both = allocate_images(arr, [large, small], ["What is the total?"] * 2, "11%")
    assert [a.pages[0].plan.gestalt for a in both] == [(8, 5), (4, 4)]
    assert both[0].pages[0].plan.cells.tolist() == out.pages[0].plan.cells.tolist()
    canvas = arr.see(large).canvas
    assert MethodInputs(canvas, text_height=heights[0]).split(62) == ((8, 5), 22)
    assert MethodInputs(canvas).split(62) == ((4, 4), 46)


def test_one_image_is_placed_by_its_own_lines_retrieval():
    """One image without a text layer is placed on its relevance plus its text lines' retrieval map
    (``image_placing``, the lines its text channels read): allocate, allocate_images and image_placing agree; the cells
    off every line keep their relevance, the best line's gain half the relevance's span; weight 0 is the ARR's own
    placement (a control that picks other cells)."""
    from arr_coc.contexts import allocate_images, see_context
    from arr_coc.contexts.allocate import IMAGE_RETRIEVAL_WEIGHT, image_placing
    from arr_coc.contexts.pagetext import legible_lines
    from arr_coc.contexts.ranking import retrieval_map
    from arr_coc.engine.channels.text import text_lines

    arr, page, q = _arr(MVP_CHANNELS + ("text_match", "key_value")), _printed(28), "What is the TOTAL?"
    out = allocate(arr, page, q, "11%")
    plain = allocate(arr, page, q, "11%", image_retrieval_weight=0.0)
    rel, placing = plain.pages[0].placing, out.pages[0].placing  # weight 0: the relevance itself
    scene = arr.see(page)
    lines = legible_lines(text_lines(arr, scene)[0])
    assert IMAGE_RETRIEVAL_WEIGHT == 0.5 and len(lines) >= 6 and any("TOTAL" in t for t, _ in lines)
    assert torch.equal(image_placing(arr, scene, rel[None], q)[0], placing)
    assert torch.equal(image_placing(arr, scene, rel[None], q, weight=0.0)[0], rel)
    added, span = placing - rel, float(rel.max() - rel.min())
    on_lines = retrieval_map(lines, torch.ones(len(lines)), (784, 560), 28) > 0
    assert bool(on_lines.any()) and torch.equal(added[~on_lines], torch.zeros(int((~on_lines).sum())))
    total = retrieval_map([ln for ln in lines if "TOTAL" in ln[0]], torch.ones(1), (784, 560), 28) > 0
    # the question's line has value 1 (relevance + 0.5 x span, less the relevance: one float32 rounding each)
    assert torch.allclose(added[total], torch.full((int(total.sum()),), 0.5 * span), rtol=1e-5, atol=1e-6)
    assert float(added[on_lines & ~total].max()) < 0.5 * span
    k = out.saccades
    assert k == plain.saccades == 46 and out.tokens == plain.tokens == 62  # 11 % of 28 x 20 cells; 4 x 4 gestalt
    sent = lambda a: _cells(a.pages[0])  # noqa: E731
    assert sent(out) == _top_cells(placing, k)
    assert sent(out) != sent(plain)  # control: the relevance alone places elsewhere
    assert sum(bool(total[y, x]) for y, x in sent(out)) > sum(bool(total[y, x]) for y, x in sent(plain))
    seen = allocate(arr, see_context(arr, page), q, "11%")  # seen once: its lines are read at the question
    assert sent(seen) == sent(out) and torch.equal(seen.pages[0].placing, placing)
    (alone,) = allocate_images(arr, [page], [q], "11%")  # the same computation: the same bits
    assert sent(alone) == sent(out) and torch.equal(alone.pages[0].placing, placing)
    both = allocate_images(arr, [page, page.flip(-1)], [q, "Is there milk?"], "11%")  # a batch: within rounding
    assert_close_reduction(both[0].pages[0].placing, placing, reduction_len=4096)
    mirrored = allocate(arr, page.flip(-1), "Is there milk?", "11%").pages[0].placing
    assert_close_reduction(both[1].pages[0].placing, mirrored, reduction_len=4096)


def test_an_image_with_a_few_lines_is_placed_by_its_relevance_alone():
    """A photo's few words (fewer than LEGIBLE_MIN_LINES lines: a sign, a shirt) place nothing: allocate,
    allocate_images and image_placing give its relevance alone, exactly; the page of eight lines (the control, at the
    boundary) is placed by its lines' retrieval."""
    from arr_coc.budget import LEGIBLE_MIN_LINES
    from arr_coc.contexts import allocate_images
    from arr_coc.contexts.allocate import image_placing
    from arr_coc.contexts.pagetext import legible_lines
    from arr_coc.engine.channels.text import text_lines

    arr, q = _arr(MVP_CHANNELS + ("text_match", "key_value")), "What is the TOTAL?"
    few, page = _printed(28, skip=1), _printed(28)
    counts = [len(legible_lines(text_lines(arr, arr.see(p))[0])) for p in (few, page)]
    assert LEGIBLE_MIN_LINES == 8 and counts == [7, 8]
    rel = allocate(arr, few, q, "11%", image_retrieval_weight=0.0).pages[0].placing
    out = allocate(arr, few, q, "11%")
    assert torch.equal(out.pages[0].placing, rel)
    assert torch.equal(image_placing(arr, arr.see(few), rel[None], q)[0], rel)
    (alone,) = allocate_images(arr, [few], [q], "11%")
    assert torch.equal(alone.pages[0].placing, rel)
    control = allocate(arr, page, q, "11%")
    assert not torch.equal(control.pages[0].placing, allocate(arr, page, q, "11%", image_retrieval_weight=0.0)
                           .pages[0].placing)


def test_images_alone_places_each_image_of_a_context_within_its_share_as_one_image_is():
    """In a context of images the ranking (the PDF's weights) decides each page's share of the saccades; with
    ``images_alone`` each page without a text layer places its share on its relevance plus 0.5 x its lines' retrieval
    (image_retrieval_weight), as one image alone is: the shares do not depend on that weight; weight 0 places every
    page on its relevance itself (the control); a page whose OCR reads no line (the mirrored copy) keeps its
    relevance at any weight; by default each page is placed on the ranking (its cells the context's top K)."""
    from arr_coc.contexts.pagetext import legible_lines
    from arr_coc.contexts.ranking import retrieval_map
    from arr_coc.engine.channels.text import text_lines

    arr, q = _arr(MVP_CHANNELS + ("text_match", "key_value")), "What is the TOTAL?"
    page = _printed(28)
    pages = [page, page.flip(-1)]
    out = allocate(arr, pages, q, "11%", images_alone=True)
    plain = allocate(arr, pages, q, "11%", image_retrieval_weight=0.0, images_alone=True)
    default = allocate(arr, pages, q, "11%")
    assert [p.text_from for p in out.pages] == ["ocr", "ocr"] and out.tokens == plain.tokens == 123  # 11 % of 1120
    assert [p.saccades for p in out.pages] == [p.saccades for p in plain.pages] == [p.saccades for p in default.pages]
    assert out.pages[0].saccades == out.saccades > 0  # the matched lines outrank the mirrored page's relevance
    assert torch.equal(out.pages[1].placing, plain.pages[1].placing)  # no line read: its relevance
    rel, placing = plain.pages[0].placing, out.pages[0].placing  # weight 0: the relevance itself
    lines = legible_lines(text_lines(arr, arr.see(page))[0])
    on_lines = retrieval_map(lines, torch.ones(len(lines)), (784, 560), 28) > 0
    added, span = placing - rel, float(rel.max() - rel.min())
    assert torch.equal(added[~on_lines], torch.zeros(int((~on_lines).sum())))
    total = retrieval_map([ln for ln in lines if "TOTAL" in ln[0]], torch.ones(1), (784, 560), 28) > 0
    # the context's best line (the question's) has value 1: half the page's relevance span
    assert torch.allclose(added[total], torch.full((int(total.sum()),), 0.5 * span), rtol=1e-5, atol=1e-6)
    assert not torch.equal(default.pages[0].placing, placing)  # by default: the ranking, its top K the page's cells
    assert _cells(default.pages[0]) == _top_cells(default.pages[0].relevance, default.pages[0].saccades)
    for a in (out, plain, default):  # each page's cells: the top k_i of its placing map (top-K sampler)
        for p in a.pages:
            assert _cells(p) == _top_cells(p.placing, p.saccades)
    assert _cells(out.pages[0]) != _cells(plain.pages[0])


def test_one_images_lines_reordered_by_a_reranker_only_when_asked():
    """``image_placing(..., rerank_top=N)`` hands the image's N best lines to the retriever's cross-encoder, whose
    order decides their values (the line it puts first gets the top value: half the relevance's span); by default
    (``allocate``'s placing) no reranker runs and the retriever's best line keeps the top value."""
    from arr_coc.contexts.allocate import image_placing
    from arr_coc.contexts.pagetext import legible_lines
    from arr_coc.contexts.ranking import retrieval_map
    from arr_coc.engine.channels.text import text_lines
    from arr_coc.engine.retrieval import HashingRetriever

    calls = []

    class BreadFirst(HashingRetriever):  # a reranker that reads the Bread line's passage (it and its neighbours) first
        def rerank(self, query, passages):
            calls.append(list(passages))
            return torch.tensor([1.0 if p.endswith("Bread 2.10 Milk 1.40") else 0.0 for p in passages])

    arr = ARR(ARRConfig(texture=TextureConfig(channels=MVP_CHANNELS + ("text_match", "key_value"))),
              query_encoder=HashingQueryEncoder(), retriever=BreadFirst()).eval()
    page, q = _printed(28), "What is the TOTAL?"
    scene = arr.see(page)
    lines = legible_lines(text_lines(arr, scene)[0])
    rel = allocate(arr, page, q, "11%", image_retrieval_weight=0.0).pages[0].placing[None]
    span = float(rel.max() - rel.min())
    on = {w: retrieval_map([ln for ln in lines if w in ln[0]], torch.ones(1), (784, 560), 28) > 0
          for w in ("TOTAL", "Bread")}
    plain = image_placing(arr, scene, rel, q)[0] - rel[0]
    assert calls == [] and torch.equal(allocate(arr, page, q, "11%").pages[0].placing - rel[0], plain)
    reranked = image_placing(arr, scene, rel, q, rerank_top=4)[0] - rel[0]
    # its 4 best passages: the two that share the question's word, then the first lines (ties to the earlier line)
    assert calls == [["Salt 0.90 TOTAL 14.45", "Jam 4.10 Salt 0.90 TOTAL 14.45", "CORNER SHOP Bread 2.10",
                      "CORNER SHOP Bread 2.10 Milk 1.40"]]
    for added, top, other in ((plain, "TOTAL", "Bread"), (reranked, "Bread", "TOTAL")):
        assert torch.allclose(added[on[top]], torch.full((int(on[top].sum()),), 0.5 * span), rtol=1e-5, atol=1e-6)
        assert float(added[on[other]].max()) < 0.5 * span - 1e-4


def test_a_chunk_of_text_and_image_pages_scores_the_images_and_inks_the_text():
    """A chunk mixing text-layer pages and an image page is scored as a whole (the image page's relevance is the
    ARR's, as under layer_relevance='arr'), its text-layer pages take their ink (control: the ARR's route differs)."""
    from dataclasses import replace

    from arr_coc.contexts.ranking import ink_map, unit
    from arr_coc.documents.page import Context

    ctx, q = render_text(_story(3, 1), SMALL), "When does the zanzibar harbour open?"
    mixed = Context([ctx.pages[0], replace(ctx.pages[1], words=[], lines=[]), ctx.pages[3]], ctx.source)
    off = dict(text_weight=0.0, page_weight=0.0, near_weight=0.0, retrieval_weight=0.0)
    arr = _arr(MVP_CHANNELS + ("text_match",))
    ink, scored = (allocate(arr, mixed, q, 60, layer_relevance=lr, **off) for lr in ("ink", "arr"))
    assert [p.text_from for p in ink.pages] == ["text layer", "ocr", "text layer"] and ink.tokens == 60
    assert [p.weights is None for p in ink.pages] == [True, False, True]
    assert all(p.weights is not None for p in scored.pages)
    assert torch.equal(ink.pages[1].relevance, scored.pages[1].relevance)  # the same chunk, scored the same way
    for i in (0, 2):
        page = ink.pages[i]
        want = unit(ink_map(page.words, tuple(page.image.shape[-2:]), page.cell))
        assert torch.equal(page.relevance, want) and not torch.allclose(scored.pages[i].relevance, want, atol=1e-3)
