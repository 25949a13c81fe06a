"""FLOP estimates of a VLM's work: the vision tower, the LLM prefill (in chunks) and decoding."""
from __future__ import annotations

from typing import Sequence

from arr_coc.vlm.protocol import VLMAdapter


def flops_estimate(n_params_llm: int, llm_layers: int, llm_width: int, prompt_tokens: int,
                   n_params_vit: int = 0, vit_layers: int = 0, vit_width: int = 0,
                   vit_segments: Sequence[int] = (), vit_window: int | None = None,
                   vit_full_layers: int | None = None) -> dict[str, float]:
    """Prefill FLOPs: 2 per weight per token, plus attention (QK^T and AV) over each sequence.

    The LLM's causal attention is counted at half the square. The vision tower attends fully within
    each segment in ``vit_full_layers`` of its layers (all when None); in the others (Qwen2.5-VL's
    window attention) each patch attends to at most ``vit_window`` patches, its window: exact for a
    grid tiled by whole windows, an upper bound where windows are cut or sparsely filled.

    >>> f = flops_estimate(1_000, 2, 8, 10)
    >>> f["llm"] == 2 * 1_000 * 10 + 2 * 2 * 8 * 10 * 10
    True
    >>> w = flops_estimate(0, 0, 0, 0, 0, 4, 8, (256,), vit_window=64, vit_full_layers=1)
    >>> w["vision"] == 4 * 8 * (1 * 256 * 256 + 3 * 256 * 64)
    True
    """
    llm = llm_chunk_flops(n_params_llm, llm_layers, llm_width, prompt_tokens)
    patches = sum(vit_segments)
    full = vit_layers if vit_full_layers is None or vit_window is None else vit_full_layers
    windowed = vit_layers - full
    pairs = full * sum(s * s for s in vit_segments)
    if windowed:
        pairs += windowed * sum(s * min(s, vit_window) for s in vit_segments)
    vit = 2.0 * n_params_vit * patches + 4.0 * vit_width * pairs
    return {"llm": llm, "vision": vit, "total": llm + vit}


def llm_chunk_flops(n_params: int, layers: int, width: int, new: int, past: int = 0) -> float:
    """LLM FLOPs of ``new`` tokens appended to ``past`` cached ones: weights, plus causal attention.

    >>> llm_chunk_flops(10, 1, 4, 6) == llm_chunk_flops(10, 1, 4, 2) + llm_chunk_flops(10, 1, 4, 4, past=2)
    True
    """
    return 2.0 * n_params * new + 4.0 * layers * width * new * (past + new / 2)



def prefill_flops(adapter: VLMAdapter, prompt_tokens: int, segments: Sequence[int], look_tokens: int = 0,
                  look_past: int = 0) -> dict[str, float]:
    """Estimated prefill FLOPs (llm, vision, allocation, total) of a prompt of ``prompt_tokens`` whose image the
    tower encoded in attention ``segments`` of patches (:func:`flops_estimate`); allocation: a first look's
    ``look_tokens`` question tokens read over ``look_past`` cached ones (0 without one)."""
    cfg_t, cfg_v = adapter.text_config, adapter.model.config.vision_config
    llm = sum(p.numel() for p in adapter.lm.layers.parameters())
    vit = sum(p.numel() for p in adapter.visual.parameters())
    depth = getattr(cfg_v, "depth", None) or cfg_v.num_hidden_layers  # Qwen towers say depth, CLIP num_hidden_layers
    window, full = None, None
    if getattr(cfg_v, "fullatt_block_indexes", None) is not None and getattr(cfg_v, "window_size", None):
        window = (cfg_v.window_size // cfg_v.patch_size) ** 2  # patches per window
        full = len(cfg_v.fullatt_block_indexes)
    out = flops_estimate(llm, cfg_t.num_hidden_layers, cfg_t.hidden_size, prompt_tokens, vit,
                         depth, getattr(cfg_v, "embed_dim", None) or cfg_v.hidden_size, segments,
                         vit_window=window, vit_full_layers=full)
    out["allocation"] = llm_chunk_flops(llm, cfg_t.num_hidden_layers, cfg_t.hidden_size, look_tokens, look_past)
    out["total"] += out["allocation"]
    return out


def decode_flops(adapter: VLMAdapter, prompt_tokens: int, new_tokens: int) -> float:
    """Estimated FLOPs of decoding ``new_tokens`` after a prompt: 2 per LLM weight per token, plus each
    token's attention over the cached context (the prefill estimate's convention)."""
    cfg = adapter.text_config
    llm = sum(p.numel() for p in adapter.lm.layers.parameters())
    context = sum(prompt_tokens + i for i in range(new_tokens))
    return 2.0 * llm * new_tokens + 4.0 * cfg.num_hidden_layers * cfg.hidden_size * context
