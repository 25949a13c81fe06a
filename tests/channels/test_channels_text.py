"""The text channels on rendered pages whose answers are known: text_match finds the line, key_value its value."""
from __future__ import annotations

import sys
from pathlib import Path

import matplotlib
import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw, ImageFont
from tolerances import assert_close_reduction

import arr_coc.engine.channels.text as text  # registers text_match and key_value
from arr_coc import ARR, ARRConfig, SamplerConfig
from arr_coc.config import TextureConfig
from arr_coc.engine import imageops
from arr_coc.engine.cache import ImageCache
from arr_coc.engine.channel_registry import TextureInputs
from arr_coc.engine.channels.text import TextLines, detect_lines, paint_boxes, sharpen, value_regions
from arr_coc.engine.query import HashingQueryEncoder, MiniLMQueryEncoder
from arr_coc.engine.texture import MVP_CHANNELS, compute_texture

FONT = Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf"
CHANNELS = ("text_match", "key_value")
# (y, x) px of each line's top-left corner on a 560 x 784 px page (20 x 28 cells of 28 px)
RECEIPT = [
    ((40, 170), "CORNER SHOP"),
    ((110, 40), "Date: 21/11/2026"),
    ((230, 40), "Milk 2L      1.20"),
    ((290, 40), "Bread        2.10"),
    ((350, 40), "Coffee beans 7.49"),
    ((560, 300), "TOTAL 42.00"),
    ((690, 120), "Thank you for shopping"),
]
FORM = [
    ((60, 40), "APPLICATION FORM"),
    ((160, 40), "Name:"),
    ((160, 260), "John Smith"),
    ((300, 40), "Address:"),
    ((300, 260), "12 High Street"),
    ((440, 40), "Phone:"),
    ((440, 260), "555 0199"),
]


def render(lines: list[tuple[tuple[int, int], str]], size=(784, 560)) -> tuple[torch.Tensor, dict[str, tuple]]:
    """White page with black ~20 px text -> ([3, H, W] in [0, 1], text -> its ink box (y0, x0, y1, x1) px)."""
    page = Image.new("RGB", (size[1], size[0]), "white")
    draw, font = ImageDraw.Draw(page), ImageFont.truetype(str(FONT), 20)
    boxes = {}
    for (y, x), s in lines:
        draw.text((x, y), s, fill="black", font=font)
        x0, y0, x1, y1 = draw.textbbox((x, y), s, font=font)
        boxes[s] = (y0, x0, y1, x1)
    return torch.from_numpy(np.asarray(page).copy()).permute(2, 0, 1).float() / 255, boxes


def peak(m: torch.Tensor) -> tuple[int, int]:
    """(y, x) px of the map's maximum."""
    i = int(m.flatten().argmax())
    return i // m.shape[-1], i % m.shape[-1]


def inside(point: tuple[int, int], box: tuple, margin: float = 6.0) -> bool:
    """Whether a pixel lies in a box grown by ``margin`` px (OCR boxes are a few px looser than the ink)."""
    y, x = point
    return box[0] - margin <= y <= box[2] + margin and box[1] - margin <= x <= box[3] + margin


@pytest.fixture(scope="module")
def encoder() -> MiniLMQueryEncoder:
    return MiniLMQueryEncoder().load()


@pytest.fixture(scope="module")
def receipt_page():
    return render(RECEIPT)


@pytest.fixture(scope="module")
def receipt_maps(receipt_page, encoder):
    """Both channels for two questions about one receipt, through one cache (OCR runs once)."""
    pixels, _ = receipt_page
    cache = ImageCache()
    questions = ["What is the total?", "What is the date?"]
    tex = compute_texture(torch.stack([pixels, pixels]), CHANNELS, queries=questions, query_encoder=encoder,
                          cache=cache)
    return dict(zip(questions, tex)), cache


def test_text_match_peaks_on_the_total_line_for_the_total_question(receipt_page, receipt_maps):
    maps, _ = receipt_maps
    box = receipt_page[1]["TOTAL 42.00"]
    tm = maps["What is the total?"][0]
    assert inside(peak(tm), box)
    assert float(tm.max()) == 1.0


def test_text_match_peaks_on_the_date_line_for_the_date_question(receipt_page, receipt_maps):
    maps, _ = receipt_maps
    tm = maps["What is the date?"][0]
    assert inside(peak(tm), receipt_page[1]["Date: 21/11/2026"])
    # the total line matches the date question less than the date line does
    y0, x0, y1, x1 = receipt_page[1]["TOTAL 42.00"]
    assert float(tm[y0:y1, x0:x1].max()) < 0.9


def test_maps_have_the_page_shape_and_lie_in_zero_one(receipt_page, receipt_maps):
    maps, _ = receipt_maps
    h, w = receipt_page[0].shape[-2:]
    for m in maps.values():
        assert tuple(m.shape) == (2, h, w)
        assert float(m.min()) >= 0.0 and float(m.max()) <= 1.0
        assert float(m[0].max()) == 1.0  # both questions find their line (text_match)


def test_two_questions_on_one_image_read_it_once(receipt_page, receipt_maps, encoder, monkeypatch):
    _, cache = receipt_maps  # two images with the same pixels, two questions, two channels: one OCR run
    assert (cache.misses, cache.hits) == (1, 3)
    calls = []
    real = text.detect_lines
    monkeypatch.setattr(text, "detect_lines", lambda *a, **k: calls.append(1) or real(*a, **k))
    pixels = receipt_page[0][None]
    compute_texture(pixels, CHANNELS, queries=["How much is the milk?"], query_encoder=encoder, cache=cache)
    first = text._lines(TextureInputs(pixels, queries=["total?"], query_encoder=encoder, cache=cache), "text_match")
    second = text._lines(TextureInputs(pixels, queries=["date?"], query_encoder=encoder, cache=cache), "key_value")
    assert calls == [] and first[0][0] is second[0][0]


def test_detected_lines_cover_the_rendered_lines(receipt_page, receipt_maps, encoder):
    pixels, boxes = receipt_page
    lines = text._lines(TextureInputs(pixels[None], queries=["?"], query_encoder=encoder, cache=receipt_maps[1]),
                        "text_match")[0][0]
    assert isinstance(lines, TextLines)
    assert lines.boxes_px.shape == (len(lines), 4) and lines.emb.shape == (len(lines), encoder.dim)
    legible = lines.emb[lines.legible]  # normalised embeddings: the norm, the division, the norm again
    assert_close_reduction(legible.norm(dim=-1), torch.ones(len(legible)), reduction_len=legible.shape[1], depth=3)
    # "Date: 21/11/2026" is stored as its key and its value, side by side on the row
    assert "Date:" in lines.texts and "21/11/2026" in lines.texts
    assert any("TOTAL" in t for t in lines.texts)
    for ink in (boxes["TOTAL 42.00"], boxes["Date: 21/11/2026"]):
        centre = ((ink[0] + ink[2]) / 2, (ink[1] + ink[3]) / 2)
        assert any(inside(centre, b.tolist(), 0.0) for b in lines.boxes_px)


def test_key_value_peaks_on_the_value_right_of_the_key_not_on_the_key(encoder):
    pixels, boxes = render(FORM)
    kv = compute_texture(pixels[None], ("key_value",), queries=["What is the name?"], query_encoder=encoder)[0, 0]
    assert inside(peak(kv), boxes["John Smith"])
    y0, x0, y1, x1 = boxes["Name:"]
    assert float(kv[y0:y1, x0:x1].max()) <= 0.5 * float(kv.max())


def test_blank_page_gives_zero_maps():
    tex = compute_texture(torch.ones(1, 3, 112, 84), CHANNELS, queries=["What is the total?"],
                          query_encoder=HashingQueryEncoder())
    assert tex.shape == (1, 2, 112, 84) and float(tex.abs().sum()) == 0.0


def test_missing_rapidocr_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "rapidocr", None)
    with pytest.raises(ImportError, match="pip install rapidocr onnxruntime"):
        detect_lines(torch.rand(3, 28, 28), HashingQueryEncoder())


def test_channels_need_a_question_and_an_encoder():
    with pytest.raises(ValueError, match="queries= and query_encoder="):
        compute_texture(torch.rand(1, 3, 28, 28), ("text_match",))


def test_paint_boxes_takes_the_max_and_matches_a_per_box_loop():
    gen = torch.Generator().manual_seed(0)
    tl = torch.randint(0, 40, (30, 2), generator=gen).float()
    boxes = torch.cat([tl, tl + torch.randint(1, 20, (30, 2), generator=gen)], 1)[:, [0, 1, 2, 3]]
    values = torch.rand(30, generator=gen)
    expected = torch.zeros(50, 60)
    for (y0, x0, y1, x1), v in zip(boxes.long().tolist(), values):
        expected[y0:y1, x0:x1] = expected[y0:y1, x0:x1].clamp_min(v)
    assert torch.equal(paint_boxes(boxes, values, (50, 60)), expected)


def test_paint_boxes_on_blocks_keeps_each_box_where_it_is(monkeypatch):
    monkeypatch.setattr(imageops, "MAX_PAINT_ELEMENTS", 100)  # forces blocks of several px
    m = paint_boxes(torch.tensor([[8.0, 8.0, 16.0, 24.0]]), torch.ones(1), (40, 40))
    assert m.shape == (40, 40) and float(m.max()) == 1.0
    assert float(m[:4].sum()) == 0.0 and float(m[:, 32:].sum()) == 0.0 and float(m[10:14, 10:22].min()) > 0


def test_value_regions_prefer_the_row_and_skip_the_key_itself():
    boxes = torch.tensor([[0.0, 0.0, 10.0, 30.0],  # key
                          [0.0, 60.0, 10.0, 100.0],  # its value on the row
                          [14.0, 0.0, 24.0, 40.0]])  # the line below
    regions, values = value_regions(boxes, torch.tensor([1.0, 0.0, 0.0]))
    m = paint_boxes(regions, values, (30, 110))
    assert float(m[:10, 60:100].min()) == 1.0  # the value, lifted whole
    assert float(m[:10, :30].max()) == 0.0  # the key itself
    assert 0 < float(m[14:24, :40].max()) < 1.0  # below: second choice


def test_sharpen_keeps_weak_matches_off_the_page():
    w = sharpen(torch.tensor([0.2, 0.25, 0.2, 0.8]), torch.ones(4, dtype=torch.bool))
    assert w.tolist()[3] == 1.0 and max(w.tolist()[:3]) < 0.1
    assert sharpen(torch.zeros(0), torch.zeros(0, dtype=torch.bool)).shape == (0,)


def test_pipeline_puts_the_first_saccade_on_the_total_line(receipt_page, receipt_maps, encoder):
    pixels, boxes = receipt_page
    config = ARRConfig(texture=TextureConfig(channels=MVP_CHANNELS + CHANNELS),
                       sampler=SamplerConfig(name="topk", saccades=4))
    arr = ARR(config, query_encoder=encoder)
    arr.cache = receipt_maps[1]  # the page's lines were read above; the canvas keeps its 560 x 784 px
    out = arr(pixels, "What is the total?")
    assert out.canvas.sizes[0] == tuple(pixels.shape[-2:]) and arr.cache.misses == 1
    cell = out.canvas.cell
    sy = out.canvas.sizes[0][0] / out.canvas.image_sizes[0][0]
    y0, _, y1, _ = boxes["TOTAL 42.00"]
    top_row = int(out.positions[0, 0, 0])
    assert top_row * cell < y1 * sy and (top_row + 1) * cell > y0 * sy  # the top cell's row meets the total line


def test_the_torch_ocr_option_reads_the_same_lines_and_the_cpu_default_stays_onnx_runtime(receipt_page, encoder,
                                                                                           monkeypatch):
    pixels, _ = receipt_page
    asked = []
    real = text.rapidocr_engine
    monkeypatch.setattr(text, "rapidocr_engine", lambda *a, **k: asked.append(k["backend"]) or real(*a, **k))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the torch OCR's many small operators on a shared 2-core machine (test_ocr_torch.py)
    try:
        maps = {ocr: compute_texture(pixels[None], CHANNELS, queries=["What is the total?"], query_encoder=encoder,
                                     cache=ImageCache(), options={c: {"ocr": ocr} for c in CHANNELS})
                for ocr in ("auto", "torch")}
    finally:
        torch.set_num_threads(threads)
    assert asked == ["onnxruntime", "torch"]  # auto on a CPU image: ONNX Runtime, as before the option
    assert torch.equal(maps["auto"], maps["torch"])  # the same texts and boxes, so the same maps
    assert float(maps["torch"].amax()) > 0.5  # the question found its line (not two empty maps)
    assert text.ocr_backend("auto", torch.device("cuda")) == {"backend": "torch", "device": "cuda"}
    with pytest.raises(ValueError, match="ocr option must be one of auto, onnxruntime, torch, got 'tesseract'"):
        text.detect_lines(pixels, encoder, ocr="tesseract")


def test_lines_of_encoders_that_differ_in_batch_size_are_never_shared():
    """A text's vector moves in its last bits with the batch it runs in: an encoder with another ``batch_size``
    embeds the page's lines itself instead of reading the first encoder's (control: the same batch size reads them)."""
    image, cache = torch.zeros(3, 28, 56), ImageCache()
    boxes, texts = torch.tensor([[2.0, 2.0, 20.0, 50.0]]), ["Total: 12.50"]
    made = []

    def lines(encoder):
        return text.image_lines(cache, image, encoder, known=lambda: made.append(encoder.batch_size)
                                or text.lines_from_text(boxes, texts, encoder))

    first = lines(MiniLMQueryEncoder())
    assert lines(MiniLMQueryEncoder()) is first and made == [256]  # the control: read from the cache
    other = lines(MiniLMQueryEncoder(batch_size=16))
    assert other is not first and made == [256, 16] and len(cache) == 2
    torch.testing.assert_close(other.emb, first.emb, rtol=0, atol=1e-5)  # the same model, to its last bits
