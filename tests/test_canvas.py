"""Tests for arr_coc.engine.canvas: smart_resize, make_canvas (loading itself: test_imageio.py)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from PIL import Image
from tolerances import CANVAS, assert_close_reduction

from arr_coc.engine.canvas import MAX_PIXELS, MIN_PIXELS, Canvas, make_canvas, smart_resize

# --- smart_resize ---------------------------------------------------------------------------------


def test_smart_resize_known_values():
    assert smart_resize(1344, 1344) == (1344, 1344)  # already whole cells: unchanged
    assert smart_resize(1000, 700) == (1008, 700)  # nearest multiples of 28
    assert smart_resize(4000, 3000, max_pixels=1344 * 1344) == (1540, 1148)  # scaled down together
    assert smart_resize(30, 30) == (56, 56)  # scaled up to MIN_PIXELS
    assert smart_resize(100, 100, cell=32) == (96, 96)


@settings(max_examples=300, deadline=None)
@given(
    height=st.integers(1, 6000),
    width=st.integers(1, 6000),
    cell=st.sampled_from([14, 28, 32]),
    max_tokens=st.sampled_from([64, 256, 1280, 4096]),
)
@example(height=15, width=2808, cell=14, max_tokens=256)  # rounding once carried the aspect past the cap
def test_smart_resize_gives_whole_cells_within_bounds_and_keeps_aspect(height, width, cell, max_tokens):
    if max(height, width) / min(height, width) > 200:
        return
    max_pixels = max_tokens * cell * cell
    min_pixels = min(MIN_PIXELS, max_pixels)
    h, w = smart_resize(height, width, cell, min_pixels, max_pixels)
    assert h % cell == 0 and w % cell == 0 and h >= cell and w >= cell
    assert min_pixels <= h * w <= max_pixels
    # Each side is off its ideal (common-scale) length by less than one cell, except where a side
    # was clamped to one cell; so the per-axis scales differ by at most one cell per side.
    if h > cell and w > cell:
        assert abs(h / height - w / width) <= cell / height + cell / width + 1e-9
    # A canvas size is a fixed point: this is what lets aligned images pass through untouched.
    assert smart_resize(h, w, cell, min_pixels, max_pixels) == (h, w)


def test_smart_resize_defaults_bound_tokens_to_4096_and_at_least_4():
    assert MAX_PIXELS // 28**2 == 4096 and MIN_PIXELS // 28**2 == 4
    h, w = smart_resize(10000, 7000)
    assert h * w <= MAX_PIXELS and (h // 28) * (w // 28) <= 4096


@pytest.mark.parametrize("hw", [(28, 28 * 201), (6000, 29)])
def test_smart_resize_rejects_extreme_aspect(hw):
    with pytest.raises(ValueError, match=r"aspect ratio 20\d\.\d exceeds 200; crop it"):
        smart_resize(*hw)


def test_smart_resize_extreme_but_allowed_aspect_stays_within_max():
    h, w = smart_resize(28, 28 * 200, max_pixels=64 * 28 * 28)
    assert (h, w) == (28, 64 * 28)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(height=0, width=10), "height must be a positive integer, got 0"),
        (dict(height=10, width=2.5), "width must be a positive integer, got 2.5"),
        (dict(height=10, width=10, cell=0), "cell must be a positive integer"),
        (dict(height=10, width=10, max_pixels=100), "cell \\* cell <= max_pixels"),
        (dict(height=10, width=10, min_pixels=5000, max_pixels=4000), "min_pixels <= max_pixels"),
        (dict(height=100, width=300, min_pixels=7 * 784, max_pixels=7 * 784), "widen the bounds"),
    ],
)
def test_smart_resize_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        smart_resize(**kwargs)


# --- make_canvas ----------------------------------------------------------------------------------


def test_batch_of_different_sizes_pads_bottom_right_with_zeros_and_marks_valid_cells():
    a, b = torch.rand(3, 56, 84), torch.rand(3, 112, 28)
    c = make_canvas([a, b], min_pixels=28 * 28)
    assert isinstance(c, Canvas)
    assert c.pixels.shape == (2, 3, 112, 84) and c.grid == (4, 3) and c.batch_size == 2
    assert c.sizes == [(56, 84), (112, 28)] and c.image_sizes == [(56, 84), (112, 28)]
    assert c.full_tokens == [6, 4] and c.full_tokens == c.valid.sum((1, 2)).tolist()
    assert c.valid[0].int().tolist() == [[1, 1, 1], [1, 1, 1], [0, 0, 0], [0, 0, 0]]
    assert c.valid[1].int().tolist() == [[1, 0, 0]] * 4
    assert torch.equal(c.pixels[0, :, :56, :84], a) and torch.equal(c.pixels[1, :, :, :28], b)
    assert c.pixels[0, :, 56:].abs().sum() == 0 and c.pixels[1, :, :, 28:].abs().sum() == 0


def test_cell_aligned_images_pass_through_bit_exactly(tmp_path):
    x = torch.rand(3, 84, 140)
    assert torch.equal(make_canvas(x).pixels[0], x)
    arr = np.random.default_rng(0).integers(0, 256, (84, 140, 3), dtype=np.uint8)
    Image.fromarray(arr).save(tmp_path / "a.png")
    pixels = make_canvas(tmp_path / "a.png").pixels[0]
    assert torch.equal(pixels, torch.from_numpy(arr).permute(2, 0, 1).float() / 255)


def test_other_sizes_are_resized_to_their_smart_resize_canvas():
    c = make_canvas([torch.full((3, 100, 61), 0.3), torch.rand(3, 1000, 700)], cell=32)
    assert c.sizes == [smart_resize(100, 61, 32), smart_resize(1000, 700, 32)] == [(96, 64), (992, 704)]
    assert c.image_sizes == [(100, 61), (1000, 700)]
    assert_close_reduction(c.pixels[0, :, :96, :64], torch.full((3, 96, 64), 0.3), **CANVAS)  # a flat page stays flat
    assert 0.0 <= float(c.pixels.min()) and float(c.pixels.max()) <= 1.0
    assert c.scales[0] == pytest.approx((96 / 100, 64 / 61))


def test_batched_tensor_equals_the_same_images_as_a_list():
    x = torch.rand(3, 3, 90, 130)  # -> 84 x 140 (nearest whole cells)
    batched, listed = make_canvas(x), make_canvas(list(x))
    assert_close_reduction(batched.pixels, listed.pixels, **CANVAS)
    assert torch.equal(batched.valid, listed.valid) and batched.sizes == listed.sizes == [(84, 140)] * 3
    u8 = make_canvas((x * 255).round().to(torch.uint8))
    assert u8.pixels.dtype == torch.float32 and u8.pixels.shape == (3, 3, 84, 140)


def test_mixed_sources_form_one_batch(tmp_path):
    Image.new("L", (60, 30), 255).save(tmp_path / "g.png")
    c = make_canvas([tmp_path / "g.png", np.zeros((28, 28, 4), np.uint8), Image.new("CMYK", (56, 56))])
    # 30x60 is only 2 cells, below MIN_PIXELS (4 cells), so it is scaled up with its aspect kept
    assert c.batch_size == 3 and c.sizes == [(56, 84), (56, 56), (56, 56)] and c.grid == (2, 3)
    assert c.image_sizes == [(30, 60), (28, 28), (56, 56)] and float(c.pixels[0, :, :56, :84].min()) == 1.0
    assert float(c.pixels[1, :, :56, :56].min()) == 1.0  # transparent -> white paper


def test_gradients_flow_through_the_resize():
    x = torch.rand(1, 3, 50, 70, requires_grad=True)
    make_canvas(x).pixels.sum().backward()
    assert x.grad is not None and float(x.grad.abs().sum()) > 0


def test_image_smaller_than_one_cell_raises():
    with pytest.raises(ValueError, match="image is 20x15 px, smaller than one 28 px token cell"):
        make_canvas(torch.rand(3, 20, 15))
    with pytest.raises(ValueError, match="image 1 is 27x40 px, smaller than one 28 px token cell"):
        make_canvas([torch.rand(3, 28, 28), torch.rand(3, 27, 40)])
    with pytest.raises(ValueError, match="image is 31x31 px, smaller than one 32 px"):
        make_canvas(torch.rand(2, 3, 31, 31), cell=32)


def test_empty_batch_raises():
    with pytest.raises(ValueError, match="empty list of images"):
        make_canvas([])
    with pytest.raises(ValueError, match=r"shape \(0, 3, 28, 28\); expected \[B, 3, H, W\] with B >= 1"):
        make_canvas(torch.zeros(0, 3, 28, 28))


def test_batched_tensor_errors_name_the_problem():
    with pytest.raises(ValueError, match="contains NaN"):
        make_canvas(torch.full((2, 3, 28, 28), float("nan")))
    with pytest.raises(ValueError, match=r"outside \[0, 1\]"):
        make_canvas(torch.full((2, 3, 28, 28), 2.0))


def test_extreme_aspect_image_raises_from_make_canvas():
    with pytest.raises(ValueError, match="aspect ratio .* exceeds 200"):
        make_canvas(np.zeros((28, 28 * 250), np.uint8))


def test_canvas_rejects_inconsistent_fields():
    pixels = torch.zeros(1, 3, 56, 56)
    with pytest.raises(ValueError, match=r"valid must be bool \[1, 2, 2\], got torch.bool \(1, 3, 3\)"):
        Canvas(pixels, torch.ones(1, 3, 3, dtype=torch.bool), [(56, 56)], [(56, 56)], 28)
    with pytest.raises(ValueError, match="multiples of cell=28"):
        Canvas(torch.zeros(1, 3, 50, 56), torch.ones(1, 1, 2, dtype=torch.bool), [(50, 56)], [(50, 56)], 28)
    with pytest.raises(ValueError, match="one image_sizes and sizes entry per image"):
        Canvas(pixels, torch.ones(1, 2, 2, dtype=torch.bool), [], [(56, 56)], 28)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(28, 200), st.integers(28, 200)), min_size=1, max_size=4))
def test_valid_marks_exactly_each_images_cells_and_padding_is_zero(hw):
    c = make_canvas([torch.rand(3, h, w) * 0.5 + 0.5 for h, w in hw])  # strictly positive pixels
    assert c.image_sizes == hw and c.sizes == [smart_resize(h, w) for h, w in hw]
    assert c.valid.sum((1, 2)).tolist() == c.full_tokens
    cell_has_pixels = c.pixels.amax(1).unflatten(1, (c.grid[0], 28)).unflatten(3, (c.grid[1], 28)).amax((2, 4)) > 0
    assert torch.equal(cell_has_pixels, c.valid)  # [B, Hc, Wc]
