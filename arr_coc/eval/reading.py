"""Reading: what the VLM would see of a token plan, and a real OCR engine reading it.

Shapes (canvas convention, see ``arr_coc.engine.canvas``): pixels [3, H, W] float in [0, 1], H, W multiples
of ``cell``; box_px (y0, x0, y1, x1) in canvas pixels (``scale_boxes`` maps original-image boxes there).

:func:`render` turns a :class:`arr_coc.engine.plan.Plan` into the pixels a VLM receives, at canvas size (the
views of :mod:`arr_coc.engine.views`: the full canvas, the downsampled image, the foveated view, or the
gestalt with variable-size squares pasted in), so an OCR engine run on it says whether the answer
survived the allocation.

Readers (``READERS``): ``tesseract`` (the Debian binary, one subprocess per crop) and ``rapidocr`` (PP-OCR ONNX models, offline).
Scores: ``anls`` (ST-VQA / DocVQA) and ``contains_score`` (ANLS against the best word window of the
reading, so neighbouring words that fall inside the crop margin are not penalised).

Two readings (``READINGS``): ``region`` reads the answer box plus a margin of the view
(:func:`read_region`: is a region known to hold the answer still legible?); ``find`` reads the whole
view and, for a plan of cells, those cells alone (:func:`find_reading`), not told where the answer is, and scores the
best-matching word window of all it read (:func:`arr_coc.eval.metrics.best_window`: can the answer be found in what
the VLM gets?).
"""
from __future__ import annotations

import io
import math
import os
import shutil
import subprocess
from typing import Protocol, Sequence, Union, runtime_checkable

import numpy as np
import torch  # noqa: F401  (the doctests use it)
from PIL import Image
from torch import Tensor

from arr_coc.data.boxes import Box, scale_boxes  # noqa: F401  (re-exported: eval.run maps boxes with it)
from arr_coc.engine.imageops import to_hwc_uint8
from arr_coc.engine.plan import Plan
from arr_coc.engine.views import (
    downsampled_grid,
    downsampled_view,
    foveated_view,
    gestalt_view,
)

# re-exported: the reading scores
from arr_coc.eval.metrics import anls, best_window, cells_to_pixels, contains_score, normalize_text  # noqa: F401
from arr_coc.ocr import DET_LIMIT_SIDE_LEN, rapidocr_engine, require_rapidocr
from arr_coc.registry import Registry

_INSTALL_TESSERACT = (
    "install the Debian package tesseract-ocr (apt-get install tesseract-ocr tesseract-ocr-eng), "
    "or choose --reader rapidocr"
)


# ----------------------------------------------------------------------------- plans


def render(plan: Plan, pixels: Tensor, cell: int) -> Tensor:
    """The pixels a VLM receives for ``plan``, at the size of ``pixels`` [3, hc * cell, wc * cell].

    full -> the pixels; native -> :func:`downsampled_view`; cells -> :func:`foveated_view`; squares ->
    the gestalt view with each square pasted in, shrunk to one cell (what its one token carries).

    Example:
        >>> px = torch.rand(3, 56, 56)
        >>> v = render(Plan("topk", "cells", (2, 2), gestalt=(1, 1), cells=torch.tensor([[1, 0]])), px, 28)
        >>> torch.equal(v[:, 28:, :28], px[:, 28:, :28]), torch.equal(render(Plan("full", "full", (2, 2)), px, 28), px)
        (True, True)
    """
    from arr_coc.allocators.patches import render_patches

    if plan.kind == "full":
        return pixels
    if plan.kind == "native":
        return downsampled_view(pixels, plan.native, cell)[0]
    if plan.kind == "cells":
        return foveated_view(pixels, plan.cells, cell, plan.gestalt)
    return render_patches(pixels, plan.squares, cell, gestalt_view(pixels, cell, plan.gestalt))


# What the find reading reads of a plan (rows record it: readings of other views never mix with these).
FIND_VIEWS = ("view", "saccades alone")


def saccades_view(plan: Plan, pixels: Tensor, cell: int) -> Tensor | None:
    """A plan's full-resolution cells alone, the rest of the page white; None for a plan without any.

    What the find reading reads beside the whole view (:func:`find_reading`): a plan of cells sends them as tokens of
    their own, which a reader of the whole view may lose in the gestalt around them.

    Example:
        >>> px = torch.rand(3, 56, 56)
        >>> v = saccades_view(Plan("topk", "cells", (2, 2), gestalt=(1, 1), cells=torch.tensor([[1, 0]])), px, 28)
        >>> torch.equal(v[:, 28:, :28], px[:, 28:, :28]), bool((v[:, :28] == 1).all()), bool((v[:, :, 28:] == 1).all())
        (True, True, True)
        >>> saccades_view(Plan("full", "full", (2, 2)), px, 28) is None
        True
    """
    from arr_coc.allocators.methods import cell_mask

    if plan.kind != "cells" or len(plan.cells) == 0:
        return None
    hc, wc = plan.grid
    sent = cells_to_pixels(cell_mask(plan), cell).bool().to(pixels.device)
    return torch.where(sent, pixels[:, : hc * cell, : wc * cell], torch.ones((), dtype=pixels.dtype))


def find_reading(reader: Reader, plan: Plan, pixels: Tensor, cell: int, answer: Union[str, Sequence[str]],
                 view: Tensor | None = None, text: str | None = None) -> tuple[float, str, int]:
    """The find reading of one plan: not told where the answer is, the answer's best word window in all it read.

    It reads the whole view (:func:`render`; or takes its ``text`` read before) and, for a plan of cells, those cells
    alone (:func:`saccades_view`), and keeps the better window. Tesseract binarises a whole view at one threshold:
    where a coarse gestalt's blurred lines fall on the dark side of it, the sharp cells among them are read as
    part of a dark blob and lost (a page read '' from a view whose cells print the answer: docs/coc.md, "The find
    reading reads the saccades alone too"). A plan without cells (full resolution, a downscaled page) is read once,
    as before.

    Returns:
        (score, the window that scored, the words read in the view that scored).
    """
    if text is None:
        text = reader.read(render(plan, pixels, cell) if view is None else view)
    best = (*best_window(text, answer), len(text.split()))
    alone = saccades_view(plan, pixels, cell)
    if alone is not None and best[0] < 1.0:  # a whole window found in the view cannot be bettered
        text = reader.read(alone)
        score, span = best_window(text, answer)
        if score > best[0]:
            best = (score, span, len(text.split()))
    return best


def rendered_tokens(plan: Plan) -> int:
    """Tokens the rendered plan holds: a native plan's downsampled grid may use fewer than its cap.

    >>> rendered_tokens(Plan("uniform_image", "native", (36, 27), native=529))
    520
    """
    if plan.kind == "native":
        rows, cols = downsampled_grid(*plan.grid, plan.native)
        return rows * cols
    return plan.tokens


# ----------------------------------------------------------------------------- boxes and crops


def union_box(boxes_px: Sequence[Box]) -> Box:
    """The smallest (y0, x0, y1, x1) box holding all boxes.

    Example:
        >>> union_box([(10, 20, 30, 40), (5, 30, 12, 60)])
        (5.0, 20.0, 30.0, 60.0)
    """
    if len(boxes_px) == 0:
        raise ValueError("union_box needs at least one (y0, x0, y1, x1) box, got none")
    b = np.asarray(boxes_px, dtype=np.float64)  # [N, 4]
    if b.ndim != 2 or b.shape[1] != 4:
        raise ValueError(f"boxes must be (y0, x0, y1, x1) each, got an array of shape {b.shape}")
    return (float(b[:, 0].min()), float(b[:, 1].min()), float(b[:, 2].max()), float(b[:, 3].max()))


def crop_px(image: Tensor, box_px: Box, margin_px: float = 0.0) -> Tensor:
    """Crops a (y0, x0, y1, x1) pixel box grown by ``margin_px`` on each side, clipped to the image.

    Rows floor(y0 - margin) .. ceil(y1 + margin) (end exclusive), columns alike, clipped to the
    image; the box itself must overlap the image.

    Args:
        image: [C, H, W].
        box_px: (y0, x0, y1, x1) in the image's pixels, y0 <= y1, x0 <= x1.
        margin_px: extra pixels on every side (>= 0).

    Returns:
        [C, h, w] view of ``image`` (h, w >= 1).

    Example:
        >>> crop_px(torch.zeros(3, 100, 200), (10.5, 20, 30, 190), margin_px=15).shape
        torch.Size([3, 45, 195])
    """
    if not isinstance(image, Tensor) or image.ndim != 3:
        shape = tuple(image.shape) if isinstance(image, Tensor) else type(image).__name__
        raise ValueError(f"crop_px: image must be a [C, H, W] tensor, got {shape}")
    if len(box_px) != 4 or not all(math.isfinite(float(v)) for v in box_px):
        raise ValueError(f"crop_px: box must be 4 finite numbers (y0, x0, y1, x1) px, got {box_px!r}")
    if not math.isfinite(float(margin_px)) or margin_px < 0:
        raise ValueError(f"crop_px: margin_px must be >= 0, got {margin_px!r}")
    y0, x0, y1, x1 = (float(v) for v in box_px)
    H, W = image.shape[-2:]
    if y1 < y0 or x1 < x0:
        raise ValueError(f"crop_px: box {box_px!r} has y1 < y0 or x1 < x0; boxes are (y0, x0, y1, x1)")
    if y1 <= 0 or x1 <= 0 or y0 >= H or x0 >= W:
        raise ValueError(
            f"crop_px: box (y0, x0, y1, x1) = {box_px!r} px lies outside the {H}x{W} px image; "
            f"map original-image boxes to canvas pixels first (scale_boxes with Canvas.scales)"
        )
    ya, yb = max(0, math.floor(y0 - margin_px)), min(H, math.ceil(y1 + margin_px))
    xa, xb = max(0, math.floor(x0 - margin_px)), min(W, math.ceil(x1 + margin_px))
    return image[:, ya : max(yb, ya + 1), xa : max(xb, xa + 1)]


def to_gray_pil(image: Tensor) -> Image.Image:
    """[3, h, w] or [1, h, w] float in [0, 1] -> 8-bit grayscale PIL image (ITU-R 601 luma).

    Example:
        >>> to_gray_pil(torch.ones(3, 2, 5)).size, to_gray_pil(torch.ones(3, 2, 5)).getpixel((0, 0))
        ((5, 2), 255)
    """
    if not isinstance(image, Tensor) or image.ndim != 3 or image.shape[0] not in (1, 3) or 0 in image.shape:
        shape = tuple(image.shape) if isinstance(image, Tensor) else type(image).__name__
        raise ValueError(f"a reader needs a non-empty [3, h, w] or [1, h, w] image tensor, got {shape}")
    u8 = to_hwc_uint8(image)  # [h, w, 1 or 3]
    return Image.fromarray(u8[..., 0] if u8.shape[-1] == 1 else u8, "L" if u8.shape[-1] == 1 else "RGB").convert("L")


# ----------------------------------------------------------------------------- readers
@runtime_checkable
class Reader(Protocol):
    """An OCR engine: ``read(image [3, h, w] float in [0, 1]) -> str``."""

    def read(self, image: Tensor) -> str: ...


READERS: Registry[type] = Registry("reader")


def make_reader(name: str, **kwargs) -> Reader:
    """Builds a registered reader by name (``READERS.names()``); unknown names list the known ones.

    Example:
        >>> make_reader("tesseract", psm=7).psm
        7
    """
    return READERS.get(name)(**kwargs)


@READERS.register("tesseract")
class TesseractReader:
    """Tesseract (the ``tesseract`` binary) on an 8-bit grayscale crop.

    ``psm=6`` ("a single uniform block of text") because a reader gets a small crop around one
    answer: the default automatic page segmentation (psm 3) looks for columns and paragraphs and
    often finds no text block at all in a one-line crop, while psm 6 reads the crop as lines of text
    (one line or several, for multi-line answers). ``psm=7`` forces a single line.

    Crops shorter than ``upscale_below_px`` are enlarged ``upscale`` times (LANCZOS) first: Tesseract
    is tuned for capitals of ~20-40 px, while FUNSD answer boxes on the canvas are ~15 px high
    (median). Measured on 150 FUNSD question -> answer pairs at full resolution (canvas 1008x756,
    psm 6, 8 px margin, mean ``contains_score``): no upscale 0.605, 2x below 40 px 0.740, 2x always
    0.748, 3x below 40 px 0.734; so 2x below 40 px is the default (``upscale=1`` switches it off).
    In the same run psm 7 scored 0.599 and psm 3 0.483. A white border added around the crop
    lowered the score (0.754 -> 0.667 over margins 0-8 px), so there is none.

    Each crop is piped to its own ``tesseract stdin stdout`` process started with
    ``OMP_THREAD_LIMIT=threads`` in that process's environment only: Tesseract's OpenMP threads make
    it ~7x slower on small crops, and the limit must not leak into the caller's process (which
    would throttle every other OpenMP user there).
    """

    def __init__(self, psm: int = 6, lang: str = "eng", upscale: float = 2.0, upscale_below_px: int = 40,
                 threads: int = 1, cmd: str = "tesseract") -> None:
        exe = shutil.which(cmd)
        if exe is None:
            raise RuntimeError(f"the tesseract binary was not found: {_INSTALL_TESSERACT}")
        if isinstance(psm, bool) or int(psm) != psm or not 0 <= psm <= 13:
            raise ValueError(f"psm must be a Tesseract page segmentation mode 0..13, got {psm!r}")
        if not upscale >= 1:
            raise ValueError(f"upscale must be >= 1 (1 switches it off), got {upscale!r}")
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads must be a positive int, got {threads!r}")
        self.cmd, self.threads = exe, threads
        self.psm, self.lang, self.upscale, self.upscale_below_px = int(psm), lang, float(upscale), upscale_below_px

    def command(self) -> list[str]:
        """The argument list of one reading (image on stdin, text on stdout)."""
        return [self.cmd, "stdin", "stdout", "-l", self.lang, "--psm", str(self.psm)]

    def read(self, image: Tensor) -> str:
        img = to_gray_pil(image)
        if self.upscale > 1 and img.height < self.upscale_below_px:
            size = (round(img.width * self.upscale), round(img.height * self.upscale))
            img = img.resize(size, Image.LANCZOS)
        png = io.BytesIO()
        img.save(png, "PNG")
        env = {**os.environ, "OMP_THREAD_LIMIT": str(self.threads)}  # this child only
        done = subprocess.run(self.command(), input=png.getvalue(), capture_output=True, env=env, check=False)
        if done.returncode != 0:
            err = done.stderr.decode("utf-8", "replace").strip().splitlines()
            raise RuntimeError(f"tesseract exited with {done.returncode}: {err[-1] if err else 'no message'}")
        return " ".join(done.stdout.decode("utf-8", "replace").split())

    def __repr__(self) -> str:
        return (f"TesseractReader(psm={self.psm}, lang={self.lang!r}, upscale={self.upscale}, "
                f"upscale_below_px={self.upscale_below_px}, threads={self.threads})")


@READERS.register("rapidocr")
class RapidOCRReader:
    """RapidOCR (PP-OCR detection + recognition, ONNX models shipped in the wheel; offline).

    The engine comes from ``arr_coc.ocr.rapidocr_engine`` on the first ``read`` (one per options and
    process). Detection keeps a crop at its own size (``Det.limit_type="max"``): the library default
    scales the short side up to 736 px, which turns a 300x60 px crop into 3680x736 px and costs ~5 s
    instead of ~0.15 s. Texts come back in the engine's reading order (top to bottom, left to right)
    and are joined by spaces.

    On the same 100 FUNSD answers at full resolution (4 px margin) it scored 0.884 mean
    ``contains_score`` against Tesseract's 0.739, at 0.06 s per crop against 0.16 s (2-core CPU).
    """

    def __init__(self, det_limit_side_len: int = DET_LIMIT_SIDE_LEN) -> None:
        require_rapidocr("the rapidocr reader", ", or choose --reader tesseract")
        self.det_limit_side_len = det_limit_side_len

    def read(self, image: Tensor) -> str:
        rgb = np.asarray(to_gray_pil(image).convert("RGB"))  # [h, w, 3] uint8, the same input Tesseract gets
        out = rapidocr_engine(self.det_limit_side_len)(rgb)
        return " ".join(t.strip() for t in (out.txts or ()) if t.strip())

    def __repr__(self) -> str:
        return f"RapidOCRReader(det_limit_side_len={self.det_limit_side_len})"


READINGS = ("region", "find")
# the whole view is a page, not a crop: Tesseract's sparse-text mode finds scattered form fields and
# receipt lines that block segmentation (psm 3) merges or drops (the crop reader's psm 6 reads one block)
VIEW_READER_OPTIONS: dict[str, dict] = {"tesseract": {"psm": 11}}


def make_view_reader(name: str, reading: str = "region") -> Reader:
    """The reader ``name`` set up for ``reading``: crops of the answer region, or whole views (``find``).

    Example:
        >>> make_view_reader("tesseract").psm, make_view_reader("tesseract", "find").psm
        (6, 11)
    """
    if reading not in READINGS:
        raise ValueError(f"unknown reading {reading!r}; choose one of {', '.join(READINGS)}")
    return make_reader(name, **(VIEW_READER_OPTIONS.get(name, {}) if reading == "find" else {}))


def read_region(
    reader: Union[Reader, str], view: Tensor, boxes_px: Sequence[Box], margin_px: float = 4.0
) -> str:
    """Reads the union of the answer boxes (canvas pixels) plus a margin from a view.

    Args:
        reader: a ``Reader`` or a registered reader name.
        view: [3, H, W] canvas-sized view (full canvas, ``foveated_view``, ``downsampled_view``).
        boxes_px: answer boxes (y0, x0, y1, x1) in canvas pixels.
        margin_px: pixels added on every side of the union box. Small margins read best: on 100
            FUNSD answers at full resolution Tesseract scored 0.770 / 0.778 / 0.739 / 0.720 (mean
            ``contains_score``) with 0 / 2 / 4 / 8 px; 4 px keeps slack for loose boxes.

    Returns:
        The text read, whitespace collapsed.
    """
    if isinstance(reader, str):
        reader = make_reader(reader)
    if not isinstance(reader, Reader):
        raise TypeError(f"reader must have a read(image) -> str method or be one of {READERS.names()}, got {reader!r}")
    return reader.read(crop_px(view, union_box(boxes_px), margin_px))
