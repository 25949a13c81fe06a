"""Image decoding: any image (file, PIL, numpy, tensor) -> float32 RGB [3, H, W] in [0, 1], read safely.

Files are opened header first: EXIF orientation is applied, a decompression bomb is refused before
any pixel is decoded, and a large image is decoded no larger than the canvas that will hold it
(:mod:`arr_coc.engine.canvas` asks for that size). Every error names the image and says what to do.
"""
from __future__ import annotations

import os
import struct
import warnings
from pathlib import Path
from typing import Union

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

ImageLike = Union[str, os.PathLike, Image.Image, np.ndarray, torch.Tensor]

# The largest image file read: PIL's decompression-bomb threshold (2 x Image.MAX_IMAGE_PIXELS, a 13377 x 13377
# image). A larger header is refused before any pixel is decoded; a smaller one is decoded at the coarsest
# integer reduction that still covers its canvas (JPEG: in the decoder), so memory follows the canvas.
MAX_IMAGE_PIXELS = 2 * 89_478_485
# What a damaged or hostile file can raise inside PIL's decoders; each is reported as a bad file.
DECODE_ERRORS = (OSError, SyntaxError, EOFError, ValueError, IndexError, struct.error, Image.DecompressionBombError)

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


def _orientation(img: Image.Image) -> int:
    """The EXIF orientation (1-8) from the header; 1 when absent or damaged (the pixels are shown as stored)."""
    try:
        return int(img.getexif().get(0x0112, 1))
    except (*DECODE_ERRORS, TypeError):
        return 1


def oriented_size(img: Image.Image) -> tuple[int, int]:
    """(H, W) of an image as displayed, i.e. after its EXIF orientation, read from the header alone."""
    w, h = img.size
    return (w, h) if _orientation(img) in (5, 6, 7, 8) else (h, w)


# What PIL's ImageOps.exif_transpose does per orientation; done here on the reduced image, not the full one.
_TRANSPOSE = {2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180, 4: Image.Transpose.FLIP_TOP_BOTTOM,
              5: Image.Transpose.TRANSPOSE, 6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE,
              8: Image.Transpose.ROTATE_90}
# A strip of the full image converted and reduced at a time: this many pixels (16 MB as 8-bit RGBA).
STRIP_PIXELS = 4_000_000


def reading_mode(img: Image.Image) -> str:
    """The mode a decoded image is read in: the narrowest one :func:`_pil_pixels` takes that PIL can box-reduce.

    Transparency of any kind becomes RGBA (composited over white later), 1-bit becomes L, palettes their
    colours, PIL's 16-bit modes I (values 0-65535); other modes are kept (converted to RGB after the reduction).

    >>> [reading_mode(Image.new(m, (1, 1))) for m in ("1", "P", "PA", "LA", "I;16", "F", "CMYK")]
    ['L', 'RGB', 'RGBA', 'RGBA', 'I', 'F', 'CMYK']
    """
    mode = img.mode
    if mode in ("LA", "PA", "La", "RGBa", "RGBA") or "transparency" in img.info:
        return "RGBA"
    if mode == "1":
        return "L"
    if mode == "P":
        return "RGB"
    if mode.startswith("I;16"):
        return "I"
    return mode


def _reduce(img: Image.Image, factor: int) -> Image.Image:
    """``img`` in :func:`reading_mode`, box-reduced by ``factor``, converted and reduced a strip of rows at a time.

    Converting first would widen the whole image (a palette PNG with transparency: 1 -> 4 bytes a pixel, and
    PIL's reduce of RGBA premultiplies alpha in a second full-size copy); strips of whole ``factor``-row boxes
    keep that to one strip, so memory is the file's own pixels plus the result. Equal to reducing at once.
    """
    mode = reading_mode(img)
    if factor < 2:
        return _convert(img, mode)
    w, h = img.size
    rows = max(1, STRIP_PIXELS // max(1, w * factor)) * factor
    out = Image.new(mode, (-(-w // factor), -(-h // factor)))
    for top in range(0, h, rows):
        strip = img.crop((0, top, w, min(h, top + rows)))
        out.paste(_convert(strip, mode).reduce(factor), (0, top // factor))
    return out


def _factor(size: tuple[int, int], orientation: int, fit: tuple[int, int]) -> int:
    """The largest integer reduction of a stored (W, H) ``size`` that keeps the upright image at least ``fit`` (H, W)."""
    h, w = (size[0], size[1]) if orientation in (5, 6, 7, 8) else (size[1], size[0])
    return max(1, min(h // max(1, fit[0]), w // max(1, fit[1])))


def _convert(img: Image.Image, mode: str) -> Image.Image:
    if img.mode == mode and "transparency" not in img.info:
        return img
    return img.convert("LA").convert(mode) if img.mode == "La" else img.convert(mode)  # PIL has no La -> RGBA


def _decoded(img: Image.Image, fit: tuple[int, int] | None = None, *, in_place: bool = False) -> Image.Image:
    """Decode ``img`` upright (EXIF orientation), in :func:`reading_mode`, no smaller than ``fit`` (H, W).

    All of PIL's decoding happens here, so a damaged file fails here and nowhere else. The image is reduced
    by the largest integer factor that keeps it at least ``fit`` before any conversion, float or wider mode
    (a 13377 x 13377 px page costs its canvas, not gigabytes), and turned upright after, on the small image.
    """
    orientation = _orientation(img)
    if in_place and fit is not None and img.format == "JPEG" and getattr(img, "tile", None):  # ours, not decoded yet
        factor = _factor(img.size, orientation, fit)
        if factor >= 2:  # the decoder itself works at 1/2, 1/4 or 1/8 scale, never below the request
            img.draft(img.mode, (img.size[0] // factor, img.size[1] // factor))
    img.load()
    out = _reduce(img, 1 if fit is None else _factor(img.size, orientation, fit))
    method = _TRANSPOSE.get(orientation)
    return out if method is None else out.transpose(method)


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


def decode_pil(img: Image.Image, fit: tuple[int, int] | None = None) -> torch.Tensor:
    """PIL image of any common mode -> [3, H, W] float32 in [0, 1], EXIF orientation applied."""
    try:
        decoded = _decoded(img, fit)
    except DECODE_ERRORS as e:
        raise ValueError(f"cannot decode the PIL image ({type(e).__name__}: {e})") from e
    return _pil_pixels(decoded)


def open_image(path: Union[str, os.PathLike]) -> Image.Image:
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
    except DECODE_ERRORS as e:
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
    with open_image(path) as img:
        return oriented_size(img)


def decode_file(img: Image.Image, path: Union[str, os.PathLike], fit: tuple[int, int] | None = None) -> torch.Tensor:
    """An image opened by :func:`open_image` -> [3, H, W] float32, decoded no smaller than ``fit``."""
    try:
        decoded = _decoded(img, fit, in_place=True)
    except DECODE_ERRORS as e:
        raise ValueError(f"cannot read image file '{path}': {e}") from e
    return _pil_pixels(decoded)


def _from_path(path: Union[str, os.PathLike], fit: tuple[int, int] | None = None) -> torch.Tensor:
    with open_image(path) as img:
        return decode_file(img, path, fit)


def _from_tensor(x: torch.Tensor) -> torch.Tensor:
    """[3, H, W] or [1, H, W] float in [0, 1], uint8 or bool -> [3, H, W] float32 (no copy if already so)."""
    if x.ndim != 3 or x.shape[0] not in (1, 3):
        hint = "; it looks channel-last, use x.permute(2, 0, 1)" if x.ndim == 3 and x.shape[-1] in (1, 3, 4) else ""
        hint = "; for a batch use make_canvas" if x.ndim == 4 else hint
        raise ValueError(f"tensor image has shape {tuple(x.shape)}; expected [3, H, W] or [1, H, W]{hint}")
    return _to_rgb(_tensor_to_float(x), "tensor image")


def _tensor_to_float(x: torch.Tensor) -> torch.Tensor:
    """A dense tensor image of a supported dtype as float32; any float dtype is converted, integers refused."""
    if x.layout != torch.strided:  # a sparse tensor may declare any size without holding it: never densified here
        raise TypeError(f"tensor image has layout {x.layout}; pass a dense tensor (x.to_dense() if it is small)")
    if x.is_meta:
        raise ValueError("tensor image is on the meta device and holds no pixels; pass a tensor with data")
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
        return decode_pil(src)
    if isinstance(src, np.ndarray):
        return _from_numpy(src)
    if isinstance(src, torch.Tensor):
        return _from_tensor(src)
    hint = " (for several images use make_canvas)" if isinstance(src, (list, tuple)) else ""
    raise TypeError(f"cannot load an image from a {type(src).__name__}{hint}; {_USAGE}")


def batch_pixels(images: torch.Tensor) -> torch.Tensor:
    """A [B, C, H, W] batch tensor (float in [0, 1], uint8 or bool) as checked float32 (no copy if already so).

    Raises:
        ValueError: zero size, NaN/inf, or float values outside [0, 1].
        TypeError: an unsupported dtype.
    """
    x = _tensor_to_float(images)
    _check(x, "image batch")
    return x
