"""Tiny random-weight Qwen-VL and LLaVA models, tokenizer and processor: real architectures, seconds on a CPU.

What the tests, the examples and ``arr-coc ask --model tiny:<family>`` run on where no checkpoint
is at hand. Weights are redrawn with a large std because a model at transformers' default init
(std 0.02) barely responds to positions, which would let a position bug pass an exactness test.
"""
from __future__ import annotations

from typing import Any

import torch

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>", "<|vision_start|>", "<|vision_end|>",
            "<|image_pad|>", "<|video_pad|>"]
TOKEN_IDS = dict(pad_token_id=0, eos_token_id=2, vision_start_token_id=4, vision_end_token_id=5,
                 image_token_id=6, video_token_id=7)
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.content is string %}{{ m.content }}"
    "{% else %}{% for c in m.content %}{% if c.type == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% else %}{{ c.text }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")


def tiny_tokenizer() -> Any:
    """A character-level fast tokenizer with the Qwen-VL special tokens and a chat template (128 ids)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [chr(c) for c in range(32, 127)] + ["\n"]
    vocab = {t: i for i, t in enumerate(SPECIALS + chars)}
    vocab.update({f"<|extra_{i}|>": i for i in range(len(vocab), 128)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<|endoftext|>",
                                   eos_token="<|im_end|>", additional_special_tokens=SPECIALS[1:])
    fast.chat_template = CHAT_TEMPLATE
    return fast


def tiny_config(family: str = "qwen2_5_vl", *, layers: int = 2, width: int = 32) -> Any:
    """A 2-layer config of a Qwen-VL family, with the tiny tokenizer's special ids."""
    import transformers as tf

    heads, head_dim = 2, width // 2
    text = dict(hidden_size=width, intermediate_size=2 * width, num_hidden_layers=layers, num_attention_heads=heads,
                num_key_value_heads=1, head_dim=head_dim, vocab_size=128, bos_token_id=None,
                eos_token_id=TOKEN_IDS["eos_token_id"], pad_token_id=0, tie_word_embeddings=False,
                rope_parameters=dict(rope_type="default", rope_theta=10000.0, mrope_section=[2, 3, 3]))
    vision = dict(depth=layers, num_heads=heads, spatial_merge_size=2, temporal_patch_size=2)
    ids = {k: v for k, v in TOKEN_IDS.items() if k not in ("pad_token_id", "eos_token_id")}
    if family == "qwen2_vl":
        return tf.Qwen2VLConfig(vision_config=dict(vision, embed_dim=width, hidden_size=width, mlp_ratio=2,
                                                   patch_size=14), text_config=text, **ids)
    if family == "qwen2_5_vl":  # window of 2x2 cells so a small image has several windows
        return tf.Qwen2_5_VLConfig(vision_config=dict(vision, hidden_size=width, intermediate_size=2 * width,
                                                      out_hidden_size=width, patch_size=14, window_size=56,
                                                      fullatt_block_indexes=[layers - 1]), text_config=text, **ids)
    if family == "qwen3_vl":
        text["rope_parameters"]["mrope_interleaved"] = True
        return tf.Qwen3VLConfig(vision_config=dict(vision, hidden_size=width, intermediate_size=2 * width,
                                                   out_hidden_size=width, patch_size=16, num_position_embeddings=16,
                                                   deepstack_visual_indexes=[0]), text_config=text, **ids)
    raise ValueError(f"unknown tiny family {family!r}; choose one of {', '.join(FAMILIES)}")


def tiny_model(family: str = "qwen2_5_vl", *, std: float = 0.3, seed: int = 0, **kwargs: Any) -> Any:
    """A tiny random ``*ForConditionalGeneration`` whose matrices are redrawn with ``std``."""
    return _redrawn(tiny_config(family, **kwargs), std, seed)


def _redrawn(config: Any, std: float, seed: int) -> Any:
    """The model of ``config`` with every matrix (position tables too, so a tower responds to where a
    patch sits) drawn from N(0, std) under ``seed``; the caller's random state is left as it was."""
    from transformers import AutoModelForImageTextToText

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForImageTextToText.from_config(config).eval()
        with torch.no_grad():
            for p in model.parameters():
                if p.ndim >= 2:
                    p.normal_(0.0, std)
    return model


def tiny_image_processor(family: str = "qwen2_5_vl") -> Any:
    """The Qwen-VL image processor (PIL backend) with the family's patch size."""
    from transformers import Qwen2VLImageProcessorPil

    mean_std = {} if family != "qwen3_vl" else dict(image_mean=[0.5] * 3, image_std=[0.5] * 3)
    return Qwen2VLImageProcessorPil(patch_size=16 if family == "qwen3_vl" else 14, merge_size=2,
                                    temporal_patch_size=2, **mean_std)


# LLaVA-1.5's chat layout, with the tiny tokenizer's <|image_pad|> standing in for <image>.
TINY_LLAVA_TEMPLATE = (
    "{% for m in messages %}{{ m.role.upper() }}: {% if m.content is string %}{{ m.content }}{% else %}"
    "{% for c in m.content %}{% if c.type == 'image' %}<|image_pad|>\n{% else %}{{ c.text }}{% endif %}"
    "{% endfor %}{% endif %} {% endfor %}{% if add_generation_prompt %}ASSISTANT:{% endif %}")
TINY_IMAGE_TOKEN_ID = 6  # <|image_pad|>, a special token of the tiny tokenizer


def tiny_llava_tokenizer() -> Any:
    """The tiny character-level tokenizer with a LLaVA-1.5-style chat template."""
    tok = tiny_tokenizer()
    tok.chat_template = TINY_LLAVA_TEMPLATE
    return tok


def tiny_llava_config(*, layers: int = 2, width: int = 32, image_size: int = 56) -> Any:
    """A 2-layer CLIP (14 px patches, 4x4 grid) + 2-layer Llama LLaVA config for the tiny tokenizer."""
    from transformers import LlavaConfig

    vision = dict(model_type="clip_vision_model", hidden_size=width, intermediate_size=2 * width,
                  num_hidden_layers=layers, num_attention_heads=2, image_size=image_size, patch_size=14,
                  projection_dim=width)
    text = dict(model_type="llama", hidden_size=width, intermediate_size=2 * width, num_hidden_layers=layers,
                num_attention_heads=2, num_key_value_heads=1, head_dim=width // 2, vocab_size=128,
                bos_token_id=None, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
    return LlavaConfig(vision_config=vision, text_config=text, image_token_id=TINY_IMAGE_TOKEN_ID,
                       image_seq_length=(image_size // 14) ** 2)


def tiny_llava_model(std: float = 0.3, seed: int = 0, **kwargs: Any) -> Any:
    """A tiny random ``LlavaForConditionalGeneration`` whose matrices are redrawn with ``std``.

    >>> tiny_llava_model().config.model_type
    'llava'
    """
    return _redrawn(tiny_llava_config(**kwargs), std, seed)
