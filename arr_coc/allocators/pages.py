"""The whole-context methods: what each sends of a context's pages at a total of T visual tokens (a plan per page).

These are entries of the one method registry (:data:`arr_coc.allocators.methods.METHODS`) beside the
per-image methods. Every one gets the same T over the context's pages, given a :class:`PagesInputs`
(the pages' cell grids, the question's per-page ranking scores, the context allocation's own plans, the
pages' BM25 order and their retrieval order):

- ``coc``: the context allocation itself (:func:`arr_coc.contexts.allocate` at T: a gestalt per
  page by the budget's rule, K saccades by one ranking over every page's cells): its plans as it made them;
- ``equal_split``: the same gestalts, K split equally over the pages, each page's best cells by the same scores;
- ``first_pages``: pages in reading order at full resolution while they fit, the rest of T downscaling the next;
- ``bm25_pages``: the same in BM25 order over the pages' text: text retrieval choosing the pages;
- ``retrieval_pages``: the same in the retriever's order (:mod:`arr_coc.engine.retrieval`: a page scores its best
  line's cosine with the question): dense retrieval choosing the pages;
- ``full`` and ``uniform_image`` (every page downscaled to T / pages tokens, what rendering at a lower dpi
  gives; the context tables call it ``uniform``) are the per-image methods' whole-context form
  (:mod:`arr_coc.allocators.methods`).

A page a method sends nothing of has no plan (it reads nothing).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch
from torch import Tensor

from arr_coc.budget import Budget
from arr_coc.engine.plan import Plan
from arr_coc.engine.selection import rank_cells

PagePlans = dict[int, Plan]


@dataclass
class PagesInputs:
    """What a whole-context method may look at for one question over a context's pages.

    ``scores``: per page the question's ranking score per cell [hc_i, wc_i] (the context allocation's
    ``PageAllocation.relevance``); ``allocated``: the context allocation's own plan per page at T (the ``coc``
    method sends it as made); ``order``: the pages in BM25 order of their text for the question;
    ``retrieval_order``: the pages in the retriever's order (best line's cosine with the question).
    """

    grids: Sequence[tuple[int, int]]
    scores: Sequence[Tensor] = ()
    allocated: Sequence[Plan] = ()
    order: Sequence[int] | None = None
    extra: dict = field(default_factory=dict)
    retrieval_order: Sequence[int] | None = None


def cells_plan(name: str, grid: tuple[int, int], gestalt: tuple[int, int], cells: Tensor) -> Plan:
    """A page's gestalt + saccades as a ``cells`` plan."""
    return Plan(name, "cells", tuple(grid), gestalt=gestalt, cells=cells.reshape(-1, 2))


def best_cells(score: Tensor, k: int) -> Tensor:
    """The ``k`` best cells of one page's score map [hc, wc] as [k, 2] (y, x), ties to the earlier cell.

    >>> best_cells(torch.tensor([[0.1, 0.9], [0.9, 0.0]]), 2).tolist()
    [[0, 1], [1, 0]]
    """
    flat = score.reshape(1, -1)
    idx = rank_cells(flat, torch.ones_like(flat, dtype=torch.bool))[0, :k]
    return torch.stack([idx // score.shape[1], idx % score.shape[1]], -1).long().reshape(-1, 2)


def whole_pages(name: str, order: Sequence[int], grids: Sequence[tuple[int, int]], total: int) -> PagePlans:
    """Pages in ``order`` at full resolution while they fit; the rest of ``total`` downscales the next page.

    >>> {i: (p.kind, p.native) for i, p in whole_pages("x", [1, 0], [(2, 2), (2, 3)], 8).items()}
    {1: ('full', None), 0: ('native', 2)}
    """
    plans, left = {}, total
    for i in order:
        full = grids[i][0] * grids[i][1]
        if full <= left:
            plans[i], left = Plan(name, "full", tuple(grids[i])), left - full
        elif left >= 1:
            plans[i], left = Plan(name, "native", tuple(grids[i]), native=left), 0
        if left == 0:
            break
    return plans


def equal_shares(total: int, n: int) -> list[int]:
    """``total`` split over ``n`` pages, the first ``total % n`` one more.

    >>> equal_shares(10, 4)
    [3, 3, 2, 2]
    """
    return [total // n + (i < total % n) for i in range(n)]


@dataclass(frozen=True)
class ContextMethod:
    """A whole-context method (the module docstring): ``rule`` is one of ``coc``, ``equal_split``, ``pages``."""

    rule: str
    needs: tuple[str, ...] = ()
    in_order: str = "reading"  # the ``pages`` rule: "reading" order, the pages' "bm25" or "retrieval" order
    uses_scorer: bool = True
    per_tokens: bool = True
    source: str = "none"
    readers: tuple[str, ...] = ("ocr",)
    scopes: tuple[str, ...] = ("context",)

    def plan(self, name: str, inputs: object, tokens: int) -> Plan | None:
        raise ValueError(f"method {name!r} sends a whole context (its pages), not one image")

    def pages(self, name: str, inputs: PagesInputs, total: int) -> PagePlans:
        grids, n = inputs.grids, len(inputs.grids)
        if self.rule == "coc":
            if len(inputs.allocated) != n:
                raise ValueError(f"method {name!r} sends the context allocation's plans, which were not passed in")
            return dict(enumerate(inputs.allocated))
        if self.rule == "equal_split":
            gestalts, k = Budget.parse(total).split(grids)
            return {i: cells_plan(name, grids[i], gestalts[i], best_cells(inputs.scores[i],
                                                                          min(share, inputs.scores[i].numel())))
                    for i, share in enumerate(equal_shares(k, n))}
        if self.in_order == "reading":
            return whole_pages(name, range(n), grids, total)
        order, how = {"bm25": (inputs.order, "BM25 order (BM25Pages.rank)"),
                      "retrieval": (inputs.retrieval_order, "retrieval order (RetrievalPages.rank)")}[self.in_order]
        if order is None:
            raise ValueError(f"method {name!r} needs the pages' {how}")
        return whole_pages(name, order, grids, total)


COC = ContextMethod("coc", needs=("relevance", "text"), readers=("ocr", "vlm"))  # the VLM reads it in one prompt
EQUAL_SPLIT = ContextMethod("equal_split", needs=("relevance", "text"))
FIRST_PAGES = ContextMethod("pages", uses_scorer=False)
BM25_PAGES = ContextMethod("pages", needs=("text",), in_order="bm25", uses_scorer=False)
RETRIEVAL_PAGES = ContextMethod("pages", needs=("text",), in_order="retrieval", uses_scorer=False)
