"""Built-in texture channels, computed from the pixels alone: colour, position, structure, change, salience, room.

Colour (``rgb``), position (``y``, ``x``, ``eccentricity``), structure (``edges``, ``edges_inv``, ``highpass``,
``lowpass``), change (``motion``), bottom-up salience (``saliency``) and free space (``distance``), one channel
group per registry entry (`arr_coc.engine.channel_registry`). Every one lies in [0, 1] and is computed for the
whole batch at once; `arr_coc.config.MVP_CHANNELS` names the default set.

Example:
    >>> from arr_coc.engine.channel_registry import TextureInputs
    >>> _eccentricity(TextureInputs(torch.rand(1, 3, 3, 3)))[0, 0].tolist()[1]
    [0.7071067690849304, 0.0, 0.7071067690849304]
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from kornia.color import rgb_to_grayscale
from kornia.filters import box_blur, gaussian_blur2d, laplacian
from torch import Tensor

from arr_coc.engine.channel_registry import FLAT_RANGE, TextureInputs, normalize_per_image, register_channel

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
