"""Pixel operations every layer shares: the antialiased resize, float <-> 8-bit, squares shrunk to one cell, boxes painted.

Images are ``[..., 3, H, W]`` float in [0, 1] unless a name says ``uint8``.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

# Painting builds a [N, h, w] product; above this many elements the boxes are painted on blocks of step px.
MAX_PAINT_ELEMENTS = 1 << 24


def resize(x: Tensor, size: tuple[int, int], mode: str = "bilinear") -> Tensor:
    """``[..., C, H, W]`` -> ``[..., C, *size]``, antialiased, clamped to [0, 1]; the only image resize.

    Antialiasing is what a VLM processor's area-like shrink does: plain bilinear aliases thin strokes of
    text away (upsampling is unaffected by it). ``mode`` is ``"bilinear"`` (the VLMs' processors and the
    canvas) or ``"bicubic"`` (CLIP's processor). The same size passes through untouched (bit-exact, no
    copy: the antialiased kernel at scale 1 is the identity anyway). A floating dtype is kept; integer
    pixels become float32.

    >>> x = torch.rand(3, 8, 8)
    >>> resize(x, (8, 8)) is x, tuple(resize(x, (4, 2)).shape), resize(x.double(), (4, 4), "bicubic").dtype
    (True, (3, 4, 2), torch.float64)
    """
    if tuple(x.shape[-2:]) == tuple(size):
        return x
    flat = x.reshape(-1, *x.shape[-3:])  # [N, C, H, W]
    flat = flat if flat.is_floating_point() else flat.float()
    y = F.interpolate(flat, size=tuple(size), mode=mode, align_corners=False, antialias=True)
    return y.clamp_(0.0, 1.0).reshape(*x.shape[:-2], *size)  # float rounding may step past 1 by an ulp


def to_uint8(image: Tensor) -> Tensor:
    """Float in [0, 1] -> uint8 0-255 (rounded, on the CPU), same shape.

    >>> to_uint8(torch.tensor([0.0, 0.5, 1.0, 1.2]))
    tensor([  0, 128, 255, 255], dtype=torch.uint8)
    """
    return (image.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).cpu()


def to_hwc_uint8(image: Tensor):
    """``[3, H, W]`` float in [0, 1] -> ``[H, W, 3]`` uint8 numpy array, what OCR engines and PIL read."""
    return to_uint8(image).permute(1, 2, 0).contiguous().numpy()


def shrink_squares(pixels: Tensor, boxes: Tensor, cell: int) -> Tensor:
    """Each (y, x, size) square of one image `[3, H, W]` resized to one cell: `[K, 3, cell, cell]`.

    A 1x1 square is its cell's pixels untouched. What a variable-size patch token is made of, in the VLM
    adapters and in the allocators' rendering of what the VLM sees.

    Example:
        >>> px = torch.rand(3, 8, 8)
        >>> out = shrink_squares(px, torch.tensor([[0, 0, 1], [0, 2, 2]]), 2)
        >>> tuple(out.shape), torch.equal(out[0], px[:, :2, :2])
        ((2, 3, 2, 2), True)
    """
    crops = []
    for y, x, s in boxes.tolist():
        square = pixels[:, y * cell:(y + s) * cell, x * cell:(x + s) * cell]
        if square.shape[1:] != (s * cell, s * cell):
            raise ValueError(f"box (y={y}, x={x}, size={s}) leaves the {pixels.shape[1]}x{pixels.shape[2]} px image")
        crops.append(square if s == 1 else resize(square, (cell, cell)))
    return torch.stack(crops)


def paint_boxes(boxes_px: Tensor, values: Tensor, size: tuple[int, int]) -> Tensor:
    """``[H, W]`` map: each (y0, x0, y1, x1) box painted with its value, overlaps take the max, 0 elsewhere.

    Vectorised over boxes: per box a row coverage ``[N, h]`` and a column coverage ``[N, w]`` (fraction of
    each pixel, or block of ``step`` px when ``N*H*W`` exceeds ``MAX_PAINT_ELEMENTS``, inside the box); the
    map is the max over boxes of ``value * outer(rows, cols)``. Fractional edges keep sub-pixel boxes exact
    in the area average a token cell takes of them.

    Example:
        >>> paint_boxes(torch.tensor([[0., 0., 1., 2.], [0., 1., 2., 3.]]), torch.tensor([0.5, 1.0]), (2, 4)).tolist()
        [[0.5, 1.0, 1.0, 0.0], [0.0, 1.0, 1.0, 0.0]]
    """
    height, width = size
    n = boxes_px.shape[0]
    if n == 0:
        return values.new_zeros(height, width)
    step = max(1, math.ceil(math.sqrt(n * height * width / MAX_PAINT_ELEMENTS)))
    b = boxes_px.to(values)

    def coverage(lo: Tensor, hi: Tensor, length: int) -> Tensor:  # [N, ceil(length / step)]
        edges = (torch.arange(0, length + step, step, device=values.device, dtype=values.dtype)).clamp_max(length)
        edges = edges[: math.ceil(length / step) + 1]
        overlap = torch.minimum(hi[:, None], edges[None, 1:]) - torch.maximum(lo[:, None], edges[None, :-1])
        return overlap.clamp_min(0) / (edges[1:] - edges[:-1])[None]

    rows, cols = coverage(b[:, 0], b[:, 2], height), coverage(b[:, 1], b[:, 3], width)  # [N, h], [N, w]
    painted = (values[:, None, None] * rows[:, :, None] * cols[:, None, :]).amax(0)  # [h, w]
    if step > 1:
        painted = painted.repeat_interleave(step, 0)[:height].repeat_interleave(step, 1)[:, :width]
    return painted
