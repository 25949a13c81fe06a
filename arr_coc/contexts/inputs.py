"""What a context can be: a PDF, a text file, several images, one image, or pages already made.

:func:`load_context` turns each into a :class:`~arr_coc.documents.page.Context`: a PDF's pages are
rendered by PDFium with their text layer (``pages`` a 1-based range like ``"1-20"``, ``dpi``), a
text file (``.txt``, ``.md``, ``.rst``, ``.tex``) is set on pages by
:func:`~arr_coc.documents.text_pages.render_text` in a recorded layout, and images become pages
without words (their text, if any, is found by OCR later). A context holds at most ``max_pages``
pages (default :data:`MAX_PAGES`); more is refused before anything is rendered.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

import torch

from arr_coc.documents.page import Context, Page
from arr_coc.documents.pdf import DEFAULT_DPI, open_pdf, page_indices, read_pdf
from arr_coc.documents.text_pages import TextLayout, render_text_file
from arr_coc.imageio import load_image

# 64 A4 pages at 150 dpi hold ~180k token cells and ~1.7 GB of float pixels: more is a batch job,
# not one request. Raise it with max_pages= (--max-pages).
MAX_PAGES = 64
TEXT_SUFFIXES = (".txt", ".md", ".rst", ".tex", ".text")


def _check_count(n: int, max_pages: int, what: str) -> None:
    if n > max_pages:
        raise ValueError(f"{what} has {n} pages; a context holds at most {max_pages} "
                         f"(choose pages with --pages / pages=, or raise --max-pages / max_pages=)")


def _is_pdf(p: Path) -> bool:
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


def load_context(context: Any, *, pages: Any = None, dpi: float = DEFAULT_DPI, layout: TextLayout = TextLayout(),
                 max_pages: int = MAX_PAGES) -> Context:
    """A context from a PDF / text / image path, a list of images or paths, one image, or a Context.

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
    if isinstance(context, (str, os.PathLike)):
        p = Path(context)
        if _is_pdf(p):
            doc = open_pdf(p)
            try:
                n = len(page_indices(len(doc), pages, str(p)))
            finally:
                doc.close()
            _check_count(n, max_pages, str(p) if pages is None else f"{p} pages {pages}")
            return read_pdf(p, pages, dpi)
        if pages is not None:
            raise ValueError(f"pages= chooses pages of a PDF; {p} is not a PDF")
        if p.suffix.lower() in TEXT_SUFFIXES:
            ctx = render_text_file(p, layout)
            _check_count(len(ctx), max_pages, f"{p} rendered at {layout.size} px on {layout.width}x{layout.height} px pages")
            return ctx
        context = [context]
    if isinstance(context, torch.Tensor) and context.ndim == 4:
        context = list(context)
    if not isinstance(context, (list, tuple)):
        context = [context]
    if not context:
        raise ValueError("a context needs at least one page; pass a PDF, a text file or images")
    _check_count(len(context), max_pages, "the list of images")
    names = [str(c) if isinstance(c, (str, os.PathLike)) else f"<image {i}>" for i, c in enumerate(context)]
    out = [_image_page(c, i, name) for i, (c, name) in enumerate(zip(context, names))]
    return Context(out, names[0] if len(names) == 1 else "<images>", {"kind": "images", "n_pages": len(out),
                                                                       "sources": names})


def context_text(ctx: Context | Sequence[Page]) -> str:
    """The text of every page, pages separated by a blank line (what the context costs as text)."""
    pages = ctx.pages if isinstance(ctx, Context) else ctx
    return "\n\n".join(p.text for p in pages)
