"""Extract: full-resolution patches (or pre-encoded features) at saccade cell positions.

Shapes used throughout this module:
    pixels     [B, C, H, W]            H, W multiples of ``cell``
    positions  [B, K, 2] (y, x) cells   cell (y, x) covers pixels [y*cell, (y+1)*cell) x [x*cell, (x+1)*cell)
    patches    [B, K, C, cell, cell]
    features   [B, Hc, Wc, D]          channels-last token grid (Hc = H // cell, Wc = W // cell)

Three pixel extractors, registered in ``EXTRACTORS``:
    ``loop``        per-patch slicing; the readable reference the tests and benchmarks check the others against.
    ``gather``      one advanced-indexing gather on a cell-grid view; exact and fast (the default).
    ``grid_sample`` bilinear sampling at float positions; differentiable w.r.t. positions and pixels.
Plus ``slice_features`` (gather from an already encoded grid) and ``paste_patches`` (the inverse of
``extract_gather``, used to render what the VLM sees).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from arr_coc.registry import Registry

Extractor = Callable[[Tensor, Tensor, int], Tensor]
EXTRACTORS: Registry[Extractor] = Registry("extractor")

_MODES = ("bilinear", "nearest", "bicubic")
_PADDING_MODES = ("border", "zeros", "reflection")


# ----------------------------------------------------------------------------- boundary checks
def _check_cell(cell: int) -> None:
    if isinstance(cell, bool) or not isinstance(cell, int) or cell < 1:
        raise ValueError(f"cell must be a positive int (pixels per token cell), got {cell!r}")


def _check_pixels(pixels: Tensor, cell: int) -> tuple[int, int]:
    """Validates [B, C, H, W] with H, W multiples of cell; returns (Hc, Wc)."""
    _check_cell(cell)
    if not isinstance(pixels, Tensor) or pixels.ndim != 4:
        shape = tuple(pixels.shape) if isinstance(pixels, Tensor) else type(pixels).__name__
        raise ValueError(f"pixels must be a [B, C, H, W] tensor, got {shape}")
    H, W = pixels.shape[-2:]
    if H % cell or W % cell:
        raise ValueError(
            f"pixels H={H}, W={W} are not multiples of cell={cell}; resize or pad the image to a "
            f"multiple of the cell first (e.g. {-(-H // cell) * cell}x{-(-W // cell) * cell})"
        )
    return H // cell, W // cell


def _check_positions(positions: Tensor, batch: int, what: str) -> None:
    if not isinstance(positions, Tensor) or positions.ndim != 3 or positions.shape[-1] != 2:
        shape = tuple(positions.shape) if isinstance(positions, Tensor) else type(positions).__name__
        raise ValueError(f"positions must be a [B, K, 2] (y, x) cells tensor, got {shape}")
    if positions.shape[0] != batch:
        raise ValueError(
            f"batch mismatch: positions has B={positions.shape[0]} but {what} has B={batch}"
        )
    if positions.dtype == torch.bool or positions.is_complex():
        raise TypeError(f"positions must be an integer or float tensor, got dtype {positions.dtype}")


def _cell_indices(positions: Tensor, Hc: int, Wc: int, fn: str) -> tuple[Tensor, Tensor]:
    """Integer (y, x) index tensors [B, K] from positions, or a ValueError naming the bad cell."""
    if positions.is_floating_point():
        bad = positions != positions.round()  # NaN compares unequal, so it is caught here too
        if bad.any():
            b, k, _ = (int(i) for i in bad.nonzero()[0])
            y, x = positions[b, k].tolist()
            raise ValueError(
                f"{fn} needs integer cell positions, got (y={y}, x={x}) at batch {b}, saccade {k}; "
                f"round them, or use extract_grid_sample for sub-cell positions"
            )
    pos = positions.long()  # [B, K, 2] (y, x) cells
    ys, xs = pos[..., 0], pos[..., 1]
    outside = (ys < 0) | (ys >= Hc) | (xs < 0) | (xs >= Wc)
    if outside.any():
        b, k = (int(i) for i in outside.nonzero()[0])
        raise ValueError(
            f"{fn}: position out of bounds at batch {b}, saccade {k}: cell (y={int(ys[b, k])}, "
            f"x={int(xs[b, k])}) but the grid is Hc={Hc} x Wc={Wc} cells "
            f"(y in [0, {Hc - 1}], x in [0, {Wc - 1}])"
        )
    return ys, xs


def _cell_grid(pixels: Tensor, cell: int) -> Tensor:
    """View [B, C, H, W] as [B, Hc, Wc, C, cell, cell] (no copy when pixels' strides allow it)."""
    B, C, H, W = pixels.shape
    grid = pixels.reshape(B, C, H // cell, cell, W // cell, cell)  # [B, C, Hc, cell, Wc, cell]
    return grid.permute(0, 2, 4, 1, 3, 5)  # [B, Hc, Wc, C, cell, cell]


def _row_index(shape: torch.Size, cell: int, ys: Tensor, xs: Tensor) -> Tensor:
    """Flat indices into ``pixels.view(-1, cell)`` (rows of one patch row each) for all patches.

    A contiguous image splits into runs of ``cell`` pixels; each patch is C * cell such runs.
    ``index_select`` over these runs copies whole runs, several times faster than element-wise
    advanced indexing on the permuted cell-grid view.
    """
    B, C, H, W = shape
    Wc = W // cell
    b = torch.arange(B, device=ys.device)[:, None]  # [B, 1]
    rows = (b * C * H + ys * cell)[:, :, None, None]  # [B, K, 1, 1] image row of each patch top, channel 0
    rows = rows + (torch.arange(C, device=ys.device) * H)[:, None] + torch.arange(cell, device=ys.device)
    return (rows * Wc + xs[:, :, None, None]).reshape(-1)  # [B*K*C*cell]


# ----------------------------------------------------------------------------- pixel extractors
@EXTRACTORS.register("loop")
def extract_loop(pixels: Tensor, positions: Tensor, cell: int) -> Tensor:
    """Crops one cell per saccade with a Python loop: the readable reference for the other methods.

    Args:
        pixels: [B, C, H, W] with H, W multiples of ``cell``.
        positions: [B, K, 2] (y, x) integer cells (integral floats are accepted).
        cell: token cell size in pixels.

    Returns:
        [B, K, C, cell, cell] patches; patch k of image b is
        ``pixels[b, :, y*cell:(y+1)*cell, x*cell:(x+1)*cell]``.

    Example:
        >>> px = torch.arange(16.).view(1, 1, 4, 4)
        >>> extract_loop(px, torch.tensor([[[1, 0]]]), cell=2)[0, 0, 0]
        tensor([[ 8.,  9.],
                [12., 13.]])
    """
    Hc, Wc = _check_pixels(pixels, cell)
    _check_positions(positions, pixels.shape[0], "pixels")
    ys, xs = _cell_indices(positions, Hc, Wc, "extract_loop")
    B, K = ys.shape
    if K == 0:
        return pixels.new_empty(B, 0, pixels.shape[1], cell, cell)
    out = []
    for b in range(B):
        crops = []
        for k in range(K):
            y, x = int(ys[b, k]), int(xs[b, k])
            crops.append(pixels[b, :, y * cell : (y + 1) * cell, x * cell : (x + 1) * cell])
        out.append(torch.stack(crops))  # [K, C, cell, cell]
    return torch.stack(out)  # [B, K, C, cell, cell]


@EXTRACTORS.register("gather")
def extract_gather(pixels: Tensor, positions: Tensor, cell: int, *, in_bounds: bool = False) -> Tensor:
    """Crops one cell per saccade in a single batched gather; exact and equal to ``extract_loop``.

    A contiguous image is read as runs of ``cell`` pixels and the C * cell runs of every patch
    are copied with one ``index_select``; other strides index a [B, Hc, Wc, C, cell, cell] view
    of the image. Either way only the K patches are copied, never the whole image.
    Differentiable w.r.t. ``pixels`` (not positions: they are indices).

    Args:
        pixels: [B, C, H, W] with H, W multiples of ``cell``; any strides.
        positions: [B, K, 2] (y, x) integer cells (integral floats are accepted).
        cell: token cell size in pixels.
        in_bounds: the positions are integer cells inside the grid already (a sampler's, by its contract): the
            value checks are skipped, so a GPU is never made to wait for the host (each check reads a tensor
            back); shapes are still checked.

    Returns:
        [B, K, C, cell, cell] patches.

    Raises:
        ValueError: bad shapes, non-integer positions, or a position outside the cell grid (unless ``in_bounds``).

    Example:
        >>> px = torch.arange(16.).view(1, 1, 4, 4)
        >>> extract_gather(px, torch.tensor([[[1, 0], [0, 1]]]), cell=2)[0, :, 0]
        tensor([[[ 8.,  9.],
                 [12., 13.]],
        <BLANKLINE>
                [[ 2.,  3.],
                 [ 6.,  7.]]])
    """
    Hc, Wc = _check_pixels(pixels, cell)
    _check_positions(positions, pixels.shape[0], "pixels")
    if in_bounds:
        ys, xs = positions[..., 0].long(), positions[..., 1].long()  # [B, K] each
    else:
        ys, xs = _cell_indices(positions, Hc, Wc, "extract_gather")  # [B, K] each
    ys, xs = ys.to(pixels.device), xs.to(pixels.device)
    B, K = ys.shape
    if pixels.is_contiguous():
        runs = pixels.view(-1, cell).index_select(0, _row_index(pixels.shape, cell, ys, xs))
        return runs.view(B, K, pixels.shape[1], cell, cell)  # [B, K, C, cell, cell]
    # Any other strides: index the cell-grid view directly rather than copying the whole image.
    b = torch.arange(B, device=pixels.device)[:, None]  # [B, 1] broadcasts over K
    return _cell_grid(pixels, cell)[b, ys, xs]  # [B, K, C, cell, cell]


@EXTRACTORS.register("grid_sample")
def extract_grid_sample(
    pixels: Tensor,
    positions: Tensor,
    cell: int,
    *,
    mode: str = "bilinear",
    padding_mode: str = "border",
) -> Tensor:
    """Samples a cell-sized patch at float cell positions; differentiable w.r.t. positions and pixels.

    Patch k samples the ``cell x cell`` pixel centres of the square whose top-left corner is
    ``positions[b, k] * cell`` pixels, with ``F.grid_sample(align_corners=False)``. At integer
    positions every sample lands on a pixel centre, so the result equals ``extract_gather`` up to
    float rounding (about H * 1e-7 px of sampling offset in float32). Between integers, bilinear
    interpolation blurs slightly; that is the price of a gradient w.r.t. where to look.

    Positions may lie partly or wholly outside the image; ``padding_mode`` says what is read there:
    ``"border"`` (default) repeats the edge pixels, so a patch sliding off the image keeps seeing
    the image edge rather than black; ``"zeros"`` reads 0; ``"reflection"`` mirrors the image.
    ``"border"`` gives zero gradient w.r.t. a coordinate that is clamped to the edge.

    Args:
        pixels: [B, C, H, W] float, H, W multiples of ``cell``.
        positions: [B, K, 2] (y, x) cells, float (sub-cell) or integer.
        cell: token cell size in pixels.
        mode: ``"bilinear"`` (differentiable w.r.t. positions), ``"nearest"`` or ``"bicubic"``.
        padding_mode: ``"border"``, ``"zeros"`` or ``"reflection"`` (see above).

    Returns:
        [B, K, C, cell, cell] patches in ``pixels.dtype``.

    Example:
        >>> px = torch.arange(16.).view(1, 1, 4, 4)
        >>> extract_grid_sample(px, torch.tensor([[[0.5, 0.0]]]), cell=2)[0, 0, 0]
        tensor([[4., 5.],
                [8., 9.]])
    """
    _check_pixels(pixels, cell)
    _check_positions(positions, pixels.shape[0], "pixels")
    if not pixels.is_floating_point():
        raise TypeError(f"extract_grid_sample needs float pixels, got dtype {pixels.dtype}")
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
    if padding_mode not in _PADDING_MODES:
        raise ValueError(f"padding_mode must be one of {_PADDING_MODES}, got {padding_mode!r}")
    B, C, H, W = pixels.shape
    K = positions.shape[1]
    pos = positions.to(device=pixels.device, dtype=pixels.dtype)  # [B, K, 2] (y, x) cells
    centres = torch.arange(cell, device=pixels.device, dtype=pixels.dtype) + 0.5  # [cell] px
    py = pos[..., 0, None] * cell + centres  # [B, K, cell] pixel-centre rows, px
    px = pos[..., 1, None] * cell + centres  # [B, K, cell] pixel-centre cols, px
    # align_corners=False: normalised -1 / +1 are the outer edges of the image, pixel i's centre is i + 0.5
    gy = (2 * py - H) / H  # [B, K, cell]
    gx = (2 * px - W) / W  # [B, K, cell]
    grid = torch.stack(
        (gx[:, :, None, :].expand(B, K, cell, cell), gy[:, :, :, None].expand(B, K, cell, cell)),
        dim=-1,
    )  # [B, K, cell, cell, 2] (x, y) as grid_sample wants
    # All K patches stacked along the output height: one grid_sample call, no copy of the image per patch.
    out = F.grid_sample(
        pixels, grid.reshape(B, K * cell, cell, 2), mode=mode, padding_mode=padding_mode, align_corners=False
    )  # [B, C, K*cell, cell]
    return out.view(B, C, K, cell, cell).permute(0, 2, 1, 3, 4).contiguous()  # [B, K, C, cell, cell]


# ----------------------------------------------------------------------------- features and pasting
def slice_features(features: Tensor, positions: Tensor) -> Tensor:
    """Gathers pre-encoded token features at cell positions (encode once, slice many).

    Args:
        features: [B, Hc, Wc, D] channels-last token grid, e.g. a VLM's merged tokens reshaped.
        positions: [B, K, 2] (y, x) integer cells on that grid.

    Returns:
        [B, K, D] features, differentiable w.r.t. ``features``.

    Example:
        >>> f = torch.arange(12.).view(1, 2, 3, 2)  # Hc=2, Wc=3, D=2
        >>> slice_features(f, torch.tensor([[[1, 2], [0, 0]]]))
        tensor([[[10., 11.],
                 [ 0.,  1.]]])
    """
    if not isinstance(features, Tensor) or features.ndim != 4:
        shape = tuple(features.shape) if isinstance(features, Tensor) else type(features).__name__
        raise ValueError(f"features must be a [B, Hc, Wc, D] channels-last tensor, got {shape}")
    _check_positions(positions, features.shape[0], "features")
    ys, xs = _cell_indices(positions, features.shape[1], features.shape[2], "slice_features")
    b = torch.arange(features.shape[0], device=features.device)[:, None]  # [B, 1]
    return features[b, ys.to(features.device), xs.to(features.device)]  # [B, K, D]


def paste_patches(canvas: Tensor, patches: Tensor, positions: Tensor, cell: int) -> Tensor:
    """Writes patches into a copy of ``canvas`` at their cells; the inverse of ``extract_gather``.

    Used to render the foveated view: an upsampled gestalt with each saccade cell at full
    resolution. ``canvas`` is not modified. If a cell appears twice in one image, which of its
    patches lands there is unspecified (samplers return distinct cells).

    Args:
        canvas: [B, C, H, W], H, W multiples of ``cell``.
        patches: [B, K, C, cell, cell], same dtype as ``canvas``.
        positions: [B, K, 2] (y, x) integer cells.
        cell: token cell size in pixels.

    Returns:
        [B, C, H, W] new contiguous tensor; differentiable w.r.t. canvas and patches.

    Example:
        >>> out = paste_patches(torch.zeros(1, 1, 4, 4), torch.ones(1, 1, 1, 2, 2), torch.tensor([[[0, 1]]]), 2)
        >>> out[0, 0]
        tensor([[0., 0., 1., 1.],
                [0., 0., 1., 1.],
                [0., 0., 0., 0.],
                [0., 0., 0., 0.]])
    """
    Hc, Wc = _check_pixels(canvas, cell)
    _check_positions(positions, canvas.shape[0], "canvas")
    B, C = canvas.shape[:2]
    K = positions.shape[1]
    if not isinstance(patches, Tensor) or tuple(patches.shape) != (B, K, C, cell, cell):
        shape = tuple(patches.shape) if isinstance(patches, Tensor) else type(patches).__name__
        raise ValueError(f"patches must be [B, K, C, cell, cell] = {(B, K, C, cell, cell)}, got {shape}")
    if patches.dtype != canvas.dtype:
        raise TypeError(f"patches dtype {patches.dtype} differs from canvas dtype {canvas.dtype}; cast one")
    ys, xs = _cell_indices(positions, Hc, Wc, "paste_patches")  # [B, K] each
    ys, xs = ys.to(canvas.device), xs.to(canvas.device)
    out = canvas.clone(memory_format=torch.contiguous_format)  # contiguous, so view(-1, cell) aliases it
    runs = patches.to(canvas.device).reshape(-1, cell)  # [B*K*C*cell, cell] in _row_index order
    out.view(-1, cell).index_copy_(0, _row_index(canvas.shape, cell, ys, xs), runs)
    return out
