"""Tests for arr_coc.canvas: loading any image to [3, H, W] in [0, 1], smart_resize, make_canvas."""
from __future__ import annotations


import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from PIL import Image

from arr_coc.canvas import MAX_PIXELS, MIN_PIXELS, Canvas, load_image, make_canvas, smart_resize

W, H = 5, 3  # PIL sizes are (width, height); non-square so a swapped axis shows


def _rgb(x: torch.Tensor) -> list[float]:
    """The colour of a constant [3, H, W] image."""
    assert x.shape == (3, H, W) and x.dtype == torch.float32
    flat = x.reshape(3, -1)
    assert torch.equal(flat, flat[:, :1].expand_as(flat)), "image is not constant"
    return flat[:, 0].tolist()


def _palette(transparent: bool) -> Image.Image:
    img = Image.new("P", (W, H), 1)
    img.putpalette([0, 0, 0, 10, 20, 30] + [0] * 762)
    if transparent:
        img.info["transparency"] = 1
    return img


# (PIL image, expected RGB in [0, 1])
PIL_CASES = {
    "1-on": (Image.new("1", (W, H), 1), [1.0, 1.0, 1.0]),
    "1-off": (Image.new("1", (W, H), 0), [0.0, 0.0, 0.0]),
    "L": (Image.new("L", (W, H), 128), [128 / 255] * 3),
    "LA-opaque": (Image.new("LA", (W, H), (128, 255)), [128 / 255] * 3),
    "LA-transparent": (Image.new("LA", (W, H), (128, 0)), [1.0, 1.0, 1.0]),
    "P": (_palette(transparent=False), [10 / 255, 20 / 255, 30 / 255]),
    "P-transparency-key": (_palette(transparent=True), [1.0, 1.0, 1.0]),
    "RGB": (Image.new("RGB", (W, H), (10, 20, 30)), [10 / 255, 20 / 255, 30 / 255]),
    "RGBA-opaque": (Image.new("RGBA", (W, H), (10, 20, 30, 255)), [10 / 255, 20 / 255, 30 / 255]),
    "RGBA-transparent": (Image.new("RGBA", (W, H), (10, 20, 30, 0)), [1.0, 1.0, 1.0]),
    "RGBA-half": (
        Image.new("RGBA", (W, H), (200, 0, 0, 128)),
        [200 / 255 * 128 / 255 + 1 - 128 / 255] + [1 - 128 / 255] * 2,
    ),
    "I;16": (Image.new("I;16", (W, H), 65535), [1.0, 1.0, 1.0]),
    "I;16-mid": (Image.new("I;16", (W, H), 32768), [32768 / 65535] * 3),
    "I;16B": (Image.new("I;16B", (W, H), 65535), [1.0, 1.0, 1.0]),
    "I;16L": (Image.new("I;16L", (W, H), 1000), [1000 / 65535] * 3),
    "I": (Image.new("I", (W, H), 65535), [1.0, 1.0, 1.0]),
    "F": (Image.new("F", (W, H), 0.25), [0.25, 0.25, 0.25]),
    "CMYK-red": (Image.new("CMYK", (W, H), (0, 255, 255, 0)), [1.0, 0.0, 0.0]),
    "CMYK-black": (Image.new("CMYK", (W, H), (0, 0, 0, 255)), [0.0, 0.0, 0.0]),
    "CMYK-white": (Image.new("CMYK", (W, H), (0, 0, 0, 0)), [1.0, 1.0, 1.0]),
}


@pytest.mark.parametrize("name", list(PIL_CASES))
def test_every_pil_mode_loads_as_rgb_in_unit_range_with_known_values(name):
    img, expected = PIL_CASES[name]
    assert _rgb(load_image(img)) == pytest.approx(expected, abs=1e-6)


def test_exif_orientation_6_rotates_a_jpeg_and_swaps_its_shape(tmp_path):
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 CW to display": phone photos of documents
    path = tmp_path / "page.jpg"
    Image.new("RGB", (40, 20), (200, 200, 200)).save(path, exif=exif)
    assert load_image(path).shape == (3, 40, 20)
    assert load_image(Image.open(path)).shape == (3, 40, 20)


def test_exif_orientation_6_moves_the_top_left_pixel_to_the_top_right(tmp_path):
    exif = Image.Exif()
    exif[0x0112] = 6
    img = Image.new("RGB", (3, 2))
    img.putpixel((0, 0), (255, 0, 0))
    img.save(tmp_path / "o.png", exif=exif)  # PNG: lossless, so the marker is exact
    red = load_image(tmp_path / "o.png")[0]
    assert red.tolist() == [[0.0, 1.0], [0.0, 0.0], [0.0, 0.0]]


def test_files_load_from_str_and_path_including_16_bit_png(tmp_path):
    Image.new("RGB", (W, H), (10, 20, 30)).save(tmp_path / "a.png")
    Image.new("I;16", (W, H), 65535).save(tmp_path / "b.png")
    assert _rgb(load_image(str(tmp_path / "a.png"))) == pytest.approx([10 / 255, 20 / 255, 30 / 255])
    assert _rgb(load_image(tmp_path / "b.png")) == [1.0, 1.0, 1.0]


@pytest.mark.parametrize(
    "arr, expected",
    [
        (np.full((H, W), 128, np.uint8), [128 / 255] * 3),
        (np.full((H, W, 1), 51, np.uint8), [0.2] * 3),
        (np.full((H, W, 3), (10, 20, 30), np.uint8), [10 / 255, 20 / 255, 30 / 255]),
        (np.full((H, W, 4), (10, 20, 30, 0), np.uint8), [1.0, 1.0, 1.0]),
        (np.full((H, W), 65535, np.uint16), [1.0] * 3),
        (np.full((H, W), 65535, ">u2"), [1.0] * 3),
        (np.ones((H, W), bool), [1.0] * 3),
        (np.full((H, W, 3), (0.0, 0.5, 1.0), np.float64), [0.0, 0.5, 1.0]),
        (np.full((H, W), 0.25, np.float16), [0.25] * 3),
    ],
    ids=["u8-HW", "u8-HW1", "u8-HW3", "u8-HW4-transparent", "u16", "u16-big-endian", "bool", "f64", "f16"],
)
def test_numpy_dtypes_and_layouts_load_with_known_values(arr, expected):
    assert _rgb(load_image(arr)) == pytest.approx(expected, abs=1e-6)


def test_non_contiguous_numpy_keeps_pixel_positions():
    arr = np.arange(H * W, dtype=np.uint8).reshape(H, W)[::-1, ::-1]  # negative strides
    x = load_image(arr)
    assert x.is_contiguous() and x[1].tolist() == (arr / 255).astype(np.float32).tolist()


def test_torch_float_image_passes_through_unchanged_and_uint8_is_scaled():
    x = torch.rand(3, H, W)
    assert load_image(x) is x
    assert torch.equal(load_image(torch.full((1, H, W), 255, dtype=torch.uint8)), torch.ones(3, H, W))
    assert load_image(x.double()).dtype == torch.float32


# --- load_image errors --------------------------------------------------------------------------


def test_missing_file_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"not found: .*nope\.png"):
        load_image(tmp_path / "nope.png")


def test_a_file_that_is_not_an_image_names_the_path(tmp_path):
    (tmp_path / "notes.png").write_text("not pixels")
    with pytest.raises(ValueError, match=r"cannot read .*notes\.png.* as an image"):
        load_image(tmp_path / "notes.png")


def test_a_truncated_image_file_names_the_path(tmp_path):
    Image.new("RGB", (64, 64), (1, 2, 3)).save(tmp_path / "t.png")
    data = (tmp_path / "t.png").read_bytes()
    (tmp_path / "t.png").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"t\.png"):
        load_image(tmp_path / "t.png")


def test_a_directory_is_not_an_image(tmp_path):
    with pytest.raises(ValueError, match="is a directory"):
        load_image(tmp_path)


@pytest.mark.parametrize(
    "src",
    [np.zeros((0, 5), np.uint8), Image.new("RGB", (0, 4)), torch.zeros(3, 4, 0)],
    ids=["numpy", "pil", "tensor"],
)
def test_zero_size_image_raises(src):
    with pytest.raises(ValueError, match="zero size"):
        load_image(src)


@pytest.mark.parametrize("bad, kind", [(float("nan"), "NaN"), (float("inf"), "inf"), (-float("inf"), "inf")])
@pytest.mark.parametrize("as_tensor", [False, True])
def test_non_finite_values_raise(bad, kind, as_tensor):
    arr = np.full((3, H, W), 0.5, np.float32)
    arr[1, 2, 3] = bad
    src = torch.from_numpy(arr) if as_tensor else arr.transpose(1, 2, 0)
    with pytest.raises(ValueError, match=f"contains {kind} values \\(1 of 45\\)"):
        load_image(src)


@pytest.mark.parametrize("as_tensor", [False, True])
def test_float_outside_unit_range_raises_and_says_to_scale(as_tensor):
    arr = np.full((H, W, 3), 200.0, np.float32)
    src = torch.from_numpy(arr).permute(2, 0, 1) if as_tensor else arr
    with pytest.raises(ValueError, match=r"values in \[200, 200\], outside \[0, 1\].*divide 0-255 data by 255"):
        load_image(src)


def test_pil_float_mode_outside_unit_range_raises():
    with pytest.raises(ValueError, match=r"outside \[0, 1\]"):
        load_image(Image.new("F", (W, H), 3.0))


def test_pil_int_mode_outside_16_bit_range_raises():
    with pytest.raises(ValueError, match=r"mode 'I' has values in \[70000, 70000\]"):
        load_image(Image.new("I", (W, H), 70000))


@pytest.mark.parametrize(
    "src, match",
    [
        (np.zeros((H, W, 5), np.uint8), r"shape \(3, 5, 5\); expected \(H, W\) or \(H, W, C\) with C in 1, 3, 4"),
        (np.zeros((3, 40, 50), np.uint8), r"looks channel-first, use arr.transpose\(1, 2, 0\)"),
        (np.zeros((2, H, W, 3), np.uint8), r"4 dims \(shape \(2, 3, 5, 3\)\).*make_canvas"),
        (np.zeros(7, np.uint8), r"1 dims"),
        (torch.zeros(40, 50, 3), r"shape \(40, 50, 3\).*channel-last, use x.permute\(2, 0, 1\)"),
        (torch.zeros(H, W), r"shape \(3, 5\); expected \[3, H, W\]"),
        (torch.zeros(2, 3, H, W), r"for a batch use make_canvas"),
    ],
    ids=["HW5", "CHW-numpy", "4d-numpy", "1d-numpy", "HWC-tensor", "2d-tensor", "4d-tensor"],
)
def test_wrong_shapes_raise_with_the_shape(src, match):
    with pytest.raises(ValueError, match=match):
        load_image(src)


@pytest.mark.parametrize(
    "src, match",
    [
        (np.zeros((H, W), np.int64), "dtype int64 is not supported; convert it to uint8"),
        (torch.zeros(3, H, W, dtype=torch.int32), "dtype torch.int32 is not supported"),
        ([np.zeros((H, W))], r"from a list \(for several images use make_canvas\)"),
        (42, "from a int; pass a file path"),
        (object(), "from a object"),
    ],
    ids=["numpy-int64", "tensor-int32", "list", "int", "object"],
)
def test_unsupported_types_and_dtypes_raise_type_error(src, match):
    with pytest.raises(TypeError, match=match):
        load_image(src)


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
    assert torch.allclose(c.pixels[0, :, :96, :64], torch.tensor(0.3), atol=1e-6)  # a flat page stays flat
    assert 0.0 <= float(c.pixels.min()) and float(c.pixels.max()) <= 1.0
    assert c.scales[0] == pytest.approx((96 / 100, 64 / 61))


def test_batched_tensor_equals_the_same_images_as_a_list():
    x = torch.rand(3, 3, 90, 130)  # -> 84 x 140 (nearest whole cells)
    batched, listed = make_canvas(x), make_canvas(list(x))
    assert torch.allclose(batched.pixels, listed.pixels, atol=1e-6)
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
