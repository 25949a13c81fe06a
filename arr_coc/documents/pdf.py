"""Born-digital PDFs as pages: PDFium renders each page and its text layer gives every word's box.

PDFium (through pypdfium2, whose wheel ships the engine) reports each character of a page's text
layer with its box in PDF points, origin at the bottom left of the page, and inserts generated
spaces and line breaks where the layout has them. Here characters are grouped into words (split at
whitespace) and lines (split at line breaks), and every box is moved into the rendered image's
pixels: relative to the page's effective box, y flipped, the page's own rotation applied, scaled by
the render. The effective box is the one PDFium renders: the CropBox clipped to the MediaBox, either
inherited from the page tree (PDF 1.7 section 7.7.3.4) where the page leaves it out, as is /Rotate.
PDFium ignores /UserUnit in rendering and in the text layer alike, so boxes and pixels still agree.

Pages are chosen by 0-based indices or by a 1-based range string as a print dialog takes it
(``"1-3,7"``). A missing file, a file that is not a PDF, an encrypted PDF and a page outside the
document each raise one line that says what to do.

Shapes: ``Page.image`` [3, H, W] float32 in [0, 1]; boxes (y0, x0, y1, x1) px.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Sequence, Union

import numpy as np
import pypdfium2 as pdfium
import pypdfium2.internal as pdfium_i
import pypdfium2.raw as pdfium_c
import torch

from arr_coc.documents.font_box import font_box, page_fonts
from arr_coc.documents.page import Box, Context, Page, Word, lines_from_breaks, union

PageSpec = Union[str, int, Sequence[int], None]

# 150 dpi puts 10 pt body text at ~21 px high: legible to OCR and to a VLM's 14 px patches, while an
# A4 page stays at 1240 x 1754 px (the canvas caps a side at 1792 px).
DEFAULT_DPI = 150.0
# Past 1200 dpi an A4 page is ~10k px a side (~400 MB as float32): a typo, not a request.
MAX_DPI = 1200.0
# A page is drawn whole before its canvas (at most 1792 x 1792 px) is made from it: PDFium's bitmap, the
# uint8 copy and the float32 copy cost ~19 bytes a pixel, so 25 million pixels (an A4 page at 500 dpi is
# 24.2 million) stay under 0.5 GB. A larger page (200 inches wide, A4 at 1200 dpi) is refused before it is
# drawn, with the dpi at which it would fit.
MAX_PAGE_PIXELS = 25_000_000
_POINTS_PER_INCH = 72.0
# A line break, or a run of whitespace, ends a word; control codes PDFium emits (e.g. 0x02 for a
# soft hyphen at a line end, 0xFFFE) carry no text.
_LINE_BREAKS = {"\n", "\r"}


def open_pdf(path: Union[str, os.PathLike]) -> pdfium.PdfDocument:
    """Opens a PDF, raising one actionable line for a missing, non-PDF, damaged or encrypted file.

    >>> open_pdf("/nonexistent/a.pdf")
    Traceback (most recent call last):
    ...
    FileNotFoundError: no such PDF: /nonexistent/a.pdf
    """
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"no such PDF: {p}")
    if not p.is_file():
        raise IsADirectoryError(f"{p} is not a file; pass the path of a PDF")
    with open(p, "rb") as f:
        head = f.read(1024)
    # The PDF spec lets the header sit anywhere in the first 1024 bytes (some writers put junk first).
    if b"%PDF-" not in head:
        raise ValueError(f"{p} is not a PDF (no %PDF- header); pass a PDF, or an image to load_image")
    try:
        return pdfium.PdfDocument(str(p))
    except pdfium.PdfiumError:
        err_code = _load_error(p)
        if err_code is None:  # PDFium read it; pypdfium2 refuses a document without pages
            raise ValueError(f"{p} has no pages; pass a PDF with at least one page") from None
        if err_code in (pdfium_c.FPDF_ERR_PASSWORD, pdfium_c.FPDF_ERR_SECURITY):
            raise ValueError(
                f"{p} is encrypted; decrypt it first (e.g. qpdf --decrypt --password=PW in.pdf out.pdf)"
            ) from None
        reason = pdfium_i.ErrorToStr.get(err_code, f"error {err_code}")
        raise ValueError(f"{p} is damaged and cannot be read as a PDF (PDFium: {reason})") from None


def _load_error(p: Path) -> int | None:
    """PDFium's error for loading ``p`` now, or None when it loads.

    pypdfium2's ``err_code`` is PDFium's last error, a process-wide value that a document PDFium loads without
    error leaves as an earlier failure set it: a PDF of no pages opened after an encrypted one would read as
    encrypted. Loading again and asking only on failure gives this file's own answer.
    """
    doc = pdfium_c.FPDF_LoadDocument(os.fsencode(p), None)
    if doc:
        pdfium_c.FPDF_CloseDocument(doc)
        return None
    return int(pdfium_c.FPDF_GetLastError())


def page_indices(n_pages: int, pages: PageSpec, source: str = "the PDF") -> list[int]:
    """0-based page indices from ``None`` (all), an index, indices, or a 1-based string like ``"1-3,7"``.

    >>> page_indices(10, "2-4,9")
    [1, 2, 3, 8]
    >>> page_indices(10, [0, 5])
    [0, 5]
    >>> page_indices(3, "4")
    Traceback (most recent call last):
    ...
    ValueError: page 4 is out of range: the PDF has 3 pages (numbered 1-3)
    """
    if pages is None:
        return list(range(n_pages))
    if isinstance(pages, str):
        out: list[int] = []
        for part in pages.replace(" ", "").split(","):
            m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
            if not m:
                raise ValueError(f"bad page range {pages!r}; write 1-based pages like '3' or '1-5,8'")
            a, b = int(m.group(1)), int(m.group(2) or m.group(1))
            for number in (a, b):
                if not 1 <= number <= n_pages:
                    raise ValueError(
                        f"page {number} is out of range: {source} has {n_pages} pages (numbered 1-{n_pages})"
                    )
            if b < a:
                raise ValueError(f"bad page range {part!r} in {pages!r}: the end comes before the start")
            out.extend(range(a - 1, b))
        return out
    idx = [pages] if isinstance(pages, int) else [int(i) for i in pages]
    for i in idx:
        if not 0 <= i < n_pages:
            raise ValueError(
                f"page index {i} is out of range: {source} has {n_pages} pages (0-based indices 0-{n_pages - 1})"
            )
    return idx


Frame = tuple[tuple[float, float, float, float], int]  # (left, bottom, right, top) points, clockwise degrees


def display_frame(page: pdfium.PdfPage) -> Frame:
    """The box a page is rendered from, in PDF points, and its clockwise rotation, as PDFium renders it.

    ``FPDF_GetPageBoundingBox`` is the box PDFium's renderer maps onto the bitmap: the CropBox clipped
    to the MediaBox, each taken from the page tree when the page does not set it. pypdfium2's
    ``get_cropbox()`` instead reads the page's own dictionary only and, where the box is inherited,
    answers US Letter (0, 0, 612, 792): on an inherited A4 page every box would move ~50 pt.
    """
    return tuple(float(v) for v in page.get_bbox()), page.get_rotation()


def _display_map(frame: Frame, scale_yx: tuple[float, float]):
    """A function taking a PDF-point box (left, bottom, right, top) to a pixel box (y0, x0, y1, x1)."""
    (cl, cb, cr, ct), rot = frame
    w0, h0 = cr - cl, ct - cb
    sy, sx = scale_yx

    def to_display(x: float, y: float) -> tuple[float, float]:
        u, v = x - cl, ct - y  # unrotated display: origin top-left, y down
        if rot == 90:
            return h0 - v, u
        if rot == 180:
            return w0 - u, h0 - v
        if rot == 270:
            return v, w0 - u
        return u, v

    def box(left: float, bottom: float, right: float, top: float) -> Box:
        xa, ya = to_display(left, top)
        xb, yb = to_display(right, bottom)
        return (min(ya, yb) * sy, min(xa, xb) * sx, max(ya, yb) * sy, max(xa, xb) * sx)

    return box


def _starts_new_line(prev: Box, box: Box) -> bool:
    """Whether a character box begins a new line: back to the left of the last one and not beside it.

    PDFium inserts line breaks itself, but not after a hyphen it takes for a soft hyphen.
    """
    overlap = min(prev[2], box[2]) - max(prev[0], box[0])
    return box[1] < prev[1] and overlap < 0.5 * min(prev[2] - prev[0], box[2] - box[0])


def page_words(page: pdfium.PdfPage, scale_yx: tuple[float, float],
               loose: bool = False) -> tuple[list[Word], list[int], list[float]]:
    """The words of a page's text layer in pixels, the index of each line's first word, each line's font size.

    Args:
        page: an open PDFium page.
        scale_yx: pixels per display point, (y, x): the rendered size over the page's display size.
        loose: box each character from its font's ascent to descent across its advance (the convention of
            poppler's ``pdftotext -bbox``; :func:`~arr_coc.documents.font_box.font_box`) instead of around its
            ink; for comparing with other engines.
    """
    tp = page.get_textpage()
    to_px = _display_map(display_frame(page), scale_yx)
    words: list[Word] = []
    breaks: list[int] = []
    sizes: list[list[float]] = []  # per line: the drawn size of each character
    chars: list[str] = []
    boxes: list[Box] = []
    line_sizes: list[float] = []
    fonts = page_fonts(page.raw)  # the page's fonts whose font box is not PDFium's loose box (mostly none)
    prev: Box | None = None
    new_line = True

    def end_word() -> None:
        nonlocal new_line
        if chars and boxes:
            if new_line:
                breaks.append(len(words))
                sizes.append([])
                new_line = False
            words.append(Word("".join(chars), union(boxes)))
            sizes[-1].extend(line_sizes)
        # A "word" of characters without extent (a lone combining accent) has no place on the page: dropped.
        chars.clear()
        boxes.clear()
        line_sizes.clear()

    for i in range(tp.count_chars()):
        ch = chr(pdfium_c.FPDFText_GetUnicode(tp.raw, i))
        if ch in _LINE_BREAKS:
            end_word()
            new_line = True
            continue
        if ch.isspace():
            end_word()
            continue
        if ch == "\x02":  # PDFium's mark for a hyphen it takes to be soft; it is printed, so it is text
            ch = "-"
        if not ch.isprintable():
            continue
        left, bottom, right, top = tp.get_charbox(i)
        if right > left and top > bottom:  # accents and generated characters can have no extent
            # Lines are found in the page's own frame (before its display rotation), where text runs left to right.
            flat: Box = (-top, left, -bottom, right)
            if prev is not None and _starts_new_line(prev, flat):
                end_word()
                new_line = True
            prev = flat
            # TeX fonts report a size of 1 and scale by the text matrix: the loose box (ascent to descent)
            # is the size as drawn.
            ll, lb, lr, lt = tp.get_charbox(i, loose=True)
            if fonts:
                ll, lb, lr, lt = font_box(tp.raw, i, (ll, lb, lr, lt), (left, bottom, right, top), fonts)
            boxes.append(to_px(ll, lb, lr, lt) if loose else to_px(left, bottom, right, top))
            line_sizes.append((lt - lb) * scale_yx[0])
        chars.append(ch)
    end_word()
    tp.close()
    # The median: a superscript or a large symbol on a line does not make it a heading.
    return words, breaks, [float(np.median(s)) for s in sizes]


def render_page(page: pdfium.PdfPage, dpi: float) -> torch.Tensor:
    """[3, H, W] uint8: the page drawn on white at ``dpi`` (a quarter of the float copy's bytes)."""
    bitmap = page.render(scale=dpi / _POINTS_PER_INCH)
    pil = bitmap.to_pil()
    bitmap.close()  # the PDFium bitmap is freed before the RGB copy is made
    rgb = pil if pil.mode == "RGB" else pil.convert("RGB")
    del pil
    return torch.from_numpy(np.asarray(rgb).copy()).permute(2, 0, 1).contiguous()


def _render(page: pdfium.PdfPage, dpi: float) -> torch.Tensor:
    """[3, H, W] float32 in [0, 1]: the page drawn on white at ``dpi`` (uint8 / 255, as float32 division gives)."""
    return render_page(page, dpi).float().div_(255.0)


def _rendered_size(page: pdfium.PdfPage, dpi: float) -> tuple[int, int]:
    """(H, W) of the bitmap PDFium renders at ``dpi``: each display side times the scale, rounded up."""
    w, h = page.get_size()
    s = dpi / _POINTS_PER_INCH
    return int(np.ceil(h * s)), int(np.ceil(w * s))


def load_page(doc: pdfium.PdfDocument, i: int, source: str) -> pdfium.PdfPage:
    """Page ``i`` (0-based) of an open PDF, or one line when the page tree names a page that does not load."""
    try:
        return doc[i]
    except pdfium.PdfiumError:
        raise ValueError(f"{source} page {i + 1} cannot be loaded: the PDF lists {len(doc)} pages but this one is "
                         f"damaged; choose other pages with --pages / pages=, or repair the file "
                         f"(e.g. qpdf in.pdf out.pdf)") from None


def fit_dpi(size_pt: tuple[float, float], max_pixels: int) -> float:
    """The largest whole dpi (or, under 1, the largest 0.01) at which a page of (w, h) points renders at most
    ``max_pixels``."""
    w, h = size_pt
    dpi = _POINTS_PER_INCH * (max_pixels / max(w * h, 1e-9)) ** 0.5
    step = 1.0 if dpi >= 2 else 0.01
    dpi = np.floor(dpi / step) * step
    while dpi > step and np.ceil(w * dpi / _POINTS_PER_INCH) * np.ceil(h * dpi / _POINTS_PER_INCH) > max_pixels:
        dpi -= step
    return float(round(dpi, 2))


def check_page_pixels(size: tuple[int, int], size_pt: tuple[float, float], dpi: float, source: str, i: int) -> None:
    """Refuse, in one line naming ``--dpi``, a page whose render at ``dpi`` would exceed :data:`MAX_PAGE_PIXELS`."""
    h, w = size
    if h * w > MAX_PAGE_PIXELS:
        wi, hi = (v / _POINTS_PER_INCH for v in size_pt)
        raise ValueError(f"{source} page {i + 1} is {wi:.4g} x {hi:.4g} in: at {dpi:g} dpi it renders {w}x{h} px, "
                         f"more than {MAX_PAGE_PIXELS // 1_000_000} million pixels a page; lower --dpi / dpi= "
                         f"to {fit_dpi(size_pt, MAX_PAGE_PIXELS):g} or less, or leave the page out with --pages")


def page_geometry(path: Union[str, os.PathLike], pages: PageSpec, dpi: float, check_pixels: bool = True
                  ) -> tuple[list[int], list[tuple[int, int]], list[tuple[float, float]], int]:
    """The chosen pages' 0-based indices, rendered (H, W) at ``dpi`` and display sizes (w, h) in points, and the
    document's page count: PDFium's page sizes, read without drawing anything. ``check_pixels=False`` leaves
    :data:`MAX_PAGE_PIXELS` to a caller with a bound (and an option to name) of its own."""
    if not 0 < dpi <= MAX_DPI:
        raise ValueError(f"dpi must be in (0, {MAX_DPI:g}], got {dpi:g}")
    doc = open_pdf(path)
    try:
        idx = page_indices(len(doc), pages, str(path))
        sizes, points = [], []
        for i in idx:
            page = load_page(doc, i, str(path))
            sizes.append(_rendered_size(page, dpi))
            points.append(tuple(float(v) for v in page.get_size()))
            page.close()
            if check_pixels:
                check_page_pixels(sizes[-1], points[-1], dpi, str(path), i)
        return idx, sizes, points, len(doc)
    finally:
        doc.close()


def read_page(doc: pdfium.PdfDocument, i: int, dpi: float, source: str, render: bool = True) -> Page:
    """Page ``i`` (0-based) of an open PDF: rendered at ``dpi`` (or not) with its words and lines."""
    page = load_page(doc, i, source)
    try:
        if render:
            check_page_pixels(_rendered_size(page, dpi), tuple(float(v) for v in page.get_size()), dpi, source, i)
        image = _render(page, dpi) if render else None
        h, w = (int(image.shape[-2]), int(image.shape[-1])) if image is not None else _rendered_size(page, dpi)
        dw, dh = page.get_size()
        words, breaks, sizes = page_words(page, (h / dh, w / dw))
    finally:
        page.close()
    return Page(image, words, lines_from_breaks(words, breaks, sizes), i, source, float(dpi), (h, w))


def pdf_meta(path: Union[str, os.PathLike], n_pages: int, idx: list[int], dpi: float) -> dict:
    """What a PDF context records: its source, page count, the pages read, the dpi and the renderer."""
    return {"kind": "pdf", "source": str(path), "n_pages": n_pages, "pages": idx, "dpi": float(dpi),
            "renderer": f"pypdfium2 {pdfium.PYPDFIUM_INFO} (PDFium {pdfium.PDFIUM_INFO})"}


def read_pdf(
    path: Union[str, os.PathLike],
    pages: PageSpec = None,
    dpi: float = DEFAULT_DPI,
    render: bool = True,
) -> Context:
    """The chosen pages of a PDF, rendered at ``dpi``, with their words and lines.

    Args:
        path: the PDF file.
        pages: None for all, 0-based indices, or a 1-based range string like ``"1-3,7"``.
        dpi: render resolution; boxes are in the pixels of this render.
        render: False reads the text layer only (``Page.image`` is None) - for scanning a corpus.

    Returns:
        A Context whose meta records the source, its page count, the pages read and the dpi.
    """
    if not 0 < dpi <= MAX_DPI:
        raise ValueError(f"dpi must be in (0, {MAX_DPI:g}], got {dpi:g}")
    doc = open_pdf(path)
    try:
        idx = page_indices(len(doc), pages, str(path))
        out = [read_page(doc, i, dpi, str(path), render) for i in idx]
        meta = pdf_meta(path, len(doc), idx, dpi)
    finally:
        doc.close()
    return Context(out, str(path), meta)
