"""The token-cell canvas: images resized to sides of whole cells and padded to one batch.

A VLM of the Qwen-VL family turns each ``cell`` x ``cell`` pixel square (a 2x2 block of ViT patches)
into one LLM token, so every image entering the pipeline is resized to sides that are multiples of
``cell``. A batch of differently sized images is padded bottom/right with zeros to one common
canvas and ``valid`` marks the real cells. Decoding the images is :mod:`arr_coc.engine.imageio`'s.

Shapes: ``pixels`` [B, 3, H, W] float32 in [0, 1]; ``valid`` [B, Hc, Wc] bool with Hc = H // cell,
Wc = W // cell; sizes are (height, width) pairs in pixels.
"""
from __future__ import annotations

import math
import os
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Sequence, Union

import torch
from PIL import Image

from arr_coc.engine.imageio import (
    ImageLike,
    batch_pixels,
    decode_file,
    decode_pil,
    load_image,
    open_image,
    oriented_size,
)
from arr_coc.engine.imageops import resize

# Documents hold small print: 1792 px a side (64 x 64 = 4096 tokens at 28 px) keeps ~10 px text of an
# A4 page at 200 dpi legible while bounding the full-resolution token count that saccades are drawn
# from. The floor of 56 x 56 px (4 tokens) only stops thumbnails collapsing to a single cell.
MIN_PIXELS = 56 * 56
MAX_PIXELS = 1792 * 1792
# Past this ratio one side is a sliver of cells and the aspect can no longer be kept (Qwen2-VL's limit).
MAX_ASPECT_RATIO = 200


def smart_resize(
    height: int, width: int, cell: int = 28, min_pixels: int = MIN_PIXELS, max_pixels: int = MAX_PIXELS
) -> tuple[int, int]:
    """Picks the canvas size for an image: sides are multiples of ``cell``, area within bounds, aspect kept.

    Each side is rounded to the nearest multiple of ``cell``; if the area then exceeds ``max_pixels``
    both sides are scaled down together (floored to cells), if it falls below ``min_pixels`` they are
    scaled up together (ceiled to cells). A side never drops below one cell.

    Args:
        height: image height in pixels (> 0).
        width: image width in pixels (> 0).
        cell: token cell side in pixels (28 for Qwen2/2.5-VL, 32 for Qwen3-VL).
        min_pixels: smallest canvas area in pixels.
        max_pixels: largest canvas area in pixels (at least one cell).

    Returns:
        (H, W) canvas size in pixels, both multiples of ``cell``.

    Raises:
        ValueError: non-positive sizes, bounds that admit no canvas, or aspect ratio above 200.

    Example:
        >>> smart_resize(1000, 700)
        (1008, 700)
        >>> smart_resize(4000, 3000, max_pixels=1344 * 1344)
        (1540, 1148)
    """
    for name, v in (("height", height), ("width", width), ("cell", cell)):
        if int(v) != v or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    height, width, cell = int(height), int(width), int(cell)
    if max_pixels < cell * cell or min_pixels > max_pixels:
        raise ValueError(
            f"need cell * cell <= max_pixels and min_pixels <= max_pixels, got cell={cell}, "
            f"min_pixels={min_pixels}, max_pixels={max_pixels}"
        )
    ratio = max(height, width) / min(height, width)
    if ratio > MAX_ASPECT_RATIO:
        raise ValueError(
            f"image is {height}x{width} px, aspect ratio {ratio:.1f} exceeds {MAX_ASPECT_RATIO}; "
            "crop it into pieces of a more moderate aspect and pass them separately"
        )
    h = max(cell, round(height / cell) * cell)
    w = max(cell, round(width / cell) * cell)
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(cell, math.floor(height / beta / cell) * cell)
        w = max(cell, math.floor(width / beta / cell) * cell)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / cell) * cell
        w = math.ceil(width * beta / cell) * cell
    # A side clamped to one cell, or a narrow [min, max] window, can overshoot a bound: step the side
    # that is relatively largest (or smallest) by one cell, which keeps the aspect as close as possible.
    while h * w > max_pixels:
        if (h / height >= w / width and h > cell) or w == cell:
            h -= cell
        else:
            w -= cell
    while h * w < min_pixels:
        if h / height <= w / width:
            h += cell
        else:
            w += cell
    # Rounding a side of a cell or two can carry the aspect past the cap the image itself met (15 x 2808
    # px -> 14 x 2814): trim the long side, so every canvas size is itself an acceptable image size.
    while max(h, w) > MAX_ASPECT_RATIO * min(h, w):
        if h > w:
            h -= cell
        else:
            w -= cell
    if not min_pixels <= h * w <= max_pixels:
        raise ValueError(
            f"no canvas of whole {cell} px cells for a {height}x{width} px image has an area within "
            f"[{min_pixels}, {max_pixels}]; widen the bounds"
        )
    return h, w


@dataclass
class Canvas:
    """A batch of images resized to whole token cells and padded to one common size.

    Example:
        >>> c = make_canvas([torch.rand(3, 56, 84), torch.rand(3, 84, 56)], min_pixels=28 * 28)
        >>> c.grid, c.sizes, c.full_tokens
        ((3, 3), [(56, 84), (84, 56)], [6, 6])
        >>> c.valid[0].int().tolist()
        [[1, 1, 1], [1, 1, 1], [0, 0, 0]]
    """

    pixels: torch.Tensor  # [B, 3, H, W] float32 in [0, 1], zeros bottom/right of each image
    valid: torch.Tensor  # [B, Hc, Wc] bool, True on an image's real cells; samplers must honour it
    image_sizes: list[tuple[int, int]]  # original (H, W) px per image: maps answer boxes onto the canvas
    sizes: list[tuple[int, int]]  # (H, W) px of each image's canvas before padding
    cell: int  # token cell side in px; comes from the VLM adapter

    def __post_init__(self) -> None:
        b, c, h, w = self.pixels.shape if self.pixels.ndim == 4 else (None,) * 4
        if c != 3 or h % self.cell or w % self.cell:
            raise ValueError(
                f"Canvas.pixels must be [B, 3, H, W] with H, W multiples of cell={self.cell}, "
                f"got {tuple(self.pixels.shape)}"
            )
        if tuple(self.valid.shape) != (b, h // self.cell, w // self.cell) or self.valid.dtype != torch.bool:
            raise ValueError(
                f"Canvas.valid must be bool [{b}, {h // self.cell}, {w // self.cell}], "
                f"got {self.valid.dtype} {tuple(self.valid.shape)}"
            )
        if len(self.image_sizes) != b or len(self.sizes) != b:
            raise ValueError(
                f"Canvas needs one image_sizes and sizes entry per image (B={b}), "
                f"got {len(self.image_sizes)} and {len(self.sizes)}"
            )

    @property
    def batch_size(self) -> int:
        return self.pixels.shape[0]

    @property
    def grid(self) -> tuple[int, int]:
        """(Hc, Wc) cells of the padded batch."""
        return self.pixels.shape[2] // self.cell, self.pixels.shape[3] // self.cell

    @property
    def full_tokens(self) -> list[int]:
        """Cells per image: the token count of feeding each image at full canvas resolution."""
        return [(h // self.cell) * (w // self.cell) for h, w in self.sizes]

    @property
    def scales(self) -> list[tuple[float, float]]:
        """(sy, sx) per image: canvas px per original px, to map original-pixel boxes onto the canvas."""
        return [(h / h0, w / w0) for (h, w), (h0, w0) in zip(self.sizes, self.image_sizes)]


def _canvas_size(which: str, h0: int, w0: int, cell: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    if h0 < cell or w0 < cell:
        raise ValueError(
            f"{which} is {h0}x{w0} px, smaller than one {cell} px token cell (sizes are height x width); "
            "upscale it first or use a VLM with a smaller cell"
        )
    try:
        return smart_resize(h0, w0, cell, min_pixels, max_pixels)
    except ValueError as err:
        raise ValueError(f"{which}: {err}" if which != "image" else str(err)) from None


def _which(i: int | None, src: object) -> str:
    """How messages name an image: its file when it has one, else its place in the batch."""
    if isinstance(src, (str, os.PathLike)):
        return f"image '{src}'"
    return "image" if i is None else f"image {i}"


def load_bounded(path: Union[str, os.PathLike], max_pixels: int = MAX_PIXELS) -> torch.Tensor:
    """An image file as [3, H, W] float32, decoded no larger than a canvas of at most ``max_pixels`` needs.

    For a caller that keeps an image to make canvases from later (the microscope's uploads): the file is
    reduced in 8-bit, a strip at a time, by the largest integer factor that still covers the largest canvas
    of any cell size, so a 40 MP upload costs about its canvas, never the full image in float32.

    Example:
        >>> import tempfile
        >>> p = os.path.join(tempfile.mkdtemp(), "page.png")
        >>> Image.new("RGB", (6000, 4000), "white").save(p)
        >>> tuple(load_bounded(p).shape), make_canvas(load_bounded(p)).sizes == make_canvas(p).sizes
        ((3, 2000, 3000), True)
    """
    with open_image(path) as img:
        h0, w0 = oriented_size(img)
        beta = math.sqrt(h0 * w0 / max_pixels)  # smart_resize floors each side of a larger image to h0/beta, w0/beta
        fit = (math.ceil(h0 / beta), math.ceil(w0 / beta)) if beta > 1 else (h0, w0)
        return decode_file(img, path, fit)


def make_canvas(
    images: Union[ImageLike, Sequence[ImageLike]],
    cell: int = 28,
    min_pixels: int = MIN_PIXELS,
    max_pixels: int = MAX_PIXELS,
) -> Canvas:
    """Loads one image or a batch, resizes each to its own cell-aligned canvas, pads them to one size.

    Args:
        images: one image in any form ``load_image`` accepts, a list/tuple of them (sizes may
            differ), or a tensor [B, 3, H, W] (float in [0, 1] or uint8).
        cell: token cell side in pixels; every canvas side is a multiple of it.
        min_pixels: smallest canvas area per image (see ``smart_resize``).
        max_pixels: largest canvas area per image.

    Returns:
        A ``Canvas``; images already of a cell-aligned size within bounds pass through bit-exactly
        (a float32 [B, 3, H, W] input of such a size becomes ``pixels`` itself, without a copy).

    Raises:
        ValueError: an empty batch, an image smaller than one cell, or any ``load_image`` error.

    Example:
        >>> c = make_canvas(torch.zeros(2, 3, 100, 60))
        >>> c.pixels.shape, c.grid, c.image_sizes
        (torch.Size([2, 3, 112, 56]), (4, 2), [(100, 60), (100, 60)])
    """
    if isinstance(images, torch.Tensor) and images.ndim == 4:
        b, c, h0, w0 = images.shape
        if b == 0 or c not in (1, 3):
            raise ValueError(f"image batch has shape {tuple(images.shape)}; expected [B, 3, H, W] with B >= 1")
        x = batch_pixels(images)
        size = _canvas_size("image", h0, w0, cell, min_pixels, max_pixels)
        pixels = resize(x, size).expand(-1, 3, -1, -1)  # [B, 3, H, W]
        hc, wc = size[0] // cell, size[1] // cell
        valid = torch.ones(b, hc, wc, dtype=torch.bool, device=x.device)
        return Canvas(pixels.contiguous(), valid, [(h0, w0)] * b, [size] * b, cell)

    single = not isinstance(images, (list, tuple))
    items = [images] if single else list(images)
    if not items:
        raise ValueError("make_canvas got an empty list of images; pass at least one image")
    with ExitStack() as files:
        # Sizes come from the headers first, so each file is then decoded no larger than its canvas needs.
        sources: list[Union[Image.Image, torch.Tensor]] = []
        for im in items:
            if isinstance(im, (str, os.PathLike)):
                sources.append(files.enter_context(open_image(im)))
            else:
                sources.append(im if isinstance(im, Image.Image) else load_image(im))  # [3, H0, W0]
        image_sizes = [oriented_size(x) if isinstance(x, Image.Image) else (int(x.shape[1]), int(x.shape[2]))
                       for x in sources]
        sizes = [
            _canvas_size(_which(None if single else i, im), h0, w0, cell, min_pixels, max_pixels)
            for i, ((h0, w0), im) in enumerate(zip(image_sizes, items))
        ]
        hmax, wmax = max(h for h, _ in sizes), max(w for _, w in sizes)
        device = next((x.device for x in sources if isinstance(x, torch.Tensor)), torch.device("cpu"))
        pixels = torch.zeros(len(items), 3, hmax, wmax, device=device)  # [B, 3, H, W]
        # Sizes differ per image, so each is resized on its own; padding stays zero.
        for i, (x, im, (h, w)) in enumerate(zip(sources, items, sizes)):
            if isinstance(im, (str, os.PathLike)):
                x = decode_file(x, im, (h, w))
            elif isinstance(x, Image.Image):
                x = decode_pil(x, (h, w))
            pixels[i, :, :h, :w] = resize(x[None].to(device), (h, w))[0]
            sources[i] = None  # type: ignore[call-overload]  # one decoded image in memory at a time
    hc = torch.tensor([h // cell for h, _ in sizes], device=pixels.device)  # [B]
    wc = torch.tensor([w // cell for _, w in sizes], device=pixels.device)  # [B]
    rows = torch.arange(hmax // cell, device=pixels.device)
    cols = torch.arange(wmax // cell, device=pixels.device)
    valid = (rows[None, :, None] < hc[:, None, None]) & (cols[None, None, :] < wc[:, None, None])  # [B, Hc, Wc]
    return Canvas(pixels, valid, image_sizes, sizes, cell)
