"""A context's lines' retrieval values beyond the retriever's ramp: a reranker's order, neighbours, a title block.

:func:`line_values` makes each page's lines' values for :func:`~arr_coc.contexts.ranking.text_parts` (``values=``)
from their retrieval scores: the ramp over the context's best lines
(:func:`~arr_coc.contexts.ranking.retrieval_values`), the best few reordered by a cross-encoder
(:func:`reranked_values`), each value passed on to the next line (:func:`spread_values`), a floor on a
document's first page's first lines (:func:`front_values`) and one on the lines that hold a span of the type the
question asks for (:func:`typed_values`, :mod:`arr_coc.contexts.answer_types`); the lines holding a token of the shape
it names (a command, a file, a length) raised before the ramp (:func:`shaped_scores`).
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import Tensor

from arr_coc.contexts.ranking import RETRIEVAL_TOP, retrieval_values

# Chosen on the 199 validation questions of texlive-paraphrase (docs/coc.md, "The coupling";
# benchmarks/paraphrase_tune.py, each page's relevance set to zero): a line's value passed on at half to the next
# line (the answer sits below the line that names it) and a floor of 0.5 on the first 10 lines of a document's first
# page (its title block: title, authors, version, date) took coverage from 0.705 to 0.750 at 10x and from 0.638 to
# 0.663 at 20x. The cross-encoder reordering the 32 best lines (RERANK_TOP) gained 2 points at 10x and lost 2 at 20x
# for ~1-2 s a question on 2 cores: off (0), kept for a caller who sets it.
RERANK_TOP = 0
RERANK_BOOST = 0.0  # the cross-encoder's own ramp added to the values it reorders
RERANK_KEEP = 0.0  # the first stage's standardised score beside the cross-encoder's in its order (0: its logits alone)
PAGE_PRIOR = 0.0  # each line's score plus this times its page's best line's score, before the ramp
SPREAD = 0.5
SPREAD_AROUND = False  # the line before a line gets its value too
FRONT_LINES = 10
FRONT_FLOOR = 0.5
# Lines holding a span of the type the question asks for (a date, a version, a person's name:
# :mod:`arr_coc.contexts.answer_types`) get at least this value; chosen on the 199 validation questions (docs/coc.md,
# "Answer types"): 0.750 -> 0.769 coverage at 10x, 0.672 -> 0.720 at 20x with a floor of 1 (the best retrieved line's
# value); above it, with the answer shapes and coarse to fine, 0.879 -> 0.894 at 10x and 0.803 -> 0.822 at 20x at 1.5
# (a typed line before the lines that only share the question's words; 1.5 is the first floor no larger one beats).
# One image's lines read the same at 1 and 1.5 on its 121 validation questions (0.842; 2: 0.840).
TYPED_FLOOR = 1.5
# Added to the first-stage score of the lines holding a token of the shape the question names (a command, a file, a
# length: :data:`arr_coc.contexts.answer_types.SHAPES`) before the ramp; chosen on the 199 validation questions
# (docs/coc.md, "Answer shapes"): coverage 0.859 -> 0.880 at 10x, 0.761 -> 0.795 at 20x (0.12 and above alike).
SHAPE_BOOST = 0.12


def top_lines(scores: Sequence[Tensor], n: int) -> list[tuple[int, int]]:
    """The context's ``n`` best lines by ``scores`` (each page's [L_i]), best first, as (page, line); ties to the
    earlier page, then line.

    >>> top_lines([torch.tensor([0.9, 0.1]), torch.tensor([0.5, 0.7])], 3)
    [(0, 0), (1, 1), (1, 0)]
    """
    flat = torch.cat([s.reshape(-1).float() for s in scores]) if scores else torch.zeros(0)
    pages = torch.cat([torch.full((len(s),), i) for i, s in enumerate(scores)]) if scores else torch.zeros(0)
    lines = torch.cat([torch.arange(len(s)) for s in scores]) if scores else torch.zeros(0)
    order = torch.sort(flat, descending=True, stable=True).indices[:n]
    return [(int(pages[i]), int(lines[i])) for i in order]


def standardised(x: Tensor) -> Tensor:
    """``x`` minus its mean over its standard deviation (0 where it has fewer than 2 values or no spread).

    >>> standardised(torch.tensor([1.0, 2.0, 3.0])).tolist()
    [-1.0, 0.0, 1.0]
    """
    x = x.float()
    if x.numel() < 2:
        return torch.zeros_like(x)
    sd = x.std()
    return (x - x.mean()) / sd if sd > 0 else torch.zeros_like(x)


def rerank_order(logits: Tensor, first: Tensor, keep: float) -> Tensor:
    """The key the reranked lines are ordered by: the reranker's ``logits`` [n], standardised, plus ``keep`` times the
    first stage's scores of the same lines, standardised (0: the logits alone, unchanged). Both scales are the
    lines' own, so a cosine and a logit weigh alike.

    >>> rerank_order(torch.tensor([0.0, 1.0]), torch.tensor([0.9, 0.1]), 0.0).tolist()
    [0.0, 1.0]
    >>> rerank_order(torch.tensor([0.0, 1.0]), torch.tensor([0.9, 0.1]), 2.0).argmax().item()  # the first stage leads
    0
    """
    if not keep:
        return logits.float()
    return standardised(logits) + keep * standardised(first)


def page_prior_scores(scores: Sequence[Tensor], weight: float) -> list[Tensor]:
    """Each line's score plus ``weight`` times the best score on its page: a line on a page whose best line meets the
    question ranks above an equal line on a page that does not (0: unchanged).

    >>> [v.tolist() for v in page_prior_scores([torch.tensor([0.5, 0.25]), torch.tensor([0.375])], 1.0)]
    [[1.0, 0.75], [0.75]]
    """
    if not weight:
        return [s.float() for s in scores]
    return [s.float() + weight * s.float().max() if len(s) else s.float() for s in scores]


def reranked_values(values: Sequence[Tensor], picked: Sequence[tuple[int, int]], logits: Tensor,
                    boost: float = 1.0) -> list[Tensor]:
    """The retrieval values with the lines ``picked`` (the first stage's best, as (page, line)) reordered by a
    reranker's ``logits`` [n]: the n values those lines hold, best first, go to them in the reranker's order, and
    ``boost`` adds the reranker's own ramp (1 for its best, down to 1/n), the sum scaled back to [0, 1]. The other
    lines keep their values: the first stage chooses where to look, the reranker which of those lines answers.

    >>> v = [torch.tensor([1.0, 0.5]), torch.tensor([0.75])]
    >>> [x.tolist() for x in reranked_values(v, [(0, 0), (1, 0), (0, 1)], torch.tensor([0.0, 1.0, 2.0]), 0.0)]
    [[0.5, 1.0], [0.75]]
    """
    out = [v.clone().float() for v in values]
    if not picked:
        return out
    held = torch.sort(torch.stack([out[p][i] for p, i in picked]), descending=True).values
    order = torch.sort(logits.float(), descending=True, stable=True).indices.tolist()
    n = len(picked)
    for rank, j in enumerate(order):
        p, i = picked[j]
        out[p][i] = (held[rank] + boost * (n - rank) / n) / (1.0 + boost)
    if boost:
        kept = set(picked)
        for p, v in enumerate(out):
            for i in range(len(v)):
                if (p, i) not in kept:
                    v[i] = v[i] / (1.0 + boost)
    return out


def spread_values(values: Sequence[Tensor], share: float, around: bool = False) -> list[Tensor]:
    """Each line's retrieval value passed on, times ``share``, to the next line of its page (``around``: and the
    line before): an answer sits beside the line that names it (an option and the sentence below it). A line keeps
    the larger of its own value and what it is given.

    >>> [v.tolist() for v in spread_values([torch.tensor([1.0, 0.0, 0.0])], 0.5)]
    [[1.0, 0.5, 0.0]]
    """
    if not share:
        return [v.float() for v in values]
    out = []
    for v in values:
        v = v.float()
        got = v.clone()
        if len(v) > 1:
            got[1:] = torch.maximum(got[1:], share * v[:-1])
            if around:
                got[:-1] = torch.maximum(got[:-1], share * v[1:])
        out.append(got)
    return out


def front_values(values: Sequence[Tensor], first: Sequence[bool], lines: int, floor: float) -> list[Tensor]:
    """A floor on the retrieval value of the first ``lines`` lines of each page flagged in ``first`` (a document's
    first page: its title block names the title, authors, version and date, which a question asks in other words).

    >>> [v.tolist() for v in front_values([torch.tensor([0.0, 0.75, 0.0]), torch.tensor([0.0])], [True, False], 2, 0.5)]
    [[0.5, 0.75, 0.0], [0.0]]
    """
    out = []
    for v, f in zip(values, first):
        v = v.float().clone()
        if f and floor and lines:
            v[:lines] = v[:lines].clamp_min(floor)
        out.append(v)
    return out


def typed_values(values: Sequence[Tensor], typed: Sequence[Tensor] | None, floor: float) -> list[Tensor]:
    """A floor on the values of the lines flagged in ``typed`` (each page's [L_i] bool: the line holds a span of the
    type the question asks for, :func:`~arr_coc.contexts.answer_types.typed_lines`); None or a floor of 0: unchanged.

    >>> [v.tolist() for v in typed_values([torch.tensor([0.25, 0.0]), torch.tensor([0.5])],
    ...                                   [torch.tensor([False, True]), torch.tensor([True])], 0.75)]
    [[0.25, 0.75], [0.75]]
    """
    if typed is None or not floor:
        return [v.float() for v in values]
    if len(typed) != len(values) or any(t.shape != v.shape for t, v in zip(typed, values)):
        raise ValueError(f"typed lines {[tuple(t.shape) for t in typed]} do not match the pages' lines "
                         f"{[tuple(v.shape) for v in values]}")
    return [torch.where(t, v.float().clamp_min(floor), v.float()) for v, t in zip(values, typed)]


def shaped_scores(scores: Sequence[Tensor], shaped: Sequence[Tensor] | None, boost: float) -> list[Tensor]:
    """Each line's score plus ``boost`` where ``shaped`` flags it (each page's [L_i] bool: the line holds a token of
    the shape the question names, :func:`~arr_coc.contexts.answer_types.shaped_lines`); None or 0: unchanged.

    >>> [v.tolist() for v in shaped_scores([torch.tensor([0.5, 0.25])], [torch.tensor([False, True])], 0.5)]
    [[0.5, 0.75]]
    """
    if shaped is None or not boost:
        return [s.float() for s in scores]
    if len(shaped) != len(scores) or any(m.shape != s.shape for m, s in zip(shaped, scores)):
        raise ValueError(f"shaped lines {[tuple(m.shape) for m in shaped]} do not match the pages' lines "
                         f"{[tuple(s.shape) for s in scores]}")
    return [s.float() + boost * m.float() for s, m in zip(scores, shaped)]


def line_values(scores: Sequence[Tensor], first: Sequence[bool], rerank: Callable[[list[tuple[int, int]]], Tensor] | None
                = None, top: int = RETRIEVAL_TOP, rerank_top: int = RERANK_TOP, boost: float = RERANK_BOOST,
                spread: float = SPREAD, around: bool = SPREAD_AROUND, front_lines: int = FRONT_LINES,
                front_floor: float = FRONT_FLOOR, typed: Sequence[Tensor] | None = None,
                typed_floor: float = TYPED_FLOOR, keep: float = RERANK_KEEP,
                page_prior: float = PAGE_PRIOR, shaped: Sequence[Tensor] | None = None,
                shape_boost: float = SHAPE_BOOST) -> list[Tensor]:
    """Each page's lines' retrieval values from their scores (:func:`line_scores`): the ramp over the context's
    ``top`` best (:func:`retrieval_values`; each score first raised by ``shape_boost`` where ``shaped`` flags its line,
    :func:`shaped_scores`, and by ``page_prior`` times its page's best, :func:`page_prior_scores`), the best
    ``rerank_top`` reordered by ``rerank`` (given those lines as (page, line), it returns their logits [n]; None: no
    reranker, as a model-free ARR) (:func:`reranked_values`; ``keep``: by its logits and the first stage's scores
    together, :func:`rerank_order`), passed on to the next line
    (:func:`spread_values`) and floored on a document's first page (``first``: each page is one) (:func:`front_values`)
    and on the lines ``typed`` flags (each page's [L_i] bool: they hold a span of the type the question asks for;
    None: no line) (:func:`typed_values`).

    >>> [v.tolist() for v in line_values([torch.tensor([0.9, 0.1, 0.5])], [False], top=1)]  # the next line: half
    [[1.0, 0.5, 0.0]]
    >>> [v.tolist() for v in line_values([torch.tensor([0.9, 0.1, 0.5])], [False], top=1,
    ...                                  typed=[torch.tensor([False, False, True])])]  # a typed line: 1.5
    [[1.0, 0.5, 1.5]]
    """
    scores = page_prior_scores(shaped_scores(scores, shaped, shape_boost), page_prior)
    values = retrieval_values(scores, top)
    if rerank is not None and rerank_top > 0:
        picked = top_lines(scores, rerank_top)
        if picked:
            first_stage = torch.stack([scores[p][i] for p, i in picked])
            values = reranked_values(values, picked, rerank_order(rerank(picked), first_stage, keep), boost)
    return typed_values(front_values(spread_values(values, spread, around), first, front_lines, front_floor), typed,
                        typed_floor)
