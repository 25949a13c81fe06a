"""The token plan: what one method sends of one image, the one currency between allocation and readers.

Every allocation method (full resolution, the model's own downscaling, the samplers, the patch
allocators, the trained selector and pruner, the VLM's first look as a relevance source) produces a
:class:`Plan`; the OCR reader renders a plan (:mod:`arr_coc.eval.reading`), the VLM path encodes one
(:mod:`arr_coc.vlm`), the app draws one. Four kinds:

=========  ==========================================================================================
kind       what is sent
=========  ==========================================================================================
full       every cell of the image at full resolution (the upper bound)
native     the whole image downsampled to at most ``native`` tokens (the field's baseline)
cells      a gestalt grid + ``cells`` [K, 2] (y, x) one-cell saccades, most relevant first
squares    a gestalt grid + ``squares`` [K, 3] (y, x, side) variable-size squares, one token each
=========  ==========================================================================================

Coordinates are (y, x) token cells of the image's own grid ``(hc, wc)``.
"""
from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

PLAN_KINDS = ("full", "native", "cells", "squares")
# how a VLM encodes a plan's cells: only them through the tower (sparse), the whole grid then the sent
# cells kept (slice), or every cell scaled by its relevance (weighted, a "full" plan)
PLAN_ENCODINGS = ("sparse", "slice", "weighted")


@dataclass(frozen=True)
class Plan:
    """What one method sends for one image.

    Example:
        >>> import torch
        >>> p = Plan("topk", "cells", (20, 30), gestalt=(8, 8), cells=torch.tensor([[3, 4], [0, 0]]))
        >>> p.saccades, p.gestalt_tokens, p.tokens, p.full_tokens
        (2, 64, 66, 600)
        >>> Plan("full", "full", (20, 30)).tokens
        600
    """

    method: str  # the registry name that made it
    kind: str  # one of PLAN_KINDS
    grid: tuple[int, int]  # (hc, wc) the image's token cells
    gestalt: tuple[int, int] | None = None  # (rows, cols) gestalt grid sent before the saccades
    cells: Tensor | None = None  # [K, 2] (y, x) cells, int64, most relevant first (kind "cells")
    squares: Tensor | None = None  # [K, 3] (y, x, side) cells, int64, one token each (kind "squares")
    native: int | None = None  # kind "native": the most tokens the downscaled image may use
    scores: Tensor | None = None  # [K] the relevance (or allocator score) of each saccade, descending
    encoding: str = "sparse"  # one of PLAN_ENCODINGS: how a VLM reader encodes the plan

    def __post_init__(self) -> None:
        if self.kind not in PLAN_KINDS:
            raise ValueError(f"unknown plan kind {self.kind!r}; choose one of {', '.join(PLAN_KINDS)}")
        if self.encoding not in PLAN_ENCODINGS:
            raise ValueError(f"unknown plan encoding {self.encoding!r}; choose one of {', '.join(PLAN_ENCODINGS)}")
        need = {"cells": self.cells, "squares": self.squares, "native": self.native}.get(self.kind, 0)
        if need is None:
            raise ValueError(f"a {self.kind!r} plan needs its {self.kind!r} field")

    @property
    def full_tokens(self) -> int:
        """Tokens the whole image costs at full resolution."""
        return self.grid[0] * self.grid[1]

    @property
    def gestalt_tokens(self) -> int:
        return self.gestalt[0] * self.gestalt[1] if self.gestalt and self.kind in ("cells", "squares") else 0

    @property
    def saccades(self) -> int:
        """Full-resolution saccade tokens (K); 0 for full and native plans."""
        if self.kind == "cells":
            return int(self.cells.shape[0])
        if self.kind == "squares":
            return int((self.squares[:, 2] > 0).sum())
        return 0

    @property
    def tokens(self) -> int:
        """Visual tokens sent (a native plan: its cap; the processor may use fewer)."""
        if self.kind == "full":
            return self.full_tokens
        if self.kind == "native":
            return int(self.native)
        return self.gestalt_tokens + self.saccades


class PageTotals:
    """What several pages send in all, for anything with ``pages`` (each with ``gestalt_tokens``, ``saccades``
    and ``full_tokens``) and ``text_tokens``: a context's allocation and a VLM's answer count alike."""

    pages: list
    text_tokens: int | None

    @property
    def gestalt_tokens(self) -> int:
        return sum(p.gestalt_tokens for p in self.pages)

    @property
    def saccades(self) -> int:
        return sum(p.saccades for p in self.pages)

    @property
    def visual_tokens(self) -> int:
        """Visual tokens sent: every page's gestalt + saccades (exact)."""
        return sum(p.gestalt_tokens + p.saccades for p in self.pages)

    @property
    def full_tokens(self) -> int:
        """Visual tokens of every page at full resolution."""
        return sum(p.full_tokens for p in self.pages)

    @property
    def compression(self) -> float | None:
        """The COC compression ratio: text tokens / visual tokens sent (None without text tokens)."""
        return None if self.text_tokens is None else self.text_tokens / self.visual_tokens
