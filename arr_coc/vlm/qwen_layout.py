"""Qwen-VL token geometry: patch rows, rotary patch coordinates, window order and LLM positions of chosen cells.

Shapes: ``Hc, Wc`` token cells of an image; ``m`` the spatial merge (2); ``K`` chosen cells;
``P`` patch side (14 or 16 px); ``T`` temporal patch (2); one cell = m x m patches = one LLM token.
These are what the Qwen-VL towers and M-RoPE take precomputed (:mod:`arr_coc.vlm.qwen`); computed
for any set of cells, they place every saccade where it sits in the full-resolution image.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from arr_coc.vlm.processing import all_cells, check_options


@dataclass
class Segment:
    """Patches the tower attends over together: ``cells`` of a ``grid``, m*m patch rows per cell."""

    patches: Tensor  # [n * m * m, C * T * P * P], cell-major, (row, col) inside a cell
    cells: Tensor  # [n, 2] (y, x) cells in the segment's own grid
    grid: tuple[int, int]  # (Hc, Wc) of the image the cells come from
    sizes: Tensor | None = None  # [n] side in cells of the square each token was shrunk from (None: all 1)


def patchify(image: Tensor, patch: int, merge: int, temporal: int) -> Tensor:
    """Normalised image [C, H, W] -> Qwen patch rows [Hc * Wc * m * m, C * T * P * P].

    The row layout of the Qwen2-VL image processor: cells in raster order, the m x m patches of a
    cell together, each patch flattened as (C, T, P, P) with the still image repeated T times.
    """
    c, h, w = image.shape
    cell = patch * merge
    if h % cell or w % cell:
        raise ValueError(f"image sides must be multiples of the {cell} px cell, got {h}x{w}")
    hc, wc = h // cell, w // cell
    x = image.reshape(c, hc, merge, patch, wc, merge, patch)
    x = x.permute(1, 4, 2, 5, 0, 3, 6)  # [Hc, Wc, m, m, C, P, P]
    x = x.unsqueeze(5).expand(hc, wc, merge, merge, c, temporal, patch, patch)
    return x.reshape(hc * wc * merge * merge, c * temporal * patch * patch)


def patch_positions(cells: Tensor, merge: int, sizes: Tensor | None = None) -> Tensor:
    """Rotary (row, col) patch coordinates of each cell's m*m patches: [n, 2] -> [n * m * m, 2].

    A token shrunk from a square of ``sizes`` cells places its m*m patches at the centres of the
    parts of that square they stand for (float); size 1 gives the native integer grid.

    >>> patch_positions(torch.tensor([[1, 2]]), 2).tolist()
    [[2, 4], [2, 5], [3, 4], [3, 5]]
    >>> patch_positions(torch.tensor([[1, 2]]), 2, torch.tensor([2])).tolist()
    [[2.5, 4.5], [2.5, 6.5], [4.5, 4.5], [4.5, 6.5]]
    """
    off = all_cells(merge, merge, cells.device)  # [m*m, 2]
    if sizes is None:
        return (cells[:, None, :] * merge + off[None]).reshape(-1, 2)
    s = sizes.float().to(cells.device)[:, None, None]  # [n, 1, 1]
    return (cells[:, None, :].float() * merge + (off[None] + 0.5) * s - 0.5).reshape(-1, 2)


def window_order(cells: Tensor, grid: tuple[int, int], window: int) -> tuple[Tensor, Tensor]:
    """Qwen2.5-VL window attention for a set of cells -> (order [n], cells per non-empty window [w]).

    Windows tile the full grid in ``window`` x ``window`` cells, raster order; inside a window
    cells keep raster order -- exactly the native order when every cell is present.

    >>> order, sizes = window_order(all_cells(2, 3), (2, 3), 2)
    >>> order.tolist(), sizes.tolist()
    ([0, 1, 3, 4, 2, 5], [4, 2])
    """
    wy, wx = cells[:, 0] // window, cells[:, 1] // window
    win = wy * (grid[1] // window + 1) + wx
    order = torch.argsort(win * grid[0] * grid[1] + cells[:, 0] * grid[1] + cells[:, 1])
    return order, torch.unique_consecutive(win[order], return_counts=True)[1]


def visual_positions(gestalt: tuple[int, int] | None, cells: Tensor, grid: tuple[int, int],
                     layout: str = "scaled") -> Tensor:
    """M-RoPE (t, h, w) positions of [gestalt ; saccades] relative to the image start: [3, N] float.

    ``scaled``: saccade cell (y, x) sits at its centre in the gestalt's frame, between gestalt
    tokens. ``temporal``: the gestalt is slice t=0 and the saccades slice t=1 in full-resolution
    coordinates, as two frames of a video. Without a gestalt both are the native layout, (0, y, x).

    >>> visual_positions((2, 2), torch.tensor([[3, 0]]), (4, 4)).T.tolist()[-1]
    [0.0, 1.25, -0.25]
    >>> visual_positions(None, torch.tensor([[3, 1]]), (4, 4)).T.tolist()
    [[0.0, 3.0, 1.0]]
    """
    check_options(layout=layout)
    cells = cells.float()
    parts = []
    if gestalt is not None:
        g = all_cells(*gestalt, cells.device).float()
        parts.append(torch.cat([torch.zeros(len(g), 1, device=cells.device), g], 1))
    if gestalt is not None and layout == "scaled":
        scale = torch.tensor([gestalt[0] / grid[0], gestalt[1] / grid[1]], device=cells.device)
        yx, t = (cells + 0.5) * scale - 0.5, 0.0
    else:
        yx, t = cells, 1.0 if gestalt is not None else 0.0
    parts.append(torch.cat([torch.full((len(cells), 1), t, device=cells.device), yx], 1))
    return torch.cat(parts).T.contiguous()
