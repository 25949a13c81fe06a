"""What one ``ask`` call asks: its prompts (a context and a question each), each allocated into a :class:`Read`.

:func:`batch` pairs the contexts with the questions; :func:`allocate_reads` gives every prompt its pages and plans
in prompt order. A prompt whose context is one image is a one-page context: those of a call are allocated together
(:func:`arr_coc.vlm.allocation.allocate`, one ARR pass through :func:`arr_coc.contexts.allocate_images`, or the
VLM's first look); a context of several pages by :func:`arr_coc.contexts.allocate` (one budget over its pages).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from torch import Tensor

from arr_coc.budget import Budget
from arr_coc.contexts import allocate as allocate_context
from arr_coc.vlm.allocation import allocate
from arr_coc.vlm.context import PageInput
from arr_coc.vlm.first_look import FirstLook
from arr_coc.vlm.processing import VisualTokens
from arr_coc.vlm.protocol import VLMAdapter
from arr_coc.vlm.reply import Read


def is_image_batch(x: Any) -> bool:
    """A [B, 3, H, W] tensor: B images."""
    return isinstance(x, torch.Tensor) and x.ndim == 4


def batch(contexts: Any, questions: str | Sequence[str]) -> list[tuple[Any, str]]:
    """The prompts of a call: (context, question) pairs. One question: one context (a [B, 3, H, W] tensor: B
    images, each asked it); a list of questions: one context each."""
    if isinstance(questions, str):
        return [(img, questions) for img in contexts] if is_image_batch(contexts) else [(contexts, questions)]
    qs = list(questions)
    cs = list(contexts) if is_image_batch(contexts) or isinstance(contexts, (list, tuple)) else [contexts]
    if len(cs) != len(qs) or not qs:
        raise ValueError(f"got {len(qs)} questions for {len(cs)} contexts; pass one question, or a list of contexts "
                         f"(each an image, a list of images, a PDF or a text file) with one question each")
    return list(zip(cs, qs))


def one_image(context: Any) -> Any:
    """The image a context is when it is one image (a list of one image is that image), else None."""
    from arr_coc.contexts.inputs import TEXT_SUFFIXES, is_pdf

    if isinstance(context, (list, tuple)):
        return one_image(context[0]) if len(context) == 1 else None
    if isinstance(context, (str, Path)):
        p = Path(context)
        return None if is_pdf(p) or p.suffix.lower() in TEXT_SUFFIXES else context
    if isinstance(context, torch.Tensor):
        return context if context.ndim in (2, 3) else None
    from PIL import Image

    return context if isinstance(context, (Image.Image, np.ndarray)) else None


def source_of(context: Any) -> str | None:
    """Where an image came from, when it is a path."""
    if isinstance(context, (list, tuple)) and len(context) == 1:
        return source_of(context[0])
    return str(context) if isinstance(context, (str, Path)) else None


def refuse_for_context(mode: str, gestalt: bool, allocator: str, relevance: str) -> None:
    """Refuse, in one line, what acts on one image only: a context's pages are allocated by one ranking over
    their cells and sent sparse, each page with its gestalt."""
    refused = [flag for flag, on in ((f"--mode {mode} (mode=)", mode != "sparse"),
                                     ("--no-gestalt (gestalt=False)", not gestalt),
                                     (f"--allocator {allocator} (allocator=)", allocator != "arr"),
                                     ("--relevance vlm (relevance=)", relevance == "vlm")) if on]
    if refused:
        raise ValueError(f"a context (several pages) is allocated by one ranking over its pages' cells and sent "
                         f"sparse with a gestalt per page; drop {', '.join(refused)}")


@dataclass
class Reads:
    """Every prompt of a call allocated: its :class:`Read`, and what the images' allocation hands the reading on."""

    reads: list[Read]
    first_look: FirstLook | None = None  # the images' first look (every prompt one image): its cache is continued
    weights: list[Tensor] | None = None  # weighted encoding: per page [Hc, Wc]
    encoded: list[VisualTokens] | None = None  # per page the gestalt tokens the first look encoded


def allocate_reads(adapter: VLMAdapter, items: Sequence[tuple[Any, str]], budget: Budget, *, arr: Any,
                   relevance: str, allocator: str, mode: str, gestalt: bool, first_look_layers: Any = None,
                   reading: dict | None = None, text_tokenizer: Any = None,
                   timings: dict[str, float] | None = None) -> Reads:
    """Each prompt's pages and plans, in prompt order (see the module docstring).

    Args:
        items: the (context, question) prompts (:func:`batch`).
        budget: each context's budget (an image's K saccades, or a total split over a context's pages).
        arr, relevance, allocator, mode, gestalt, first_look_layers: as :func:`arr_coc.vlm.ask` takes them
            (checked there; a context of several pages is allocated with the ``arr`` allocator, sparse).
        reading: how a context is read (``pages``, ``dpi``, ``layout``, ``max_pages``).
        text_tokenizer: what counts a context's text tokens.
        timings: collects ``allocation/...`` milliseconds, summed over the contexts.
    """
    t = {} if timings is None else timings
    images = [i for i, (c, _) in enumerate(items) if one_image(c) is not None]
    out: list[Read | None] = [None] * len(items)
    planned = None
    if images:
        planned = allocate(adapter, [one_image(items[i][0]) for i in images], [items[i][1] for i in images],
                           budget=budget, arr=arr, relevance=relevance, allocator=allocator, encoding=mode,
                           gestalt=gestalt, first_look_layers=first_look_layers, timings=t)
        for i, q, img, plan, (pre, suf) in zip(images, planned.queries, planned.images, planned.plans,
                                               planned.prompts):
            out[i] = Read(q, [PageInput(0, img, plan)], [pre, suf], source=source_of(items[i][0]))
    for i, (context, question) in enumerate(items):
        if out[i] is None:
            alloc = allocate_context(arr, context, question, budget, tokenizer=text_tokenizer, **(reading or {}))
            for name, ms in alloc.timings_ms.items():
                t[f"allocation/{name}"] = t.get(f"allocation/{name}", 0.0) + ms
            out[i] = Read(alloc.question, alloc.pages, adapter.prompt_segments(alloc.question, len(alloc.pages)),
                          alloc.text_tokens, alloc.tokenizer, alloc.source)
    if planned is None:
        return Reads(out)  # type: ignore[arg-type]  (every prompt is a context)
    # the first look and weighted encoding are the images' alone: ask refuses them beside a context
    return Reads(out, planned.first_look, planned.weights, planned.gestalt_tokens)  # type: ignore[arg-type]
