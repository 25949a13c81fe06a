"""Texture array: per-pixel channels from a registry, stacked into [B, C, H, W], pooled to token cells.

The texture is what the relevance scorers read: the channel groups named, in order, each a registry entry
(`arr_coc.engine.channel_registry`): the built-in pixel channels (`arr_coc.engine.pixel_channels`: colour,
position, structure, change, salience, free space) and the model-based ones (`arr_coc.engine.channels`).

Notation: ``[B, 3, H, W]`` pixels in [0, 1]; ``[B, C, H, W]`` texture, C = sum of the channel widths.
The scorer reads the texture averaged over token cells (``pool_to_cells``): a cell of 28 or 14 px is not a
power of two, so a mip pyramid's levels would not line up with the cells.

Example:
    >>> pixels = torch.rand(2, 3, 56, 84)
    >>> compute_texture(pixels).shape
    torch.Size([2, 13, 56, 84])
    >>> channel_layout(("rgb", "edges"))
    {'rgb': slice(0, 3, None), 'edges': slice(3, 4, None)}
"""
from __future__ import annotations

import time
from typing import Any, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from arr_coc.config import MVP_CHANNELS  # noqa: F401  (the default set, defined with the other defaults; named here too)
from arr_coc.engine import pixel_channels  # noqa: F401  (registers the built-in channels MVP_CHANNELS names)
from arr_coc.engine.cache import ImageCache
from arr_coc.engine.channel_registry import CHANNELS, ChannelSpec, PageText, TextureInputs


def _specs(channels: Sequence[str]) -> list[ChannelSpec]:
    if isinstance(channels, str):
        raise TypeError(f"channels must be a sequence of names, got the string {channels!r}; use ({channels!r},)")
    if len(channels) == 0:
        raise ValueError(f"channels is empty; pick from: {', '.join(CHANNELS.names())}")
    if len(set(channels)) != len(channels):
        raise ValueError(f"channels names a channel twice: {tuple(channels)}")
    return [CHANNELS.get(name) for name in channels]


def channel_layout(channels: Sequence[str] = MVP_CHANNELS) -> dict[str, slice]:
    """Where each named channel group sits along C of the texture.

    Example:
        >>> channel_layout(("y", "rgb"))["rgb"]
        slice(1, 4, None)
    """
    layout, start = {}, 0
    for spec in _specs(channels):
        layout[spec.name] = slice(start, start + spec.width)
        start += spec.width
    return layout


def query_channels(channels: Sequence[str]) -> tuple[str, ...]:
    """The query-coupled names among ``channels`` (computed per question, not per image).

    >>> query_channels(MVP_CHANNELS)
    ()
    """
    return tuple(spec.name for spec in _specs(channels) if spec.needs_query)


def channel_width(channels: Sequence[str] = MVP_CHANNELS) -> int:
    """Total number of channels C of a texture built from ``channels``.

    Example:
        >>> channel_width()
        13
    """
    return sum(spec.width for spec in _specs(channels))


def _check_image(x: object, name: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.ndim != 4 or x.shape[1] != 3:
        raise ValueError(f"{name} must be [B, 3, H, W] RGB, got shape {tuple(x.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be float in [0, 1], got dtype {x.dtype}; convert with x.float() / 255")
    return x


def compute_texture(pixels: Tensor, channels: Sequence[str] = MVP_CHANNELS, prev: Tensor | None = None, *,
                    queries: Sequence[str] | None = None, query_encoder: Any = None,
                    cache: ImageCache | None = None, options: Mapping[str, Mapping[str, Any]] | None = None,
                    text: Sequence[PageText | None] | None = None, timings: dict[str, float] | None = None,
                    cell: int | None = None) -> Tensor:
    """Stack the named channel groups of a batch of images into a texture.

    Args:
        pixels: ``[B, 3, H, W]`` float in [0, 1].
        channels: registered channel names, in the order they appear along C (see ``channel_layout``).
        prev: ``[B, 3, H, W]`` previous frame for ``motion``; None for still images.
        queries, query_encoder: one question per image and its encoder, for query-coupled channels.
        cache: reuse the question-free part of model-based channels across calls (one per pipeline).
        options: per-channel settings (``{"clip": {"model": PATH}}``).
        text: per image its known :class:`PageText` (or None): the text channels read it instead of OCR.
        timings: if given, each channel's milliseconds are added under ``"channel/<name>"``.
        cell: if given, each channel group is pooled to token cells as soon as it is computed
            (:func:`pool_to_cells`, the same values as pooling the whole stack: each channel is averaged on its
            own), so the full-resolution stack is never built.

    Returns:
        ``[B, C, H, W]`` texture with the dtype and device of ``pixels`` (``[B, C, H // cell, W // cell]`` with
        ``cell``).

    Example:
        >>> tex = compute_texture(torch.rand(1, 3, 28, 28), ("rgb", "eccentricity"))
        >>> tex.shape, bool(tex[0, 3, 0, 0] == 1.0)
        (torch.Size([1, 4, 28, 28]), True)
    """
    specs = _specs(channels)
    _check_image(pixels, "pixels")
    if prev is not None and _check_image(prev, "prev").shape != pixels.shape:
        raise ValueError(f"prev must match pixels {tuple(pixels.shape)}, got shape {tuple(prev.shape)}")
    if text is not None and len(text) != pixels.shape[0]:
        raise ValueError(f"got the text of {len(text)} images for {pixels.shape[0]} images")
    inputs = TextureInputs(pixels, prev, queries, query_encoder, cache if cache is not None else ImageCache(),
                           options or {}, text)
    b, _, h, w = pixels.shape
    if cell is not None and (cell < 1 or h % cell or w % cell):
        raise ValueError(f"H, W = {h}, {w} must be multiples of cell={cell}; fit the image to the canvas first")
    groups = []
    for spec in specs:  # a loop over channel groups, each batched over images and pixels
        start = time.perf_counter()
        out = spec.fn(inputs)
        if timings is not None:  # shared intermediates (grayscale, Sobel) count for the first channel using them
            key = f"channel/{spec.name}"
            timings[key] = timings.get(key, 0.0) + (time.perf_counter() - start) * 1e3
        if tuple(out.shape) != (b, spec.width, h, w):
            expected = (b, spec.width, h, w)
            raise ValueError(f"channel {spec.name!r} returned shape {tuple(out.shape)}, expected {expected}")
        out = out.to(pixels.dtype)
        groups.append(out if cell is None else pool_to_cells(out, cell))  # [B, width, H, W] or cells
    return torch.cat(groups, dim=1)  # [B, C, H, W] or [B, C, Hc, Wc]


def prepare_texture(pixels: Tensor, channels: Sequence[str], *, query_encoder: Any = None,
                    cache: ImageCache, options: Mapping[str, Mapping[str, Any]] | None = None,
                    text: Sequence[PageText | None] | None = None) -> tuple[str, ...]:
    """The per-image part of the named question-coupled channels that declare one (``prepare``), done into
    ``cache`` for ``pixels`` [B, 3, H, W] without a question; returns the channels that declare none.

    Example:
        >>> from arr_coc.engine.query import HashingQueryEncoder
        >>> prepare_texture(torch.ones(1, 3, 28, 28), ("text_match", "first_look"),
        ...                 query_encoder=HashingQueryEncoder(), cache=ImageCache())
        ('first_look',)
    """
    specs = _specs(channels)
    _check_image(pixels, "pixels")
    inputs = TextureInputs(pixels, None, None, query_encoder, cache, options or {}, text)
    for spec in specs:
        if spec.prepare is not None:
            spec.prepare(inputs)
    return tuple(spec.name for spec in specs if spec.prepare is None)


class Texture(nn.Module):
    """Module form of ``compute_texture``; it only stores the channel names (validated on construction).

    Example:
        >>> Texture(("rgb", "motion"))(torch.rand(2, 3, 8, 8)).shape
        torch.Size([2, 4, 8, 8])
    """

    def __init__(self, channels: Sequence[str] = MVP_CHANNELS) -> None:
        super().__init__()
        self.channels = tuple(channels) if not isinstance(channels, str) else channels
        self.width = channel_width(self.channels)  # fails here on an unknown name, not at the first forward

    def forward(self, pixels: Tensor, prev: Tensor | None = None) -> Tensor:
        return compute_texture(pixels, self.channels, prev)

    def extra_repr(self) -> str:
        return f"channels={self.channels}, width={self.width}"


def pool_to_cells(texture: Tensor, cell: int) -> Tensor:
    """Average the texture over token cells: ``[B, C, H, W] -> [B, C, H // cell, W // cell]``.

    Example:
        >>> pool_to_cells(torch.ones(1, 13, 56, 84), 28).shape
        torch.Size([1, 13, 2, 3])
    """
    if texture.ndim != 4:
        raise ValueError(f"texture must be [B, C, H, W], got shape {tuple(texture.shape)}")
    h, w = texture.shape[-2:]
    if cell < 1 or h % cell or w % cell:
        raise ValueError(f"H, W = {h}, {w} must be multiples of cell={cell}; fit the image to the canvas first")
    return F.avg_pool2d(texture, cell)  # [B, C, Hc, Wc]
