"""Loading VLMs with from_pretrained, ask() end to end, and ``arr-coc ask``."""
from pathlib import Path

import pytest
import torch
from tolerances import VLM_EMBEDS, assert_close_reduction

from arr_coc.allocators.methods import METHODS
from arr_coc.allocators.patching import PATCHERS
from arr_coc.cli import main
from arr_coc.config import ARRConfig, CanvasConfig, TextureConfig
from arr_coc.engine.pipeline import ARR
from arr_coc.engine.query import HashingQueryEncoder
from arr_coc.engine.samplers import select
from arr_coc.engine.texture import MVP_CHANNELS
from arr_coc.registry import UnknownNameError
from arr_coc.vlm import ADAPTERS, Answer, ask, load_vlm
from arr_coc.vlm.allocation import allocators
from arr_coc.vlm.processing import all_cells
from arr_coc.vlm.tiny import tiny_image_processor, tiny_model, tiny_tokenizer


def save_tiny(folder, family: str) -> Path:
    """A tiny model, its tokenizer and image processor written to ``folder``, as ``from_pretrained`` reads them.

    The processor's parts are saved one by one: the full processor object also wants a video processor,
    which needs torchvision.
    """
    folder = Path(folder)
    tiny_model(family).save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    tiny_image_processor(family).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    return {f: save_tiny(tmp_path_factory.mktemp(f), f) for f in ("qwen2_5_vl", "qwen3_vl")}


@pytest.fixture(scope="module")
def tiny():
    return {f: load_vlm(f"tiny:{f}") for f in ("qwen2_5_vl", "llava")}


def small_image(adapter, hc=6, wc=8, seed=0):
    """A random [3, H, W] image of hc x wc of the adapter's cells (small enough for the canvas to keep)."""
    return torch.rand(3, hc * adapter.cell, wc * adapter.cell, generator=torch.Generator().manual_seed(seed))


def fast_arr(cell):
    return ARR(ARRConfig(canvas=CanvasConfig(cell=cell), texture=TextureConfig(channels=MVP_CHANNELS)),
               query_encoder=HashingQueryEncoder()).eval()


@pytest.mark.parametrize("family, mean", [("qwen2_5_vl", 0.48145466), ("qwen3_vl", 0.5)])
def test_load_vlm_from_a_saved_folder_rebuilds_the_same_model(saved, family, mean):
    adapter = load_vlm(str(saved[family]))
    assert isinstance(adapter, ADAPTERS.get(family))
    assert adapter.mean.flatten()[0].item() == pytest.approx(mean)  # read from preprocessor_config.json
    img = torch.rand(3, 3 * adapter.cell, 4 * adapter.cell, generator=torch.Generator().manual_seed(0))
    ref = tiny_model(family)
    inputs = adapter.native_inputs([img], ["Total?"])
    with torch.no_grad():
        assert torch.equal(adapter.model(**inputs).logits, ref(**inputs).logits)  # the same weights, the same forward
    pre, suf = adapter.prompt_ids("Total?")  # the saved chat template puts the image before the question
    assert adapter.tokenizer.decode(pre).endswith("<|vision_start|>")
    assert adapter.tokenizer.decode(suf).startswith("<|vision_end|>Total?<|im_end|>")


def test_load_vlm_errors_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match="cannot load a VLM config from"):
        load_vlm(str(tmp_path / "missing"))
    from transformers import CLIPVisionConfig

    CLIPVisionConfig(hidden_size=8, intermediate_size=8, num_hidden_layers=1, num_attention_heads=1).save_pretrained(tmp_path)
    with pytest.raises(UnknownNameError, match="unknown VLM adapter 'clip_vision_model'; known: .*qwen2_5_vl"):
        load_vlm(str(tmp_path))


@pytest.mark.parametrize("mode", ["sparse", "slice"])
def test_ask_sends_gestalt_plus_exactly_k_saccades_where_arr_chose(saved, receipt, mode):
    adapter = load_vlm(str(saved["qwen2_5_vl"]))
    arr = fast_arr(adapter.cell)
    with torch.no_grad():
        answer = ask(adapter, receipt, "What is the total?", arr=arr, saccades=40, mode=mode, max_new_tokens=3)
        alloc = arr(receipt, "What is the total?", saccades=40)
    assert (answer.gestalt_tokens, answer.saccades, answer.full_tokens) == (36, 40, 53 * 35)
    assert answer.cells.tolist() == alloc.positions[0].tolist()  # relevance order, as allocated
    assert 1 <= len(answer.tokens) <= 3 and isinstance(answer.text, str)
    assert answer.flops_full["llm"] > 10 * answer.flops["llm"]
    if mode == "sparse":
        assert answer.flops_full["vision"] > 5 * answer.flops["vision"]


def test_ask_weighted_sends_every_cell_and_the_answer_is_deterministic(saved, receipt):
    adapter = load_vlm(str(saved["qwen3_vl"]))
    arr = fast_arr(adapter.cell)
    with torch.no_grad():
        a = ask(adapter, receipt, "Date?", arr=arr, saccades=16, mode="weighted", max_new_tokens=2)
        b = ask(adapter, receipt, "Date?", arr=arr, saccades=16, mode="weighted", max_new_tokens=2)
    assert a.gestalt_tokens == 0 and a.saccades == a.full_tokens == 46 * 31
    assert a.tokens == b.tokens


def test_ask_weighted_with_unit_weights_is_the_native_encoding(saved):
    adapter = load_vlm(str(saved["qwen3_vl"]))
    img = torch.rand(3, 64, 96)
    vis = adapter.encode([img], [None], mode="weighted", weights=[torch.ones(2, 3)])[0]
    assert_close_reduction(vis.embeds, adapter.encode_native([img])[0].embeds, **VLM_EMBEDS)
    half = adapter.encode([img], [None], mode="weighted", weights=[torch.full((2, 3), 0.5)])[0]
    assert torch.equal(half.embeds, vis.embeds * 0.5)  # the same tower; the weight scales its output, exactly
    assert vis.positions.T.tolist() == [[0.0, y, x] for y, x in all_cells(2, 3).tolist()]


def test_ask_refuses_an_arr_with_the_wrong_cell(saved, receipt):
    adapter = load_vlm(str(saved["qwen3_vl"]))
    with pytest.raises(ValueError, match="canvas cell is 28 px but qwen3_vl needs 32 px"):
        ask(adapter, receipt, "Date?", arr=fast_arr(28), saccades=8)


def test_cli_ask_prints_answer_tokens_and_flops(saved, receipt, capsys):
    argv = ["ask", str(receipt), "What is the total?", "--model", str(saved["qwen2_5_vl"]), "--saccades", "40",
            "--query-encoder", "hashing", "--channels", "mvp", "--max-new-tokens", "2"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "answer        '" in out
    assert "visual tokens sent 76 = 36 gestalt + 40 saccades  |  full resolution 1855  (4%)" in out
    assert "prefill FLOPs est." in out and "(full / sent = " in out


def test_cli_ask_errors_are_one_clear_line(tmp_path, receipt, capsys):
    assert main(["ask", str(receipt), "Q?", "--model", str(tmp_path / "nope"), "--query-encoder", "hashing"]) == 2
    assert "arr-coc: error: cannot load a VLM config from" in capsys.readouterr().err


def test_ask_returns_the_answer_to_one_question_and_a_list_to_a_list(tiny):
    adapter = tiny["qwen2_5_vl"]
    arr, img = fast_arr(adapter.cell), small_image(adapter, seed=2)
    one = ask(adapter, img, "Date?", arr=arr, saccades=5, max_new_tokens=2)
    listed = ask(adapter, [img], ["Date?"], arr=arr, saccades=5, max_new_tokens=2)
    stacked = ask(adapter, torch.stack([img, img]), "Date?", arr=arr, saccades=5, max_new_tokens=2)  # B images
    assert isinstance(one, Answer) and isinstance(listed, list) and len(listed) == 1 and len(stacked) == 2
    assert listed[0].tokens == one.tokens == stacked[1].tokens and listed[0].cells.tolist() == one.cells.tolist()
    # negative control: another image is answered from other saccades
    other = ask(adapter, small_image(adapter, seed=3), "Date?", arr=arr, saccades=5, max_new_tokens=2)
    assert other.cells.tolist() != one.cells.tolist()


def test_a_batch_of_images_is_seen_and_scored_in_one_arr_pass(tiny, monkeypatch):
    adapter = tiny["qwen2_5_vl"]
    arr, calls = fast_arr(adapter.cell), []
    see, score = arr.see, arr.score
    monkeypatch.setattr(arr, "see", lambda *a, **k: calls.append("see") or see(*a, **k))
    monkeypatch.setattr(arr, "score", lambda *a, **k: calls.append("score") or score(*a, **k))
    imgs, qs = [small_image(adapter, seed=s) for s in range(3)], ["Total?", "Date?", "Who?"]
    both = ask(adapter, imgs, qs, arr=arr, saccades=5, max_new_tokens=1)
    assert calls == ["see", "score"] and len(both) == 3
    calls.clear()  # negative control: asked one at a time, each image is a pass of its own
    alone = [ask(adapter, img, q, arr=arr, saccades=5, max_new_tokens=1) for img, q in zip(imgs, qs)]
    assert calls == ["see", "score"] * 3
    assert [a.cells.tolist() for a in alone] == [a.cells.tolist() for a in both]  # each image as it is alone


# ----------------------------------------------------------------------------- variable-size patch allocators


@pytest.mark.parametrize("family, gestalt", [("qwen2_5_vl", 2 * 2), ("llava", 16)])  # Qwen: 2x2, the largest offered square <= 11; LLaVA: its own 4x4 view
@pytest.mark.parametrize("allocator, sent", [("patches", 11), ("quadtree", 9)])  # quadtree: 6 squares + 3 per split
def test_ask_with_a_patch_allocator_sends_the_gestalt_and_one_token_per_box(tiny, family, gestalt, allocator, sent):
    adapter, q, k = tiny[family], "What is the total?", 11
    arr, img = fast_arr(adapter.cell), small_image(adapter)
    with torch.no_grad():
        a = ask(adapter, img, q, arr=arr, saccades=k, allocator=allocator, max_new_tokens=2)
        alloc = arr(img, q, saccades=k)
    patcher = METHODS.get(allocator).patcher  # the registry's method "patches" places squares with the saliency patcher
    assert patcher == {"patches": "saliency", "quadtree": "quadtree"}[allocator]
    patches = PATCHERS.get(patcher)(alloc.relevance.map, k, valid=alloc.canvas.valid, pixels=alloc.canvas.pixels)
    assert int(patches.counts[0]) == sent and a.full_tokens == 48
    assert (a.allocator, a.gestalt_tokens, a.saccades, a.visual_tokens) == (allocator, gestalt, sent, gestalt + sent)
    assert a.squares.tolist() == patches.boxes[0, :sent].tolist() and a.cells is None  # [K, 3] (y, x, side)
    assert a.plan.kind == "squares" and a.plan.saccades == sent
    assert 1 <= len(a.tokens) <= 2 and isinstance(a.text, str)
    # negative control: the sampler spends all 11 tokens on one-cell saccades
    arr_answer = ask(adapter, img, q, arr=arr, saccades=k, max_new_tokens=2)
    assert arr_answer.cells.shape == (k, 2) and arr_answer.saccades == k and arr_answer.squares is None


@pytest.mark.parametrize("family", ["qwen2_5_vl", "llava"])
def test_allocator_arr_is_the_call_without_it(tiny, family):
    adapter = tiny[family]
    arr, img = fast_arr(adapter.cell), small_image(adapter, seed=1)
    with torch.no_grad():
        a, b = (ask(adapter, img, "Date?", arr=arr, saccades=5, max_new_tokens=3, **kw)
                for kw in ({}, {"allocator": "arr"}))
    assert (a.text, a.tokens, a.gestalt_tokens, a.saccades, a.flops, a.allocator) == \
        (b.text, b.tokens, b.gestalt_tokens, b.saccades, b.flops, b.allocator)
    assert a.allocator == "arr" and torch.equal(a.cells, b.cells) and a.cells.shape == (5, 2)


@pytest.mark.parametrize("kwargs, message", [
    (dict(allocator="grid"), f"unknown allocator 'grid'; choose one of {', '.join(allocators())}"),
    (dict(allocator="quadtree", mode="slice"),
     "allocator 'quadtree' sends variable-size patches, which only mode='sparse' encodes \\(got mode='slice'\\)"),
    (dict(allocator="patches", mode="weighted"), "use mode='sparse' or allocator='arr'"),
    (dict(allocator="quadtree", saccades=5), "'quadtree' needs more saccades: budget K=5 is below the 6 starting "
                                             "squares .*; raise --saccades \\(saccades=\\) to at least 6"),
])
def test_ask_refuses_what_a_patch_allocator_cannot_do(tiny, kwargs, message):
    adapter = tiny["llava"]
    kwargs = {"saccades": 11, **kwargs}
    with pytest.raises(ValueError, match=message):
        ask(adapter, small_image(adapter), "Q?", arr=fast_arr(adapter.cell), max_new_tokens=1, **kwargs)


def test_cli_ask_with_a_quadtree_reports_its_tokens_or_asks_for_more_saccades(tmp_path, capsys):
    from PIL import Image

    path = tmp_path / "page.png"
    Image.fromarray((small_image(load_vlm("tiny:llava")) * 255).byte().permute(1, 2, 0).numpy()).save(path)
    argv = ["ask", str(path), "What is the total?", "--model", "tiny:llava", "--allocator", "quadtree",
            "--query-encoder", "hashing", "--channels", "mvp", "--max-new-tokens", "1"]
    assert main(argv + ["--saccades", "11"]) == 0
    out = capsys.readouterr().out
    assert "allocator quadtree" in out
    assert "visual tokens sent 25 = 16 gestalt + 9 saccades  |  full resolution 48  (52%)" in out
    assert main(argv + ["--saccades", "5"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("arr-coc: error: allocator 'quadtree' needs more saccades") and "raise --saccades" in err


# ----------------------------------------------------------------------------- relevance from the VLM's first look


def test_ask_vlm_relevance_sends_the_cells_its_first_look_chose_and_answers_as_one_pass(tiny):
    from arr_coc.vlm import assemble, generate
    from arr_coc.vlm.first_look import first_look

    adapter, q, k = tiny["qwen2_5_vl"], "What is the total?", 11
    arr, img = fast_arr(adapter.cell), small_image(adapter, seed=2)
    a = ask(adapter, img, q, arr=arr, saccades=k, relevance="vlm", max_new_tokens=4)
    assert (a.relevance, a.gestalt_tokens, a.saccades, a.full_tokens) == ("vlm", 4, k, 48)
    # the same first look by hand: its map spread over the 6x8 cells, ARR's sampler on it
    gestalt = adapter.encode_gestalt([img], [(2, 2)])
    look = first_look(adapter, gestalt, [(2, 2)], [q])
    rel = look.cell_maps([(6, 8)])[0]
    chosen = select(arr.sampler, rel[None], k, valid=torch.ones(1, 6, 8, dtype=torch.bool), seed=arr.config.seed)
    chosen = chosen.positions[0]
    assert a.cells.tolist() == chosen.tolist()
    # one fresh pass over prefix, gestalt, those saccades, question gives the same answer tokens
    vis = adapter.encode([img], [chosen], gestalt=[(2, 2)])
    pre, suf = adapter.prompt_ids(q)
    tokens, _ = generate(adapter, assemble(adapter.embed_tokens, [pre], vis, [suf], adapter.rope_rows),
                         max_new_tokens=4)
    stop = tokens[0].tolist()
    assert a.tokens == stop[:len(a.tokens)] and len(a.tokens) >= 1
    # negative control: ARR's texture relevance picks other cells
    b = ask(adapter, img, q, arr=arr, saccades=k, relevance="arr", max_new_tokens=1)
    assert b.relevance == "arr" and b.cells.tolist() != a.cells.tolist()
    # stage times and FLOPs: the first look is allocation, its LLM work is the question once more
    stages = a.stage_ms()
    assert set(stages) == {"allocation", "vision", "prefill", "decode"} and all(v > 0 for v in stages.values())
    assert {"allocation/first look", "vision/gestalt", "prefill/gestalt", "prefill", "decode"} <= set(a.timings_ms)
    assert a.flops["allocation"] > 0 and b.flops["allocation"] == 0
    assert a.flops["total"] == pytest.approx(a.flops["llm"] + a.flops["vision"] + a.flops["allocation"])
    assert (a.flops["llm"], a.flops["vision"]) == (b.flops["llm"], b.flops["vision"])  # the same sequence sent


def test_ask_vlm_a_batch_of_different_sizes_equals_each_image_alone(tiny):
    adapter = tiny["qwen2_5_vl"]
    arr = fast_arr(adapter.cell)
    imgs = [small_image(adapter, 6, 8, seed=3), small_image(adapter, 5, 4, seed=4)]
    qs = ["What is the total?", "Date?"]
    both = ask(adapter, imgs, qs, arr=arr, saccades=6, relevance="vlm", max_new_tokens=3)
    for b in range(2):
        one = ask(adapter, imgs[b], qs[b], arr=arr, saccades=6, relevance="vlm", max_new_tokens=3)
        assert one.cells.tolist() == both[b].cells.tolist()
        assert one.tokens == both[b].tokens and one.gestalt_tokens == both[b].gestalt_tokens


@pytest.mark.parametrize("kwargs, message", [
    (dict(relevance="ocr"), "unknown relevance source 'ocr'; choose one of auto, arr, vlm"),
    (dict(relevance="vlm", mode="weighted"), "relevance 'vlm' reads the VLM's look at the gestalt, which mode weighted"),
    (dict(relevance="vlm", gestalt=False), "which no gestalt does not send"),
])
def test_ask_refuses_a_relevance_source_it_cannot_use(tiny, kwargs, message):
    adapter = tiny["qwen2_5_vl"]
    with pytest.raises(ValueError, match=message):
        ask(adapter, small_image(adapter), "Q?", arr=fast_arr(adapter.cell), saccades=4, max_new_tokens=1, **kwargs)


def test_ask_vlm_on_llava_names_what_it_needs(tiny):
    adapter = tiny["llava"]
    with pytest.raises(ValueError, match="relevance 'vlm' needs an adapter that encodes the gestalt alone"):
        ask(adapter, small_image(adapter), "Q?", arr=fast_arr(adapter.cell), saccades=4, relevance="vlm")


def test_flops_count_qwen25_window_attention_per_window(tiny):
    from arr_coc.vlm.cost import prefill_flops

    adapter = tiny["qwen2_5_vl"]  # 2 tower layers, the last one full; windows of 56 px = 4 x 4 patches
    vc = adapter.model.config.vision_config
    assert (vc.window_size // vc.patch_size) ** 2 == 16 and list(vc.fullatt_block_indexes) == [1]
    width, weights = vc.hidden_size, sum(p.numel() for p in adapter.visual.parameters())
    f = prefill_flops(adapter, 10, (64,))
    assert f["vision"] == 2.0 * weights * 64 + 4.0 * width * (64 * 64 + 64 * 16)  # one full layer, one windowed
    g = prefill_flops(adapter, 10, (64,), look_tokens=5, look_past=20)
    assert g["allocation"] > 0 and g["total"] == pytest.approx(f["total"] + g["allocation"])


def test_cli_ask_relevance_vlm_json_prints_answer_tokens_and_stage_times(receipt, capsys):
    import json

    argv = ["ask", str(receipt), "What is the total?", "--model", "tiny:qwen2_5_vl", "--relevance", "vlm", "--json",
            "--saccades", "40", "--max-new-tokens", "2"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["relevance"], out["family"]) == ("vlm", "qwen2_5_vl")
    assert out["tokens"] == {"sent": 76, "visual": 76, "gestalt": 36, "saccades": 40, "full_resolution": 53 * 35,
                             "text": None, "tokenizer": None, "compression": None}
    assert [len(p["positions"]) for p in out["pages"]] == [40] and out["pages"][0]["gestalt_grid"] == [6, 6]
    assert isinstance(out["answer"], str) and set(out["time_ms"]) == {"allocation", "vision", "prefill", "decode",
                                                                       "total"}
    assert out["time_ms"]["total"] == pytest.approx(sum(v for k, v in out["time_ms"].items() if k != "total"), abs=0.1)
    assert {"allocation/first look", "allocation/selection", "vision/gestalt", "prefill/gestalt"} <= set(out["stages_ms"])
    assert out["flops"]["allocation"] > 0 and out["flops"]["total"] < out["flops_full"]["total"]
    # on the CPU, auto is arr: ARR's stages, no first look
    assert main(argv[:5] + ["--json", "--saccades", "40", "--max-new-tokens", "1", "--query-encoder", "hashing",
                            "--channels", "mvp"]) == 0
    auto = json.loads(capsys.readouterr().out)
    assert auto["relevance"] == "arr" and "allocation/texture" in auto["stages_ms"] and auto["flops"]["allocation"] == 0


def test_first_look_channel_mixes_the_vlms_attention_into_arrs_scorer(tiny):
    from arr_coc.vlm.first_look import first_look

    adapter, q, k = tiny["qwen2_5_vl"], "What is the total?", 8
    img = small_image(adapter, seed=5)
    arr = ARR(ARRConfig(canvas=CanvasConfig(cell=adapter.cell),
                        texture=TextureConfig(channels=MVP_CHANNELS + ("first_look",))),
              query_encoder=HashingQueryEncoder()).eval()
    a = ask(adapter, img, q, arr=arr, saccades=k, relevance="arr", max_new_tokens=2)
    assert a.relevance == "arr" and {"allocation/first look", "allocation/texture"} <= set(a.timings_ms)
    look = first_look(adapter, adapter.encode_gestalt([img], [(2, 2)]), [(2, 2)], [q])
    fl = look.relevance_map([(6, 8)], (6, 8))[:, None]  # [1, 1, Hc, Wc]
    alloc = arr(img, q, saccades=k, coupled=lambda canvas, qs: {"first_look": fl})
    assert a.cells.tolist() == alloc.positions[0].tolist()
    # hand-set participatory head: the coupled channel enters with its fixed weight 3, at its absolute level
    # the participatory head sums the cell texture's channels (fewer than 64), all but this one at weight 0
    assert_close_reduction(alloc.relevance.parts[0, 2], 3.0 * fl[0, 0], reduction_len=64)
    # negative control: a flat first look leaves other cells on top
    flat = arr(img, q, saccades=k, coupled=lambda canvas, qs: {"first_look": torch.full_like(fl, 0.5)})
    assert flat.positions[0].tolist() != alloc.positions[0].tolist()
    with pytest.raises(ValueError, match="'first_look' channel is read from a VLM's attention, not from pixels"):
        arr(img, q, saccades=k)
    with pytest.raises(ValueError, match="given channels \\['clip'\\] are not question-coupled channels"):
        arr(img, q, saccades=k, coupled=lambda canvas, qs: {"clip": fl})


def test_arr_texture_runs_where_the_arr_was_moved():
    """Plain tensor channels follow the ARR's device (the meta device stands in for a GPU here)."""
    channels = ("rgb", "edges", "saliency", "eccentricity")
    arr = ARR(ARRConfig(texture=TextureConfig(channels=channels)), query_encoder=HashingQueryEncoder()).eval()
    img = torch.rand(3, 112, 140, generator=torch.Generator().manual_seed(0))
    cpu = arr.see(img)
    meta = arr.to("meta").see(img)
    assert cpu.cell_texture.device.type == "cpu"
    assert meta.cell_texture.device.type == meta.canvas.pixels.device.type == meta.canvas.valid.device.type == "meta"
    assert meta.cell_texture.shape == cpu.cell_texture.shape == (1, 6, 4, 5)


def test_tiny_models_leave_the_callers_random_state_alone():
    from arr_coc.vlm.tiny import tiny_llava_model, tiny_model

    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    a, b = tiny_model("qwen2_5_vl", seed=1), tiny_llava_model(seed=1)
    assert torch.equal(torch.rand(3), expected)  # as if no model had been built
    again = tiny_model("qwen2_5_vl", seed=1)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), again.parameters()))  # same seed, same model
    other = tiny_model("qwen2_5_vl", seed=2)
    assert not all(torch.equal(x, y) for x, y in zip(a.parameters(), other.parameters()))
