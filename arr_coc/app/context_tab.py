"""The microscope over a context: a PDF or several images -> one budget over the pages, the strip, one page opened.

The pages go through the same ARR the image view uses (shipped scorer, default channels, the
microscope's shared OCR cache), with :func:`arr_coc.contexts.allocate`: every page a small
gestalt, the saccades ranked over all pages. What the page shows: the totals with the text tokens
and the compression ratio, a table of pages (gestalt, saccades, where the text came from), the pages
as a strip, and the page the user opens at full size with its saccades outlined.

One request's memory is bounded before anything is rendered: the pages' rendered pixels (PDFium's
page sizes x dpi, or the images as decoded) are summed against :data:`MAX_CONTEXT_PIXELS`, and a
page larger than :data:`MAX_PAGE_PIXELS` is refused by its number. What outlives a request is a
:class:`ContextView`: the summary, the strip and each opened page as PNG bytes, never the pages.
"""
from __future__ import annotations

import functools
import gc
import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from PIL import Image

from arr_coc.app.service import Microscope, Settings, check_question, read_upload
from arr_coc.contexts import ContextAllocation, allocate
from arr_coc.contexts.inputs import is_pdf
from arr_coc.documents.pdf import DEFAULT_DPI, MAX_DPI, page_geometry
from arr_coc.viz import page_strip

MAX_APP_PAGES = 30  # one request on a shared CPU; `arr-coc look --max-pages` takes more
# What one request may render, summed over its pages: 7 US Letter pages at 150 dpi (2.10 MP each), 20 at 90 dpi,
# 30 at 75 dpi. Measured: each pixel costs about 30 bytes until the request ends (a float32 page and its float32
# canvas, kept for the ranking over all pages) on top of ~1.4 GB for the process, its models and one page's
# texture; at this bound the server stays under 2 GB (docs/reliability.md, "Peak memory of the microscope").
MAX_CONTEXT_PIXELS = 16_000_000
# One page: a US Tabloid / A3 sheet at 150 dpi (17 x 11 in = 4.2 MP) and more; a poster is refused by its number.
MAX_PAGE_PIXELS = 8_000_000
# Pages scored at once: a page's texture is computed at full resolution. Measured on 20 US Letter pages at 150 dpi:
# a peak of 2943 MB four at a time (the library's default), 2592 MB one at a time.
APP_CHUNK = 1
STRIP_HEIGHT = 240
PAGE_HEIGHT = 900


def pdf_page_sizes(path: str | Path, pages: str | None, dpi: float) -> list[tuple[int, int, int]]:
    """(page number, H, W) of each chosen page as PDFium would render it at ``dpi``; nothing is rendered.

    Raises:
        ValueError: what :func:`~arr_coc.documents.pdf.page_geometry` refuses (a page that cannot load, a bad
            page range or file); the page sizes are checked by :func:`check_pixels`, against the microscope's bound.
    """
    idx, sizes, _, _ = page_geometry(path, pages, dpi, check_pixels=False)
    return [(i + 1, h, w) for i, (h, w) in zip(idx, sizes)]


def check_pixels(sizes: Sequence[tuple[int, int, int]], dpi: float | None) -> None:
    """Refuse pages that would render too large, one by one and in all, before anything is rendered.

    ``sizes``: (page number, H, W) per page; ``dpi``: the render's, None for images (as decoded).
    """
    what, at = ("page", f" at {dpi:g} dpi") if dpi else ("image", " as read")
    lower = ' or choose a lower "PDF dpi"' if dpi else ""
    for number, h, w in sizes:
        if h * w > MAX_PAGE_PIXELS:
            raise ValueError(f"{what} {number} is {w}x{h} px{at} = {h * w / 1e6:.3g} megapixels; the microscope takes "
                             f"pages of at most {MAX_PAGE_PIXELS / 1e6:.3g} MP: leave it out{lower}")
    total = sum(h * w for _, h, w in sizes)
    if total > MAX_CONTEXT_PIXELS:
        fit = 0
        while fit < len(sizes) and sum(h * w for _, h, w in sizes[:fit + 1]) <= MAX_CONTEXT_PIXELS:
            fit += 1
        raise ValueError(f"these {len(sizes)} {what}s are {total / 1e6:.3g} megapixels{at}; the microscope takes "
                         f"{MAX_CONTEXT_PIXELS / 1e6:.3g} MP per request (here the first {fit}): "
                         + ('choose fewer in "PDF pages" or a lower "PDF dpi"' if dpi else "send fewer or smaller images"))


def _read_images(paths: Sequence[str | Path]) -> list[torch.Tensor]:
    """The uploaded images as decoded for the canvas, refusing the request once their pixels pass the bound."""
    if len(paths) > MAX_APP_PAGES:
        raise ValueError(f"{len(paths)} images; the microscope takes at most {MAX_APP_PAGES} per context")
    images, sizes = [], []
    for i, p in enumerate(paths):
        images.append(read_upload(p))
        sizes.append((i + 1, *images[-1].shape[-2:]))
        check_pixels(sizes, None)
    return images


def run_context(scope: Microscope, paths: Sequence[str | Path], question: str | None, tokens: Any,
                pages: str | None = None, dpi: float = DEFAULT_DPI) -> ContextAllocation:
    """Allocate ``tokens`` over the uploaded PDF (``pages``: a 1-based range) or images, for ``question``."""
    q = check_question(question)
    if not paths:
        raise ValueError("upload a PDF or several images first")
    whole = isinstance(tokens, (int, float)) and not isinstance(tokens, bool) and float(tokens).is_integer()
    if not whole or tokens < 2:
        raise ValueError(f"the tokens T must be a whole number of at least 2 (a gestalt and a saccade), got {tokens}")
    pdfs = [p for p in paths if is_pdf(Path(p))]
    if pdfs and len(paths) > 1:
        raise ValueError("upload one PDF, or several images, not both")
    real = isinstance(dpi, (int, float)) and not isinstance(dpi, bool) and math.isfinite(dpi)
    if pdfs and not (real and 0 < dpi <= MAX_DPI):
        raise ValueError(f"the PDF dpi must be a number in (0, {MAX_DPI:g}], got {dpi}")
    if pdfs:
        sizes = pdf_page_sizes(pdfs[0], pages or None, dpi)
        if len(sizes) > MAX_APP_PAGES:
            raise ValueError(f"{Path(pdfs[0]).name} has {len(sizes)} pages{' in ' + pages if pages else ''}; the "
                             f"microscope takes at most {MAX_APP_PAGES} (give PDF pages, e.g. 1-{MAX_APP_PAGES})")
        check_pixels(sizes, dpi)
        context: Any = str(pdfs[0])
    else:
        context = _read_images(paths)
    arr = scope.arr(Settings(cell=scope.cell))
    with torch.inference_mode():
        return allocate(arr, context, q, int(tokens), pages=(pages or None) if pdfs else None,
                        dpi=dpi, max_pages=MAX_APP_PAGES, chunk=APP_CHUNK)


def context_summary(alloc: ContextAllocation) -> str:
    """Markdown: the totals, the compression ratio and a row per page."""
    ratio = ("no text found, so no compression ratio" if alloc.compression is None else
             f"{alloc.text_tokens} text tokens ({alloc.tokenizer}) -> **compression {alloc.compression:.1f}x**")
    lines = [f"**{len(alloc.pages)} pages**: sent **{alloc.tokens}** visual tokens = {alloc.gestalt_tokens} gestalt + "
             f"{alloc.saccades} saccades, of {alloc.full_tokens} at full resolution; {ratio}.", "",
             "| page | gestalt | saccades | text from |", "|---:|---:|---:|---|"]
    for p in alloc.pages:
        g = p.plan.gestalt
        lines.append(f"| {p.index + 1} | {g[0]}x{g[1]} | {p.saccades} | {p.text_from} |")
    return "\n".join(lines)


def strip(alloc: ContextAllocation, height: int = STRIP_HEIGHT) -> np.ndarray:
    """[height, W, 3] uint8: every page with its saccades outlined."""
    return page_strip([p.image for p in alloc.pages], [p.plan.cells for p in alloc.pages], alloc.pages[0].cell,
                      height)


def open_page(alloc: ContextAllocation, number: Any, height: int = PAGE_HEIGHT) -> np.ndarray:
    """[height, W, 3] uint8: page ``number`` (1-based, as listed) with its saccades outlined."""
    listed = [p.index + 1 for p in alloc.pages]
    if number not in listed:
        raise ValueError(f"page {number} is not in this context; open one of {listed[0]}-{listed[-1]}")
    p = alloc.pages[listed.index(number)]
    return page_strip([p.image], [p.plan.cells], p.cell, height)


def _png(rgb: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


@dataclass(frozen=True)
class ContextView:
    """What a context request leaves for the page: its summary, its strip, and every page as opened (PNG bytes).

    Kept in the browser session's state so "open page" needs no pages, canvases or scores: a few hundred KB a page.
    """

    summary: str
    strip: np.ndarray  # [STRIP_HEIGHT, W, 3] uint8
    numbers: tuple[int, ...]  # the pages, 1-based, as listed
    opened: tuple[bytes, ...]  # per page: PNG of open_page
    first: int  # the page with the most saccades, opened first

    @classmethod
    def of(cls, alloc: ContextAllocation) -> ContextView:
        numbers = tuple(p.index + 1 for p in alloc.pages)
        first = alloc.pages[max(range(len(alloc.pages)), key=lambda i: alloc.pages[i].saccades)].index + 1
        return cls(context_summary(alloc), strip(alloc), numbers, tuple(_png(open_page(alloc, n)) for n in numbers),
                   first)

    def page(self, number: Any) -> np.ndarray:
        """[PAGE_HEIGHT, W, 3] uint8: what :func:`open_page` drew for page ``number``."""
        if number not in self.numbers:
            raise ValueError(f"page {number} is not in this context; open one of {self.numbers[0]}-{self.numbers[-1]}")
        with Image.open(io.BytesIO(self.opened[self.numbers.index(number)])) as img:
            return np.asarray(img.convert("RGB"))

    @property
    def nbytes(self) -> int:
        return self.strip.nbytes + sum(len(b) for b in self.opened)


def context_request(scope: Microscope, paths: Sequence[str | Path], question: str | None, tokens: Any,
                    pages: str | None = None, dpi: float = DEFAULT_DPI) -> ContextView:
    """One click of "Allocate over the context": the allocation drawn; its pages, canvases and scores are not kept."""
    return ContextView.of(run_context(scope, paths, question, tokens, pages, dpi))


def release_memory() -> None:
    """Collect what a request left in reference cycles and give the C heap's free pages back to the system.

    Cycles a request makes are young: collecting the two younger generations takes milliseconds, where a full
    collection over the imported libraries takes a second or more. glibc keeps freed blocks below its (growing)
    mmap threshold in the heap; without the trim the resident set stays near the request's peak. Only the
    collection where the C library has no ``malloc_trim``.
    """
    gc.collect(1)
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.lru_cache(maxsize=1)
def _malloc_trim() -> Any:
    import ctypes

    try:
        return ctypes.CDLL(None).malloc_trim  # the process's own C library (glibc)
    except (OSError, AttributeError):
        return None
