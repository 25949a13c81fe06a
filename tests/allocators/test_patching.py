"""Specification tests for arr_coc.allocators.patching: budgets, tilings, rendering and batching of variable-size patches."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tolerances import CANVAS, assert_close_reduction

from arr_coc.allocators.patches import BudgetTooSmallError, Patches, patch_coverage, render_patches
from arr_coc.allocators.patching import PATCHERS, attention_saliency, edge_density, saliency_patches
from arr_coc.allocators.quadtree import _tiling, quadtree_patches
from arr_coc.allocators.token_batches import bucket_by_tokens, pad_tokens
from arr_coc.engine.selection import valid_extent


def padded_valid(b: int, h: int, w: int, g: torch.Generator) -> torch.Tensor:
    """Each image a top-left rectangle of the canvas, as a padded batch has."""
    hs, ws = torch.randint(1, h + 1, (b,), generator=g), torch.randint(1, w + 1, (b,), generator=g)
    return (torch.arange(h)[None, :, None] < hs[:, None, None]) & (torch.arange(w)[None, None, :] < ws[:, None, None])


@st.composite
def maps(draw, kind=st.sampled_from(["full", "padded", "random"])):
    b, h, w = draw(st.integers(1, 3)), draw(st.integers(1, 12)), draw(st.integers(1, 12))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    kind = draw(kind)
    if kind == "full":
        valid = torch.ones(b, h, w, dtype=torch.bool)
    elif kind == "padded":
        valid = padded_valid(b, h, w, g)
    else:
        valid = (torch.rand(b, h, w, generator=g) < 0.7).flatten(1).index_fill(1, torch.tensor([0]), True).view(b, h, w)
    sal = torch.rand(b, h, w, generator=g)
    if draw(st.booleans()):  # few levels: plenty of ties
        sal = (sal * 3).floor()
    return sal.masked_fill(~valid, float("nan")), valid  # padding content must never matter


def assert_tiles(p: Patches, valid: torch.Tensor, sizes: set[int]) -> None:
    """In bounds, on valid cells only, aligned to their size from the extent's corner, and non-overlapping."""
    b, hc, wc = valid.shape
    y, x, s = p.boxes.unbind(-1)
    real = s > 0
    assert p.boxes.dtype == torch.int64 and p.scores.shape == s.shape
    assert set(s[real].tolist()) <= sizes
    y0, x0, _, _ = valid_extent(valid)
    assert bool((((y - y0[:, None]) % s.clamp(min=1) == 0) & ((x - x0[:, None]) % s.clamp(min=1) == 0))[real].all())
    mask = p.mask(hc, wc)  # raises if a box leaves the grid
    assert not bool(((mask > 0) & ~valid).any()), "patches only on valid cells"
    # The union of the boxes has as many cells as their areas add up to: no two boxes overlap.
    assert torch.equal((mask > 0).flatten(1).sum(1), (s**2).sum(1))


# ----------------------------------------------------------------------------- saliency_patches
@settings(max_examples=60, deadline=None)
@given(problem=maps(), data=st.data())
def test_saliency_patches_returns_exactly_k_aligned_non_overlapping_patches(problem, data):
    sal, valid = problem
    k = data.draw(st.integers(1, int(valid.flatten(1).sum(1).min())))
    p = saliency_patches(sal, k, valid)
    assert p.boxes.shape == (sal.shape[0], k, 3) and p.tokens == k and bool((p.counts == k).all())
    assert_tiles(p, valid, {1, 2, 4})
    assert bool((p.scores[:, 1:] <= p.scores[:, :-1]).all()), "picks in descending score"
    assert torch.equal(saliency_patches(sal, k, valid).boxes, p.boxes), "deterministic"


def test_saliency_patch_score_is_mass_over_size():
    sal = torch.zeros(1, 4, 4)
    sal[0, 0, 0], sal[0, 2:, 2:] = 3.0, 1.0
    p = saliency_patches(sal, 2, sizes=(1, 2))
    assert p.boxes[0].tolist() == [[0, 0, 1], [2, 2, 2]]
    assert p.scores[0].tolist() == [3.0, 2.0]  # 3 / 1 and 4 cells * 1 / 2
    assert saliency_patches(sal, 2, sizes=(1, 2), size_prior=2.0).boxes[0, 1].tolist() == [2, 2, 2]  # tie: larger
    assert saliency_patches(sal, 2, sizes=(1, 2), size_prior=3.0).boxes[0, 1].tolist() == [2, 2, 1]


def test_concentrated_saliency_gets_small_patches_and_spread_saliency_large_ones():
    peak = torch.zeros(1, 8, 8)
    peak[0, 5, 3] = 1.0
    assert saliency_patches(peak, 1).boxes[0].tolist() == [[5, 3, 1]]
    flat = torch.ones(1, 8, 8)
    assert saliency_patches(flat, 4).boxes[0, :, 2].tolist() == [4, 4, 4, 4]


def test_saliency_patches_fill_every_cell_when_k_is_the_cell_count():
    p = saliency_patches(torch.rand(2, 5, 6), 30)
    assert bool((p.boxes[..., 2] == 1).all()) and bool((p.mask(5, 6) == 1).all())


def test_saliency_patches_errors_name_the_numbers():
    with pytest.raises(ValueError, match=r"K=17 exceeds the 16 valid cells of image 0"):
        saliency_patches(torch.rand(1, 4, 4), 17)
    with pytest.raises(ValueError, match="including 1"):
        saliency_patches(torch.rand(1, 4, 4), 2, sizes=(2, 4))
    with pytest.raises(ValueError, match=r"shape \(4, 4\)"):
        saliency_patches(torch.rand(4, 4), 2)


# ----------------------------------------------------------------------------- quadtree_patches
def busy_corner(b: int = 1, side: int = 16, cell: int = 4) -> torch.Tensor:
    """Flat grey pixels with random noise in the top-left quarter only."""
    g = torch.Generator().manual_seed(0)
    px = torch.full((b, 3, side * cell, side * cell), 0.5)
    q = side * cell // 2
    px[..., :q, :q] = torch.rand(b, 1, q, q, generator=g).expand(b, 3, q, q)
    return px


@settings(max_examples=50, deadline=None)
@given(problem=maps(kind=st.sampled_from(["full", "padded"])), data=st.data())
def test_quadtree_leaves_tile_the_valid_extent_within_budget(problem, data):
    rel, valid = problem
    max_size = data.draw(st.sampled_from([1, 2, 4, 8]))
    starts = [len(_tiling(int(h), int(w), max_size)) for _, _, h, w in zip(*valid_extent(valid))]
    k = data.draw(st.integers(max(starts), max(starts) + 40))
    p = quadtree_patches(rel, k, valid, criterion="relevance", max_size=max_size)
    assert_tiles(p, valid, {1, 2, 4, 8})
    assert bool((p.boxes[..., 2] <= max_size).all())
    assert torch.equal(p.mask(*valid.shape[1:]) > 0, valid), "no gaps: every valid cell covered"
    for b, start in enumerate(starts):
        n, sizes = int(p.counts[b]), p.boxes[b, : int(p.counts[b]), 2]
        assert n <= k and (n - start) % 3 == 0, "a split adds exactly 3 tokens"
        assert n + 3 > k or bool((sizes == 1).all()), "splits until the budget or the cells run out"


def test_initial_tiling_covers_border_remainders_with_smaller_squares():
    tiles = _tiling(5, 6, 8)
    assert sum(s * s for _, _, s in tiles) == 30 and (0, 0, 4) in tiles
    assert len(tiles) == len(set((y, x) for y, x, _ in tiles))


@pytest.mark.parametrize("criterion", ["variance", "entropy", "relevance"])
def test_quadtree_splits_where_the_importance_is(criterion):
    px = busy_corner()
    rel = edge_density(px, 4)  # busy corner is also where the relevance is
    p = quadtree_patches(rel, 4 + 3 * 6, criterion=criterion, pixels=px)
    y, x, s = p.boxes[0].unbind(-1)
    assert int(p.counts[0]) == 22 and set(s.tolist()) >= {8, 2}
    corner = (y < 8) & (x < 8)
    assert bool((s[~corner] == 8).all()), "the flat quarters stay coarse"
    assert bool((s[corner] < 8).all()) and int(corner.sum()) == 19


def test_quadtree_pads_images_with_fewer_leaves():
    valid = torch.zeros(2, 8, 8, dtype=torch.bool)
    valid[0], valid[1, :2, :2] = True, True
    p = quadtree_patches(torch.rand(2, 8, 8), 10, valid, criterion="relevance")
    assert p.counts.tolist() == [10, 4] and p.boxes[1, 4:].abs().sum() == 0
    assert torch.equal(p.mask(8, 8) > 0, valid)


def test_quadtree_errors_are_actionable():
    with pytest.raises(BudgetTooSmallError, match=r"K=3 is below the 4 starting squares") as small:
        quadtree_patches(torch.rand(1, 16, 16), 3, criterion="relevance")
    assert (small.value.k, small.value.minimum) == (3, 4) and isinstance(small.value, ValueError)
    with pytest.raises(ValueError, match="pass pixels"):
        quadtree_patches(torch.rand(1, 4, 4), 4, criterion="variance")
    holey = torch.ones(1, 4, 4, dtype=torch.bool)
    holey[0, 1, 1] = False
    with pytest.raises(ValueError, match="15 valid cells do not fill their 4x4 extent"):
        quadtree_patches(torch.rand(1, 4, 4), 8, holey, criterion="relevance")
    with pytest.raises(ValueError, match="criterion"):
        quadtree_patches(torch.rand(1, 4, 4), 4, criterion="gradient")


# ----------------------------------------------------------------------------- registry
@pytest.mark.parametrize("name", PATCHERS.names())
def test_every_patcher_keeps_its_budget_on_valid_cells(name):
    valid = torch.zeros(3, 12, 10, dtype=torch.bool)
    valid[0], valid[1, :8, :8], valid[2, :6, :4] = True, True, True  # a padded batch
    px = busy_corner(3, side=12)[..., :40]
    rel = torch.rand(3, 12, 10, generator=torch.Generator().manual_seed(1)).masked_fill(~valid, float("nan"))
    p = PATCHERS.get(name)(rel, 20, valid=valid, pixels=px)
    assert isinstance(p, Patches) and p.tokens <= 20 and bool((p.counts >= 1).all())
    assert_tiles(p, valid, {1, 2, 4, 8})


# ----------------------------------------------------------------------------- rendering and coverage
def test_constant_patch_renders_its_colour():
    px = torch.rand(3, 32, 32)
    px[:, 8:24, 8:24] = torch.tensor([0.25, 0.5, 0.75])[:, None, None]
    out = render_patches(px, torch.tensor([[1, 1, 2]]), 8)
    assert_close_reduction(out[:, 8:24, 8:24], px[:, 8:24, 8:24], **CANVAS)  # resampled: weights summing to 1


def test_size_one_patch_renders_the_original_pixels_exactly_over_the_background():
    px, bg = torch.rand(3, 16, 16), torch.rand(3, 16, 16)
    out = render_patches(px, torch.tensor([[1, 0, 1], [0, 0, 0]]), 8, background=bg)  # second row is padding
    assert torch.equal(out[:, 8:, :8], px[:, 8:, :8])
    assert torch.equal(out[:, :8], bg[:, :8]) and torch.equal(out[:, :, 8:], bg[:, :, 8:])


def test_size_two_patch_of_a_smooth_gradient_renders_close_to_it():
    ramp = torch.linspace(0, 1, 32)
    px = (ramp[:, None] * 0.5 + ramp[None, :] * 0.5).expand(3, 32, 32).contiguous()
    out = render_patches(px, torch.tensor([[0, 0, 2]]), 16)
    assert (out - px).abs().mean() < 0.02
    noise = torch.rand(3, 32, 32, generator=torch.Generator().manual_seed(0))
    assert (render_patches(noise, torch.tensor([[0, 0, 2]]), 16) - noise).abs().mean() > 0.15, "detail is lost"


def test_patch_coverage_splits_the_answer_by_resolution():
    boxes = torch.tensor([[[0, 0, 1], [0, 2, 2], [2, 0, 2]]])
    answer = torch.zeros(1, 4, 4, dtype=torch.bool)
    answer[0, 0, :4] = True
    answer[0, 3, 3] = True
    cover = patch_coverage(boxes, answer)
    assert {s: v.item() for s, v in cover.items()} == pytest.approx({0: 0.4, 1: 0.2, 2: 0.4})
    assert torch.allclose(sum(cover.values()), torch.ones(1))


def test_patches_mask_rejects_boxes_off_the_grid():
    with pytest.raises(ValueError, match="does not fit a 4x4"):
        Patches(torch.tensor([[[3, 3, 2]]]), torch.ones(1, 1)).mask(4, 4)


# ----------------------------------------------------------------------------- batching
@settings(max_examples=100, deadline=None)
@given(lengths=st.lists(st.integers(0, 50), max_size=30), max_tokens=st.integers(1, 120))
def test_buckets_keep_every_item_once_within_max_tokens(lengths, max_tokens):
    buckets = bucket_by_tokens(lengths, max_tokens)
    assert sorted(i for b in buckets for i in b) == list(range(len(lengths)))
    for b in buckets:
        assert len(b) * max(lengths[i] for i in b) <= max_tokens or len(b) == 1
    in_order = [lengths[i] for b in buckets for i in b]
    assert in_order == sorted(lengths), "buckets hold neighbours in length order"


def test_an_item_longer_than_max_tokens_gets_its_own_bucket():
    assert bucket_by_tokens([3, 100, 3, 4], 10) == [[0, 2], [3], [1]]
    with pytest.raises(ValueError, match="max_tokens >= 1"):
        bucket_by_tokens([1], 0)


def test_pad_tokens_masks_exactly_the_padding():
    items = [torch.randn(n, 4) for n in (3, 0, 5)]
    padded, mask = pad_tokens(items)
    assert padded.shape == (3, 5, 4) and mask.sum(1).tolist() == [3, 0, 5]
    for row, item, m in zip(padded, items, mask):
        assert torch.equal(row[m], item) and bool((row[~m] == 0).all())
    with pytest.raises(ValueError, match=r"\(2, 4\), \(2, 3\)"):
        pad_tokens([torch.zeros(2, 4), torch.zeros(2, 3)])


# ----------------------------------------------------------------------------- saliency maps
def test_attention_saliency_peaks_on_the_attended_token():
    b, heads, gh, gw = 2, 4, 3, 5
    n = 1 + gh * gw  # CLS first
    attn = torch.full((b, heads, n, n), 0.5 / (n - 1))
    attn[..., 1 + 7] = 0.5  # every query attends patch 7 = cell (1, 2)
    sal = attention_saliency(attn, (gh, gw))
    assert sal.shape == (b, gh, gw) and [divmod(int(i), gw) for i in sal.flatten(1).argmax(1)] == [(1, 2)] * b
    cls_row = attn[:, 0, 0]  # [B, N]
    assert torch.equal(attention_saliency(cls_row, (gh, gw)).flatten(1).argmax(1), torch.tensor([7, 7]))
    with pytest.raises(ValueError, match="N=16 tokens, fewer than the 4x5 grid's 20"):
        attention_saliency(attn, (4, 5))


def test_edge_density_is_high_on_a_checkerboard_and_zero_on_flat():
    px = torch.full((1, 3, 32, 64), 0.3)
    board = ((torch.arange(32)[:, None] // 4 + torch.arange(32) // 4) % 2).float()
    px[..., 32:] = board
    dens = edge_density(px, 16)
    assert dens.shape == (1, 2, 4)
    assert bool((dens[0, :, 0] == 0).all()) and bool((dens[0, :, 3] > 0.5).all())


def test_the_quadtree_entry_starts_coarser_when_the_budget_is_small():
    from arr_coc.allocators.patching import PATCHERS

    rel = torch.rand(1, 55, 39, generator=torch.Generator().manual_seed(0))
    patches = PATCHERS.get("quadtree")(rel, 170)  # 183 squares to start with at 8 cells, 165 at 16
    assert int(patches.counts[0]) <= 170
    sizes = patches.mask(55, 39)
    assert (sizes > 0).all() and int(sizes.max()) > 8  # the page is tiled, with leaves above 8 cells
