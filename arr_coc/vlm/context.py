"""Pages read by the VLM: a batch of prompts, each of any number of pages, encoded, prefilled and decoded in one go.

:func:`read_pages` is the one path from plans to answers: every page's plan of every prompt goes through the
model's own tower (:func:`arr_coc.vlm.stages.encode`: one call per plan kind, one attention segment per
gestalt and per page's saccades), each prompt places its pages as the images of one prompt at the positions
the model's multi-image path gives them (:func:`arr_coc.vlm.stages.prefill`: one page is its one-image
case), and the batch decodes together. Each prompt becomes one :class:`arr_coc.vlm.reply.Answer`: per page
its gestalt tokens, saccades and their positions, and the context's text tokens against the visual tokens
sent (the COC compression ratio).

:func:`read_context` reads one context's allocated pages (anything with ``index``, ``image`` [3, H, W] on
the model's cell and ``plan``: the context allocation's ``PageAllocation`` or :class:`PageInput`) for one
question.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence

from torch import Tensor

from arr_coc.config import MAX_NEW_TOKENS
from arr_coc.engine.plan import Plan
from arr_coc.vlm.generation import timed
from arr_coc.vlm.processing import VisualTokens
from arr_coc.vlm.protocol import VLMAdapter
from arr_coc.vlm.reply import Answer, Read, replies
from arr_coc.vlm.stages import decode, encode, prefill


class PageLike(Protocol):
    """What reading needs of a page: the context allocation's pages have it."""

    index: int
    image: Tensor
    plan: Plan


@dataclass
class PageInput:
    """One page of a context and its plan: ``image`` [3, H, W] in [0, 1], sides multiples of the model's cell."""

    index: int
    image: Tensor
    plan: Plan


def read_pages(adapter: VLMAdapter, reads: Sequence[Read], *, layout: str = "scaled",
               max_new_tokens: int = MAX_NEW_TOKENS, generation_config: Any = None, streamer: Any = None,
               seed: int | None = None, first_look: Any = None, weights: Sequence[Tensor | None] | None = None,
               encoded: Sequence[VisualTokens] | None = None, allocator: str = "arr", relevance: str = "arr",
               timings: dict[str, float] | None = None) -> list[Answer]:
    """One answer per prompt of ``reads``: each prompt's pages encoded, placed between its text runs, decoded.

    Args:
        reads: per prompt its question, pages (``index``, ``image``, ``plan``) and ``runs``, the ids around them.
        layout: saccade positions relative to each page's gestalt (``adapter.layouts``).
        max_new_tokens, generation_config, streamer, seed: how to decode (:func:`arr_coc.vlm.stages.decode`).
        first_look: the first look whose cache the prompts continue (one page per prompt; its gestalt is reused).
        weights, encoded: per page, in batch order, the weighted encoding's maps and the first look's gestalt
            tokens (:func:`arr_coc.vlm.stages.encode`).
        allocator, relevance: recorded on the answers.
        timings: collects ``vision``, ``prefill`` and ``decode`` milliseconds (every answer gets a copy).
    """
    if not reads or any(not r.pages for r in reads):
        raise ValueError("a context needs at least one page")
    t = {} if timings is None else timings
    pages = [p for r in reads for p in r.pages]
    with timed(t, "vision", adapter.device):
        flat = encode(adapter, [p.plan for p in pages], [p.image for p in pages], layout=layout, weights=weights,
                      encoded=encoded)
    at = 0
    for r in reads:
        r.visual, at = flat[at:at + len(r.pages)], at + len(r.pages)
    prompt = prefill(adapter, [r.visual for r in reads], [r.runs for r in reads], first_look=first_look)
    tokens, _ = decode(adapter, prompt, max_new_tokens=max_new_tokens, generation_config=generation_config,
                       streamer=streamer, seed=seed, logits=False, timings=t)
    return replies(adapter, reads, tokens, prompt, allocator, relevance, t)


def read_context(adapter: VLMAdapter, pages: Sequence[PageLike], question: str, *, text_tokens: int | None = None,
                 tokenizer: str | None = None, layout: str = "scaled", max_new_tokens: int = MAX_NEW_TOKENS,
                 timings: dict[str, float] | None = None) -> Answer:
    """The VLM's answer to ``question`` over every page's plan, as one multi-image prompt (:func:`read_pages`).

    Args:
        adapter: the VLM; every page's image is on its cell.
        pages: in prompt order, each with ``index``, ``image`` and ``plan`` (kind cells or squares: a gestalt,
            saccades, or both; full and native plans too, as :func:`arr_coc.vlm.stages.encode` takes them).
        question: asked once, after the last page.
        text_tokens, tokenizer: the context's text tokens and who counted them (the compression ratio).
        layout: saccade positions relative to each page's gestalt (``adapter.layouts``).
        max_new_tokens: the answer's length cap.
        timings: collects ``vision``, ``prefill`` and ``decode`` milliseconds (merged into the answer's).
    """
    if not pages:
        raise ValueError("a context needs at least one page")
    read = Read(question, list(pages), adapter.prompt_segments(question, len(pages)), text_tokens, tokenizer)
    return read_pages(adapter, [read], layout=layout, max_new_tokens=max_new_tokens, timings=timings)[0]
