"""Selection: the K cells a sampler picks per image, and the pieces every sampler shares to keep its contract.

The contract: every sampler (`arr_coc.engine.samplers.SAMPLERS`) returns exactly K distinct valid cells per
image, ordered by relevance (high -> low, ties by lower flat index), or raises ValueError. Here are the
budget checks, the one deterministic ranking, each image's valid extent and the one shift of relevance to a
non-negative mass, shared by the samplers and by the allocators built beside them (patches, pruner, pages).

Notation: B images on a padded canvas of Hc x Wc token cells, N = Hc * Wc cells in flat raster order
(flat index = y * Wc + x), K the budget.
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class Selection:
    """K chosen cells per image, ordered by relevance."""

    positions: Tensor  # [B, K, 2] (y, x) cells, int64
    scores: Tensor  # [B, K] relevance at positions, descending per row

    def mask(self, hc: int, wc: int) -> Tensor:
        """The chosen cells as a boolean map `[B, hc, wc]` (e.g. to score coverage of an answer box)."""
        flat = self.positions[..., 0] * wc + self.positions[..., 1]  # [B, K]
        out = torch.zeros(flat.shape[0], hc * wc, dtype=torch.bool, device=flat.device)
        return out.scatter_(1, flat, True).view(-1, hc, wc)


def as_budget(k: object) -> int:
    """K as an int; anything else (a float, a bool, a tensor of several values) is a TypeError.

    >>> as_budget(3), as_budget(torch.tensor(4))
    (3, 4)
    """
    try:
        if isinstance(k, bool):
            raise TypeError
        return operator.index(k)
    except TypeError:
        raise TypeError(f"budget K must be an int, got {type(k).__name__}") from None


def check_budget(relevance: Tensor, k: int, valid: Tensor | None = None) -> Tensor:
    """Validate a sampler call; returns the valid mask `[B, Hc, Wc]` bool (all True for None).

    Raises:
        ValueError: bad shapes, NaN/inf in a valid cell, K < 1, or K above some image's valid-cell count.
    """
    if relevance.ndim != 3 or not relevance.is_floating_point():
        raise ValueError(
            f"relevance must be a float [B, Hc, Wc] map, got {relevance.dtype} of shape {tuple(relevance.shape)}"
        )
    k = as_budget(k)
    if valid is None:
        valid = torch.ones(relevance.shape, dtype=torch.bool, device=relevance.device)
    elif valid.shape != relevance.shape or valid.dtype != torch.bool:
        raise ValueError(
            f"valid must be bool of shape {tuple(relevance.shape)}, got {valid.dtype} {tuple(valid.shape)}"
        )
    # both value checks in one read back to the host: on a GPU each read waits for the queued work
    bad, *counts = torch.cat([(~torch.isfinite(relevance) & valid).sum().view(1),
                              valid.flatten(1).sum(1)]).tolist()  # NaN/inf count, then [B] valid cells
    if bad:
        raise ValueError(
            f"relevance has {bad} NaN/inf values in valid cells; fix the scorer or mark those cells invalid"
        )
    if k < 1:
        raise ValueError(f"budget K={k} must be at least 1")
    short = next((b for b, n in enumerate(counts) if n < k), None)
    if short is not None:
        raise ValueError(
            f"budget K={k} exceeds the {counts[short]} valid cells of image {short}; "
            "lower --saccades or raise the canvas size"
        )
    return valid


def rank_cells(key: Tensor, eligible: Tensor) -> Tensor:
    """Flat cell indices `[B, N]`: eligible cells first, then `key` descending, ties by lower flat index.

    Two stable sorts (secondary key first) give the exact deterministic order torch.topk does not promise.
    """
    order = torch.sort(key, dim=1, descending=True, stable=True).indices  # [B, N]
    demote = (~eligible).gather(1, order).to(torch.uint8)
    return order.gather(1, torch.sort(demote, dim=1, stable=True).indices)


def select_cells(relevance: Tensor, chosen: Tensor, k: int) -> Selection:
    """Turn a flat mask `[B, N]` with exactly K True per row into a relevance-ordered Selection."""
    flat_rel = relevance.flatten(1)
    idx = rank_cells(flat_rel, chosen)[:, :k]  # [B, K] flat cells
    wc = relevance.shape[2]
    return Selection(torch.stack((idx // wc, idx % wc), dim=-1), flat_rel.gather(1, idx))


def valid_extent(valid: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Bounding box of each image's valid cells: (y0, x0, h, w), each `[B]` int64."""
    rows, cols = valid.any(2).long(), valid.any(1).long()  # [B, Hc], [B, Wc]
    y0, x0 = rows.argmax(1), cols.argmax(1)
    h = valid.shape[1] - rows.flip(1).argmax(1) - y0
    w = valid.shape[2] - cols.flip(1).argmax(1) - x0
    return y0, x0, h, w


def shift_nonnegative(relevance: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
    """Relevance minus its minimum over each image's valid cells (0 on invalid cells), and each image's span.

    The one way relevance becomes a non-negative mass (stratum importances, patch sums, centroids, weights):
    a scorer's additive offset then changes nothing (logits and logits + c give the same shifted map).

    Args:
        relevance: `[B, ...]` float.
        valid: bool, the shape of `relevance`.

    Returns:
        (shifted `[B, ...]` >= 0 with 0 on invalid cells, span `[B, 1, ...]` = max - min over valid cells).

    Example:
        >>> shifted, span = shift_nonnegative(torch.tensor([[3.0, -1.0, 9.0]]), torch.tensor([[True, True, False]]))
        >>> shifted.tolist(), span.tolist()
        ([[4.0, 0.0, 0.0]], [[4.0]])
    """
    keep = (-1,) + (1,) * (relevance.ndim - 1)  # [B, 1, ...]
    lo = relevance.masked_fill(~valid, math.inf).flatten(1).amin(1).view(keep)
    hi = relevance.masked_fill(~valid, -math.inf).flatten(1).amax(1).view(keep)
    return torch.where(valid, relevance - lo, 0.0), hi - lo


def cell_coordinates(valid: Tensor) -> Tensor:
    """Cell centres `[B, N, 2]` (y, x) normalised to [0, 1] over each image's own valid extent (padding ignored)."""
    y0, x0, h, w = valid_extent(valid)
    ys = torch.arange(valid.shape[1], device=valid.device)
    xs = torch.arange(valid.shape[2], device=valid.device)
    ny = (ys[None] - y0[:, None] + 0.5) / h[:, None]  # [B, Hc]
    nx = (xs[None] - x0[:, None] + 0.5) / w[:, None]  # [B, Wc]
    b, hc, wc = valid.shape
    return torch.stack((ny[:, :, None].expand(b, hc, wc), nx[:, None, :].expand(b, hc, wc)), -1).reshape(b, -1, 2)
