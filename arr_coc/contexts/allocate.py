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
5. one ranking over every valid cell of every page (:mod:`arr_coc.contexts.ranking`): the page's
   relevance scaled to [0, 1] over its cells, plus ``text_weight`` x the cell's text-layer match,
   plus ``page_weight`` x the page's best matching word, plus ``near_weight`` x where a matched
   line's answer sits (the rest of the line, the line below); the top K cells, ties broken by page
   then cell order, are the saccades.

The total sent is exact: sum of the gestalts + K. A context of one page keeps today's path: the
ARR's own sampler on its own relevance (``ContextAllocation.allocation`` is the usual
:class:`~arr_coc.pipeline.Allocation`), so one image gives what ``ARR()(image, question)`` gives.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from torch import Tensor

from arr_coc.channels.text import image_lines, lines_from_text
from arr_coc.channels.text_layer import image_words, word_values
from arr_coc.contexts.budget import split_context
from arr_coc.contexts.inputs import MAX_PAGES, load_context
from arr_coc.contexts.ranking import (
    NEAR_WEIGHT,
    PAGE_WEIGHT,
    TEXT_WEIGHT,
    RankParts,
    idf,
    near_map,
    rank_cells,
    ranking_score,
    unit,
)
from arr_coc.contexts.result import ContextAllocation, Line, PageAllocation
from arr_coc.contexts.tokens import text_tokens as count_tokens
from arr_coc.contexts.tokens import tokenizer_name
from arr_coc.documents.page import Context, Page
from arr_coc.documents.pdf import DEFAULT_DPI
from arr_coc.documents.text_pages import TextLayout
from arr_coc.ocr import DET_LIMIT_SIDE_LEN
from arr_coc.pipeline import ARR, Allocation, Scene
from arr_coc.plan import Plan
from arr_coc.query import check_queries
from arr_coc.texture import compute_texture, pool_to_cells

CHUNK = 4  # pages scored at once: ~0.3 GB of texture per A4 page at 150 dpi
OCR = Callable[[Tensor], Sequence[Line]]


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


def _page_text(arr: ARR, image: Tensor, page: Page, ocr: OCR | None) -> tuple[list[Line], list[Line], str]:
    """The page's words and lines on its canvas, and where they came from (text layer, OCR, none)."""
    if page.words:
        words, lines = _canvas_words(page, (int(image.shape[-2]), int(image.shape[-1])))
        return words, lines, "text layer"
    if ocr is not None:
        lines = [(str(t), tuple(float(v) for v in b)) for t, b in ocr(image)]
        return _line_words(lines), lines, "ocr"
    # the text channels' own OCR, cached, so they do not read the page a second time
    sides = _coupling_sides(arr)
    tl = image_lines(arr.cache, image, arr.query_encoder, min(sides, default=DET_LIMIT_SIDE_LEN))
    lines = [(t, tuple(b)) for t, b, ok in zip(tl.texts, tl.boxes_px.tolist(), tl.legible.tolist()) if ok]
    return _line_words(lines), lines, "ocr"


def _hand_over(arr: ARR, image: Tensor, words: list[Line], lines: list[Line]) -> None:
    """Give the page's text to the text channels through the cache, so they run no OCR on it.

    Done before every allocation: an entry the cache evicted since is made again from the lines.
    """
    made: list[Any] = []

    def known() -> Any:  # embedded once, even when the two channels read at different sides
        if not made:
            made.append(lines_from_text(torch.tensor([b for _, b in lines], dtype=torch.float32).reshape(-1, 4),
                                        [t for t, _ in lines], arr.query_encoder))
        return made[0]

    for side in _coupling_sides(arr):
        image_lines(arr.cache, image, arr.query_encoder, side, known=known)
    image_words(arr.cache, image, known=lambda: words)


@dataclass
class SeenContext:
    """What a context's pages alone determine, for any number of questions: canvases, textures, words.

    Attributes:
        context: the pages as read.
        scenes: the ARR's :class:`~arr_coc.pipeline.Scene` of each chunk of pages.
        words, lines: per page, its words and lines in canvas pixels.
        sources: per page, where its text came from: "text layer", "ocr" or "none".
        timings_ms: the time each stage took.
    """

    context: Context
    scenes: list[Scene]
    words: list[list[Line]]
    lines: list[list[Line]]
    sources: list[str]
    timings_ms: dict[str, float] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.words)

    def page(self, i: int) -> tuple[Scene, int]:
        """Page ``i``'s chunk scene and its row in it."""
        n = 0
        for scene in self.scenes:
            if i < n + scene.canvas.batch_size:
                return scene, i - n
            n += scene.canvas.batch_size
        raise IndexError(f"page {i} of a {len(self)}-page context")

    def image(self, i: int) -> Tensor:
        """Page ``i``'s canvas [3, H, W]."""
        scene, r = self.page(i)
        h, w = scene.canvas.sizes[r]
        return scene.canvas.pixels[r, :, :h, :w]


def see_context(arr: ARR, context: Any, *, pages: Any = None, dpi: float = DEFAULT_DPI,
                layout: TextLayout = TextLayout(), max_pages: int = MAX_PAGES, ocr: OCR | None = None,
                chunk: int = CHUNK) -> SeenContext:
    """Read a context and compute what its pages alone determine (see :func:`allocate_context` for the arguments)."""
    t: dict[str, float] = {}
    start = time.perf_counter()
    ctx = load_context(context, pages=pages, dpi=dpi, layout=layout, max_pages=max_pages)
    t["load"] = (time.perf_counter() - start) * 1e3
    if any(p.image is None for p in ctx.pages):
        raise ValueError("allocation needs rendered pages; read the PDF with render=True")
    scenes, words, lines, sources = [], [], [], []
    step = max(1, int(chunk))
    for lo in range(0, len(ctx), step):
        part = ctx.pages[lo:lo + step]
        tc: dict[str, float] = {}  # this chunk's stage times, summed into t
        scene = arr.see([p.image for p in part], timings=tc)
        for name, ms in tc.items():
            t[name] = t.get(name, 0.0) + ms
        scenes.append(scene)
        for r, page in enumerate(part):
            h, w = scene.canvas.sizes[r]
            one = len(ctx) == 1 and not page.words and ocr is None  # an image alone: today's path, untouched
            ws, ls, src = ([], [], "none") if one else _page_text(arr, scene.canvas.pixels[r, :, :h, :w], page, ocr)
            words.append(ws)
            lines.append(ls)
            sources.append(src)
    return SeenContext(ctx, scenes, words, lines, sources, t)


def _one_page(arr: ARR, seen: SeenContext, question: str, tokens: int | None, saccades: int | None,
              t: dict[str, float]) -> tuple[PageAllocation, Allocation]:
    scene = seen.scenes[0]
    (h, w), cell = scene.canvas.sizes[0], scene.canvas.cell
    image = seen.image(0)
    if seen.sources[0] != "none":
        _hand_over(arr, image, seen.words[0], seen.lines[0])
    grid, k = (None, saccades) if tokens is None else split_context(scene.extents, tokens=tokens)  # the ARR checks K
    alloc = arr.allocate(scene, [question], saccades=k, timings=t, gestalt_grid=None if grid is None else grid[0])
    plan = Plan("arr", "cells", scene.extents[0], gestalt=alloc.gestalt.grid, cells=alloc.positions[0],
                scores=alloc.scores[0])
    rel = alloc.relevance.map[0, : h // cell, : w // cell]
    page = seen.context.pages[0]
    return PageAllocation(page.index, image, plan, cell, rel, seen.words[0], seen.sources[0]), alloc


def allocate_context(arr: ARR, context: Any, question: str, *, tokens: int | None = None,
                     saccades: int | None = None, pages: Any = None, dpi: float = DEFAULT_DPI,
                     layout: TextLayout = TextLayout(), max_pages: int = MAX_PAGES, tokenizer: Any = None,
                     ocr: OCR | None = None, text_weight: float = TEXT_WEIGHT, page_weight: float = PAGE_WEIGHT,
                     near_weight: float = NEAR_WEIGHT, chunk: int = CHUNK) -> ContextAllocation:
    """Allocate one budget over a context's pages for a question.

    Args:
        arr: the ARR whose canvas, channels and scorer every page goes through.
        context: a :class:`~arr_coc.documents.page.Context`, a PDF, a text file, an image, a list of
            images, or a :class:`SeenContext` (from :func:`see_context`: several questions pay for the pages once).
        question: the question.
        tokens: the total T sent over all pages; or ``saccades``: K (default: the ARR's K), not both.
        pages: a PDF's pages (1-based range string, 0-based indices, None for all).
        dpi: a PDF's render resolution.
        layout: how a text file is set on pages.
        max_pages: the most pages taken (more is refused, naming this option).
        tokenizer: the VLM's tokenizer (or processor) to count the text tokens; default the offline one.
        ocr: ``ocr(canvas [3, H, W]) -> [(line text, (y0, x0, y1, x1) px)]`` for pages without text;
            default the text channels' own cached RapidOCR.
        text_weight, page_weight, near_weight: the ranking's weights (:mod:`arr_coc.contexts.ranking`).
        chunk: pages computed at once.

    Returns:
        A :class:`ContextAllocation`; ``.tokens`` is exactly T (or the gestalts + K).
    """
    seen = context if isinstance(context, SeenContext) else see_context(
        arr, context, pages=pages, dpi=dpi, layout=layout, max_pages=max_pages, ocr=ocr, chunk=chunk)
    t = dict(seen.timings_ms) if seen is not context else {}
    question = check_queries([question], 1, arr.max_question_tokens)[0]
    if tokens is None and saccades is None:
        saccades = arr.config.sampler.saccades
    alloc = None
    if len(seen) == 1:
        page_alloc, alloc = _one_page(arr, seen, question, tokens, saccades, t)
        out = [page_alloc]
    else:
        with torch.no_grad():  # a ranking, not a training step: no graph over the pages
            weights = dict(text_weight=text_weight, page_weight=page_weight, near_weight=near_weight)
            out = _many_pages(arr, seen, question, tokens, saccades, weights, t)
    has_text = [p for p in out if p.words]
    text = "\n\n".join(" ".join(w for w, _ in p.words) for p in has_text)
    n_text = count_tokens(text, tokenizer) if has_text else None
    ctx = seen.context
    return ContextAllocation(question, out, ctx.source, dict(ctx.meta), n_text, tokenizer_name(tokenizer), t, alloc)


def rank_parts(arr: ARR, seen: SeenContext, question: str, k: int = 0, t: dict[str, float] | None = None,
               relevance: Sequence[Tensor] | None = None) -> list[RankParts]:
    """Every page's :class:`~arr_coc.contexts.ranking.RankParts` for a question.

    Args:
        arr, seen: the ARR and the context's pages (:func:`see_context`).
        question: the question.
        k: the saccades the ARR's gestalt is made for.
        t: stage times (ms) are added here.
        relevance: each page's relevance in [0, 1] when already known (the text parts of another
            wording of a question); otherwise every page is scored.
    """
    t = {} if t is None else t
    cell = seen.scenes[0].canvas.cell
    images = [seen.image(i) for i in range(len(seen))]
    rels: list[Tensor] = list(relevance) if relevance is not None else []
    i = 0
    for scene in seen.scenes if relevance is None else ():
        b = scene.canvas.batch_size
        for j in range(b):
            _hand_over(arr, images[i + j], seen.words[i + j], seen.lines[i + j])
        tc: dict[str, float] = {}
        g = arr.gestalt(scene, k)
        relevance_map, _ = arr.score(scene, [question] * b, g.vector, timings=tc)
        for name, ms in tc.items():
            t[name] = t.get(name, 0.0) + ms
        c = scene.canvas
        rels.extend(unit(relevance_map.map[r, : h // c.cell, : w // c.cell]) for r, (h, w) in enumerate(c.sizes))
        i += b
    start = time.perf_counter()
    words = seen.words
    weights = idf(words, question)
    values = [word_values([w for w, _ in ws], question, weights) for ws in words]
    norm = max((max(v, default=0.0) for v in values), default=0.0)
    parts = []
    for img, rel, ws, ls, vs in zip(images, rels, words, seen.lines, values):
        if norm > 0:
            image_words(arr.cache, img, known=lambda ws=ws: ws)  # seeded again: the cache may have dropped it
            m = compute_texture(img[None], ("text_layer",), queries=[question], cache=arr.cache,
                                options={"text_layer": {"weights": weights, "norm": norm}})
            text = pool_to_cells(m, cell)[0, 0]  # [hc, wc]
            near = near_map(ws, ls, [v / norm for v in vs], tuple(img.shape[-2:]), cell)
        else:
            text = near = torch.zeros_like(rel)
        parts.append(RankParts(rel, text, near[: rel.shape[0], : rel.shape[1]],
                               max(vs, default=0.0) / norm if norm > 0 else 0.0))
    t["text_layer"] = (time.perf_counter() - start) * 1e3
    return parts


def _many_pages(arr: ARR, seen: SeenContext, question: str, tokens: int | None, saccades: int | None,
                weights: dict[str, float], t: dict[str, float]) -> list[PageAllocation]:
    cell = seen.scenes[0].canvas.cell
    grids = [g for scene in seen.scenes for g in scene.extents]
    gestalts, k = split_context(grids, tokens=tokens, saccades=saccades)
    scores = [ranking_score(p, **weights) for p in rank_parts(arr, seen, question, k, t)]
    start = time.perf_counter()
    out = []
    for i, (page, s, cells) in enumerate(zip(seen.context.pages, scores, rank_cells(scores, k))):
        flat = s.reshape(-1)[cells[:, 0] * s.shape[1] + cells[:, 1]]
        plan = Plan("coc", "cells", tuple(s.shape), gestalt=gestalts[i], cells=cells, scores=flat)
        out.append(PageAllocation(page.index, seen.image(i), plan, cell, s, seen.words[i], seen.sources[i]))
    t["selection"] = (time.perf_counter() - start) * 1e3
    return out
