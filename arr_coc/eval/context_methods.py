"""What each method sends of a context at a total of T visual tokens: a plan per page (the baselines of COC).

Every method gets the same T (equal visual tokens) over the context's pages, given the pages' cell
grids and the ranking scores :func:`arr_coc.contexts.allocate_context` computed for the question:

- ``coc``: the context rule (:func:`arr_coc.contexts.split_context`: a gestalt per page, K saccades) and
  one ranking of every page's cells (:func:`arr_coc.contexts.rank_cells`): what ``allocate_context`` sends;
- ``equal_split``: the same gestalts, K split equally over the pages, each page's best cells by the same scores;
- ``uniform``: every page downscaled to T / pages tokens (what rendering at a lower DPI gives);
- ``first_pages``: pages in reading order at full resolution while they fit, the rest of T downscaling the next;
- ``bm25_pages``: the same in BM25 order over the pages' text (bm25s, English stop words): text retrieval
  choosing the pages, what a user would pick instead;
- ``full``: every page at full resolution (the reference; one row per question, budget ``full``).

A page a method sends nothing of has no plan (it reads nothing).
"""
from __future__ import annotations

from typing import Sequence

from torch import Tensor

from arr_coc.contexts import rank_cells, split_context
from arr_coc.engine.plan import Plan
from arr_coc.errors import MissingDependencyError

CONTEXT_METHODS = ("full", "coc", "equal_split", "uniform", "first_pages", "bm25_pages")  # table order
NEEDS_BM25 = "bm25_pages"
_BM25_INSTALL = "pip install 'arr-coc[bench]' (bm25s), or leave out --methods bm25_pages"


def cells_plan(name: str, grid: tuple[int, int], gestalt: tuple[int, int], cells: Tensor) -> Plan:
    """A page's gestalt + saccades as a ``cells`` plan."""
    return Plan(name, "cells", tuple(grid), gestalt=gestalt, cells=cells.reshape(-1, 2))


def whole_pages(name: str, order: Sequence[int], grids: Sequence[tuple[int, int]], total: int) -> dict[int, Plan]:
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


def context_plans(methods: Sequence[str], scores: Sequence[Tensor], total: int,
                  bm25_order: Sequence[int] | None = None) -> dict[str, dict[int, Plan]]:
    """Each method's plans {page position: Plan} for T = ``total`` over pages with these score maps [hc_i, wc_i].

    Raises:
        ValueError: ``total`` cannot give every page a gestalt (:func:`split_context` names the minimum), or
            ``bm25_pages`` is asked without ``bm25_order``.
    """
    grids = [tuple(int(v) for v in s.shape) for s in scores]
    n = len(grids)
    out: dict[str, dict[int, Plan]] = {}
    if "full" in methods:
        out["full"] = {i: Plan("full", "full", g) for i, g in enumerate(grids)}
    if {"coc", "equal_split"} & set(methods):
        gestalts, k = split_context(grids, tokens=total)
    if "coc" in methods:
        out["coc"] = {i: cells_plan("coc", grids[i], gestalts[i], c) for i, c in enumerate(rank_cells(scores, k))}
    if "equal_split" in methods:
        share = [k // n + (i < k % n) for i in range(n)]
        out["equal_split"] = {i: cells_plan("equal_split", grids[i], gestalts[i],
                                            rank_cells([scores[i]], min(share[i], scores[i].numel()))[0])
                              for i in range(n)}
    if "uniform" in methods:
        per = [total // n + (i < total % n) for i in range(n)]
        out["uniform"] = {i: Plan("uniform", "native", grids[i], native=per[i]) for i in range(n)}
    if "first_pages" in methods:
        out["first_pages"] = whole_pages("first_pages", range(n), grids, total)
    if NEEDS_BM25 in methods:
        if bm25_order is None:
            raise ValueError("bm25_pages needs the pages' BM25 order (BM25Pages.rank)")
        out[NEEDS_BM25] = whole_pages(NEEDS_BM25, bm25_order, grids, total)
    return {m: out[m] for m in methods if m in out}


def require_bm25(what: str = "method bm25_pages") -> None:
    """Raise :class:`MissingDependencyError` in one line when bm25s is not installed."""
    try:
        import bm25s  # noqa: F401
    except ImportError as err:
        raise MissingDependencyError(f"{what} needs bm25s: {_BM25_INSTALL}") from err


class BM25Pages:
    """The pages of one context ranked by BM25 (bm25s, English stop words) for a question.

    Example:
        >>> BM25Pages(["apples and pears", "the brass key is under the mat", "pears"]).rank("Where is the key?")[0]
        1
    """

    def __init__(self, texts: Sequence[str]) -> None:
        require_bm25()
        import bm25s

        self.n = len(texts)
        self.retriever = bm25s.BM25()
        self.retriever.index(bm25s.tokenize(list(texts), stopwords="en", show_progress=False), show_progress=False)

    def rank(self, question: str) -> list[int]:
        """Every page position, best first."""
        import bm25s

        ids, _ = self.retriever.retrieve(bm25s.tokenize([question], stopwords="en", show_progress=False),
                                         k=self.n, show_progress=False)
        return [int(i) for i in ids[0]]
