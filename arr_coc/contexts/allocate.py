"""One budget over any input: ``allocate(arr, context, question, budget)``, one image being a context of one page.

1. the input's pages are sized and checked before any is drawn (:func:`~arr_coc.contexts.inputs.open_context`:
   the page count, each page's and all pages' pixels), and the budget (:class:`~arr_coc.budget.Budget`, split by
   :meth:`~arr_coc.budget.Budget.split`) gives each page a gestalt and leaves K saccades for all pages, from the
   canvas grids those sizes make: a budget too small is refused before anything is drawn (a compression
   ``"10x"`` is split once the pages' text is counted);
2. the pages are drawn, put on the ARR's canvas and scored a few at a time (at most ``chunk`` pages and
   :data:`~arr_coc.contexts.seen.CHUNK_PIXELS` drawn pixels at once, :mod:`arr_coc.contexts.seen`); what the
   ranking needs of a page (its relevance, its words) is kept, its pixels are not unless all pages fit one
   chunk: a page's canvas is drawn again when asked for;
3. every page without a text layer is scored by the same ARR (one scorer, one question); a page's known text
   (rendered words, or lines read by ``ocr``) goes to the ``text_match`` / ``key_value`` channels on its scene
   (:class:`~arr_coc.engine.channel_registry.PageText`), so no OCR runs on it. An image page is read by the text
   channels' OCR when the context has other pages to rank it against (or ``ocr`` is given). A page with a text
   layer (a PDF's, a text file's set words) takes the share of each cell its words cover as its relevance
   (:func:`~arr_coc.contexts.ranking.ink_map`; ``layer_relevance="arr"``: scored as the others are);
4. one ranking over every cell of every page (:mod:`arr_coc.contexts.ranking`): the page's relevance scaled
   to [0, 1], plus the text-layer match, the page's best word and where a matched line's answer sits; the
   context's top K cells (ties to the earlier page, then cell) decide each page's share k_i of the saccades;
5. each page's own sampler (the ARR's: ``topk`` by default, or ``nms``, ``stratified``, ...) places its k_i
   saccades on the page's placing map (:func:`~arr_coc.contexts.ranking.placing_map`): the ranking in the page's
   own relevance units, so for top-K its cells are the context's top K themselves (``images_alone=True``: a
   page without a text layer reads its relevance plus ``image_retrieval_weight`` times its lines' retrieval
   instead, as one image alone is placed). One image alone is placed by its relevance plus
   ``image_retrieval_weight`` times its own lines' retrieval (:func:`image_placing`), or by its relevance alone
   where it has fewer than :data:`~arr_coc.budget.LEGIBLE_MIN_LINES` lines (a photo's few words). Another sampler
   spreads each page's share by its own rule. One image without text lines gives exactly what
   ``ARR()(image, question)`` gives, on every sampler.

The total sent is exact: sum of the gestalts + K.
"""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Callable, Sequence

import torch
from torch import Tensor

from arr_coc.budget import LEGIBLE_MIN_LINES, Budget
from arr_coc.config import ARRConfig, check_float
from arr_coc.contexts.answer_types import question_typed_lines, shaped_lines
from arr_coc.contexts.inputs import MAX_PAGES, OpenContext, open_context
from arr_coc.contexts.line_embeddings import REFINE_CHUNKS, LineEmbeddings, check_refine
from arr_coc.contexts.line_values import RERANK_TOP, TYPED_FLOOR, line_values
from arr_coc.contexts.pagetext import OCR, legible_lines
from arr_coc.contexts.ranking import (
    BM25_WEIGHT,
    LAYER_RELEVANCE,
    NEAR_WEIGHT,
    PAGE_WEIGHT,
    RETRIEVAL_WEIGHT,
    TEXT_WEIGHT,
    Line,
    RankParts,
    bm25_line_scores,
    check_layer_relevance,
    fuse_bm25,
    passage_texts,
    placing_map,
    rank_cells,
    ranking_score,
    text_parts,
)
from arr_coc.contexts.result import ContextAllocation, PageAllocation
from arr_coc.contexts.seen import (
    CHUNK,
    ContextScene,
    PageRead,
    canvas_grids,
    read_chunk,
    read_pages,
    scored,
)
from arr_coc.contexts.tokens import text_tokens as count_tokens
from arr_coc.contexts.tokens import tokenizer_name
from arr_coc.documents.pdf import DEFAULT_DPI
from arr_coc.documents.text_pages import TextLayout
from arr_coc.engine.canvas import Canvas
from arr_coc.engine.channels.text import median_height, text_lines
from arr_coc.engine.pipeline import ARR, Scene
from arr_coc.engine.plan import Plan
from arr_coc.engine.query import Questions, check_queries

# question-coupled channels computed outside the ARR for a chunk: (canvas, questions) -> {name: [B, C, Hc, Wc]}
# (a VLM's first look: what ``ARR.forward(coupled=)`` takes)
Coupled = Callable[[Canvas, list[str]], dict[str, Tensor]]


# one image without a text layer: its relevance plus this weight times its own lines' retrieval map (the lines its
# text channels read, ranked by the ARR's retriever), in the relevance's units. Chosen at 11 % on the validation
# questions of image-paraphrase, SROIE and FUNSD: 0.5 gains on all three, 1 reads most on image-paraphrase but loses
# on SROIE (docs/coc.md, "One image: its own lines retrieved")
IMAGE_RETRIEVAL_WEIGHT = 0.5


def placed_lines(lines: Sequence[Line]) -> list[Line]:
    """The lines a page without a text layer is placed by: all of them on a page of text (at least
    :data:`~arr_coc.budget.LEGIBLE_MIN_LINES`, as the legible gestalt counts them), none on a photo whose OCR reads a
    few words (a sign, a shirt: the question asks for an object, and a ramp over its lines would give the best of
    them the top value whatever it says), which its relevance places alone.

    >>> line = ("TOTAL 14.45", (0.0, 0.0, 28.0, 280.0))
    >>> len(placed_lines([line] * 8)), len(placed_lines([line] * 7))
    (8, 0)
    """
    return list(lines) if len(lines) >= LEGIBLE_MIN_LINES else []


def image_weights(retrieval_weight: float = IMAGE_RETRIEVAL_WEIGHT) -> dict[str, float]:
    """The placing weights of a page without a text layer (and the ranking's of one image alone): its lines'
    retrieval only, no words to match."""
    return dict(text_weight=0.0, page_weight=0.0, near_weight=0.0, retrieval_weight=retrieval_weight)


def check_ranking_weights(**weights: float) -> None:
    """Every ranking weight a finite number >= 0, else a one-line error naming it (a negative weight would turn its
    part's ranking upside down, a NaN rank cells in no order): checked before a page is read.

    >>> check_ranking_weights(retrieval_weight=8.0, bm25_weight=0)
    >>> check_ranking_weights(page_weight=-1.0)
    Traceback (most recent call last):
    ...
    ValueError: page_weight must be a finite number >= 0, got -1.0
    """
    for name, w in weights.items():
        check_float(name, w, strict=False)


def plan_budget(config: ARRConfig, budget: Budget, grids: Sequence[tuple[int, int]],
                text_tokens: int | None = None, text_height: float | None = None) -> tuple[list[tuple[int, int]], int]:
    """Each page's gestalt grid and K for pages of these cell grids: :meth:`Budget.split` (``text_height``: one
    page's text lines' median height, :func:`~arr_coc.engine.channels.text.text_heights`), or the config's fixed
    gestalt grid (``--gestalt N``, each side clamped to the page) with K saccades."""
    gestalts, k = budget.split(grids, text_tokens=text_tokens, text_height=text_height)
    if config.gestalt.grid is not None:
        if budget.kind != "saccades":
            raise ValueError(f"a fixed gestalt grid {config.gestalt.grid} comes with K saccades, not a total "
                             f"budget ({budget}): the total sets the gestalt by the split rule; drop one")
        gestalts = [config.gestalt.grid_for(k, g) for g in grids]
    return gestalts, k


def check_context(config: ARRConfig, context: Any, budget: Any = None, *, pages: Any = None, dpi: float = DEFAULT_DPI,
                  layout: TextLayout = TextLayout(), max_pages: int = MAX_PAGES,
                  ) -> tuple[OpenContext, list[tuple[int, int]], tuple[list[tuple[int, int]], int] | None]:
    """Everything an allocation refuses, checked before anything is drawn (or a model loaded): the pages
    (:func:`~arr_coc.contexts.inputs.open_context`), their canvas grids and the budget over them.

    Returns the opened context (:func:`allocate` takes it as it is: the input is opened once), each page's cell
    grid and the split (gestalt grids, K); the split is None for a compression (``"10x"``), which needs the
    pages' text.
    """
    budget = Budget.saccades(config.sampler.saccades) if budget is None else Budget.parse(budget)
    opened = context if isinstance(context, OpenContext) else open_context(context, pages=pages, dpi=dpi,
                                                                           layout=layout, max_pages=max_pages)
    grids = canvas_grids(config.canvas, opened)
    return opened, grids, None if budget.needs_text else plan_budget(config, budget, grids)


def _score(arr: ARR, scene: Scene, question: str | Sequence[str], gestalts: Sequence[tuple[int, int]] | None,
           t: dict[str, float], coupled: Coupled | None = None, reads: Sequence[PageRead] | None = None,
           layer_relevance: str = LAYER_RELEVANCE) -> list[tuple[Tensor, Tensor, Tensor | None, Tensor]]:
    """Per page of a chunk: its relevance [hc, wc], valid cells, context weights [3] (None: no scorer ran on it)
    and question embedding [1, D].

    ``question``: one for every page, or one per page (a batch of one-page contexts). The gestalt the scorer reads
    is the chunk's (its vector: the mean of each page's cells), on the pages' grid. ``reads``: the chunk's pages as
    read; under ``layer_relevance="ink"`` a page with a text layer takes its words' ink as its relevance, and a
    chunk of such pages alone is not scored (:func:`~arr_coc.contexts.seen.scored`).
    """
    tc: dict[str, float] = {}
    c = scene.canvas
    # the question was checked once, where the request entered (allocate): every chunk takes it as it is
    questions = Questions([question] * c.batch_size if isinstance(question, str) else list(question),
                          arr.max_question_tokens, None)
    layer = [r.source == "text layer" for r in reads] if reads is not None else [False] * c.batch_size
    if scored(layer, layer_relevance):
        grid = None if gestalts is None else (min(g[0] for g in gestalts), min(g[1] for g in gestalts))
        g = arr.gestalt(scene, arr.config.sampler.saccades, grid)
        given = None if coupled is None else coupled(c, questions)
        relevance, query_emb = arr.score(scene, questions, g.vector, timings=tc, given=given)
        maps, weights = relevance.map, list(relevance.weights)
    else:  # every page ranked on its ink: the question's embedding alone (what a sampler may read)
        start = time.perf_counter()
        query_emb = arr.query_encoder.encode(questions).to(c.pixels)
        tc["query"] = (time.perf_counter() - start) * 1e3
        maps, weights = None, [None] * c.batch_size
    for name, ms in tc.items():
        t[name] = t.get(name, 0.0) + ms
    out = []
    for r, (h, w) in enumerate(c.sizes):
        gh, gw = h // c.cell, w // c.cell
        if layer[r] and layer_relevance == "ink":  # its ink, made once as it was read
            rel, weight = reads[r].ink, None
        else:
            rel, weight = maps[r, :gh, :gw], weights[r]
        out.append((rel, c.valid[r, :gh, :gw], weight, query_emb[r: r + 1]))
    return out


def _place(arr: ARR, placing: Tensor, k: int, valid: Tensor, query_emb: Tensor) -> tuple[Tensor, Tensor]:
    """The page's sampler on its placing map: its k saccades [k, 2] and their scores [k]."""
    if k == 0:
        return torch.zeros(0, 2, dtype=torch.long, device=placing.device), placing.new_zeros(0)
    sel = arr.select(placing[None], k, valid=valid[None], query_emb=query_emb)
    return sel.positions[0], sel.scores[0]


def allocate(arr: ARR, context: Any, question: str, budget: Any = None, *, pages: Any = None,
             dpi: float = DEFAULT_DPI, layout: TextLayout = TextLayout(), max_pages: int = MAX_PAGES,
             tokenizer: Any = None, ocr: OCR | None = None, text_weight: float = TEXT_WEIGHT,
             page_weight: float = PAGE_WEIGHT, near_weight: float = NEAR_WEIGHT,
             retrieval_weight: float = RETRIEVAL_WEIGHT, chunk: int = CHUNK,
             image_retrieval_weight: float = IMAGE_RETRIEVAL_WEIGHT, images_alone: bool = False,
             layer_relevance: str = LAYER_RELEVANCE, bm25_weight: float = BM25_WEIGHT,
             refine: int | None = REFINE_CHUNKS) -> ContextAllocation:
    """Allocate one budget over any input's pages for a question (one image is a context of one page).

    Args:
        arr: the ARR whose canvas, channels, scorer and sampler every page goes through.
        context: an image (path, PIL image, [3, H, W] tensor), a list of images (or a [B, 3, H, W] tensor), a PDF,
            a text file, a :class:`~arr_coc.documents.page.Context`, or a :class:`ContextScene` (from
            :func:`~arr_coc.contexts.see_context`: several questions pay for the pages once), or the
            :class:`~arr_coc.contexts.inputs.OpenContext` :func:`check_context` returned.
        question: the question.
        budget: what :meth:`Budget.parse` takes (``"529"``, ``"25%"``, ``"10x"``) or a :class:`Budget`
            (``Budget.saccades(K)``); default K = the ARR's saccades.
        pages: a PDF's pages (1-based range string, 0-based indices, None for all).
        dpi: a PDF's render resolution.
        layout: how a text file is set on pages.
        max_pages: the most pages taken (more is refused, naming this option).
        tokenizer: the VLM's tokenizer (or processor) to count the text tokens; default the offline one.
        ocr: ``ocr(canvas [3, H, W]) -> [(line text, (y0, x0, y1, x1) px)]`` for pages without text;
            default the text channels' own cached RapidOCR.
        text_weight, page_weight, near_weight, retrieval_weight: the ranking's weights
            (:mod:`arr_coc.contexts.ranking`); the retrieval part ranks the context's lines by ``arr.retriever``
            (a :class:`ContextScene` brings its lines' embeddings; otherwise they are computed here).
        chunk: pages computed at once at most.
        image_retrieval_weight: one page without a text layer (one image) is placed by its relevance plus this
            weight times its text lines' retrieval map (:func:`image_placing`; a photo with fewer than
            :data:`~arr_coc.budget.LEGIBLE_MIN_LINES` lines: its relevance alone); the four weights above are then
            unused (0: its relevance alone, as ``ARR()(image, question)`` places it).
        images_alone: in a context of several pages, each page without a text layer (an image, a scan) places its
            share on that map too (its relevance plus ``image_retrieval_weight`` x its lines' retrieval) instead of
            the ranking; the ranking still decides the shares. Off by default: on contexts of 4 receipts and forms
            it read 0.753 against 0.704 (validation), on a scanned manual's title-page questions at 20x it lost
            (docs/coc.md, "Several images").
        layer_relevance: what a page with a text layer is ranked and placed on under the question's parts:
            ``"ink"`` (the default), the share of each cell its words cover, its texture and scorer not computed;
            ``"arr"``, the ARR's relevance, as a page without text (:data:`~arr_coc.contexts.ranking.LAYER_RELEVANCE`).
            A :class:`ContextScene` seen with ``"ink"`` has no texture to score: ``"arr"`` needs one seen with it.
        bm25_weight: the context's lines' BM25 for the question fused into their retrieval scores (cosine +
            ``bm25_weight`` x BM25 / the context's best; :func:`question_scores`), on every page and one image alike;
            0: the retriever's cosine alone.
        refine: coarse to fine (:mod:`~arr_coc.contexts.line_embeddings`): every line is first scored by its
            chunk's passage (one in three, embedded when the context is seen), then the question's ``refine`` best
            chunks' lines by their own passages (embedded now, kept by a :class:`ContextScene` for later questions);
            None: every line by its own passage (the see's saving is then spent on the first question). One image
            is always read line by line.

    Returns:
        A :class:`ContextAllocation`: ``.pages[i]`` per page; ``.tokens`` is exactly the budget's total (or the
        gestalts + K).

    Example:
        >>> from arr_coc.engine.query import HashingQueryEncoder
        >>> arr = ARR(query_encoder=HashingQueryEncoder())
        >>> out = allocate(arr, torch.rand(3, 560, 560), "What is the total?", "192")
        >>> out.tokens, out.pages[0].plan.gestalt, out.pages[0].saccades
        (192, (8, 8), 128)
    """
    question = check_queries([question], 1, arr.max_question_tokens)[0]
    budget = Budget.saccades(arr.config.sampler.saccades) if budget is None else Budget.parse(budget)
    arr.check_weights()
    check_layer_relevance(layer_relevance)
    check_refine(refine)
    check_ranking_weights(text_weight=text_weight, page_weight=page_weight, near_weight=near_weight,
                          retrieval_weight=retrieval_weight, image_retrieval_weight=image_retrieval_weight,
                          bm25_weight=bm25_weight)
    t: dict[str, float] = {}
    if isinstance(context, ContextScene):
        if layer_relevance == "arr" and context.layer_relevance == "ink":
            raise ValueError("this context was seen with layer_relevance='ink' (its text-layer pages have no texture "
                             "to score); see it with see_context(..., layer_relevance='arr') to allocate with 'arr'")
        grids = [g for scene in context.scenes for g in scene.extents]
        split = None if budget.needs_text else plan_budget(arr.config, budget, grids)
        source, meta, stream = context.context.source, context.context.meta, context.chunks()
    else:
        start = time.perf_counter()
        opened, grids, split = check_context(arr.config, context, budget, pages=pages, dpi=dpi, layout=layout,
                                             max_pages=max_pages)
        t["load"] = (time.perf_counter() - start) * 1e3
        one_chunk = len(grids) <= max(1, int(chunk))  # all pages in memory at once anyway: their canvases are kept
        source, meta = opened.source, opened.meta
        stream = read_pages(arr, opened, ocr, chunk, t, keep=one_chunk, layer_relevance=layer_relevance)
    reads: list[PageRead] = []
    scores: list[tuple[Tensor, Tensor, Tensor | None, Tensor]] = []
    height, lone = None, []
    with torch.no_grad():  # a ranking, not a training step: no graph over the pages
        for scene, read in stream:
            scores.extend(_score(arr, scene, question, None if split is None else
                                 split[0][len(reads): len(reads) + len(read)], t, reads=read,
                                 layer_relevance=layer_relevance))
            if len(grids) == 1:  # one page: its lines as the text channels read them, for its gestalt and placing
                channel_lines = text_lines(arr, scene)[0]
                height = None if channel_lines is None else median_height(channel_lines)
                lone = legible_lines(channel_lines)
            reads.extend(read)
            del scene
        has_text = [r for r in reads if r.words]
        text = "\n\n".join(" ".join(w for w, _ in r.words) for r in has_text)
        n_text = count_tokens(text, tokenizer) if has_text else None
        gestalts, k = plan_budget(arr.config, budget, grids, n_text, height)
        weights = dict(text_weight=text_weight, page_weight=page_weight, near_weight=near_weight,
                       retrieval_weight=retrieval_weight)
        embedded, placing = context, None  # a seen context's line embeddings are its reads' lines'
        if len(reads) == 1 and reads[0].source != "text layer":  # one image: placed by its own lines' retrieval
            refine = None  # every passage of its few lines, as for a batch of images (allocate_images)
            if not reads[0].lines:  # the lines its text channels read: embedded here, not at its seeing
                reads[0], embedded = replace(reads[0], lines=lone), None
            reads[0] = replace(reads[0], lines=placed_lines(reads[0].lines))  # a photo's few words: none
            weights = image_weights(image_retrieval_weight)  # its ranking is its placing
        elif images_alone:  # a page without a text layer (an image, a scan) placed within its share as one image is
            placing = [None if r.source == "text layer" else
                       image_weights(image_retrieval_weight if placed_lines(r.lines) else 0.0) for r in reads]
        values = (retrieval_parts(arr, embedded, reads, question, t, bm25_weight, refine) if weights["retrieval_weight"]
                  else None)
        out = _pages(arr, reads, scores, grids, gestalts, k, question, weights, t, values, placing)
    return ContextAllocation(question, out, source, dict(meta), n_text, tokenizer_name(tokenizer), t, budget)


def retrieval_scores(arr: ARR, context: Any, reads: Sequence[PageRead], question: str,
                     t: dict[str, float], bm25_weight: float = BM25_WEIGHT,
                     refine: int | None = REFINE_CHUNKS) -> list[Tensor] | None:
    """Each page's lines' retrieval scores for the question (None: no page has lines): the retriever's cosine with
    ``bm25_weight`` x the lines' BM25 fused in (:func:`question_scores`). A :class:`ContextScene`'s line embeddings
    are reused when they are the ARR's retriever's; otherwise the lines are embedded here."""
    if not any(r.lines for r in reads):
        return None
    start = time.perf_counter()
    seen = context if isinstance(context, ContextScene) else None
    if seen is not None and seen.embeddings is not None and seen.embeddings.retriever == arr.retriever.name:
        embeddings = seen.embeddings
    else:
        embeddings = LineEmbeddings.see(arr.retriever, [r.lines for r in reads])
    t["retrieval"] = t.get("retrieval", 0.0) + (time.perf_counter() - start) * 1e3
    return question_scores(arr, embeddings, [r.lines for r in reads], question, bm25_weight, t, refine)


def question_scores(arr: ARR, embeddings: LineEmbeddings, lines: Sequence[Sequence[Line]], question: str,
                    bm25_weight: float = BM25_WEIGHT, t: dict[str, float] | None = None,
                    refine: int | None = REFINE_CHUNKS) -> list[Tensor]:
    """Each page's lines' score for the question: their passages' cosine with the question's (``arr.retriever``;
    :meth:`LineEmbeddings.scores`: the ``refine`` best chunks' lines by their own passage, embedded now where they are
    not yet; None: every line) plus ``bm25_weight`` x their BM25 over the context's best
    (:func:`~arr_coc.contexts.ranking.fuse_bm25`; 0: the cosine alone; a weight below 0 or not finite is refused in
    one line)."""
    check_ranking_weights(bm25_weight=bm25_weight)
    t = {} if t is None else t
    start = time.perf_counter()
    scores = embeddings.scores(arr.retriever, arr.retriever.queries([question])[0], refine)
    t["retrieval"] = t.get("retrieval", 0.0) + (time.perf_counter() - start) * 1e3
    if not bm25_weight:
        return scores
    start = time.perf_counter()
    scores = fuse_bm25(scores, bm25_line_scores([[text for text, _ in ls] for ls in lines], question), bm25_weight)
    t["bm25"] = t.get("bm25", 0.0) + (time.perf_counter() - start) * 1e3
    return scores


def retrieval_parts(arr: ARR, context: Any, reads: Sequence[PageRead], question: str,
                    t: dict[str, float], bm25_weight: float = BM25_WEIGHT,
                    refine: int | None = REFINE_CHUNKS) -> list[Tensor] | None:
    """Each page's lines' retrieval values for the question (:func:`~arr_coc.contexts.ranking.line_values`; None: no
    page has lines): the retriever's scores (:func:`retrieval_scores`), its best lines reordered by the retriever's
    cross-encoder where it has one (``arr.retriever.rerank``: a model-free retriever has none), each line read as
    the passage the retriever read, the lines holding a span of the type the question asks for (a date, a version,
    a name: :mod:`~arr_coc.contexts.answer_types`) floored and those holding a token of the shape it names (a command,
    a file, a length) raised. ``refine``: the best chunks whose lines the retriever
    reads by their own passages (:meth:`LineEmbeddings.scores`; None: every line)."""
    scores = retrieval_scores(arr, context, reads, question, t, bm25_weight, refine)
    if scores is None:
        return None
    return _line_values(arr, scores, [r.lines for r in reads], [r.page.index == 0 for r in reads], question, t)


def _line_values(arr: ARR, scores: list[Tensor], lines: Sequence[Sequence[Line]], first: Sequence[bool],
                 question: str, t: dict[str, float], rerank_top: int = RERANK_TOP,
                 typed_floor: float = TYPED_FLOOR) -> list[Tensor]:
    """:func:`retrieval_parts` from the pages' lines' scores, lines and first-page flags (``rerank_top``: the best
    lines the retriever's cross-encoder reorders; ``typed_floor``: the floor on the lines holding the question's
    answer type)."""
    start = time.perf_counter()
    rerank = getattr(arr.retriever, "rerank", None)
    call = None
    if rerank is not None and rerank_top > 0:
        texts = [passage_texts(ls) for ls in lines]
        call = lambda picked: rerank(question, [texts[p][i] for p, i in picked])  # noqa: E731
    said = [[text for text, _ in ls] for ls in lines]  # (not ``texts``: the reranker's call reads that name)
    values = line_values(scores, list(first), call, rerank_top=rerank_top, typed=question_typed_lines(question, said),
                         typed_floor=typed_floor, shaped=shaped_lines(question, said))
    t["rerank"] = t.get("rerank", 0.0) + (time.perf_counter() - start) * 1e3
    return values


def image_placing(arr: ARR, scene: Scene, relevance: Tensor, question: str,
                  weight: float = IMAGE_RETRIEVAL_WEIGHT, rerank_top: int = RERANK_TOP,
                  bm25_weight: float = BM25_WEIGHT, typed_floor: float = TYPED_FLOOR) -> Tensor:
    """Where one image's saccades go for a question: ``[1, Hc, Wc]``, its ``relevance`` (the ARR's map on a
    one-image ``scene``) plus ``weight`` times its text lines' retrieval map in the relevance's own units
    (:func:`~arr_coc.contexts.ranking.placing_map`), the lines its text channels read ranked by ``arr.retriever``.

    What :func:`allocate` and :func:`allocate_images` place a lone image on (the eval's image methods read it as
    their relevance); an image with fewer than :data:`~arr_coc.budget.LEGIBLE_MIN_LINES` text lines
    (:func:`placed_lines`: a photo), an ARR without text channels or ``weight`` 0 get ``relevance``.
    ``rerank_top``: the image's best lines reordered by the retriever's cross-encoder (by default none, as
    :func:`allocate` places it; 32 read 0.845 against 0.843 on the validation questions, docs/coc.md).
    ``bm25_weight``: the lines' BM25 fused into their retrieval scores (:func:`question_scores`). ``typed_floor``: the
    floor on the lines holding the answer type the question asks for (a date, a person:
    :data:`~arr_coc.contexts.line_values.TYPED_FLOOR`, as over a context).
    """
    check_ranking_weights(weight=weight, bm25_weight=bm25_weight)
    lines = placed_lines(legible_lines(text_lines(arr, scene)[0]))
    if not lines or not weight:
        return relevance
    cell = scene.canvas.cell
    hc, wc = (s // cell for s in scene.canvas.sizes[0])
    scores = question_scores(arr, LineEmbeddings.see(arr.retriever, [lines]), [lines], question, bm25_weight,
                             refine=None)  # one image's lines, every passage (it is seen for this question alone)
    values = _line_values(arr, scores, [lines], [True], question, {}, rerank_top,  # the only page, as allocate reads it
                          typed_floor=typed_floor)
    rel = relevance[0, :hc, :wc]
    part = text_parts(cell, [(hc * cell, wc * cell)], [rel], [[]], [lines], question, retrieved=values)[0]
    out = relevance.clone()
    out[0, :hc, :wc] = placing_map(rel, part, **image_weights(weight))
    return out


def allocate_images(arr: ARR, images: Sequence[Any], questions: Sequence[str], budget: Any = None, *,
                    coupled: Coupled | None = None, tokenizer: Any = None,
                    image_retrieval_weight: float = IMAGE_RETRIEVAL_WEIGHT,
                    bm25_weight: float = BM25_WEIGHT) -> list[ContextAllocation]:
    """``allocate(arr, images[b], questions[b], budget)`` for every b, the B images seen and scored in one ARR pass.

    Each image is a context of one page (checked, split and placed as :func:`allocate` does it, by the same
    functions); only the seeing and scoring are batched, as ``ARR()(images, questions)`` batches them (each image
    on its own canvas: a batch gives what each image gives alone).

    Args:
        arr, budget, tokenizer, image_retrieval_weight, bm25_weight: as in :func:`allocate`.
        images: one image each (a path, a PIL image, a [3, H, W] tensor).
        questions: one per image.
        coupled: question-coupled channels computed elsewhere (``{"first_look": [B, 1, Hc, Wc]}``: a VLM's
            attention to its gestalt), given the batch's canvas and questions, as ``ARR.forward(coupled=)``.

    Example:
        >>> from arr_coc.engine.query import HashingQueryEncoder
        >>> arr = ARR(query_encoder=HashingQueryEncoder())
        >>> imgs, qs = [torch.rand(3, 560, 560), torch.rand(3, 280, 560)], ["What is the total?", "Who?"]
        >>> both = allocate_images(arr, imgs, qs, "100")
        >>> [a.pages[0].plan.cells.tolist() == allocate(arr, i, q, "100").pages[0].plan.cells.tolist()
        ...  for a, i, q in zip(both, imgs, qs)]
        [True, True]
    """
    questions = check_queries(questions, len(images), arr.max_question_tokens)  # as they are, if checked already
    budget = Budget.saccades(arr.config.sampler.saccades) if budget is None else Budget.parse(budget)
    arr.check_weights()
    check_ranking_weights(image_retrieval_weight=image_retrieval_weight, bm25_weight=bm25_weight)
    t: dict[str, float] = {}
    start = time.perf_counter()
    checked = [check_context(arr.config, image, budget, max_pages=1) for image in images]
    t["load"] = (time.perf_counter() - start) * 1e3
    out = []
    with torch.no_grad():  # a ranking, not a training step
        scene, reads = read_chunk(arr, [d for opened, _, _ in checked for d in opened.draw([0])], None, False, t)
        splits = [split if split is not None else plan_budget(arr.config, budget, grids)
                  for _, grids, split in checked]  # an image has no text: a compression is refused here
        scores = _score(arr, scene, questions, [s[0][0] for s in splits], t, coupled)
        # each image's gestalt where its text stays legible and its placing: its lines as the text channels read
        # them (the scorer above read the square rule's gestalt, as allocate's does)
        channel_lines = text_lines(arr, scene)
        splits = [plan_budget(arr.config, budget, grids, None, None if ls is None else median_height(ls))
                  for (_, grids, _), ls in zip(checked, channel_lines)]
        del scene
        weights = image_weights(image_retrieval_weight)
        for (opened, grids, _), (gestalts, k), read, score, q, ls in zip(checked, splits, reads, scores, questions,
                                                                        channel_lines):
            read = replace(read, lines=placed_lines(legible_lines(ls)))
            values = (retrieval_parts(arr, None, [read], q, t, bm25_weight, refine=None) if image_retrieval_weight
                      else None)  # one image: every passage of its lines
            pages = _pages(arr, [read], [score], grids, gestalts, k, q, weights, t, values)
            out.append(ContextAllocation(q, pages, opened.source, dict(opened.meta), None, tokenizer_name(tokenizer),
                                         t, budget))
    return out


def _pages(arr: ARR, reads: Sequence[PageRead], scores: Sequence[tuple[Tensor, Tensor, Tensor | None, Tensor]],
           grids: Sequence[tuple[int, int]], gestalts: Sequence[tuple[int, int]], k: int, question: str,
           weights: dict[str, float], t: dict[str, float], values: Sequence[Tensor] | None = None,
           placing: Sequence[dict[str, float] | None] | None = None) -> list[PageAllocation]:
    """The ranking decides each page's share k_i; each page's sampler places it (``values``: the lines' retrieval
    values, :func:`retrieval_parts`; ``placing``: per page, the weights of its placing map where they are not the
    ranking's, None where they are)."""
    cell = arr.config.canvas.cell
    start = time.perf_counter()
    parts = text_parts(cell, [(h * cell, w * cell) for h, w in grids], [s[0] for s in scores],
                       [r.words for r in reads], [r.lines for r in reads], question, retrieved=values)
    t["text_layer"] = (time.perf_counter() - start) * 1e3
    start = time.perf_counter()
    ranks = [ranking_score(p, **weights) for p in parts]
    shares = [len(c) for c in rank_cells(ranks, k)]
    out = []
    placing = placing or [None] * len(reads)
    for read, (rel, valid, w, q), part, rank, gestalt, k_i, own in zip(reads, scores, parts, ranks, gestalts, shares,
                                                                      placing):
        placed = placing_map(rel, part, **(weights if own is None else own))
        cells, scores = _place(arr, placed, k_i, valid, q)
        plan = Plan("arr", "cells", tuple(rel.shape), gestalt=tuple(gestalt), cells=cells, scores=scores)
        out.append(PageAllocation(read.page.index, read.image, plan, cell, rank, placed, read.words, read.source,
                                  read.image_size, None if w is None else tuple(float(v) for v in w.tolist())))
    t["selection"] = (time.perf_counter() - start) * 1e3
    return out


def rank_parts(arr: ARR, seen: ContextScene, question: str, k: int = 0, t: dict[str, float] | None = None,
               relevance: Sequence[Tensor] | None = None) -> list[RankParts]:
    """Every page's :class:`~arr_coc.contexts.ranking.RankParts` for a question.

    Args:
        arr, seen: the ARR and the context's pages (:func:`~arr_coc.contexts.see_context`).
        question: the question.
        k: unused (the scorer's gestalt vector does not depend on K).
        t: stage times (ms) are added here.
        relevance: each page's relevance when already known (the text parts of another wording of a
            question); otherwise every page is scored (its text-layer pages ranked on what ``seen`` was seen
            for: their ink by default).
    """
    t = {} if t is None else t
    rels = list(relevance) if relevance is not None else [
        s[0] for scene, rs in seen.chunks()
        for s in _score(arr, scene, question, None, t, reads=rs, layer_relevance=seen.layer_relevance)]
    cell = arr.config.canvas.cell
    grids = [g for scene in seen.scenes for g in scene.extents]
    values = retrieval_parts(arr, seen, seen.reads, question, t)
    start = time.perf_counter()
    parts = text_parts(cell, [(h * cell, w * cell) for h, w in grids], rels, seen.words, seen.lines, question,
                       retrieved=values)
    t["text_layer"] = (time.perf_counter() - start) * 1e3
    return parts
