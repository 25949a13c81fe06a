"""Ask a frozen VLM about images with gestalt + saccades: load a model, then the four stages in a row.

Saccades are one-cell tokens from ARR's sampler (``allocator="arr"``) or variable-size squares from a
patch allocator of :data:`arr_coc.allocators.patching.PATCHERS` (``"saliency"``, ``"quadtree"``) run on
the same relevance, each square shrunk to one token. :func:`ask` is :func:`arr_coc.vlm.stages.allocate`,
``encode``, ``prefill`` and ``decode``, plus what each answer cost.

>>> from arr_coc.vlm import load_vlm
>>> adapter = load_vlm("tiny:qwen2_5_vl")  # random weights: the answer is noise, the plumbing is real
>>> adapter.cell
28
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from arr_coc.config import MAX_NEW_TOKENS, ARRConfig, check_int, resolve_device, resolve_dtype
from arr_coc.engine.plan import Plan
from arr_coc.threads import check_model
from arr_coc.vlm.cost import decode_flops, prefill_flops  # noqa: F401  (decode_flops: the VLM evaluation's import)
from arr_coc.vlm.generation import answer_text, decoding_config, stage_ms, timed
from arr_coc.vlm.processing import LAYOUTS, MODES, VisualTokens
from arr_coc.vlm.protocol import ADAPTERS, VLMAdapter
from arr_coc.vlm.stages import (
    RELEVANCE_SOURCES,
    Prompt,
    allocate,
    allocators,
    arr_for,
    check_look,
    decode,
    default_relevance,
    encode,
    prefill,
)


def load_vlm(name_or_path: str, *, dtype: Any = None, device: Any = None) -> VLMAdapter:
    """An adapter around a checkpoint folder or hub id (``from_pretrained``), or ``tiny:<family>``.

    The adapter is chosen from the config's ``model_type`` in the ``ADAPTERS`` registry.
    """
    from transformers import AutoConfig, AutoModelForImageTextToText, AutoTokenizer

    # checked before anything loads: a wrong name or a GPU this torch cannot reach fails in a second
    dtype, device = resolve_dtype(dtype), resolve_device(device)
    if not isinstance(name_or_path, str) or not name_or_path.strip():
        raise ValueError(f"model must be a checkpoint folder, a hub id or tiny:<family>, got {name_or_path!r}")
    if name_or_path.startswith("tiny:"):
        from arr_coc.vlm.tiny import tiny_image_processor, tiny_model, tiny_tokenizer

        family = name_or_path.split(":", 1)[1]
        if family == "llava":
            from arr_coc.vlm.tiny import tiny_llava_model, tiny_llava_tokenizer

            return ADAPTERS.get("llava")(_placed(tiny_llava_model(), dtype, device), tiny_llava_tokenizer())
        ADAPTERS.get(family)  # an unknown family lists the registered ones
        ip = tiny_image_processor(family)
        return ADAPTERS.get(family)(_placed(tiny_model(family), dtype, device), tiny_tokenizer(),
                                    image_mean=ip.image_mean, image_std=ip.image_std)
    try:
        config = AutoConfig.from_pretrained(name_or_path)
    except (OSError, ValueError) as err:
        reason = " ".join(str(err).split())  # transformers words it over several lines; a user error is one
        raise ValueError(f"cannot load a VLM config from {name_or_path!r}: {reason}") from err
    adapter_cls = ADAPTERS.get(config.model_type)  # unknown families raise with the registered names
    model = AutoModelForImageTextToText.from_pretrained(name_or_path, dtype=dtype or "auto")
    if device is not None:
        model = model.to(device)
    processor, tokenizer, mean, std = _processor_parts(name_or_path)
    if tokenizer is None:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    return adapter_cls(model, tokenizer, processor=processor, image_mean=mean, image_std=std)


def _placed(model: Any, dtype: torch.dtype | None, device: torch.device | None) -> Any:
    """A model built here (not loaded) moved to the asked dtype and device, as from_pretrained would."""
    return model.to(**{k: v for k, v in (("dtype", dtype), ("device", device)) if v is not None})


def _processor_parts(path: str) -> tuple[Any, Any, Any, Any]:
    """The processor if it loads; else its parts (the video processor needs torchvision)."""
    from transformers import AutoImageProcessor, AutoProcessor

    try:
        proc = AutoProcessor.from_pretrained(path)
        ip = getattr(proc, "image_processor", None)
        return proc, getattr(proc, "tokenizer", None), getattr(ip, "image_mean", None), getattr(ip, "image_std", None)
    except (ImportError, OSError, ValueError, AttributeError):
        pass
    try:
        ip = AutoImageProcessor.from_pretrained(path)
        return None, None, ip.image_mean, ip.image_std
    except (ImportError, OSError, ValueError):  # no preprocessor config: the adapter's family defaults
        return None, None, None, None


@dataclass
class Answer:
    """One question's answer and what it cost against the model's full-resolution input."""

    question: str
    text: str
    tokens: list[int]
    gestalt_tokens: int
    saccades: int
    full_tokens: int  # visual tokens of the full-resolution image
    flops: dict[str, float]  # estimated FLOPs sent: llm, vision (prefill), allocation (the VLM's first look), total
    flops_full: dict[str, float]  # the same at full resolution
    plan: Plan = field(repr=False)  # what was sent (kind cells, squares, or full under the weighted encoding)
    allocator: str = "arr"  # who chose the saccades: "arr" (sampler) or a PATCHERS name
    relevance: str = "arr"  # where relevance came from: "arr" (texture + OCR scorer) or "vlm" (its first look)
    # wall milliseconds of the whole call (the batch) per stage: "allocation/<stage>" (ARR's stages,
    # "allocation/channel/<name>" inside its texture and coupling; or the first look), "vision...",
    # "prefill...", "decode"
    timings_ms: dict[str, float] = field(default_factory=dict, repr=False)

    @property
    def cells(self) -> torch.Tensor | None:
        """[K, 2] (y, x) saccade cells in relevance order (allocator "arr"), else None."""
        return None if self.plan.cells is None else self.plan.cells.cpu()

    @property
    def squares(self) -> torch.Tensor | None:
        """[K, 3] (y, x, side) squares of a patch allocator, in its order, one token each, else None."""
        return None if self.plan.squares is None else self.plan.squares.cpu()

    @property
    def visual_tokens(self) -> int:
        return self.gestalt_tokens + self.saccades

    def stage_ms(self) -> dict[str, float]:
        """Milliseconds per stage group: allocation, vision, prefill, decode (channel details not added twice)."""
        return stage_ms(self.timings_ms)

    def to_json(self) -> dict[str, Any]:
        """The answer, the tokens sent and full, FLOPs and stage times, as plain JSON-able data."""
        stages = self.stage_ms()
        return {
            "question": self.question,
            "answer": self.text,
            "relevance": self.relevance,
            "allocator": self.allocator,
            "tokens": {"sent": self.visual_tokens, "gestalt": self.gestalt_tokens, "saccades": self.saccades,
                       "full_resolution": self.full_tokens},
            "flops": {k: float(v) for k, v in self.flops.items()},
            "flops_full": {k: float(v) for k, v in self.flops_full.items()},
            "time_ms": {**{k: round(v, 2) for k, v in stages.items()}, "total": round(sum(stages.values()), 2)},
            "stages_ms": {k: round(v, 2) for k, v in self.timings_ms.items()},
        }


def fixed_gestalt(adapter: Any) -> int | None:
    """The tokens of an adapter's gestalt when it cannot be chosen (LLaVA's tower view), else None."""
    return getattr(adapter, "fixed_gestalt", None)


def refuse_total_tokens(adapter: Any, tokens: Any, images: int | None = 1) -> None:
    """Refuse ``--tokens T`` (a total split between gestalt and saccades) for an adapter whose gestalt is fixed.

    The split would choose a gestalt grid the adapter does not send, and the total sent would not be T.

    Args:
        adapter: the loaded VLM adapter.
        tokens: the ``--tokens`` value given (None: nothing to check).
        images: images the total is spread over (one image: the message names the K that sends T), None when unknown.
    """
    fixed = fixed_gestalt(adapter)
    if tokens is None or fixed is None:
        return
    hint = ""
    if images == 1 and str(tokens).strip().isdigit() and int(tokens) > fixed:
        hint = f"; --saccades {int(tokens) - fixed} sends {int(tokens)}"
    raise ValueError(f"--tokens {tokens}: {adapter.name} sends its own fixed {fixed}-token gestalt per image (its "
                     f"tower's whole-image view) beside K saccades, so T cannot be split as asked; give --saccades K "
                     f"instead ({fixed} + K tokens per image{hint})")


def ask(adapter: VLMAdapter, images: Any, questions: str | Sequence[str], *, arr: Any = None,
        saccades: int | None = None, mode: str = "sparse", layout: str = "scaled", gestalt: bool = True,
        max_new_tokens: int = MAX_NEW_TOKENS, config: ARRConfig | None = None, allocator: str = "arr",
        relevance: str = "auto", look_layers: Sequence[int] | None = None, generation_config: Any = None,
        streamer: Any = None, seed: int | None = None) -> list[Answer]:
    """Allocate saccades with arr-coc, then let the frozen VLM answer from gestalt + saccades.

    Args:
        adapter: a VLM adapter (:func:`load_vlm`); its cell sets the canvas cell.
        images: what :class:`arr_coc.ARR` accepts (paths, PIL images, tensors; one or a list).
        questions: one per image.
        arr: an ARR whose canvas cell equals ``adapter.cell``; built from ``config`` when None. Its
            canvas, gestalt rule and sampler serve both relevance sources.
        saccades: K per image (default: the config's sampler saccades); a patch allocator's K
            (quadtree: at most K, and at least its starting tiling).
        mode: ``sparse`` (the tower encodes only the saccades), ``slice`` (the full grid, saccades
            kept) or ``weighted`` (every cell, scaled by relevance); patch allocators need ``sparse``.
        layout: saccade positions relative to the gestalt (``adapter.layouts``).
        gestalt: send the gestalt (the config's grid for K) before the saccades.
        allocator: ``"arr"``: one-cell saccades from ARR's sampler (``Answer.cells``); a
            :data:`arr_coc.allocators.patching.PATCHERS` name: variable-size squares on the relevance
            map, each one token (``Answer.squares``, ``Answer.saccades`` their count).
        relevance: ``"arr"``: ARR's scorer on its texture channels (OCR included by default; on the
            CPU). ``"vlm"``: the VLM's first look (:mod:`arr_coc.vlm.first_look`): the model encodes the
            gestalt, reads the question over it, and its attention to each gestalt token, spread
            over the cells, is the relevance; the answer then reuses that prefill. Everything runs
            on the model's device. ``"auto"``: :func:`arr_coc.vlm.stages.default_relevance`.
        look_layers: decoder layers the first look reads (default: the middle half).
        generation_config: how to decode, a ``transformers.GenerationConfig`` passed to the model's own
            ``generate`` (sampling, beams, stop strings, ...; unset fields come from the checkpoint's
            ``generation_config.json``, as in transformers). None: plain greedy decoding.
            ``max_new_tokens`` applies where it sets no length.
        streamer: a transformers streamer (e.g. ``TextStreamer(adapter.tokenizer, skip_prompt=True)``),
            one question at a time.
        seed: seeds sampling's draws on a generator forked from torch's (None: torch's global one).
    """
    if allocator not in allocators():
        raise ValueError(f"unknown allocator {allocator!r}; choose one of {', '.join(allocators())}")
    for name, value, choices in (("mode", mode, MODES), ("layout", layout, LAYOUTS)):
        if value not in choices:
            raise ValueError(f"unknown {name} {value!r}; choose one of {', '.join(choices)}")
    adapter.check_layout(layout)
    check_model(adapter, "ask")
    max_new_tokens = check_int("max_new_tokens", max_new_tokens)
    decoding_config(adapter, generation_config, max_new_tokens)  # refused before any work
    if seed is not None:
        seed = check_int("seed", seed, 0)
    if saccades is not None:
        saccades = check_int("saccades", saccades)
    if relevance == "auto":
        relevance = default_relevance(adapter)
    if relevance not in RELEVANCE_SOURCES:
        raise ValueError(f"unknown relevance source {relevance!r}; choose one of auto, {', '.join(RELEVANCE_SOURCES)}")
    if allocator != "arr" and mode != "sparse":
        raise ValueError(f"allocator {allocator!r} sends variable-size patches, which only mode='sparse' encodes "
                         f"(got mode={mode!r}); use mode='sparse' or allocator='arr'")
    if relevance == "vlm":
        check_look(adapter, mode, gestalt, "relevance 'vlm'")
    arr = arr_for(adapter, arr, config)
    grid = arr.config.gestalt.grid
    if gestalt and grid is not None and fixed_gestalt(adapter) is not None:  # a grid the adapter would not send
        raise ValueError(f"{adapter.name} sends its own fixed {fixed_gestalt(adapter)}-token gestalt (its tower's "
                         f"whole-image view), not the gestalt grid {tuple(grid)} asked for; leave GestaltConfig.grid "
                         f"unset (and give K saccades rather than a total of tokens)")
    k = saccades if saccades is not None else arr.config.sampler.saccades
    t: dict[str, float] = {}
    planned = allocate(adapter, images, questions, saccades=k, arr=arr, relevance=relevance, allocator=allocator,
                       encoding=mode, gestalt=gestalt, look_layers=look_layers, timings=t)
    with timed(t, "vision", adapter.device):
        visual = encode(adapter, planned.plans, planned.images, layout=layout, weights=planned.weights,
                        encoded=planned.gestalt_tokens)
    prompt = prefill(adapter, visual, planned.prompts, look=planned.look)
    tokens, _ = decode(adapter, prompt, max_new_tokens=max_new_tokens, generation_config=generation_config,
                       streamer=streamer, seed=seed, logits=False, timings=t)
    return answers(adapter, planned.queries, tokens, visual, prompt, planned.plans, allocator, relevance, t)


def answers(adapter: VLMAdapter, queries: Sequence[str], tokens: torch.Tensor, visual: Sequence[VisualTokens],
            prompt: Prompt, plans: Sequence[Plan], allocator: str, relevance: str,
            timings: dict[str, float]) -> list[Answer]:
    """One :class:`Answer` per prompt: its text, tokens sent, and FLOPs beside full resolution."""
    out = []
    for b, (vis, (pre, suf), plan) in enumerate(zip(visual, prompt.prompts, plans)):
        text, toks = answer_text(adapter, tokens[b].tolist())
        full = plan.full_tokens
        out.append(Answer(queries[b], text, toks, vis.n_gestalt, len(vis) - vis.n_gestalt, full,
                          prefill_flops(adapter, len(pre) + len(vis) + len(suf), vis.vision_segments,
                                        *prompt.look_work(b, vis)),
                          prefill_flops(adapter, len(pre) + full + len(suf), (full * adapter.merge ** 2,)),
                          plan, allocator, relevance, dict(timings)))
    return out
