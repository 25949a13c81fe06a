"""Contexts read by OCR: questions over whole contexts x methods x budgets (the context reader of the loop).

For every context (:mod:`arr_coc.data.contexts`: the LaTeX manuals' long contexts, MP-DocVQA,
SlideVQA) the pages are seen once (:func:`arr_coc.contexts.see_context`); for every question and budget
the context allocation is made once (:func:`arr_coc.contexts.allocate` at that budget: the ``coc``
method's plans, and the per-page scores the other methods rank by), and every whole-context method of the
registry (:mod:`arr_coc.allocators.pages`) sends its plans, all at equal visual tokens.

A budget is ``"10x"`` (T = the context's text tokens / 10, at least 2 per page: the COC compression
ratio asked), a count (``"1500"``) or a share of the context's full resolution (``"5%"``). A row,
per question, method and budget, records on the answer's page(s):

- ``page_hit``: the page gets full-resolution tokens (saccades or the whole page); over several answer
  pages (SlideVQA's evidence), the share of them that do;
- ``page_hit_strict``: at least half of the answer's area is in full-resolution cells (``coverage`` >= 0.5 for
  the best-covered occurrence of the answer; NaN without boxes): one saccade on the page is not enough;
- ``coverage``: the share of the answer boxes' area inside full-resolution cells (NaN without boxes);
- ``reading`` (the ``region`` reading): the OCR reader reads exactly what the VLM would see of the page
  (:func:`arr_coc.eval.reading.render` of its plan), the answer boxes + ``margin_px``, scored by
  ``contains_score``; where the boxes are unknown it is the find reading; the best over the answer pages;
- ``reading_find`` (the ``find`` reading): the reader reads the whole rendered view of the answer page, not
  told where the answer is, and (a plan of cells) those full-resolution cells alone
  (:func:`~arr_coc.eval.reading.find_reading`); the answer's best word window in all it read scores it (the best
  over the answer pages). Only the answer page's view is read, not every page sent: reading more pages could only
  raise the best window, so this is the conservative form, and it costs one page's OCR instead of twenty;
- a page sent nothing reads nothing (0);

and over the context: ``tokens`` (visual tokens sent, exact), ``full_tokens``, ``text_tokens`` (the
context's text by :func:`arr_coc.contexts.text_tokens`: the text layer, or OCR on pages without one)
and ``compression`` = text tokens / tokens sent. The loop (:func:`arr_coc.eval.evaluate.evaluate`) stores
the rows; :func:`arr_coc.eval.report.write_reports` with ``reader="context"`` makes the tables.
"""
from __future__ import annotations

import math
import time
from typing import Any, Iterator, Sequence

import torch

from arr_coc.allocators.methods import cell_mask, page_plans, resolve
from arr_coc.allocators.pages import PagesInputs
from arr_coc.budget import LEGIBLE_SIDE, Budget
from arr_coc.contexts import allocate, see_context, text_tokens, tokenizer_name
from arr_coc.contexts.ranking import LAYER_RELEVANCE
from arr_coc.data.contexts import ContextItem, ContextQuestion
from arr_coc.engine.imageops import paint_boxes
from arr_coc.engine.pipeline import ARR
from arr_coc.engine.plan import Plan
from arr_coc.eval.context_methods import NEEDS_BM25, NEEDS_RETRIEVER, BM25Pages, RetrievalPages
from arr_coc.eval.evaluate import Unit, row
from arr_coc.eval.metrics import cells_to_pixels
from arr_coc.eval.reading import (
    FIND_VIEWS,
    contains_score,
    find_reading,
    make_view_reader,
    read_region,
    render,
    rendered_tokens,
)
from arr_coc.eval.run import arr_settings
from arr_coc.eval.settings import EvalSettings


def page_retriever(arr: ARR) -> Any:
    """The retriever of the ``retrieval_pages`` baseline: the default model (:func:`load_retriever`), the ARR's own
    where the ARR's retriever is that model (loaded once; a text's vector does not depend on what else it embeds)."""
    from arr_coc.engine.retrieval import DEFAULT_RETRIEVER, load_retriever

    return arr.retriever if arr.retriever.name == DEFAULT_RETRIEVER else load_retriever()


class ContextReading:
    """The loop's reader of contexts: OCR (``settings.reader``) or none (page hit and coverage only)."""

    shards = False
    desc = ""

    def __init__(self, arr: ARR, settings: EvalSettings) -> None:
        self.arr, self.settings = arr, settings
        self.readers = {} if settings.reader is None else {r: make_view_reader(settings.reader, r)
                                                           for r in ("region", "find")}
        self.retriever = None
        if NEEDS_RETRIEVER in settings.methods:
            self.retriever = page_retriever(arr)

    def identity(self) -> tuple[dict, dict]:
        s = self.settings
        # readings: rows of both readings (region and find) never mix with rows of the region reading alone, nor
        # with find readings of other views (find_views); the budget rule's legible side: rows split under another
        # rule never mix with these; what text-layer pages are ranked on (their ink since it became the default):
        # rows ranked on the ARR's relevance never mix with these (the typed floor, the shapes' boost and the shaped
        # words' rest are in arr_settings, as for one image)
        return ({**arr_settings(self.arr), "task": "contexts", "reader": s.reader, "margin_px": s.margin_px,
                 "readings": ["region", "find"], "find_views": list(FIND_VIEWS), "ranking": s.weights(),
                 "text_tokenizer": tokenizer_name(), "contexts": s.contexts, "gestalt_legible_side": LEGIBLE_SIDE,
                 "layer_relevance": LAYER_RELEVANCE},
                {} if self.retriever is None else {NEEDS_RETRIEVER: {"retriever": self.retriever.name}})

    def rows(self, unit: Unit, todo: list, done: set) -> Iterator[list[dict]]:
        item: ContextItem = unit.payload
        start = time.perf_counter()
        with torch.inference_mode():
            try:
                # the lines' embeddings serve the context allocation (coc, equal_split) only
                seen = see_context(self.arr, item.load(), embed=any(
                    "relevance" in resolve(m, "context").needs for m in self.settings.methods))
            except (ValueError, OSError) as err:
                raise type(err)(f"context {item.context_id}: {err}") from err
        see_ms = (time.perf_counter() - start) * 1e3
        texts = page_texts(seen)
        n_text = text_tokens("\n\n".join(texts)) if any(t.strip() for t in texts) else None
        orders = {}
        if NEEDS_BM25 in self.settings.methods:
            orders["bm25"] = BM25Pages(texts).rank
        if self.retriever is not None:  # the pages' lines embedded once, for every question
            orders["retrieval"] = RetrievalPages(self.retriever, [[t for t, _ in ls] for ls in seen.lines]).rank
        views: dict = {}  # whole views read by the find reading, shared by the questions (see measure)
        for q in todo:
            yield question_rows(item, q, seen, self.arr, self.settings, self.readers, done, n_text, orders, see_ms,
                                views)

    def flush(self) -> list[dict]:
        return []


def answer_boxes(q: ContextQuestion, image: torch.Tensor, source_size: tuple[int, int],
                 boxes: Sequence | None = None) -> list[tuple[float, ...]]:
    """The question's boxes (or ``boxes``) moved from the page's pixels onto its canvas (``image``: the page's
    canvas [3, H, W])."""
    sy, sx = image.shape[-2] / source_size[0], image.shape[-1] / source_size[1]
    return [(b[0] * sy, b[1] * sx, b[2] * sy, b[3] * sx) for b in (q.boxes if boxes is None else boxes)]


def measure(plan: Plan | None, image: torch.Tensor, cell: int, options: Sequence[Sequence], answers: Sequence[str],
            readers: dict[str, Any], margin_px: float, views: dict | None = None, page: int = 0) -> dict[str, Any]:
    """What one page's plan shows of the answer; a page not sent scores 0.

    ``options``: the answer's occurrences on the page, each its boxes (canvas px; ``[[]]``: none known).
    ``readers``: ``region`` and ``find`` readers (:func:`make_view_reader`), or {} for no reading. ``views``: the
    find reading's text of whole views that do not depend on the question (a full or downscaled page), by
    (``page``, plan): every question on the page reads them once.

    Returns ``hit`` (the page gets full-resolution tokens), ``coverage`` and ``reading``/``prediction`` of the
    occurrence read best (then covered best), ``strict`` (the best-covered occurrence has >= 0.5 of its area in
    full-resolution cells; NaN without boxes) and ``found``/``found_text`` (the find reading of the whole view).
    """
    boxed = [boxes for boxes in options if boxes]
    read = bool(readers)
    if plan is None:
        zero = 0.0 if boxed else math.nan
        return {"hit": 0, "coverage": zero, "strict": zero, "reading": 0.0 if read else None,
                "prediction": "" if read else None, "found": 0.0 if read else None, "found_text": "" if read else None}
    hit_cells = cell_mask(plan)  # the full-resolution cells: all of a full plan, the saccades, 1 x 1 squares
    full_px = cells_to_pixels(hit_cells, cell).float()  # 0 / 1: the same in float32
    covered = []
    for boxes in boxed:
        mask = paint_boxes(torch.tensor(boxes, dtype=torch.float32), torch.ones(len(boxes)), tuple(image.shape[-2:]))
        covered.append(float((mask * full_px).sum() / mask.sum().clamp_min(1e-9)))
    out = {"hit": int(hit_cells.sum() > 0), "strict": float(max(covered) >= 0.5) if covered else math.nan,
           "coverage": max(covered) if covered else math.nan, "reading": None, "prediction": None, "found": None,
           "found_text": None}
    if not read:
        return out
    view = render(plan, image, cell)
    key = (page, plan.kind, plan.native) if plan.kind in ("full", "native") and views is not None else None
    text = views.get(key) if key is not None else None
    if text is None and key is not None:
        text = views[key] = readers["find"].read(view)
    out["found"], out["found_text"], _ = find_reading(readers["find"], plan, image, cell, list(answers), view, text)
    if not boxed:  # not told where: the region reading is the find reading
        out["reading"], out["prediction"] = out["found"], out["found_text"]
        return out
    reads = [read_region(readers["region"], view, boxes, margin_px) for boxes in boxed]
    best = max(range(len(boxed)), key=lambda i: (contains_score(reads[i], list(answers)), covered[i]))
    out.update(coverage=covered[best], reading=contains_score(reads[best], list(answers)), prediction=reads[best])
    return out


def page_texts(seen: Any) -> list[str]:
    """Each page's text: its text layer (or rendered words), else the words OCR read on it."""
    return [p.text if p.words else " ".join(w for w, _ in ws) for p, ws in zip(seen.context.pages, seen.words)]


def question_rows(item: ContextItem, q: ContextQuestion, seen: Any, arr: ARR, settings: EvalSettings,
                  readers: dict[str, Any], done: set, n_text: int | None, orders: dict[str, Any],
                  see_ms: float, views: dict | None = None) -> list[dict]:
    """Every row one question asks for and ``done`` does not hold: per budget the context allocation is made once
    (when a method asked reads it: ``coc`` sends it, ``equal_split`` ranks by its scores). ``orders``: the rank
    functions (question -> page order) of the text-ranked methods, ``bm25`` and ``retrieval``."""
    n = len(seen)
    if any(not 0 <= a < n for a in q.pages):
        raise ValueError(f"question {q.record_id}: answer page(s) {list(q.pages)} outside the context's "
                         f"{n} pages")
    grids = [tuple(int(v) for v in g) for scene in seen.scenes for g in scene.extents]
    full, cell = sum(h * w for h, w in grids), seen.scenes[0].canvas.cell
    images = {a: seen.image(a) for a in q.pages}
    # per answer page, the box sets measured (the best counts): the question's boxes, or every occurrence found
    first = [q.boxes] if q.boxes or not q.found else list(q.found)
    targets = [(a, [answer_boxes(q, images[a], seen.context.pages[a].size, b) for b in first] if i == 0 else [[]])
               for i, a in enumerate(q.pages)]
    ranked = {how: rank(q.question) for how, rank in orders.items()}
    budgets = settings.parsed()
    rows = []
    for budget in ("full", *settings.budgets):
        methods = [m for m in settings.methods if (m == "full") == (budget == "full")
                   and (q.record_id, m, budget) not in done]
        if not methods:
            continue
        total = full if budget == "full" else budgets[budget].total(full, text_tokens=n_text, pages=n)
        inputs, alloc_ms = PagesInputs(grids, order=ranked.get("bm25"), retrieval_order=ranked.get("retrieval")), 0.0
        if any("relevance" in resolve(m, "context").needs for m in methods):
            start = time.perf_counter()
            with torch.inference_mode():
                alloc = allocate(arr, seen, q.question, Budget.parse(total), **settings.weights())
            alloc_ms = (time.perf_counter() - start) * 1e3
            inputs = PagesInputs(grids, [p.relevance for p in alloc.pages], [p.plan for p in alloc.pages],
                                 inputs.order, retrieval_order=inputs.retrieval_order)
        for method in methods:
            plans = page_plans(method, inputs, total)
            got = [measure(plans.get(a), images[a], cell, options, q.answers, readers, settings.margin_px, views, a)
                   for a, options in targets]
            sent = sum(rendered_tokens(p) for p in plans.values())
            best = max(range(len(got)), key=lambda i: got[i]["reading"] or 0.0)
            found = max(range(len(got)), key=lambda i: got[i]["found"] or 0.0)
            rows.append(row(item.dataset, q.record_id, item.context_id, q.kind, q.question, q.answers[0], method,
                            budget, sent, full, settings.reader, budget_tokens=total, text_tokens=n_text,
                            compression=n_text / sent if n_text else None, pages=n, answer_pages=list(q.pages),
                            page_hit=sum(g["hit"] for g in got) / len(got), page_hit_strict=got[0]["strict"],
                            coverage=got[0]["coverage"], reading=got[best]["reading"],
                            prediction=got[best]["prediction"], reading_find=got[found]["found"],
                            prediction_find=got[found]["found_text"], see_ms=round(see_ms, 1),
                            alloc_ms=round(alloc_ms, 1)))
    return rows
