"""The one answer type: what a frozen VLM answered about a context (one image is its one-page case), what each
page sent (gestalt tokens, saccades and where they went), the text those pages replace and what it all cost.

:func:`replies` builds one :class:`Answer` per prompt of a decoded batch (:func:`arr_coc.vlm.answer.ask`,
:func:`arr_coc.vlm.context.read_context`); the FLOPs count the prompt's text runs, its visual tokens and the
tower's segments, against every page at full resolution.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence, Union

from torch import Tensor

from arr_coc.engine.plan import PageTotals, Plan
from arr_coc.vlm.cost import prefill_flops
from arr_coc.vlm.generation import answer_text, stage_ms
from arr_coc.vlm.processing import VisualTokens
from arr_coc.vlm.protocol import VLMAdapter


@dataclass
class PageSent:
    """What one page sent: its index in the source, gestalt tokens, saccades, full-resolution tokens and the plan
    (where the saccades went: ``plan.cells`` [K, 2] (y, x) or ``plan.squares`` [K, 3] (y, x, side))."""

    index: int
    gestalt_tokens: int
    saccades: int
    full_tokens: int
    plan: Plan | None = field(default=None, repr=False)
    # [3, H, W] the page's canvas as the tower saw it, or a function drawing it again (a long context keeps none)
    pixels: Union[Tensor, Callable[[], Tensor], None] = field(default=None, repr=False)

    @property
    def tokens(self) -> int:
        return self.gestalt_tokens + self.saccades

    @property
    def image(self) -> Tensor | None:
        """[3, H, W] the page's canvas (drawn again when not kept), or None when not known."""
        return self.pixels() if callable(self.pixels) else self.pixels

    @property
    def cells(self) -> Tensor | None:
        """[K, 2] (y, x) saccade cells in relevance order (a cells plan), else None."""
        return None if self.plan is None or self.plan.cells is None else self.plan.cells.cpu()

    @property
    def squares(self) -> Tensor | None:
        """[K, 3] (y, x, side) squares of a patch allocator, one token each (a squares plan), else None."""
        return None if self.plan is None or self.plan.squares is None else self.plan.squares.cpu()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"page": self.index + 1, "gestalt": self.gestalt_tokens, "saccades": self.saccades,
                               "full_resolution": self.full_tokens}
        if self.plan is not None:
            p = self.plan
            where = self.squares if self.squares is not None else self.cells
            out.update(kind=p.kind, encoding=p.encoding, grid=list(p.grid),
                       gestalt_grid=None if p.gestalt is None else list(p.gestalt),
                       positions=None if where is None else where.tolist())
        return out


@dataclass
class Answer(PageTotals):
    """One question's answer over a context (one image: one page) and what it cost against full resolution."""

    question: str
    text: str
    tokens: list[int]  # the answer's token ids, up to the first end-of-sequence token
    pages: list[PageSent]
    flops: dict[str, float]  # estimated FLOPs sent: llm, vision (prefill), allocation (the VLM's first look), total
    flops_full: dict[str, float]  # the same with every page at full resolution
    text_tokens: int | None = None  # the context's text as text tokens (None: no text known, e.g. one image)
    tokenizer: str | None = None  # who counted them
    allocator: str = "arr"  # who chose the saccades: "arr" (sampler, or the context's ranking) or a PATCHERS name
    relevance: str = "arr"  # where relevance came from: "arr" (texture + OCR scorer) or "vlm" (its first look)
    source: str | None = None  # where the pages came from (a path), when known
    # wall milliseconds of the whole call (the batch) per stage: "allocation/<stage>" (ARR's stages,
    # "allocation/channel/<name>" inside its texture and coupling; or the first look), "vision...",
    # "prefill...", "decode"
    timings_ms: dict[str, float] = field(default_factory=dict, repr=False)

    def _page(self) -> PageSent:
        if len(self.pages) != 1:
            raise ValueError(f"this answer read {len(self.pages)} pages; read each page's from .pages[i]")
        return self.pages[0]

    @property
    def plan(self) -> Plan | None:
        """The one page's plan (what was sent); a context of several pages has one per page (``pages[i].plan``)."""
        return self._page().plan

    @property
    def cells(self) -> Tensor | None:
        """The one page's [K, 2] (y, x) saccade cells (allocator "arr"), else None."""
        return self._page().cells

    @property
    def squares(self) -> Tensor | None:
        """The one page's [K, 3] (y, x, side) squares (a patch allocator), else None."""
        return self._page().squares

    def stage_ms(self) -> dict[str, float]:
        """Milliseconds per stage group: allocation, vision, prefill, decode (channel details not added twice)."""
        return stage_ms(self.timings_ms)

    def to_json(self) -> dict[str, Any]:
        """The answer, per page what it sent and where, the tokens sent, full and as text, FLOPs and stage
        times, as plain JSON-able data."""
        stages = self.stage_ms()
        c = self.compression
        return {
            "question": self.question,
            "answer": self.text,
            "relevance": self.relevance,
            "allocator": self.allocator,
            "source": self.source,
            "pages": [p.to_json() for p in self.pages],
            "tokens": {"sent": self.visual_tokens, "visual": self.visual_tokens, "gestalt": self.gestalt_tokens,
                       "saccades": self.saccades, "full_resolution": self.full_tokens, "text": self.text_tokens,
                       "tokenizer": self.tokenizer, "compression": None if c is None else round(c, 3)},
            "flops": {k: float(v) for k, v in self.flops.items()},
            "flops_full": {k: float(v) for k, v in self.flops_full.items()},
            "time_ms": {**{k: round(v, 2) for k, v in stages.items()}, "total": round(sum(stages.values()), 2)},
            "stages_ms": {k: round(v, 2) for k, v in self.timings_ms.items()},
        }


@dataclass
class Read:
    """One prompt of a batch: its question, pages (each with ``index``, ``plan`` and ``image``, or ``pixels``),
    the runs of text ids around them, the text they replace, and (once encoded) each page's visual tokens."""

    question: str
    pages: list[Any]
    runs: list[list[int]]  # len(pages) + 1 runs: before the first page, between pages, after the last
    text_tokens: int | None = None
    tokenizer: str | None = None
    source: str | None = None
    visual: list[VisualTokens] = field(default_factory=list)


def replies(adapter: VLMAdapter, reads: Sequence[Read], tokens: Tensor, prompt: Any, allocator: str, relevance: str,
            timings: dict[str, float]) -> list[Answer]:
    """One :class:`Answer` per prompt of a decoded batch: its text, what each page sent, and FLOPs sent and full.

    ``prompt`` is the batch's :class:`arr_coc.vlm.stages.Prompt` (its text runs; a first look's work is the
    allocation's FLOPs); ``tokens`` [B, T] the decoded ids.
    """
    out = []
    for b, r in enumerate(reads):
        text, toks = answer_text(adapter, tokens[b].tolist())
        n_text = sum(len(run) for run in prompt.prompts[b])
        # a context's page keeps its pixels or how to draw them again (``pixels``), a page given whole its ``image``
        sent = [PageSent(p.index, v.n_gestalt, len(v) - v.n_gestalt, p.plan.full_tokens, p.plan,
                         p.pixels if hasattr(p, "pixels") else p.image) for p, v in zip(r.pages, r.visual)]
        flops = prefill_flops(adapter, n_text + sum(len(v) for v in r.visual),
                              tuple(s for v in r.visual for s in v.vision_segments), *prompt.first_look_work(b, r.visual))
        full = [s.full_tokens for s in sent]
        flops_full = prefill_flops(adapter, n_text + sum(full), tuple(n * adapter.merge ** 2 for n in full))
        out.append(Answer(r.question, text, toks, sent, flops, flops_full, r.text_tokens, r.tokenizer, allocator,
                          relevance, r.source, dict(timings)))
    return out
