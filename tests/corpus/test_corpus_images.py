"""Corpus: generated hostile images -- every PIL mode in every format that holds it, truncated and corrupted
files, decompression bombs, extreme sizes, EXIF rotations -- each ends in a correct canvas or one line."""
from __future__ import annotations

import io
import random
import struct
import zlib

import numpy as np
import pytest
import torch
from corpus_checks import outcome
from PIL import Image

from arr_coc.engine.canvas import make_canvas
from arr_coc.engine.imageio import MAX_IMAGE_PIXELS, image_size, load_image

MODES = ("1", "L", "P", "RGB", "RGBA", "CMYK", "YCbCr", "LAB", "HSV", "I", "F", "I;16", "I;16B", "I;16L", "LA",
         "PA", "RGBX", "RGBa", "La")
FORMATS = ("PNG", "JPEG", "TIFF", "BMP", "GIF", "WEBP", "PPM", "TGA")
SIZE = (90, 60)  # (W, H) PIL order: small, so the corpus runs in seconds


def uniform(mode: str) -> Image.Image:
    """A uniform image of ``mode`` (a mid value in every band)."""
    img = Image.new("RGB", SIZE, (120, 60, 200))
    if mode in ("I", "F", "I;16", "I;16B", "I;16L"):
        return Image.new(mode, SIZE, 300 if mode != "F" else 0.25)
    if mode == "1":
        return Image.new("1", SIZE, 1)
    if mode in ("P", "PA"):  # no dithering: a uniform picture stays one palette entry
        return img.convert("P", dither=Image.Dither.NONE).convert(mode)
    if mode in ("LA", "La"):
        return img.convert("RGBA").convert(mode)
    return img.convert(mode)


def check_canvas(canvas, size_hw=(60, 90)) -> None:
    """A correct result: original size kept, a cell-aligned canvas, finite pixels in [0, 1]."""
    assert canvas.image_sizes == [size_hw]
    px = canvas.pixels
    assert px.dtype == torch.float32 and bool(torch.isfinite(px).all())
    assert float(px.min()) >= 0 and float(px.max()) <= 1


@pytest.mark.parametrize("mode", MODES)
def test_every_pil_mode_in_memory_loads_uniformly(mode):
    img = uniform(mode)
    kind, x = outcome(lambda: load_image(img))
    assert kind == "ok", x
    assert x.shape == (3, 60, 90)
    # a uniform image stays uniform: no band is read as another, no channel misplaced
    assert float((x - x[:, :1, :1]).abs().max()) < 1e-6


def writable() -> list[tuple[str, str]]:
    """The (mode, format) pairs PIL can write: the files a user can have."""
    pairs = []
    for mode in MODES:
        for fmt in FORMATS:
            try:
                uniform(mode).save(io.BytesIO(), format=fmt)
            except (OSError, ValueError, KeyError, TypeError):
                continue
            pairs.append((mode, fmt))
    return pairs


@pytest.mark.parametrize("mode, fmt", writable())
def test_every_pil_mode_in_every_format_it_can_be_saved_in_reads(mode, fmt, tmp_path):
    path = tmp_path / f"x.{fmt.lower()}"
    uniform(mode).save(path, format=fmt)
    kind, canvas = outcome(lambda: make_canvas(path, min_pixels=28 * 28))
    if kind == "ok":
        check_canvas(canvas)
    else:  # PIL writes a few pairs it cannot read back (YCbCr TIFF): the file is named
        assert str(path) in canvas


def encoded(fmt: str) -> bytes:
    buf = io.BytesIO()
    img = Image.effect_noise(SIZE, 40).convert("RGB")
    img.save(buf, format=fmt)
    return buf.getvalue()


CUTS = (0, 1, 8, 30, 0.25, 0.5, 0.9, -1)


@pytest.mark.parametrize("cut", CUTS)
@pytest.mark.parametrize("fmt", ("PNG", "JPEG", "TIFF", "GIF", "WEBP", "BMP"))
def test_truncated_files_read_or_name_the_file(fmt, cut, tmp_path):
    data = encoded(fmt)
    n = int(len(data) * cut) if isinstance(cut, float) else (cut if cut >= 0 else len(data) + cut)
    path = tmp_path / f"cut.{fmt.lower()}"
    path.write_bytes(data[:n])
    kind, result = outcome(lambda: make_canvas(path, min_pixels=28 * 28))
    if kind == "ok":
        check_canvas(result)
    else:
        assert str(path) in result


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("fmt", ("PNG", "JPEG", "TIFF", "GIF", "WEBP", "BMP"))
def test_corrupted_bytes_read_or_name_the_file(fmt, seed, tmp_path):
    data = bytearray(encoded(fmt))
    rng = random.Random(seed)
    for _ in range(1 + seed * 3):  # a few flipped bytes, past the magic number so the format is still found
        i = rng.randrange(min(8, len(data) - 1), len(data))
        data[i] = rng.randrange(256)
    path = tmp_path / f"bad.{fmt.lower()}"
    path.write_bytes(bytes(data))
    kind, result = outcome(lambda: make_canvas(path, min_pixels=28 * 28))
    if kind == "ok":
        assert bool(torch.isfinite(result.pixels).all())
    else:
        assert str(path) in result


def png_header(width: int, height: int, mode: int = 2) -> bytes:
    """A PNG whose header claims width x height and whose one IDAT holds a few rows: a decompression bomb."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, mode, 0, 0, 0)
    rows = zlib.compress(b"\x00" * (1 + 3 * min(width, 64)) * 4)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", rows) + chunk(b"IEND", b"")


@pytest.mark.parametrize("width, height", [(100_000, 100_000), (2**31 - 1, 1), (13378, 13378), (20000, 9000),
                                           (1_000_000, 200)])
def test_decompression_bombs_are_refused_from_the_header(width, height, tmp_path):
    path = tmp_path / "bomb.png"
    path.write_bytes(png_header(width, height))
    assert width * height > MAX_IMAGE_PIXELS
    for call in (lambda: make_canvas(path), lambda: load_image(path), lambda: image_size(path)):
        kind, message = outcome(call)
        assert kind == "error" and "decompression bomb guard" in message and str(path) in message


def test_a_bomb_just_inside_the_limit_is_decoded_bounded(tmp_path):
    # 4000 x 3000 px reduced in the decoder / by box averages to no less than its 336 x 252 px canvas
    img = Image.effect_noise((4000, 3000), 60).convert("RGB")
    png, jpg = tmp_path / "big.png", tmp_path / "big.jpg"
    img.save(png, compress_level=1)
    img.save(jpg, quality=90)
    reference = torch.from_numpy(np.array(img.resize((336, 252), Image.Resampling.BOX))).permute(2, 0, 1) / 255
    for path in (png, jpg):
        c = make_canvas(path, max_pixels=336 * 252)
        assert c.image_sizes == [(3000, 4000)] and c.sizes == [(252, 336)]
        assert float((c.pixels[0] - reference).abs().mean()) < 0.03  # the same picture, averaged


@pytest.mark.parametrize("w, h", [(1, 1), (27, 27), (28, 28), (1, 5000), (5000, 1), (28, 5600), (5600, 28),
                                  (28, 5601), (29, 5800), (3, 400), (56, 11200), (2, 3)])
def test_extreme_sizes_give_a_canvas_or_one_line(w, h, tmp_path):
    path = tmp_path / f"{w}x{h}.png"
    Image.new("L", (w, h), 128).save(path)
    kind, result = outcome(lambda: make_canvas(path))
    if kind == "ok":
        hc, wc = result.grid
        assert result.image_sizes == [(h, w)] and hc >= 1 and wc >= 1 and max(h, w) / min(h, w) <= 200
    else:
        assert str(path) in result and ("token cell" in result or "aspect ratio" in result)


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_is_the_size_of_the_picture_everyone_sees(orientation, tmp_path):
    img = Image.new("RGB", (90, 60), (0, 0, 255))
    img.paste((255, 0, 0), (0, 0, 30, 20))  # a red corner, to follow the rotation
    exif = Image.Exif()
    exif[0x0112] = orientation
    path = tmp_path / "o.jpg"
    img.save(path, exif=exif, quality=95)
    swapped = orientation in (5, 6, 7, 8)
    assert image_size(path) == ((90, 60) if swapped else (60, 90))
    c = make_canvas(path, min_pixels=28 * 28)
    assert c.image_sizes == [image_size(path)]
    # the pixels really were turned: the loaded image has the header's displayed size
    assert tuple(load_image(path).shape[1:]) == image_size(path)


def test_a_directory_an_empty_file_and_text_name_themselves(tmp_path):
    (tmp_path / "empty.png").write_bytes(b"")
    (tmp_path / "notes.png").write_text("hello")
    for path in (tmp_path, tmp_path / "empty.png", tmp_path / "notes.png", tmp_path / "missing.png"):
        kind, message = outcome(lambda: make_canvas(path))
        assert kind == "error" and str(path) in message
