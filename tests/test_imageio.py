"""Tests for arr_coc.engine.imageio: loading any image (file, PIL, numpy, tensor) to [3, H, W] in [0, 1]."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from arr_coc.engine.imageio import load_image

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
