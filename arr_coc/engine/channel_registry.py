"""Texture channel registry: what a channel reads (`TextureInputs`) and how it registers (`register_channel`).

A channel group is a function ``fn(inputs: TextureInputs) -> [B, width, H, W]``; the built-in pixel channels
(`arr_coc.engine.pixel_channels`) and the model-based ones (`arr_coc.engine.channels`) register here, and
`arr_coc.engine.texture` stacks the named groups into the texture. The shared intermediates (luma, Sobel
edges, coordinate ramps) are computed once per batch on `TextureInputs`.

Notation: ``[B, 3, H, W]`` pixels in [0, 1]; ``[B, width, H, W]`` one channel group.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, Mapping, Sequence

import torch
from kornia.color import rgb_to_grayscale
from kornia.filters import sobel
from torch import Tensor

from arr_coc.engine.cache import ImageCache
from arr_coc.registry import Registry

# A per-image value range below this counts as flat and normalises to 0 instead of stretching float noise to [0, 1].
FLAT_RANGE = 1e-4
# Inside the Sobel square root so its gradient stays finite; its root (1e-6) stays below FLAT_RANGE.
SOBEL_EPS = 1e-12

Line = tuple[str, tuple[float, float, float, float]]  # (text, (y0, x0, y1, x1) px on the image)


@dataclass(frozen=True)
class PageText:
    """What an image's text is, when it is known (a PDF's text layer, rendered text, an OCR run before):
    its words and its lines on the image, in pixels. The text channels read it instead of running OCR."""

    words: Sequence[Line] = ()
    lines: Sequence[Line] = ()


@dataclass
class TextureInputs:
    """What channels read: the pixels, an optional previous frame, and shared intermediates computed once.

    Attributes:
        pixels: ``[B, 3, H, W]`` float in [0, 1].
        prev: ``[B, 3, H, W]`` previous frame of a video, or None for a still image.
        queries: one question per image, for query-coupled channels (``needs_query``).
        query_encoder: embeds questions and any text found in the image into one space.
        cache: per-image cache for the slow, question-free part of model-based channels.
        options: per-channel settings, e.g. ``{"clip": {"model": "/path/to/clip"}}``.
        text: per image its known :class:`PageText`, or None (the text channels then read it by OCR).
    """

    pixels: Tensor
    prev: Tensor | None = None
    queries: Sequence[str] | None = None
    query_encoder: Any = None
    cache: ImageCache = field(default_factory=ImageCache)
    options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    text: Sequence[PageText | None] | None = None

    def known_text(self, i: int) -> PageText | None:
        """Image ``i``'s known text, or None."""
        return None if self.text is None else self.text[i]

    def option(self, channel: str, key: str, default: Any = None) -> Any:
        """The ``key`` setting of ``channel`` (``options[channel][key]``), or ``default``."""
        return self.options.get(channel, {}).get(key, default)

    @cached_property
    def query_emb(self) -> Tensor:
        """Question embeddings ``[B, D]`` from ``query_encoder``."""
        if self.queries is None or self.query_encoder is None:
            raise ValueError("this channel couples the question to the image: pass queries= and query_encoder=")
        if len(self.queries) != self.pixels.shape[0]:
            raise ValueError(f"got {len(self.queries)} questions for {self.pixels.shape[0]} images")
        return self.query_encoder.encode(list(self.queries)).to(self.pixels)

    @cached_property
    def gray(self) -> Tensor:
        """Luma ``[B, 1, H, W]`` (ITU-R 601 weights), shared by every structure channel."""
        return rgb_to_grayscale(self.pixels)

    @cached_property
    def sobel_magnitude(self) -> Tensor:
        """Raw Sobel gradient magnitude of the luma, ``[B, 1, H, W]``."""
        return sobel(self.gray, eps=SOBEL_EPS)

    @cached_property
    def edges(self) -> Tensor:
        """Sobel magnitude normalised per image to [0, 1], ``[B, 1, H, W]``."""
        return normalize_per_image(self.sobel_magnitude)

    @cached_property
    def coords(self) -> tuple[Tensor, Tensor]:
        """(y, x) ramps from 0 (first pixel) to 1 (last pixel), shapes ``[1, 1, H, 1]`` and ``[1, 1, 1, W]``."""
        _, _, height, width = self.pixels.shape
        y = _ramp(height, self.pixels).view(1, 1, height, 1)
        x = _ramp(width, self.pixels).view(1, 1, 1, width)
        return y, x


@dataclass(frozen=True)
class ChannelSpec:
    """One registered channel group: ``fn(inputs) -> [B, width, H, W]``."""

    name: str
    width: int
    fn: Callable[[TextureInputs], Tensor]
    differentiable: bool  # whether gradients reach the pixels (training learns through these only)
    doc: str
    needs_query: bool = False  # query-coupled: computed per question (its image part cached per image)
    # ``prepare(inputs)``: a query-coupled channel's per-image part alone, done into ``inputs.cache`` without a
    # question (what several questions about one image then share); None: the channel has none to do apart.
    prepare: Callable[[TextureInputs], None] | None = None


CHANNELS: Registry[ChannelSpec] = Registry("texture channel")


def register_channel(
    name: str, width: int = 1, differentiable: bool = True, needs_query: bool = False,
    prepare: Callable[[TextureInputs], None] | None = None,
) -> Callable[[Callable[[TextureInputs], Tensor]], Callable[[TextureInputs], Tensor]]:
    """Decorator registering ``fn(inputs: TextureInputs) -> [B, width, H, W]`` as channel group ``name``.

    The first docstring line of ``fn`` is the channel's one-line documentation (why it is there).
    ``needs_query`` marks channels that read ``inputs.queries`` / ``inputs.query_emb``; ``prepare(inputs)``, the
    per-image part of such a channel done into ``inputs.cache`` without a question (see :class:`ChannelSpec`).
    """
    if prepare is not None and not needs_query:
        raise ValueError(f"channel {name!r}: prepare is the per-image part of a question-coupled channel; "
                         f"pass needs_query=True or drop prepare")

    def add(fn: Callable[[TextureInputs], Tensor]) -> Callable[[TextureInputs], Tensor]:
        doc = fn.__doc__.strip().splitlines()[0] if fn.__doc__ else ""
        CHANNELS.register(name)(ChannelSpec(name, width, fn, differentiable, doc, needs_query, prepare))
        return fn

    return add


def normalize_per_image(x: Tensor) -> Tensor:
    """Min-max normalise each image of ``[B, C, H, W]`` to [0, 1] (over C, H, W); a flat image gives 0.

    Example:
        >>> normalize_per_image(torch.tensor([[[[1.0, 3.0]]], [[[2.0, 2.0]]]])).flatten().tolist()
        [0.0, 1.0, 0.0, 0.0]
    """
    lo = x.amin(dim=(-3, -2, -1), keepdim=True)  # [B, 1, 1, 1]
    span = x.amax(dim=(-3, -2, -1), keepdim=True) - lo
    # where() rather than a division by a tiny span: a flat map carries no structure, so it must not be stretched.
    # (the division in place on x - lo and a scalar 0: the same values without two more full-size temporaries)
    return torch.where(span > FLAT_RANGE, (x - lo).div_(span.clamp_min(FLAT_RANGE)), 0.0)


def _ramp(n: int, like: Tensor) -> Tensor:
    # A single row or column sits at the centre, not at the first edge.
    if n == 1:
        return torch.full((1,), 0.5, dtype=like.dtype, device=like.device)
    return torch.linspace(0.0, 1.0, n, dtype=like.dtype, device=like.device)
