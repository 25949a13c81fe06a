"""Viz: one picture of where a token budget went (saccades, relevance, tokens per region).

Drawn with matplotlib's object API on an Agg canvas, so it needs no display and touches no pyplot state.
Shapes: image [C, H, W] float in [0, 1]; relevance [Hc, Wc]; positions [K, 2] (y, x) cells; scores [K].
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from arr_coc.weights import atomic_write

FIGSIZE_IN = (18.0, 6.0)  # three square-ish panels side by side
DPI = 100  # 18 x 6 in at 100 dpi -> a 1800 x 600 px PNG (no tight bbox, so the size is fixed)
N_NUMBERED = 10  # rank labels beyond ten clutter the panel without saying more


def _grid2(name: str, value: Any) -> tuple[int, int]:
    if len(value) != 2 or any(isinstance(v, bool) or int(v) != v or v < 1 for v in value):
        raise ValueError(f"{name} must be two positive ints (rows, cols), got {value!r}")
    return int(value[0]), int(value[1])


def _region_of(n_cells: int, n_regions: int) -> Tensor:
    """Region index of each of n_cells cells along one axis; regions differ by at most one cell."""
    return torch.arange(n_cells) * n_regions // n_cells  # [n_cells]


def tokens_per_region(
    positions: Tensor | np.ndarray,
    grid_hw_cells: tuple[int, int],
    region_grid: tuple[int, int] = (8, 8),
    gestalt_tokens: int = 256,
) -> Tensor:
    """Tokens each region receives: its saccades plus its area share of the gestalt tokens.

    The cell grid is split into ``region_grid`` regions (cell row y belongs to region
    ``y * Ry // Hc``, likewise for columns). The gestalt covers the whole image at low resolution,
    so its tokens are spread over the regions in proportion to their area in cells.

    Args:
        positions: [K, 2] or [B, K, 2] (y, x) integer cells.
        grid_hw_cells: (Hc, Wc) size of the cell grid.
        region_grid: (Ry, Rx) regions; at most one region per cell along each axis.
        gestalt_tokens: tokens of the gestalt (e.g. 16 * 16 = 256).

    Returns:
        float64 [Ry, Rx] (or [B, Ry, Rx]); each map sums to K + gestalt_tokens.

    Example:
        >>> tokens_per_region(torch.tensor([[0, 0], [0, 1], [3, 3]]), (4, 4), (2, 2), gestalt_tokens=4)
        tensor([[3., 1.],
                [1., 2.]], dtype=torch.float64)
    """
    Hc, Wc = _grid2("grid_hw_cells", grid_hw_cells)
    Ry, Rx = _grid2("region_grid", region_grid)
    if Ry > Hc or Rx > Wc:
        raise ValueError(
            f"region_grid {(Ry, Rx)} is finer than the cell grid {(Hc, Wc)}; use at most one region per cell"
        )
    if isinstance(gestalt_tokens, bool) or int(gestalt_tokens) != gestalt_tokens or gestalt_tokens < 0:
        raise ValueError(f"gestalt_tokens must be a non-negative int, got {gestalt_tokens!r}")
    pos = torch.as_tensor(positions).detach().cpu()
    if pos.ndim not in (2, 3) or pos.shape[-1] != 2:
        raise ValueError(f"positions must be [K, 2] or [B, K, 2] (y, x) cells, got {tuple(pos.shape)}")
    if pos.is_floating_point() and not torch.equal(pos, pos.round()):
        raise ValueError("positions must be integer cells, got fractional values")
    pos = pos.long()
    ys, xs = pos[..., 0], pos[..., 1]  # [..., K]
    outside = (ys < 0) | (ys >= Hc) | (xs < 0) | (xs >= Wc)
    if outside.any():
        y, x = pos[outside][0].tolist()
        raise ValueError(f"position (y={y}, x={x}) is outside the {Hc} x {Wc} cell grid")
    lead = pos.shape[:-2]
    n = int(np.prod(lead))  # 1 for unbatched positions
    region = (ys * Ry // Hc) * Rx + xs * Rx // Wc  # [..., K] flat region index
    batch = torch.arange(n).view(*lead, 1) * (Ry * Rx)  # [..., 1] offsets so one bincount serves the batch
    saccades = torch.bincount((region + batch).flatten(), minlength=n * Ry * Rx).view(*lead, Ry, Rx)
    area = torch.outer(torch.bincount(_region_of(Hc, Ry)), torch.bincount(_region_of(Wc, Rx)))  # [Ry, Rx] cells
    return saccades.double() + gestalt_tokens * area.double() / (Hc * Wc)


def _numpy(name: str, x: Tensor | np.ndarray) -> np.ndarray:
    if isinstance(x, Tensor):
        return x.detach().cpu().float().numpy()
    try:
        return np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise TypeError(f"{name} must be a tensor or array, got {type(x).__name__}") from err


def plot_allocation(
    image: Tensor | np.ndarray,
    relevance: Tensor | np.ndarray,
    positions: Tensor | np.ndarray,
    scores: Tensor | np.ndarray,
    cell: int,
    path: str | Path,
    *,
    gestalt_grid: tuple[int, int] = (16, 16),
    title: str | None = None,
    region_grid: tuple[int, int] = (8, 8),
) -> Path:
    """Writes one PNG with three panels: saccades by score, relevance heat map, tokens per region.

    Args:
        image: [C, H, W] float in [0, 1], C in {1, 3}; H, W multiples of ``cell``.
        relevance: [Hc, Wc] relevance over token cells.
        positions: [K, 2] (y, x) integer cells of the saccades.
        scores: [K] score of each saccade (colours the cells; the top ones get rank numbers).
        cell: token cell size in pixels.
        path: where to write the PNG (parent folders are created).
        gestalt_grid: (rows, cols) of the gestalt; its tokens are spread over the image by area.
        title: optional figure title.
        region_grid: (Ry, Rx) regions of the tokens-per-region panel, at most one per cell (a 3 x 20 cell
            banner gets 3 x 8 regions).

    Returns:
        The path written, as a ``Path``.

    Example:
        >>> import tempfile
        >>> out = plot_allocation(torch.rand(3, 64, 96), torch.rand(2, 3), torch.tensor([[0, 1], [1, 2]]),
        ...                       torch.tensor([0.9, 0.5]), 32, Path(tempfile.mkdtemp()) / "a" / "alloc.png",
        ...                       gestalt_grid=(1, 1), region_grid=(2, 3))
        >>> out.exists(), out.suffix
        (True, '.png')
    """
    from matplotlib import patheffects
    from matplotlib.collections import PatchCollection
    from matplotlib.colors import Normalize
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    img, rel = _numpy("image", image), _numpy("relevance", relevance)
    pos, sc = _numpy("positions", positions), _numpy("scores", scores)
    if isinstance(cell, bool) or not isinstance(cell, int) or cell < 1:
        raise ValueError(f"cell must be a positive int (pixels per token cell), got {cell!r}")
    if img.ndim != 3 or img.shape[0] not in (1, 3):
        raise ValueError(f"image must be [C, H, W] with C in (1, 3), got {img.shape}")
    C, H, W = img.shape
    if H % cell or W % cell:
        raise ValueError(f"image H={H}, W={W} are not multiples of cell={cell}")
    if img.size and (np.nanmin(img) < 0 or np.nanmax(img) > 1):
        lo, hi = np.nanmin(img), np.nanmax(img)
        raise ValueError(f"image values must lie in [0, 1], got [{lo:.3g}, {hi:.3g}]; divide uint8 images by 255")
    Hc, Wc = H // cell, W // cell
    if rel.shape != (Hc, Wc):
        raise ValueError(f"relevance must be [Hc, Wc] = {(Hc, Wc)} for a {H}x{W} image at cell={cell}, got {rel.shape}")
    if pos.ndim != 2 or pos.shape[1] != 2 or sc.shape != (pos.shape[0],):
        raise ValueError(f"positions must be [K, 2] and scores [K], got {pos.shape} and {sc.shape}")
    G = int(np.prod(_grid2("gestalt_grid", gestalt_grid)))
    Ry, Rx = _grid2("region_grid", region_grid)
    Ry, Rx = min(Ry, Hc), min(Rx, Wc)  # a small image has fewer cells than regions: one region per cell
    counts = tokens_per_region(torch.from_numpy(pos), (Hc, Wc), (Ry, Rx), G).numpy()  # [Ry, Rx]; checks positions
    K = len(pos)
    pos = pos.astype(np.int64)

    fig = Figure(figsize=FIGSIZE_IN, dpi=DPI, layout="constrained")
    axes = fig.subplots(1, 3)
    extent = (0, W, H, 0)  # pixel edges, so cell (y, x) is the square [x*cell, (x+1)*cell) exactly
    shown = img.transpose(1, 2, 0) if C == 3 else img[0]
    for ax in axes:
        ax.imshow(shown, extent=extent, cmap=None if C == 3 else "gray", vmin=0, vmax=1)
        ax.set_axis_off()

    # (1) saccades: filled cells coloured by score, the best few numbered by rank
    outline = [patheffects.withStroke(linewidth=2, foreground="black")]
    if K:
        rects = [Rectangle((x * cell, y * cell), cell, cell) for y, x in pos]
        cells = PatchCollection(rects, cmap="plasma", norm=Normalize(sc.min(), sc.max()), alpha=0.5, edgecolor="face")
        cells.set_array(sc)
        axes[0].add_collection(cells)
        fig.colorbar(cells, ax=axes[0], shrink=0.8, label="saccade score")
        for rank, k in enumerate(np.argsort(-sc, kind="stable")[:N_NUMBERED], start=1):
            axes[0].text((pos[k, 1] + 0.5) * cell, (pos[k, 0] + 0.5) * cell, str(rank), color="white", fontsize=7,
                         ha="center", va="center", path_effects=outline)
    axes[0].set_title(f"{K} saccades (colour = score, top {min(K, N_NUMBERED)} numbered)")

    # (2) relevance over the image
    heat = axes[1].imshow(rel, extent=extent, cmap="inferno", alpha=0.6, interpolation="nearest")
    fig.colorbar(heat, ax=axes[1], shrink=0.8, label="relevance")
    axes[1].set_title(f"relevance ({Hc} x {Wc} cells)")

    # (3) homunculus: tokens per region, drawn on the cell grid so uneven regions keep their true borders
    row_region, col_region = _region_of(Hc, Ry).numpy(), _region_of(Wc, Rx).numpy()
    tokens = axes[2].imshow(counts[row_region][:, col_region], extent=extent, cmap="viridis", alpha=0.75,
                            interpolation="nearest")
    fig.colorbar(tokens, ax=axes[2], shrink=0.8, label="tokens")
    whole = np.allclose(counts, np.round(counts))
    for ry in range(Ry):
        for rx in range(Rx):
            cy = (np.flatnonzero(row_region == ry).mean() + 0.5) * cell
            cx = (np.flatnonzero(col_region == rx).mean() + 0.5) * cell
            axes[2].text(cx, cy, f"{counts[ry, rx]:.0f}" if whole else f"{counts[ry, rx]:.1f}", color="white",
                         fontsize=8, ha="center", va="center", path_effects=outline)
    axes[2].set_title(f"tokens per region ({Ry} x {Rx}): {K} saccades + {G} gestalt\n"
                      f"= {K + G} tokens sent; full resolution {Hc * Wc}")
    if title:
        fig.suptitle(title)

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # whole or not at all: a failed save (a full disk) never leaves a 0-byte or truncated PNG behind
    return atomic_write(path, lambda f: fig.savefig(f, format="png"))


def page_strip(images: list[Tensor], cells: list[Tensor], cell: int, height: int = 360) -> np.ndarray:
    """The pages of a context side by side, each scaled to ``height`` px, its saccade cells outlined in red.

    Args:
        images: per page [3, H, W] in [0, 1] (its canvas).
        cells: per page [k_i, 2] (y, x) saccade cells on that canvas, or [k_i, 3] (y, x, side) squares.
        cell: token cell side on the canvas, px.
        height: the strip's height, px.

    Returns:
        [height, W, 3] uint8, pages separated by 8 px of grey.

    >>> page_strip([torch.ones(3, 56, 28), torch.ones(3, 56, 56)], [torch.tensor([[0, 0]]), torch.zeros(0, 2)], 28, 56).shape
    (56, 92, 3)
    """
    from PIL import Image, ImageDraw

    tiles = []
    for image, cs in zip(images, cells):
        h, w = image.shape[-2:]
        s = height / h
        pil = Image.fromarray((image.permute(1, 2, 0).clamp(0, 1).numpy() * 255).round().astype(np.uint8))
        pil = pil.resize((max(1, round(w * s)), height), Image.LANCZOS)
        d = ImageDraw.Draw(pil)
        for y, x, *side in cs.tolist():  # a patch allocator's squares carry their side in cells
            n = side[0] if side else 1
            d.rectangle([x * cell * s, y * cell * s, (x + n) * cell * s - 1, (y + n) * cell * s - 1],
                        outline=(220, 0, 0), width=max(1, round(2 * s)))
        tiles.append(np.asarray(pil))
    gap = np.full((height, 8, 3), 128, np.uint8)
    parts = [t for tile in tiles for t in (tile, gap)][:-1]
    return np.concatenate(parts, 1)


def plot_context(images: list[Tensor], cells: list[Tensor], labels: list[str], cell: int, path: str | Path,
                 title: str = "", height: int = 360, per_row: int = 10) -> None:
    """Writes a PNG of a context's pages in rows of ``per_row``, saccades outlined, a label under each page."""
    from matplotlib.figure import Figure

    rows = [range(i, min(i + per_row, len(images))) for i in range(0, len(images), per_row)]
    fig = Figure(figsize=(min(24, 2.2 * min(per_row, len(images)) + 1), 3.2 * len(rows)), layout="constrained")
    axes = fig.subplots(len(rows), 1, squeeze=False)
    for ax, r in zip(axes[:, 0], rows):
        strip = page_strip([images[i] for i in r], [cells[i] for i in r], cell, height)
        ax.imshow(strip)
        ax.set_xticks([])
        ax.set_yticks([])
        widths = [round(images[i].shape[-1] * height / images[i].shape[-2]) for i in r]
        x = 0
        for i, w in zip(r, widths):
            ax.text(x + w / 2, height + 8, labels[i], ha="center", va="top", fontsize=8)
            x += w + 8
    if title:
        fig.suptitle(title, fontsize=10)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    atomic_write(Path(path), lambda f: fig.savefig(f, dpi=100, format="png"))
