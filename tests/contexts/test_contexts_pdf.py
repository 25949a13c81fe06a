"""A PDF as a context: its text layer feeds the text channels, so no page is read by OCR."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import key_pdf

from arr_coc import ARR, ARRConfig
from arr_coc.config import MVP_CHANNELS, TextureConfig
from arr_coc.contexts import allocate, load_context
from arr_coc.contexts.ranking import ink_map, unit
from arr_coc.engine.channels.text import lines_entry
from arr_coc.engine.query import HashingQueryEncoder


@pytest.fixture(scope="module")
def fifty(tmp_path_factory) -> Path:
    return key_pdf(tmp_path_factory.mktemp("ctx") / "fifty.pdf", 50)


def _arr() -> ARR:
    channels = MVP_CHANNELS + ("text_match", "key_value")
    return ARR(ARRConfig(texture=TextureConfig(channels=channels)), query_encoder=HashingQueryEncoder()).eval()


def test_fifty_page_pdf_runs_no_ocr_and_finds_the_page(fifty):
    calls: list[int] = []

    def ocr(image: torch.Tensor):
        calls.append(1)
        return []

    arr = _arr()
    out = allocate(arr, fifty, "Where is the brass key?", 200, dpi=60, ocr=ocr, layer_relevance="arr")
    assert calls == [] and len(out.pages) == 50 and out.tokens == 200
    assert {p.text_from for p in out.pages} == {"text layer"}
    # the text channels read the text layer from the cache (an OCR run would have stored its own lines)
    entry = lines_entry(arr.query_encoder)
    lines = arr.cache.get(entry, out.pages[37].image, lambda: pytest.fail("page 37's lines were not seeded"))
    assert lines.texts == ("chapter 37 notes", "the brass key is under the mat")
    best = max(range(50), key=lambda i: float(out.pages[i].relevance.max()))  # the ranking's best cell
    assert best == 37 and out.pages[37].saccades == out.pages[37].plan.full_tokens  # the whole page is read
    assert out.text_tokens > 0 and out.compression == pytest.approx(out.text_tokens / 200)


def test_text_layer_pages_are_ranked_on_their_ink(fifty):
    """By default a text-layer page's relevance is its words' ink: no texture, no text channel, no scorer runs;
    the ranking finds the page by its words as with the ARR's relevance (control: that route seeds the lines)."""
    arr = _arr()
    out = allocate(arr, fifty, "Where is the brass key?", 200, dpi=60)
    assert out.tokens == 200 and {p.text_from for p in out.pages} == {"text layer"}
    assert arr.cache.get(lines_entry(arr.query_encoder), out.pages[37].image, lambda: "not computed") == "not computed"
    assert all(p.weights is None and "context_weights" not in p.to_json() for p in out.pages)
    best = max(range(50), key=lambda i: float(out.pages[i].relevance.max()))
    assert best == 37 and out.pages[37].saccades == out.pages[37].plan.full_tokens
    # the question's parts off: every page ranked and placed on its ink alone (control: the ARR's relevance is not it)
    off = dict(text_weight=0.0, page_weight=0.0, near_weight=0.0, retrieval_weight=0.0)
    plain, scored = (allocate(arr, fifty, "Where is the brass key?", 200, dpi=60, pages="1-8", layer_relevance=lr, **off)
                     for lr in ("ink", "arr"))
    for page, other in zip(plain.pages, scored.pages):
        ink = ink_map(page.words, tuple(page.image.shape[-2:]), page.cell)
        assert 0 < float(ink.max()) <= 1 and torch.equal(page.placing, unit(ink)) and torch.equal(page.relevance, unit(ink))
        assert not torch.allclose(other.relevance, unit(ink), atol=1e-3)
    with pytest.raises(ValueError, match="layer_relevance must be one of 'ink', 'arr'"):
        allocate(arr, fifty, "Where is the brass key?", 200, dpi=60, layer_relevance="pixels")


def test_the_same_pages_as_images_are_read_by_ocr(fifty):  # control: the counter does count
    calls: list[int] = []

    def ocr(image: torch.Tensor):
        calls.append(1)
        return [("the brass key", (10.0, 10.0, 30.0, 120.0))]

    images = [p.image for p in load_context(fifty, pages="1-6", dpi=60).pages]
    out = allocate(_arr(), images, "Where is the brass key?", 40, ocr=ocr)
    assert len(calls) == 6 and {p.text_from for p in out.pages} == {"ocr"}
    assert [w for w, _ in out.pages[0].words] == ["the", "brass", "key"]


def test_pdf_page_range_and_limit(fifty):
    out = allocate(_arr(), fifty, "Where is the brass key?", 40, pages="36-39", dpi=60)
    assert [p.index for p in out.pages] == [35, 36, 37, 38] and out.tokens == 40
    with pytest.raises(ValueError, match=r"has 50 pages; a context holds at most 20"):
        allocate(_arr(), fifty, "Where?", max_pages=20)


def test_seeing_text_layer_pages_draws_their_canvases_alone(fifty):
    """Under the default ink the see computes no texture and no channel work (the timings name no such stage), the
    canvases are those the textured see draws; a context seen so refuses the ARR's relevance in one line."""
    from arr_coc.contexts import see_context

    arr = _arr()
    ink, scored = (see_context(arr, fifty, pages="1-6", dpi=60, layer_relevance=lr) for lr in ("ink", "arr"))
    assert not {"texture", "coupling"} & set(ink.timings_ms) and {"texture", "coupling"} <= set(scored.timings_ms)
    for a, b in zip(ink.scenes, scored.scenes):
        assert a.cell_texture.shape[1] == 0 < b.cell_texture.shape[1] and a.cell_texture.shape[2:] == b.cell_texture.shape[2:]
        assert torch.equal(a.canvas.pixels, b.canvas.pixels) and torch.equal(a.canvas.valid, b.canvas.valid)
    q = "Where is the brass key?"
    assert [p.plan.cells.tolist() for p in allocate(arr, ink, q, 60).pages] == \
        [p.plan.cells.tolist() for p in allocate(arr, fifty, q, 60, pages="1-6", dpi=60).pages]
    assert allocate(arr, scored, q, 60, layer_relevance="arr").pages[0].weights is not None
    with pytest.raises(ValueError, match="seen with layer_relevance='ink'.*layer_relevance='arr'"):
        allocate(arr, ink, q, 60, layer_relevance="arr")
