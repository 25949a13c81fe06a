import pytest
import torch
from PIL import Image
from tolerances import ARR_MAP, CANVAS, assert_close_reduction

from arr_coc.config import PIPELINE_CHANNELS, ARRConfig, CanvasConfig, SamplerConfig, ScorerConfig, TextureConfig
from arr_coc.engine.extract import extract_loop
from arr_coc.engine.pipeline import ARR
from arr_coc.engine.query import HashingQueryEncoder
from arr_coc.engine.samplers import SAMPLERS
from arr_coc.engine.texture import MVP_CHANNELS

STAGES = {"canvas", "texture", "gestalt", "query", "scoring", "selection", "extraction"}


def make_arr(**kw) -> ARR:
    kw.setdefault("texture", TextureConfig(channels=MVP_CHANNELS))  # the OCR channels have their own tests
    return ARR(ARRConfig(**kw), query_encoder=HashingQueryEncoder()).eval()


def check_allocation(out, k):
    B = out.positions.shape[0]
    assert out.positions.shape == (B, k, 2) and out.scores.shape == (B, k)
    for b in range(B):
        pos = out.positions[b]
        assert len({tuple(p) for p in pos.tolist()}) == k  # distinct
        assert out.canvas.valid[b, pos[:, 0], pos[:, 1]].all()  # real cells only
        assert (out.scores[b][:-1] >= out.scores[b][1:]).all()  # most relevant first
        assert torch.equal(out.scores[b], out.relevance.map[b, pos[:, 0], pos[:, 1]])  # read off the map


def test_receipt_end_to_end_sends_exactly_the_default_budget(receipt):
    with torch.no_grad():
        out = make_arr()(receipt, "What is the total?")
    check_allocation(out, 273)
    assert out.gestalt.grid == (16, 16) and out.tokens_sent == 256 + 273
    assert out.canvas.image_sizes == [(1484, 992)] and out.canvas.sizes == [(1484, 980)]
    assert out.canvas.full_tokens == [53 * 35]
    assert {k for k in out.timings_ms if "/" not in k} == STAGES
    assert {k.split("/")[1] for k in out.timings_ms if "/" in k} == set(MVP_CHANNELS)
    assert torch.equal(out.patches, extract_loop(out.canvas.pixels, out.positions, 28))  # copies of the pixels
    # the page is mostly blank paper: the saccades must land on ink, not on the margins
    ink = (out.patches.mean(2) < 0.6).flatten(2).any(-1).float().mean()
    assert ink > 0.8, f"only {ink:.0%} of saccades contain any ink"


def test_same_seed_same_allocation(receipt):
    a = make_arr(seed=3)(receipt, "Date?")
    b = make_arr(seed=3)(receipt, "Date?")
    assert torch.equal(a.positions, b.positions) and torch.equal(a.scores, b.scores)


def test_batch_of_different_sizes_equals_each_image_alone(receipt, tmp_path):
    landscape = tmp_path / "landscape.png"  # a second size and orientation: the receipt turned and shrunk
    Image.open(receipt).transpose(Image.Transpose.ROTATE_90).reduce(2).save(landscape)
    arr = make_arr()
    with torch.no_grad():
        both = arr([receipt, landscape], ["What is the total?", "Where is the dog?"])
        alone = [arr(receipt, "What is the total?"), arr(landscape, "Where is the dog?")]
    check_allocation(both, 273)
    for i, one in enumerate(alone):
        assert torch.equal(both.positions[i], one.positions[0])
        assert_close_reduction(both.scores[i], one.scores[0], **ARR_MAP)
        assert_close_reduction(both.patches[i], one.patches[0], **CANVAS)


@pytest.mark.parametrize("name", SAMPLERS.names())
def test_every_sampler_runs_in_the_pipeline(name, receipt):
    with torch.no_grad():
        out = make_arr(sampler=SamplerConfig(name=name, saccades=64))(receipt, "Date:")
    check_allocation(out, 64)
    assert out.gestalt.grid == (8, 8) and out.tokens_sent == 128


def test_mvp_scorer_and_qwen3_cell(receipt):
    with torch.no_grad():
        out = make_arr(scorer=ScorerConfig(name="mvp"), canvas=CanvasConfig(cell=32))(receipt, "Total?")
    check_allocation(out, 273)
    assert out.patches.shape[-2:] == (32, 32) and out.canvas.pixels.shape[-1] % 32 == 0


def test_motion_channel_sees_the_previous_frame():
    frame = torch.zeros(3, 224, 224)
    moved = frame.clone()
    moved[:, 100:130, 150:180] = 1.0
    arr = make_arr(sampler=SamplerConfig(name="topk", saccades=4))
    with torch.no_grad():
        out = arr(moved, "what moved?", prev=frame)
    cells = {tuple(p) for p in out.positions[0].tolist()}
    assert cells <= {(y, x) for y in range(3, 5) for x in range(5, 7)}
    with pytest.raises(ValueError, match="previous frames make a canvas"):
        arr(moved, "what moved?", prev=torch.zeros(3, 280, 224))


def test_budget_larger_than_the_image_raises_clearly():
    with pytest.raises(ValueError, match="exceeds"):
        make_arr()(torch.rand(3, 112, 112), "anything", saccades=17)


def test_to_json_carries_what_scripts_need(receipt):
    with torch.no_grad():
        d = make_arr(sampler=SamplerConfig(saccades=32))(receipt, "Date?").to_json(0)
    assert d["image_size"] == [1484, 992] and d["canvas"] == [1484, 980] and d["cell"] == 28
    assert len(d["positions"]) == len(d["scores"]) == 32
    assert d["tokens"] == {"gestalt": 16, "saccades": 32, "sent": 48, "full_resolution": 1855}


def test_default_pipeline_couples_the_question_through_the_text_channels():
    arr = ARR(query_encoder=HashingQueryEncoder())
    assert arr.channels == PIPELINE_CHANNELS and arr.query_channels == ("text_match", "key_value")
    assert arr.image_channels == MVP_CHANNELS + ("learned_saliency",)
