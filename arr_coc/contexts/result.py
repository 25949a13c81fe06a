"""What an allocation sends: per page a plan on its canvas; in all, the tokens and the compression.

One image is a context of one page: its :class:`ContextAllocation` has one :class:`PageAllocation`, and its JSON
carries that page's fields at the top level too (what ``look --json`` printed for an image, ``scores`` there being
what its sampler read, as ``ARR()`` reports them; per page ``scores`` are the ranking's, comparable across pages).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Union

from torch import Tensor

from arr_coc.budget import Budget
from arr_coc.engine.plan import PageTotals, Plan

Line = tuple[str, tuple[float, float, float, float]]  # (text, (y0, x0, y1, x1) px)
WEIGHT_NAMES = ("propositional", "perspectival", "participatory")


@dataclass
class PageAllocation:
    """What one page of a context sends.

    Attributes:
        index: the page's index in its source (0-based).
        pixels: [3, H, W] the page's canvas, or a function that draws it again (a context of many pages keeps
            no page's pixels); read it as ``image``.
        plan: kind "cells": the page's gestalt grid and its saccades [k_i, 2] (y, x) as its sampler ordered
            them, with the scores it read (``plan.scores``).
        cell: token cell side, px.
        relevance: [hc, wc] the ranking score of every cell (what the context's top K compared: it decided the
            page's share of the saccades).
        placing: [hc, wc] what the page's sampler read (:func:`~arr_coc.contexts.ranking.placing_map`: the ARR's
            relevance, plus the ranking's text parts in its units where the page matched the question; one image,
            or a page without a text layer under ``images_alone``: plus its lines' retrieval alone).
        words: the page's words in canvas pixels (text layer, rendered text, or OCR).
        text_from: "text layer", "ocr" or "none".
        image_size: (H, W) px of the page before its canvas.
        weights: the scorer's context weights (propositional, perspectival, participatory).
    """

    index: int
    pixels: Union[Tensor, Callable[[], Tensor]]
    plan: Plan
    cell: int
    relevance: Tensor
    placing: Tensor | None = field(default=None, repr=False)
    words: list[Line] = field(default_factory=list, repr=False)
    text_from: str = "none"
    image_size: tuple[int, int] | None = None
    weights: tuple[float, float, float] | None = None

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

    @property
    def full_tokens(self) -> int:
        return self.plan.full_tokens

    def ranking_scores(self) -> Tensor:
        """[k_i] each saccade's ranking score (comparable across pages: what decided the page's share)."""
        cells = self.plan.cells.long()
        return self.relevance[cells[:, 0], cells[:, 1]]

    def to_json(self) -> dict[str, Any]:
        """The page as JSON: per saccade its ranking score (``scores``, comparable across pages) and the score its
        sampler read (``sampler_scores``, ``plan.scores``)."""
        p = self.plan
        d: dict[str, Any] = {
            "index": self.index, "canvas": [g * self.cell for g in p.grid], "grid": list(p.grid), "cell": self.cell,
            "gestalt_grid": list(p.gestalt), "gestalt_tokens": p.gestalt_tokens, "saccades": p.saccades,
            "full_resolution": p.full_tokens, "text_from": self.text_from,
            "positions": p.cells.tolist(), "scores": [round(s, 5) for s in self.ranking_scores().tolist()],
            "sampler_scores": [round(s, 5) for s in p.scores.tolist()]}
        if self.image_size is not None:
            d["image_size"] = list(self.image_size)
        if self.weights is not None:
            d["context_weights"] = dict(zip(WEIGHT_NAMES, [round(w, 4) for w in self.weights]))
        return d


@dataclass
class ContextAllocation(PageTotals):
    """A whole context's allocation: per page what it sends, and what the context costs as text."""

    question: str
    pages: list[PageAllocation]
    source: str
    meta: dict[str, Any]
    text_tokens: int | None  # the context's text, counted by ``tokenizer``; None when no page has text
    tokenizer: str
    timings_ms: dict[str, float] = field(default_factory=dict)
    budget: Budget | None = None  # what was asked

    @property
    def tokens(self) -> int:
        """Visual tokens sent: every page's gestalt + saccades (exact)."""
        return self.visual_tokens

    def to_json(self) -> dict[str, Any]:
        """The allocation as JSON; a one-page context (one image) has its page's fields at the top level too."""
        d: dict[str, Any] = {"question": self.question}
        if len(self.pages) == 1:
            page = self.pages[0].to_json()
            d.update({k: page[k] for k in ("image_size", "canvas", "cell", "grid") if k in page})
        d["tokens"] = {"gestalt": self.gestalt_tokens, "saccades": self.saccades, "sent": self.tokens,
                       "full_resolution": self.full_tokens}
        if len(self.pages) == 1:  # the image schema: its scores are what its sampler read (ARR()'s scores)
            d.update({k: page[k] for k in ("gestalt_grid", "context_weights", "positions") if k in page})
            d["scores"] = page["sampler_scores"]
        d.update({"source": self.source, "pages": [p.to_json() for p in self.pages],
                  "budget": None if self.budget is None else str(self.budget),
                  "text_tokens": self.text_tokens, "tokenizer": self.tokenizer,
                  "compression": None if self.compression is None else round(self.compression, 3),
                  "context": {k: v for k, v in self.meta.items() if k not in ("pages", "sources")},
                  "timings_ms": {k: round(v, 2) for k, v in self.timings_ms.items() if "/" not in k},
                  "channel_ms": {k.split("/", 1)[1]: round(v, 2) for k, v in self.timings_ms.items() if "/" in k}})
        return d
