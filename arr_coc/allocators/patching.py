"""Adaptive patching: allocators whose tokens stand for 1x, 2x, 4x ... squares of cells under a token budget.

A sampler (`arr_coc.engine.samplers`) spends one token per cell. Here one token may cover a size x size square of
cells, resized to one cell: coarse where little happens, fine where the saliency is. Two families behind one
registry (`PATCHERS`), both returning `arr_coc.allocators.patches.Patches`: `saliency_patches` here (greedy
non-overlapping squares, exactly K) and the quadtree (`arr_coc.allocators.quadtree`: hierarchical splits of a
tiling of the image, at most K). Here too are the query-blind saliency maps a patcher can read
(`edge_density`, `attention_saliency`).

Notation: B images on a padded canvas of Hc x Wc token cells, `cell` pixels per cell side, K tokens.
    boxes  [B, K, 3] (y, x, size) in cells, int64: the size x size cells whose top-left cell is (y, x).
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from kornia.color import rgb_to_grayscale
from kornia.filters import sobel
from torch import Tensor

from arr_coc.allocators.patches import BudgetTooSmallError, Patches, box_sums
from arr_coc.allocators.quadtree import quadtree_patches
from arr_coc.engine.selection import check_budget, shift_nonnegative, valid_extent
from arr_coc.registry import Registry

# A pixel is a strong edge at a normalised Sobel magnitude >= 0.05, a 10 % contrast step (a full black/white
# step gives 0.5): ink on paper and object borders pass, JPEG noise and soft shading (1-2 %) do not.
EDGE_STRENGTH = 0.05
SIZE_PRIOR = 2.0  # the registry's alpha of `saliency_patches`: best reading on validation images (tune_patches.py)

Patcher = Callable[..., "Patches"]  # (relevance [B, Hc, Wc], k, valid=None, pixels=None) -> Patches
PATCHERS: Registry[Patcher] = Registry("patcher")


# ----------------------------------------------------------------------------- saliency maps
def edge_density(pixels: Tensor, cell: int, strength: float = EDGE_STRENGTH) -> Tensor:
    """Share of strong-gradient pixels in each cell, `[B, Hc, Wc]` in [0, 1]: the classic query-blind saliency.

    Args:
        pixels: `[B, 3, H, W]` float in [0, 1], H and W multiples of `cell`.
        cell: pixels per cell side.
        strength: normalised Sobel magnitude (kornia) at which a pixel counts as an edge.

    Example:
        >>> board = ((torch.arange(8)[:, None] // 2 + torch.arange(8) // 2) % 2).float()  # 2 px squares
        >>> px = torch.zeros(1, 3, 8, 24); px[..., 16:] = board
        >>> edge_density(px, 8)[0, 0].tolist()  # flat, flat beside the board's edge, checkerboard
        [0.0, 0.109375, 0.953125]
    """
    if pixels.ndim != 4 or pixels.shape[1] != 3 or pixels.shape[2] % cell or pixels.shape[3] % cell:
        raise ValueError(f"pixels must be [B, 3, H, W] with H, W multiples of cell={cell}, got {tuple(pixels.shape)}")
    strong = (sobel(rgb_to_grayscale(pixels)) >= strength).to(pixels.dtype)  # [B, 1, H, W]
    return F.avg_pool2d(strong, cell)[:, 0]


def attention_saliency(attn: Tensor, grid: tuple[int, int]) -> Tensor:
    """Saliency `[B, gh, gw]` from a vision encoder's attention: the attention each patch token receives.

    Args:
        attn: `[B, heads, N, N]` attention weights (mean over heads and query rows of each key column) or
            `[B, N]` one row, e.g. the CLS token's. Prefix tokens (CLS, registers) come first and are
            dropped: the last gh * gw tokens are the patches in raster order.
        grid: (gh, gw) patch grid of the encoder (`F.interpolate` the result if the canvas grid differs).

    Example:
        >>> a = torch.full((1, 5), 0.1); a[0, 3] = 0.6  # CLS + 2x2 patches; patch 2 gets the attention
        >>> attention_saliency(a, (2, 2))[0].argmax().item()
        2
    """
    gh, gw = grid
    received = attn.mean(dim=(1, 2)) if attn.ndim == 4 and attn.shape[2] == attn.shape[3] else attn  # [B, N]
    if received.ndim != 2:
        raise ValueError(f"attn must be [B, heads, N, N] or [B, N], got {tuple(attn.shape)}")
    if received.shape[1] < gh * gw:
        raise ValueError(f"attn has N={received.shape[1]} tokens, fewer than the {gh}x{gw} grid's {gh * gw} patches")
    return received[:, received.shape[1] - gh * gw :].reshape(-1, gh, gw)


# ----------------------------------------------------------------------------- greedy saliency patches
def saliency_patches(
    saliency: Tensor, k: int, valid: Tensor | None = None, sizes: Sequence[int] = (1, 2, 4), size_prior: float = 1.0
) -> Patches:
    """Exactly K non-overlapping square patches, greedily by saliency mass per token.

    Candidates are the squares of every size fully inside the valid cells and aligned to their size from
    the corner of the valid extent ((y - y0) % size == 0). A candidate scores `sum(mass) / size**alpha`,
    alpha = `size_prior`, mass = saliency shifted to min 0 over valid cells. A token of side `size` sees
    size^2 cells at 1/size of the resolution per axis; alpha = 1 discounts the mass by that linear loss:
    saliency concentrated in one cell scores highest as a 1x1 patch (v > v / 2), saliency spread evenly
    highest as a large one (16 v / 4 > v). alpha = 2 ranks by mean, alpha = 0 by sum.
    Picks go highest first (ties to the larger, then upper-left patch), skipping overlaps and any patch
    that would leave fewer free cells than tokens still to place, so K always fits: size 1 must be among
    `sizes`, and a pick's score never exceeds an earlier one's. The loop runs over K, batched over images.

    Args:
        saliency: `[B, Hc, Wc]` any saliency: the pipeline's relevance, `edge_density`, `attention_saliency`.
        k: tokens per image; valid: `[B, Hc, Wc]` bool (None: all cells).
        sizes: patch sides in cells; size_prior: alpha above.

    Raises:
        ValueError: bad shapes or sizes, or K above some image's valid-cell count.

    Example:
        >>> sal = torch.zeros(1, 4, 4); sal[0, 0, 0] = 1.0; sal[0, 2:, 2:] = 0.5
        >>> saliency_patches(sal, 3).boxes[0].tolist()
        [[2, 2, 2], [0, 0, 1], [0, 2, 2]]
    """
    valid = check_budget(saliency, k, valid)
    sizes = sorted({int(s) for s in sizes}, reverse=True)  # larger first, so ties go to the larger patch
    if 1 not in sizes or min(sizes) < 1:
        raise ValueError(f"sizes must be positive ints including 1 (so exactly K patches always fit), got {sizes}")
    b, hc, wc = saliency.shape
    mass = shift_nonnegative(saliency, valid)[0][:, None]  # [B, 1, Hc, Wc]
    y0, x0, _, _ = valid_extent(valid)
    ys, xs, ss, score, ok = [], [], [], [], []
    for s in sizes:
        if s > min(hc, wc):
            continue
        gy, gx = torch.meshgrid(torch.arange(hc - s + 1), torch.arange(wc - s + 1), indexing="ij")
        gy, gx = gy.flatten().to(valid.device), gx.flatten().to(valid.device)  # [M_s] every window's corner
        inside = box_sums(valid[:, None].to(mass.dtype), s, 1).flatten(1) == s * s  # [B, M_s]
        aligned = ((gy[None] - y0[:, None]) % s == 0) & ((gx[None] - x0[:, None]) % s == 0)
        ys.append(gy), xs.append(gx), ss.append(torch.full_like(gy, s)), ok.append(inside & aligned)
        score.append(box_sums(mass, s, 1).flatten(1) / s**size_prior)
    cy, cx, cs = torch.cat(ys), torch.cat(xs), torch.cat(ss)  # [M] candidate boxes
    score, avail = torch.cat(score, 1), torch.cat(ok, 1)  # [B, M]
    free = valid.flatten(1).sum(1)  # [B] cells no pick covers yet
    rows = torch.arange(b, device=valid.device)
    picks = []
    for t in range(k):
        fits = avail & (free[:, None] - cs[None] ** 2 >= k - t - 1)  # a 1x1 always fits: free >= k - t holds
        pick = torch.where(fits, score, -math.inf).argmax(1)  # [B] first maximum, per torch.argmax's contract
        py, px, ps = cy[pick, None], cx[pick, None], cs[pick, None]  # [B, 1]
        avail &= ~((cy < py + ps) & (py < cy + cs) & (cx < px + ps) & (px < cx + cs))
        free = free - ps[:, 0] ** 2
        picks.append(pick)
    pick = torch.stack(picks, 1)  # [B, K]
    return Patches(torch.stack((cy[pick], cx[pick], cs[pick]), -1), score[rows[:, None], pick])


# ----------------------------------------------------------------------------- registry
@PATCHERS.register("saliency")
def _saliency(relevance: Tensor, k: int, valid: Tensor | None = None, pixels: Tensor | None = None,
              size_prior: float = SIZE_PRIOR) -> Patches:
    """`saliency_patches` on any saliency map (the relevance, `edge_density`): exactly K tokens of sizes 1, 2, 4."""
    return saliency_patches(relevance, k, valid, size_prior=size_prior)


@PATCHERS.register("quadtree")
def _quadtree(relevance: Tensor, k: int, valid: Tensor | None = None, pixels: Tensor | None = None) -> Patches:
    """`quadtree_patches` refined by summed relevance (query-aware): at most K tokens.

    The largest leaf grows (8, 16, 32 cells) until the starting tiling fits the budget: a small
    budget on a large page has to begin with coarser leaves.
    """
    for max_size in (8, 16, 32):
        try:
            return quadtree_patches(relevance, k, valid, criterion="relevance", max_size=max_size)
        except BudgetTooSmallError:
            continue
    return quadtree_patches(relevance, k, valid, criterion="relevance", max_size=64)
