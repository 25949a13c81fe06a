"""The microscope's engine without a browser: uploads, settings, caching, views and downloads."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw
from tolerances import ARR_MAP, assert_close_reduction

from arr_coc.app import panels as views
from arr_coc.app.service import PRESETS, Microscope, Settings, check_question, methods, read_upload, render
from arr_coc.budget import Budget
from arr_coc.config import ARRConfig, CanvasConfig, SamplerConfig, ScorerConfig, TextureConfig
from arr_coc.contexts import allocate
from arr_coc.engine.imageops import to_hwc_uint8
from arr_coc.engine.pipeline import ARR
from arr_coc.engine.query import HashingQueryEncoder
from arr_coc.engine.texture import MVP_CHANNELS

CHANNELS = MVP_CHANNELS + ("text_match",)  # the MVP plus one OCR channel, so the question matters


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> str:
    """A 448 x 336 px page (16 x 12 cells) with two printed lines."""
    from arr_coc.app.panels import font

    img = Image.new("RGB", (448, 336), "white")
    d = ImageDraw.Draw(img)
    d.text((20, 40), "INVOICE DATE 12 MAY 2026", fill="black", font=font(22))
    d.text((20, 250), "TOTAL DUE 48.50", fill="black", font=font(22))
    path = tmp_path_factory.mktemp("app") / "page.png"
    img.save(path)
    return str(path)


@pytest.fixture(scope="module")
def scope() -> Microscope:
    return Microscope(query_encoder=HashingQueryEncoder())


def test_read_upload_refuses_a_file_that_is_not_an_image(tmp_path):
    bad = tmp_path / "notes.png"
    bad.write_text("these are not pixels")
    with pytest.raises(ValueError, match="not an image PIL can read"):
        read_upload(bad)


def test_read_upload_refuses_a_decompression_bomb_from_its_header_alone(tmp_path):
    bomb = tmp_path / "bomb.png"
    Image.new("1", (9000, 6000)).save(bomb)  # 54 MP that packs into a few kB
    assert bomb.stat().st_size < 50_000
    with pytest.raises(ValueError, match=r"9000x6000 px = 54 megapixels; send an image of at most 40 MP"):
        read_upload(bomb)
    # the same file under a larger cap, decoded at 1/4 (no less than its 1463 x 2195 px largest canvas)
    assert read_upload(bomb, max_pixels=60_000_000).shape == (3, 1500, 2250)


@pytest.mark.parametrize("q, message", [("", "the question is empty"), ("   ", "the question is empty"),
                                        ("x " * 129, "129 words and punctuation marks; keep it to 128")])
def test_check_question_refuses_empty_and_overlong_questions(q, message):
    with pytest.raises(ValueError, match=message):
        check_question(q)


def test_a_second_question_reuses_the_texture_and_ocr_and_equals_the_plain_pipeline(scope, page):
    image = read_upload(page)
    settings = Settings(saccades=40, channels=CHANNELS, weights="none")
    first = scope.run(image, "What is the invoice date?", settings)
    hits = scope.channel_cache.hits
    second = scope.run(image, "What is the total due?", settings)
    assert (first.scene_cached, second.scene_cached) == (False, True)
    assert scope.channel_cache.hits > hits  # the OCR lines came from the cache
    assert "texture" in first.timings_ms and second.timings_ms["texture"] == 0.0
    arr = ARR(ARRConfig(texture=TextureConfig(channels=CHANNELS), scorer=ScorerConfig(weights="none"),
                        sampler=SamplerConfig(saccades=40)), query_encoder=HashingQueryEncoder())
    for result, q in ((first, "What is the invoice date?"), (second, "What is the total due?")):
        plain, sent = arr(image, q), allocate(arr, image, q, Budget.saccades(40)).pages[0]
        # the saccades look and ask send (two lines: their retrieval leaves the ARR's own top 40), its own relevance
        assert torch.equal(result.sent, sent.plan.cells) and torch.equal(result.sent, plain.positions[0])
        assert_close_reduction(result.allocation.relevance.map, plain.relevance.map, **ARR_MAP)
    assert not torch.equal(first.sent, second.sent)  # negative control: the question moved the saccades
    assert second.tokens_sent == 36 + 40  # 40 saccades come with a 6x6 gestalt (arr_coc.budget)


def test_the_saccades_go_where_look_and_ask_send_them_on_a_page_of_lines(scope):
    """Eight printed lines: the image's own lines' retrieval moves the saccades off the ARR's own top K; the page
    shows (and its JSON lists) the cells `look` and `ask` send, ``allocate``'s."""
    from arr_coc.app.panels import font

    img = Image.new("RGB", (448, 336), "white")
    d = ImageDraw.Draw(img)
    for i, line in enumerate(["CORNER SHOP", "Bread 2.10", "Milk 1.40", "Eggs 3.20", "Tea 2.75", "Jam 4.10",
                              "Salt 0.90", "TOTAL 14.45"]):
        d.text((20 + (i % 2) * 200, 20 + i * 38), line, fill="black", font=font(22))
    image = torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1).float() / 255
    q = "How much is the milk?"
    result = scope.run(image, q, Settings(saccades=40, channels=CHANNELS, weights="none"))
    arr = ARR(ARRConfig(texture=TextureConfig(channels=CHANNELS), scorer=ScorerConfig(weights="none"),
                        sampler=SamplerConfig(saccades=40)), query_encoder=HashingQueryEncoder())
    sent = allocate(arr, image, q, Budget.saccades(40)).pages[0].plan.cells
    assert torch.equal(result.sent, sent) and result.to_json()["positions"] == sent.tolist()
    assert not torch.equal(result.sent, arr(image, q).positions[0])  # control: the relevance alone places elsewhere


def test_sliders_scale_the_parts_and_presets_name_real_settings(scope, page):
    image = read_upload(page)
    base = scope.run(image, "What is the total due?", Settings(saccades=40, channels=CHANNELS))
    only = scope.run(image, "What is the total due?", Settings(saccades=40, channels=CHANNELS,
                                                               part_scale=PRESETS["only participatory"]["part_scale"]))
    rel, w = base.allocation.relevance, base.allocation.relevance.weights
    assert_close_reduction(only.allocation.relevance.map, rel.parts[:, 2] * w[:, 2, None, None], reduction_len=3,
                           depth=2)  # the mix of 3 parts, two scaled to 0
    assert not torch.equal(only.sent, base.sent)
    assert all(p.get("sampler", SamplerConfig.name) in methods() for p in PRESETS.values())


def test_json_download_keeps_the_look_json_schema_and_the_png_is_written(scope, page, tmp_path):
    result = scope.run(read_upload(page), "What is the total due?", Settings(saccades=40, channels=MVP_CHANNELS))
    v = render(result, tmp_path)
    d = json.loads(v.json_path.read_text())
    look_keys = set(result.allocation.to_json(0))
    assert look_keys <= set(d) and {"method", "part_scale", "scorer_weights"} <= set(d)
    assert d["tokens"] == {"gestalt": 36, "saccades": 40, "sent": 76, "full_resolution": 192}
    assert d["positions"] == result.sent.tolist() and len(d["positions"]) == 40
    png = Image.open(v.png_path)
    assert png.format == "PNG" and png.height > 336
    assert v.saccades.size == (448, 336)  # a small canvas is drawn 1:1
    assert "**tokens sent 76**" in v.summary and "| **total** |" in v.timings


def test_saccade_view_keeps_chosen_cells_and_dims_the_rest(page):
    rgb = to_hwc_uint8(read_upload(page))
    cells = torch.tensor([[0, 0], [5, 7]])
    out = np.asarray(views.saccade_view(rgb, cells, 28, numbered=0)).astype(int)
    inner = (slice(3, 25), slice(3, 25))  # inside the outline
    assert np.array_equal(out[5 * 28:6 * 28, 7 * 28:8 * 28][inner], rgb[5 * 28:6 * 28, 7 * 28:8 * 28][inner])
    np.testing.assert_allclose(out[28:56, :28], (rgb[28:56, :28] * views.DIM).astype(int), atol=1)


def test_patch_allocators_send_squares_and_say_so_in_the_json(scope, page, tmp_path):
    result = scope.run(read_upload(page), "What is the total due?",
                       Settings(saccades=40, method="patches", channels=MVP_CHANNELS))
    assert result.sent.shape[1] == 3 and 0 < len(result.sent) <= 40
    d = render(result, tmp_path).json_path.read_text()
    assert json.loads(d)["boxes"] == result.sent.tolist()


@pytest.mark.parametrize("settings, message", [
    (Settings(saccades=300, channels=MVP_CHANNELS), "budget K=300 exceeds the 192 valid cells"),
    (Settings(method="nope", channels=MVP_CHANNELS), "unknown sampler or allocator 'nope'"),
])
def test_bad_settings_raise_a_readable_error(scope, page, settings, message):
    with pytest.raises(ValueError, match=message):
        scope.run(read_upload(page), "What is the total due?", settings)


def test_display_factor_keeps_cells_whole_pixels():
    for cell in (28, 32):
        for side in (cell * 10, cell * 40, cell * 64):
            f = views.display_factor((side, side // 2), cell)
            assert cell % f == 0 and (side / f <= views.MAX_SIDE or f == cell)
    assert CanvasConfig().cell % views.display_factor((1484, 980), 28) == 0


def test_with_a_vlm_the_answer_comes_from_the_same_allocation_settings(page, tmp_path):
    from arr_coc.vlm import load_vlm

    vlm = load_vlm("tiny:qwen2_5_vl")
    scope = Microscope(query_encoder=HashingQueryEncoder(), vlm=vlm, max_new_tokens=3)
    result = scope.run(read_upload(page), "What is the total due?",
                       Settings(saccades=40, channels=MVP_CHANNELS, cell=32))
    assert result.settings.cell == vlm.cell == result.allocation.canvas.cell  # the model's cell wins
    assert isinstance(result.answer, str) and "answer" in result.timings_ms
    d = json.loads(render(result, tmp_path).json_path.read_text())
    assert d["answer"] == result.answer and d["cell"] == vlm.cell


def test_with_a_vlm_a_patch_method_is_answered_by_its_registry_name(page):
    from arr_coc.vlm import load_vlm
    from arr_coc.vlm.allocation import allocators

    assert "patches" in allocators() and "saliency" not in allocators()  # one vocabulary: the registry's
    scope = Microscope(query_encoder=HashingQueryEncoder(), vlm=load_vlm("tiny:qwen2_5_vl"), max_new_tokens=2)
    result = scope.run(read_upload(page), "What is the total due?",
                       Settings(saccades=40, method="patches", channels=MVP_CHANNELS))
    assert result.sent.shape[1] == 3 and isinstance(result.answer, str) and "answer" in result.timings_ms


def test_a_checkpoint_that_is_not_a_torch_file_is_a_readable_error(scope, page, tmp_path):
    garbage = tmp_path / "scorer.pt"
    garbage.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match=r"scorer.pt is not a file torch.save wrote \(it begins b'not '\); expected "
                                         "scorer weights"):
        scope.run(read_upload(page), "What is the total due?",
                  Settings(channels=MVP_CHANNELS, weights=str(garbage)))
