"""Where did the saccades land? Answer-box coverage, hit rate, the IoU proxy of training, region-wise coverage.

Boxes are ``(y0, x0, y1, x1)`` in canvas pixels (``arr_coc.data.boxes.scale_boxes`` with ``Canvas.scales``); ``chosen`` is a
``[Hc, Wc]`` bool map of the full-resolution saccade cells. Areas are measured exactly: a box
covers each pixel by the fraction of the pixel inside it, and a union of boxes takes the per-pixel
maximum (exact for boxes on pixel edges, a tight lower bound otherwise).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

import torch
from torch import Tensor

from arr_coc.data.boxes import Box, box_mask




def cells_to_pixels(chosen: Tensor, cell: int) -> Tensor:
    """[Hc, Wc] bool cells -> [Hc*cell, Wc*cell] float64 pixel mask."""
    return chosen.to(torch.float64).repeat_interleave(cell, 0).repeat_interleave(cell, 1)


def covered_fraction(region: Tensor, chosen_px: Tensor) -> float:
    """Share of ``region``'s area (a fractional pixel mask) inside the chosen pixels; NaN for an empty region."""
    area = float(region.sum())
    return float((region * chosen_px).sum()) / area if area > 0 else float("nan")


@dataclass
class Coverage:
    """Per-record allocation metrics (all in [0, 1]; NaN where a region is empty)."""

    coverage: float  # share of the answer-box area inside saccade cells
    hit: float  # 1.0 when coverage >= 0.5
    iou: float  # training's proxy: IoU of the chosen cells and the cells the answer touches
    secondary: float  # coverage of the other answers of the same image (not the target)
    peripheral: float  # coverage of everything else

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def allocation_metrics(chosen: Tensor, cell: int, target: Sequence[Box], others: Sequence[Box] = (),
                       hit_threshold: float = 0.5) -> Coverage:
    """Coverage, hit, IoU proxy and region-wise coverage (does every region keep some saccades?) of one image's saccades.

    Args:
        chosen: [Hc, Wc] bool, the saccade cells (the canvas is Hc*cell x Wc*cell px).
        cell: token cell in px.
        target: the question's answer boxes, canvas px (y0, x0, y1, x1).
        others: the other answers' boxes on the same image, canvas px.

    Example:
        >>> chosen = torch.zeros(4, 4, dtype=torch.bool); chosen[0, 0] = chosen[0, 1] = True
        >>> m = allocation_metrics(chosen, 10, [(0, 0, 10, 40)], [(30, 30, 40, 40)])
        >>> m.coverage, m.hit, m.iou, m.secondary, round(m.peripheral, 4)
        (0.5, 1.0, 0.5, 0.0, 0.0)
    """
    hc, wc = chosen.shape
    height, width = hc * cell, wc * cell
    chosen_px = cells_to_pixels(chosen, cell)
    t = box_mask(target, height, width)
    o = (box_mask(others, height, width) - t).clamp(min=0)  # secondary excludes what is also the target
    rest = (1 - torch.maximum(t, o)).clamp(min=0)
    cov = covered_fraction(t, chosen_px)
    answer_cells = torch.nn.functional.avg_pool2d(t[None, None], cell)[0, 0] > 0  # [Hc, Wc]
    union = int((answer_cells | chosen).sum())
    iou = int((answer_cells & chosen).sum()) / union if union else float("nan")
    return Coverage(coverage=cov, hit=float(cov >= hit_threshold) if cov == cov else float("nan"), iou=iou,
                    secondary=covered_fraction(o, chosen_px), peripheral=covered_fraction(rest, chosen_px))
