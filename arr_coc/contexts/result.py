"""What a context's allocation sends: per page a plan on its canvas; in all, the tokens and the compression."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Union

from torch import Tensor

from arr_coc.engine.pipeline import Allocation
from arr_coc.engine.plan import Plan

Line = tuple[str, tuple[float, float, float, float]]  # (text, (y0, x0, y1, x1) px)


@dataclass
class PageAllocation:
    """What one page of a context sends.

    Attributes:
        index: the page's index in its source (0-based).
        pixels: [3, H, W] the page's canvas, or a function that draws it again (a context of many pages keeps
            no page's pixels); read it as ``image``.
        plan: kind "cells": the page's gestalt grid and its saccades [k_i, 2] (y, x), in global rank order.
        cell: token cell side, px.
        relevance: [hc, wc] the ranking score of every cell (what the global top-K compared).
        words: the page's words in canvas pixels (text layer, rendered text, or OCR).
        text_from: "text layer", "ocr" or "none".
    """

    index: int
    pixels: Union[Tensor, Callable[[], Tensor]]
    plan: Plan
    cell: int
    relevance: Tensor
    words: list[Line] = field(default_factory=list, repr=False)
    text_from: str = "none"

    @property
    def image(self) -> Tensor:
        """[3, H, W] the page's canvas, as the VLM gets it (sides multiples of ``cell``); drawn again when not kept."""
        return self.pixels() if callable(self.pixels) else self.pixels

    @property
    def saccades(self) -> int:
        return self.plan.saccades

    @property
    def gestalt_tokens(self) -> int:
        return self.plan.gestalt_tokens

    @property
    def tokens(self) -> int:
        return self.plan.tokens

    def to_json(self) -> dict[str, Any]:
        p = self.plan
        return {"index": self.index, "canvas": [g * self.cell for g in p.grid], "grid": list(p.grid), "cell": self.cell,
                "gestalt_grid": list(p.gestalt), "gestalt_tokens": p.gestalt_tokens, "saccades": p.saccades,
                "full_resolution": p.full_tokens, "text_from": self.text_from,
                "positions": p.cells.tolist(), "scores": [round(s, 5) for s in p.scores.tolist()]}


@dataclass
class ContextAllocation:
    """A whole context's allocation: per page what it sends, and what the context costs as text."""

    question: str
    pages: list[PageAllocation]
    source: str
    meta: dict[str, Any]
    text_tokens: int | None  # the context's text, counted by ``tokenizer``; None when no page has text
    tokenizer: str
    timings_ms: dict[str, float] = field(default_factory=dict)
    allocation: Allocation | None = None  # the one-page case: the ARR's own allocation

    @property
    def tokens(self) -> int:
        """Visual tokens sent: every page's gestalt + saccades (exact)."""
        return sum(p.tokens for p in self.pages)

    @property
    def gestalt_tokens(self) -> int:
        return sum(p.gestalt_tokens for p in self.pages)

    @property
    def saccades(self) -> int:
        return sum(p.saccades for p in self.pages)

    @property
    def full_tokens(self) -> int:
        """Visual tokens every page costs at full resolution."""
        return sum(p.plan.full_tokens for p in self.pages)

    @property
    def compression(self) -> float | None:
        """The COC compression ratio: text tokens over visual tokens sent (None without text)."""
        return None if self.text_tokens is None else self.text_tokens / self.tokens

    def to_json(self) -> dict[str, Any]:
        return {"question": self.question, "source": self.source, "pages": [p.to_json() for p in self.pages],
                "tokens": {"gestalt": self.gestalt_tokens, "saccades": self.saccades, "sent": self.tokens,
                           "full_resolution": self.full_tokens},
                "text_tokens": self.text_tokens, "tokenizer": self.tokenizer,
                "compression": None if self.compression is None else round(self.compression, 3),
                "context": {k: v for k, v in self.meta.items() if k not in ("pages", "sources")},
                "timings_ms": {k: round(v, 2) for k, v in self.timings_ms.items()}}
