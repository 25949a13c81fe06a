"""One token budget over a whole context: a gestalt per page, saccades by one ranking over all pages' cells.

``allocate_context(arr, context, question, tokens=T)``:

1. the context's pages are sized and checked before any is drawn (:func:`~arr_coc.contexts.inputs.open_context`:
   the page count, each page's and all pages' pixels), and the token rule
   (:func:`~arr_coc.contexts.budget.split_context`) gives each page a small gestalt and leaves K saccades
   for the whole context, from the canvas grids those sizes make: a budget too small is refused before
   anything is drawn;
2. the pages are drawn, put on the ARR's canvas and scored a few at a time (at most ``chunk`` pages and
   :data:`CHUNK_PIXELS` drawn pixels at once); what the ranking needs of a page (its cells' relevance,
   its words) is kept, its pixels are not: a page's canvas is drawn again when asked for;
3. every page is scored by the same ARR (one scorer, one question); where a page has a text layer
   (or rendered words), its lines are handed to the ``text_match`` / ``key_value`` channels through the
   per-image cache, so no OCR runs on it; a page without one is read once by ``ocr``;
4. the ``text_layer`` channel (:mod:`arr_coc.engine.channels.text_layer`) paints the page words that are the
   question's words, weighted by their inverse page frequency over the context and divided by one
   context-wide maximum, so it is comparable across pages;
5. one ranking over every valid cell of every page (:mod:`arr_coc.contexts.ranking`): the page's
   relevance scaled to [0, 1] over its cells, plus ``text_weight`` x the cell's text-layer match,
   plus ``page_weight`` x the page's best matching word, plus ``near_weight`` x where a matched
   line's answer sits (the rest of the line, the line below); the top K cells, ties broken by page
   then cell order, are the saccades.

The total sent is exact: sum of the gestalts + K. A context of one page keeps today's path: the
ARR's own sampler on its own relevance (``ContextAllocation.allocation`` is the usual
:class:`~arr_coc.engine.pipeline.Allocation`), so one image gives what ``ARR()(image, question)`` gives.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

import torch
from torch import Tensor

from arr_coc.config import CanvasConfig
from arr_coc.contexts.budget import split_context
from arr_coc.contexts.inputs import MAX_PAGES, OpenContext, open_context
from arr_coc.contexts.pagetext import OCR, hand_over, page_text
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
from arr_coc.engine.canvas import make_canvas, smart_resize
from arr_coc.engine.channels.text_layer import match_map, word_values
from arr_coc.engine.pipeline import ARR, Allocation, Scene
from arr_coc.engine.plan import Plan
from arr_coc.engine.query import check_queries
from arr_coc.engine.texture import pool_to_cells

CHUNK = 4  # pages scored at once
# ... unless they draw more pixels than the largest canvas (1792 x 1792): the texture of the default channels
# costs ~170 bytes per canvas pixel while a chunk is scored (measured: 20 A4 pages at 150 dpi peak at 1539 MB
# scored one at a time, 2642 MB four at a time), so an A4 page at 150 dpi (2.2 million pixels) goes alone
# and small pages (slides, thumbnails) four at a time.
CHUNK_PIXELS = 1792 * 1792


def chunks(sizes: Sequence[tuple[int, int]], chunk: int = CHUNK) -> list[list[int]]:
    """Page positions computed together: groups of ``chunk`` consecutive pages, a group over :data:`CHUNK_PIXELS`
    drawn pixels split into consecutive runs under it (a page larger than that alone).

    The groups are those of a fixed ``chunk`` wherever they fit (so their float sums, which depend on the batch,
    are unchanged); only a group of large pages is computed in smaller batches.

    >>> chunks([(800, 600)] * 6), chunks([(1754, 1240), (1754, 1240), (800, 600)])
    ([[0, 1, 2, 3], [4, 5]], [[0], [1, 2]])
    """
    step = max(1, int(chunk))
    out: list[list[int]] = []
    for lo in range(0, len(sizes), step):
        group = range(lo, min(len(sizes), lo + step))
        if sum(sizes[i][0] * sizes[i][1] for i in group) <= CHUNK_PIXELS:
            out.append(list(group))
            continue
        pixels = 0
        for j, i in enumerate(group):
            h, w = sizes[i]
            if j and pixels + h * w <= CHUNK_PIXELS:
                out[-1].append(i)
                pixels += h * w
            else:
                out.append([i])
                pixels = h * w
    return out


def canvas_grids(cfg: CanvasConfig, opened: OpenContext) -> list[tuple[int, int]]:
    """Each page's cell grid on the canvas ``cfg`` makes, from its size alone (nothing drawn)."""
    out = []
    for i, (h, w) in enumerate(opened.sizes):
        if h < cfg.cell or w < cfg.cell:
            raise ValueError(f"page {i + 1} of {opened.source} is {h}x{w} px, smaller than one {cfg.cell} px token "
                             f"cell (sizes are height x width); render it larger (--dpi) or leave it out")
        ch, cw = smart_resize(h, w, cfg.cell, cfg.min_pixels, cfg.max_pixels)
        out.append((ch // cfg.cell, cw // cfg.cell))
    return out


def check_context(canvas: CanvasConfig, context: Any, *, tokens: int | None = None, saccades: int | None = None,
                  pages: Any = None, dpi: float = DEFAULT_DPI, layout: TextLayout = TextLayout(),
                  max_pages: int = MAX_PAGES) -> tuple[OpenContext, list[tuple[int, int]], int]:
    """Everything a context allocation refuses, checked before anything is drawn (or a model loaded): the pages
    (:func:`~arr_coc.contexts.inputs.open_context`), their canvas grids and the budget over them.

    Returns the opened context, each page's gestalt grid and K (one page given K: the ARR checks it later).
    """
    opened = open_context(context, pages=pages, dpi=dpi, layout=layout, max_pages=max_pages)
    grids = canvas_grids(canvas, opened)
    if len(opened) == 1 and tokens is None:
        return opened, [], int(saccades or 0)
    gestalts, k = split_context(grids, tokens=tokens, saccades=None if tokens is not None else saccades)
    return opened, gestalts, k


@dataclass
class SeenContext:
    """What a context's pages alone determine, for any number of questions: canvases, textures, words.

    Attributes:
        context: the pages as read (their words and sizes; the pixels are in the scenes' canvases).
        scenes: the ARR's :class:`~arr_coc.engine.pipeline.Scene` of each chunk of pages.
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


def _merge(t: dict[str, float], tc: dict[str, float]) -> None:
    for name, ms in tc.items():
        t[name] = t.get(name, 0.0) + ms


def _see(arr: ARR, opened: OpenContext, ocr: OCR | None, chunk: int, t: dict[str, float]) -> SeenContext:
    scenes, words, lines, sources, pages = [], [], [], [], []
    for positions in chunks(opened.sizes, chunk):
        drawn = opened.draw(positions)
        tc: dict[str, float] = {}  # this chunk's stage times, summed into t
        scene = arr.see([src for _, src in drawn], timings=tc)
        _merge(t, tc)
        scenes.append(scene)
        for r, (page, _) in enumerate(drawn):
            h, w = scene.canvas.sizes[r]
            one = len(opened) == 1 and not page.words and ocr is None  # an image alone: today's path, untouched
            ws, ls, src = ([], [], "none") if one else page_text(arr, scene.canvas.pixels[r, :, :h, :w], page, ocr)
            words.append(ws)
            lines.append(ls)
            sources.append(src)
            pages.append(replace(page, image=None))  # the canvas holds the pixels
    return SeenContext(Context(pages, opened.source, opened.meta), scenes, words, lines, sources, t)


def see_context(arr: ARR, context: Any, *, pages: Any = None, dpi: float = DEFAULT_DPI,
                layout: TextLayout = TextLayout(), max_pages: int = MAX_PAGES, ocr: OCR | None = None,
                chunk: int = CHUNK) -> SeenContext:
    """Read a context and compute what its pages alone determine, for several questions (see
    :func:`allocate_context` for the arguments). It holds every page's canvas and texture: for one question
    :func:`allocate_context` on the context itself holds a few pages at a time."""
    t: dict[str, float] = {}
    start = time.perf_counter()
    opened = open_context(context, pages=pages, dpi=dpi, layout=layout, max_pages=max_pages)
    canvas_grids(arr.config.canvas, opened)
    t["load"] = (time.perf_counter() - start) * 1e3
    return _see(arr, opened, ocr, chunk, t)


def _one_page(arr: ARR, seen: SeenContext, question: str, tokens: int | None, saccades: int | None,
              t: dict[str, float]) -> tuple[PageAllocation, Allocation]:
    scene = seen.scenes[0]
    (h, w), cell = scene.canvas.sizes[0], scene.canvas.cell
    image = seen.image(0)
    if seen.sources[0] != "none":
        hand_over(arr, image, seen.words[0], seen.lines[0])
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
        chunk: pages computed at once at most.

    Returns:
        A :class:`ContextAllocation`; ``.tokens`` is exactly T (or the gestalts + K).
    """
    question = check_queries([question], 1, arr.max_question_tokens)[0]
    if tokens is None and saccades is None:
        saccades = arr.config.sampler.saccades
    weights = dict(text_weight=text_weight, page_weight=page_weight, near_weight=near_weight)
    alloc = None
    if isinstance(context, SeenContext):
        seen, t = context, {}
        if len(seen) == 1:
            page_alloc, alloc = _one_page(arr, seen, question, tokens, saccades, t)
            out = [page_alloc]
        else:
            with torch.no_grad():  # a ranking, not a training step: no graph over the pages
                out = _many_pages(arr, seen, question, tokens, saccades, weights, t)
        source, meta = seen.context.source, seen.context.meta
    else:
        t = {}
        start = time.perf_counter()
        opened, gestalts, k = check_context(arr.config.canvas, context, tokens=tokens, saccades=saccades, pages=pages,
                                            dpi=dpi, layout=layout, max_pages=max_pages)
        t["load"] = (time.perf_counter() - start) * 1e3
        if len(opened) == 1:
            page_alloc, alloc = _one_page(arr, _see(arr, opened, ocr, chunk, t), question, tokens, saccades, t)
            out = [page_alloc]
        else:
            with torch.no_grad():
                out = _stream(arr, opened, question, gestalts, k, weights, ocr, chunk, t)
        source, meta = opened.source, opened.meta
    has_text = [p for p in out if p.words]
    text = "\n\n".join(" ".join(w for w, _ in p.words) for p in has_text)
    n_text = count_tokens(text, tokenizer) if has_text else None
    return ContextAllocation(question, out, source, dict(meta), n_text, tokenizer_name(tokenizer), t, alloc)


def text_parts(cell: int, sizes: Sequence[tuple[int, int]], rels: Sequence[Tensor], words: Sequence[list[Line]],
               lines: Sequence[list[Line]], question: str) -> list[RankParts]:
    """Every page's :class:`RankParts` from its relevance in [0, 1], its words and lines and its canvas size.

    The text part is the ``text_layer`` channel's map (the matching words painted with their values, over
    one context-wide maximum, clamped to [0, 1]) pooled to cells: computed from the words alone.
    """
    weights = idf(words, question)
    values = [word_values([w for w, _ in ws], question, weights) for ws in words]
    norm = max((max(v, default=0.0) for v in values), default=0.0)
    parts = []
    for size, rel, ws, ls, vs in zip(sizes, rels, words, lines, values):
        if norm > 0:
            m = (match_map(ws, question, size, weights) / norm).float().clamp(0, 1)
            text = pool_to_cells(m[None, None], cell)[0, 0]  # [hc, wc]
            near = near_map(ws, ls, [v / norm for v in vs], size, cell)
        else:
            text = near = torch.zeros_like(rel)
        parts.append(RankParts(rel, text, near[: rel.shape[0], : rel.shape[1]],
                               max(vs, default=0.0) / norm if norm > 0 else 0.0))
    return parts


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
    rels: list[Tensor] = list(relevance) if relevance is not None else []
    i = 0
    for scene in seen.scenes if relevance is None else ():
        b = scene.canvas.batch_size
        for j in range(b):
            hand_over(arr, seen.image(i + j), seen.words[i + j], seen.lines[i + j])
        rels.extend(_score(arr, scene, question, k, t))
        i += b
    start = time.perf_counter()
    sizes = [tuple(seen.image(i).shape[-2:]) for i in range(len(seen))]
    parts = text_parts(cell, sizes, rels, seen.words, seen.lines, question)
    t["text_layer"] = (time.perf_counter() - start) * 1e3
    return parts


def _score(arr: ARR, scene: Scene, question: str, k: int, t: dict[str, float]) -> list[Tensor]:
    """Each page's relevance scaled to [0, 1] over its cells."""
    tc: dict[str, float] = {}
    g = arr.gestalt(scene, k)
    relevance_map, _ = arr.score(scene, [question] * scene.canvas.batch_size, g.vector, timings=tc)
    _merge(t, tc)
    c = scene.canvas
    return [unit(relevance_map.map[r, : h // c.cell, : w // c.cell]) for r, (h, w) in enumerate(c.sizes)]


def _select(seen_pages: Sequence[Page], scores: list[Tensor], k: int, gestalts: Sequence[tuple[int, int]],
            cell: int, images: Sequence[Any], words: Sequence[list[Line]], sources: Sequence[str]) -> list[PageAllocation]:
    out = []
    for i, (page, s, cells) in enumerate(zip(seen_pages, scores, rank_cells(scores, k))):
        flat = s.reshape(-1)[cells[:, 0] * s.shape[1] + cells[:, 1]]
        plan = Plan("coc", "cells", tuple(s.shape), gestalt=gestalts[i], cells=cells, scores=flat)
        out.append(PageAllocation(page.index, images[i], plan, cell, s, words[i], sources[i]))
    return out


def _many_pages(arr: ARR, seen: SeenContext, question: str, tokens: int | None, saccades: int | None,
                weights: dict[str, float], t: dict[str, float]) -> list[PageAllocation]:
    cell = seen.scenes[0].canvas.cell
    grids = [g for scene in seen.scenes for g in scene.extents]
    gestalts, k = split_context(grids, tokens=tokens, saccades=saccades)
    scores = [ranking_score(p, **weights) for p in rank_parts(arr, seen, question, k, t)]
    start = time.perf_counter()
    out = _select(seen.context.pages, scores, k, gestalts, cell, [seen.image(i) for i in range(len(seen))],
                  seen.words, seen.sources)
    t["selection"] = (time.perf_counter() - start) * 1e3
    return out


def _redraw(arr: ARR, opened: OpenContext, i: int) -> Tensor:
    """Page ``i``'s canvas, drawn again (the same pixels the scoring saw: each page is resized on its own)."""
    cfg = arr.config.canvas
    (_, src), = opened.draw([i])
    c = make_canvas([src], cell=cfg.cell, min_pixels=cfg.min_pixels, max_pixels=cfg.max_pixels)
    h, w = c.sizes[0]
    param = next(arr.parameters(), None)
    return c.pixels[0, :, :h, :w].to(c.pixels.device if param is None else param.device)


def _stream(arr: ARR, opened: OpenContext, question: str, gestalts: list[tuple[int, int]], k: int,
            weights: dict[str, float], ocr: OCR | None, chunk: int, t: dict[str, float]) -> list[PageAllocation]:
    """Many pages, a chunk at a time: drawn, seen, their words handed over, scored, and let go."""
    cell = arr.config.canvas.cell
    rels: list[Tensor] = []
    words: list[list[Line]] = []
    lines: list[list[Line]] = []
    sources: list[str] = []
    sizes: list[tuple[int, int]] = []
    pages: list[Page] = []
    for positions in chunks(opened.sizes, chunk):
        drawn = opened.draw(positions)
        tc: dict[str, float] = {}
        scene = arr.see([src for _, src in drawn], timings=tc)
        _merge(t, tc)
        for r, (page, _) in enumerate(drawn):
            h, w = scene.canvas.sizes[r]
            image = scene.canvas.pixels[r, :, :h, :w]
            ws, ls, src = page_text(arr, image, page, ocr)
            hand_over(arr, image, ws, ls)
            words.append(ws)
            lines.append(ls)
            sources.append(src)
            sizes.append((h, w))
            pages.append(replace(page, image=None))
        del drawn  # the drawn pages go before the next chunk is drawn
        rels.extend(_score(arr, scene, question, k, t))
        del scene
    start = time.perf_counter()
    parts = text_parts(cell, sizes, rels, words, lines, question)
    t["text_layer"] = (time.perf_counter() - start) * 1e3
    start = time.perf_counter()
    scores = [ranking_score(p, **weights) for p in parts]
    images = [lambda i=i: _redraw(arr, opened, i) for i in range(len(pages))]
    out = _select(pages, scores, k, gestalts, cell, images, words, sources)
    t["selection"] = (time.perf_counter() - start) * 1e3
    return out
