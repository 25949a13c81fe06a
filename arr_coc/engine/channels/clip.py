"""CLIP / SigLIP patch-text similarity: the ``clip`` channel marks where the question's words are in the image.

For users who have CLIP or SigLIP weights (a local folder or a hub id, loaded with transformers'
``from_pretrained``). The question is embedded by the model's own text tower, not by
``inputs.query_encoder``: patch and text embeddings must live in the one space the model was trained on.

Dense patch embeddings. Both models pool the image with one last attention (CLIP: the last encoder block,
whose class token becomes the image embedding; SigLIP: the attention-pooling head over the final tokens).
Following MaskCLIP (Zhou et al., ECCV 2022), each patch is sent through that same pooling path as if the
last attention looked at that patch alone, i.e. the pooling module is run on a one-token sequence, where
softmax attention is exactly the value path (out_proj(v_proj(x))):

- CLIP:   ``e_i = visual_projection(post_layernorm(last_block([x_i])))`` with ``x_i`` the patch tokens
  entering the last block; the class token through ``visual_projection(post_layernorm(.))`` is
  ``get_image_features``.
- SigLIP: ``e_i = head([post_layernorm(x_i)])`` (value/out projection, then the head's residual MLP); the
  head over all tokens is ``get_image_features``.

The plain alternative (the final patch tokens through the pooled embedding's norm and projection) is known
to localise poorly: the last attention is global, so every patch already carries the whole image.

Resolution: the image is resized keeping its aspect to about the model's native number of patches
(option ``grid``: patches per side of the equivalent square, default ``image_size // patch_size``) and
normalised with the processor's mean/std; the position embeddings are interpolated
(``interpolate_pos_encoding=True``). A model without that argument gets the processor's square size and the
map is stretched back. The map is ``relu(cos - mean cos)`` over patches (patches more like the question
than the image's average; a softmax with ``logit_scale`` ~100 would keep only the top patch or two),
upsampled bilinearly to H x W and min-max normalised per image.

Example:
    >>> patches = F.normalize(torch.eye(4).view(1, 2, 2, 4), dim=-1)  # [1, 2, 2, 4]
    >>> similarity_map(patches, torch.tensor([[1.0, 0, 0, 0]]), (2, 2))[0, 0].tolist()
    [[1.0, 0.0], [0.0, 0.0]]
"""
from __future__ import annotations

import functools
import inspect
import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from arr_coc.engine.channel_registry import TextureInputs, normalize_per_image, register_channel
from arr_coc.engine.imageops import resize
from arr_coc.errors import MissingDependencyError

FAMILIES = ("clip", "siglip")
HOW_TO_SET = ('set the model with ARRConfig(texture=TextureConfig(options={"clip": {"model": PATH}})) or the CLI '
              "flag --clip-model PATH (a local folder or a hub id of a CLIPModel / SiglipModel)")


@dataclass(frozen=True)
class ClipModel:
    """A loaded CLIP/SigLIP model with what the channel needs from its tokenizer and image processor."""

    model: Any  # transformers CLIPModel or SiglipModel, eval mode
    tokenizer: Any
    family: str  # "clip" | "siglip"
    mean: Tensor  # [3] processor's normalisation of [0, 1] pixels
    std: Tensor  # [3]
    image_size: int  # native input side in px
    patch_size: int
    interpolate: bool  # whether the vision tower takes interpolate_pos_encoding (any aspect, any size)


def load_clip(model: str, device: str | torch.device = "cpu") -> ClipModel:
    """Load model, tokenizer and image-processor settings once per (model, device); later calls share them.

    Args:
        model: a local folder or a hub id of a transformers CLIPModel / SiglipModel.
        device: where the model runs.

    Raises:
        ImportError: transformers is missing.
        ValueError: the checkpoint is not a CLIPModel / SiglipModel with a pooling head.
    """
    return _load_clip(str(model), str(torch.device(device)))


@functools.lru_cache(maxsize=4)
def _load_clip(model: str, device: str) -> ClipModel:
    try:
        import transformers
    except ImportError as err:
        raise MissingDependencyError("the clip channel needs transformers: pip install transformers") from err
    net = transformers.AutoModel.from_pretrained(model).to(device).eval()
    family = net.config.model_type
    if family not in FAMILIES:
        raise ValueError(f"clip model {model!r} is a {family!r} model; supported: {FAMILIES}")
    vision = net.config.vision_config
    if family == "siglip" and not vision.vision_use_head:
        raise ValueError(f"SigLIP model {model!r} has no attention-pooling head (vision_use_head=False): "
                         "its image and text embeddings are not comparable")
    processor = transformers.AutoImageProcessor.from_pretrained(model, backend="pil")
    normalize = getattr(processor, "do_normalize", True)
    mean = torch.tensor(processor.image_mean if normalize else [0.0] * 3, device=device)
    std = torch.tensor(processor.image_std if normalize else [1.0] * 3, device=device)
    embeddings = type(net.vision_model.embeddings).forward
    interpolate = "interpolate_pos_encoding" in inspect.signature(embeddings).parameters
    return ClipModel(net, transformers.AutoTokenizer.from_pretrained(model), family, mean, std,
                     vision.image_size, vision.patch_size, interpolate)


def vision_input(clip: ClipModel, pixels: Tensor, grid: int | None = None) -> Tensor:
    """Resize ``[B, 3, H, W]`` [0, 1] pixels for the vision tower (aspect kept when it can) and normalise them.

    The output has ``~grid**2`` patches (default: the model's native count), sides multiples of the patch.
    """
    _, _, h, w = pixels.shape
    side = grid or clip.image_size // clip.patch_size
    if clip.interpolate:  # keep the aspect: h_p / w_p ~ H / W with h_p * w_p ~ side**2
        size = (max(1, round(side * math.sqrt(h / w))), max(1, round(side * math.sqrt(w / h))))
    else:
        size = (clip.image_size // clip.patch_size,) * 2
    x = resize(pixels, (size[0] * clip.patch_size, size[1] * clip.patch_size), "bicubic")  # [B, 3, h_p * p, w_p * p]
    return ((x - clip.mean.view(1, 3, 1, 1)) / clip.std.view(1, 3, 1, 1)).to(clip.model.dtype)


def project_tokens(clip: ClipModel, tokens: Tensor) -> Tensor:
    """The pooled-embedding path applied to each token of ``[N, L, C]`` on its own -> ``[N, L, D]`` (not normalised).

    CLIP: ``visual_projection(post_layernorm(t))`` of final tokens. SigLIP: the attention-pooling head run
    on each (post-layernorm) token as a one-token sequence.
    """
    n, length, c = tokens.shape
    if clip.family == "clip":
        return clip.model.visual_projection(clip.model.vision_model.post_layernorm(tokens))
    return clip.model.vision_model.head(tokens.reshape(n * length, 1, c)).view(n, length, -1)


@torch.no_grad()
def patch_features(clip: ClipModel, pixel_values: Tensor) -> Tensor:
    """Dense, L2-normalised patch embeddings ``[B, h_p, w_p, D]`` of normalised ``pixel_values`` (see module doc)."""
    b, _, hp, wp = pixel_values.shape
    hp, wp = hp // clip.patch_size, wp // clip.patch_size
    vision = clip.model.vision_model
    out = vision(pixel_values=pixel_values, output_hidden_states=clip.family == "clip",
                 **({"interpolate_pos_encoding": True} if clip.interpolate else {}))
    if clip.family == "clip":
        entering = out.hidden_states[-2][:, 1:]  # [B, N, C] patch tokens entering the last block (class token off)
        # A one-token sequence: the last block's attention sees only the patch itself (MaskCLIP's value path).
        alone = vision.encoder.layers[-1](entering.reshape(-1, 1, entering.shape[-1]), None)  # [B * N, 1, C]
        feats = project_tokens(clip, alone.view(b, hp * wp, -1))  # [B, N, D]
    else:
        feats = project_tokens(clip, out.last_hidden_state)  # [B, N, D]; post_layernorm already applied
    return F.normalize(feats.float(), dim=-1).view(b, hp, wp, -1)  # [B, h_p, w_p, D]


@torch.no_grad()
def text_features(clip: ClipModel, queries: Sequence[str]) -> Tensor:
    """L2-normalised text embeddings ``[N, D]`` of the questions, from the model's own text tower.

    Padded to the text tower's full length, as SigLIP was trained (it pools the last position); CLIP's causal
    text tower pools at the end-of-text token, so its padding changes nothing. Longer questions are truncated.
    """
    length = clip.model.config.text_config.max_position_embeddings
    enc = clip.tokenizer(list(queries), padding="max_length", max_length=length, truncation=True,
                         return_tensors="pt")
    enc = {k: v.to(clip.model.device) for k, v in enc.items() if k in ("input_ids", "attention_mask")}
    out = clip.model.get_text_features(**enc)
    emb = out.pooler_output if hasattr(out, "pooler_output") else out  # transformers 5 returns an output object
    return F.normalize(emb.float(), dim=-1)


def similarity_map(patches: Tensor, text: Tensor, size: tuple[int, int]) -> Tensor:
    """``relu(cos - mean cos)`` of ``[B, h_p, w_p, D]`` patches vs ``[B, D]`` texts, upsampled to ``[B, 1, H, W]`` in [0, 1].

    Both inputs L2-normalised. A map with no patch above the mean (flat) is 0 everywhere.
    """
    sim = torch.einsum("bhwd,bd->bhw", patches, text.to(patches))  # [B, h_p, w_p] cosine
    above = (sim - sim.mean(dim=(1, 2), keepdim=True)).relu()
    up = F.interpolate(above[:, None], size=size, mode="bilinear", align_corners=False)  # [B, 1, H, W]
    return normalize_per_image(up)


@register_channel("clip", width=1, differentiable=False, needs_query=True)
def clip_channel(inputs: TextureInputs) -> Tensor:
    """CLIP/SigLIP similarity of each image patch to the question (user-supplied weights; option clip.model)."""
    name = inputs.option("clip", "model")
    if not name:
        raise ValueError(f"the clip channel needs a CLIP or SigLIP model: {HOW_TO_SET}")
    pixels = inputs.pixels
    if inputs.queries is None or len(inputs.queries) != pixels.shape[0]:
        got = None if inputs.queries is None else len(inputs.queries)
        raise ValueError(f"the clip channel needs one question per image: got {got} for {pixels.shape[0]} images")
    grid = inputs.option("clip", "grid")
    clip = load_clip(str(name), pixels.device)
    key = f"clip:{name}" + (f":grid{grid}" if grid else "")
    # One image at a time so that each is cached on its own (a batch shares H, W, so the grids match).
    patches = torch.stack([
        inputs.cache.get(key, img, lambda img=img: patch_features(clip, vision_input(clip, img[None], grid))[0])
        for img in pixels
    ]).to(pixels.device)  # [B, h_p, w_p, D]
    text = text_features(clip, inputs.queries)  # [B, D]
    return similarity_map(patches, text, tuple(pixels.shape[-2:])).to(pixels.dtype)
