"""Object channel: where the things the question names are, from EfficientNet-Lite0 class-activation maps.

Image part (once per image, cached under ``"efficientnet_cam"``): the image is resized so its short side is
``SHORT_SIDE`` px (aspect kept, each side rounded to a multiple of the network's stride 32 so every feature
cell covers whole pixels) and run through the network once. Each cell of the last conv map ``f(x)`` [1280] is
classified with the network's own classifier, ``P(c | x) = softmax_c(w_c . f(x) + b_c)``: the class-activation
maps (CAM_c = w_c . f) turned into local class posteriors ``[1000, h, w]``, which is what the cache holds.

Question part (per question, batched): the question embedding is compared with the embeddings of the 1000
ImageNet class names (encoded once per query encoder); the ``TOP_K`` best-matching classes get the relevance
``r_c = exp((s_c - s_max) / TAU)`` (a softmax over the top-k rescaled so the best class weighs 1), and

    map(x) = sum_c r_c * P(c | x)   in [0, 1], upsampled bilinearly to the pixels.

Why local posteriors rather than min-max normalising ``relu(sum_c r_c p_c CAM_c)`` with the global class
probabilities ``p_c``: (1) a question about an object that is not there must paint nothing, and per-image
min-max normalisation stretches the faint map of an absent object to a full-strength peak, while a posterior is
~0 wherever the asked class is not seen; (2) the global ``p_c`` of a secondary object is diluted by the main
one (a cup beside a cat: global cup probability ~0.01, local ~0.5 on the cup), so a product with ``p_c`` loses
it. The value reads "how sure the network is that this place shows what was asked about".

The map is as coarse as the conv map (one value per 32 px of the network input, ~100 px of a 1024 px page):
it says roughly where an object is; the full-resolution channels say where its detail is.

Example:
    >>> from arr_coc.engine.query import HashingQueryEncoder
    >>> from arr_coc.engine.texture import compute_texture
    >>> tex = compute_texture(torch.rand(1, 3, 64, 96), ("objects",), queries=["Where is the cat?"],
    ...                       query_encoder=HashingQueryEncoder())
    >>> tuple(tex.shape), bool(tex.min() >= 0) and bool(tex.max() <= 1)
    ((1, 1, 64, 96), True)
"""
from __future__ import annotations

from functools import lru_cache
from importlib import resources
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor

from arr_coc.engine.cache import cached_per_image
from arr_coc.engine.channel_registry import TextureInputs, register_channel
from arr_coc.engine.imageops import resize

from .efficientnet_lite import EfficientNetLite0, load_efficientnet_lite0, normalize_lite

T = TypeVar("T")

CACHE_NAME = "efficientnet_cam"
CLASS_NAMES_FILE = resources.files(__package__) / "imagenet_classes.txt"  # package data (pyproject.toml)
STRIDE = 32  # output stride of the network: one feature cell per 32x32 input pixels
# Cosine similarities of MiniLM questions to class names: a matching class scores ~0.6, the next unrelated
# one ~0.4; TAU = 0.05 makes that gap a factor e^4 ~ 55, and synonyms within ~0.05 keep comparable weight.
TAU = 0.05
# Short side of the network input. Lite0 was trained at 224; at 320 (feature map 10 cells on the short side) a
# secondary object of a scene is found (a 200 x 300 px cup beside a cat on a 672 x 952 canvas: peak on the cup
# at 320 and 448, beside it at 224) and the single-object case is unchanged, for about twice the time of 224.
SHORT_SIDE = 320
# Questions name one kind of thing; ten classes hold its ImageNet synonyms and sub-kinds (the cat and dog
# breeds, cup / coffee mug / espresso) while keeping the tail of weakly similar classes out.
TOP_K = 10

# Class-name embeddings per query encoder: id -> (encoder, [1000, D]). Holding the encoder keeps its id from
# being reused by another object while the entry exists; only the most recent few encoders are kept.
_CLASS_EMBEDDINGS: dict[int, tuple[Any, Tensor]] = {}
MAX_ENCODERS = 4


@lru_cache(maxsize=1)
def imagenet_class_names() -> tuple[str, ...]:
    """The 1000 ImageNet-1k class names in class-id order (first WordNet lemma of each synset).

    Example:
        >>> names = imagenet_class_names()
        >>> len(names), names[0], names[281], names[967]
        (1000, 'tench', 'tabby', 'espresso')
    """
    names = tuple(CLASS_NAMES_FILE.read_text(encoding="utf-8").splitlines())
    if len(names) != 1000:
        raise RuntimeError(f"{CLASS_NAMES_FILE} must list 1000 ImageNet classes, found {len(names)}; reinstall arr-coc")
    return names


def class_name_embeddings(encoder: Any) -> Tensor:
    """``[1000, D]`` embeddings of the ImageNet class names by ``encoder``, computed once per encoder object."""
    entry = _CLASS_EMBEDDINGS.get(id(encoder))
    if entry is None or entry[0] is not encoder:
        entry = (encoder, encoder.encode(list(imagenet_class_names())).float())  # [1000, D]
        _CLASS_EMBEDDINGS[id(encoder)] = entry
        while len(_CLASS_EMBEDDINGS) > MAX_ENCODERS:
            del _CLASS_EMBEDDINGS[next(iter(_CLASS_EMBEDDINGS))]  # the oldest
    return entry[1]


@lru_cache(maxsize=None)
def _model(device: str) -> EfficientNetLite0:
    return load_efficientnet_lite0(device)


def network_size(height: int, width: int, short_side: int = SHORT_SIDE) -> tuple[int, int]:
    """Network input size: short side ``short_side``, aspect kept, each side rounded to a multiple of 32.

    Example:
        >>> network_size(1024, 1024), network_size(1484, 980), network_size(10, 40, 224)
        ((320, 320), (480, 320), (224, 896))
    """
    scale = short_side / min(height, width)
    h, w = (max(STRIDE, round(side * scale / STRIDE) * STRIDE) for side in (height, width))
    return h, w


def class_posteriors(pixels: Tensor, short_side: int = SHORT_SIDE) -> Tensor:
    """Local ImageNet class posteriors ``[B, 1000, h, w]`` of ``[B, 3, H, W]`` pixels: Lite0 run once on the batch.

    Cell ``(i, j)`` is the softmax over classes of the class-activation maps plus the classifier bias there,
    ``softmax_c(w_c . f_ij + b_c)``; their spatial mean of logits is the network's own image logit.
    """
    model = _model(str(pixels.device))
    size = network_size(*pixels.shape[-2:], short_side=short_side)
    x = resize(pixels.detach().float(), size)
    with torch.no_grad():  # a fixed feature extractor: the channel is not differentiable
        feats = model.features(normalize_lite(x))  # [B, 1280, h, w]
        cams = torch.einsum("nf,bfhw->bnhw", model.classifier_weight, feats)  # [B, 1000, h, w]
        return (cams + model.classifier_bias[:, None, None]).softmax(dim=1)  # [B, 1000, h, w]


def object_maps(posteriors: Tensor, relevance: Tensor) -> Tensor:
    """How sure the network is that each place shows what the question asks about: ``sum_c r_c P(c | x)``.

    Args:
        posteriors: ``[B, N, h, w]`` local class posteriors (sum to 1 over N).
        relevance: ``[B, N]`` in [0, 1], how much each class is what the question asks about.

    Returns:
        ``[B, h, w]`` in [0, 1].

    Example:
        >>> post = torch.tensor([[[[0.9, 0.2]], [[0.1, 0.8]]]])  # class 0 on the left, class 1 on the right
        >>> object_maps(post, torch.tensor([[1.0, 0.0]])).tolist()  # asked about class 0
        [[[0.8999999761581421, 0.20000000298023224]]]
    """
    return torch.einsum("bn,bnhw->bhw", relevance.to(posteriors), posteriors).clamp(0.0, 1.0)


def class_relevance(query_emb: Tensor, class_emb: Tensor, tau: float = TAU, top_k: int = TOP_K) -> Tensor:
    """``[B, N]`` relevance of each class to each question: ``exp((s - s_max) / tau)`` on the top-k, 0 elsewhere.

    Example:
        >>> r = class_relevance(torch.tensor([[1.0, 0.0]]), torch.tensor([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0]]), 0.5, 2)
        >>> [round(v, 3) for v in r[0].tolist()]
        [1.0, 0.449, 0.0]
    """
    sim = query_emb.float() @ class_emb.float().T  # [B, N] cosine (both L2-normalised)
    top, idx = sim.topk(min(top_k, sim.shape[-1]), dim=-1)  # [B, k]
    weights = torch.exp((top - top[:, :1]) / tau)  # [B, k], 1 for the best-matching class
    return torch.zeros_like(sim).scatter(-1, idx, weights)


@register_channel("objects", differentiable=False, needs_query=True)
def _objects(inputs: TextureInputs) -> Tensor:
    """Where the things the question names are: EfficientNet-Lite0 class maps weighted by question-class similarity."""
    pixels, query_emb = inputs.pixels, inputs.query_emb  # [B, D]; raises before any model work without questions
    short_side = int(inputs.option("objects", "short_side", SHORT_SIDE))
    tau = float(inputs.option("objects", "tau", TAU))
    top_k = int(inputs.option("objects", "top_k", TOP_K))
    if short_side < STRIDE or tau <= 0 or top_k < 1:
        raise ValueError(f"objects options need short_side >= {STRIDE}, tau > 0, top_k >= 1; "
                         f"got short_side={short_side}, tau={tau}, top_k={top_k}")
    name = CACHE_NAME if short_side == SHORT_SIDE else f"{CACHE_NAME}@{short_side}"  # another size, another entry
    posteriors = torch.stack(cached_per_image(
        inputs.cache, name, pixels, lambda x: list(class_posteriors(x, short_side).unbind(0))))  # [B, 1000, h, w]
    class_emb = class_name_embeddings(inputs.query_encoder)  # [1000, D]
    relevance = class_relevance(query_emb.to(class_emb), class_emb, tau, top_k)  # [B, 1000]
    maps = object_maps(posteriors, relevance.to(posteriors.device))  # [B, h, w]
    up = F.interpolate(maps[:, None], size=pixels.shape[-2:], mode="bilinear", align_corners=False)  # [B, 1, H, W]
    return up.clamp(0.0, 1.0).to(pixels)
