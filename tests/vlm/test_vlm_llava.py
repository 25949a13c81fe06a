"""The LLaVA adapter against the model's own forward, on a tiny random-weight LLaVA (CLIP + Llama).

Every exactness test carries a negative control: the same comparison with deliberately wrong
positions or order must fail, so a test cannot pass because the model ignores them.
"""
import copy

import pytest
import torch
import torch.nn.functional as F
from conftest import check_batch_equals_singles
from tolerances import VLM_EMBEDS, VLM_LOGITS, assert_close_reduction, assert_far, reduction_atol

from arr_coc.config import ARRConfig, CanvasConfig, TextureConfig
from arr_coc.engine.pipeline import ARR
from arr_coc.engine.query import HashingQueryEncoder
from arr_coc.engine.texture import MVP_CHANNELS
from arr_coc.vlm import ADAPTERS, Answer, assemble
from arr_coc.vlm.answer import ask
from arr_coc.vlm.llava import LlavaAdapter, box_places, to_patches, to_tiles
from arr_coc.vlm.processing import all_cells
from arr_coc.vlm.tiny import tiny_llava_model, tiny_llava_tokenizer


@torch.no_grad()
def sparse_features(adapter: LlavaAdapter, tile: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Tokens [k, D] of only the patches ``index`` [k] (raster, in-tile) of one tile [C, S, S]: the CLIP tower
    attends over CLS + these patches alone, each with the position embedding of its place in the tile."""
    at = torch.stack([index // adapter.side, index % adapter.side], 1).float()  # [k, 2] whole slots
    return adapter.tower_tokens(to_patches(tile, adapter.cell)[index], at)


@pytest.fixture(scope="module")
def adapter():
    return ADAPTERS.get("llava")(tiny_llava_model(), tiny_llava_tokenizer())


def image(hc, wc, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(3, hc * 14, wc * 14, generator=g)


def prefill_for(adapter, questions, visuals):
    prompts = [adapter.prompt_ids(q) for q in questions]
    return assemble(adapter.embed_tokens, [p[0] for p in prompts], visuals, [p[1] for p in prompts], 1)


def run_llm(adapter, pf):
    x = dict(inputs_embeds=pf.inputs_embeds, attention_mask=pf.attention_mask, position_ids=pf.position_ids)
    with torch.no_grad():
        return adapter.logits(adapter.language_model(x))


def native_tile(adapter, tile):
    """LLaVA's own features of one normalised S x S tile, straight from the model's public API."""
    with torch.no_grad():
        return adapter.model.model.get_image_features(pixel_values=tile[None]).pooler_output[0]


# ----------------------------------------------------------------------------- pure pieces


def test_tiles_cover_the_image_row_major_with_zero_padding():
    x = torch.arange(3 * 5 * 9, dtype=torch.float32).view(3, 5, 9)
    tiles = to_tiles(x, 4)  # 2 x 3 tiles over an 8 x 12 padded image
    assert tiles.shape == (6, 3, 4, 4)
    assert torch.equal(tiles[4][:, :1, :4], x[:, 4:5, 4:8])
    assert tiles[5][:, :, 1:].abs().sum() == 0 and tiles[5][:, 1:].abs().sum() == 0
    patches = to_patches(tiles[0], 2)
    assert torch.equal(patches[3], x[:, 2:4, 2:4])


def test_prompt_ids_split_the_llava_template_around_one_image():
    adapter = LlavaAdapter(tiny_llava_model(), tiny_llava_tokenizer())
    pre, suf = adapter.prompt_ids("What?")
    tok = adapter.tokenizer
    assert tok.decode(pre) == "USER: " and tok.decode(suf) == "\nWhat? ASSISTANT:"
    tok.chat_template = None  # fallback: the image, then the bare question
    assert adapter.prompt_ids("Hi") == ([], tok("Hi", add_special_tokens=False)["input_ids"])
    tok.bos_token = "<|im_start|>"  # a Llama tokenizer starts every prompt with BOS
    assert adapter.prompt_ids("Hi")[0] == [tok.bos_token_id]


# ----------------------------------------------------------------------------- exactness


def test_gestalt_alone_reproduces_the_native_forward(adapter):
    img, q = image(4, 6), "What is the total?"
    with torch.no_grad():
        ref = adapter.model(**adapter.native_inputs([img], [q])).logits
    for vis in (adapter.encode_native([img]), adapter.encode([img], [torch.zeros(0, 2)], gestalt=[(8, 8)])):
        assert len(vis[0]) == vis[0].n_gestalt == 16 and vis[0].positions.tolist() == [list(map(float, range(16)))]
        pf = prefill_for(adapter, [q], vis)
        atol = assert_close_reduction(run_llm(adapter, pf), ref, **VLM_LOGITS)
    # negative control: the same gestalt tokens in another order
    perm = torch.randperm(16, generator=torch.Generator().manual_seed(0))
    vis[0].embeds = vis[0].embeds[perm]
    assert_far(run_llm(adapter, prefill_for(adapter, [q], vis)), ref, atol=atol)


@pytest.mark.parametrize("mode", ["slice", "sparse", "weighted"])
def test_every_cell_of_one_tile_equals_the_native_tile_encoding(adapter, mode):
    img = image(4, 4, seed=1)  # exactly one 56 px tile
    ref = native_tile(adapter, adapter.normalize(img)) * (0.5 if mode == "weighted" else 1.0)
    vis = adapter.encode([img], [all_cells(4, 4)], mode=mode, weights=[torch.full((4, 4), 0.5)])[0]  # weighted only
    assert vis.n_gestalt == 0 and vis.vision_segments == (17,)
    atol = assert_close_reduction(vis.embeds, ref, **VLM_EMBEDS)
    # negative control: the native tokens read column-major instead of raster
    assert_far(vis.embeds, ref.view(4, 4, -1).transpose(0, 1).reshape(16, -1), atol=atol)


def test_saccades_of_a_multi_tile_image_come_from_their_own_tile(adapter):
    img = image(7, 9, seed=2)  # 2 x 3 tiles; the last row and column padded
    cells = torch.tensor([[6, 8], [0, 0], [5, 4], [1, 7]])
    padded = torch.nn.functional.pad(adapter.normalize(img), (0, 168 - 126, 0, 112 - 98))

    def tile_tokens(column_shift):
        """Each cell's native token, read from the tile ``column_shift`` tiles to the right."""
        out = []
        for y, x in cells.tolist():
            ty, tx = y // 4, (x // 4 + column_shift) % 3
            tile = padded[:, ty * 56:(ty + 1) * 56, tx * 56:(tx + 1) * 56]
            out.append(native_tile(adapter, tile)[(y % 4) * 4 + x % 4])
        return torch.stack(out)

    ref = tile_tokens(0)
    sliced = adapter.encode([img], [cells], mode="slice")[0]
    assert sliced.vision_segments == (17,) * 4  # four tiles hold a chosen cell
    atol = assert_close_reduction(sliced.embeds, ref, **VLM_EMBEDS)
    weighted = adapter.encode([img], [None], mode="weighted", weights=[torch.full((7, 9), 0.5)])[0]
    assert len(weighted) == 63 and weighted.vision_segments == (17,) * 6
    assert_close_reduction(weighted.embeds[cells[:, 0] * 9 + cells[:, 1]], 0.5 * ref, **VLM_EMBEDS)
    # negative control: the same in-tile places, read from the neighbouring tile
    assert_far(sliced.embeds, tile_tokens(1), atol=atol)
    # sparse: the tower attends over CLS + the chosen patches of each tile, one segment per tile
    assert adapter.encode([img], [cells], mode="sparse")[0].vision_segments == (2, 2, 2, 2)


def test_sparse_patches_at_wrong_in_tile_positions_give_other_tokens(adapter):
    tile = adapter.normalize(image(4, 4, seed=4))
    index = torch.tensor([0, 5, 10, 15])
    right = sparse_features(adapter, tile, index)
    assert torch.equal(right, sparse_features(adapter, tile, index))  # the same call: the same bits
    # roll the tile one patch right and ask for the next column: the same pixels, other positions
    rolled, moved = torch.roll(tile, 14, dims=2), index // 4 * 4 + (index % 4 + 1) % 4
    assert torch.equal(to_patches(rolled, 14)[moved], to_patches(tile, 14)[index])
    assert_far(sparse_features(adapter, rolled, moved), right, atol=reduction_atol(right, **VLM_EMBEDS))


# ----------------------------------------------------------------------------- variable-size patches


def as_boxes(cells, size=1):
    """[K, 2] (y, x) cells -> [K, 3] (y, x, size) squares."""
    return torch.cat([cells, torch.full((len(cells), 1), size)], 1)


def shrunk(img, y, x, size):
    """The size x size cells at (y, x) resized to one 14 px cell, as encode_patches resizes them."""
    crop = img[None, :, y * 14:(y + size) * 14, x * 14:(x + size) * 14]
    return F.interpolate(crop, size=(14, 14), mode="bilinear", antialias=True, align_corners=False)[0]


def test_a_shrunk_square_sits_at_its_centre_between_table_slots(adapter):
    img = image(4, 4, seed=12)  # one tile of 4 x 4 slots
    token = adapter.encode_patches([img], [torch.tensor([[1, 2, 2]])])[0]  # cells (1..2, 2..3): centre (1.5, 2.5)
    assert len(token) == 1 and token.vision_segments == (2,)  # CLS + the one square
    table = adapter.visual.embeddings.position_embedding.weight  # [1 + 16, Dv], CLS first
    centre = table[1 + torch.tensor([1 * 4 + 2, 1 * 4 + 3, 2 * 4 + 2, 2 * 4 + 3])].mean(0)
    assert_close_reduction(adapter.position_at(torch.tensor([[1.5, 2.5]]))[0], centre, reduction_len=4)  # 4 slots
    torch.testing.assert_close(adapter.position_at(torch.tensor([[2.0, 3.0]]))[0], table[1 + 11], atol=0, rtol=0)
    # reference: the shrunk square as a one-patch saccade at slot (1, 2) of a tower copy holding the centre there
    tile = torch.zeros(3, 56, 56)
    tile[:, 14:28, 28:42] = adapter.normalize(shrunk(img, 1, 2, 2))
    twin = LlavaAdapter(copy.deepcopy(adapter.model), adapter.tokenizer)
    with torch.no_grad():
        twin.visual.embeddings.position_embedding.weight[1 + 6] = centre
    atol = assert_close_reduction(token.embeds, sparse_features(twin, tile, torch.tensor([6])), **VLM_EMBEDS)
    # negative control: the same shrunk pixels at the square's corner slot, as if it were one cell
    assert_far(token.embeds, sparse_features(adapter, tile, torch.tensor([6])), atol=atol)


def test_a_square_across_tiles_is_encoded_in_the_tile_of_its_centre(adapter):
    img = image(7, 9, seed=13)  # 2 x 3 tiles of 4 x 4 cells
    boxes = torch.tensor([[3, 3, 2], [0, 0, 1], [4, 4, 1], [2, 4, 4]])  # the first straddles four tiles
    tile, at = box_places(boxes, 4, (7, 9))
    assert tile.tolist() == [0, 0, 4, 1]  # centres (3.5, 3.5), (0, 0), (4, 4), (3.5, 5.5)
    assert at.tolist() == [[3.0, 3.0], [0.0, 0.0], [0.0, 0.0], [3.0, 1.5]]  # 3.5 clamped to the last slot
    vis = adapter.encode_patches([img], [boxes])[0]
    assert vis.vision_segments == (3, 2, 2)  # CLS + tile 0's two squares, tile 1's, tile 4's
    # the straddling square attends with tile 0's cell: the same token without the other tiles' squares
    alone = adapter.encode_patches([img], [boxes[:2]])[0]
    atol = assert_close_reduction(vis.embeds[:2], alone.embeds, **VLM_EMBEDS)
    # negative control: with the lower-right tile's square as its companion it would be another token
    assert_far(adapter.encode_patches([img], [boxes[[0, 2]]])[0].embeds[0], alone.embeds[0], atol=atol)


def test_a_batch_of_patches_equals_each_image_alone(adapter):
    imgs, questions = [image(6, 4, seed=14), image(5, 9, seed=15)], ["What is the total?", "Date?"]
    boxes = [torch.tensor([[0, 0, 2], [5, 3, 1], [2, 2, 2]]), torch.tensor([[1, 6, 1], [0, 0, 4], [3, 4, 2]])]
    vis = adapter.encode_patches(imgs, boxes, gestalt=[True, True])
    assert [len(v) for v in vis] == [16 + 3, 16 + 3]
    singles = []
    for b in range(2):
        one = adapter.encode_patches([imgs[b]], [boxes[b]], gestalt=[True])
        assert_close_reduction(one[0].embeds, vis[b].embeds, **VLM_EMBEDS)
        singles.append(prefill_for(adapter, [questions[b]], one))
    check_batch_equals_singles(adapter, prefill_for(adapter, questions, vis), singles, run_llm)


# ----------------------------------------------------------------------------- end to end


@pytest.mark.parametrize("mode, sent", [("sparse", (16, 5)), ("slice", (16, 5)), ("weighted", (0, 48))])
def test_ask_runs_end_to_end_and_reports_gestalt_plus_saccades(adapter, mode, sent):
    arr = ARR(ARRConfig(canvas=CanvasConfig(cell=14), texture=TextureConfig(channels=MVP_CHANNELS)),
              query_encoder=HashingQueryEncoder()).eval()
    a = ask(adapter, image(6, 8, seed=10), "What is the total?", arr=arr, saccades=5, mode=mode, max_new_tokens=3)
    assert isinstance(a, Answer)  # one question: its answer, not a list
    assert (a.gestalt_tokens, a.saccades) == sent and a.visual_tokens == sum(sent)
    assert a.cells.shape == (5, 2) and 1 <= len(a.tokens) <= 3 and a.full_tokens == 48
    if mode != "weighted":  # 21 of 48 tokens: the LLM prefill must cost less than full resolution
        assert 0 < a.flops["llm"] < a.flops_full["llm"]


# ----------------------------------------------------------------------------- errors


def test_encode_needs_cells_or_a_gestalt(adapter):
    with pytest.raises(ValueError, match="nothing to encode: give cells, a gestalt, or both, for each image"):
        adapter.encode([image(3, 4)], [torch.zeros(0, 2)])
    assert len(adapter.encode([image(3, 4)], [torch.zeros(0, 2)], gestalt=[(4, 4)])[0]) == 16  # the gestalt alone


def test_off_cell_images_and_fractional_positions_are_rejected(adapter):
    with pytest.raises(ValueError, match="multiples of the 14 px cell"):
        adapter.encode([torch.rand(3, 30, 56)], [torch.tensor([[0, 0]])])
    pf = prefill_for(adapter, ["?"], adapter.encode_native([image(4, 4)]))
    with pytest.raises(ValueError, match="whole-number positions"):
        adapter.language_model(dict(inputs_embeds=pf.inputs_embeds, attention_mask=pf.attention_mask,
                                    position_ids=pf.position_ids + 0.5))
