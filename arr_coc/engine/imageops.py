"""Pixel operations every layer shares: the antialiased resize, float <-> 8-bit, squares shrunk to one cell, boxes painted.

Images are ``[..., 3, H, W]`` float in [0, 1] unless a name says ``uint8``.
"""
from __future__ import annotations

import math
from typing import Callable

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
    step = paint_step(n, size)
    if _local(values):
        return _paint_local(boxes_px, values, step, size)
    b = boxes_px.to(values)
    rows, cols = box_coverage(b[:, 0], b[:, 2], height, step), box_coverage(b[:, 1], b[:, 3], width, step)  # [N, h], [N, w]
    painted = (values[:, None, None] * rows[:, :, None] * cols[:, None, :]).amax(0)  # [h, w]
    if step > 1:
        painted = painted.repeat_interleave(step, 0)[:height].repeat_interleave(step, 1)[:, :width]
    return painted


def _local(values: Tensor) -> bool:
    """Whether boxes of these values may be painted each on its own rows and columns: a pixel no box covers holds
    0 either way only when no value is negative (nor NaN), and the loop keeps no graph."""
    return not values.requires_grad and bool(torch.isfinite(values).all()) and not bool((values < 0).any())


def _paint_local(boxes_px: Tensor, values: Tensor, step: int, size: tuple[int, int]) -> Tensor:
    """``[H, W]`` the max over boxes of ``value * outer(rows, cols)`` on blocks of ``step`` px, each box of a positive
    value computed on the blocks it covers only and spread on their pixels: the same products to the last bit,
    without the [N, h, w] product (a page's lines cover a sliver of it each; a box of value 0 paints 0)."""
    keep = (values > 0).nonzero()[:, 0]
    b = boxes_px[keep].to(values)
    rows, cols = box_coverage(b[:, 0], b[:, 2], size[0], step), box_coverage(b[:, 1], b[:, 3], size[1], step)
    out = values.new_zeros(rows.shape[1] * step, cols.shape[1] * step)
    r_on, c_on = rows > 0, cols > 0
    r0, r1 = r_on.float().argmax(1), rows.shape[1] - r_on.flip(1).float().argmax(1)  # first, after last covered
    c0, c1 = c_on.float().argmax(1), cols.shape[1] - c_on.flip(1).float().argmax(1)
    ok = r_on.any(1) & c_on.any(1)
    v = values[keep]
    for k, (a, b, c, d, on) in enumerate(zip(r0.tolist(), r1.tolist(), c0.tolist(), c1.tolist(), ok.tolist())):
        if on:
            block = v[k] * rows[k, a:b, None] * cols[k, None, c:d]
            if step > 1:
                block = block.repeat_interleave(step, 0).repeat_interleave(step, 1)
            patch = out[a * step:b * step, c * step:d * step]
            torch.maximum(patch, block, out=patch)
    return out[: size[0], : size[1]].contiguous()


def paint_step(n: int, size: tuple[int, int]) -> int:
    """The block side (px) :func:`paint_boxes` paints ``n`` boxes on at ``size``: 1 unless the [N, H, W] product
    would pass ``MAX_PAINT_ELEMENTS``.

    >>> paint_step(4, (100, 100)), paint_step(64, (1024, 1024))
    (1, 2)
    """
    return max(1, math.ceil(math.sqrt(n * size[0] * size[1] / MAX_PAINT_ELEMENTS)))


def box_coverage(lo: Tensor, hi: Tensor, length: int, step: int = 1) -> Tensor:
    """``[N, ceil(length / step)]`` the share of each block of ``step`` px (the last one cut at ``length``) that
    each span [lo, hi) covers: one axis of :func:`paint_boxes` (a box's value at a block is its value times its row
    and column coverage).

    >>> box_coverage(torch.tensor([0.5]), torch.tensor([2.0]), 3).tolist()
    [[0.5, 1.0, 0.0]]
    """
    edges = (torch.arange(0, length + step, step, device=lo.device, dtype=lo.dtype)).clamp_max(length)
    edges = edges[: math.ceil(length / step) + 1]
    overlap = torch.minimum(hi[:, None], edges[None, 1:]) - torch.maximum(lo[:, None], edges[None, :-1])
    return overlap.clamp_min(0) / (edges[1:] - edges[:-1])[None]


def paint_cells(boxes_px: Tensor, values: Tensor, size: tuple[int, int], cell: int, reduce: str = "mean",
                transform: Callable[[Tensor], Tensor] | None = None) -> Tensor:
    """``[H // cell, W // cell]`` :func:`paint_boxes` pooled to cells (``reduce``: ``"mean"`` or ``"max"`` over each
    cell's pixels, ``transform`` applied to the painted pixels first), equal to the last bit, without painting
    every pixel.

    ``max`` of non-negative values needs no pixel at all: a cell's max is each box's value times its best row
    and best column coverage in the cell (rounding is monotone), maxed over boxes. ``mean`` paints, with the same
    arithmetic, only the cells some box of a positive value touches; the others take the mean of ``transform(0)``.
    Anything else (negative or non-finite values) is painted whole.

    >>> b, v = torch.tensor([[0.0, 0.0, 2.0, 3.0]]), torch.tensor([1.0])
    >>> paint_cells(b, v, (4, 4), 2).tolist(), paint_cells(b, v, (4, 4), 2, "max").tolist()
    ([[1.0, 0.5], [0.0, 0.0]], [[1.0, 1.0], [0.0, 0.0]])
    """
    if reduce not in ("mean", "max"):
        raise ValueError(f"reduce must be 'mean' or 'max', got {reduce!r}")
    hc, wc = size[0] // cell, size[1] // cell
    n = boxes_px.shape[0]
    if n == 0 or not bool(torch.isfinite(values).all()) or bool((values < 0).any()) or \
            (reduce == "max" and transform is not None):
        painted = paint_boxes(boxes_px, values, size)[: hc * cell, : wc * cell]
        painted = painted if transform is None else transform(painted)
        pool = F.avg_pool2d if reduce == "mean" else F.max_pool2d
        return pool(painted[None, None], cell)[0, 0]
    step = paint_step(n, size)  # the blocks paint_boxes paints on (all N boxes): the same coverage to the last bit
    keep = (values > 0).nonzero()[:, 0]  # a box of value 0 paints 0, what an unpainted pixel holds
    v, b = values[keep], boxes_px[keep].to(values)
    if reduce == "max" and len(keep) == 0:
        return values.new_zeros(hc, wc)
    ys = torch.arange(hc * cell, device=values.device) // step
    xs = torch.arange(wc * cell, device=values.device) // step
    rows = box_coverage(b[:, 0], b[:, 2], size[0], step)[:, ys]  # [N, hc * cell] each pixel row's block
    cols = box_coverage(b[:, 1], b[:, 3], size[1], step)[:, xs]  # [N, wc * cell]
    if reduce == "max":
        r, c = rows.reshape(-1, hc, cell).amax(-1), cols.reshape(-1, wc, cell).amax(-1)  # [N, hc], [N, wc]
        return (v[:, None, None] * r[:, :, None] * c[:, None, :]).amax(0)
    touched = (rows.reshape(-1, hc, cell) > 0).any(-1)[:, :, None] & (cols.reshape(-1, wc, cell) > 0).any(-1)[:, None]
    zero = values.new_zeros(cell, cell)
    base = F.avg_pool2d((zero if transform is None else transform(zero))[None, None], cell)[0, 0, 0, 0]
    out = base.expand(hc, wc).clone()
    if not bool(touched.any()):
        return out
    ri, ci = touched.any(0).any(1).nonzero()[:, 0], touched.any(0).any(0).nonzero()[:, 0]  # cell rows, cols painted
    py = (ri[:, None] * cell + torch.arange(cell, device=ri.device)).reshape(-1)  # their pixel rows
    px = (ci[:, None] * cell + torch.arange(cell, device=ci.device)).reshape(-1)
    r, c = rows[:, py], cols[:, px]
    painted = v.new_zeros(len(py), len(px))
    chunk = max(1, MAX_PAINT_ELEMENTS // max(1, len(py) * len(px)))
    for lo in range(0, len(v), chunk):  # max is exact in any grouping
        painted = torch.maximum(painted, (v[lo:lo + chunk, None, None] * r[lo:lo + chunk, :, None]
                                          * c[lo:lo + chunk, None, :]).amax(0))
    painted = painted if transform is None else transform(painted)
    out[ri[:, None], ci[None, :]] = F.avg_pool2d(painted[None, None], cell)[0, 0]
    return out
