"""Reading a context's pages: drawn a few at a time, put on the ARR's canvas, their text found.

:func:`read_pages` yields, chunk after chunk, the ARR's :class:`~arr_coc.engine.pipeline.Scene` of a few pages
(with each page's known text on it, for the text channels) and what the ranking keeps of each page;
:func:`see_context` keeps them all (a :class:`ContextScene`), so several questions pay for the pages once.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator, Sequence, Union

import torch
from torch import Tensor

from arr_coc.config import CanvasConfig
from arr_coc.contexts.inputs import MAX_PAGES, OpenContext, open_context
from arr_coc.contexts.line_embeddings import LineEmbeddings
from arr_coc.contexts.pagetext import OCR, page_text
from arr_coc.contexts.ranking import LAYER_RELEVANCE, check_layer_relevance, ink_map, unit
from arr_coc.contexts.result import Line
from arr_coc.documents.page import Context, Page
from arr_coc.documents.pdf import DEFAULT_DPI
from arr_coc.documents.text_pages import TextLayout
from arr_coc.engine.canvas import make_canvas, smart_resize
from arr_coc.engine.channel_registry import PageText
from arr_coc.engine.pipeline import ARR, Scene, cell_texture, prepare_cell_texture

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


@dataclass
class PageRead:
    """What the ranking keeps of a page once its chunk is seen: not its pixels (``image`` draws them again)."""

    page: Page  # without its pixels
    image: Union[Tensor, Callable[[], Tensor]]
    words: list[Line]
    lines: list[Line]
    source: str  # where its text came from: "text layer", "ocr" or "none"
    image_size: tuple[int, int] = (0, 0)  # (H, W) px of the page before its canvas
    # a text-layer page's words' ink on its cells, scaled to [0, 1] (unit(ink_map)): question-free, made once as the
    # page is read, what every question ranks it on under layer_relevance="ink"; None for a page without a text layer
    ink: Tensor | None = None


def scored(has_layer: Sequence[bool], layer_relevance: str = LAYER_RELEVANCE) -> bool:
    """Whether a chunk of pages is scored by the ARR: ``has_layer`` per page whether it has a text layer; a chunk whose
    pages all have one is ranked on their words' ink alone under ``layer_relevance="ink"`` (nothing to score)."""
    return check_layer_relevance(layer_relevance) == "arr" or not all(has_layer)


def read_chunk(arr: ARR, drawn: Sequence[tuple[Page, Any]], ocr: OCR | None, read_images: bool,
               t: dict[str, float], redraw: Callable[[int], Callable[[], Tensor]] | None = None,
               layer_relevance: str = LAYER_RELEVANCE) -> tuple[Scene, list[PageRead]]:
    """A chunk's scene, with each page's known text on it, and its pages as read.

    ``read_images``: whether a page without a text layer is read by OCR (the context has other pages to
    rank it against, or ``ocr`` was given); ``redraw(j)``: how the chunk's row ``j`` is drawn again (None:
    its canvas is kept); ``layer_relevance``: a chunk of text-layer pages ranked on their ink gets its canvas
    alone (no texture: :func:`scored`).
    """
    tc: dict[str, float] = {}  # this chunk's stage times, summed into t
    texture = scored([bool(page.words) for page, _ in drawn], layer_relevance)
    scene = arr.see([src for _, src in drawn], timings=tc, texture=texture)
    for name, ms in tc.items():
        t[name] = t.get(name, 0.0) + ms
    texts: list[PageText | None] = []
    out = []
    for r, (page, _) in enumerate(drawn):
        h, w = scene.canvas.sizes[r]
        image = scene.canvas.pixels[r, :, :h, :w]
        if page.words or read_images:
            ws, ls, src = page_text(arr, image, page, ocr)
        else:
            ws, ls, src = [], [], "none"
        texts.append(PageText(ws, ls) if src != "none" else None)
        ink = unit(ink_map(ws, (h, w), scene.canvas.cell)).to(image) if src == "text layer" else None
        out.append(PageRead(replace(page, image=None), image if redraw is None else redraw(r), ws, ls, src,
                            tuple(scene.canvas.image_sizes[r]), ink))
    return replace(scene, text=texts), out


def read_pages(arr: ARR, opened: OpenContext, ocr: OCR | None, chunk: int, t: dict[str, float], *,
               keep: bool, layer_relevance: str = LAYER_RELEVANCE) -> Iterator[tuple[Scene, list[PageRead]]]:
    """Every chunk of the context's pages, drawn, seen and read; ``keep``: whether the pages' canvases are kept
    (else each page's ``image`` draws it again, and a chunk's pixels go before the next is drawn);
    ``layer_relevance``: as :func:`read_chunk`."""
    read_images = len(opened) > 1 or ocr is not None
    for positions in chunks(opened.sizes, chunk):
        drawn = opened.draw(positions)
        redraw = None if keep else (lambda r, positions=positions: (lambda: _redraw(arr, opened, positions[r])))
        yield read_chunk(arr, drawn, ocr, read_images, t, redraw, layer_relevance)
        del drawn


def _redraw(arr: ARR, opened: OpenContext, i: int) -> Tensor:
    """Page ``i``'s canvas, drawn again (the same pixels the scoring saw: each page is resized on its own)."""
    cfg = arr.config.canvas
    (_, src), = opened.draw([i])
    c = make_canvas([src], cell=cfg.cell, min_pixels=cfg.min_pixels, max_pixels=cfg.max_pixels)
    h, w = c.sizes[0]
    param = next(arr.parameters(), None)
    return c.pixels[0, :, :h, :w].to(c.pixels.device if param is None else param.device)


@dataclass
class ContextScene:
    """What a context's pages alone determine, for any number of questions: canvases, textures, words.

    Attributes:
        context: the pages as read (their words and sizes; the pixels are in the scenes' canvases).
        scenes: the ARR's :class:`~arr_coc.engine.pipeline.Scene` of each chunk of pages, each page's known
            text on it.
        reads: per page, what the ranking keeps (:class:`PageRead`).
        timings_ms: the time each stage took.
        embeddings: its lines' retrieval embeddings by the ARR's retriever, coarse to fine
            (:class:`~arr_coc.contexts.line_embeddings.LineEmbeddings`: one passage in three when seen, the rest where
            questions look); None when not computed.
        layer_relevance: what its text-layer pages are ranked on (``"ink"``: their chunks have no texture).
    """

    context: Context
    scenes: list[Scene]
    reads: list[PageRead]
    timings_ms: dict[str, float] = field(default_factory=dict)
    embeddings: LineEmbeddings | None = None
    layer_relevance: str = LAYER_RELEVANCE

    def __len__(self) -> int:
        return len(self.reads)

    @property
    def words(self) -> list[list[Line]]:
        return [r.words for r in self.reads]

    @property
    def lines(self) -> list[list[Line]]:
        return [r.lines for r in self.reads]

    @property
    def sources(self) -> list[str]:
        return [r.source for r in self.reads]

    def chunks(self) -> Iterator[tuple[Scene, list[PageRead]]]:
        """The scenes with their pages, as :func:`read_pages` yields them."""
        i = 0
        for scene in self.scenes:
            b = scene.canvas.batch_size
            yield scene, self.reads[i: i + b]
            i += b

    def image(self, i: int) -> Tensor:
        """Page ``i``'s canvas [3, H, W]."""
        return self.reads[i].image  # kept: a tensor


# Any question: a question-coupled channel without a ``prepare`` leaves its per-page work in the ARR's cache when
# computed for it.
WARM_QUESTION = "What does this page say?"


def warm_channels(arr: ARR, scenes: Sequence[Scene]) -> None:
    """The question-coupled channels' per-page work (the text channels' lines embedded by the question encoder, a
    model's features of the page), done now into ``arr.cache``: each question then does its own work only (while
    the cache holds the pages). A channel that declares that part (``prepare``: the text channels) does it alone;
    any other is computed once for ``WARM_QUESTION``."""
    cfg = arr.config.texture
    with torch.no_grad():
        for scene in scenes:
            rest = prepare_cell_texture(scene.canvas, arr.query_channels, query_encoder=arr.query_encoder,
                                        cache=arr.cache, options=cfg.options, text=scene.text)
            if rest:
                cell_texture(scene.canvas, rest, queries=[WARM_QUESTION] * scene.canvas.batch_size,
                             query_encoder=arr.query_encoder, cache=arr.cache, options=cfg.options, text=scene.text)


def see_context(arr: ARR, context: Any, *, pages: Any = None, dpi: float = DEFAULT_DPI,
                layout: TextLayout = TextLayout(), max_pages: int = MAX_PAGES, ocr: OCR | None = None,
                chunk: int = CHUNK, embed: bool = True, layer_relevance: str = LAYER_RELEVANCE) -> ContextScene:
    """Read a context and compute what its pages alone determine, for several questions (see
    :func:`~arr_coc.contexts.allocate` for the arguments): canvases, textures, words and lines, and (``embed``)
    the lines' retrieval embeddings by ``arr.retriever`` (one passage in three; each question embeds the rest of
    the chunks it ranks best, and later questions reuse them: :mod:`~arr_coc.contexts.line_embeddings`), and the
    question-coupled channels' per-page work (:func:`warm_channels`). Chunks of text-layer pages ranked on their ink
    (``layer_relevance="ink"``, the default) get their canvases alone: no texture, no channel work. It holds every
    page's canvas and texture: for one question :func:`~arr_coc.contexts.allocate` on the context itself holds a few
    pages at a time."""
    check_layer_relevance(layer_relevance)
    t: dict[str, float] = {}
    start = time.perf_counter()
    opened = open_context(context, pages=pages, dpi=dpi, layout=layout, max_pages=max_pages)
    canvas_grids(arr.config.canvas, opened)
    t["load"] = (time.perf_counter() - start) * 1e3
    scenes, reads = [], []
    for scene, read in read_pages(arr, opened, ocr, chunk, t, keep=True, layer_relevance=layer_relevance):
        scenes.append(scene)
        reads.extend(read)
    out = ContextScene(Context([r.page for r in reads], opened.source, opened.meta), scenes, reads, t,
                       layer_relevance=layer_relevance)
    warm = [scene for scene, rs in out.chunks() if scored([r.source == "text layer" for r in rs], layer_relevance)]
    if arr.query_channels and warm:
        start = time.perf_counter()
        warm_channels(arr, warm)
        t["coupling"] = (time.perf_counter() - start) * 1e3
    if embed and any(r.lines for r in reads):
        start = time.perf_counter()
        out.embeddings = LineEmbeddings.see(arr.retriever, out.lines)
        t["retrieval"] = (time.perf_counter() - start) * 1e3
    return out
