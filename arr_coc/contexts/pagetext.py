"""A page's words for the ranking and the text channels: its text layer or rendered words, else OCR.

:func:`page_text` gives a page's words and lines on its canvas and where they came from; the scene carries
them to the text channels (:class:`~arr_coc.engine.channel_registry.PageText`), so those run no OCR on the page.
"""
from __future__ import annotations

from typing import Callable, Sequence

from torch import Tensor

from arr_coc.contexts.result import Line
from arr_coc.documents.page import Page
from arr_coc.engine.channels.text import TEXT_CHANNELS, TextLines, image_lines
from arr_coc.engine.pipeline import ARR
from arr_coc.ocr import DET_LIMIT_SIDE_LEN

OCR = Callable[[Tensor], Sequence[Line]]


def canvas_words(page: Page, size: tuple[int, int]) -> tuple[list[Line], list[Line]]:
    """The page's words and lines moved onto its canvas of ``size`` (H, W) px."""
    sy, sx = size[0] / page.size[0], size[1] / page.size[1]

    def move(b: Sequence[float]) -> tuple[float, float, float, float]:
        return (b[0] * sy, b[1] * sx, b[2] * sy, b[3] * sx)

    words = [(w.text, move(w.box)) for w in page.words]
    lines = [(page.line_text(i), move(page.line_box(i))) for i in range(len(page.lines))]
    return words, lines


def _line_words(lines: Sequence[Line]) -> list[Line]:
    """Words of OCR lines: split at spaces, each boxed by its share of the line's characters."""
    out = []
    for text, (y0, x0, y1, x1) in lines:
        n = max(1, len(text))
        start = 0
        for w in text.split():
            a = text.index(w, start)
            start = a + len(w)
            out.append((w, (y0, x0 + (x1 - x0) * a / n, y1, x0 + (x1 - x0) * start / n)))
    return out


def _coupling_sides(arr: ARR) -> set[int]:
    opts = arr.config.texture.options or {}
    return {int(opts.get(c, {}).get("det_limit_side_len", DET_LIMIT_SIDE_LEN))
            for c in TEXT_CHANNELS if c in arr.query_channels}


def page_text(arr: ARR, image: Tensor, page: Page, ocr: OCR | None) -> tuple[list[Line], list[Line], str]:
    """The page's words and lines on its canvas, and where they came from (text layer, OCR, none)."""
    if page.words:
        words, lines = canvas_words(page, (int(image.shape[-2]), int(image.shape[-1])))
        return words, lines, "text layer"
    if ocr is not None:
        lines = [(str(t), tuple(float(v) for v in b)) for t, b in ocr(image)]
        return _line_words(lines), lines, "ocr"
    # the text channels' own OCR, cached, so they do not read the page a second time
    sides = _coupling_sides(arr)
    lines = legible_lines(image_lines(arr.cache, image, arr.query_encoder, min(sides, default=DET_LIMIT_SIDE_LEN)))
    return _line_words(lines), lines, "ocr"


def legible_lines(lines: TextLines | None) -> list[Line]:
    """The lines the text channels read (``.legible`` of their :class:`TextLines`; none for None) as (text, box)."""
    if lines is None:
        return []
    return [(t, tuple(float(v) for v in b)) for t, b, ok in zip(lines.texts, lines.boxes_px.tolist(),
                                                               lines.legible.tolist()) if ok]
