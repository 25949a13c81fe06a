"""Answer boxes ``(y0, x0, y1, x1)`` in pixels: clipped to their image, mapped between images, rasterised exactly."""
from __future__ import annotations

from typing import Iterable, Sequence

import torch
from torch import Tensor

Box = tuple[float, float, float, float]  # (y0, x0, y1, x1)


def clip_boxes(boxes: Iterable[Box], size: tuple[int, int]) -> tuple[Box, ...]:
    """Clip (y0, x0, y1, x1) boxes to an image of ``size=(width, height)`` and drop empty ones.

    Example:
        >>> clip_boxes([(-5, 10, 20, 900), (30, 30, 30, 40)], (640, 480))
        ((0.0, 10.0, 20.0, 640.0),)
    """
    w, h = float(size[0]), float(size[1])
    out = []
    for y0, x0, y1, x1 in boxes:
        b = (min(max(y0, 0.0), h), min(max(x0, 0.0), w), min(max(y1, 0.0), h), min(max(x1, 0.0), w))
        if b[2] > b[0] and b[3] > b[1]:
            out.append((float(b[0]), float(b[1]), float(b[2]), float(b[3])))
    return tuple(out)


def scale_boxes(boxes_px: Sequence[Box], scale_yx: tuple[float, float]) -> list[Box]:
    """Maps (y0, x0, y1, x1) boxes by (sy, sx), e.g. original pixels -> canvas pixels (``Canvas.scales``).

    Example:
        >>> scale_boxes([(10, 20, 30, 40)], (0.5, 2.0))
        [(5.0, 40.0, 15.0, 80.0)]
    """
    sy, sx = (float(s) for s in scale_yx)
    return [(y0 * sy, x0 * sx, y1 * sy, x1 * sx) for y0, x0, y1, x1 in (map(float, b) for b in boxes_px)]


def box_mask(boxes: Sequence[Box], height: int, width: int) -> Tensor:
    """Fraction of each pixel covered by the union of ``boxes`` -> [height, width] float64 in [0, 1].

    >>> box_mask([(0.5, 0, 2, 1)], 2, 2)
    tensor([[0.5000, 0.0000],
            [1.0000, 0.0000]], dtype=torch.float64)
    """
    mask = torch.zeros(height, width, dtype=torch.float64)
    for y0, x0, y1, x1 in boxes:  # a loop over boxes (tens), each touching only its own window
        r0, r1 = max(int(y0), 0), min(int(-(-y1 // 1)), height)
        c0, c1 = max(int(x0), 0), min(int(-(-x1 // 1)), width)
        if r1 <= r0 or c1 <= c0:
            continue
        rows = torch.arange(r0, r1, dtype=torch.float64)
        cols = torch.arange(c0, c1, dtype=torch.float64)
        wy = (torch.clamp(rows + 1, max=y1) - torch.clamp(rows, min=y0)).clamp(0, 1)  # [h]
        wx = (torch.clamp(cols + 1, max=x1) - torch.clamp(cols, min=x0)).clamp(0, 1)  # [w]
        window = mask[r0:r1, c0:c1]
        torch.maximum(window, wy[:, None] * wx[None, :], out=window)
    return mask
