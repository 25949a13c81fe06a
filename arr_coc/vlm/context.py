"""A context read by the VLM: every page's gestalt + saccades in one multi-image prompt, and what it cost.

:func:`read_context` takes the pages of an allocated context (anything with ``index``, ``image``
[3, H, W] on the model's cell and ``plan``, a :class:`arr_coc.engine.plan.Plan`: the context allocation's
``PageAllocation`` or :class:`PageInput`), encodes every page's plan through the model's own tower
(one call, one attention segment per gestalt and per page's saccades), places each page as its
own image of one prompt at the positions the model's multi-image path gives it
(:func:`arr_coc.vlm.stages.prefill_context`) and decodes the answer. A page may send its gestalt
alone (no saccades). :class:`ContextAnswer` reports, per page, gestalt tokens and saccades, and the
context's text tokens against the visual tokens sent: the COC compression ratio.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

from torch import Tensor

from arr_coc.config import MAX_NEW_TOKENS
from arr_coc.engine.plan import Plan
from arr_coc.vlm.cost import prefill_flops
from arr_coc.vlm.generation import answer_text, stage_ms, timed
from arr_coc.vlm.protocol import VLMAdapter
from arr_coc.vlm.stages import decode, encode, prefill_context


class PageLike(Protocol):
    """What :func:`read_context` needs of a page: the context allocation's pages have it."""

    index: int
    image: Tensor
    plan: Plan


@dataclass
class PageInput:
    """One page of a context and its plan: ``image`` [3, H, W] in [0, 1], sides multiples of the model's cell."""

    index: int
    image: Tensor
    plan: Plan


@dataclass
class PageSent:
    """What one page sent: its index in the source, gestalt tokens, saccades and its full-resolution tokens."""

    index: int
    gestalt_tokens: int
    saccades: int
    full_tokens: int

    @property
    def tokens(self) -> int:
        return self.gestalt_tokens + self.saccades


@dataclass
class ContextAnswer:
    """The answer over a whole context, what each page sent, and the COC compression ratio."""

    question: str
    text: str
    tokens: list[int]
    pages: list[PageSent]
    text_tokens: int | None  # the context's text as text tokens (None: no text known)
    tokenizer: str | None  # who counted them
    flops: dict[str, float]  # estimated prefill FLOPs sent: llm, vision, total
    flops_full: dict[str, float]  # the same with every page at full resolution
    timings_ms: dict[str, float] = field(default_factory=dict, repr=False)

    @property
    def visual_tokens(self) -> int:
        return sum(p.tokens for p in self.pages)

    @property
    def full_tokens(self) -> int:
        return sum(p.full_tokens for p in self.pages)

    @property
    def compression(self) -> float | None:
        """Text tokens / visual tokens sent (None without text tokens)."""
        return None if self.text_tokens is None else self.text_tokens / self.visual_tokens

    def to_json(self) -> dict[str, Any]:
        stages = stage_ms(self.timings_ms)
        return {
            "question": self.question, "answer": self.text,
            "pages": [{"page": p.index + 1, "gestalt": p.gestalt_tokens, "saccades": p.saccades,
                       "full_resolution": p.full_tokens} for p in self.pages],
            "tokens": {"visual": self.visual_tokens, "gestalt": sum(p.gestalt_tokens for p in self.pages),
                       "saccades": sum(p.saccades for p in self.pages), "full_resolution": self.full_tokens,
                       "text": self.text_tokens, "tokenizer": self.tokenizer,
                       "compression": None if self.compression is None else round(self.compression, 3)},
            "flops": {k: float(v) for k, v in self.flops.items()},
            "flops_full": {k: float(v) for k, v in self.flops_full.items()},
            "time_ms": {**{k: round(v, 2) for k, v in stages.items()}, "total": round(sum(stages.values()), 2)},
        }


def read_context(adapter: VLMAdapter, pages: Sequence[PageLike], question: str, *, text_tokens: int | None = None,
                 tokenizer: str | None = None, layout: str = "scaled", max_new_tokens: int = MAX_NEW_TOKENS,
                 timings: dict[str, float] | None = None) -> ContextAnswer:
    """The VLM's answer to ``question`` over every page's plan, as one multi-image prompt.

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
    t = {} if timings is None else timings
    with timed(t, "vision", adapter.device):
        visual = encode(adapter, [p.plan for p in pages], [p.image for p in pages], layout=layout)
    runs = adapter.prompt_segments(question, len(pages))
    tokens, _ = decode(adapter, prefill_context(adapter, [visual], [runs]), max_new_tokens=max_new_tokens,
                       timings=t)
    text, toks = answer_text(adapter, tokens[0].tolist())
    n_text = sum(len(r) for r in runs)
    sent = [PageSent(p.index, v.n_gestalt, len(v) - v.n_gestalt, p.plan.full_tokens) for p, v in zip(pages, visual)]
    flops = prefill_flops(adapter, n_text + sum(len(v) for v in visual),
                          tuple(s for v in visual for s in v.vision_segments))
    full = [s.full_tokens for s in sent]
    flops_full = prefill_flops(adapter, n_text + sum(full), tuple(n * adapter.merge ** 2 for n in full))
    return ContextAnswer(question, text, toks, sent, text_tokens, tokenizer, flops, flops_full, dict(t))
