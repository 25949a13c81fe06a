"""One token budget over a whole context: a gestalt per page, saccades by one ranking over all pages' cells.

``allocate_context(arr, context, question, tokens=T)``:

1. the context's pages (:func:`~arr_coc.contexts.inputs.load_context`) go on the ARR's canvas, page
   by page (in chunks of ``CHUNK`` pages, so memory stays bounded for any page count);
2. the token rule (:func:`~arr_coc.contexts.budget.split_context`) gives each page a small gestalt
   and leaves K saccades for the whole context;
3. every page is scored by the same ARR (one scorer, one question); where a page has a text layer
   (or rendered words), its lines are handed to the ``text_match`` / ``key_value`` channels through the
   per-image cache, so no OCR runs on it; a page without one is read once by ``ocr``;
4. the ``text_layer`` channel (:mod:`arr_coc.channels.text_layer`) paints the page words that are the
   question's words, weighted by their inverse page frequency over the context and divided by one
   context-wide maximum, so it is comparable across pages;
5. one ranking over every valid cell of every page: the page's relevance z-scored over its cells
   (the scorer's own scale differs from page to page), plus ``text_weight`` x the cell's text-layer
   match, plus ``page_weight`` x the page's best text-layer match (the detail goes to the pages the
   question names); the top K cells, ties broken by page then cell order, are the saccades.

The total sent is exact: sum of the gestalts + K. A context of one page keeps today's path: the
ARR's own sampler on its own relevance (``ContextAllocation.allocation`` is the usual
:class:`~arr_coc.pipeline.Allocation`), so one image gives what ``ARR()(image, question)`` gives.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from torch import Tensor

from arr_coc.canvas import smart_resize
from arr_coc.channels.text import image_lines, lines_from_text
from arr_coc.channels.text_layer import image_words, question_terms, term, word_values
from arr_coc.contexts.budget import split_context
from arr_coc.contexts.inputs import MAX_PAGES, load_context
from arr_coc.contexts.tokens import text_tokens as count_tokens
from arr_coc.contexts.tokens import tokenizer_name
from arr_coc.documents.page import Page
from arr_coc.documents.pdf import DEFAULT_DPI
from arr_coc.documents.text_pages import TextLayout
from arr_coc.ocr import DET_LIMIT_SIDE_LEN
from arr_coc.pipeline import ARR, Allocation, Scene
from arr_coc.plan import Plan
from arr_coc.query import check_queries
from arr_coc.relevance import standardize
from arr_coc.texture import compute_texture, pool_to_cells

# Chosen on validation documents (docs/coc.md): a cell on a matched word of the question outranks
# the page's most relevant unmatched cells; a page holding the question's words outranks pages without.
TEXT_WEIGHT = 4.0
PAGE_WEIGHT = 2.0
CHUNK = 4  # pages scored at once: ~0.3 GB of texture per A4 page at 150 dpi
Line = tuple[str, tuple[float, float, float, float]]  # (text, (y0, x0, y1, x1) px)
OCR = Callable[[Tensor], Sequence[Line]]


@dataclass
class PageAllocation:
    """What one page of a context sends.

    Attributes:
        index: the page's index in its source (0-based).
        image: [3, H, W] the page's canvas, as the VLM gets it (sides multiples of ``cell``).
        plan: kind "cells": the page's gestalt grid and its saccades [k_i, 2] (y, x), in global rank order.
        cell: token cell side, px.
        relevance: [hc, wc] the ranking score of every cell (what the global top-K compared).
        words: the page's words in canvas pixels (text layer, rendered text, or OCR).
        text_from: "text layer", "ocr" or "none".
    """

    index: int
    image: Tensor
    plan: Plan
    cell: int
    relevance: Tensor
    words: list[Line] = field(default_factory=list, repr=False)
    text_from: str = "none"

    @property
    def saccades(self) -> int:
        return self.plan.saccades

    @property
    def gestalt_tokens(self) -> int:
        return self.plan.gestalt_tokens

    @property
    def tokens(self) -> int:
        return self.plan.tokens

    def to_json(self) -> dict[str, Any]:
        p = self.plan
        return {"index": self.index, "canvas": list(self.image.shape[-2:]), "grid": list(p.grid), "cell": self.cell,
                "gestalt_grid": list(p.gestalt), "gestalt_tokens": p.gestalt_tokens, "saccades": p.saccades,
                "full_resolution": p.full_tokens, "text_from": self.text_from,
                "positions": p.cells.tolist(), "scores": [round(s, 5) for s in p.scores.tolist()]}


@dataclass
class ContextAllocation:
    """A whole context's allocation: per page what it sends, and what the context costs as text."""

    question: str
    pages: list[PageAllocation]
    source: str
    meta: dict[str, Any]
    text_tokens: int | None  # the context's text, counted by ``tokenizer``; None when no page has text
    tokenizer: str
    timings_ms: dict[str, float] = field(default_factory=dict)
    allocation: Allocation | None = None  # the one-page case: the ARR's own allocation

    @property
    def tokens(self) -> int:
        """Visual tokens sent: every page's gestalt + saccades (exact)."""
        return sum(p.tokens for p in self.pages)

    @property
    def gestalt_tokens(self) -> int:
        return sum(p.gestalt_tokens for p in self.pages)

    @property
    def saccades(self) -> int:
        return sum(p.saccades for p in self.pages)

    @property
    def full_tokens(self) -> int:
        """Visual tokens every page costs at full resolution."""
        return sum(p.plan.full_tokens for p in self.pages)

    @property
    def compression(self) -> float | None:
        """The COC compression ratio: text tokens over visual tokens sent (None without text)."""
        return None if self.text_tokens is None else self.text_tokens / self.tokens

    def to_json(self) -> dict[str, Any]:
        return {"question": self.question, "source": self.source, "pages": [p.to_json() for p in self.pages],
                "tokens": {"gestalt": self.gestalt_tokens, "saccades": self.saccades, "sent": self.tokens,
                           "full_resolution": self.full_tokens},
                "text_tokens": self.text_tokens, "tokenizer": self.tokenizer,
                "compression": None if self.compression is None else round(self.compression, 3),
                "context": {k: v for k, v in self.meta.items() if k not in ("pages", "sources")},
                "timings_ms": {k: round(v, 2) for k, v in self.timings_ms.items()}}


def _canvas_words(page: Page, size: tuple[int, int]) -> tuple[list[Line], list[Line]]:
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
            for c in ("text_match", "key_value") if c in arr.query_channels}


def _seed(arr: ARR, image: Tensor, page: Page, ocr: OCR | None) -> tuple[list[Line], str]:
    """Hand the page's text to the text channels through the cache (no OCR where it has words) -> words, source."""
    size = (int(image.shape[-2]), int(image.shape[-1]))
    sides = _coupling_sides(arr)
    if page.words:
        words, lines = _canvas_words(page, size)
        source = "text layer"
    elif ocr is not None:
        lines = [(str(t), tuple(float(v) for v in b)) for t, b in ocr(image)]
        words, source = _line_words(lines), "ocr"
    else:  # the text channels' own OCR, cached, so they do not read the page twice
        tl = image_lines(arr.cache, image, arr.query_encoder, min(sides, default=DET_LIMIT_SIDE_LEN))
        lines = [(t, tuple(b)) for t, b, ok in zip(tl.texts, tl.boxes_px.tolist(), tl.legible.tolist()) if ok]
        words, source = _line_words(lines), "ocr"
    if sides:
        made: list[Any] = []

        def known() -> Any:  # embedded once, even when the two channels read at different sides
            if not made:
                made.append(lines_from_text(torch.tensor([b for _, b in lines], dtype=torch.float32).reshape(-1, 4),
                                            [t for t, _ in lines], arr.query_encoder))
            return made[0]

        for side in sides:
            image_lines(arr.cache, image, arr.query_encoder, side, known=known)
    image_words(arr.cache, image, known=lambda: words)
    return words, source


def _idf(pages_words: Sequence[Sequence[Line]], question: str) -> dict[str, float]:
    """Each question term's weight: log(1 + pages / pages holding it); 0 where no page holds it."""
    n = len(pages_words)
    have = [{term(w) for w, _ in ws} for ws in pages_words]
    return {t: (math.log(1 + n / df) if (df := sum(t in h for h in have)) else 0.0) for t in set(question_terms(question))}


def _one_page(arr: ARR, page: Page, question: str, tokens: int | None, saccades: int | None,
              ocr: OCR | None, t: dict[str, float]) -> tuple[PageAllocation, Allocation]:
    scene = arr.see([page.image], timings=t)
    (h, w), cell = scene.canvas.sizes[0], scene.canvas.cell
    image = scene.canvas.pixels[0, :, :h, :w]
    words, source = _seed(arr, image, page, ocr) if (page.words or ocr is not None) else ([], "none")
    k = saccades if tokens is None else split_context(scene.extents, tokens=tokens)[1]  # the ARR checks K itself
    alloc = arr.allocate(scene, [question], saccades=k, timings=t)
    plan = Plan("arr", "cells", scene.extents[0], gestalt=alloc.gestalt.grid, cells=alloc.positions[0],
                scores=alloc.scores[0])
    rel = alloc.relevance.map[0, : h // cell, : w // cell]
    return PageAllocation(page.index, image.clone(), plan, cell, rel, words, source), alloc


def allocate_context(arr: ARR, context: Any, question: str, *, tokens: int | None = None,
                     saccades: int | None = None, pages: Any = None, dpi: float = DEFAULT_DPI,
                     layout: TextLayout = TextLayout(), max_pages: int = MAX_PAGES, tokenizer: Any = None,
                     ocr: OCR | None = None, text_weight: float = TEXT_WEIGHT, page_weight: float = PAGE_WEIGHT,
                     chunk: int = CHUNK) -> ContextAllocation:
    """Allocate one budget over a context's pages for a question.

    Args:
        arr: the ARR whose canvas, channels and scorer every page goes through.
        context: a :class:`~arr_coc.documents.page.Context`, a PDF, a text file, an image, or a list of images.
        question: the question.
        tokens: the total T sent over all pages; or ``saccades``: K (default: the ARR's K), not both.
        pages: a PDF's pages (1-based range string, 0-based indices, None for all).
        dpi: a PDF's render resolution.
        layout: how a text file is set on pages.
        max_pages: the most pages taken (more is refused, naming this option).
        tokenizer: the VLM's tokenizer (or processor) to count the text tokens; default the offline one.
        ocr: ``ocr(canvas [3, H, W]) -> [(line text, (y0, x0, y1, x1) px)]`` for pages without text;
            default the text channels' own cached RapidOCR.
        text_weight, page_weight: the ranking's weights (see the module docstring).
        chunk: pages scored at once.

    Returns:
        A :class:`ContextAllocation`; ``.tokens`` is exactly T (or the gestalts + K).
    """
    t: dict[str, float] = {}
    start = time.perf_counter()
    ctx = load_context(context, pages=pages, dpi=dpi, layout=layout, max_pages=max_pages)
    t["load"] = (time.perf_counter() - start) * 1e3
    question = check_queries([question], 1, arr.max_question_tokens)[0]
    if tokens is None and saccades is None:
        saccades = arr.config.sampler.saccades
    if any(p.image is None for p in ctx.pages):
        raise ValueError("allocation needs rendered pages; read the PDF with render=True")
    alloc = None
    if len(ctx) == 1:
        page_alloc, alloc = _one_page(arr, ctx.pages[0], question, tokens, saccades, ocr, t)
        out = [page_alloc]
    else:
        out = _many_pages(arr, ctx.pages, question, tokens, saccades, ocr, text_weight, page_weight, chunk, t)
    has_text = [p for p in out if p.words]
    text = "\n\n".join(" ".join(w for w, _ in p.words) for p in has_text)
    n_text = count_tokens(text, tokenizer) if has_text else None
    return ContextAllocation(question, out, ctx.source, dict(ctx.meta), n_text, tokenizer_name(tokenizer), t, alloc)


def _many_pages(arr: ARR, pages: Sequence[Page], question: str, tokens: int | None, saccades: int | None,
                ocr: OCR | None, text_weight: float, page_weight: float, chunk: int,
                t: dict[str, float]) -> list[PageAllocation]:
    cfg = arr.config.canvas
    sizes = [smart_resize(*p.size, cfg.cell, cfg.min_pixels, cfg.max_pixels) for p in pages]
    grids = [(h // cfg.cell, w // cfg.cell) for h, w in sizes]
    gestalts, k = split_context(grids, tokens=tokens, saccades=saccades)
    images, rels, words, sources = [], [], [], []
    for lo in range(0, len(pages), max(1, chunk)):
        part = pages[lo:lo + max(1, chunk)]
        scene: Scene = arr.see([p.image for p in part], timings=t)
        c = scene.canvas
        crops = [c.pixels[i, :, :h, :w] for i, (h, w) in enumerate(c.sizes)]
        for img, page in zip(crops, part):
            ws, src = _seed(arr, img, page, ocr)
            words.append(ws)
            sources.append(src)
            images.append(img.clone())
        g = arr.gestalt(scene, k)
        relevance, _ = arr.score(scene, [question] * len(part), g.vector, timings=t)
        z = standardize(relevance.map[:, None], c.valid)[:, 0]  # [b, Hc, Wc]
        rels.extend(z[i, : h // c.cell, : w // c.cell] for i, (h, w) in enumerate(c.sizes))
    start = time.perf_counter()
    idf = _idf(words, question)
    norm = max((max(word_values([w for w, _ in ws], question, idf), default=0.0) for ws in words), default=0.0)
    scores = []
    for img, rel, ws in zip(images, rels, words):
        if norm > 0:
            m = compute_texture(img[None], ("text_layer",), queries=[question], cache=arr.cache,
                                options={"text_layer": {"weights": idf, "norm": norm}})
            text = pool_to_cells(m, cfg.cell)[0, 0]  # [hc, wc]
        else:
            text = torch.zeros_like(rel)
        scores.append(rel + text_weight * text + page_weight * text.max())
    t["text_layer"] = (time.perf_counter() - start) * 1e3
    start = time.perf_counter()
    flat = torch.cat([s.reshape(-1) for s in scores])
    order = torch.sort(flat, descending=True, stable=True).indices[:k]
    offsets = torch.tensor([0] + [s.numel() for s in scores]).cumsum(0)
    page_of = torch.searchsorted(offsets, order, right=True) - 1
    out = []
    for i, (page, img, s) in enumerate(zip(pages, images, scores)):
        mine = order[page_of == i] - offsets[i]  # rank order kept
        wc = s.shape[1]
        cells = torch.stack([mine // wc, mine % wc], -1).long().reshape(-1, 2)
        plan = Plan("coc", "cells", tuple(s.shape), gestalt=gestalts[i], cells=cells, scores=s.reshape(-1)[mine])
        out.append(PageAllocation(page.index, img, plan, cfg.cell, s, words[i], sources[i]))
    t["selection"] = (time.perf_counter() - start) * 1e3
    return out
