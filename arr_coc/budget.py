"""Token arithmetic: how many tokens a request sends, and how they split into gestalt and saccades.

One rule serves ``look``, ``ask``, ``eval`` and ``train``:

* K saccades come with the largest square gestalt of at most K tokens (sides 16, 12, 8, 6, 4, 2, 1),
  each side clamped to the image's own cell grid: 273 saccades -> 16x16 (529 in all), 128 -> 8x8.
* A total of T tokens splits into the largest square gestalt of at most T // 2 tokens plus the rest as
  saccades. For every K, splitting K + gestalt(K) gives back exactly K and gestalt(K) (save for the last rule), so
  ``eval --tokens 192``, ``look --tokens 192`` and ``look --saccades 128`` send the same 8x8 + 128 tokens.
* Over a context of n pages (one image is its one-page case) the same rule holds per page: every page gets
  the largest square side s with ``n * s * s`` at most K (given K) or at most T // 2 (given T), clamped to the
  page's grid, and K = T minus the gestalts; over several pages a side below 8 (``LEGIBLE_SIDE``: a page in 6x6
  tokens reads nothing) is sent as 1x1. 20 pages at T = 1300 get 1x1 each (20 tokens, K = 1280), 20 pages at
  T = 3000 8x8 (1280, K = 1720); past T // 2 pages even 1x1 does not fit and the request is refused with the least
  total that works.
* One image given a total whose print stays legible in a smaller copy (its text lines' median height, at least 10 px
  in a gestalt of its own aspect holding 70 % of T: ``legible_gestalt``) gets that gestalt and T minus it as
  saccades: a receipt's large print reads in it, where the square rule's half would leave it illegible.

A request's budget is a :class:`Budget`, parsed once where it enters (:meth:`Budget.parse`) and split by
:meth:`Budget.split` for any number of pages.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

GESTALT_SIDES = (16, 12, 8, 6, 4, 2, 1)  # square gestalt grids, largest first; 16x16 at the reference budget of 273 saccades
# Over several pages, a page's gestalt side below this is sent as 1x1 (the page's place and mean colour) and the
# tokens it frees go to saccades: a whole page in 6x6 or fewer tokens reads nothing of its text, while the saccades
# it would cost read lines. Chosen on the 199 validation questions of texlive-paraphrase (docs/coc.md, "The gestalt
# over many pages"); one image keeps its gestalt at every size (its only view of what the saccades leave out).
LEGIBLE_SIDE = 8
# One image whose text stays legible in a smaller copy (a receipt's large print) gets a gestalt of its own aspect
# holding LEGIBLE_SHARE of the total, the rest as saccades, where its lines' median height stays at least
# LEGIBLE_TEXT_PX in that gestalt; an image whose text it would shrink below that (a form's small print) keeps the
# square rule (at most half), since every token taken from its saccades is lost. Chosen on the 121 validation
# questions of image-paraphrase at 11 % and 25 % (docs/coc.md, "One image: a gestalt where its text stays legible").
LEGIBLE_SHARE = 0.7
LEGIBLE_TEXT_PX = 10.0
# ... and only an image with at least this many legible lines is a page of text (a sign in a photo is not): not tuned,
# every validation receipt and form has 24 or more.
LEGIBLE_MIN_LINES = 8


def downsampled_grid(hc: int, wc: int, tokens: int) -> tuple[int, int]:
    """The (rows, cols) token grid of the uniform baseline: canvas aspect, as many tokens as fit.

    Rule: if ``tokens >= hc * wc`` the canvas's own grid (full resolution). Otherwise start from the
    largest grid of the canvas's exact aspect, ``floor(hc * s) x floor(wc * s)`` with
    ``s = sqrt(tokens / (hc * wc))`` (each side at least 1, rows at most ``tokens``, cols cut so rows * cols <= tokens), then
    repeatedly add one row or one column, whichever keeps rows / cols closer to hc / wc in log ratio
    (a row on a tie), while rows * cols <= tokens, rows <= hc and cols <= wc. The result keeps the
    aspect to within one cell per side and uses all but a few percent of the budget.

    Example:
        >>> downsampled_grid(36, 27, 529)  # FUNSD-sized canvas, 256 + 273 tokens: 26x19 then one column
        (26, 20)
        >>> downsampled_grid(10, 10, 50), downsampled_grid(4, 40, 8), downsampled_grid(6, 8, 1000)
        ((7, 7), (1, 8), (6, 8))
    """
    if any(isinstance(v, bool) or int(v) != v or v < 1 for v in (hc, wc, tokens)):
        raise ValueError(f"downsampled_grid needs positive ints, got hc={hc!r}, wc={wc!r}, tokens={tokens!r}")
    if tokens >= hc * wc:
        return hc, wc
    s = math.sqrt(tokens / (hc * wc))
    rows = min(hc, tokens, max(1, math.floor(hc * s)))  # a very tall canvas can ask for more rows than tokens
    cols = min(wc, max(1, math.floor(wc * s)), tokens // rows)
    target = math.log(hc / wc)
    while True:
        options = [(r, c) for r, c in ((rows + 1, cols), (rows, cols + 1)) if r * c <= tokens and r <= hc and c <= wc]
        if not options:
            return rows, cols
        rows, cols = min(options, key=lambda rc: abs(math.log(rc[0] / rc[1]) - target))  # row first on ties


def legible_gestalt(cells_hw: tuple[int, int], tokens: int, text_height: float | None,
                    share: float = LEGIBLE_SHARE, min_px: float = LEGIBLE_TEXT_PX) -> tuple[int, int] | None:
    """One image's gestalt of its own aspect holding ``share`` of ``tokens`` (:func:`downsampled_grid`), where its
    text (lines of median height ``text_height`` px at full resolution) is at least ``min_px`` tall in it; None
    where it is not (or the height is unknown), and the square rule holds.

    >>> legible_gestalt((53, 36), 210, 40.0)  # a receipt's print: 40 px lines are 10.8 px in 14x10 of 53x36 cells
    (14, 10)
    >>> legible_gestalt((36, 27), 107, 21.0) is None  # a form's: 21 px lines would be 5.6 px in 10x7
    True
    """
    hc, wc = int(cells_hw[0]), int(cells_hw[1])
    if text_height is None or not share or tokens < 2:
        return None
    rows, cols = downsampled_grid(hc, wc, max(1, int(tokens * share)))
    if rows * cols >= tokens or text_height * math.sqrt(rows * cols / (hc * wc)) < min_px:
        return None
    return rows, cols


def _clamp(side: int, cells_hw: tuple[int, int]) -> tuple[int, int]:
    return min(side, int(cells_hw[0])), min(side, int(cells_hw[1]))


def gestalt_grid(saccades: int, cells_hw: tuple[int, int]) -> tuple[int, int]:
    """Gestalt grid (rows, cols) sent with ``saccades`` saccade tokens on an image of ``cells_hw`` cells.

    >>> gestalt_grid(273, (48, 48)), gestalt_grid(128, (48, 48)), gestalt_grid(273, (10, 40))
    ((16, 16), (8, 8), (10, 16))
    """
    if saccades < 1:
        raise ValueError(f"saccades K must be at least 1, got {saccades}")
    return _clamp(_side(1, saccades), cells_hw)


def _side(n_pages: int, share: int, legible: int = 0) -> int | None:
    """The largest gestalt side every one of ``n_pages`` pages can have within ``share`` tokens (None: not even 1);
    over several pages a side below ``legible`` is 1.

    >>> _side(20, 687), _side(20, 687, legible=8), _side(1, 50, legible=8), _side(20, 19)
    (4, 1, 6, None)
    """
    side = next((s for s in GESTALT_SIDES if n_pages * s * s <= share), None)
    return 1 if side is not None and n_pages > 1 and side < legible else side


@dataclass(frozen=True)
class Budget:
    """What a request may send, parsed once where it enters and split for any number of pages.

    Kinds: ``tokens`` T in all (``"529"``); ``share`` of full resolution (``"25%"``: T = round(share x the
    pages' full tokens)); ``text``, a compression C of the context's text tokens (``"10x"``: T = round(text / C),
    at least 2 per page); ``saccades`` K on top of the per-page gestalts (:meth:`saccades`). A total above full
    resolution sends full resolution's count.

    >>> Budget.parse("529"), Budget.parse("25%"), Budget.parse("10x"), Budget.saccades(273)
    (Budget('529'), Budget('25%'), Budget('10x'), Budget('K=273'))
    >>> Budget.parse("25%").split([(48, 48)]), Budget.parse(1300).split([(40, 32)] * 20)[1]
    (([(16, 16)], 320), 1280)
    >>> Budget.parse(1300).split([(40, 32)] * 20, legible=0)[1]  # the square rule alone: 4x4 each
    980
    >>> Budget.parse("10x").total(25000, text_tokens=12640, pages=20)
    1264
    """

    kind: str
    value: float

    def __post_init__(self) -> None:
        if self.kind not in ("tokens", "share", "text", "saccades"):
            raise ValueError(f"unknown budget kind {self.kind!r}")

    @classmethod
    def parse(cls, spec: "str | int | Budget") -> "Budget":
        """``"529"`` / 529 (tokens), ``"25%"`` (a share of full resolution), ``"10x"`` (the text over 10); a
        :class:`Budget` is returned as is. Anything else is refused in one line naming the forms."""
        if isinstance(spec, Budget):
            return spec
        if isinstance(spec, bool) or not isinstance(spec, (str, int)):
            raise ValueError(f"budget {spec!r} must be a token count (529), a share (25%) or a compression (10x)")
        s = str(spec).strip()
        forms = "a token count (e.g. 529), a share of full resolution (e.g. 25%) or a compression of the text (e.g. 10x)"
        try:
            if s.endswith("%"):
                value = float(s[:-1]) / 100
                if not (math.isfinite(value) and 0 < value <= 1):
                    raise ValueError(f"tokens {spec!r} must be a share in (0%, 100%]")
                return cls("share", value)
            if s.lower().endswith("x"):
                value = float(s[:-1])
                if not (math.isfinite(value) and value > 0):
                    raise ValueError(f"compression {spec!r} must be a positive ratio, e.g. 10x")
                return cls("text", value)
            value = int(s)
        except ValueError as err:
            if "must be" in str(err):
                raise
            raise ValueError(f"tokens {spec!r} is neither {forms}") from None
        if value < 2:
            raise ValueError(f"tokens {spec!r} gives {value} tokens; at least 2 (one gestalt, one saccade) are needed")
        return cls("tokens", value)

    @classmethod
    def saccades(cls, k: int) -> "Budget":
        """K saccades, each page's gestalt on top."""
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"saccades K must be a whole number of at least 1, got {k!r}")
        return cls("saccades", k)

    def __repr__(self) -> str:
        return f"Budget({str(self)!r})"

    def __str__(self) -> str:
        if self.kind == "share":
            return f"{100 * self.value:g}%"
        if self.kind == "text":
            return f"{self.value:g}x"
        return f"K={int(self.value)}" if self.kind == "saccades" else str(int(self.value))

    @property
    def needs_text(self) -> bool:
        """Whether the total depends on the context's text tokens (a compression ``10x``)."""
        return self.kind == "text"

    def total(self, full_tokens: int, *, text_tokens: int | None = None, pages: int = 1) -> int | None:
        """T for pages whose full resolution is ``full_tokens`` (None for a budget of K saccades)."""
        if self.kind == "saccades":
            return None
        if self.kind == "text":
            if not text_tokens:
                raise ValueError(f"budget {self} is a compression of the context's text, and this context has no "
                                 f"text (no text layer, nothing read by OCR); give a token count or a share instead")
            return min(full_tokens, max(2 * pages, round(text_tokens / self.value)))
        tokens = round(self.value * full_tokens) if self.kind == "share" else int(self.value)
        if tokens < 2:
            raise ValueError(f"tokens {self} gives {tokens} tokens; at least 2 (one gestalt, one saccade) are needed")
        return min(tokens, full_tokens)

    def split(self, grids: Sequence[tuple[int, int]], *, text_tokens: int | None = None,
              legible: int = LEGIBLE_SIDE, text_height: float | None = None) -> tuple[list[tuple[int, int]], int]:
        """Per page its gestalt grid, and K saccades for all pages, for pages with these cell grids.

        A total (tokens, share, text) is clamped to the pages' full resolution; K saccades are checked
        against the pages' cells. Over several pages a gestalt side below ``legible`` is sent as 1x1 (0: the
        square rule alone). One page given a total and ``text_height`` (its text lines' median height in pixels at
        full resolution; None: not known) gets :func:`legible_gestalt` where its text stays legible in it.
        """
        n = len(grids)
        if n == 0:
            raise ValueError("a context needs at least one page")
        full = sum(int(h) * int(w) for h, w in grids)
        tokens = self.total(full, text_tokens=text_tokens, pages=n)
        if tokens is None:
            k = int(self.value)
            side = _side(n, k, legible)
            if side is None:
                raise ValueError(f"{k} saccades give {n} pages no gestalt: each page needs at least a 1x1 gestalt, "
                                 f"so K >= {n}; raise --saccades or choose fewer pages")
        else:
            side = _side(n, tokens // 2, legible)
            if side is None:
                raise ValueError(f"{tokens} tokens cannot give {n} pages a 1x1 gestalt each and as many saccades; "
                                 f"use at least {2 * n} tokens or choose fewer pages")
        gestalts = [_clamp(side, g) for g in grids]
        if tokens is not None and n == 1:
            gestalts = [legible_gestalt(grids[0], tokens, text_height) or gestalts[0]]
        if tokens is not None:
            k = tokens - sum(h * w for h, w in gestalts)
        if k > full:
            raise ValueError(f"{k} saccades exceed the {full} cells of the {n} page{'s' if n != 1 else ''}; "
                             f"send fewer")
        return gestalts, k
