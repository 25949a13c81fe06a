"""The text channels score a single image's OCR lines with the cross-encoder: paraphrases find their answer line."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from test_channels_text import inside, peak, render

import arr_coc.engine.channels.text as text
from arr_coc import ARR, ARRConfig, SamplerConfig
from arr_coc.config import TextureConfig
from arr_coc.engine.cache import ImageCache
from arr_coc.engine.channel_registry import PageText, TextureInputs
from arr_coc.engine.channels.text import reranks
from arr_coc.engine.query import HashingQueryEncoder, MiniLMQueryEncoder
from arr_coc.engine.retrieval import CrossEncoderReranker
from arr_coc.engine.texture import MVP_CHANNELS, compute_texture

# "How much was the bill?" shares "bill" with the till line, not with the total: MiniLM's cosine ranks the till
# line first (0.52 against 0.44), the cross-encoder the total (logit -2.6 against -6.1).
BILL = [
    ((40, 170), "CORNER SHOP"),
    ((110, 40), "21/11/2026 10:42"),
    ((230, 40), "Milk 2L 1.20"),
    ((290, 40), "Bread 2.10"),
    ((420, 40), "TOTAL 42.00"),
    ((560, 40), "Bill printed by till 3"),
    ((690, 120), "Thank you for shopping"),
]
QUESTION = "How much was the bill?"


@pytest.fixture(scope="module")
def encoder() -> MiniLMQueryEncoder:
    return MiniLMQueryEncoder().load()


@pytest.fixture(scope="module")
def bill_page():
    return render(BILL)


def text_match(pixels, encoder, cache, **options) -> torch.Tensor:
    opts = {"text_match": options} if options else None
    return compute_texture(pixels[None], ("text_match",), queries=[QUESTION], query_encoder=encoder, cache=cache,
                           options=opts)[0, 0]


def box_max(m: torch.Tensor, box: tuple) -> float:
    y0, x0, y1, x1 = box
    return float(m[y0:y1, x0:x1].max())


def test_reranked_text_match_puts_the_paraphrased_answer_line_above_a_word_sharing_distractor(bill_page, encoder):
    pixels, boxes = bill_page
    cache = ImageCache()  # one OCR run for both maps
    reranked = text_match(pixels, encoder, cache, rerank=True)
    cosine = text_match(pixels, encoder, cache)  # the control and the default: the same lines, MiniLM's cosine
    total, till = boxes["TOTAL 42.00"], boxes["Bill printed by till 3"]
    assert inside(peak(reranked), total)
    assert box_max(reranked, total) == 1.0 and box_max(reranked, till) < 0.9
    assert inside(peak(cosine), till)
    assert box_max(cosine, till) == 1.0 and box_max(cosine, total) < 1.0


def test_rerank_is_off_by_default_and_on_where_a_channel_asks_for_it(encoder):
    pixels = torch.ones(2, 3, 28, 28)
    known = [None, PageText(lines=[("TOTAL 42.00", (0.0, 0.0, 10.0, 28.0))])]
    minilm = TextureInputs(pixels, queries=["q", "q"], query_encoder=encoder, text=known)
    hashing = TextureInputs(pixels, queries=["q", "q"], query_encoder=HashingQueryEncoder(), text=known)
    forced = TextureInputs(pixels, queries=["q", "q"], query_encoder=HashingQueryEncoder(), text=known,
                           options={"key_value": {"rerank": True}})
    assert [reranks(minilm, "text_match", i) for i in (0, 1)] == [False, False]
    assert [reranks(hashing, "text_match", i) for i in (0, 1)] == [False, False]
    assert [reranks(forced, "key_value", i) for i in (0, 1)] == [True, True]
    assert [reranks(forced, "text_match", i) for i in (0, 1)] == [False, False]


def test_a_hashing_arr_stays_model_free(monkeypatch):
    def no_model():
        raise AssertionError("a hashing ARR loaded the cross-encoder")

    monkeypatch.setattr(text, "cross_encoder", no_model)
    lines = [("TOTAL 42.00", (0.0, 0.0, 20.0, 60.0)), ("Milk 1.20", (30.0, 0.0, 50.0, 60.0))]
    tex = compute_texture(torch.ones(1, 3, 56, 84), ("text_match", "key_value"), queries=["What is the total?"],
                          query_encoder=HashingQueryEncoder(), text=[PageText(lines=lines)])
    assert float(tex[0, 0, :20, :60].min()) == 1.0  # the line sharing "total" matched, without any model


class CountingModel:
    """The cross-encoder's graph in :class:`CrossEncoderReranker`'s place: a pair's logit is its line's length;
    counts the pairs it was run on."""

    def __init__(self) -> None:
        self.pairs = 0

    def run(self, pairs):
        self.pairs += len(pairs)
        return [np.array([float(len(p))], np.float32) for _, p in pairs]


def test_both_channels_of_one_question_read_each_pair_once(monkeypatch):
    counting, shared = CountingModel(), CrossEncoderReranker()
    shared._model = counting
    monkeypatch.setattr(text, "cross_encoder", lambda: shared)
    lines = [("TOTAL 42.00", (0.0, 0.0, 20.0, 60.0)), ("Milk 1.20", (30.0, 0.0, 50.0, 60.0)), ("", (60.0, 0, 70.0, 9))]
    opts = {"text_match": {"rerank": True}, "key_value": {"rerank": True}}
    tex = compute_texture(torch.ones(1, 3, 84, 84), ("text_match", "key_value"), queries=["What is the total?"],
                          query_encoder=HashingQueryEncoder(), text=[PageText(lines=lines)], options=opts)
    assert counting.pairs == 2  # two legible lines, read once for both channels; the empty line is not read
    # logits 11 and 9 scaled over the page's legible lines: the longest line 1, the other 0
    assert float(tex[0, 0, :20, :60].min()) == 1.0 and float(tex[0, 0, 30:50, :60].max()) == 0.0
    assert shared.rerank("What is the total?", ["Milk 1.20"]).tolist() == [9.0]
    assert counting.pairs == 2  # from the cache


def test_reranked_pipeline_keeps_the_exact_budget_and_puts_the_first_saccade_on_the_total(bill_page, encoder):
    pixels, boxes = bill_page
    config = ARRConfig(texture=TextureConfig(channels=MVP_CHANNELS + ("text_match", "key_value"),
                                             options={c: {"rerank": True} for c in ("text_match", "key_value")}),
                       sampler=SamplerConfig(name="topk", saccades=7))
    out = ARR(config, query_encoder=encoder)(pixels, QUESTION)
    pos = out.positions[0]  # [7, 2] (y, x) cells
    assert pos.shape == (7, 2) and len({tuple(p) for p in pos.tolist()}) == 7
    cell = out.canvas.cell
    sy = out.canvas.sizes[0][0] / out.canvas.image_sizes[0][0]
    y0, _, y1, _ = boxes["TOTAL 42.00"]
    top_row = int(pos[0, 0])
    assert top_row * cell < y1 * sy and (top_row + 1) * cell > y0 * sy  # the top cell's row meets the total line
