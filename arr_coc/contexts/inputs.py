"""What a context can be: a PDF, a text file, several images, one image, or pages already made.

:func:`load_context` turns each into a :class:`~arr_coc.documents.page.Context`: a PDF's pages are
rendered by PDFium with their text layer (``pages`` a 1-based range like ``"1-20"``, ``dpi``), a
text file (``.txt``, ``.md``, ``.rst``, ``.tex``) is set on pages by
:func:`~arr_coc.documents.text_pages.render_text` in a recorded layout, and images become pages
without words (their text, if any, is found by OCR later). :func:`open_context` does the same
without drawing anything: it sizes every page and refuses, in one line naming the option to change,
more than ``max_pages`` pages (default :data:`MAX_PAGES`), a PDF page that does not load or would draw
more than :data:`~arr_coc.documents.pdf.MAX_PAGE_PIXELS` at ``dpi``, a text longer than its pages
or with characters its font cannot draw, and pages that together draw more than
:data:`MAX_CONTEXT_PIXELS`; its pages are then drawn a few at a time.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from arr_coc.documents.page import Context, Page
from arr_coc.documents.pdf import DEFAULT_DPI, open_pdf, page_geometry, pdf_meta, read_page
from arr_coc.documents.text_pages import TextLayout, layout_text, read_text_file
from arr_coc.engine.imageio import load_image, open_image, oriented_size

# 64 A4 pages at 150 dpi hold ~180k token cells (one ranking over all of them): more is a batch job,
# not one request. Raise it with max_pages= (--max-pages).
MAX_PAGES = 64
# Every page of a PDF or a text is drawn (a few at a time) before its canvas is made: 256 million pixels
# (64 A4 pages at 200 dpi; 117 at the default 150) bound the drawing a context costs, checked from the page
# sizes before anything is drawn.
MAX_CONTEXT_PIXELS = 256_000_000
TEXT_SUFFIXES = (".txt", ".md", ".rst", ".tex", ".text")


def _check_count(n: int, max_pages: int, what: str) -> None:
    if n > max_pages:
        raise ValueError(f"{what} has {n} pages; a context holds at most {max_pages} "
                         f"(choose pages with --pages / pages=, or raise --max-pages / max_pages=)")


def is_pdf(p: Path) -> bool:
    """A .pdf name, or a file whose first 1024 bytes hold the %PDF- header."""
    if p.suffix.lower() == ".pdf":
        return True
    if not p.is_file():
        return False
    with open(p, "rb") as f:
        return b"%PDF-" in f.read(1024)


def _image_page(image: Any, i: int, source: str) -> Page:
    pixels = load_image(image)  # [3, H, W] float32
    h, w = int(pixels.shape[-2]), int(pixels.shape[-1])
    return Page(pixels, [], [], i, source, None, (h, w))


@dataclass
class OpenContext:
    """A context's pages before any is drawn: their sizes, checked, and how to draw a few of them.

    Attributes:
        source, meta: as :class:`~arr_coc.documents.page.Context` records them.
        sizes: per page (H, W) px as drawn (an image file: its size; it is decoded no larger than its canvas).
        draw: positions -> per position (the page, what the canvas is made from: its pixels or its image file).
    """

    source: str
    meta: dict
    sizes: list[tuple[int, int]]
    draw: Callable[[Sequence[int]], list[tuple[Page, Any]]]

    def __len__(self) -> int:
        return len(self.sizes)

    def load(self) -> Context:
        """Every page drawn, at once."""
        pages = [page if page.image is not None else _image_page(src, page.index, page.source)
                 for page, src in self.draw(range(len(self)))]
        return Context(pages, self.source, self.meta)


def _check_pixels(sizes: Sequence[tuple[int, int]], what: str, option: str) -> None:
    total = sum(h * w for h, w in sizes)
    if total > MAX_CONTEXT_PIXELS:
        raise ValueError(f"the {len(sizes)} pages of {what} are {total / 1e6:.0f} million pixels drawn, more than a "
                         f"context's {MAX_CONTEXT_PIXELS // 1_000_000} million; {option}")


def _fit_total(points: Sequence[tuple[float, float]]) -> int:
    """The largest whole dpi at which pages of these (w, h) points draw at most :data:`MAX_CONTEXT_PIXELS`."""
    def total(dpi: int) -> int:
        return sum(math.ceil(w * dpi / 72) * math.ceil(h * dpi / 72) for w, h in points)

    dpi = math.floor(72 * math.sqrt(MAX_CONTEXT_PIXELS / max(sum(w * h for w, h in points), 1e-9)))
    while dpi > 1 and total(dpi) > MAX_CONTEXT_PIXELS:
        dpi -= 1
    return max(dpi, 1)


def _open_pdf(p: Path, pages: Any, dpi: float, max_pages: int) -> OpenContext:
    idx, sizes, points, n_doc = page_geometry(p, pages, dpi)
    _check_count(len(idx), max_pages, str(p) if pages is None else f"{p} pages {pages}")
    if sum(h * w for h, w in sizes) > MAX_CONTEXT_PIXELS:
        _check_pixels(sizes, f"{p} at {dpi:g} dpi", f"lower --dpi / dpi= to {_fit_total(points):g} or less, or "
                                                      f"choose fewer pages with --pages / pages=")

    def draw(positions: Sequence[int]) -> list[tuple[Page, Any]]:
        doc = open_pdf(p)
        try:
            out = [read_page(doc, idx[j], dpi, str(p)) for j in positions]
        finally:
            doc.close()
        return [(page, page.image) for page in out]

    return OpenContext(str(p), pdf_meta(p, n_doc, idx, dpi), sizes, draw)


def _open_text(p: Path, layout: TextLayout, max_pages: int) -> OpenContext:
    setting = layout_text(read_text_file(p), layout, str(p), max_pages)
    sizes = [setting.size] * len(setting)
    _check_pixels(sizes, f"{p} set on {layout.width}x{layout.height} px pages",
                  "choose a smaller --page-width / --page-height or a shorter text")

    def draw(positions: Sequence[int]) -> list[tuple[Page, Any]]:
        return [(page, page.image) for page in (setting.page(j) for j in positions)]

    return OpenContext(str(p), setting.meta, sizes, draw)


def _open_images(items: Sequence[Any], max_pages: int) -> OpenContext:
    _check_count(len(items), max_pages, "the list of images")
    names = [str(c) if isinstance(c, (str, os.PathLike)) else f"<image {i}>" for i, c in enumerate(items)]
    pages: list[Page] = []
    for i, (c, name) in enumerate(zip(items, names)):
        if isinstance(c, (str, os.PathLike)):  # the header's size; decoded later, no larger than its canvas
            with open_image(c) as img:
                pages.append(Page(None, [], [], i, name, None, oriented_size(img)))
        else:  # already in memory: loaded as today
            pages.append(_image_page(c, i, name))

    def draw(positions: Sequence[int]) -> list[tuple[Page, Any]]:
        return [(pages[j], pages[j].image if pages[j].image is not None else items[j]) for j in positions]

    meta = {"kind": "images", "n_pages": len(items), "sources": names}
    return OpenContext(names[0] if len(names) == 1 else "<images>", meta, [pg.size for pg in pages], draw)


def open_context(context: Any, *, pages: Any = None, dpi: float = DEFAULT_DPI, layout: TextLayout = TextLayout(),
                 max_pages: int = MAX_PAGES) -> OpenContext:
    """A context's pages, sized and checked, nothing drawn: the arguments of :func:`load_context`.

    Checked before any page is drawn: the page count (``max_pages``), every PDF page's size at ``dpi``
    (:data:`~arr_coc.documents.pdf.MAX_PAGE_PIXELS`) and that it loads, a text's length (laid out, not
    drawn) and the glyphs its font has, and the pixels all pages draw (:data:`MAX_CONTEXT_PIXELS`).
    """
    if isinstance(context, Context):
        _check_count(len(context), max_pages, f"the context {context.source}")
        if any(pg.image is None for pg in context.pages):
            raise ValueError("allocation needs rendered pages; read the PDF with render=True")
        return OpenContext(context.source, dict(context.meta), [pg.size for pg in context.pages],
                           lambda positions: [(context.pages[j], context.pages[j].image) for j in positions])
    if isinstance(context, (str, os.PathLike)):
        p = Path(context)
        if is_pdf(p):
            return _open_pdf(p, pages, dpi, max_pages)
        if pages is not None:
            raise ValueError(f"pages= chooses pages of a PDF; {p} is not a PDF")
        if p.suffix.lower() in TEXT_SUFFIXES:
            return _open_text(p, layout, max_pages)
        context = [context]
    if isinstance(context, torch.Tensor) and context.ndim == 4:
        context = list(context)
    if not isinstance(context, (list, tuple)):
        context = [context]
    if not context:
        raise ValueError("a context needs at least one page; pass a PDF, a text file or images")
    return _open_images(context, max_pages)


def load_context(context: Any, *, pages: Any = None, dpi: float = DEFAULT_DPI, layout: TextLayout = TextLayout(),
                 max_pages: int = MAX_PAGES) -> Context:
    """A context from a PDF / text / image path, a list of images or paths, one image, or a Context.

    Every page is drawn and held at once; :func:`arr_coc.contexts.allocate` given the path draws a
    few at a time. Everything :func:`open_context` checks is checked first.

    Args:
        context: what to read (see the module docstring).
        pages: a PDF's pages: None for all, 0-based indices, or a 1-based range string (``"1-20"``).
        dpi: a PDF's render resolution.
        layout: how a text file is set on pages.
        max_pages: the most pages taken.

    Example:
        >>> ctx = load_context(torch.rand(3, 56, 84))
        >>> len(ctx), ctx.pages[0].size, ctx.meta["kind"]
        (1, (56, 84), 'images')
    """
    if isinstance(context, Context):
        _check_count(len(context), max_pages, f"the context {context.source}")
        return context
    return open_context(context, pages=pages, dpi=dpi, layout=layout, max_pages=max_pages).load()
