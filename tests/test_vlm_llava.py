"""The LLaVA adapter against the model's own forward, on a tiny random-weight LLaVA (CLIP + Llama).

Every exactness test carries a negative control: the same comparison with deliberately wrong
positions or order must fail, so a test cannot pass because the model ignores them.
"""
import copy

import pytest
import torch
import torch.nn.functional as F
from conftest import check_batch_equals_singles

from arr_coc.config import ARRConfig, CanvasConfig, TextureConfig
from arr_coc.pipeline import ARR
from arr_coc.query import HashingQueryEncoder
from arr_coc.texture import MVP_CHANNELS
from arr_coc.vlm import ADAPTERS, assemble, generate
from arr_coc.vlm.ask import ask
from arr_coc.vlm.llava import LlavaAdapter, box_places, to_patches, to_tiles
from arr_coc.vlm.tiny import tiny_llava_model, tiny_llava_tokenizer
from arr_coc.vlm.base import all_cells

ATOL = 1e-5  # one float32 model, the same kernels on both paths
WRONG = 1e-2  # a wrong position or order must move some value by more than this


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


def far(a, b):
    return (a - b).abs().max().item() > WRONG


# ----------------------------------------------------------------------------- pure pieces


def test_tiles_cover_the_image_row_major_with_zero_padding():
    x = torch.arange(3 * 5 * 9, dtype=torch.float32).view(3, 5, 9)
    tiles = to_tiles(x, 4)  # 2 x 3 tiles over an 8 x 12 padded image
    assert tiles.shape == (6, 3, 4, 4)
    torch.testing.assert_close(tiles[4][:, :1, :4], x[:, 4:5, 4:8])
    assert tiles[5][:, :, 1:].abs().sum() == 0 and tiles[5][:, 1:].abs().sum() == 0
    patches = to_patches(tiles[0], 2)
    torch.testing.assert_close(patches[3], x[:, 2:4, 2:4])


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
        torch.testing.assert_close(run_llm(adapter, pf), ref, atol=ATOL, rtol=0)
    # negative control: the same gestalt tokens in another order
    perm = torch.randperm(16, generator=torch.Generator().manual_seed(0))
    vis[0].embeds = vis[0].embeds[perm]
    assert far(run_llm(adapter, prefill_for(adapter, [q], vis)), ref)


@pytest.mark.parametrize("mode", ["slice", "sparse", "weighted"])
def test_every_cell_of_one_tile_equals_the_native_tile_encoding(adapter, mode):
    img = image(4, 4, seed=1)  # exactly one 56 px tile
    ref = native_tile(adapter, adapter.normalize(img)) * (0.5 if mode == "weighted" else 1.0)
    vis = adapter.encode([img], [all_cells(4, 4)], mode=mode, weights=[torch.full((4, 4), 0.5)])[0]  # weighted only
    assert vis.n_gestalt == 0 and vis.vision_segments == (17,)
    torch.testing.assert_close(vis.embeds, ref, atol=ATOL, rtol=0)
    # negative control: the native tokens read column-major instead of raster
    assert far(vis.embeds, ref.view(4, 4, -1).transpose(0, 1).reshape(16, -1))


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
    torch.testing.assert_close(sliced.embeds, ref, atol=ATOL, rtol=0)
    weighted = adapter.encode([img], [None], mode="weighted", weights=[torch.full((7, 9), 0.5)])[0]
    assert len(weighted) == 63 and weighted.vision_segments == (17,) * 6
    torch.testing.assert_close(weighted.embeds[cells[:, 0] * 9 + cells[:, 1]], 0.5 * ref, atol=ATOL, rtol=0)
    # negative control: the same in-tile places, read from the neighbouring tile
    assert far(sliced.embeds, tile_tokens(1))


def test_sparse_subset_is_order_free_and_differs_from_slice(adapter):
    img = image(7, 9, seed=3)
    cells = torch.tensor([[6, 8], [0, 0], [2, 3], [3, 2], [0, 5], [4, 4]])
    a = adapter.encode([img], [cells], mode="sparse")[0]
    assert a.vision_segments == (4, 2, 2, 2)  # CLS + the chosen patches of each tile
    perm = torch.tensor([3, 0, 5, 4, 1, 2])
    b = adapter.encode([img], [cells[perm]], mode="sparse")[0]
    torch.testing.assert_close(b.embeds, a.embeds[perm], atol=ATOL, rtol=0)
    # the tower saw 3 patches of the first tile, not 16: a different context, different tokens
    assert far(adapter.encode([img], [cells], mode="slice")[0].embeds, a.embeds)


def test_sparse_patches_at_wrong_in_tile_positions_give_other_tokens(adapter):
    tile = adapter.normalize(image(4, 4, seed=4))
    index = torch.tensor([0, 5, 10, 15])
    right = adapter.sparse_features(tile, index)
    torch.testing.assert_close(right, adapter.sparse_features(tile, index))
    # roll the tile one patch right and ask for the next column: the same pixels, other positions
    rolled, moved = torch.roll(tile, 14, dims=2), index // 4 * 4 + (index % 4 + 1) % 4
    assert torch.equal(to_patches(rolled, 14)[moved], to_patches(tile, 14)[index])
    assert far(adapter.sparse_features(rolled, moved), right)


# ----------------------------------------------------------------------------- variable-size patches


def as_boxes(cells, size=1):
    """[K, 2] (y, x) cells -> [K, 3] (y, x, size) squares."""
    return torch.cat([cells, torch.full((len(cells), 1), size)], 1)


def shrunk(img, y, x, size):
    """The size x size cells at (y, x) resized to one 14 px cell, as encode_patches resizes them."""
    crop = img[None, :, y * 14:(y + size) * 14, x * 14:(x + size) * 14]
    return F.interpolate(crop, size=(14, 14), mode="bilinear", antialias=True, align_corners=False)[0]


@pytest.mark.parametrize("gestalt", [None, True])
def test_size_one_patches_are_exactly_the_sparse_saccades(adapter, gestalt):
    img = image(7, 9, seed=11)
    cells = torch.tensor([[6, 8], [0, 0], [2, 3], [3, 2], [0, 5], [4, 4]])  # four of the six tiles
    ref = adapter.encode([img], [cells], mode="sparse", gestalt=[gestalt])[0]
    vis = adapter.encode_patches([img], [as_boxes(cells)], gestalt=[gestalt])[0]
    assert (vis.n_gestalt, len(vis)) == (ref.n_gestalt, len(ref)) == (16 if gestalt else 0, ref.n_gestalt + 6)
    assert vis.vision_segments == ref.vision_segments and vis.positions.tolist() == ref.positions.tolist()
    torch.testing.assert_close(vis.embeds, ref.embeds, atol=1e-6, rtol=0)
    # negative control: the same cells encoded inside their full tiles (slice) are other tokens
    sliced = adapter.encode([img], [cells], mode="slice", gestalt=[gestalt])[0]
    assert far(vis.embeds[vis.n_gestalt:], sliced.embeds[sliced.n_gestalt:])


def test_a_shrunk_square_sits_at_its_centre_between_table_slots(adapter):
    img = image(4, 4, seed=12)  # one tile of 4 x 4 slots
    token = adapter.encode_patches([img], [torch.tensor([[1, 2, 2]])])[0]  # cells (1..2, 2..3): centre (1.5, 2.5)
    assert len(token) == 1 and token.vision_segments == (2,)  # CLS + the one square
    table = adapter.visual.embeddings.position_embedding.weight  # [1 + 16, Dv], CLS first
    centre = table[1 + torch.tensor([1 * 4 + 2, 1 * 4 + 3, 2 * 4 + 2, 2 * 4 + 3])].mean(0)
    torch.testing.assert_close(adapter.position_at(torch.tensor([[1.5, 2.5]]))[0], centre, atol=1e-6, rtol=0)
    torch.testing.assert_close(adapter.position_at(torch.tensor([[2.0, 3.0]]))[0], table[1 + 11], atol=0, rtol=0)
    # reference: the shrunk square as a one-patch saccade at slot (1, 2) of a tower copy holding the centre there
    tile = torch.zeros(3, 56, 56)
    tile[:, 14:28, 28:42] = adapter.normalize(shrunk(img, 1, 2, 2))
    twin = LlavaAdapter(copy.deepcopy(adapter.model), adapter.tokenizer)
    with torch.no_grad():
        twin.visual.embeddings.position_embedding.weight[1 + 6] = centre
    torch.testing.assert_close(token.embeds, twin.sparse_features(tile, torch.tensor([6])), atol=ATOL, rtol=0)
    # negative control: the same shrunk pixels at the square's corner slot, as if it were one cell
    assert far(token.embeds, adapter.sparse_features(tile, torch.tensor([6])))


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
    torch.testing.assert_close(vis.embeds[:2], alone.embeds, atol=1e-6, rtol=0)
    # negative control: with the lower-right tile's square as its companion it would be another token
    assert far(adapter.encode_patches([img], [boxes[[0, 2]]])[0].embeds[0], alone.embeds[0])


def test_a_batch_of_patches_equals_each_image_alone(adapter):
    imgs, questions = [image(6, 4, seed=14), image(5, 9, seed=15)], ["What is the total?", "Date?"]
    boxes = [torch.tensor([[0, 0, 2], [5, 3, 1], [2, 2, 2]]), torch.tensor([[1, 6, 1], [0, 0, 4], [3, 4, 2]])]
    vis = adapter.encode_patches(imgs, boxes, gestalt=[True, True])
    assert [len(v) for v in vis] == [16 + 3, 16 + 3]
    singles = []
    for b in range(2):
        one = adapter.encode_patches([imgs[b]], [boxes[b]], gestalt=[True])
        torch.testing.assert_close(one[0].embeds, vis[b].embeds, atol=1e-6, rtol=0)
        singles.append(prefill_for(adapter, [questions[b]], one))
    check_batch_equals_singles(adapter, prefill_for(adapter, questions, vis), singles, run_llm, ATOL)


@pytest.mark.parametrize("boxes, kwargs, message", [
    ([torch.tensor([[2, 3, 2]])], {}, "inside the 3x4 cell grid; \\(y, x, size\\) = \\(2, 3, 2\\) leaves it"),
    ([torch.tensor([[-1, 0, 1]])], {}, "inside the 3x4 cell grid"),
    ([torch.tensor([[0, 0, 1], [0, 0, 0]])], {}, "sizes must be >= 1; size 0 marks padding"),
    ([torch.zeros(3)], {}, "non-empty \\[K, 3\\] \\(y, x, size\\) tensor per image, got shape \\(3,\\)"),
    ([torch.zeros(0, 3)], {}, "non-empty \\[K, 3\\]"),
    ([torch.tensor([[0.5, 0.0, 1.0]])], {}, "whole cells"),
    ([torch.tensor([[0, 0, 1]])], dict(layout="polar"), "unknown layout 'polar'"),
    ([], {}, "need boxes and gestalt for each of the 1 images"),
])
def test_encode_patches_rejects_bad_boxes_clearly(adapter, boxes, kwargs, message):
    with pytest.raises(ValueError, match=message):
        adapter.encode_patches([image(3, 4)], boxes, **kwargs)
    # the same call with a good box encodes (only the box was wrong)
    if kwargs == {} and boxes:
        assert len(adapter.encode_patches([image(3, 4)], [torch.tensor([[1, 2, 2]])])[0]) == 1


# ----------------------------------------------------------------------------- generation and batching


def manual_decode(adapter, pf, steps, shift=0.0):
    """Recompute the whole sequence each step, no cache; ``shift`` moves the generated positions."""
    emb, mask, pos, tokens, logits = pf.inputs_embeds, pf.attention_mask, pf.position_ids, [], []
    for step in range(steps):
        out = run_llm(adapter, type(pf)(emb, mask, pos, pf.next_position, pf.visual_mask, []))[:, -1]
        nxt = out.argmax(-1)
        tokens.append(nxt)
        logits.append(out)
        emb = torch.cat([emb, adapter.embed_tokens(nxt[:, None])], 1)
        mask = torch.cat([mask, mask.new_ones(len(mask), 1)], 1)
        pos = torch.cat([pos, (pf.next_position + step + shift)[None, :, None]], 2)
    return torch.stack(tokens, 1), torch.stack(logits, 1)


def test_cached_generate_equals_manual_decode(adapter):
    img = image(7, 5, seed=5)
    vis = adapter.encode([img], [torch.tensor([[6, 4], [1, 1], [3, 0]])], gestalt=[(4, 4)])
    pf = prefill_for(adapter, ["Date?"], vis)
    tokens, logits = generate(adapter, pf, max_new_tokens=4)
    ref_tokens, ref_logits = manual_decode(adapter, pf, 4)
    assert tokens.shape == (1, 4) and tokens.tolist() == ref_tokens.tolist()
    torch.testing.assert_close(logits, ref_logits, atol=ATOL, rtol=0)
    # negative control: decoding one position early changes what the model computes
    _, wrong = manual_decode(adapter, pf, 4, shift=-1.0)
    assert far(wrong[:, 1:], logits[:, 1:])


def test_a_batch_of_different_sizes_equals_each_image_alone(adapter):
    imgs, questions = [image(6, 4, seed=6), image(5, 9, seed=7)], ["What is the total?", "Date?"]
    cells = [torch.tensor([[5, 3], [0, 0]]), torch.tensor([[1, 6], [2, 0], [4, 8], [0, 3]])]
    vis = adapter.encode(imgs, cells, gestalt=[(4, 4), (4, 4)])
    pf = prefill_for(adapter, questions, vis)
    singles = []
    for b in range(2):
        one = adapter.encode([imgs[b]], [cells[b]], gestalt=[(4, 4)])
        torch.testing.assert_close(one[0].embeds, vis[b].embeds, atol=1e-4, rtol=1e-5)
        singles.append(prefill_for(adapter, [questions[b]], one))
    check_batch_equals_singles(adapter, pf, singles, run_llm, ATOL)


def test_native_batch_reference_is_itself_consistent(adapter):
    """The reference pads too: its positions count real tokens, so a batch equals each prompt alone."""
    imgs, questions = [image(3, 4, seed=8), image(5, 2, seed=9)], ["a", "bbbbbb"]
    with torch.no_grad():
        both = adapter.model(**adapter.native_inputs(imgs, questions)).logits
        for b in range(2):
            one = adapter.model(**adapter.native_inputs([imgs[b]], [questions[b]])).logits
            torch.testing.assert_close(both[b, -1], one[0, -1], atol=ATOL, rtol=0)
        inputs = adapter.native_inputs(imgs, questions)
        inputs["attention_mask"] = torch.ones_like(inputs["attention_mask"])  # negative control: padding seen
        short = int(adapter.native_inputs(imgs, questions)["attention_mask"].sum(1).argmin())
        assert far(adapter.model(**inputs).logits[short, -1], both[short, -1])


@pytest.mark.parametrize("mode, sent", [("sparse", (16, 5)), ("slice", (16, 5)), ("weighted", (0, 48))])
def test_ask_runs_end_to_end_and_reports_gestalt_plus_saccades(adapter, mode, sent):
    arr = ARR(ARRConfig(canvas=CanvasConfig(cell=14), texture=TextureConfig(channels=MVP_CHANNELS)),
              query_encoder=HashingQueryEncoder()).eval()
    answers = ask(adapter, image(6, 8, seed=10), "What is the total?", arr=arr, budget=5, mode=mode,
                  max_new_tokens=3)
    assert len(answers) == 1
    a = answers[0]
    assert (a.gestalt_tokens, a.saccades) == sent and a.visual_tokens == sum(sent)
    assert a.cells.shape == (5, 2) and 1 <= len(a.tokens) <= 3 and a.full_tokens == 48
    if mode != "weighted":  # 21 of 48 tokens: the LLM prefill must cost less than full resolution
        assert 0 < a.flops["llm"] < a.flops_full["llm"]


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize("kwargs, message", [
    (dict(cells=[torch.tensor([[9, 0]])]), "out of bounds for a 3x4 cell grid"),
    (dict(cells=[torch.tensor([[1, 1], [1, 1]])]), "cells must be distinct"),
    (dict(cells=[torch.zeros(0, 2)]), "nothing to encode"),
    (dict(cells=[torch.zeros(3)]), "\\[K, 2\\]"),
    (dict(cells=[torch.tensor([[0, 0]])], mode="dense"), "unknown mode 'dense'"),
    (dict(cells=[torch.tensor([[0, 0]])], mode="weighted"), "weighted mode needs a \\[3, 4\\] weight map"),
    (dict(cells=[torch.tensor([[0, 0]])], layout="polar"), "unknown layout"),
    (dict(cells=[]), "need cells, gestalt and weights for each of the 1 images"),
])
def test_encode_rejects_bad_input_clearly(adapter, kwargs, message):
    with pytest.raises(ValueError, match=message):
        adapter.encode([image(3, 4)], **kwargs)


def test_off_cell_images_and_fractional_positions_are_rejected(adapter):
    with pytest.raises(ValueError, match="multiples of the 14 px cell"):
        adapter.encode([torch.rand(3, 30, 56)], [torch.tensor([[0, 0]])])
    pf = prefill_for(adapter, ["?"], adapter.encode_native([image(4, 4)]))
    with pytest.raises(ValueError, match="whole-number positions"):
        adapter.language_model(dict(inputs_embeds=pf.inputs_embeds, attention_mask=pf.attention_mask,
                                    position_ids=pf.position_ids + 0.5))
