"""Views of one allocation as RGB uint8 arrays: saccades, heat maps, texture channels, tokens per region.

Drawn with numpy and PIL (no matplotlib figure per request), so a page of views costs tens of
milliseconds and a second question on the same image stays interactive.

Shapes: image [3, H, W] float in [0, 1] (a canvas: H, W multiples of ``cell``); maps [Hc, Wc] over
token cells; positions [K, 2] (y, x) cells; boxes [K, 3] (y, x, size) squares in cells.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont
from torch import Tensor

N_NUMBERED = 20  # rank labels beyond twenty cover the page without saying more
DIM = 0.35  # cells not chosen keep 35 % of their brightness: still readable, clearly not sent
CHOSEN = (255, 196, 0)  # outline of a chosen cell (amber reads on paper and on photos)
MAX_SIDE = 800  # px; views are drawn at most this large on their long side (the page shows them smaller)


@lru_cache(maxsize=8)
def font(size: int) -> ImageFont.FreeTypeFont:
    """DejaVu Sans Bold from matplotlib's bundled fonts (the same on every machine)."""
    import matplotlib

    return ImageFont.truetype(str(Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans-Bold.ttf"), size)


def colormap(values: np.ndarray, name: str = "inferno") -> np.ndarray:
    """Values in [0, 1] (any shape) -> [..., 3] uint8 through a matplotlib colour map."""
    from matplotlib import colormaps

    return (colormaps[name](np.clip(values, 0, 1))[..., :3] * 255).astype(np.uint8)


def unit(x: np.ndarray) -> np.ndarray:
    """Min-max scale to [0, 1]; a constant map becomes 0.

    >>> unit(np.array([1.0, 3.0])).tolist(), unit(np.ones(2)).tolist()
    ([0.0, 1.0], [0.0, 0.0])
    """
    lo, hi = float(x.min()), float(x.max())
    return (x - lo) / (hi - lo) if hi > lo else np.zeros_like(x, dtype=np.float64)


def display_factor(size_hw: tuple[int, int], cell: int, max_side: int = MAX_SIDE) -> int:
    """The smallest divisor f of ``cell`` that brings the canvas within ``max_side``: cells stay whole pixels.

    >>> display_factor((1484, 980), 28), display_factor((560, 560), 28), display_factor((4000, 3000), 32)
    (2, 1, 8)
    """
    divisors = [f for f in range(1, cell + 1) if cell % f == 0]
    return next((f for f in divisors if max(size_hw) / f <= max_side), cell)


def downscale(image: Tensor, factor: int) -> Tensor:
    """[3, H, W] -> [3, H/f, W/f] by area averaging (f divides H and W)."""
    return image if factor == 1 else torch.nn.functional.avg_pool2d(image[None], factor)[0]


def upsample(values: np.ndarray, cell: int) -> np.ndarray:
    """[Hc, Wc, ...] -> [Hc*cell, Wc*cell, ...], each cell a flat square."""
    return values.repeat(cell, 0).repeat(cell, 1)


def shrink(rgb: np.ndarray | Image.Image, max_side: int = MAX_SIDE) -> Image.Image:
    """An [H, W, 3] uint8 array or a PIL image, no larger than ``max_side`` on its long side."""
    img = Image.fromarray(rgb) if isinstance(rgb, np.ndarray) else rgb.copy()
    img.thumbnail((max_side, max_side), Image.Resampling.LANCZOS)
    return img


def _as_boxes(chosen: Tensor) -> np.ndarray:
    """[K, 2] (y, x) cells or [K, 3] (y, x, size) squares -> [K, 3] int squares."""
    c = chosen.detach().cpu().long().numpy()
    return c if c.shape[1] == 3 else np.concatenate([c, np.ones((len(c), 1), np.int64)], 1)


def saccade_view(rgb: np.ndarray, chosen: Tensor, cell: int, numbered: int = N_NUMBERED) -> Image.Image:
    """The image with the chosen cells at full brightness and outlined, the rest dimmed, the first ones numbered.

    ``chosen`` are in rank order (most relevant first): [K, 2] one-cell saccades or [K, 3] squares.

    Args:
        rgb: [H, W, 3] uint8 image (``arr_coc.engine.imageops.to_hwc_uint8`` of the canvas), H, W multiples of ``cell``.

    >>> v = saccade_view(np.full((56, 84, 3), 255, np.uint8), torch.tensor([[0, 1]]), 28)
    >>> v.size, v.getpixel((0, 0)), v.getpixel((42, 14))
    ((84, 56), (89, 89, 89), (255, 255, 255))
    """
    boxes = _as_boxes(chosen)
    chosen = np.zeros(rgb.shape[:2], bool)
    for y, x, s in boxes:
        chosen[y * cell:(y + s) * cell, x * cell:(x + s) * cell] = True
    out = np.where(chosen[..., None], rgb, (rgb * DIM).astype(np.uint8))
    img = Image.fromarray(out)
    draw = ImageDraw.Draw(img)
    width = max(1, cell // 14)
    for y, x, s in boxes:
        draw.rectangle((x * cell, y * cell, (x + s) * cell - 1, (y + s) * cell - 1), outline=CHOSEN, width=width)
    f = font(max(8, cell // 2))
    for rank, (y, x, s) in enumerate(boxes[:numbered], start=1):
        draw.text(((x + s / 2) * cell, (y + s / 2) * cell), str(rank), fill="white", font=f, anchor="mm",
                  stroke_width=2, stroke_fill="black")
    return img


def heat_view(rgb: np.ndarray, values: Tensor, cell: int, alpha: float = 0.65, cmap: str = "inferno") -> Image.Image:
    """A map ``values`` over token cells [Hc, Wc] in false colour over the grey image ``rgb`` (min-max scaled per map).

    >>> heat_view(np.zeros((56, 56, 3), np.uint8), torch.tensor([[0., 1.], [2., 3.]]), 28).size
    (56, 56)
    """
    grey = rgb.mean(-1, keepdims=True, dtype=np.float32)  # [H, W, 1]
    heat = upsample(colormap(unit(values.detach().cpu().double().numpy()), cmap), cell)  # [H, W, 3]
    return Image.fromarray((alpha * heat + (1 - alpha) * grey).astype(np.uint8))


def labelled(img: Image.Image, text: str, size: int = 14) -> Image.Image:
    """``img`` with a white caption strip on top."""
    f = font(size)
    out = Image.new("RGB", (img.width, img.height + size + 8), "white")
    out.paste(img, (0, size + 8))
    ImageDraw.Draw(out).text((4, 3), text, fill="black", font=f)
    return out


def grid(tiles: Sequence[Image.Image], columns: int, pad: int = 6) -> Image.Image:
    """Tiles of equal size in rows of ``columns``."""
    w, h = tiles[0].size
    rows = (len(tiles) + columns - 1) // columns
    out = Image.new("RGB", (columns * (w + pad) - pad, rows * (h + pad) - pad), "white")
    for i, t in enumerate(tiles):
        out.paste(t, ((i % columns) * (w + pad), (i // columns) * (h + pad)))
    return out


def channels_view(cell_texture: Tensor, layout: dict[str, slice], tile: int = 220, columns: int = 4) -> Image.Image:
    """Every texture channel of ``cell_texture`` [C, Hc, Wc] over the token cells, one false-colour tile each (viridis, min-max per tile).

    ``rgb`` is shown in its own colours; multi-band groups get one tile per band.

    >>> channels_view(torch.rand(4, 5, 6), {"rgb": slice(0, 3), "edges": slice(3, 4)}).size
    (438, 202)
    """
    Hc, Wc = cell_texture.shape[-2:]
    scale = max(1, tile // max(Hc, Wc))
    tiles = []
    for name, sl in layout.items():
        block = cell_texture[sl].detach().cpu().double().numpy()  # [n, Hc, Wc]
        if name == "rgb":
            bands = [(name, (np.clip(block.transpose(1, 2, 0), 0, 1) * 255).astype(np.uint8))]
        else:
            bands = [(name if len(block) == 1 else f"{name}[{i}]", colormap(unit(b), "viridis"))
                     for i, b in enumerate(block)]
        for label, rgb in bands:
            tiles.append(labelled(Image.fromarray(upsample(rgb, scale)), label))
    return grid(tiles, min(columns, len(tiles)))


def tokens_view(rgb: np.ndarray, counts: np.ndarray, cell: int) -> Image.Image:
    """Tokens per region (:func:`arr_coc.viz.tokens_per_region`) as a heat map with the count on each region."""
    from arr_coc.viz import _region_of

    Hc, Wc = rgb.shape[0] // cell, rgb.shape[1] // cell
    rows, cols = _region_of(Hc, counts.shape[0]).numpy(), _region_of(Wc, counts.shape[1]).numpy()
    img = heat_view(rgb, torch.from_numpy(counts[rows][:, cols]), cell, alpha=0.75, cmap="viridis")
    draw, f = ImageDraw.Draw(img), font(max(10, cell // 2))
    whole = np.allclose(counts, np.round(counts))
    for ry in range(counts.shape[0]):
        for rx in range(counts.shape[1]):
            cy = (np.flatnonzero(rows == ry).mean() + 0.5) * cell
            cx = (np.flatnonzero(cols == rx).mean() + 0.5) * cell
            text = f"{counts[ry, rx]:.0f}" if whole else f"{counts[ry, rx]:.1f}"
            draw.text((cx, cy), text, fill="white", font=f, anchor="mm", stroke_width=2, stroke_fill="black")
    return img


def side_by_side(images: Sequence[Image.Image], titles: Sequence[str]) -> Image.Image:
    """Images scaled to the first one's height, captioned, in a row: the downloadable picture."""
    height = images[0].height
    scaled = [im if im.height == height else im.resize((max(1, round(im.width * height / im.height)), height))
              for im in images]
    tiles = [labelled(im, t, 18) for im, t in zip(scaled, titles)]
    out = Image.new("RGB", (sum(t.width for t in tiles) + 10 * (len(tiles) - 1), tiles[0].height), "white")
    x = 0
    for t in tiles:
        out.paste(t, (x, 0))
        x += t.width + 10
    return out
