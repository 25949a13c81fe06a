"""Input loading and the token-cell canvas: any image -> float [0, 1] pixels on a grid of whole cells.

A VLM of the Qwen-VL family turns each ``cell`` x ``cell`` pixel square (a 2x2 block of ViT patches)
into one LLM token, so every image entering the pipeline is resized to sides that are multiples of
``cell``. A batch of differently sized images is padded bottom/right with zeros to one common
canvas and ``valid`` marks the real cells.

Shapes: ``pixels`` [B, 3, H, W] float32 in [0, 1]; ``valid`` [B, Hc, Wc] bool with Hc = H // cell,
Wc = W // cell; sizes are (height, width) pairs in pixels.
"""
from __future__ import annotations

import math
import os
import struct
import warnings
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence, Union

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError

from arr_coc.imageops import resize

ImageLike = Union[str, os.PathLike, Image.Image, np.ndarray, torch.Tensor]

# Documents hold small print: 1792 px a side (64 x 64 = 4096 tokens at 28 px) keeps ~10 px text of an
# A4 page at 200 dpi legible while bounding the full-resolution token count that saccades are drawn
# from. The floor of 56 x 56 px (4 tokens) only stops thumbnails collapsing to a single cell.
MIN_PIXELS = 56 * 56
MAX_PIXELS = 1792 * 1792
# Past this ratio one side is a sliver of cells and the aspect can no longer be kept (Qwen2-VL's limit).
MAX_ASPECT_RATIO = 200
# The largest image file read: PIL's decompression-bomb threshold (2 x Image.MAX_IMAGE_PIXELS, a 13377 x 13377
# image). A larger header is refused before any pixel is decoded; a smaller one is decoded at the coarsest
# integer reduction that still covers its canvas (JPEG: in the decoder), so memory follows the canvas.
MAX_IMAGE_PIXELS = 2 * 89_478_485
# What a damaged or hostile file can raise inside PIL's decoders; each is reported as a bad file.
_DECODE_ERRORS = (OSError, SyntaxError, EOFError, ValueError, IndexError, struct.error, Image.DecompressionBombError)

_USAGE = "pass a file path, a PIL image, a numpy array (H, W) or (H, W, C), or a torch tensor [3, H, W]"


def _check(x: torch.Tensor, what: str) -> None:
    """Raises on a [..., H, W] float tensor that is empty, not finite, or outside [0, 1]."""
    x = x.detach()
    if x.shape[-2] == 0 or x.shape[-1] == 0:
        raise ValueError(f"{what} has zero size (shape {tuple(x.shape)}); an image needs at least one pixel")
    bad = ~torch.isfinite(x)
    if bool(bad.any()):
        kind = "NaN" if bool(torch.isnan(x).any()) else "inf"
        raise ValueError(
            f"{what} contains {kind} values ({int(bad.sum())} of {x.numel()}); "
            "replace them (e.g. with torch.nan_to_num) before loading"
        )
    lo, hi = float(x.min()), float(x.max())
    if lo < 0.0 or hi > 1.0:
        raise ValueError(
            f"{what} is float with values in [{lo:g}, {hi:g}], outside [0, 1]; float images must "
            "already be scaled to [0, 1] (divide 0-255 data by 255, or pass it as uint8)"
        )


def _to_rgb(x: torch.Tensor, what: str) -> torch.Tensor:
    """[C, H, W] float, C in 1, 3, 4 -> checked [3, H, W]; alpha is composited over white."""
    _check(x, what)
    if x.shape[0] == 4:
        # A transparent region of a scan or screenshot is paper, so it reads as white, not black.
        rgb, alpha = x[:3], x[3:]
        return rgb * alpha + (1.0 - alpha)
    if x.shape[0] == 1:
        return x.expand(3, -1, -1).contiguous()
    return x


def _from_numpy(arr: np.ndarray) -> torch.Tensor:
    """(H, W) or (H, W, C) array with C in 1, 3, 4 -> [3, H, W] float32 in [0, 1]."""
    shape = tuple(arr.shape)
    if arr.ndim == 3 and shape[2] not in (1, 3, 4):
        hint = "; it looks channel-first, use arr.transpose(1, 2, 0)" if shape[0] in (1, 3, 4) else ""
        raise ValueError(f"numpy image has shape {shape}; expected (H, W) or (H, W, C) with C in 1, 3, 4{hint}")
    if arr.ndim not in (2, 3):
        raise ValueError(
            f"numpy image has {arr.ndim} dims (shape {shape}); expected (H, W) or (H, W, C); "
            "for a batch pass a list of images or a tensor [B, 3, H, W] to make_canvas"
        )
    kind, size = arr.dtype.kind, arr.dtype.itemsize
    if kind == "u" and size in (1, 2):
        scale = 255.0 if size == 1 else 65535.0  # 16-bit scans and PNGs use the full range
    elif kind in "bf":
        scale = 1.0
    else:
        raise TypeError(
            f"numpy image of dtype {arr.dtype} is not supported; convert it to uint8 (0-255), "
            "uint16 (0-65535), bool, or float in [0, 1]"
        )
    # Always a fresh float32 copy: fixes byte order ('>u2' TIFFs), negative strides, read-only buffers.
    x = torch.from_numpy(np.array(arr, dtype=np.float32, order="C", copy=True))
    x = x / scale if scale != 1.0 else x
    x = x[None] if x.ndim == 2 else x.permute(2, 0, 1)  # [C, H, W]
    return _to_rgb(x, "numpy image").contiguous()


def _oriented_size(img: Image.Image) -> tuple[int, int]:
    """(H, W) of an image as displayed, i.e. after its EXIF orientation, read from the header alone."""
    w, h = img.size
    try:
        orientation = img.getexif().get(0x0112, 1)
    except _DECODE_ERRORS:  # a damaged EXIF block: the pixels are still shown as stored
        orientation = 1
    return (w, h) if orientation in (5, 6, 7, 8) else (h, w)


def _reduce(img: Image.Image, fit: tuple[int, int] | None) -> Image.Image:
    """Shrink by the largest integer factor that keeps the image at least ``fit`` (H, W): box averages, 8-bit.

    Done before any float conversion, so a 13000 x 13000 px page costs its canvas, not 2 GB of float32.
    """
    if fit is None:
        return img
    factor = min(img.size[1] // max(1, fit[0]), img.size[0] // max(1, fit[1]))
    return img.reduce(factor) if factor >= 2 else img


def _decoded(img: Image.Image, fit: tuple[int, int] | None = None, *, in_place: bool = False) -> Image.Image:
    """Decode ``img`` upright (EXIF orientation), in a mode ``_pil_pixels`` reads, no smaller than ``fit`` (H, W).

    All of PIL's decoding happens here, so a damaged file fails here and nowhere else.
    """
    if in_place and fit is not None and img.format == "JPEG" and getattr(img, "tile", None):  # ours, not decoded yet
        oriented = _oriented_size(img)
        factor = min(oriented[0] // max(1, fit[0]), oriented[1] // max(1, fit[1]))
        if factor >= 2:  # the decoder itself works at 1/2, 1/4 or 1/8 scale, never below the request
            img.draft(img.mode, (img.size[0] // factor, img.size[1] // factor))
    img.load()
    transposed = ImageOps.exif_transpose(img, in_place=in_place)
    img = img if transposed is None else transposed
    # Modes whose reduce is undefined or meaningless (bits, palette indices) are widened first.
    if img.mode == "1":
        img = img.convert("L")
    elif img.mode in ("P", "PA"):
        img = img.convert("RGBA" if img.mode == "PA" or "transparency" in img.info else "RGB")
    elif img.mode.startswith("I;16"):
        img = img.convert("I")  # PIL's 16-bit modes hold values 0-65535, which mode I keeps
    return _reduce(img, fit)


def _pil_pixels(img: Image.Image) -> torch.Tensor:
    """A decoded PIL image -> [3, H, W] float32 in [0, 1]."""
    mode = img.mode
    # Spelled out: a band named "A" is not always alpha (LAB), and a transparency key can sit on any mode.
    if mode in ("LA", "PA", "La", "RGBa") or "transparency" in img.info:
        img = img.convert("LA").convert("RGBA") if mode == "La" else img.convert("RGBA")
        return _from_numpy(np.asarray(img))
    if mode in ("L", "RGB", "RGBA", "F"):
        return _from_numpy(np.asarray(img))
    if mode == "I":
        # 32-bit integer mode is how PIL hands over most 16-bit grey images: read it as 16-bit data.
        arr = np.asarray(img)
        if arr.size and (int(arr.min()) < 0 or int(arr.max()) > 65535):
            raise ValueError(
                f"PIL image of mode 'I' has values in [{arr.min()}, {arr.max()}], outside the 16-bit "
                "range [0, 65535]; rescale it or convert it to mode 'F' with values in [0, 1]"
            )
        return _from_numpy(arr.astype(np.uint16))
    try:
        img = img.convert("RGB")  # CMYK, YCbCr, HSV, LAB, RGBX
    except ValueError as e:
        raise TypeError(f"PIL image of mode {mode!r} cannot be converted to RGB ({e}); convert it first") from e
    return _from_numpy(np.asarray(img))


def _from_pil(img: Image.Image, fit: tuple[int, int] | None = None) -> torch.Tensor:
    """PIL image of any common mode -> [3, H, W] float32 in [0, 1], EXIF orientation applied."""
    try:
        decoded = _decoded(img, fit)
    except _DECODE_ERRORS as e:
        raise ValueError(f"cannot decode the PIL image ({type(e).__name__}: {e})") from e
    return _pil_pixels(decoded)


def _open(path: Union[str, os.PathLike]) -> Image.Image:
    """Open an image file lazily (header only), refusing what cannot be read or is too large to decode."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"image file not found: '{p}'")
    if p.is_dir():
        raise ValueError(f"cannot read image '{p}': it is a directory, not an image file")
    try:
        with warnings.catch_warnings():  # PIL warns between its two limits; the size is checked just below
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img = Image.open(p)
    except UnidentifiedImageError as e:
        raise ValueError(f"cannot read '{p}' as an image: not a format PIL recognises (PNG, JPEG, TIFF, ...)") from e
    except Image.DecompressionBombError:
        raise ValueError(f"image '{p}' has more than {MAX_IMAGE_PIXELS} pixels (a decompression bomb guard); "
                         "downscale it first") from None
    except _DECODE_ERRORS as e:
        raise ValueError(f"cannot read image file '{p}': {e}") from e
    w, h = img.size
    if w * h > MAX_IMAGE_PIXELS:
        img.close()
        raise ValueError(f"image '{p}' is {w}x{h} px = {w * h} pixels, more than the {MAX_IMAGE_PIXELS} read "
                         "(a decompression bomb guard); downscale it first")
    if w < 1 or h < 1:
        img.close()
        raise ValueError(f"image '{p}' has zero size ({w}x{h} px); an image needs at least one pixel")
    return img


def image_size(path: Union[str, os.PathLike]) -> tuple[int, int]:
    """(H, W) in px of an image file as displayed (EXIF orientation applied), from its header alone.

    The pixels boxes are given in: every loader and the pipeline see the image the same way round.

    Example:
        >>> import tempfile
        >>> p = Path(tempfile.mkdtemp()) / "a.png"
        >>> Image.new("RGB", (40, 30)).save(p)
        >>> image_size(p)
        (30, 40)
    """
    with _open(path) as img:
        return _oriented_size(img)


def _file_pixels(img: Image.Image, path: Union[str, os.PathLike], fit: tuple[int, int] | None = None) -> torch.Tensor:
    """An image opened by :func:`_open` -> [3, H, W] float32, decoded no smaller than ``fit``."""
    try:
        decoded = _decoded(img, fit, in_place=True)
    except _DECODE_ERRORS as e:
        raise ValueError(f"cannot read image file '{path}': {e}") from e
    return _pil_pixels(decoded)


def _from_path(path: Union[str, os.PathLike], fit: tuple[int, int] | None = None) -> torch.Tensor:
    with _open(path) as img:
        return _file_pixels(img, path, fit)


def _from_tensor(x: torch.Tensor) -> torch.Tensor:
    """[3, H, W] or [1, H, W] float in [0, 1], uint8 or bool -> [3, H, W] float32 (no copy if already so)."""
    if x.ndim != 3 or x.shape[0] not in (1, 3):
        hint = "; it looks channel-last, use x.permute(2, 0, 1)" if x.ndim == 3 and x.shape[-1] in (1, 3, 4) else ""
        hint = "; for a batch use make_canvas" if x.ndim == 4 else hint
        raise ValueError(f"tensor image has shape {tuple(x.shape)}; expected [3, H, W] or [1, H, W]{hint}")
    return _to_rgb(_tensor_to_float(x), "tensor image")


def _tensor_to_float(x: torch.Tensor) -> torch.Tensor:
    if x.dtype == torch.uint8:
        return x.to(torch.float32) / 255.0
    if x.dtype == torch.bool or x.is_floating_point():
        return x.to(torch.float32)
    raise TypeError(
        f"tensor image of dtype {x.dtype} is not supported; pass float in [0, 1], uint8 (0-255) or bool"
    )


def load_image(src: ImageLike) -> torch.Tensor:
    """Loads one image from a path, PIL image, numpy array or tensor as float32 RGB in [0, 1].

    PIL images (and files) of any common mode are handled: EXIF orientation is applied, alpha is
    composited over white (a transparent document is white paper), 16-bit data is divided by 65535,
    CMYK and palettes are converted to RGB. A float32 tensor [3, H, W] is returned as is (no copy).

    Args:
        src: a file path; a PIL image; a numpy array (H, W) or (H, W, C), C in 1, 3, 4, of dtype
            uint8, uint16, bool or float in [0, 1]; or a tensor [3, H, W] / [1, H, W] that is float in
            [0, 1], uint8 or bool.

    Returns:
        [3, H, W] float32 tensor in [0, 1].

    Raises:
        FileNotFoundError: the path does not exist.
        ValueError: unreadable file, zero size, NaN/inf, float values outside [0, 1], wrong shape.
        TypeError: unsupported input type or dtype.

    Example:
        >>> x = load_image(np.full((2, 5), 255, dtype=np.uint8))
        >>> x.shape, x.dtype, float(x.min())
        (torch.Size([3, 2, 5]), torch.float32, 1.0)
    """
    if isinstance(src, (str, os.PathLike)):
        return _from_path(src)
    if isinstance(src, Image.Image):
        return _from_pil(src)
    if isinstance(src, np.ndarray):
        return _from_numpy(src)
    if isinstance(src, torch.Tensor):
        return _from_tensor(src)
    hint = " (for several images use make_canvas)" if isinstance(src, (list, tuple)) else ""
    raise TypeError(f"cannot load an image from a {type(src).__name__}{hint}; {_USAGE}")


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
        x = _tensor_to_float(images)
        _check(x, "image batch")
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
                sources.append(files.enter_context(_open(im)))
            else:
                sources.append(im if isinstance(im, Image.Image) else load_image(im))  # [3, H0, W0]
        image_sizes = [_oriented_size(x) if isinstance(x, Image.Image) else (int(x.shape[1]), int(x.shape[2]))
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
                x = _file_pixels(x, im, (h, w))
            elif isinstance(x, Image.Image):
                x = _from_pil(x, (h, w))
            pixels[i, :, :h, :w] = resize(x[None].to(device), (h, w))[0]
            sources[i] = None  # type: ignore[call-overload]  # one decoded image in memory at a time
    hc = torch.tensor([h // cell for h, _ in sizes], device=pixels.device)  # [B]
    wc = torch.tensor([w // cell for _, w in sizes], device=pixels.device)  # [B]
    rows = torch.arange(hmax // cell, device=pixels.device)
    cols = torch.arange(wmax // cell, device=pixels.device)
    valid = (rows[None, :, None] < hc[:, None, None]) & (cols[None, None, :] < wc[:, None, None])  # [B, Hc, Wc]
    return Canvas(pixels, valid, image_sizes, sizes, cell)
