"""The context evaluation: questions over whole contexts x methods x budgets -> resumable rows (OCR readers).

For every context (:mod:`arr_coc.data.contexts`: the LaTeX manuals' long contexts, MP-DocVQA,
SlideVQA) the pages are seen once (:func:`arr_coc.contexts.see_context`); for every question the
cells of all pages are scored once (:func:`arr_coc.contexts.allocate_context`), and every method of
:mod:`arr_coc.eval.context_methods` sends its plans at every budget, all at equal visual tokens.

A budget is ``"10x"`` (T = the context's text tokens / 10, at least 2 per page: the COC compression
ratio asked), a count (``"1500"``) or a share of the context's full resolution (``"5%"``). A row,
per question, method and budget, records on the answer's page(s):

- ``page_hit``: the page gets full-resolution tokens (saccades or the whole page); over several answer
  pages (SlideVQA's evidence), the share of them that do;
- ``coverage``: the share of the answer boxes' area inside full-resolution cells (NaN without boxes);
- ``reading``: the OCR reader reads exactly what the VLM would see of the page
  (:func:`arr_coc.eval.reading.render` of its plan): the answer boxes + ``margin_px`` scored by
  ``contains_score`` where the boxes are known, else the whole view, not told where the answer is,
  scored by its best word window (the ``find`` reading); the best over the answer pages; a page sent
  nothing reads nothing;

and over the context: ``tokens`` (visual tokens sent, exact), ``full_tokens``, ``text_tokens`` (the
context's text by :func:`arr_coc.contexts.text_tokens`: the text layer, or OCR on pages without one)
and ``compression`` = text tokens / tokens sent. Rows go through :class:`arr_coc.eval.store.RowStore`
(a rerun skips what is done; other settings are refused); :func:`arr_coc.eval.report.write_reports`
with ``reader="context"`` makes the tables.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch
from tqdm import tqdm

from arr_coc.budget import budget_tokens
from arr_coc.contexts import allocate_context, see_context, text_tokens, tokenizer_name
from arr_coc.data.contexts import ContextItem, ContextQuestion
from arr_coc.engine.imageops import paint_boxes
from arr_coc.engine.pipeline import ARR
from arr_coc.engine.plan import Plan
from arr_coc.eval.context_methods import CONTEXT_METHODS, NEEDS_BM25, BM25Pages, context_plans, require_bm25
from arr_coc.eval.reading import (
    READERS,
    best_window,
    contains_score,
    make_view_reader,
    read_region,
    render,
    rendered_tokens,
)
from arr_coc.eval.run import arr_settings
from arr_coc.eval.store import RowStore

DEFAULT_BUDGETS = ("10x", "20x")
CONTEXT_MARGIN_PX = 4.0  # the long-context task's reading margin (docs/coc.md): tight crops of one text line


def parse_budget(spec: Any) -> str:
    """A budget spec checked and written as rows key it: ``"10x"``, a count or a share.

    >>> parse_budget("10x"), parse_budget(1500), parse_budget("5%")
    ('10x', '1500', '5%')
    """
    s = str(spec).strip()
    if s.endswith("x"):
        try:
            c = float(s[:-1])
        except ValueError:
            c = float("nan")
        if not (math.isfinite(c) and c > 0):
            raise ValueError(f"compression {spec!r} must be a positive ratio, e.g. 10x (--compression 10)")
        return f"{c:g}x"
    budget_tokens(s, 10**9)  # a count or a share, or one line saying which it must be
    return s


def budget_total(spec: str, text: int | None, full: int, pages: int) -> int:
    """T for one context: ``"Cx"`` -> max(2 x pages, round(text / C)); a count or share as :func:`budget_tokens`.

    >>> budget_total("10x", 12640, 25000, 20), budget_total("10x", 100, 25000, 20), budget_total("5%", None, 2000, 3)
    (1264, 40, 100)
    """
    if spec.endswith("x"):
        if not text:
            raise ValueError(f"budget {spec} is a compression of the context's text, and this context has no text "
                             f"(no text layer, nothing read by OCR); give --tokens counts instead")
        return min(full, max(2 * pages, round(text / float(spec[:-1]))))
    return budget_tokens(spec, full)  # below 2 per page, split_context says the least that works


@dataclass
class ContextEvalSettings:
    """What a context evaluation runs: ``methods`` (:data:`CONTEXT_METHODS`) at every budget of ``budgets``.

    ``contexts`` records how the contexts were made (source, pages, dpi, questions, seed): it goes into the
    folder's settings, so rows of other contexts are never mixed in.
    """

    methods: Sequence[str] = CONTEXT_METHODS
    budgets: Sequence[Any] = DEFAULT_BUDGETS
    reader: str | None = "tesseract"  # None: page hit and coverage only
    margin_px: float = CONTEXT_MARGIN_PX
    text_weight: float | None = None  # the ranking's weights (None: allocate_context's)
    page_weight: float | None = None
    contexts: dict = field(default_factory=dict)
    fresh: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.methods, str) or isinstance(self.budgets, (str, int)):
            raise TypeError("methods and budgets are lists, e.g. methods=('coc',), budgets=('10x',)")
        unknown = [m for m in self.methods if m not in CONTEXT_METHODS]
        if unknown:
            raise ValueError(f"unknown context methods {unknown}; known: {', '.join(CONTEXT_METHODS)}")
        if not self.methods or (not self.budgets and set(self.methods) != {"full"}):
            raise ValueError("name at least one method and one budget (--compression or --tokens)")
        self.budgets = tuple(parse_budget(b) for b in self.budgets)
        if self.reader is not None:
            READERS.get(self.reader)  # fail now, not after the first context
        if not (math.isfinite(self.margin_px) and self.margin_px >= 0):
            raise ValueError(f"--margin must be >= 0 px, got {self.margin_px}")
        for name, w in self.weights().items():
            if not (math.isfinite(w) and w >= 0):
                raise ValueError(f"--{name.replace('_', '-')} must be a finite weight >= 0, got {w}")
        if NEEDS_BM25 in self.methods:
            require_bm25()

    def keys(self, q: ContextQuestion) -> set[tuple[str, str, str]]:
        """The row keys one question asks for."""
        return {(q.record_id, m, "full" if m == "full" else b) for m in self.methods
                for b in (("full",) if m == "full" else self.budgets)}

    def weights(self) -> dict[str, float]:
        return {k: v for k, v in (("text_weight", self.text_weight), ("page_weight", self.page_weight)) if v is not None}


def context_settings(arr: ARR, settings: ContextEvalSettings) -> dict:
    """What a context row depends on besides its key: recorded in the output folder and checked."""
    return json.loads(json.dumps({**arr_settings(arr), "task": "contexts", "reader": settings.reader,
                                  "margin_px": settings.margin_px, "ranking": settings.weights(),
                                  "text_tokenizer": tokenizer_name(), "contexts": settings.contexts}, default=str))


def answer_boxes(q: ContextQuestion, page: Any, source_size: tuple[int, int]) -> list[tuple[float, ...]]:
    """The question's boxes moved from the page's pixels onto its canvas (``page``: a PageAllocation)."""
    sy, sx = page.image.shape[-2] / source_size[0], page.image.shape[-1] / source_size[1]
    return [(b[0] * sy, b[1] * sx, b[2] * sy, b[3] * sx) for b in q.boxes]


def measure(plan: Plan | None, image: torch.Tensor, cell: int, boxes: Sequence, answers: Sequence[str],
            readers: dict[str, Any], margin_px: float) -> tuple[int, float, float | None, str | None]:
    """(page hit, answer coverage, reading, what was read) of one page's plan; a page not sent scores 0.

    ``readers``: ``region`` and ``find`` readers (:func:`make_view_reader`), or {} for no reading.
    """
    if plan is None:
        return 0, 0.0 if boxes else math.nan, 0.0 if readers else None, "" if readers else None
    hc, wc = plan.grid
    hit_cells = torch.zeros(hc, wc)
    if plan.kind == "full":
        hit_cells += 1
    elif plan.kind == "cells":
        hit_cells[plan.cells[:, 0], plan.cells[:, 1]] = 1
    coverage = math.nan
    if boxes:
        mask = paint_boxes(torch.tensor(boxes, dtype=torch.float32), torch.ones(len(boxes)), tuple(image.shape[-2:]))
        full_px = hit_cells.repeat_interleave(cell, 0).repeat_interleave(cell, 1)
        coverage = float((mask * full_px).sum() / mask.sum().clamp_min(1e-9))
    reading, prediction = None, None
    if readers:
        view = render(plan, image, cell)
        if boxes:
            prediction = read_region(readers["region"], view, boxes, margin_px)
            reading = contains_score(prediction, list(answers))
        else:  # not told where: the best word window of the whole view
            text = readers["find"].read(view)
            reading, prediction = max((best_window(text, a) for a in answers), key=lambda sp: sp[0])
    return int(hit_cells.sum() > 0), coverage, reading, prediction


def page_texts(seen: Any) -> list[str]:
    """Each page's text: its text layer (or rendered words), else the words OCR read on it."""
    return [p.text if p.words else " ".join(w for w, _ in ws) for p, ws in zip(seen.context.pages, seen.words)]


def question_rows(item: ContextItem, q: ContextQuestion, seen: Any, arr: ARR, settings: ContextEvalSettings,
                  readers: dict[str, Any], done: set, n_text: int | None, bm25: BM25Pages | None,
                  see_ms: float) -> list[dict]:
    """Every row one question asks for and ``done`` does not hold."""
    start = time.perf_counter()
    with torch.inference_mode():
        alloc = allocate_context(arr, seen, q.question, tokens=2 * len(seen), **settings.weights())
    alloc_ms = (time.perf_counter() - start) * 1e3
    scores = [p.relevance for p in alloc.pages]
    full = alloc.full_tokens
    order = bm25.rank(q.question) if bm25 is not None else None
    if any(not 0 <= a < len(seen) for a in q.pages):
        raise ValueError(f"question {q.record_id}: answer page(s) {list(q.pages)} outside the context's "
                         f"{len(seen)} pages")
    targets = [(a, answer_boxes(q, alloc.pages[a], seen.context.pages[a].size) if i == 0 else [])
               for i, a in enumerate(q.pages)]
    rows = []
    for budget in ("full", *settings.budgets):
        methods = [m for m in settings.methods if (m == "full") == (budget == "full")
                   and (q.record_id, m, budget) not in done]
        if not methods:
            continue
        total = full if budget == "full" else budget_total(budget, n_text, full, len(seen))
        for method, plans in context_plans(methods, scores, total, order).items():
            got = [measure(plans.get(a), alloc.pages[a].image, alloc.pages[a].cell, boxes, q.answers, readers,
                           settings.margin_px) for a, boxes in targets]
            sent = sum(rendered_tokens(p) for p in plans.values())
            best = max(range(len(got)), key=lambda i: got[i][2] or 0.0)
            rows.append({"dataset": item.dataset, "record_id": q.record_id, "image_id": item.context_id,
                         "kind": q.kind, "question": q.question, "answer": q.answers[0], "method": method,
                         "budget": budget, "budget_tokens": total, "tokens": sent, "full_tokens": full,
                         "text_tokens": n_text, "compression": n_text / sent if n_text else None,
                         "pages": len(seen), "answer_pages": list(q.pages),
                         "page_hit": sum(g[0] for g in got) / len(got), "coverage": got[0][1],
                         "reading": got[best][2], "prediction": got[best][3],
                         "see_ms": round(see_ms, 1), "alloc_ms": round(alloc_ms, 1)})
    return rows


def evaluate_contexts(items: Iterable[ContextItem], arr: ARR, out_dir: Path,
                      settings: ContextEvalSettings | None = None, progress: bool = True) -> Path:
    """Evaluate every question of every context into ``out_dir``; returns the rows' JSONL path.

    Raises:
        ValueError: ``out_dir`` holds rows made with other settings (unless ``settings.fresh``), a budget
            cannot give every page a gestalt, or a compression budget meets a context without text.
    """
    settings = settings or ContextEvalSettings()
    store = RowStore(Path(out_dir))
    store.claim(context_settings(arr, settings), fresh=settings.fresh)
    readers = {} if settings.reader is None else {r: make_view_reader(settings.reader, r) for r in ("region", "find")}
    for item in tqdm(items, desc="contexts", disable=not progress):
        done = store.done()  # re-read: another run into the same folder may have done some
        todo = [q for q in item.questions if not settings.keys(q) <= done]
        if not todo:
            continue
        start = time.perf_counter()
        with torch.inference_mode():
            try:
                seen = see_context(arr, item.load())
            except (ValueError, OSError) as err:
                raise type(err)(f"context {item.context_id}: {err}") from err
        see_ms = (time.perf_counter() - start) * 1e3
        texts = page_texts(seen)
        n_text = text_tokens("\n\n".join(texts)) if any(t.strip() for t in texts) else None
        bm25 = BM25Pages(texts) if NEEDS_BM25 in settings.methods else None
        for q in tqdm(todo, desc=item.context_id, leave=False, disable=not progress):
            store.append(question_rows(item, q, seen, arr, settings, readers, done, n_text, bm25, see_ms))
    return store.path
