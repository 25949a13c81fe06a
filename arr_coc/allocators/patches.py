"""Variable-size patches: one token per size x size square of cells, what the VLM sees of them, what they cover.

The patch allocators (`arr_coc.allocators.patching`: greedy saliency squares; `arr_coc.allocators.quadtree`)
return `Patches`; `render_patches` draws one image as the VLM receives it and `patch_coverage` measures how
much of an answer each patch size saw.

Notation: B images on a padded canvas of Hc x Wc token cells, `cell` pixels per cell side, K tokens.
    boxes  [B, K, 3] (y, x, size) in cells, int64: the size x size cells whose top-left cell is (y, x);
           size 0 marks padding (an image with fewer tokens than the widest of its batch).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from arr_coc.engine.imageops import resize, shrink_squares


class BudgetTooSmallError(ValueError):
    """A patch allocator cannot start at this budget: ``minimum`` tokens is the least it can send.

    A quadtree must send its whole starting tiling before it refines anything, so below that count
    there is no allocation at all (callers skip the budget or ask for a larger one).
    """

    def __init__(self, message: str, k: int, minimum: int) -> None:
        super().__init__(message)
        self.k, self.minimum = k, minimum


@dataclass
class Patches:
    """Variable-size patches per image, one token each, ordered by score (high -> low); padding last."""

    boxes: Tensor  # [B, K, 3] (y, x, size) in cells, int64
    scores: Tensor  # [B, K] the allocator's score of each patch (0 on padding)

    @property
    def tokens(self) -> int:
        """K, the width of the batch (per-image counts in `counts` when images differ)."""
        return self.boxes.shape[1]

    @property
    def counts(self) -> Tensor:
        """Real patches per image `[B]` (rows with size > 0)."""
        return (self.boxes[..., 2] > 0).sum(1)

    def mask(self, hc: int, wc: int) -> Tensor:
        """Which patch size covers each cell, `[B, hc, wc]` int64, 0 where no patch does.

        Example:
            >>> Patches(torch.tensor([[[0, 0, 2], [1, 2, 1]]]), torch.ones(1, 2)).mask(2, 3).tolist()
            [[[2, 2, 0], [2, 2, 1]]]
        """
        y, x, s = self.boxes.unbind(-1)  # [B, K] each
        if bool(((s > 0) & ((y < 0) | (x < 0) | (y + s > hc) | (x + s > wc))).any()):
            raise ValueError(f"some box does not fit a {hc}x{wc} cell grid: {self.boxes.tolist()}")
        side = int(s.max()) if s.numel() else 0
        d = torch.arange(max(side, 1), device=s.device)
        dy, dx = d.repeat_interleave(len(d)), d.repeat(len(d))  # [S*S] offsets inside the largest box
        inside = (dy < s[..., None]) & (dx < s[..., None])  # [B, K, S*S]
        flat = torch.where(inside, (y[..., None] + dy) * wc + x[..., None] + dx, hc * wc)  # sink column hc*wc
        out = torch.zeros(s.shape[0], hc * wc + 1, dtype=torch.long, device=s.device)
        out.scatter_(1, flat.flatten(1), s[..., None].expand_as(flat).flatten(1))
        return out[:, :-1].view(-1, hc, wc)


def box_sums(x: Tensor, size: int, stride: int) -> Tensor:
    """Sums over size x size windows of `[B, C, h, w]` -> `[B, C, h', w']` (sum, not mean: exact counts)."""
    return F.avg_pool2d(x, size, stride, divisor_override=1)


def render_patches(pixels: Tensor, boxes: Tensor, cell: int, background: Tensor | None = None) -> Tensor:
    """One image `[3, H, W]` as the VLM receives it: each patch shrunk to one cell and blown up onto its area.

    A patch is resized to cell x cell px (bilinear, antialiased, as a VLM processor shrinks an image) and
    back (bilinear); 1x1 patches pass through bit-exact. Patches are pasted over `background`, e.g.
    `arr_coc.eval.reading.gestalt_view(pixels, cell, grid)` for what arr-coc sends; default black (nothing seen).

    Args:
        pixels: `[3, H, W]` float in [0, 1].
        boxes: `[K, 3]` (y, x, size) in cells, one image's `Patches.boxes[b]`; size-0 rows are skipped.
        cell: pixels per cell side.
        background: `[3, H, W]` or None.

    Example:
        >>> px = torch.rand(3, 8, 8)
        >>> out = render_patches(px, torch.tensor([[0, 0, 1], [0, 2, 2]]), 2)
        >>> torch.equal(out[:, :2, :2], px[:, :2, :2]), out[:, 4:].abs().sum().item()
        (True, 0.0)
    """
    if pixels.ndim != 3 or boxes.ndim != 2 or boxes.shape[1] != 3:
        raise ValueError(f"need pixels [3, H, W] and boxes [K, 3], got {tuple(pixels.shape)} and {tuple(boxes.shape)}")
    out = torch.zeros_like(pixels) if background is None else background.clone()
    if out.shape != pixels.shape:
        raise ValueError(f"background {tuple(out.shape)} must match pixels {tuple(pixels.shape)}")
    boxes = boxes[boxes[:, 2] > 0]
    if len(boxes) == 0:
        return out
    for (y, x, s), small in zip(boxes.tolist(), shrink_squares(pixels, boxes, cell)):
        area = (slice(None), slice(y * cell, (y + s) * cell), slice(x * cell, (x + s) * cell))
        out[area] = small if s == 1 else resize(small, (s * cell, s * cell))
    return out


def patch_coverage(boxes: Tensor, answer: Tensor) -> dict[int, Tensor]:
    """Share of the answer's cells seen at each patch size: `{size: [B]}`, size 0 = not covered by any patch.

    Args:
        boxes: `[B, K, 3]` (or one image's `[K, 3]`) (y, x, size) in cells.
        answer: `[B, Hc, Wc]` (or `[Hc, Wc]`) bool, the answer's cells. An empty answer gives 0 everywhere.

    Example:
        >>> ans = torch.zeros(4, 4, dtype=torch.bool); ans[0, :2] = True
        >>> {s: v.tolist() for s, v in patch_coverage(torch.tensor([[0, 0, 1], [2, 0, 2]]), ans).items()}
        {0: [0.5], 1: [0.5], 2: [0.0]}
    """
    boxes, answer = (boxes[None], answer[None]) if boxes.ndim == 2 else (boxes, answer)
    if boxes.ndim != 3 or answer.ndim != 3 or answer.dtype != torch.bool or len(boxes) != len(answer):
        raise ValueError(f"need boxes [B, K, 3] and a bool answer [B, Hc, Wc], got {tuple(boxes.shape)} and "
                         f"{answer.dtype} {tuple(answer.shape)}")
    size = Patches(boxes, boxes[..., 0].float()).mask(*answer.shape[1:])
    total = answer.flatten(1).sum(1).clamp_min(1)
    sizes = [0] + sorted({int(s) for s in boxes[..., 2].unique().tolist() if s > 0})
    return {s: ((size == s) & answer).flatten(1).sum(1) / total for s in sizes}
