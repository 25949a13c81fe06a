"""Views: the pixels a VLM receives for a token plan, rendered at canvas size (gestalt, foveated, downsampled).

Shapes (canvas convention, see ``arr_coc.engine.canvas``):
    pixels     [3, H, W] or [B, 3, H, W] float in [0, 1], H, W multiples of ``cell``
    positions  [K, 2] or [B, K, 2] (y, x) integer cells (saccades)

Each view has the canvas's size and lines up pixel for pixel with it, so an OCR engine (or a person
in the app) looking at it sees exactly what survives an allocation:
    ``gestalt_view``      the canvas at grid[0] x grid[1] tokens, upsampled back to H x W
    ``foveated_view``     the gestalt with every saccade cell pasted back at full resolution
    ``downsampled_view``  the field's baseline: one uniformly downsampled image within a token count
"""
from __future__ import annotations

from typing import Sequence

import torch  # noqa: F401  (the doctests use it)
from torch import Tensor

from arr_coc.budget import downsampled_grid  # noqa: F401  (the uniform baseline's grid; importable here too)
from arr_coc.engine.extract import extract_gather, paste_patches
from arr_coc.engine.imageops import resize


def _as_batch(pixels: Tensor, cell: int, fn: str) -> tuple[Tensor, bool]:
    """[3, H, W] or [B, 3, H, W] -> ([B, 3, H, W], was_single) with H, W multiples of cell."""
    if isinstance(cell, bool) or not isinstance(cell, int) or cell < 1:
        raise ValueError(f"{fn}: cell must be a positive int (pixels per token cell), got {cell!r}")
    if not isinstance(pixels, Tensor) or pixels.ndim not in (3, 4) or pixels.shape[-3] != 3:
        shape = tuple(pixels.shape) if isinstance(pixels, Tensor) else type(pixels).__name__
        raise ValueError(f"{fn}: pixels must be a [3, H, W] or [B, 3, H, W] tensor, got {shape}")
    if not pixels.is_floating_point():
        raise TypeError(f"{fn}: pixels must be float in [0, 1], got dtype {pixels.dtype}; divide uint8 by 255")
    H, W = pixels.shape[-2:]
    if H % cell or W % cell or H == 0 or W == 0:
        raise ValueError(
            f"{fn}: pixels H={H}, W={W} are not positive multiples of cell={cell}; build the canvas "
            f"with arr_coc.engine.canvas.make_canvas first"
        )
    single = pixels.ndim == 3
    return (pixels[None] if single else pixels), single


def _check_grid(grid: Sequence[int], fn: str) -> tuple[int, int]:
    if len(grid) != 2 or any(isinstance(g, bool) or int(g) != g or g < 1 for g in grid):
        raise ValueError(f"{fn}: grid must be (rows, cols) positive ints (token cells), got {grid!r}")
    return int(grid[0]), int(grid[1])


def _grid_view(x: Tensor, cell: int, grid: tuple[int, int]) -> Tensor:
    """[B, 3, H, W] -> the same size after a round trip through grid[0]*cell x grid[1]*cell px."""
    H, W = x.shape[-2:]
    small = resize(x, (grid[0] * cell, grid[1] * cell))  # [B, 3, rows*cell, cols*cell]: what the VLM sees
    out = resize(small, (H, W))  # [B, 3, H, W]; upsampling, so antialias has no effect here
    return out.clone() if out is x else out  # a view is a new image, never the caller's tensor


def gestalt_view(pixels: Tensor, cell: int, grid: Sequence[int]) -> Tensor:
    """The canvas as a VLM sees it with grid[0] x grid[1] tokens, upsampled back to canvas size.

    The canvas is resized (bilinear, antialiased) to (grid[0]*cell, grid[1]*cell) px, exactly the
    image a VLM would encode into grid[0]*grid[1] tokens, then upsampled (bilinear) to H x W so it
    lines up pixel for pixel with the canvas and with answer boxes in canvas pixels.

    Args:
        pixels: [3, H, W] or [B, 3, H, W] float in [0, 1], H, W multiples of ``cell``.
        cell: token cell side in pixels.
        grid: (rows, cols) gestalt tokens, e.g. (16, 16).

    Returns:
        Same shape as ``pixels``; equal to ``pixels`` when grid is the canvas's own cell grid.

    Example:
        >>> px = torch.rand(3, 56, 84)
        >>> v = gestalt_view(px, 28, (1, 1))  # one token: the page shrunk to 28x28 px and blown up again
        >>> tuple(v.shape), torch.equal(v, px), torch.equal(gestalt_view(px, 28, (2, 3)), px)
        ((3, 56, 84), False, True)
    """
    x, single = _as_batch(pixels, cell, "gestalt_view")
    out = _grid_view(x, cell, _check_grid(grid, "gestalt_view"))
    return out[0] if single else out


def foveated_view(pixels: Tensor, positions: Tensor, cell: int, grid: Sequence[int]) -> Tensor:
    """The gestalt view with every saccade cell pasted back at full resolution: what arr-coc sends.

    Args:
        pixels: [3, H, W] (positions [K, 2]) or [B, 3, H, W] (positions [B, K, 2]), float in [0, 1].
        positions: (y, x) integer cells of the saccades; K may be 0.
        cell: token cell side in pixels.
        grid: (rows, cols) gestalt tokens.

    Returns:
        Same shape as ``pixels``: saccade cells bit-exact from ``pixels``, the rest from ``gestalt_view``.

    Example:
        >>> px = torch.rand(3, 56, 56)
        >>> v = foveated_view(px, torch.tensor([[1, 0]]), 28, (1, 1))
        >>> torch.equal(v[:, 28:, :28], px[:, 28:, :28]), torch.equal(v[:, :28], px[:, :28])
        (True, False)
    """
    x, single = _as_batch(pixels, cell, "foveated_view")
    want = 2 if single else 3
    if not isinstance(positions, Tensor) or positions.ndim != want or positions.shape[-1] != 2:
        shape = tuple(positions.shape) if isinstance(positions, Tensor) else type(positions).__name__
        form = "[K, 2] for a [3, H, W] image" if single else "[B, K, 2] for a [B, 3, H, W] batch"
        raise ValueError(f"foveated_view: positions must be {form} (y, x) cells, got {shape}")
    pos = positions[None] if single else positions  # [B, K, 2] (y, x) cells
    gestalt = _grid_view(x, cell, _check_grid(grid, "foveated_view"))  # [B, 3, H, W]
    patches = extract_gather(x, pos, cell)  # [B, K, 3, cell, cell] full resolution
    out = paste_patches(gestalt, patches, pos, cell)  # [B, 3, H, W]
    return out[0] if single else out


def downsampled_view(pixels: Tensor, tokens: int, cell: int) -> tuple[Tensor, int]:
    """The field's baseline: the whole canvas uniformly downsampled to at most ``tokens`` tokens.

    The grid comes from ``downsampled_grid`` (canvas aspect, as many tokens as fit); the canvas is
    resized to (rows*cell, cols*cell) px, antialiased, and upsampled back to H x W.

    Args:
        pixels: [3, H, W] or [B, 3, H, W] float in [0, 1], H, W multiples of ``cell``.
        tokens: token budget (>= 1), e.g. gestalt + K of the method it is compared with.
        cell: token cell side in pixels.

    Returns:
        (view with the shape of ``pixels``, tokens_used = rows * cols <= tokens).

    Example:
        >>> view, used = downsampled_view(torch.rand(3, 280, 280), 50, 28)
        >>> tuple(view.shape), used
        ((3, 280, 280), 49)
    """
    x, single = _as_batch(pixels, cell, "downsampled_view")
    if isinstance(tokens, bool) or int(tokens) != tokens or tokens < 1:
        raise ValueError(f"downsampled_view: tokens must be a positive int, got {tokens!r}")
    rows, cols = downsampled_grid(x.shape[-2] // cell, x.shape[-1] // cell, int(tokens))
    out = _grid_view(x, cell, (rows, cols))
    return (out[0] if single else out), rows * cols
