"""The ranking of cells over a context's pages: its parts per page, their weighted sum, the global top K.

A cell's ranking score (:func:`ranking_score`) is the sum of four parts (:class:`RankParts`), each in [0, 1]:

- ``relevance``: the page's ARR relevance scaled to [0, 1] over its cells (the scorer standardises its
  parts per image, so its raw scale differs by page; a z-score let a 15-cell page's outlier beat a
  matched page); a page with a text layer: the share of each cell its words cover (:func:`ink_map`, no pixel
  read: ``LAYER_RELEVANCE``);
- ``text``: the cell's text-layer match (:mod:`arr_coc.engine.channels.text_layer`: the matching words' area
  in the cell, IDF-weighted, phrases first, one maximum over the context);
- ``page``: the page's best matching word over the context's best (the detail goes to the pages the
  question names);
- ``near``: where the answer to a matched phrase sits (:func:`near_map`): the rest of the matched line
  right of the phrase and the line below it, weighted by the line's match. The question names the
  words *around* its answer ("the title of section 3.2", 'what comes after "..."', "the total"), not
  the answer: the key_value channel's geometry (:func:`arr_coc.engine.channels.text.value_regions`) placed
  on the text layer's lines.

The weights (``TEXT_WEIGHT``, ``PAGE_WEIGHT``, ``NEAR_WEIGHT``) were chosen on validation documents
(docs/coc.md, "Questions over a long context"). :func:`text_parts` computes every page's parts,
:func:`rank_cells` takes the top K over all pages and :func:`placing_map` gives each page's sampler the
ranking in the page's own relevance units.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

from arr_coc.contexts.answer_types import Box, shaped_words
from arr_coc.engine.channels.text import value_regions
from arr_coc.engine.channels.text_layer import match_cells, question_terms, quoted_terms, term, word_values
from arr_coc.engine.imageops import paint_cells

Line = tuple[str, Box]  # (text, (y0, x0, y1, x1) px)

# A cell on a matched word of the question outranks the page's most relevant unmatched cells (relevance is
# in [0, 1]); a page holding the question's words outranks pages without; the place of the best match's
# answer ranks with the words that name it (near = text). On the validation grid (docs/coc.md) every near
# weight from 1 to 8 covered every answer and 0 did not; the text and page weights (set by hand before)
# made no difference there, so they are kept.
TEXT_WEIGHT = 4.0
PAGE_WEIGHT = 2.0
NEAR_WEIGHT = 4.0
# The question's best lines by the retrieval model (a paraphrase finds its line where no word matches): the
# RETRIEVAL_TOP best lines of the context, ramped from 1 (the best) to 0, weighted like a matched word.
RETRIEVAL_WEIGHT = 8.0
# 64 until the gestalt rule over many pages (budget.LEGIBLE_SIDE) freed saccades for more lines; 192 chosen then on the
# 199 validation questions (docs/coc.md, "The gestalt over many pages"): 10x 0.814 -> 0.846, 20x 0.734 -> 0.748.
RETRIEVAL_TOP = 192
PASSAGE_AROUND = 1  # lines before and after a line that the retrieval model reads with it
# BM25 over the context's lines fused into the retrieval model's line scores (:func:`fuse_bm25`: cosine + BM25_WEIGHT x
# BM25 / the context's best BM25). Off: chosen on validation questions (0.05 with the retrieval weight 12: 0.859 ->
# 0.871 at 10x, 0.761 -> 0.787 at 20x), it read the 182 hand-written test questions no better at 10x (+0.001) and
# worse at 20x (-0.021 [-0.041, -0.005], names losing the lines that say what they are) (docs/coc.md, "BM25 in the lines").
BM25_WEIGHT = 0.0
# A line's value on its first LINE_HEAD cells and LINE_TAIL times it on the rest (the start of a line is where a manual
# names its command or option). 0 = the whole line at its value: the head study on validation (docs/coc.md, "Line
# heads") left it off.
LINE_HEAD = 0
LINE_TAIL = 1.0
# Where the question names its answer's shape (a command, a file, a length: :data:`~arr_coc.contexts.answer_types.
# SHAPES`), a line holding words of that shape gets its value on those words alone and TOKEN_REST times it on the rest
# of the line, so the K best cells reach the commands of many lines before the prose of a few. Chosen on the 199
# validation questions (docs/coc.md, "Answer shapes"): the whole line (1) 0.894 / 0.822 coverage at 10x / 20x, 0.5
# 0.919 / 0.835, 0.25 0.922 / 0.841, the words alone (0) 0.922 / 0.858.
TOKEN_REST = 0.0
# What a page with a text layer (a PDF's, a text file's set words) is ranked and placed on under the question's parts:
# "ink", the share of each cell its words cover (:func:`ink_map`; its texture, question-coupled channels and scorer
# are not computed), or "arr", the ARR's relevance, as a page without text gets. On the 199 validation questions of
# texlive-paraphrase (the text parts at their defaults) the ink covered the answer as the ARR's relevance did at 10x
# (0.856 against 0.854, paired +0.002 [-0.012, +0.015]) and more at 20x (0.760 against 0.747, +0.013 [+0.002,
# +0.025]); the 65 generated ones 1.000 under both; a 20-page PDF is seen in 5.5 s instead of 14.9 (docs/coc.md,
# "A text layer's ink").
LAYER_RELEVANCE = "ink"
LAYER_RELEVANCES = ("ink", "arr")


@dataclass(frozen=True)
class RankParts:
    """One page's ranking parts for one question (each ``[hc, wc]`` over its cells, ``page`` a number).

    Attributes:
        relevance: the ARR's relevance (a text-layer page: its ink) scaled to [0, 1] over the page's cells.
        text: the text-layer match of each cell, in [0, 1] over the context.
        near: where a matched line's answer sits (:func:`near_map`), in [0, 1].
        page: the page's best matching word over the context's best, in [0, 1].
        retrieval: the lines the retrieval model ranks first for the question (:func:`retrieval_values`), painted
            with their values, in [0, 1]; None without a retriever.
    """

    relevance: Tensor
    text: Tensor
    near: Tensor
    page: float
    retrieval: Tensor | None = None


def ranking_score(parts: RankParts, text_weight: float = TEXT_WEIGHT, page_weight: float = PAGE_WEIGHT,
                  near_weight: float = NEAR_WEIGHT, retrieval_weight: float = RETRIEVAL_WEIGHT) -> Tensor:
    """``[hc, wc]`` a page's cell scores: relevance + the weighted text, page, near and retrieval parts.

    >>> p = RankParts(torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0]]), torch.tensor([[0.5, 0.0]]), 1.0)
    >>> ranking_score(p, 4.0, 2.0, 2.0).tolist()
    [[4.0, 6.0]]
    """
    out = parts.relevance + text_weight * parts.text + page_weight * parts.page + near_weight * parts.near
    if parts.retrieval is not None and retrieval_weight:
        out = out + retrieval_weight * parts.retrieval.to(out)
    return out


def _extra(parts: RankParts, text_weight: float, page_weight: float, near_weight: float,
           retrieval_weight: float) -> Tensor:
    """The weighted text, page, near and retrieval parts of a page's cells."""
    extra = text_weight * parts.text + page_weight * parts.page + near_weight * parts.near
    if parts.retrieval is not None and retrieval_weight:
        extra = extra + retrieval_weight * parts.retrieval.to(extra)
    return extra


def ink_map(words: Sequence[Line], size: tuple[int, int], cell: int) -> Tensor:
    """``[hc, wc]`` the share of each cell of a page of ``size`` (H, W) px that its words' boxes cover (0 without
    words): each box's area in each cell (its row overlap times its column overlap), summed over the boxes and
    clipped at 1 (words' boxes do not overlap but for a kerned edge). Question-free; under 1 ms a page.

    >>> ink_map([("a", (0.0, 0.0, 2.0, 3.0))], (4, 4), 2).tolist()
    [[1.0, 0.5], [0.0, 0.0]]
    """
    hc, wc = size[0] // cell, size[1] // cell
    if not words:
        return torch.zeros(hc, wc)
    b = torch.tensor([box for _, box in words], dtype=torch.float32)  # [N, 4] (y0, x0, y1, x1)

    def overlap(lo: Tensor, hi: Tensor, n: int) -> Tensor:  # [N, n] each box's share of each cell's side
        edges = torch.arange(n + 1, dtype=torch.float32) * cell
        return (torch.minimum(hi[:, None], edges[1:]) - torch.maximum(lo[:, None], edges[:-1])).clamp_min(0) / cell

    return (overlap(b[:, 0], b[:, 2], hc).T @ overlap(b[:, 1], b[:, 3], wc)).clamp_max(1.0)


def check_layer_relevance(layer_relevance: str) -> str:
    """``layer_relevance`` if it names one of :data:`LAYER_RELEVANCES`, else a one-line ValueError."""
    if layer_relevance not in LAYER_RELEVANCES:
        raise ValueError(f"layer_relevance must be one of {', '.join(map(repr, LAYER_RELEVANCES))} (what a page with "
                         f"a text layer is ranked on), got {layer_relevance!r}")
    return layer_relevance


def unit(rel: Tensor) -> Tensor:
    """A page's relevance scaled to [0, 1] over its cells (its best cell 1): the scorer's scale varies by page."""
    lo, hi = rel.min(), rel.max()
    return (rel - lo) / (hi - lo) if float(hi - lo) > 0 else torch.zeros_like(rel)


def idf(pages_words: Sequence[Sequence[Line]], question: str) -> dict[str, float]:
    """Each question term's weight (a quote's stop words too): log(1 + pages / pages holding it); 0 where none does."""
    n = len(pages_words)
    have = [{term(w) for w, _ in ws} for ws in pages_words]
    terms = set(question_terms(question)).union(*quoted_terms(question))
    return {t: (math.log(1 + n / df) if (df := sum(t in h for h in have)) else 0.0) for t in terms}


def near_map(words: Sequence[Line], lines: Sequence[Line], values: Sequence[float], size: tuple[int, int],
             cell: int) -> Tensor:
    """``[hc, wc]`` where the answer to each matched line sits: the rest of its line, and the line below.

    Each line holding matched words (``values[i] > 0`` for word i, a word belonging to the line its
    centre lies in) is a key of weight = its best word's value. It is cut after its best word, as
    :func:`~arr_coc.engine.channels.text.split_key_value` cuts "Key: value", and
    :func:`~arr_coc.engine.channels.text.value_regions` lifts the value lines: the rest of the row (a section
    number's title) at the key's weight, the nearest line below (the words that follow a quoted line
    end) at ``BELOW_WEIGHT`` of it. The empty stretches that channel paints for faint values OCR missed
    are left out: a text layer knows every word. A cell gets the best value of any lifted line
    touching it (max over the cell): the answer needs every cell it touches, not the cells it fills.
    """
    hc, wc = size[0] // cell, size[1] // cell
    if not lines or not any(v > 0 for v in values):
        return torch.zeros(hc, wc)
    lb = torch.tensor([b for _, b in lines], dtype=torch.float32).reshape(-1, 4)  # [L, 4]
    wb = torch.tensor([b for _, b in words], dtype=torch.float32).reshape(-1, 4)  # [N, 4]
    v = torch.tensor(list(values), dtype=torch.float32)
    cy, cx = (wb[:, 0] + wb[:, 2]) / 2, (wb[:, 1] + wb[:, 3]) / 2
    inside = (cy[:, None] >= lb[None, :, 0]) & (cy[:, None] <= lb[None, :, 2]) \
        & (cx[:, None] >= lb[None, :, 1]) & (cx[:, None] <= lb[None, :, 3])  # [N, L]
    line_of = torch.where(inside.any(1), inside.float().argmax(1), torch.full_like(v, -1, dtype=torch.long))
    keys, weights, rest = lb.clone(), torch.zeros(len(lines)), []
    for i in torch.unique(line_of[(v > 0) & (line_of >= 0)]).tolist():
        mine = (line_of == i).nonzero().flatten()
        best = float(v[mine].max())
        cut = float(wb[mine[v[mine] == best], 3].max())  # the end of the line's best (rightmost) word
        weights[i] = best
        keys[i, 3] = cut
        if lb[i, 3] - cut > 0:
            rest.append([float(lb[i, 0]), cut, float(lb[i, 2]), float(lb[i, 3])])
    boxes = torch.cat([keys, torch.tensor(rest, dtype=torch.float32).reshape(-1, 4)])
    regions, vals = value_regions(boxes, torch.cat([weights, torch.zeros(len(rest))]))
    m = len(boxes)
    return paint_cells(regions[2 * m:], vals[2 * m:], tuple(size), cell, "max")  # the lifted lines, not the gaps


def passage_texts(lines: Sequence[Line], around: int = PASSAGE_AROUND) -> list[str]:
    """What the retrieval model reads for each line of a page: the line with ``around`` lines before and after it
    (an option's name and the sentence that says what it does are often on neighbouring lines).

    >>> passage_texts([("a", (0, 0, 1, 1)), ("b", (1, 0, 2, 1)), ("c", (2, 0, 3, 1))])
    ['a b', 'a b c', 'b c']
    """
    texts = [text for text, _ in lines]
    return [" ".join(texts[max(0, i - around): i + around + 1]) for i in range(len(texts))]


def line_scores(embeddings: Sequence[Tensor | None], query: Tensor) -> list[Tensor]:
    """Each page's lines' cosine with the question (``embeddings[i]``: page i's lines [L_i, D], L2-normalised, or None
    for a page without lines; ``query``: [D], L2-normalised)."""
    return [e.float() @ query.float() if e is not None and len(e) else torch.zeros(0) for e in embeddings]


def bm25_line_scores(lines: Sequence[Sequence[str]], question: str) -> list[Tensor]:
    """Each page's lines' BM25 score for the question (``lines[i]``: page i's lines' texts): bm25s with English stop
    words, every line of the context a document, the question's words the context has as the query (none: zeros).

    >>> [s.gt(0).tolist() for s in bm25_line_scores([["the page layout", "a margin"], ["page numbers"]], "page?")]
    [[True, False], [True]]
    """
    import bm25s  # ~0.3 s to import: once a process, at its first question

    texts = [t for page in lines for t in page]
    counts = [len(page) for page in lines]
    scores = torch.zeros(len(texts))
    if texts:
        index = bm25s.BM25()
        index.index(bm25s.tokenize(texts, stopwords="en", show_progress=False), show_progress=False)
        words = [w for w in bm25s.tokenize(question, stopwords="en", return_ids=False, show_progress=False)[0]
                 if w in index.vocab_dict]
        if words:
            scores = torch.as_tensor(index.get_scores(words), dtype=torch.float32)
    return list(torch.split(scores, counts))


def fuse_bm25(scores: Sequence[Tensor], bm25: Sequence[Tensor], weight: float = BM25_WEIGHT) -> list[Tensor]:
    """Each page's lines' retrieval score plus ``weight`` x its BM25 over the context's best BM25 (no BM25 anywhere,
    or weight 0: the scores as they are).

    >>> [s.tolist() for s in fuse_bm25([torch.tensor([0.5, 0.25])], [torch.tensor([2.0, 0.0])], 0.5)]
    [[1.0, 0.25]]
    """
    top = max((float(b.max()) for b in bm25 if len(b)), default=0.0)
    if not weight or top <= 0:
        return list(scores)
    return [s + weight * b / top for s, b in zip(scores, bm25)]


def retrieval_values(scores: Sequence[Tensor], top: int = RETRIEVAL_TOP) -> list[Tensor]:
    """Each line's retrieval value: the context's ``top`` best lines ramped from 1 (the best) down towards 0 (the
    score of the line ranked ``top + 1``), every other line 0. A ramp over ranks, not the raw cosine: a retrieval
    model's cosines sit in a narrow, model-dependent band, and only their order says which line answers.

    >>> [v.tolist() for v in retrieval_values([torch.tensor([0.9, 0.1]), torch.tensor([0.5, 0.7])], top=2)]
    [[1.0, 0.0], [0.0, 0.5]]
    """
    flat = torch.cat([s.reshape(-1).float() for s in scores]) if scores else torch.zeros(0)
    if flat.numel() == 0:
        return [s.float() for s in scores]
    ordered = torch.sort(flat, descending=True).values
    hi, lo = ordered[0], ordered[min(top, len(ordered) - 1)]
    if float(hi - lo) <= 0:
        return [(s >= hi).float() for s in scores]
    return [((s.float() - lo) / (hi - lo)).clamp_min(0) for s in scores]


def _painted(boxes: Tensor, values: Tensor, hc: int, wc: int, cell: int) -> tuple[Tensor, Tensor, Tensor]:
    """The cell rows [B, hc] and columns [B, wc] each of ``boxes`` [B, 4] touches, and the map [hc, wc] of the best of
    ``values`` [B] over the boxes touching each cell."""
    ys, xs = torch.arange(hc, dtype=torch.float32) * cell, torch.arange(wc, dtype=torch.float32) * cell
    rows = (ys[None] < boxes[:, 2:3]) & (ys[None] + cell > boxes[:, 0:1])  # [B, hc] the cell rows a box touches
    cols = (xs[None] < boxes[:, 3:4]) & (xs[None] + cell > boxes[:, 1:2])  # [B, wc]
    painted = values.float()[:, None, None] * (rows[:, :, None] & cols[:, None, :]).float()
    return rows, cols, painted.amax(0) if len(boxes) else torch.zeros(hc, wc)


def retrieval_map(lines: Sequence[Line], values: Tensor, size: tuple[int, int], cell: int, head: int = LINE_HEAD,
                  tail: float = LINE_TAIL, tokens: Sequence[Box] = (), rest: float = TOKEN_REST) -> Tensor:
    """``[hc, wc]`` a page's lines painted with their retrieval values on its cells: a cell gets the best value of
    the lines touching it (a line is read only if every cell it touches is sent). Computed on cells, not pixels.

    ``head`` > 0 paints a line's value on its first ``head`` cells from its left edge and ``tail`` times it on the
    rest (0 <= tail <= 1; 0: the line's head alone), so the K best cells cover the starts of many lines before the
    ends of a few; ``head`` = 0 paints the whole line at its value (``tail`` unused). ``tokens``: the boxes of the
    words holding the answer's shape (:func:`~arr_coc.contexts.answer_types.shaped_words`); a line holding one (its
    centre inside the line's box) gets its value on them and ``rest`` times it on itself (0 <= rest <= 1).

    >>> lines = [("a", (0.0, 0.0, 10.0, 30.0)), ("b", (20.0, 0.0, 30.0, 10.0))]
    >>> retrieval_map(lines, torch.tensor([1.0, 0.5]), (42, 42), 14).tolist()
    [[1.0, 1.0, 1.0], [0.5, 0.0, 0.0], [0.5, 0.0, 0.0]]
    >>> retrieval_map(lines, torch.tensor([1.0, 0.5]), (42, 42), 14, head=2, tail=0.25).tolist()
    [[1.0, 1.0, 0.25], [0.5, 0.0, 0.0], [0.5, 0.0, 0.0]]
    >>> retrieval_map(lines, torch.tensor([1.0, 0.5]), (42, 42), 14, tokens=[(0.0, 16.0, 10.0, 26.0)]).tolist()
    [[0.0, 1.0, 0.0], [0.5, 0.0, 0.0], [0.5, 0.0, 0.0]]
    """
    if head < 0 or not 0.0 <= tail <= 1.0 or not 0.0 <= rest <= 1.0:
        raise ValueError(f"retrieval_map: head must be >= 0 cells and 0 <= tail, rest <= 1, got head={head}, "
                         f"tail={tail}, rest={rest}")
    hc, wc = size[0] // cell, size[1] // cell
    keep = values > 0
    if not lines or not bool(keep.any()):
        return torch.zeros(hc, wc)
    boxes = torch.tensor([b for _, b in lines], dtype=torch.float32).reshape(-1, 4)[keep]
    kept = values[keep].float()
    words = torch.zeros(hc, wc)
    if len(tokens):
        tb = torch.tensor(list(tokens), dtype=torch.float32).reshape(-1, 4)
        cy, cx = (tb[:, 0] + tb[:, 2]) / 2, (tb[:, 1] + tb[:, 3]) / 2
        inside = ((boxes[:, 0:1] <= cy[None]) & (cy[None] <= boxes[:, 2:3])
                  & (boxes[:, 1:2] <= cx[None]) & (cx[None] <= boxes[:, 3:4]))  # [L, T] the words each line holds
        held = (inside.float() * kept[:, None]).amax(0)  # [T] a word's value: its line's (0: in no valued line)
        words = _painted(tb[held > 0], held[held > 0], hc, wc, cell)[2]
        kept = torch.where(inside.any(1), rest * kept, kept)
    rows, cols, whole = _painted(boxes, kept, hc, wc, cell)
    if not head:
        return torch.maximum(whole, words)
    first = cols.float().argmax(1, keepdim=True)  # [L, 1] the first cell column a line touches
    inside_head = torch.arange(wc)[None] < first + head  # [L, wc] the line's head
    along = torch.where(inside_head, 1.0, tail) * cols.float()  # [L, wc]
    painted = kept[:, None, None] * rows[:, :, None].float() * along[:, None, :]
    return torch.maximum(painted.amax(0), words)


def rank_cells(scores: Sequence[Tensor], k: int) -> list[Tensor]:
    """The K best cells over every page's score map [hc_i, wc_i], per page as [k_i, 2] (y, x) in rank order.

    Ties go to the earlier page, then the earlier cell (a stable sort), so the result is deterministic.

    >>> [c.tolist() for c in rank_cells([torch.tensor([[0.1, 0.9]]), torch.tensor([[0.5], [0.9]])], 3)]
    [[[0, 1]], [[1, 0], [0, 0]]]
    """
    flat = torch.cat([s.reshape(-1) for s in scores])
    order = torch.sort(flat, descending=True, stable=True).indices[:k]
    offsets = torch.tensor([0] + [s.numel() for s in scores]).cumsum(0)
    page_of = torch.searchsorted(offsets, order, right=True) - 1
    out = []
    for i, s in enumerate(scores):
        mine = order[page_of == i] - offsets[i]  # rank order kept
        out.append(torch.stack([mine // s.shape[1], mine % s.shape[1]], -1).long().reshape(-1, 2))
    return out


def text_parts(cell: int, sizes: Sequence[tuple[int, int]], rels: Sequence[Tensor], words: Sequence[list[Line]],
               lines: Sequence[list[Line]], question: str, scores: Sequence[Tensor] | None = None,
               top: int = RETRIEVAL_TOP, retrieved: Sequence[Tensor] | None = None, head: int = LINE_HEAD,
               tail: float = LINE_TAIL, rest: float = TOKEN_REST) -> list[RankParts]:
    """Every page's :class:`RankParts` from its relevance (any scale: scaled here by :func:`unit`), its words and
    lines and its canvas size; ``scores``: each page's lines' retrieval scores (:func:`line_scores`, ramped by
    :func:`retrieval_values` over the ``top`` best), or ``retrieved``: their retrieval values already made
    (:func:`arr_coc.contexts.line_values.line_values`); neither: no retrieval part. ``head``, ``tail``: how each
    line's value is painted on its cells (:func:`retrieval_map`); where the question names its answer's shape, a
    line's words of that shape (:func:`~arr_coc.contexts.answer_types.shaped_words`) take its value and the rest of
    it ``rest`` times it.

    The text part is the ``text_layer`` channel's map (the matching words painted with their values, over
    one context-wide maximum, clamped to [0, 1]) pooled to cells: computed from the words alone.
    """
    weights = idf(words, question)
    values = [word_values([w for w, _ in ws], question, weights) for ws in words]
    norm = max((max(v, default=0.0) for v in values), default=0.0)
    if retrieved is None:
        retrieved = retrieval_values(scores, top) if scores is not None else [None] * len(sizes)
    tokens = (shaped_words(question, words) if any(rv is not None for rv in retrieved) else None) or [()] * len(sizes)
    parts = []
    for size, raw, ws, ls, vs, rv, tk in zip(sizes, rels, words, lines, values, retrieved, tokens):
        rel = unit(raw)
        found = None if rv is None else retrieval_map(ls, rv, size, cell, head, tail, tk, rest)[: rel.shape[0],
                                                                                            : rel.shape[1]]
        if norm > 0:
            text = match_cells(ws, vs, size, cell, norm)  # [hc, wc]
            near = near_map(ws, ls, [v / norm for v in vs], size, cell)
        else:
            text = near = torch.zeros_like(rel)
        parts.append(RankParts(rel, text, near[: rel.shape[0], : rel.shape[1]],
                               max(vs, default=0.0) / norm if norm > 0 else 0.0, found))
    return parts


def placing_map(relevance: Tensor, parts: RankParts, text_weight: float = TEXT_WEIGHT, page_weight: float = PAGE_WEIGHT,
                near_weight: float = NEAR_WEIGHT, retrieval_weight: float = RETRIEVAL_WEIGHT) -> Tensor:
    """``[hc, wc]`` what a page's sampler places its saccades on: the ranking score in the page's own relevance
    units, ``relevance + (max - min) x (the text, page, near and retrieval parts)`` (``parts.relevance`` being
    ``unit(relevance)``, as :func:`text_parts` makes it).

    It orders the page's cells as :func:`ranking_score` does (that is ``unit(relevance)`` + the same parts); a
    relevance that spans [0, 1] (a text layer's ink: :func:`ink_map` scaled by :func:`unit`) gets the ranking score
    itself, to the last bit, so equal scores (common on ink) keep the ranking's order. A page without matched words
    gets its relevance itself, so one image alone is placed as the ARR places it.

    >>> p = RankParts(torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0]]), torch.tensor([[0.0, 0.0]]), 0.0)
    >>> placing_map(torch.tensor([[3.0, 1.0]]), p, 4.0).tolist(), placing_map(torch.tensor([[3.0, 1.0]]), p, 0.0).tolist()
    ([[3.0, 9.0]], [[3.0, 1.0]])
    """
    extra = _extra(parts, text_weight, page_weight, near_weight, retrieval_weight)
    if not bool(extra.ne(0).any()):
        return relevance
    lo, span = float(relevance.min()), float(relevance.max() - relevance.min())
    if lo == 0.0 and span == 1.0:
        return ranking_score(parts, text_weight, page_weight, near_weight, retrieval_weight).to(relevance)
    return relevance + (span if span > 0 else 1.0) * extra.to(relevance)
