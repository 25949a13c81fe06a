"""Quadtree patches: leaves that tile each image's valid rectangle, split where the importance is, within K tokens.

The importance of a square is extensive (it grows with area): the luma's variance or entropy over its
pixels, or its summed relevance (query-aware). Notation as in `arr_coc.allocators.patches`.
"""
from __future__ import annotations

import heapq
import operator

import torch
from kornia.color import rgb_to_grayscale
from torch import Tensor

from arr_coc.allocators.patches import BudgetTooSmallError, Patches, box_sums
from arr_coc.engine.selection import check_budget, shift_nonnegative, valid_extent

# Luma levels of the entropy criterion: enough to tell ink, paper and shading apart, few enough that a
# one-cell histogram (28 x 28 px) is not all singletons.
ENTROPY_BINS = 16


def _cell_stats(criterion: str, importance: Tensor, valid: Tensor, pixels: Tensor | None) -> Tensor:
    """Per-cell statistics `[B, F, Hc, Wc]` that add up over a square and give its importance."""
    if criterion == "relevance":
        return shift_nonnegative(importance, valid)[0][:, None]
    if pixels is None:
        raise ValueError(f"criterion {criterion!r} reads pixel luminance: pass pixels=[B, 3, H, W]")
    b, hc, wc = importance.shape
    cell = pixels.shape[-2] // hc if pixels.ndim == 4 else 0
    if pixels.ndim != 4 or pixels.shape[:2] != (b, 3) or cell == 0 or pixels.shape[2:] != (hc * cell, wc * cell):
        raise ValueError(f"pixels must be [{b}, 3, cell * {hc}, cell * {wc}], got {tuple(pixels.shape)}")
    luma = rgb_to_grayscale(pixels).double()  # [B, 1, H, W]; float64 so sum(y^2) - sum(y)^2 / n cancels cleanly
    if criterion == "variance":
        return box_sums(torch.cat((torch.ones_like(luma), luma, luma**2), 1), cell, cell)  # n, sum y, sum y^2
    level = (luma[:, 0] * ENTROPY_BINS).long().clamp(0, ENTROPY_BINS - 1)  # [B, H, W]
    cy = torch.arange(pixels.shape[2], device=luma.device)[:, None] // cell
    cx = torch.arange(pixels.shape[3], device=luma.device)[None, :] // cell
    bin_ = ((torch.arange(b, device=luma.device)[:, None, None] * hc + cy) * wc + cx) * ENTROPY_BINS + level
    hist = torch.bincount(bin_.flatten(), minlength=b * hc * wc * ENTROPY_BINS).double()
    return hist.view(b, hc, wc, ENTROPY_BINS).permute(0, 3, 1, 2)  # bincount avoids a [B, bins, H, W] one-hot


def _importance(criterion: str, sums: Tensor) -> Tensor:
    """A square's importance `[h', w']` from its summed statistics `[F, h', w']`; extensive (grows with area)."""
    if criterion == "relevance":
        return sums[0]
    if criterion == "variance":  # squared error of the square's flat approximation: n * var
        return sums[2] - sums[1] ** 2 / sums[0]
    n = sums.sum(0)  # entropy in bits per pixel times pixels: the bits to code the square's luma levels
    return -(sums * torch.log2(sums.clamp_min(1) / n)).sum(0)


def _tiling(h: int, w: int, cap: int) -> list[tuple[int, int, int]]:
    """Squares (y, x, size) tiling an h x w rectangle exactly, each aligned to its size: the largest power
    of two <= min(h, w), capped, on a grid, then the right and bottom remainders the same way."""
    if h == 0 or w == 0:
        return []
    s = min(cap, 1 << (min(h, w).bit_length() - 1))
    nh, nw = h // s, w // s
    tiles = [(i * s, j * s, s) for i in range(nh) for j in range(nw)]
    right = [(y, nw * s + x, t) for y, x, t in _tiling(nh * s, w - nw * s, cap)]
    return tiles + right + [(nh * s + y, x, t) for y, x, t in _tiling(h - nh * s, w, cap)]


def quadtree_patches(
    importance: Tensor,
    k: int,
    valid: Tensor | None = None,
    criterion: str = "variance",
    pixels: Tensor | None = None,
    max_size: int = 8,
) -> Patches:
    """Quadtree leaves that tile each valid rectangle, refined where the importance is, within K tokens.

    Start from `_tiling` of the valid extent (squares of side min(max_size, largest power of two <= the
    shorter side), smaller squares filling the borders), then repeatedly split the leaf of highest
    importance into its 4 quadrants while the count stays <= K (1x1 leaves cannot split; ties to the upper
    left). A split adds 3 tokens, so the count is start + 3m: up to 2 tokens of the budget may stay unused.
    Importance grows with area, so a large busy leaf splits before a small one:
    `"variance"` n * var(luma) over the leaf's n pixels; `"entropy"` n * entropy of the luma over
    `ENTROPY_BINS` levels (both need `pixels`, `[B, 3, H, W]`); `"relevance"` summed relevance shifted to
    min 0 (`importance`, query-aware). `max_size` (a power of two; default 8) caps a leaf: its one token is
    the square shrunk 8x per axis (224 px into one 28 px cell); coarser, a token carries little beyond the
    leaf's mean colour. Images with fewer leaves than the widest of the batch are padded with size 0.

    Raises:
        BudgetTooSmallError: K below the starting tiling's count (``err.minimum``).
        ValueError: bad shapes or criterion, a valid mask that is not one rectangle per image.

    Example:
        >>> rel = torch.zeros(1, 4, 4); rel[0, 0, 0] = 1.0
        >>> p = quadtree_patches(rel, 7, criterion="relevance")
        >>> sorted(p.boxes[0].tolist())
        [[0, 0, 1], [0, 1, 1], [0, 2, 2], [1, 0, 1], [1, 1, 1], [2, 0, 2], [2, 2, 2]]
    """
    valid, k = check_budget(importance, 1, valid), operator.index(k)  # K=1: shapes and NaNs only, K may exceed cells
    if criterion not in ("variance", "entropy", "relevance"):
        raise ValueError(f"criterion must be 'variance', 'entropy' or 'relevance', got {criterion!r}")
    if max_size < 1 or max_size & (max_size - 1):
        raise ValueError(f"max_size must be a power of two >= 1, got {max_size}")
    stats = _cell_stats(criterion, importance, valid, pixels)  # [B, F, Hc, Wc]
    boxes, scores = [], []
    for b, (y0, x0, h, w) in enumerate(zip(*(v.tolist() for v in valid_extent(valid)))):
        if int(valid[b].sum()) != h * w:
            raise ValueError(f"quadtree_patches tiles a rectangle, but image {b}'s {int(valid[b].sum())} valid cells "
                             f"do not fill their {h}x{w} extent; pass a padded-canvas mask")
        leaves = _tiling(h, w, max_size)
        if len(leaves) > k:
            raise BudgetTooSmallError(f"budget K={k} is below the {len(leaves)} starting squares of image {b}'s "
                                      f"{h}x{w} cells; raise K or max_size", k, len(leaves))
        crop = stats[b, :, y0 : y0 + h, x0 : x0 + w]
        table = {}  # size -> importance of every aligned square of that size, as nested lists for cheap lookups
        for s in (1 << i for i in range(max(t for _, _, t in leaves).bit_length())):
            table[s] = _importance(criterion, box_sums(crop[None], s, s)[0]).tolist()
        heap = [(-table[s][y // s][x // s], y, x, s) for y, x, s in leaves if s > 1]
        heapq.heapify(heap)
        done = [(y, x, s) for y, x, s in leaves if s == 1]
        count = len(leaves)
        while heap and count + 3 <= k:
            _, y, x, s = heapq.heappop(heap)
            half = s // 2
            for cy, cx in ((y, x), (y, x + half), (y + half, x), (y + half, x + half)):
                if half > 1:
                    heapq.heappush(heap, (-table[half][cy // half][cx // half], cy, cx, half))
                else:
                    done.append((cy, cx, 1))
            count += 3
        leaves = done + [(y, x, s) for _, y, x, s in heap]
        score = [table[s][y // s][x // s] for y, x, s in leaves]
        order = sorted(range(len(leaves)), key=lambda i: (-score[i], leaves[i][0], leaves[i][1]))
        boxes.append(torch.tensor([(y0 + leaves[i][0], x0 + leaves[i][1], leaves[i][2]) for i in order]))
        scores.append(torch.tensor([score[i] for i in order], dtype=importance.dtype))
    pad = torch.nn.utils.rnn.pad_sequence  # padding rows are (0, 0, 0): size 0
    return Patches(pad(boxes, batch_first=True).to(valid.device), pad(scores, batch_first=True).to(valid.device))
