"""Qwen-VL adapters against the models' own forward, on tiny random-weight models of each family.

Every exactness test carries a negative control: the same comparison with deliberately wrong
positions must fail, so a test cannot pass because the model ignores positions.
"""
import numpy as np
import pytest
import torch
from tolerances import VLM_EMBEDS, assert_close_reduction, assert_far
from transformers.vision_utils import get_vision_interpolation_indices_and_weights, get_vision_window_index

from arr_coc.vlm import ADAPTERS
from arr_coc.vlm.processing import all_cells
from arr_coc.vlm.qwen_layout import Segment, patch_positions, patchify, visual_positions, window_order
from arr_coc.vlm.tiny import FAMILIES, tiny_image_processor, tiny_model, tiny_tokenizer


@pytest.fixture(scope="module", params=FAMILIES)
def adapter(request):
    ip = tiny_image_processor(request.param)
    return ADAPTERS.get(request.param)(tiny_model(request.param), tiny_tokenizer(), image_mean=ip.image_mean,
                                       image_std=ip.image_std)


def image(adapter, hc, wc, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(3, hc * adapter.cell, wc * adapter.cell, generator=g)


# ----------------------------------------------------------------------------- pure pieces


def test_patchify_reproduces_the_qwen_image_processor_rows():
    ip = tiny_image_processor("qwen2_5_vl")
    pixels = (np.random.default_rng(0).random((56, 84, 3)) * 255).astype(np.uint8)  # 2x3 cells, no resize
    ref = ip(images=[pixels], return_tensors="pt")
    assert ref["image_grid_thw"].tolist() == [[1, 4, 6]]
    img = torch.from_numpy(pixels).permute(2, 0, 1).float() / 255
    norm = (img - torch.tensor(ip.image_mean).view(3, 1, 1)) / torch.tensor(ip.image_std).view(3, 1, 1)
    # elementwise: /255, -mean, /std on each side (3 roundings) and the constants' own rounding
    assert_close_reduction(patchify(norm, 14, 2, 2), ref["pixel_values"], reduction_len=1, depth=4)


def test_window_order_is_the_native_window_attention_for_every_cell():
    for hc, wc in [(5, 7), (4, 4), (1, 9), (8, 3)]:
        order, sizes = window_order(all_cells(hc, wc), (hc, wc), 4)
        index, cu = get_vision_window_index(torch.tensor([[1, 2 * hc, 2 * wc]]), 2, 112, 14)
        assert order.tolist() == index.tolist()
        assert torch.nn.functional.pad(sizes.cumsum(0) * 4, (1, 0)).tolist() == cu.tolist()


def test_patch_positions_and_interpolation_rows_match_the_full_grid():
    cells = all_cells(3, 5)
    native_pos = torch.stack(torch.meshgrid(torch.arange(6), torch.arange(10), indexing="ij"), -1)
    native_pos = native_pos.reshape(3, 2, 5, 2, 2).permute(0, 2, 1, 3, 4).reshape(-1, 2)  # block-major
    assert patch_positions(cells, 2).tolist() == native_pos.tolist()
    full_i, full_w = get_vision_interpolation_indices_and_weights(torch.tensor([[1, 6, 10]]), 4, align_corners=True,
                                                                  spatial_merge_size=2)
    assert full_i.shape == (60, 4)
    assert_close_reduction(full_w.sum(1), torch.ones(60), reduction_len=4, depth=2)  # 4 bilinear weights


def test_visual_positions_layouts():
    cells = torch.tensor([[0, 0], [7, 3]])
    scaled = visual_positions((4, 2), cells, (8, 4), "scaled")  # gestalt 4x2 over an 8x4 grid: halves
    assert scaled.shape == (3, 8 + 2)
    assert scaled[:, :8].T.tolist()[-1] == [0.0, 3.0, 1.0]  # last gestalt token
    assert scaled[:, 8:].T.tolist() == [[0.0, -0.25, -0.25], [0.0, 3.25, 1.25]]
    temporal = visual_positions((4, 2), cells, (8, 4), "temporal")
    assert temporal[:, 8:].T.tolist() == [[1.0, 0.0, 0.0], [1.0, 7.0, 3.0]]
    native = visual_positions(None, all_cells(2, 3), (2, 3))
    assert native.T.tolist() == [[0.0, y, x] for y in range(2) for x in range(3)]
    with pytest.raises(ValueError, match="unknown layout 'polar'"):
        visual_positions(None, cells, (8, 4), "polar")


# ----------------------------------------------------------------------------- exactness


def test_sparse_tower_positions_matter(adapter):
    """Encoding each cell's true patches at another cell's place must change the tokens."""
    img = image(adapter, 4, 6)
    x = adapter.normalize(img)
    rows, cells = patchify(x, adapter.patch, adapter.merge, adapter.temporal), all_cells(4, 6)
    right = adapter.encode_segments([Segment(rows, cells, (4, 6))])[0][0]
    atol = assert_close_reduction(right, adapter.encode_native([img])[0].embeds, **VLM_EMBEDS)
    shifted = (cells + torch.tensor([1, 2])) % torch.tensor([4, 6])
    assert_far(adapter.encode_segments([Segment(rows, shifted, (4, 6))])[0][0], right, atol=atol)


def test_gestalt_is_the_models_own_low_resolution_encoding(adapter):
    img = image(adapter, 8, 6, seed=2)
    vis = adapter.encode([img], [torch.tensor([[7, 5], [0, 0]])], gestalt=[(4, 3)], mode="sparse")[0]
    assert vis.n_gestalt == 12 and len(vis) == 14 and vis.vision_segments == (48, 8)
    small = adapter.gestalt_image(img, (4, 3))
    assert small.shape == (3, 4 * adapter.cell, 3 * adapter.cell)
    assert_close_reduction(vis.embeds[:12], adapter.encode_native([small])[0].embeds, **VLM_EMBEDS)
    # the saccades are encoded without the gestalt in their attention segment
    alone = adapter.encode([img], [torch.tensor([[7, 5], [0, 0]])], mode="sparse")[0]
    assert_close_reduction(vis.embeds[12:], alone.embeds, **VLM_EMBEDS)
    assert vis.positions[:, 12:].T.tolist() == [[0.0, 3.25, 2.25], [0.0, -0.25, -0.25]]
    if adapter.name == "qwen3_vl":
        assert len(vis.deepstack) == 1 and vis.deepstack[0].shape == vis.embeds.shape


# ----------------------------------------------------------------------------- generation and batching


# ----------------------------------------------------------------------------- errors


def test_encode_needs_at_least_one_cell():
    """Qwen encodes saccades in their own attention segment: an empty one is refused (LLaVA's gestalt may
    stand alone)."""
    adapter = ADAPTERS.get("qwen2_vl")(tiny_model("qwen2_vl"), tiny_tokenizer())
    with pytest.raises(ValueError, match="cells must be a non-empty \\[K, 2\\] \\(y, x\\) tensor per image"):
        adapter.encode([image(adapter, 3, 4)], [torch.zeros(0, 2)])


def test_patchify_rejects_sides_off_the_cell():
    with pytest.raises(ValueError, match="multiples of the 28 px cell, got 30x56"):
        patchify(torch.zeros(3, 30, 56), 14, 2, 2)


# ----------------------------------------------------------------------------- variable-size patches


def test_size_one_patches_at_every_cell_are_the_native_encoding(adapter):
    img = image(adapter, 4, 5, seed=11)
    boxes = torch.cat([all_cells(4, 5), torch.ones(20, 1, dtype=torch.long)], 1)
    vis = adapter.encode_patches([img], [boxes])[0]
    native = adapter.encode_native([img])[0]
    assert_close_reduction(vis.embeds, native.embeds, **VLM_EMBEDS)
    assert vis.positions.tolist() == native.positions.tolist()


def test_a_shrunk_patch_sits_at_its_centre_and_its_position_matters(adapter):
    img = image(adapter, 6, 6, seed=12)
    boxes = torch.tensor([[2, 2, 2], [0, 0, 1], [0, 4, 2]])
    vis = adapter.encode_patches([img], [boxes], gestalt=[(3, 3)], layout="temporal")[0]
    assert vis.n_gestalt == 9 and len(vis) == 12
    assert vis.positions[:, 9:].T.tolist() == [[1.0, 2.5, 2.5], [1.0, 0.0, 0.0], [1.0, 0.5, 4.5]]
    # negative control: the same shrunk pixels encoded at the square's corner, as if it were one cell
    c = adapter.cell
    crop = torch.nn.functional.interpolate(img[None, :, 2 * c:4 * c, 2 * c:4 * c].float(), size=(c, c),
                                           mode="bilinear", antialias=True, align_corners=False)[0]
    rows = patchify(adapter.normalize(crop), adapter.patch, adapter.merge, adapter.temporal)
    centred = adapter.encode_segments([Segment(rows, torch.tensor([[2, 2]]), (6, 6), torch.tensor([2]))])[0][0]
    corner = adapter.encode_segments([Segment(rows, torch.tensor([[2, 2]]), (6, 6))])[0][0]
    atol = assert_close_reduction(adapter.encode_patches([img], [boxes[:1]])[0].embeds, centred, **VLM_EMBEDS)
    assert_far(centred, corner, atol=atol)


def test_position_table_taps_at_grid_points_match_transformers():
    from arr_coc.vlm.processing import table_taps

    cells = all_cells(3, 5)
    coords = patch_positions(cells, 2, torch.ones(15, dtype=torch.long))
    idx, w = table_taps(coords, torch.tensor([6, 10]), 4)
    ref_i, ref_w = get_vision_interpolation_indices_and_weights(torch.tensor([[1, 6, 10]]), 4, align_corners=True,
                                                                spatial_merge_size=2)
    dense = torch.zeros(60, 16).scatter_add_(1, idx, w)
    ref = torch.zeros(60, 16).scatter_add_(1, ref_i, ref_w)
    assert_close_reduction(dense, ref, reduction_len=4, depth=2)  # 4 taps, each a product of two weights
