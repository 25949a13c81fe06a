"""The clip channel on tiny random CLIP and SigLIP models built by transformers and saved to a folder."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from tolerances import CLIP_MAP, assert_close_reduction, assert_far, reduction_atol

import arr_coc.engine.channels.clip  # noqa: F401  registers the channel
from arr_coc.engine.cache import ImageCache
from arr_coc.engine.channels.clip import load_clip, patch_features, project_tokens, vision_input
from arr_coc.engine.texture import compute_texture

WORDS = ["[PAD]", "[UNK]", "[BOS]", "[EOS]", "what", "is", "the", "total", "where", "cat", "dog", "a", "date"]
TEXT_LEN, IMAGE, PATCH = 16, 32, 8  # native grid 4 x 4 patches
TINY = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)


def _tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="[BOS] $A [EOS]",
                                                       special_tokens=[("[BOS]", 2), ("[EOS]", 3)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", bos_token="[BOS]",
                                   eos_token="[EOS]", model_max_length=TEXT_LEN)


def _reinit(model: torch.nn.Module) -> None:
    # transformers' default init (std ~0.02) gives near-constant outputs; std 0.3 makes every path matter.
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for module in model.modules():
            for name in ("weight", "in_proj_weight"):
                w = getattr(module, name, None)
                if isinstance(module, (torch.nn.Linear, torch.nn.Conv2d, torch.nn.Embedding,
                                       torch.nn.MultiheadAttention)) and isinstance(w, torch.Tensor):
                    w.copy_(torch.randn(w.shape, generator=gen) * 0.3)


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    from transformers import (
        CLIPConfig,
        CLIPImageProcessorPil,
        CLIPModel,
        SiglipConfig,
        SiglipImageProcessorPil,
        SiglipModel,
    )

    text = dict(TINY, vocab_size=len(WORDS), max_position_embeddings=TEXT_LEN, pad_token_id=0, bos_token_id=2,
                eos_token_id=3)
    vision = dict(TINY, image_size=IMAGE, patch_size=PATCH)
    built = {
        "clip": (CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=16)),
                 CLIPImageProcessorPil(size={"shortest_edge": IMAGE}, crop_size={"height": IMAGE, "width": IMAGE})),
        "siglip": (SiglipModel(SiglipConfig(text_config=text, vision_config=vision)),
                   SiglipImageProcessorPil(size={"height": IMAGE, "width": IMAGE})),
    }
    out = {}
    for family, (model, processor) in built.items():
        folder = tmp_path_factory.mktemp(family)
        _reinit(model)
        model.save_pretrained(folder)
        processor.save_pretrained(folder)
        _tokenizer().save_pretrained(folder)
        out[family] = folder
    return out


def _clip_map(pixels, queries, folder, cache=None):
    return compute_texture(pixels, ("clip",), queries=queries, cache=cache, options={"clip": {"model": str(folder)}})


def _manual_dense(family: str, model, pixel_values: torch.Tensor) -> torch.Tensor:
    """The documented dense formula written out from the model's modules: [B, N, D], not normalised."""
    vision = model.vision_model
    if family == "clip":
        seen = {}
        block = vision.encoder.layers[-1]
        hook = block.register_forward_pre_hook(lambda m, args: seen.update(x=args[0]))  # returns None: args unchanged
        vision(pixel_values=pixel_values, interpolate_pos_encoding=True)
        hook.remove()
        x = seen["x"][:, 1:]  # patch tokens entering the last block
        a = x + block.self_attn.out_proj(block.self_attn.v_proj(block.layer_norm1(x)))  # attention on itself only
        a = a + block.mlp(block.layer_norm2(a))
        return model.visual_projection(vision.post_layernorm(a))
    tokens = vision(pixel_values=pixel_values, interpolate_pos_encoding=True).last_hidden_state
    head, c = vision.head, tokens.shape[-1]
    v = tokens @ head.attention.in_proj_weight[2 * c:].T + head.attention.in_proj_bias[2 * c:]  # value slice
    a = head.attention.out_proj(v)
    return a + head.mlp(head.layernorm(a))


@pytest.mark.parametrize("family", ["clip", "siglip"])
def test_channel_gives_one_map_per_image_in_unit_range(folders, family):
    pixels = torch.rand(2, 3, 56, 84, generator=torch.Generator().manual_seed(1))
    out = _clip_map(pixels, ["what is the total", "where is the cat"], folders[family])
    assert out.shape == (2, 1, 56, 84) and out.dtype == pixels.dtype
    assert float(out.min()) == 0.0 and torch.allclose(out.amax(dim=(1, 2, 3)), torch.ones(2))


@pytest.mark.parametrize("family", ["clip", "siglip"])
def test_vision_input_of_a_native_size_image_equals_the_processor(folders, family):
    from transformers import AutoImageProcessor

    image = torch.randint(0, 256, (3, IMAGE, IMAGE), generator=torch.Generator().manual_seed(2)).to(torch.uint8)
    processor = AutoImageProcessor.from_pretrained(folders[family], backend="pil")
    expected = processor(images=image.permute(1, 2, 0).numpy(), return_tensors="pt")["pixel_values"]
    got = vision_input(load_clip(str(folders[family])), image[None].float() / 255)
    assert got.shape == expected.shape == (1, 3, IMAGE, IMAGE)
    assert_close_reduction(got, expected, reduction_len=1, depth=4)  # elementwise: /255, -mean, /std, constants


def test_vision_input_keeps_the_aspect_at_about_the_native_patch_count(folders):
    clip = load_clip(str(folders["clip"]))
    assert vision_input(clip, torch.rand(1, 3, 56, 112)).shape == (1, 3, 3 * PATCH, 6 * PATCH)  # 18 ~ 16 patches
    assert vision_input(clip, torch.rand(1, 3, 56, 112), grid=8).shape == (1, 3, 6 * PATCH, 11 * PATCH)


def test_clip_dense_path_uses_the_projection_of_get_image_features(folders):
    clip = load_clip(str(folders["clip"]))
    model, pv = clip.model, vision_input(clip, torch.rand(2, 3, 56, 84, generator=torch.Generator().manual_seed(3)))
    with torch.no_grad():
        final = model.vision_model(pixel_values=pv, interpolate_pos_encoding=True).last_hidden_state  # [B, 1 + N, C]
        pooled = model.get_image_features(pixel_values=pv, interpolate_pos_encoding=True).pooler_output
        assert_close_reduction(project_tokens(clip, final[:, :1])[:, 0], pooled, reduction_len=32, depth=2)
        dense = patch_features(clip, pv).flatten(1, 2)  # [B, N, D]
        atol = assert_close_reduction(dense, F.normalize(_manual_dense("clip", model, pv), dim=-1), **CLIP_MAP)
        # Negative control: the plain final patch tokens through the same projection are a different map.
        plain = F.normalize(project_tokens(clip, final[:, 1:]), dim=-1)
        assert_far(plain, dense, atol=atol)


def test_siglip_dense_path_is_the_pooling_heads_value_path(folders):
    clip = load_clip(str(folders["siglip"]))
    model, pv = clip.model, vision_input(clip, torch.rand(2, 3, 56, 84, generator=torch.Generator().manual_seed(4)))
    with torch.no_grad():
        final = model.vision_model(pixel_values=pv, interpolate_pos_encoding=True).last_hidden_state  # [B, N, C]
        pooled = model.get_image_features(pixel_values=pv, interpolate_pos_encoding=True).pooler_output
        assert_close_reduction(model.vision_model.head(final), pooled, **CLIP_MAP)  # the head: a layer of its own
        dense = patch_features(clip, pv).flatten(1, 2)  # [B, N, D]
        atol = assert_close_reduction(dense, F.normalize(_manual_dense("siglip", model, pv), dim=-1), **CLIP_MAP)
        # Negative control: the head attending over all tokens is not what any patch gets on its own.
        closest = (F.normalize(pooled, dim=-1)[:, None] - dense).abs().amax(dim=-1).min()
        assert_far(closest, torch.zeros(()), atol=atol)


@pytest.mark.parametrize("family", ["clip", "siglip"])
def test_map_is_the_relu_of_the_centred_cosine_upsampled_and_normalised(folders, family):
    clip = load_clip(str(folders[family]))
    pixels = torch.rand(2, 3, 56, 84, generator=torch.Generator().manual_seed(5))
    questions = ["what is the total", "where is a dog"]
    pv = vision_input(clip, pixels)
    with torch.no_grad():
        dense = F.normalize(_manual_dense(family, clip.model, pv), dim=-1)  # [B, N, D]
        enc = clip.tokenizer(questions, padding="max_length", max_length=TEXT_LEN, return_tensors="pt")
        text = clip.model.get_text_features(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"])
    cos = (dense * F.normalize(text.pooler_output, dim=-1)[:, None]).sum(-1).view(2, pv.shape[2] // PATCH, -1)
    above = F.relu(cos - cos.mean(dim=(1, 2), keepdim=True))
    up = F.interpolate(above[:, None], size=(56, 84), mode="bilinear", align_corners=False)
    lo, hi = up.amin(dim=(1, 2, 3), keepdim=True), up.amax(dim=(1, 2, 3), keepdim=True)
    assert_close_reduction(_clip_map(pixels, questions, folders[family]), (up - lo) / (hi - lo), **CLIP_MAP)


@pytest.mark.parametrize("family", ["clip", "siglip"])
def test_vision_tower_runs_once_per_image_whatever_the_questions(folders, family):
    clip = load_clip(str(folders[family]))
    calls = []
    hook = clip.model.vision_model.register_forward_hook(lambda *_: calls.append(1))
    try:
        cache, image = ImageCache(), torch.rand(1, 3, 56, 56)
        first = _clip_map(image, ["what is the total"], folders[family], cache)
        second = _clip_map(image.clone(), ["where is the cat"], folders[family], cache)
        assert len(calls) == 1 and cache.hits == 1
        assert not torch.equal(first, second)
        _clip_map(torch.rand(2, 3, 56, 56), ["a", "a"], folders[family], cache)
        assert len(calls) == 3  # two new images: one run each
    finally:
        hook.remove()


@pytest.mark.parametrize("family", ["clip", "siglip"])
def test_a_different_question_changes_the_map_and_the_same_question_does_not(folders, family):
    image = torch.rand(1, 3, 56, 84, generator=torch.Generator().manual_seed(6))
    total = _clip_map(image, ["what is the total"], folders[family], ImageCache())
    again = _clip_map(image, ["what is the total"], folders[family], ImageCache())
    cat = _clip_map(image, ["where is the cat"], folders[family], ImageCache())
    assert torch.equal(total, again)
    assert_far(total, cat, atol=reduction_atol(total, **CLIP_MAP))  # the question moves the map


@pytest.mark.parametrize("family", ["clip", "siglip"])
def test_a_batch_of_two_equals_each_image_alone(folders, family):
    pixels = torch.rand(2, 3, 56, 84, generator=torch.Generator().manual_seed(7))
    questions = ["what is the total", "where is the cat"]
    both = _clip_map(pixels, questions, folders[family])
    alone = torch.cat([_clip_map(pixels[i:i + 1], questions[i:i + 1], folders[family]) for i in range(2)])
    assert_close_reduction(both, alone, **CLIP_MAP)


def test_missing_model_says_how_to_set_it():
    with pytest.raises(ValueError, match=r'options=\{"clip": \{"model": PATH\}\}.*--clip-model PATH'):
        compute_texture(torch.rand(1, 3, 28, 28), ("clip",), queries=["what is the total?"])


def test_question_count_must_match_the_images(folders):
    with pytest.raises(ValueError, match="one question per image: got 1 for 2 images"):
        _clip_map(torch.rand(2, 3, 28, 28), ["a"], folders["clip"])


def test_missing_transformers_says_pip_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers now raises ImportError
    with pytest.raises(ImportError, match="pip install transformers"):
        load_clip("openai/clip-vit-base-patch32")  # never loaded, so not cached
