"""Decoding through the model's own ``generate`` from a prefill with explicit positions, and stage timing."""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

import torch
from torch import Tensor

from arr_coc.config import MAX_NEW_TOKENS, DecodeConfig, check_int
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


def model_positions(adapter: VLMAdapter, position_ids: Tensor) -> Tensor:
    """Positions [R, B, L] float as the adapter's model takes them: M-RoPE [3, B, L] float as is, 1-D RoPE [B, L] long."""
    if adapter.rope_rows == 1:
        return position_ids[0].round().long()
    return position_ids


def eos_ids(adapter: VLMAdapter, config: Any = None) -> list[int]:
    """The end-of-sequence ids: ``config``'s, else the checkpoint's generation config's, else the LLM config's."""
    for eos in (getattr(config, "eos_token_id", None), getattr(adapter.model.generation_config, "eos_token_id", None),
                adapter.text_config.eos_token_id):
        if eos is not None:
            return [eos] if isinstance(eos, int) else list(eos)
    return []


def greedy(max_new_tokens: int = MAX_NEW_TOKENS) -> Any:
    """Plain greedy decoding, whatever the checkpoint's ``generation_config.json`` samples with: the default answer.

    Unset fields of a ``GenerationConfig`` are filled from the checkpoint's (transformers' rule), and
    Qwen-VL checkpoints ship sampling and a repetition penalty; the evaluation compares methods on
    deterministic answers, so the default sets those off explicitly.
    """
    from transformers import GenerationConfig

    max_new_tokens = check_int("max_new_tokens", max_new_tokens)  # the project's line, before transformers' own
    return GenerationConfig(do_sample=False, num_beams=1, repetition_penalty=1.0, max_new_tokens=max_new_tokens)


def from_decode(decode: DecodeConfig, max_new_tokens: int = MAX_NEW_TOKENS) -> Any:
    """The ``GenerationConfig`` of a :class:`arr_coc.config.DecodeConfig` (the CLI's flags): :func:`greedy`
    with its settings, every sampling value set (top_k off) so the checkpoint's own fills none.

    >>> c = from_decode(DecodeConfig(do_sample=True, top_p=0.9, stop=(".",)), 8)
    >>> c.do_sample, c.temperature, c.top_p, c.top_k, c.stop_strings, c.max_new_tokens
    (True, 1.0, 0.9, 0, ['.'], 8)
    """
    config = greedy(max_new_tokens)
    config.update(do_sample=decode.do_sample, num_beams=decode.num_beams, stop_strings=list(decode.stop) or None)
    if decode.do_sample:
        config.update(temperature=decode.temperature, top_p=decode.top_p, top_k=0)
    return config


def decoding_config(adapter: VLMAdapter, generation_config: Any = None, max_new_tokens: int = MAX_NEW_TOKENS) -> Any:
    """The ``GenerationConfig`` :func:`generate` runs: a copy of ``generation_config`` (None: :func:`greedy`),
    checked in one line, with ``max_new_tokens`` where it sets no length, and what decoding needs set.

    Raises:
        TypeError: not a ``transformers.GenerationConfig``.
        ValueError: a setting decoding from the prompt's own cache cannot honour, or one transformers refuses.
    """
    import copy

    from transformers import GenerationConfig

    if generation_config is None:
        config = greedy(max_new_tokens)
    elif not isinstance(generation_config, GenerationConfig):
        raise TypeError(f"generation_config must be a transformers.GenerationConfig, got "
                        f"{type(generation_config).__name__}")
    else:
        config = copy.deepcopy(generation_config)
    if config.max_new_tokens is None and config.max_length is None:
        config.max_new_tokens = max_new_tokens
    refused = [(config.num_return_sequences not in (None, 1), "num_return_sequences must be 1 (one answer per prompt)"),
               (config.use_cache is False, "use_cache=False: the answer continues the prompt's KV cache"),
               (config.cache_implementation is not None, f"cache_implementation {config.cache_implementation!r}: the "
                "prompt's prefill fills a DynamicCache the answer continues; leave it unset")]
    for bad, why in refused:
        if bad:
            raise ValueError(f"generation_config: {why}")
    try:
        config.validate(strict=True)
    except ValueError as err:  # transformers words some checks over several lines; a user error is one
        raise ValueError(f"generation_config: {' '.join(str(err).split())}") from None
    eos = eos_ids(adapter, config)
    if eos:
        # a finished row repeats its end token, so an answer ends at its first end token whatever stopped it
        config.eos_token_id, config.pad_token_id = eos, eos[0]
    config.return_dict_in_generate = True
    config.output_logits = config.num_beams in (None, 1)
    return config


def token_ids(adapter: VLMAdapter, ids: Tensor, mask: Tensor) -> Tensor:
    """Prompt ids [B, L] as the model's ``generate`` reads them: text ids kept, visual tokens (-1 on an attention
    mask of 1) as the image placeholder, padding as the pad id. Only logits processors and stopping criteria
    that look back at the prompt read them (``repetition_penalty``, ``stop_strings``); the prefill has its
    embeddings already."""
    pad = adapter.text_config.pad_token_id or 0
    out = torch.where(ids >= 0, ids, torch.full_like(ids, adapter.image_token_id))
    return out.masked_fill(mask == 0, pad)


@torch.no_grad()
def generate(adapter: VLMAdapter, prefill: Prefill, *, generation_config: Any = None,
             max_new_tokens: int = MAX_NEW_TOKENS, cache: Any = None, past_mask: Tensor | None = None,
             past_ids: Tensor | None = None, streamer: Any = None, seed: int | None = None, logits: bool = True,
             timings: dict[str, float] | None = None) -> tuple[Tensor, Tensor | None]:
    """Decode with the model's own ``generate`` from a prefill with explicit positions.

    The prompt but its last token runs through ``adapter.language_model`` (visual tokens at their
    positions, DeepStack features, into a ``DynamicCache``); ``model.generate`` then continues that cache
    from the last token, at the prompt's explicit positions: transformers extends position ids by one
    per new token, so the Qwen-VL models never recompute M-RoPE from ``rope_deltas``. Every
    ``GenerationConfig`` setting (sampling, beams, stop strings, repetition penalty...) is then
    transformers' own.

    Args:
        prefill: the prompts (:func:`arr_coc.vlm.processing.assemble`); each must end in a text token.
        generation_config: a ``transformers.GenerationConfig`` (None: greedy, :func:`greedy`); see
            :func:`decoding_config`.
        max_new_tokens: the length limit where ``generation_config`` sets none.
        cache: a ``DynamicCache`` already holding the start of every prompt (the first look), with
            ``past_mask`` [B, L0] its padding mask and ``past_ids`` [B, L0] its ids (-1 on visual tokens).
        streamer: a transformers streamer (``TextStreamer``), batch of one.
        seed: seeds the draws of sampling on a generator forked from torch's (None: torch's global state).
        logits: keep the logits of every step (False: a caller that reads only the tokens saves [B, T, V]).
        timings: receives ``prefill_ms`` (the prompt up to its last token) and ``decode_ms`` (the rest).

    Returns:
        tokens [B, T] (T <= the length limit; a finished row repeats its end token) and, with ``logits``
        and without beam search, the raw logits [B, T, V] that chose them (else None).
    """
    from transformers import DynamicCache

    config = decoding_config(adapter, generation_config, max_new_tokens)
    config.output_logits = config.output_logits and logits
    if bool(prefill.visual_mask[:, -1].any()):
        raise ValueError("every prompt must end in text (the chat template's generation prompt), not a visual token")
    device, mask, pad = prefill.inputs_embeds.device, prefill.attention_mask, adapter.text_config.pad_token_id or 0
    # unknown ids read as padding, not as image placeholders
    ids = prefill.token_ids if prefill.token_ids is not None else torch.full_like(mask, pad)
    if cache is None:
        cache = DynamicCache(config=adapter.text_config)
    elif past_mask is None or past_mask.shape[1] != cache.get_seq_length():
        raise ValueError("continuing a cache needs past_mask [B, cached length]")
    else:
        past = past_ids if past_ids is not None else torch.full_like(past_mask, pad)
        ids, mask = torch.cat([past.to(ids), ids], 1), torch.cat([past_mask.to(mask), mask], 1)
    start = time.perf_counter()
    if prefill.inputs_embeds.shape[1] > 1:
        adapter.language_model(dict(inputs_embeds=prefill.inputs_embeds[:, :-1], attention_mask=mask[:, :-1],
                                    position_ids=prefill.position_ids[..., :-1], past_key_values=cache,
                                    visual_mask=prefill.visual_mask[:, :-1], deepstack=prefill.deepstack))
    if timings is not None:
        synchronize(device)
        timings["prefill_ms"] = (time.perf_counter() - start) * 1e3
        start = time.perf_counter()
    expand = max(config.num_beams or 1, config.num_return_sequences or 1)
    if expand > 1:  # generate expands its inputs per beam, not a cache it was given
        cache.batch_repeat_interleave(expand)
    extra = {"tokenizer": adapter.tokenizer} if config.stop_strings else {}
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else [], enabled=seed is not None):
        if seed is not None:
            torch.manual_seed(seed)
        out = adapter.model.generate(input_ids=token_ids(adapter, ids, mask), attention_mask=mask,
                                     position_ids=model_positions(adapter, prefill.position_ids[..., -1:]),
                                     cache=cache, generation_config=config, streamer=streamer, **extra)
    tokens, scores = out.sequences[:, mask.shape[1]:], torch.stack(out.logits, 1) if config.output_logits else None
    if timings is not None:
        synchronize(device)
        timings["decode_ms"] = (time.perf_counter() - start) * 1e3
    return tokens, scores


def answer_text(adapter: VLMAdapter, tokens: Sequence[int]) -> tuple[str, list[int]]:
    """Generated ids up to the first end-of-sequence token (:func:`eos_ids`), and their text."""
    toks, stop = list(tokens), eos_ids(adapter)
    toks = toks[:next((i for i, t in enumerate(toks) if t in stop), len(toks))]
    return adapter.tokenizer.decode(toks, skip_special_tokens=True).strip(), toks
