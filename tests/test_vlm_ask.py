"""Loading VLMs with from_pretrained, ask() end to end, and ``arr-coc ask``."""
import pytest
import torch

from arr_coc.cli import main
from arr_coc.config import ARRConfig, CanvasConfig, TextureConfig
from arr_coc.pipeline import ARR
from arr_coc.query import HashingQueryEncoder
from arr_coc.registry import UnknownNameError
from arr_coc.texture import DEFAULT_CHANNELS
from arr_coc.vlm import ADAPTERS, ask, load_vlm
from arr_coc.vlm.qwen import all_cells
from arr_coc.vlm.tiny import save_tiny, tiny_model


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    return {f: save_tiny(tmp_path_factory.mktemp(f), f) for f in ("qwen2_5_vl", "qwen3_vl")}


def fast_arr(cell):
    return ARR(ARRConfig(canvas=CanvasConfig(cell=cell), texture=TextureConfig(channels=DEFAULT_CHANNELS)),
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
        torch.testing.assert_close(adapter.model(**inputs).logits, ref(**inputs).logits)
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
        answer = ask(adapter, receipt, "What is the total?", arr=arr, budget=40, mode=mode, max_new_tokens=3)[0]
        alloc = arr(receipt, "What is the total?", budget=40)
    assert (answer.gestalt_tokens, answer.saccades, answer.full_tokens) == (64, 40, 53 * 35)
    assert answer.cells.tolist() == alloc.positions[0].tolist()  # relevance order, as allocated
    assert 1 <= len(answer.tokens) <= 3 and isinstance(answer.text, str)
    assert answer.flops_full["llm"] > 10 * answer.flops["llm"]
    if mode == "sparse":
        assert answer.flops_full["vision"] > 5 * answer.flops["vision"]


def test_ask_weighted_sends_every_cell_and_the_answer_is_deterministic(saved, receipt):
    adapter = load_vlm(str(saved["qwen3_vl"]))
    arr = fast_arr(adapter.cell)
    with torch.no_grad():
        a = ask(adapter, receipt, "Date?", arr=arr, budget=16, mode="weighted", max_new_tokens=2)[0]
        b = ask(adapter, receipt, "Date?", arr=arr, budget=16, mode="weighted", max_new_tokens=2)[0]
    assert a.gestalt_tokens == 0 and a.saccades == a.full_tokens == 46 * 31
    assert a.tokens == b.tokens


def test_ask_weighted_with_unit_weights_is_the_native_encoding(saved):
    adapter = load_vlm(str(saved["qwen3_vl"]))
    img = torch.rand(3, 64, 96)
    vis = adapter.encode([img], [None], mode="weighted", weights=[torch.ones(2, 3)])[0]
    torch.testing.assert_close(vis.embeds, adapter.encode_native([img])[0].embeds)
    half = adapter.encode([img], [None], mode="weighted", weights=[torch.full((2, 3), 0.5)])[0]
    torch.testing.assert_close(half.embeds, vis.embeds * 0.5)
    assert vis.positions.T.tolist() == [[0.0, y, x] for y, x in all_cells(2, 3).tolist()]


def test_ask_refuses_an_arr_with_the_wrong_cell(saved, receipt):
    adapter = load_vlm(str(saved["qwen3_vl"]))
    with pytest.raises(ValueError, match="canvas cell is 28 px but qwen3_vl needs 32 px"):
        ask(adapter, receipt, "Date?", arr=fast_arr(28), budget=8)


def test_cli_ask_prints_answer_tokens_and_flops(saved, receipt, capsys):
    argv = ["ask", str(receipt), "What is the total?", "--model", str(saved["qwen2_5_vl"]), "--budget", "40",
            "--query-encoder", "hashing", "--channels", "mvp", "--max-new-tokens", "2"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "answer        '" in out
    assert "visual tokens sent 104 = 64 gestalt + 40 saccades  |  full resolution 1855  (6%)" in out
    assert "prefill FLOPs est." in out and "(full / sent = " in out


def test_cli_ask_errors_are_one_clear_line(tmp_path, receipt, capsys):
    assert main(["ask", str(receipt), "Q?", "--model", str(tmp_path / "nope"), "--query-encoder", "hashing"]) == 2
    assert "arr-coc: error: cannot load a VLM config from" in capsys.readouterr().err
