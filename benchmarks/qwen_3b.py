"""The real-size Qwen2.5-VL-3B-Instruct architecture with random weights, built in seconds, and its inputs.

Shared by ``bench_vlm.py`` and ``bench_train_memory.py``: the published config (``--depth`` shrinks both
towers for quick checks of the timing harness), cheap random weights, the dtype probe, the device note, the
page and a fixed prompt. Timing needs the shapes, not trained values.
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]

# Qwen/Qwen2.5-VL-3B-Instruct config.json (transformers 5 layout: rope settings under rope_parameters,
# tie_word_embeddings on the top-level config).
QWEN25_VL_3B_TEXT = dict(
    vocab_size=151936, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
    num_key_value_heads=2, hidden_act="silu", max_position_embeddings=128000, rms_norm_eps=1e-6,
    use_sliding_window=False, sliding_window=32768, max_window_layers=70, attention_dropout=0.0,
    rope_parameters=dict(rope_type="default", rope_theta=1000000.0, mrope_section=[16, 24, 24]),
    bos_token_id=151643, eos_token_id=151645)
QWEN25_VL_3B_VISION = dict(
    depth=32, hidden_act="silu", hidden_size=1280, intermediate_size=3420, num_heads=16, in_channels=3,
    out_hidden_size=2048, patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=112,
    fullatt_block_indexes=[7, 15, 23, 31], tokens_per_second=2)
QWEN25_VL_3B_IDS = dict(image_token_id=151655, video_token_id=151656, vision_start_token_id=151652,
                        vision_end_token_id=151653)

QUESTION_TOKENS = 20


def qwen25_vl_3b_config(*, tiny: bool = False, layers: int | None = None, vocab: int | None = None) -> Any:
    """The Qwen2.5-VL-3B-Instruct config; ``tiny``: arr_coc's 2-layer, 32-wide config of the same family.

    ``layers`` and ``vocab`` shrink the full config (depth of both towers, vocabulary) for the
    one-layer copy whose non-persistent buffers seed the big model built on the meta device.
    """
    import transformers as tf

    if tiny:
        from arr_coc.vlm.tiny import tiny_config

        return tiny_config("qwen2_5_vl", layers=layers or 2)
    text, vision = dict(QWEN25_VL_3B_TEXT), dict(QWEN25_VL_3B_VISION)
    if layers is not None:
        text["num_hidden_layers"], vision["depth"] = layers, layers
    if vocab is not None:
        text.update(vocab_size=vocab, bos_token_id=None, eos_token_id=None)
    return tf.Qwen2_5_VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=True, **QWEN25_VL_3B_IDS)


def fill_random_(model: torch.nn.Module, *, std: float = 0.02, seed: int = 0, pool: int = 1_000_003) -> None:
    """Cheap random weights: matrices from one N(0, std) pool, norms 1, biases 0.

    Every matrix is the pool repeated from a random offset (its length is prime, so rows do not
    line up); drawing 3.75 G fresh normals takes ~40 s on two cores, this takes seconds.
    """
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(2 * pool, generator=g) * std
    cache: dict[torch.dtype, torch.Tensor] = {}  # the pool in each parameter dtype
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim < 2 and name.endswith("weight"):  # RMSNorm scales
                p.fill_(1.0)
                continue
            if p.ndim < 2:  # biases
                p.zero_()
                continue
            if p.dtype not in cache:
                cache[p.dtype] = values.to(p.dtype)
            src, off = cache[p.dtype], int(torch.randint(pool, (1,), generator=g))
            flat = p.view(-1)
            reps = flat.numel() // pool  # one strided copy: whole pool-length rows, then the rest
            flat[:reps * pool].view(reps, pool).copy_(src[off:off + pool].expand(reps, pool))
            flat[reps * pool:].copy_(src[off:off + flat.numel() - reps * pool])


def build_model(config: Any, dtype: torch.dtype, *, small_config: Any, seed: int = 0) -> Any:
    """A ``Qwen2_5_VLForConditionalGeneration`` with random weights, built without transformers' init.

    The module tree is made on the meta device (no memory, no init), then given empty CPU storage
    and filled by :func:`fill_random_`. Non-persistent buffers (the rotary ``inv_freq`` tables) are
    computed in constructors, which the meta device skips: they are copied from ``small_config``'s
    model, built normally (one layer, same rotary settings), and must cover every buffer.
    """
    from transformers import Qwen2_5_VLForConditionalGeneration

    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device("meta"):
            model = Qwen2_5_VLForConditionalGeneration(config)
    finally:
        torch.set_default_dtype(prev)
    model = model.to_empty(device="cpu")
    if config.tie_word_embeddings:
        model.tie_weights()  # to_empty gives the tied head its own storage
    small = dict(Qwen2_5_VLForConditionalGeneration(small_config).named_buffers())
    with torch.no_grad():
        for name, buf in model.named_buffers():
            if name not in small or small[name].shape != buf.shape:
                raise RuntimeError(f"no reference value for buffer {name}")
            buf.copy_(small[name])
    fill_random_(model, seed=seed)
    return model.eval()


def probe_dtypes(m: int = 1024, k: int = 2048, n: int = 5504, repeats: int = 3) -> dict[torch.dtype, float]:
    """Median ms of an LLM-shaped matmul ([m, k] @ [k, n]) in float32 and bfloat16 on this CPU."""
    out = {}
    for dt in (torch.float32, torch.bfloat16):
        a, b = torch.randn(m, k).to(dt), torch.randn(k, n).to(dt)
        a @ b
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            a @ b
            times.append((time.perf_counter() - t) * 1e3)
        out[dt] = statistics.median(times)
    return out


def choose_dtype(choice: str, device: torch.device = torch.device("cpu")) -> tuple[torch.dtype, str]:
    """``auto``: on the CPU bfloat16 if the probe matmul runs faster in it, else float32; on a GPU bfloat16
    (the dtype the checkpoints ship in); the reason as text."""
    if choice != "auto":
        return getattr(torch, choice), f"{choice} (chosen by --dtype)"
    if device.type != "cpu":  # the probe times this CPU, not the device
        return torch.bfloat16, f"bfloat16 (auto on {device.type})"
    probe = probe_dtypes()
    f32, bf16 = probe[torch.float32], probe[torch.bfloat16]
    measured = f"a 1024x2048 @ 2048x5504 matmul took {f32:.1f} ms in float32, {bf16:.1f} ms in bfloat16"
    if choice == "auto":
        dtype = torch.bfloat16 if bf16 < f32 else torch.float32
        why = f"{'bfloat16' if dtype == torch.bfloat16 else 'float32'} (auto: {measured})"
    else:
        dtype = getattr(torch, choice)
        why = f"{choice} (chosen by --dtype; {measured})"
    return dtype, why


def device_note(device: torch.device) -> str:
    """What the model ran on beyond the CPU: the GPU's name and its peak memory; empty on the CPU."""
    if device.type != "cuda":
        return ""
    cap = ".".join(map(str, torch.cuda.get_device_capability(device)))
    return (f", on {torch.cuda.get_device_name(device)} (compute capability {cap}, CUDA {torch.version.cuda}; "
            f"peak GPU memory {torch.cuda.max_memory_allocated(device) / 2 ** 30:.1f} GiB)")


def page(size: int) -> torch.Tensor:
    """The bundled receipt resized to ``size`` x ``size`` px: [3, S, S] in [0, 1]."""
    from arr_coc.engine.imageio import load_image
    from arr_coc.engine.imageops import resize

    return resize(load_image(ROOT / "examples" / "receipt.jpg"), (size, size))


def prompt_ids(config: Any, seed: int = 0) -> tuple[list[int], list[int]]:
    """A fixed chat-like prompt around the image: (header, vision_start) and (vision_end, question, tail).

    The text ids are arbitrary (no tokenizer): 3 header ids, a 20-id question and a 5-id tail,
    below the special-token range.
    """
    g = torch.Generator().manual_seed(seed)
    top = min(config.text_config.vocab_size, QWEN25_VL_3B_TEXT["bos_token_id"])
    ids = torch.randint(10, top, (3 + QUESTION_TOKENS + 5,), generator=g).tolist()
    pre = ids[:3] + [config.vision_start_token_id]
    suf = [config.vision_end_token_id] + ids[3:]
    return pre, suf


