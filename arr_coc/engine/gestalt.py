"""Gestalt: a cheap low-resolution encoding of the whole image (tokens on a grid + one vector).

The built-in encoder pools texture features; VLM adapters implement the same protocol with the
model's own encoder at gestalt resolution.

Shapes: B images, C feature channels, (Hc, Wc) token cells of the padded batch, (gh, gw) gestalt grid.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence, runtime_checkable

import torch
from torch import Tensor, nn


@dataclass
class Gestalt:
    tokens: Tensor  # [B, gh*gw, D] row-major over the gestalt grid
    vector: Tensor  # [B, D] summary of the whole image
    grid: tuple[int, int]  # (gh, gw)

    @property
    def num_tokens(self) -> int:
        return self.grid[0] * self.grid[1]


@runtime_checkable
class GestaltEncoder(Protocol):
    """Encodes features on token cells into a gestalt of ``grid`` tokens, per image's valid extent."""

    def __call__(self, cell_features: Tensor, extents: Sequence[tuple[int, int]], grid: tuple[int, int]) -> Gestalt: ...


def adaptive_pool_matrix(sizes: Tensor, out: int, full: int) -> Tensor:
    """Row-averaging weights that reproduce ``adaptive_avg_pool`` on the first ``sizes[b]`` of ``full`` cells.

    Bin i of an image with n cells averages cells [floor(i*n/out), ceil((i+1)*n/out)), exactly as
    torch's adaptive pooling does, so a padded batch pools each image over its own extent.

    Args:
        sizes: [B] int, the valid length of each image along this axis (1 <= size <= full).
        out: number of output bins.
        full: padded length.

    Returns:
        [B, out, full] weights; each row sums to 1.

    >>> m = adaptive_pool_matrix(torch.tensor([4]), 2, 6)
    >>> m[0]
    tensor([[0.5000, 0.5000, 0.0000, 0.0000, 0.0000, 0.0000],
            [0.0000, 0.0000, 0.5000, 0.5000, 0.0000, 0.0000]])
    """
    n = sizes.to(torch.long)[:, None, None]  # [B, 1, 1]
    i = torch.arange(out)[None, :, None]  # [1, out, 1]
    j = torch.arange(full)[None, None, :]  # [1, 1, full]
    start = torch.div(i * n, out, rounding_mode="floor")
    end = torch.div((i + 1) * n + out - 1, out, rounding_mode="floor")  # ceil
    inside = ((j >= start) & (j < end)).float()  # [B, out, full]
    return inside / inside.sum(-1, keepdim=True)


def pooled_gestalt(cell_features: Tensor, extents: Sequence[tuple[int, int]], grid: tuple[int, int]) -> Gestalt:
    """Pool cell features into a ``grid`` of gestalt tokens over each image's own (unpadded) extent.

    Args:
        cell_features: [B, C, Hc, Wc] features per token cell (e.g. the texture pooled to cells).
        extents: per image (rows, cols) of valid cells, the rest being padding.
        grid: (gh, gw) gestalt tokens; must fit every image (gh <= rows, gw <= cols).

    Returns:
        Gestalt with tokens [B, gh*gw, C] and vector [B, C] (mean over the valid cells).

    >>> g = pooled_gestalt(torch.arange(16.).view(1, 1, 4, 4), [(4, 4)], (2, 2))
    >>> g.tokens[0, :, 0]
    tensor([ 2.5000,  4.5000, 10.5000, 12.5000])
    """
    if cell_features.dim() != 4:
        raise ValueError(f"cell_features must be [B, C, Hc, Wc], got {tuple(cell_features.shape)}")
    B, C, Hc, Wc = cell_features.shape
    if len(extents) != B:
        raise ValueError(f"got {len(extents)} extents for a batch of {B}")
    gh, gw = grid
    ext = torch.tensor(extents, dtype=torch.long).view(B, 2)
    if (ext[:, 0] < gh).any() or (ext[:, 1] < gw).any() or (ext[:, 0] > Hc).any() or (ext[:, 1] > Wc).any():
        raise ValueError(f"gestalt grid {grid} must fit every image's cell extent {extents} within {(Hc, Wc)}")
    rows = adaptive_pool_matrix(ext[:, 0], gh, Hc).to(cell_features)  # [B, gh, Hc]
    cols = adaptive_pool_matrix(ext[:, 1], gw, Wc).to(cell_features)  # [B, gw, Wc]
    tokens = torch.einsum("bgh,bchw,bkw->bgkc", rows, cell_features, cols)  # [B, gh, gw, C]
    valid = (torch.arange(Hc)[None, :, None] < ext[:, 0, None, None]) & (
        torch.arange(Wc)[None, None, :] < ext[:, 1, None, None]
    )  # [B, Hc, Wc]
    w = valid.to(cell_features)[:, None]
    vector = (cell_features * w).sum((2, 3)) / w.sum((2, 3))  # [B, C]
    return Gestalt(tokens=tokens.reshape(B, gh * gw, C), vector=vector, grid=(gh, gw))


class PooledGestaltEncoder(nn.Module):
    """The built-in gestalt encoder: :func:`pooled_gestalt` as a module (no parameters)."""

    def forward(self, cell_features: Tensor, extents: Sequence[tuple[int, int]], grid: tuple[int, int]) -> Gestalt:
        return pooled_gestalt(cell_features, extents, grid)
