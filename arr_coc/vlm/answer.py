"""Ask a frozen VLM about a context (one image, several, a PDF, a text file) with gestalt + saccades: load a
model, then allocate, encode, prefill and decode.

Every prompt of a call is allocated by :func:`arr_coc.vlm.request.allocate_reads`: one image is a one-page
context (the call's images seen and scored in one ARR pass by the context allocation's own code, or the VLM's
first look; one-cell saccades from ARR's sampler, or variable-size squares from a method of the registry such as
``"patches"`` or ``"quadtree"``: :mod:`arr_coc.vlm.allocation`); a context of several pages gets one budget over
all of them (:func:`arr_coc.contexts.allocate`). The pages of every prompt are then read by one path
(:func:`arr_coc.vlm.context.read_pages`: ``encode``, ``prefill``, ``decode``) into one answer type,
:class:`arr_coc.vlm.reply.Answer`, with what each answer cost.

>>> from arr_coc.vlm import load_vlm
>>> adapter = load_vlm("tiny:qwen2_5_vl")  # random weights: the answer is noise, the plumbing is real
>>> adapter.cell
28
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from arr_coc.budget import Budget
from arr_coc.config import MAX_NEW_TOKENS, ARRConfig, check_int, resolve_device, resolve_dtype
from arr_coc.contexts.inputs import MAX_PAGES
from arr_coc.documents.pdf import DEFAULT_DPI
from arr_coc.documents.text_pages import TextLayout
from arr_coc.threads import check_model
from arr_coc.vlm.allocation import (
    RELEVANCE_SOURCES,
    allocators,
    arr_for,
    check_allocator,
    check_first_look,
    default_relevance,
)
from arr_coc.vlm.context import read_pages
from arr_coc.vlm.generation import decoding_config
from arr_coc.vlm.processing import LAYOUTS, MODES
from arr_coc.vlm.protocol import ADAPTERS, VLMAdapter
from arr_coc.vlm.reply import Answer
from arr_coc.vlm.request import allocate_reads, batch, is_image_batch, one_image, refuse_for_context


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


def ask(adapter: VLMAdapter, contexts: Any, questions: str | Sequence[str], *, arr: Any = None,
        saccades: int | None = None, budget: Any = None, mode: str = "sparse", layout: str = "scaled",
        gestalt: bool = True, max_new_tokens: int = MAX_NEW_TOKENS, config: ARRConfig | None = None,
        allocator: str = "arr", relevance: str = "auto", first_look_layers: Sequence[int] | None = None,
        generation_config: Any = None, streamer: Any = None, seed: int | None = None, pages: Any = None,
        dpi: float = DEFAULT_DPI, text_layout: TextLayout = TextLayout(), max_pages: int = MAX_PAGES,
        text_tokenizer: Any = None) -> Answer | list[Answer]:
    """Allocate saccades with arr-coc, then let the frozen VLM answer from gestalt + saccades: the
    :class:`Answer` to one question (a str), a list of them to a list of questions (one per context; a
    [B, 3, H, W] tensor asked one question: B answers).

    Args:
        adapter: a VLM adapter (:func:`load_vlm`); its cell sets the canvas cell.
        contexts: what the questions are about. With one question (a str): one context, which is one image
            (a path, a PIL image, a [3, H, W] tensor), several images (a list: one page each), a PDF, a text
            file, or a :class:`arr_coc.documents.page.Context`. With a list of questions: a list of contexts,
            one per question (a batch). A [B, 3, H, W] tensor is B images, one per question (one question: asked
            of each).
        questions: one question, or one per context.
        arr: an ARR whose canvas cell equals ``adapter.cell``; built from ``config`` when None. Its
            canvas, gestalt rule and sampler serve both relevance sources.
        saccades: K per image (default: the config's sampler saccades); a patch allocator's K
            (quadtree: at most K, and at least its starting tiling); over a context, K for all its pages.
        budget: instead of ``saccades``, a :class:`arr_coc.budget.Budget` or its spec: a total of tokens
            ("1300") or a share of full resolution ("25%") over a context's pages, each page a gestalt by
            the context rule (an image given a total is read as a one-page context).
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
            on the model's device. ``"auto"``: :func:`arr_coc.vlm.allocation.default_relevance` for an image,
            ``"arr"`` for a context.
        first_look_layers: decoder layers the first look reads (default: the middle half).
        generation_config: how to decode, a ``transformers.GenerationConfig`` passed to the model's own
            ``generate`` (sampling, beams, stop strings, ...; unset fields come from the checkpoint's
            ``generation_config.json``, as in transformers). None: plain greedy decoding.
            ``max_new_tokens`` applies where it sets no length.
        streamer: a transformers streamer (e.g. ``TextStreamer(adapter.tokenizer, skip_prompt=True)``),
            one question at a time.
        seed: seeds sampling's draws on a generator forked from torch's (None: torch's global one).
        pages, dpi, text_layout, max_pages: how a context is read (a PDF's 1-based page range and render
            resolution, a text file's :class:`arr_coc.documents.text_pages.TextLayout`, the most pages taken).
        text_tokenizer: what counts a context's text tokens (the compression ratio); None: the offline
            default (:data:`arr_coc.contexts.DEFAULT_TOKENIZER`).

    A context's pages are allocated together (one gestalt per page, saccades ranked over all its pages'
    cells) and sent sparse with their gestalts: ``mode``, ``gestalt=False``, a patch ``allocator`` and
    ``relevance="vlm"`` act on one image and are refused for a context (:func:`refuse_for_context`).
    """
    for name, value, choices in (("mode", mode, MODES), ("layout", layout, LAYOUTS)):
        if value not in choices:
            raise ValueError(f"unknown {name} {value!r}; choose one of {', '.join(choices)}")
    if allocator not in allocators():
        raise ValueError(f"unknown allocator {allocator!r}; choose one of {', '.join(allocators())}")
    adapter.check_layout(layout)
    check_model(adapter, "ask")
    max_new_tokens = check_int("max_new_tokens", max_new_tokens)
    decoding_config(adapter, generation_config, max_new_tokens)  # refused before any work
    if seed is not None:
        seed = check_int("seed", seed, 0)
    if saccades is not None:
        saccades = check_int("saccades", saccades)
    if budget is not None:
        if saccades is not None:
            raise ValueError("give saccades (K) or budget (a total), not both")
        budget = Budget.parse(budget)  # the one parse: every prompt's allocation takes it as it is
    if relevance not in ("auto", *RELEVANCE_SOURCES):
        raise ValueError(f"unknown relevance source {relevance!r}; choose one of auto, {', '.join(RELEVANCE_SOURCES)}")
    items = batch(contexts, questions)
    paged = any(one_image(c) is None for c, _ in items)
    if paged:
        refuse_for_context(mode, gestalt, allocator, relevance)
    if budget is not None and budget.kind != "saccades":  # an image given a total is split as a one-page context
        refuse_total_tokens(adapter, budget, images=None if paged or len(items) > 1 else 1)
    relevance = "arr" if paged else default_relevance(adapter) if relevance == "auto" else relevance
    check_allocator(allocator, relevance, mode)
    if relevance == "vlm":
        check_first_look(adapter, mode, gestalt, "relevance 'vlm'")
    arr = arr_for(adapter, arr, config)
    grid = arr.config.gestalt.grid
    if gestalt and grid is not None and fixed_gestalt(adapter) is not None:  # a grid the adapter would not send
        raise ValueError(f"{adapter.name} sends its own fixed {fixed_gestalt(adapter)}-token gestalt (its tower's "
                         f"whole-image view), not the gestalt grid {tuple(grid)} asked for; leave GestaltConfig.grid "
                         f"unset (and give K saccades rather than a total of tokens)")
    if budget is None:
        budget = Budget.saccades(saccades if saccades is not None else arr.config.sampler.saccades)
    t: dict[str, float] = {}
    planned = allocate_reads(adapter, items, budget, arr=arr, relevance=relevance, allocator=allocator, mode=mode,
                             gestalt=gestalt, first_look_layers=first_look_layers, text_tokenizer=text_tokenizer,
                             reading=dict(pages=pages, dpi=dpi, layout=text_layout, max_pages=max_pages), timings=t)
    answers = read_pages(adapter, planned.reads, layout=layout, max_new_tokens=max_new_tokens,
                         generation_config=generation_config, streamer=streamer, seed=seed,
                         first_look=planned.first_look, weights=planned.weights, encoded=planned.encoded,
                         allocator=allocator, relevance=relevance, timings=t)
    return answers[0] if isinstance(questions, str) and not is_image_batch(contexts) else answers
