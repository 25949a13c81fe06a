"""The token rule of a context: one small gestalt per page, the rest saccades ranked over all pages.

Given K saccades, every page gets the largest square gestalt side s (16, 12, 8, 6, 4, 2, 1) with
``pages * s * s <= K`` (each side clamped to the page's cell grid); given a total T, the largest s
with ``pages * s * s <= T // 2``, and K = T minus the gestalt tokens. With one page both are
exactly :func:`arr_coc.budget.gestalt_grid` / :func:`arr_coc.budget.split_budget`. Many pages
shrink the side: 20 pages at T = 1300 get 4x4 each (320 tokens, K = 980); past T // 2 pages even
1x1 does not fit and the request is refused with the smallest total that works (pages + 1 and up).
"""
from __future__ import annotations

from typing import Sequence

from arr_coc.budget import GESTALT_SIDES


def _side(n_pages: int, share: int) -> int | None:
    return next((s for s in GESTALT_SIDES if n_pages * s * s <= share), None)


def split_context(grids: Sequence[tuple[int, int]], *, tokens: int | None = None,
                  saccades: int | None = None) -> tuple[list[tuple[int, int]], int]:
    """Per-page gestalt grids and the saccades K for a context of pages with these cell grids.

    Exactly one of ``tokens`` (a total T) and ``saccades`` (K) is given.

    >>> split_context([(40, 32)], tokens=529), split_context([(40, 32)] * 20, tokens=1300)[1]
    (([(16, 16)], 273), 980)
    >>> split_context([(40, 32)] * 3, saccades=100)
    ([(4, 4), (4, 4), (4, 4)], 100)
    """
    n = len(grids)
    if n == 0:
        raise ValueError("a context needs at least one page")
    if (tokens is None) == (saccades is None):
        raise ValueError("give exactly one of tokens (a total) and saccades (K)")
    if saccades is not None:
        if saccades < 1:
            raise ValueError(f"saccades K must be at least 1, got {saccades}")
        side = _side(n, saccades)
        if side is None:
            raise ValueError(f"{saccades} saccades give {n} pages no gestalt: each page needs at least a 1x1 "
                             f"gestalt, so K >= {n}; raise --saccades or choose fewer pages")
        k = saccades
    else:
        side = _side(n, tokens // 2)
        if side is None:
            raise ValueError(f"{tokens} tokens cannot give {n} pages a 1x1 gestalt each and as many saccades; "
                             f"use at least {2 * n} tokens or choose fewer pages")
    gestalts = [(min(side, h), min(side, w)) for h, w in grids]
    if tokens is not None:
        k = tokens - sum(h * w for h, w in gestalts)
    free = sum(h * w for h, w in grids)
    if k > free:
        raise ValueError(f"{k} saccades exceed the {free} cells of the context's {n} pages; send fewer tokens")
    return gestalts, k
