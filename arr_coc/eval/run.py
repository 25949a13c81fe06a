"""Images read by OCR: every method's plan of one image at every budget, and whether the answer is still read.

The image reader of the evaluation loop (:func:`arr_coc.eval.evaluate.evaluate`): for every record (image,
question, answer, answer boxes) and every budget, each method of :mod:`arr_coc.allocators.methods` makes a
:class:`arr_coc.engine.plan.Plan`; a row records where its full-resolution tokens landed
(:mod:`arr_coc.eval.metrics`) and whether a real OCR engine still reads the answer in the plan rendered as
the VLM would see it (:func:`arr_coc.eval.reading.render`). The texture of an image is computed once for
all its questions.
"""
from __future__ import annotations

import hashlib
import math
import time
from typing import Any, Iterable, Iterator, Sequence

import torch
from torch import Tensor

from arr_coc.allocators.methods import METHODS as REGISTRY
from arr_coc.allocators.methods import (
    MethodInputs,
    build_samplers,
    cell_mask,
    make_plan,
    square_sizes,
)
from arr_coc.budget import LEGIBLE_MIN_LINES, LEGIBLE_SHARE, LEGIBLE_TEXT_PX
from arr_coc.contexts.allocate import IMAGE_RETRIEVAL_WEIGHT, image_placing
from arr_coc.contexts.line_embeddings import CHUNK_STRIDE, REFINE_CHUNKS
from arr_coc.contexts.line_values import SHAPE_BOOST, TYPED_FLOOR
from arr_coc.contexts.ranking import BM25_WEIGHT, RETRIEVAL_WEIGHT, TOKEN_REST
from arr_coc.data.datasets import Record
from arr_coc.engine.channels.text import text_heights
from arr_coc.engine.pipeline import ARR
from arr_coc.engine.plan import Plan
from arr_coc.eval.evaluate import Unit, row
from arr_coc.eval.metrics import allocation_metrics, box_mask
from arr_coc.eval.reading import (
    FIND_VIEWS,
    best_window,
    find_reading,
    make_view_reader,
    read_region,
    render,
    rendered_tokens,
    scale_boxes,
)
from arr_coc.eval.settings import EvalSettings
from arr_coc.eval.store import SETTINGS_FORMAT
from arr_coc.weights import load_learned_methods, weights_digest

_NAN = float("nan")
_BLIND = {"coverage": _NAN, "hit": _NAN, "iou": _NAN, "secondary": _NAN, "peripheral": _NAN}


def record_seed(seed: int, record_id: str) -> int:
    """The seed of one record's stochastic choices (random baseline, stochastic samplers): run seed x record."""
    return int.from_bytes(hashlib.blake2b(f"{seed}:{record_id}".encode(), digest_size=8).digest(), "little") >> 1


def placing_settings(arr: ARR) -> dict:
    """What an ARR's placing of lines and images depends on besides its own settings: the rows of an OCR run
    (:func:`arr_settings`) and of a VLM run (``vlm_reader.run_identity``) record it alike."""
    # one image's gestalt where its text stays legible (budget.legible_gestalt): rows under two rules never mix
    return {"gestalt_legible_text": {"share": LEGIBLE_SHARE, "min_px": LEGIBLE_TEXT_PX},
            # one image placed by its relevance and its lines' retrieval (contexts.allocate.image_placing)
            "image_retrieval": {"weight": IMAGE_RETRIEVAL_WEIGHT, "retriever": arr.retriever.name,
                                "min_lines": LEGIBLE_MIN_LINES},
            # the lines' scores: the retriever's cosine + BM25 (contexts.allocate.question_scores), a context's weight
            "line_scores": {"bm25_weight": BM25_WEIGHT, "retrieval_weight": RETRIEVAL_WEIGHT,
                            # coarse to fine (contexts.line_embeddings): one passage in three, the best chunks refined
                            "chunk_stride": CHUNK_STRIDE, "refine_chunks": REFINE_CHUNKS},
            # the lines' values for a question asking for a type or naming a shape (contexts.answer_types): the typed
            # lines' floor, the shaped lines' boost and the share of a shaped line beyond its shaped words
            "line_values": {"typed_floor": TYPED_FLOOR, "shape_boost": SHAPE_BOOST, "token_rest": TOKEN_REST}}


def arr_settings(arr: ARR) -> dict:
    """What an ARR's rows depend on: channels, canvas, gestalt, scorer and its weights, sampler, question encoder."""
    c = arr.config
    encoder = arr.query_encoder
    return {"format": SETTINGS_FORMAT, "channels": list(arr.channels), "texture_options": c.texture.options,
            "canvas": vars(c.canvas), "gestalt_grid": c.gestalt.grid, "scorer": c.scorer.name,
            "sampler": {"name": c.sampler.name, "kwargs": c.sampler.kwargs},  # the "arr" method's sampler
            "scorer_weights": weights_digest(arr.scorer), "weights_source": arr.weights_source,
            "query_encoder": f"{type(encoder).__name__}/{encoder.dim}", **placing_settings(arr)}


class ImageReading:
    """The loop's reader of images: OCR (``settings.reader``) or none (the allocation metrics only)."""

    shards = False

    def __init__(self, arr: ARR, settings: EvalSettings) -> None:
        self.arr, self.settings = arr, settings
        self.reader = make_view_reader(settings.reader, settings.reading) if settings.reader else None
        self.samplers = build_samplers(settings.methods)
        self.learned = load_learned_methods(arr, settings)
        self.desc = ""

    def identity(self) -> tuple[dict, dict]:
        s = self.settings
        find = {"find_views": list(FIND_VIEWS)} if s.reading == "find" else {}  # what the find reading reads
        return ({**arr_settings(self.arr), "reader": s.reader, "reading": s.reading, "margin_px": s.margin_px,
                 "seed": s.seed, "patch_options": s.patch_options or {}, **find},
                {m: weights_digest(net) for m, net in self.learned.items()})

    def rows(self, unit: Unit, todo: list, done: set) -> Iterator[list[dict]]:
        arr = self.arr
        with torch.no_grad():
            try:
                scene = arr.see(todo[0].image)
            except (ValueError, TypeError, OSError) as err:
                raise type(err)(f"record {todo[0].record_id}: {err}") from err
            vector = arr.gestalt(scene, 1).vector
            heights = None
            for record in todo:
                relevance, query_emb = arr.score(scene, [record.question], vector)
                if heights is None:  # once: the image's lines as the text channels read them scoring it
                    heights = text_heights(arr, scene)
                maps = learned_maps(self.learned, arr, scene, record.question, query_emb) if self.learned else None
                placing = image_placing(arr, scene, relevance.map, record.question)  # as allocate places one image
                yield list(allocation_rows(record, scene.canvas, placing, query_emb, self.samplers, self.reader,
                                           self.settings, done, maps=maps, arr=arr, text_height=heights[0]))

    def flush(self) -> list[dict]:
        return []


@torch.no_grad()
def learned_maps(learned: dict[str, Any], arr: ARR, scene: Any, question: str, query_emb: Tensor) -> dict[str, Tensor]:
    """Each trained allocator's map [1, Hc, Wc] on a one-image scene (-inf off the image).

    The selector reads the canvas pixels; the pruner reads every cell's encoded token -- the full
    texture stack, question channels included -- with the question embedding.
    """
    maps, valid = {}, scene.canvas.valid
    if "selector" in learned:
        maps["selector"] = learned["selector"].importance(scene.canvas.pixels, valid)
    if "pruner" in learned:
        cells = arr.cell_stack(scene, [question])[0]  # [C, Hc, Wc]
        score = learned["pruner"].score(cells.flatten(1).T[None].float(), query_emb.float())
        maps["pruner"] = score.view(valid.shape).masked_fill(~valid, -torch.inf)
    return maps


def plan_metrics(plan: Plan, cell: int, target: Sequence, others: Sequence, keep_cells: bool = False) -> dict:
    """Where a plan's full-resolution tokens land relative to the answer (:func:`allocation_metrics`).

    A squares plan adds ``seen``: the answer seen at all, through larger, shrunk squares too.
    """
    if plan.kind == "full":
        return {"coverage": 1.0, "hit": 1.0, "iou": _NAN, "secondary": 1.0, "peripheral": 1.0}
    if plan.kind == "native":
        return dict(_BLIND)
    metrics = allocation_metrics(cell_mask(plan), cell, target, others).as_dict()
    if plan.kind == "cells" and keep_cells:
        metrics["cells"] = plan.cells.tolist()
    if plan.kind == "squares":
        hc, wc = plan.grid
        answer = box_mask(target, hc * cell, wc * cell)
        seen_px = (square_sizes(plan) > 0).double().repeat_interleave(cell, 0).repeat_interleave(cell, 1)
        metrics["seen"] = float((answer * seen_px).sum() / answer.sum()) if answer.sum() > 0 else _NAN
    return metrics


def allocation_rows(record: Record, canvas: Any, relevance: Tensor, query_emb: Tensor, samplers: dict,
                    reader: Any, settings: EvalSettings, done: set = frozenset(), suffix: str = "",
                    maps: dict[str, Tensor] | None = None, arr: ARR | None = None,
                    text_height: float | None = None) -> Iterable[dict]:
    """Rows of one record (a one-image canvas) for every method and token count, given its relevance map.

    ``samplers``: :func:`arr_coc.allocators.methods.build_samplers` of the methods. ``arr``: the ARR whose
    sampler the ``arr`` method uses (without it that method gives no rows). ``suffix`` tells scorers apart
    in one table (``topk@learned``); the scorer-free rows (full, uniform image, random) come only with the
    empty suffix. ``maps`` holds the trained allocators' own maps (:func:`learned_maps`); their methods
    are skipped without one. ``text_height``: the image's text lines' median height (canvas px,
    :func:`~arr_coc.engine.channels.text.text_heights`), which the gestalt + saccades split reads.
    """
    settings = settings if settings.scope == "image" else settings.resolve("image")
    cell = canvas.cell
    hc, wc = canvas.sizes[0][0] // cell, canvas.sizes[0][1] // cell
    full = canvas.full_tokens[0]
    _check_boxes(record, canvas.image_sizes[0])
    target = scale_boxes(record.boxes_px, canvas.scales[0])
    others = scale_boxes(record.others_px, canvas.scales[0])
    pixels = canvas.pixels[0, :, : hc * cell, : wc * cell]
    inputs = MethodInputs(canvas, relevance, query_emb, sampler=arr.sampler if arr is not None else None,
                          sampler_seed=arr.config.seed if arr is not None else 0, samplers=samplers, maps=maps or {},
                          seed=record_seed(settings.seed, record.record_id), options=settings.patch_options or {},
                          text_height=text_height)
    readable = reader is not None and bool(record.answer.strip())

    def read(plan: Plan) -> dict:
        """The reading of one plan's view: the answer region's text, or the best span of the whole view's."""
        if not readable:
            return {"prediction": None, "reading": None}
        view = render(plan, pixels, cell)
        if settings.reading == "find":  # not told where the answer is: it counts only if the view shows it
            score, span, words = find_reading(reader, plan, pixels, cell, record.answer, view)
            return {"prediction": span, "reading": score, "read_words": words}
        prediction = read_region(reader, view, target, settings.margin_px)
        return {"prediction": prediction, "reading": best_window(prediction, record.answer)[0]}

    def one(method: str, budget: str, plan: Plan, start: float) -> dict:
        metrics = plan_metrics(plan, cell, target, others, settings.keep_cells)
        return row(record.dataset, record.record_id, record.image_id, record.kind, record.question, record.answer,
                   method, budget, rendered_tokens(plan), full, settings.reader, **metrics, **read(plan),
                   ms=round((time.perf_counter() - start) * 1e3, 1))

    names = [n for n in settings.methods if REGISTRY.get(n).uses_scorer or not suffix]  # one scorer-free row
    for name in names:
        if not REGISTRY.get(name).per_tokens and (record.record_id, name, "full") not in done:
            start = time.perf_counter()
            yield one(name, "full", make_plan(name, inputs, full), start)
    for label, budget in settings.parsed().items():
        total = budget.total(full)
        for name in names:
            if not REGISTRY.get(name).per_tokens or (record.record_id, name + suffix, label) in done:
                continue
            start = time.perf_counter()
            plan = make_plan(name, inputs, total)
            if plan is not None:
                yield one(name + suffix, label, plan, start)


def _check_boxes(record: Record, size: tuple[int, int]) -> None:
    """Every answer box is finite, non-empty and inside the image as displayed, or the record is refused.

    A box outside would give no answer area and a NaN row that silently drops out of the means.
    """
    h, w = size
    for box in record.boxes_px:
        y0, x0, y1, x1 = box
        inside = all(math.isfinite(v) for v in box) and 0 <= y0 < y1 <= h and 0 <= x0 < x1 <= w
        if not inside:
            raise ValueError(f"record {record.record_id}: answer box (y0, x0, y1, x1) {tuple(box)} is not a "
                             f"non-empty box inside its {w}x{h} px image {record.image}")
