"""Greedy decoding with a KV cache from a prefill with explicit positions, and stage timing."""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

import torch
from torch import Tensor

from arr_coc.config import MAX_NEW_TOKENS
from arr_coc.vlm.processing import Prefill
from arr_coc.vlm.protocol import VLMAdapter


def synchronize(device: Any) -> None:
    """Wait for the device's queued work, so a wall-clock reading covers it (a no-op on the CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


@contextmanager
def timed(timings: dict[str, float] | None, name: str, device: Any = "cpu") -> Iterator[None]:
    """Add the wall milliseconds of the block to ``timings[name]`` (None: no timing), ``device`` synchronised."""
    if timings is None:
        yield
        return
    synchronize(device)
    start = time.perf_counter()
    yield
    synchronize(device)
    timings[name] = timings.get(name, 0.0) + (time.perf_counter() - start) * 1e3


STAGES = ("allocation", "vision", "prefill", "decode")


def stage_ms(timings: dict[str, float]) -> dict[str, float]:
    """Milliseconds per stage group (``allocation``, ``vision``, ``prefill``, ``decode``) of timings named
    ``group`` or ``group/part``; ``allocation/channel/...`` details are inside ARR's stages, not added twice.

    >>> stage_ms({"allocation/texture": 2.0, "allocation/channel/ocr": 1.5, "vision": 3.0, "prefill/gestalt": 1.0})
    {'allocation': 2.0, 'vision': 3.0, 'prefill': 1.0, 'decode': 0.0}
    """
    out = dict.fromkeys(STAGES, 0.0)
    for name, ms in timings.items():
        group = name.split("/", 1)[0]
        if group in out and not name.startswith("allocation/channel/"):
            out[group] += ms
    return out


@torch.no_grad()
def generate(adapter: VLMAdapter, prefill: Prefill, *, max_new_tokens: int = MAX_NEW_TOKENS,
             eos_token_id: int | Sequence[int] | None = None, cache: Any = None,
             past_mask: Tensor | None = None, timings: dict[str, float] | None = None) -> tuple[Tensor, Tensor]:
    """Greedy decoding with a KV cache from a prefill with explicit positions.

    ``cache`` (a transformers ``DynamicCache``) may already hold the start of every prompt, with
    ``past_mask`` [B, L0] its padding mask: the prefill then continues those prompts.

    Returns:
        tokens [B, T] (T <= max_new_tokens; finished rows repeat ``eos``) and the logits [B, T, V] that
        chose them. ``timings``, when given, receives ``prefill_ms`` and ``decode_ms`` of the batch.
    """
    from transformers import DynamicCache

    eos = torch.tensor([] if eos_token_id is None else
                       ([eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)),
                       device=prefill.attention_mask.device)
    device = prefill.inputs_embeds.device
    start = time.perf_counter()
    mask = prefill.attention_mask
    if cache is None:
        cache = DynamicCache(config=adapter.text_config)
    elif past_mask is None or past_mask.shape[1] != cache.get_seq_length():
        raise ValueError("continuing a cache needs past_mask [B, cached length]")
    else:
        mask = torch.cat([past_mask.to(mask), mask], 1)
    hidden = adapter.language_model(dict(inputs_embeds=prefill.inputs_embeds, attention_mask=mask,
                                         position_ids=prefill.position_ids, past_key_values=cache,
                                         visual_mask=prefill.visual_mask, deepstack=prefill.deepstack))
    logits = adapter.logits(hidden[:, -1:])  # [B, 1, V]
    if timings is not None:
        synchronize(device)
        timings["prefill_ms"] = (time.perf_counter() - start) * 1e3
        start = time.perf_counter()
    b = mask.shape[0]
    done = torch.zeros(b, dtype=torch.bool, device=mask.device)
    tokens, scores = [], []
    for step in range(max_new_tokens):
        nxt = logits[:, -1].argmax(-1)  # [B]
        if eos.numel():
            nxt = torch.where(done, eos[0].to(nxt), nxt)
        tokens.append(nxt)
        scores.append(logits[:, -1])
        done |= torch.isin(nxt, eos.to(nxt))
        if bool(done.all()) or step == max_new_tokens - 1:
            break
        mask = torch.cat([mask, mask.new_ones(b, 1)], dim=1)
        pos = (prefill.next_position + step)[None, :, None].expand(adapter.rope_rows, b, 1)  # [R, B, 1]
        hidden = adapter.language_model(dict(inputs_embeds=adapter.embed_tokens(nxt[:, None]), attention_mask=mask,
                                             position_ids=pos, past_key_values=cache))
        logits = adapter.logits(hidden)
    out = torch.stack(tokens, 1), torch.stack(scores, 1)
    if timings is not None:
        synchronize(device)
        timings["decode_ms"] = (time.perf_counter() - start) * 1e3
    return out



def answer_text(adapter: VLMAdapter, tokens: Sequence[int]) -> tuple[str, list[int]]:
    """Generated ids up to the first end-of-sequence token, and their text."""
    toks, eos = list(tokens), adapter.text_config.eos_token_id
    if eos is not None:
        stop = [eos] if isinstance(eos, int) else list(eos)
        toks = toks[:next((i for i, t in enumerate(toks) if t in stop), len(toks))]
    return adapter.tokenizer.decode(toks, skip_special_tokens=True).strip(), toks
