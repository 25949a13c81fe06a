"""Texture array: per-pixel channels from a registry, stacked into [B, C, H, W], pooled to token cells.

The texture is what the relevance scorers read: colour, position, structure (edges, high/low-pass),
change (motion), bottom-up salience and free space (distance to edges), one channel group per registry
entry. Every built-in channel lies in [0, 1] and is computed for the whole batch at once.

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

import math
import time
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.nn.functional as F
from kornia.color import rgb_to_grayscale
from kornia.filters import box_blur, gaussian_blur2d, laplacian, sobel
from torch import Tensor, nn

from arr_coc.config import MVP_CHANNELS  # noqa: F401  (the default set, defined with the other defaults; named here too)
from arr_coc.engine.cache import ImageCache
from arr_coc.registry import Registry

# A per-image value range below this counts as flat and normalises to 0 instead of stretching float noise to [0, 1].
FLAT_RANGE = 1e-4
# Inside the Sobel square root so its gradient stays finite; its root (1e-6) stays below FLAT_RANGE.
SOBEL_EPS = 1e-12
# Low-pass scale: sigma 2 px removes pixel-level texture and keeps regions; kernel covers +-2 sigma.
LOWPASS_KERNEL, LOWPASS_SIGMA = 9, 2.0
# Hou & Zhang (2007) and OpenCV compute spectral residual at 64 px: the scale of proto-objects on a page or scene.
SALIENCY_WIDTH = 64
# Amplitude floor of the ortho-normalised spectrum, about 8-bit quantisation noise (1/255/sqrt(12)): the residual
# whitens the spectrum, and without a floor it would blow float noise up into a salient pattern.
SALIENCY_EPS = 1e-3
# Smoothing of the squared reconstruction at 64 px, close to the radius-3 disk of Hou & Zhang's code.
SALIENCY_KERNEL, SALIENCY_SIGMA = 7, 2.0
# A pixel is a "strong" edge for the distance field at >= 25 % of its image's strongest edge.
EDGE_THRESHOLD = 0.25
# The exact distance transform costs O(h * w * max(h, w)) memory per image; 128 px keeps it to ~8 MB per image at
# 1024 px input, and the relevance stage reads the field at token-cell resolution (28-32 px) anyway.
DISTANCE_MAX_SIDE = 128


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


CHANNELS: Registry[ChannelSpec] = Registry("texture channel")


def register_channel(
    name: str, width: int = 1, differentiable: bool = True, needs_query: bool = False
) -> Callable[[Callable[[TextureInputs], Tensor]], Callable[[TextureInputs], Tensor]]:
    """Decorator registering ``fn(inputs: TextureInputs) -> [B, width, H, W]`` as channel group ``name``.

    The first docstring line of ``fn`` is the channel's one-line documentation (why it is there).
    ``needs_query`` marks channels that read ``inputs.queries`` / ``inputs.query_emb``.
    """

    def add(fn: Callable[[TextureInputs], Tensor]) -> Callable[[TextureInputs], Tensor]:
        doc = fn.__doc__.strip().splitlines()[0] if fn.__doc__ else ""
        CHANNELS.register(name)(ChannelSpec(name, width, fn, differentiable, doc, needs_query))
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
    return torch.where(span > FLAT_RANGE, (x - lo) / span.clamp_min(FLAT_RANGE), torch.zeros_like(x))


def _ramp(n: int, like: Tensor) -> Tensor:
    # A single row or column sits at the centre, not at the first edge.
    if n == 1:
        return torch.full((1,), 0.5, dtype=like.dtype, device=like.device)
    return torch.linspace(0.0, 1.0, n, dtype=like.dtype, device=like.device)


def _full_size(inputs: TextureInputs, x: Tensor) -> Tensor:
    b, _, h, w = inputs.pixels.shape
    return x.expand(b, x.shape[1], h, w)


@register_channel("rgb", width=3)
def _rgb(inputs: TextureInputs) -> Tensor:
    """Colour itself: what the content looks like, for the scorers and for query-colour coupling."""
    return inputs.pixels


@register_channel("y", differentiable=False)
def _y(inputs: TextureInputs) -> Tensor:
    """Row position 0 (top) .. 1 (bottom): lets scorers learn layout priors (headers, footers)."""
    return _full_size(inputs, inputs.coords[0])


@register_channel("x", differentiable=False)
def _x(inputs: TextureInputs) -> Tensor:
    """Column position 0 (left) .. 1 (right): reading-order and margin priors."""
    return _full_size(inputs, inputs.coords[1])


@register_channel("eccentricity", differentiable=False)
def _eccentricity(inputs: TextureInputs) -> Tensor:
    """Distance from the image centre, 0 at the centre and 1 at the corners: the foveal centre bias."""
    y, x = inputs.coords
    ecc = torch.sqrt((2 * y - 1) ** 2 + (2 * x - 1) ** 2) / math.sqrt(2.0)  # [1, 1, H, W]
    return _full_size(inputs, ecc)


@register_channel("edges")
def _edges(inputs: TextureInputs) -> Tensor:
    """Sobel gradient magnitude of the luma, normalised per image: where information (strokes, contours) is."""
    return inputs.edges


@register_channel("edges_inv")
def _edges_inv(inputs: TextureInputs) -> Tensor:
    """1 - edges: empty space, so a scorer can down-weight blank margins without learning a negative weight."""
    return 1.0 - inputs.edges


@register_channel("highpass")
def _highpass(inputs: TextureInputs) -> Tensor:
    """Absolute Laplacian of the luma, normalised per image: fine detail such as small text that needs full res."""
    return normalize_per_image(laplacian(inputs.gray, 3, border_type="replicate").abs())


@register_channel("lowpass")
def _lowpass(inputs: TextureInputs) -> Tensor:
    """Gaussian-blurred luma (sigma 2 px): coarse region layout, which the gestalt view already resolves."""
    kernel, sigma = (LOWPASS_KERNEL, LOWPASS_KERNEL), (LOWPASS_SIGMA, LOWPASS_SIGMA)
    return gaussian_blur2d(inputs.gray, kernel, sigma, border_type="replicate")


@register_channel("motion")
def _motion(inputs: TextureInputs) -> Tensor:
    """|luma - previous luma|, zeros for a still image: change draws the eye in video."""
    if inputs.prev is None:
        return torch.zeros_like(inputs.gray)
    return (inputs.gray - rgb_to_grayscale(inputs.prev)).abs()


@register_channel("saliency")
def _saliency(inputs: TextureInputs) -> Tensor:
    """Spectral residual saliency (Hou & Zhang 2007), normalised per image: bottom-up pop-out, query-free."""
    gray = inputs.gray
    _, _, height, width = gray.shape
    small_w = min(width, SALIENCY_WIDTH)
    small_h = max(1, round(height * small_w / width))
    small = F.interpolate(gray, size=(small_h, small_w), mode="area")  # [B, 1, h, w]
    if small.element_size() < 4:
        small = small.float()  # FFTs need float32 or float64; compute_texture casts the result back
    spectrum = torch.fft.fft2(small, norm="ortho")  # [B, 1, h, w] complex
    log_amp = torch.log(spectrum.abs() + SALIENCY_EPS)
    # spectrum * exp(-box(L)) == exp(L - box(L)) * e^{i phase} * A / (A + eps): the residual with the original
    # phase, without computing the phase (whose gradient is undefined at zero amplitude). The spectrum is
    # periodic, hence circular padding for the 3x3 box.
    whitened = spectrum * torch.exp(-box_blur(log_amp, (3, 3), border_type="circular"))
    recon = torch.fft.ifft2(whitened, norm="ortho")
    sal = recon.real.square() + recon.imag.square()  # [B, 1, h, w]; no abs(), so no kink at zero
    kernel, sigma = (SALIENCY_KERNEL, SALIENCY_KERNEL), (SALIENCY_SIGMA, SALIENCY_SIGMA)
    sal = gaussian_blur2d(sal, kernel, sigma, border_type="replicate")
    if (small_h, small_w) != (height, width):
        sal = F.interpolate(sal, size=(height, width), mode="bilinear", align_corners=False)  # [B, 1, H, W]
    # The whitening turns even float noise of a flat image into a pattern; a flat image has nothing salient.
    contrast = small.amax(dim=(-2, -1), keepdim=True) - small.amin(dim=(-2, -1), keepdim=True)
    return normalize_per_image(sal) * (contrast > FLAT_RANGE)


def euclidean_distance_transform(features: Tensor) -> Tensor:
    """Exact Euclidean distance from every pixel to the nearest True pixel of ``features`` [B, 1, h, w] -> float.

    Two separable min-plus passes (the decomposition of Felzenszwalb & Huttenlocher 2012, with the
    lower envelope taken by brute force over the axis): first along columns, g(y, x) = min_y' |y - y'|
    over feature pixels, then D(y, x)^2 = min_x' g(y, x')^2 + (x - x')^2. Batched and exact, unlike
    kornia's iterative ``distance_transform`` (diagonals up to ~29 % short, one convolution per pixel
    of the longest side); memory is O(B * h * w * max(h, w)), so callers reduce the image first.
    An image without any feature pixel gets h + w everywhere.

    Example:
        >>> m = torch.zeros(1, 1, 3, 4, dtype=torch.bool); m[0, 0, 0, 0] = True
        >>> euclidean_distance_transform(m)[0, 0].round(decimals=3)
        tensor([[0.0000, 1.0000, 2.0000, 3.0000],
                [1.0000, 1.4140, 2.2360, 3.1620],
                [2.0000, 2.2360, 2.8280, 3.6060]])
    """
    _, _, h, w = features.shape
    big = float(h + w)
    ys = torch.arange(h, device=features.device, dtype=torch.float32)
    xs = torch.arange(w, device=features.device, dtype=torch.float32)
    f = torch.where(features[:, 0], 0.0, big)  # [B, h, w]
    g = (f[:, None, :, :] + (ys[:, None] - ys[None, :]).abs()[None, :, :, None]).amin(2)  # [B, h, w] over y'
    g = g.clamp_max(big)
    d2 = (g.square()[:, :, None, :] + (xs[:, None] - xs[None, :]).square()[None, None]).amin(-1)  # [B, h, w] over x'
    return d2.sqrt()[:, None].clamp_max(big)


@register_channel("first_look", differentiable=False, needs_query=True)
def _first_look(inputs: TextureInputs) -> Tensor:
    """The VLM's own attention from the question to its gestalt: where the model itself looks first."""
    raise ValueError("the 'first_look' channel is read from a VLM's attention, not from pixels: use it through "
                     "arr_coc.vlm.answer (arr-coc ask --channels ... first_look), which runs the model's first look")


@register_channel("distance", differentiable=False)
def _distance(inputs: TextureInputs) -> Tensor:
    """Distance to the nearest strong edge, normalised per image (1 everywhere if no edge): room around objects."""
    strong = inputs.edges.detach() >= EDGE_THRESHOLD  # [B, 1, H, W] bool
    _, _, height, width = strong.shape
    factor = max(1, math.ceil(max(height, width) / DISTANCE_MAX_SIDE))
    mask = strong.to(inputs.pixels.dtype)
    if factor > 1:
        # max-pool, not average: a one-pixel stroke must survive the reduction.
        mask = F.max_pool2d(mask, factor, factor, ceil_mode=True)  # [B, 1, ceil(H/f), ceil(W/f)]
    dist = euclidean_distance_transform(mask > 0)  # reduced-grid pixels
    if factor > 1:
        # Scale by the exact factor and crop, so the reduced grid stays aligned when H or W is not a multiple.
        dist = F.interpolate(dist, scale_factor=factor, mode="bilinear", align_corners=False)
        dist = dist[..., :height, :width] * ~strong  # interpolation must not lift the edges themselves off 0
    has_edge = strong.amax(dim=(-2, -1), keepdim=True)  # [B, 1, 1, 1]
    return torch.where(has_edge, normalize_per_image(dist), torch.ones_like(dist))


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
                    text: Sequence[PageText | None] | None = None, timings: dict[str, float] | None = None) -> Tensor:
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

    Returns:
        ``[B, C, H, W]`` texture with the dtype and device of ``pixels``.

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
        groups.append(out.to(pixels.dtype))
    return torch.cat(groups, dim=1)  # [B, C, H, W]


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
