"""Tests for arr_coc.engine.extract: the three pixel extractors agree, features slice, patches paste back."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tolerances import assert_close_reduction

from arr_coc.engine.extract import (
    EXTRACTORS,
    extract_gather,
    extract_grid_sample,
    extract_loop,
    paste_patches,
    slice_features,
)
from arr_coc.registry import UnknownNameError


def random_positions(B: int, K: int, Hc: int, Wc: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    flat = torch.stack([torch.randperm(Hc * Wc, generator=g)[:K] for _ in range(B)])  # [B, K]
    return torch.stack((flat // Wc, flat % Wc), dim=-1)  # [B, K, 2] (y, x) cells


def assert_sampled(got, ref, px):
    """grid_sample against the pixels it should read: 4 bilinear taps whose weights carry the rounding of the
    normalised coordinate, which in pixels is that rounding times the side (so the scale is side x max pixel)."""
    assert_close_reduction(got, ref, reduction_len=4, depth=2, scale=max(px.shape[-2:]) * float(px.abs().max()))


@pytest.fixture
def image() -> torch.Tensor:
    return torch.rand(2, 3, 5 * 4, 7 * 4, generator=torch.Generator().manual_seed(1))  # Hc=5, Wc=7, cell=4


def test_loop_crops_the_documented_pixel_square(image):
    pos = torch.tensor([[[2, 3], [4, 6]], [[0, 0], [1, 5]]])
    out = extract_loop(image, pos, 4)
    assert out.shape == (2, 2, 3, 4, 4)
    assert torch.equal(out[0, 1], image[0, :, 16:20, 24:28])
    assert torch.equal(out[1, 1], image[1, :, 4:8, 20:24])


def test_gather_equals_loop_exactly(image):
    pos = random_positions(2, 20, 5, 7)
    assert torch.equal(extract_gather(image, pos, 4), extract_loop(image, pos, 4))


def test_gather_reads_the_last_row_and_column(image):
    pos = torch.tensor([[[4, 6], [4, 0], [0, 6]]] * 2)
    out = extract_gather(image, pos, 4)
    assert torch.equal(out[1, 0], image[1, :, 16:20, 24:28])
    assert torch.equal(out[0, 1], image[0, :, 16:20, 0:4])
    assert torch.equal(out[0, 2], image[0, :, 0:4, 24:28])
    assert torch.equal(out, extract_loop(image, pos, 4))


@pytest.mark.parametrize(
    "make",
    [
        lambda x: x.transpose(2, 3).contiguous().transpose(2, 3),  # same values, W-major strides
        lambda x: torch.stack([x, x], dim=2).flatten(1, 2)[:, ::2],  # channel-strided slice
        lambda x: torch.nn.functional.pad(x, (2, 1, 1, 1))[..., 1:-1, 2:-1],  # crop of a larger image
        lambda x: x.contiguous(memory_format=torch.channels_last),
    ],
)
def test_gather_gives_the_same_result_on_non_contiguous_pixels(image, make):
    strided = make(image)
    assert not strided.is_contiguous() and torch.equal(strided, image)
    pos = random_positions(2, 9, 5, 7, seed=3)
    assert torch.equal(extract_gather(strided, pos, 4), extract_loop(image, pos, 4))
    assert_sampled(extract_grid_sample(strided, pos.float(), 4), extract_loop(image, pos, 4), image)


def test_gather_accepts_integral_float_positions_and_empty_budgets(image):
    pos = random_positions(2, 6, 5, 7)
    assert torch.equal(extract_gather(image, pos.float(), 4), extract_gather(image, pos, 4))
    empty = torch.zeros(2, 0, 2, dtype=torch.long)
    for name in EXTRACTORS:
        assert EXTRACTORS.get(name)(image, empty, 4).shape == (2, 0, 3, 4, 4)


def test_gather_passes_gradients_to_pixels(image):
    px = image.clone().requires_grad_(True)
    pos = torch.tensor([[[1, 1], [2, 2]], [[0, 0], [0, 0]]])
    extract_gather(px, pos, 4).sum().backward()
    assert px.grad[0, :, 4:12, 4:12].sum() == 2 * 3 * 16  # two distinct cells of image 0
    assert px.grad[1, :, 0:4, 0:4].unique().tolist() == [2.0]  # cell (0, 0) read twice


@pytest.mark.parametrize("dtype,size", [(torch.float32, (2, 3, 20, 28)), (torch.float64, (1, 3, 224, 224))])
def test_grid_sample_at_integer_positions_reproduces_the_crop(dtype, size):
    px = torch.rand(*size, generator=torch.Generator().manual_seed(2), dtype=dtype)
    cell = 4 if size[-1] == 28 else 28
    pos = random_positions(size[0], 8, size[2] // cell, size[3] // cell, seed=5)
    out = extract_grid_sample(px, pos.to(dtype), cell)
    assert out.dtype == dtype and out.is_contiguous()
    assert (out - extract_gather(px, pos, cell)).abs().max() < 1e-6


def test_grid_sample_half_cell_shift_averages_neighbouring_rows():
    px = torch.arange(16.0).view(1, 1, 4, 4)
    out = extract_grid_sample(px, torch.tensor([[[0.25, 0.0]]]), 2)[0, 0, 0]  # 0.5 px down
    assert_sampled(out, torch.tensor([[2.0, 3.0], [6.0, 7.0]]), px)


def test_grid_sample_padding_modes_fill_the_outside_part_of_a_patch():
    px = torch.arange(1.0, 17.0).view(1, 1, 4, 4)
    pos = torch.tensor([[[-0.5, 0.0]]])  # the top pixel row of the 2x2 patch lies above the image
    border = extract_grid_sample(px, pos, 2, padding_mode="border")[0, 0, 0]
    zeros = extract_grid_sample(px, pos, 2, padding_mode="zeros")[0, 0, 0]
    assert_sampled(border, torch.tensor([[1.0, 2.0], [1.0, 2.0]]), px)
    assert_sampled(zeros, torch.tensor([[0.0, 0.0], [1.0, 2.0]]), px)


def test_grid_sample_passes_gradients_to_float_positions_and_pixels():
    g = torch.Generator().manual_seed(4)
    px = torch.rand(2, 2, 6, 9, generator=g, dtype=torch.float64, requires_grad=True)
    # sub-cell positions whose samples fall strictly between pixel centres (bilinear is smooth there)
    pos = torch.tensor(
        [[[0.3, 0.45], [1.1, 1.7], [0.62, 0.05]], [[1.45, 2.2], [0.7, 0.9], [0.2, 1.35]]],
        dtype=torch.float64,
        requires_grad=True,
    )
    assert torch.autograd.gradcheck(lambda p, x: extract_grid_sample(x, p, 3), (pos, px))
    extract_grid_sample(px, pos, 3).sum().backward()
    assert pos.grad.abs().sum() > 0


def test_slice_features_equals_manual_indexing():
    feats = torch.rand(3, 4, 5, 6, generator=torch.Generator().manual_seed(6))  # [B, Hc, Wc, D]
    pos = random_positions(3, 7, 4, 5, seed=7)
    out = slice_features(feats, pos)
    expected = torch.stack([torch.stack([feats[b, y, x] for y, x in pos[b].tolist()]) for b in range(3)])
    assert out.shape == (3, 7, 6) and torch.equal(out, expected)
    assert torch.equal(slice_features(feats, torch.tensor([[[3, 4]]] * 3))[:, 0], feats[:, 3, 4])


def test_paste_round_trips_with_gather(image):
    pos = random_positions(2, 12, 5, 7, seed=8)
    patches = extract_gather(image, pos, 4)
    canvas = torch.zeros_like(image)
    pasted = paste_patches(canvas, patches, pos, 4)
    assert canvas.abs().sum() == 0  # the input canvas is not modified
    assert torch.equal(extract_gather(pasted, pos, 4), patches)
    chosen = torch.zeros(2, 5, 7, dtype=torch.bool)
    chosen[torch.arange(2)[:, None], pos[..., 0], pos[..., 1]] = True
    mask = chosen.repeat_interleave(4, 1).repeat_interleave(4, 2)[:, None].expand_as(image)  # [B, C, H, W]
    assert torch.equal(pasted[mask], image[mask]) and pasted[~mask].abs().sum() == 0


def test_paste_into_a_non_contiguous_canvas_and_back_gives_gradients(image):
    canvas = image.transpose(2, 3).contiguous().transpose(2, 3).requires_grad_(True)
    patches = torch.ones(2, 1, 3, 4, 4, requires_grad=True)
    pos = torch.tensor([[[4, 6]], [[0, 0]]])
    out = paste_patches(canvas, patches, pos, 4)
    assert torch.equal(out[0, :, 16:20, 24:28], torch.ones(3, 4, 4))
    out.sum().backward()
    assert canvas.grad.sum() == image.numel() - 2 * 3 * 16 and patches.grad.sum() == 2 * 3 * 16


@pytest.mark.parametrize("name", EXTRACTORS.names())
def test_every_registered_extractor_matches_the_loop_reference(name, image):
    pos = random_positions(2, 5, 5, 7, seed=9)
    out = EXTRACTORS.get(name)(image, pos, 4)
    assert_sampled(out, extract_loop(image, pos, 4), image)


def test_registry_names_and_unknown_method():
    assert set(EXTRACTORS.names()) == {"loop", "gather", "grid_sample"}
    with pytest.raises(UnknownNameError, match="known: loop, gather, grid_sample"):
        EXTRACTORS.get("bicubic_crop")


@given(
    B=st.integers(1, 3),
    C=st.integers(1, 4),
    Hc=st.integers(1, 6),
    Wc=st.integers(1, 6),
    cell=st.integers(1, 5),
    data=st.data(),
)
@settings(max_examples=60, deadline=None)
def test_gather_equals_loop_for_any_sizes_and_positions(B, C, Hc, Wc, cell, data):
    K = data.draw(st.integers(0, 10))
    ys = data.draw(st.lists(st.integers(0, Hc - 1), min_size=B * K, max_size=B * K))
    xs = data.draw(st.lists(st.integers(0, Wc - 1), min_size=B * K, max_size=B * K))
    pos = torch.stack((torch.tensor(ys, dtype=torch.long), torch.tensor(xs, dtype=torch.long)), -1).view(B, K, 2)
    px = torch.randn(B, C, Hc * cell, Wc * cell)
    out = extract_gather(px, pos, cell)
    assert torch.equal(out, extract_loop(px, pos, cell))
    assert torch.equal(extract_gather(paste_patches(torch.zeros_like(px), out, pos, cell), pos, cell), out)


# ----------------------------------------------------------------------------- errors
PX = torch.zeros(2, 3, 8, 12)  # cell 4 -> Hc=2, Wc=3


@pytest.mark.parametrize("fn", [extract_loop, extract_gather, extract_grid_sample])
def test_pixel_extractors_reject_bad_shapes(fn):
    ok = torch.zeros(2, 1, 2, dtype=torch.long)
    with pytest.raises(ValueError, match=r"positions must be a \[B, K, 2\].*got \(2, 2\)"):
        fn(PX, torch.zeros(2, 2), 4)
    with pytest.raises(ValueError, match=r"got \(2, 1, 3\)"):
        fn(PX, torch.zeros(2, 1, 3), 4)
    with pytest.raises(ValueError, match="batch mismatch: positions has B=3 but pixels has B=2"):
        fn(PX, torch.zeros(3, 1, 2, dtype=torch.long), 4)
    with pytest.raises(ValueError, match=r"pixels must be a \[B, C, H, W\] tensor, got \(3, 8, 12\)"):
        fn(PX[0], ok, 4)
    with pytest.raises(ValueError, match="pixels H=8, W=12 are not multiples of cell=5"):
        fn(PX, ok, 5)
    with pytest.raises(ValueError, match="cell must be a positive int"):
        fn(PX, ok, 0)
    with pytest.raises(TypeError, match="dtype torch.bool"):
        fn(PX, ok.bool(), 4)


@pytest.mark.parametrize("fn", [extract_loop, extract_gather])
def test_integer_extractors_reject_fractional_and_out_of_grid_positions(fn):
    frac = torch.tensor([[[0.0, 1.0]], [[1.0, 0.5]]])
    with pytest.raises(ValueError, match=rf"{fn.__name__} needs integer.*\(y=1.0, x=0.5\) at batch 1, saccade 0"):
        fn(PX, frac, 4)
    with pytest.raises(ValueError, match="needs integer"):
        fn(PX, torch.full((2, 1, 2), float("nan")), 4)
    bad = torch.tensor([[[0, 0], [1, 3]], [[0, 0], [0, 0]]])
    with pytest.raises(ValueError, match=r"batch 0, saccade 1: cell \(y=1, x=3\).*Hc=2 x Wc=3 cells"):
        fn(PX, bad, 4)
    with pytest.raises(ValueError, match=r"cell \(y=-1, x=0\)"):
        fn(PX, torch.tensor([[[-1, 0]], [[0, 0]]]), 4)


def test_grid_sample_rejects_unknown_modes_and_integer_pixels():
    pos = torch.zeros(2, 1, 2)
    with pytest.raises(ValueError, match="mode must be one of.*got 'area'"):
        extract_grid_sample(PX, pos, 4, mode="area")
    with pytest.raises(ValueError, match="padding_mode must be one of.*got 'wrap'"):
        extract_grid_sample(PX, pos, 4, padding_mode="wrap")
    with pytest.raises(TypeError, match="needs float pixels, got dtype torch.uint8"):
        extract_grid_sample(PX.to(torch.uint8), pos, 4)


def test_slice_features_rejects_bad_shapes_and_positions():
    feats = torch.zeros(2, 2, 3, 5)
    with pytest.raises(ValueError, match=r"features must be a \[B, Hc, Wc, D\].*got \(2, 6, 5\)"):
        slice_features(feats.flatten(1, 2), torch.zeros(2, 1, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="positions has B=1 but features has B=2"):
        slice_features(feats, torch.zeros(1, 1, 2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"slice_features: position out of bounds.*cell \(y=2, x=0\).*Hc=2 x Wc=3"):
        slice_features(feats, torch.tensor([[[0, 0]], [[2, 0]]]))
    with pytest.raises(ValueError, match="slice_features needs integer"):
        slice_features(feats, torch.full((2, 1, 2), 0.5))


def test_paste_rejects_mismatched_patches_and_positions():
    pos = torch.zeros(2, 1, 2, dtype=torch.long)
    with pytest.raises(ValueError, match=r"patches must be \[B, K, C, cell, cell\] = \(2, 1, 3, 4, 4\), got \(2, 1, 3, 2"):
        paste_patches(PX, torch.zeros(2, 1, 3, 2, 2), pos, 4)
    with pytest.raises(TypeError, match="patches dtype torch.float64 differs from canvas dtype torch.float32"):
        paste_patches(PX, torch.zeros(2, 1, 3, 4, 4, dtype=torch.float64), pos, 4)
    with pytest.raises(ValueError, match="positions has B=1 but canvas has B=2"):
        paste_patches(PX, torch.zeros(1, 1, 3, 4, 4), pos[:1], 4)
    with pytest.raises(ValueError, match=r"paste_patches: position out of bounds.*cell \(y=0, x=3\)"):
        paste_patches(PX, torch.zeros(2, 1, 3, 4, 4), torch.tensor([[[0, 3]], [[0, 0]]]), 4)
