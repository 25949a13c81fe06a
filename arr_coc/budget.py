"""Token arithmetic: how many tokens a request sends, and how they split into gestalt and saccades.

One rule serves ``look``, ``ask``, ``eval`` and ``train``:

* K saccades come with the largest square gestalt of at most K tokens (sides 16, 12, 8, 6, 4, 2, 1),
  each side clamped to the image's own cell grid: 273 saccades -> 16x16 (529 in all), 128 -> 8x8.
* A total of T tokens splits into the largest square gestalt of at most T // 2 tokens plus the rest as
  saccades. For every K, splitting K + gestalt(K) gives back exactly K and gestalt(K), so
  ``eval --tokens 192``, ``look --tokens 192`` and ``look --saccades 128`` send the same 8x8 + 128 tokens.
"""
from __future__ import annotations

GESTALT_SIDES = (16, 12, 8, 6, 4, 2, 1)  # square gestalt grids, largest first; 16x16 at the reference budget of 273 saccades


def _clamp(side: int, cells_hw: tuple[int, int]) -> tuple[int, int]:
    return min(side, int(cells_hw[0])), min(side, int(cells_hw[1]))


def gestalt_grid(saccades: int, cells_hw: tuple[int, int]) -> tuple[int, int]:
    """Gestalt grid (rows, cols) sent with ``saccades`` saccade tokens on an image of ``cells_hw`` cells.

    >>> gestalt_grid(273, (48, 48)), gestalt_grid(128, (48, 48)), gestalt_grid(273, (10, 40))
    ((16, 16), (8, 8), (10, 16))
    """
    if saccades < 1:
        raise ValueError(f"saccades K must be at least 1, got {saccades}")
    return _clamp(next(s for s in GESTALT_SIDES if s * s <= saccades), cells_hw)


def budget_tokens(spec: str | int, full_tokens: int) -> int:
    """Total tokens T given as a count (``"529"``/529) or as a share of full resolution (``"25%"``) -> tokens.

    >>> budget_tokens("25%", 972), budget_tokens(529, 400), budget_tokens("100", 972)
    (243, 400, 100)
    """
    s = str(spec).strip()
    try:
        value = float(s[:-1]) / 100 if s.endswith("%") else int(s)
    except ValueError:
        raise ValueError(f"tokens {spec!r} is neither a token count (e.g. 529) nor a share (e.g. 25%)") from None
    if s.endswith("%"):
        if not 0 < value <= 1:
            raise ValueError(f"tokens {spec!r} must be a share in (0%, 100%]")
        tokens = round(value * full_tokens)
    else:
        tokens = int(value)
    if tokens < 2:
        raise ValueError(f"tokens {spec!r} gives {tokens} tokens; at least 2 (one gestalt, one saccade) are needed")
    return min(tokens, full_tokens)


def split_budget(total: int, cells_hw: tuple[int, int]) -> tuple[tuple[int, int], int]:
    """Share ``total`` tokens between a gestalt grid and K saccades (the inverse of :func:`gestalt_grid`).

    >>> split_budget(529, (48, 48)), split_budget(192, (48, 48)), split_budget(48, (36, 27))
    (((16, 16), 273), ((8, 8), 128), ((4, 4), 32))
    """
    if total < 2:
        raise ValueError(f"{total} tokens cannot hold one gestalt and one saccade token")
    gh, gw = _clamp(next(s for s in GESTALT_SIDES if s * s <= total // 2), cells_hw)
    return (gh, gw), total - gh * gw
