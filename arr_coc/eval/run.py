"""The OCR evaluation loop: records x methods x token counts -> rows (does the allocation keep the answer?).

For every record (image, question, answer, answer boxes) and every token count, each method of
:mod:`arr_coc.allocators.methods` makes a :class:`arr_coc.engine.plan.Plan`; a row records where its
full-resolution tokens landed (:mod:`arr_coc.eval.metrics`) and whether a real OCR engine still reads
the answer in the plan rendered as the VLM would see it (:func:`arr_coc.eval.reading.render`).

Rows go to ``<out>/<dataset>/records.jsonl`` one record at a time (:class:`arr_coc.eval.store.RowStore`):
an interrupted run loses at most the record in flight and a rerun skips what is done; the folder
records the settings that made its rows and refuses a run with other settings; concurrent runs into
one folder never write a row twice. :mod:`arr_coc.eval.report` turns the rows into tables and plots.
"""
from __future__ import annotations

import hashlib
import json
import math
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch
from torch import Tensor
from tqdm import tqdm

from arr_coc.allocators.methods import METHODS as REGISTRY
from arr_coc.allocators.methods import (
    MethodInputs,
    build_samplers,
    cell_mask,
    make_plan,
    methods_for,
    square_sizes,
)
from arr_coc.budget import budget_tokens
from arr_coc.config import check_float, check_int
from arr_coc.data.datasets import Record
from arr_coc.engine.pipeline import ARR
from arr_coc.engine.plan import Plan
from arr_coc.eval.metrics import allocation_metrics, box_mask
from arr_coc.eval.reading import (
    READERS,
    READINGS,
    best_window,
    make_view_reader,
    read_region,
    render,
    rendered_tokens,
    scale_boxes,
)
from arr_coc.eval.store import SETTINGS_FORMAT, RowStore, requested
from arr_coc.weights import load_learned_methods, weights_digest

DEFAULT_TOKENS = ("5%", "10%", "25%", "50%")  # total visual tokens per row: shares of the full canvas
MARGIN_PX = 8  # canvas px around the answer box when reading: room for ascenders without the next field
METHODS = methods_for("ocr")  # the methods the OCR readers can read, in table order
DEFAULT_METHODS = methods_for("ocr", default=True)  # what a run evaluates unless told otherwise

_NAN = float("nan")
_BLIND = {"coverage": _NAN, "hit": _NAN, "iou": _NAN, "secondary": _NAN, "peripheral": _NAN}


def record_seed(seed: int, record_id: str) -> int:
    """The seed of one record's stochastic choices (random baseline, stochastic samplers): run seed x record."""
    return int.from_bytes(hashlib.blake2b(f"{seed}:{record_id}".encode(), digest_size=8).digest(), "little") >> 1


@dataclass
class EvalSettings:
    """What an OCR evaluation runs: the methods, each at every total token count of ``tokens``.

    ``tokens`` holds token specs (T): a count (``529``) or a share of the full-resolution canvas
    (``"25%"``). A row's ``budget`` column holds the spec as asked (``"25%"``, ``"529"``; ``"full"`` for a
    method with one plan), so result folders and the committed tables stay valid; ``tokens`` holds
    what was sent.
    """

    methods: Sequence[str] = DEFAULT_METHODS
    tokens: Sequence[str | int] = DEFAULT_TOKENS
    reader: str | None = "tesseract"  # None: coverage only
    reading: str = "region"  # READINGS: "region" reads the answer box + margin, "find" the whole view
    seed: int = 0
    margin_px: int = MARGIN_PX
    patch_options: dict | None = None  # keyword options of the patchers, e.g. {"size_prior": 2.0}
    learned: dict | None = None  # weights of "selector" / "pruner" (default: the packaged ones)
    keep_cells: bool = False  # rows also hold the chosen cells ("cells": [[y, x], ...]) of the cell methods
    fresh: bool = False  # replace rows of an output folder made with other settings (else: refuse)

    def __post_init__(self) -> None:
        if isinstance(self.methods, str) or isinstance(self.tokens, (str, int)):
            raise TypeError("methods and tokens are lists, e.g. methods=('topk',), tokens=('25%',)")
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown:
            raise ValueError(f"unknown methods {unknown}; known: {', '.join(METHODS)}")
        if not self.methods or not self.tokens:
            raise ValueError("name at least one method and one token count")
        if self.reader is not None:
            READERS.get(self.reader)  # fail now, not after the first image
        if self.reading not in READINGS:
            raise ValueError(f"unknown reading {self.reading!r}; choose one of {', '.join(READINGS)}")
        for b in self.tokens:
            budget_tokens(b, 10**9)
        self.seed = check_int("seed", self.seed, 0)
        self.margin_px = check_int("margin", self.margin_px, 0)
        if (self.patch_options or {}).get("size_prior") is not None:
            check_float("size_prior", self.patch_options["size_prior"], strict=False)


def arr_settings(arr: ARR) -> dict:
    """What an ARR's rows depend on: channels, canvas, gestalt, scorer and its weights, sampler, question encoder."""
    c = arr.config
    encoder = arr.query_encoder
    return {"format": SETTINGS_FORMAT, "channels": list(arr.channels), "texture_options": c.texture.options,
            "canvas": vars(c.canvas), "gestalt_grid": c.gestalt.grid, "scorer": c.scorer.name,
            "sampler": {"name": c.sampler.name, "kwargs": c.sampler.kwargs},  # the "arr" method's sampler
            "scorer_weights": weights_digest(arr.scorer), "weights_source": arr.weights_source,
            "query_encoder": f"{type(encoder).__name__}/{encoder.dim}"}


def run_settings(arr: ARR, settings: EvalSettings) -> dict:
    """Everything besides its key that a row depends on: recorded in the output folder and checked."""
    return {**arr_settings(arr), "reader": settings.reader, "reading": settings.reading,
            "margin_px": settings.margin_px, "seed": settings.seed, "patch_options": settings.patch_options or {}}


def evaluate(records: Sequence[Record], arr: ARR, out_dir: Path, settings: EvalSettings | None = None,
             progress: bool = True) -> Path:
    """Evaluate ``records`` (grouped by image, so each texture is computed once); returns the JSONL path.

    Raises:
        ValueError: ``out_dir`` holds rows made with other settings (unless ``settings.fresh``), an image
            cannot be read (named), or a record's boxes lie outside its image.
    """
    settings = settings or EvalSettings()
    store = RowStore(Path(out_dir))
    reader = make_view_reader(settings.reader, settings.reading) if settings.reader else None
    samplers = build_samplers(settings.methods)
    learned = load_learned_methods(arr, settings)
    store.claim(json.loads(json.dumps(run_settings(arr, settings), default=str)),
                {m: weights_digest(net) for m, net in learned.items()}, fresh=settings.fresh)
    by_image: dict[str, list[Record]] = defaultdict(list)
    for r in records:
        by_image[r.image_id].append(r)
    # closed on the way out of an interruption too, so the message that follows starts its own line
    with tqdm(total=len(records), desc=f"eval {records[0].dataset if records else ''}", disable=not progress) as bar:
        for recs in by_image.values():
            done = store.done()  # re-read: another run into the same folder may have done some
            todo = [r for r in recs if not requested([r], settings.methods, settings.tokens) <= done]
            bar.update(len(recs) - len(todo))
            if not todo:
                continue
            with torch.no_grad():
                try:
                    scene = arr.see(todo[0].image)
                except (ValueError, TypeError, OSError) as err:
                    raise type(err)(f"record {todo[0].record_id}: {err}") from err
                vector = arr.gestalt(scene, 1).vector
                for record in todo:
                    relevance, query_emb = arr.score(scene, [record.question], vector)
                    maps = learned_maps(learned, arr, scene, record.question, query_emb) if learned else None
                    store.append(allocation_rows(record, scene.canvas, relevance.map, query_emb, samplers, reader,
                                                 settings, done, maps=maps, arr=arr))
                    bar.update(1)
    return store.path


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
                    maps: dict[str, Tensor] | None = None, arr: ARR | None = None) -> Iterable[dict]:
    """Rows of one record (a one-image canvas) for every method and token count, given its relevance map.

    ``samplers``: :func:`arr_coc.allocators.methods.build_samplers` of the methods. ``arr``: the ARR whose
    sampler the ``arr`` method uses (without it that method gives no rows). ``suffix`` tells scorers apart
    in one table (``topk@learned``); the scorer-free rows (full, uniform image, random) come only with the
    empty suffix. ``maps`` holds the trained allocators' own maps (:func:`learned_maps`); their methods
    are skipped without one.
    """
    cell = canvas.cell
    hc, wc = canvas.sizes[0][0] // cell, canvas.sizes[0][1] // cell
    full = canvas.full_tokens[0]
    _check_boxes(record, canvas.image_sizes[0])
    target = scale_boxes(record.boxes_px, canvas.scales[0])
    others = scale_boxes(record.others_px, canvas.scales[0])
    pixels = canvas.pixels[0, :, : hc * cell, : wc * cell]
    inputs = MethodInputs(canvas, relevance, query_emb, sampler=arr.sampler if arr is not None else None,
                          sampler_seed=arr.config.seed if arr is not None else 0, samplers=samplers, maps=maps or {},
                          seed=record_seed(settings.seed, record.record_id), options=settings.patch_options or {})
    readable = reader is not None and bool(record.answer.strip())

    def read(plan: Plan) -> dict:
        """The reading of one plan's view: the answer region's text, or the best span of the whole view's."""
        if not readable:
            return {"prediction": None, "reading": None}
        view = render(plan, pixels, cell)
        if settings.reading == "find":  # not told where the answer is: it counts only if the view shows it
            text = reader.read(view)
            score, span = best_window(text, record.answer)
            return {"prediction": span, "reading": score, "read_words": len(text.split())}
        prediction = read_region(reader, view, target, settings.margin_px)
        return {"prediction": prediction, "reading": best_window(prediction, record.answer)[0]}

    def row(method: str, budget: str, plan: Plan, start: float) -> dict:
        metrics = plan_metrics(plan, cell, target, others, settings.keep_cells)
        return {
            "dataset": record.dataset, "record_id": record.record_id, "image_id": record.image_id,
            "kind": record.kind, "question": record.question, "answer": record.answer, "method": method,
            "budget": budget, "tokens": rendered_tokens(plan), "full_tokens": full, **metrics, **read(plan),
            "ms": round((time.perf_counter() - start) * 1e3, 1),
        }

    names = [n for n in settings.methods if REGISTRY.get(n).uses_scorer or not suffix]  # one scorer-free row
    for name in names:
        if not REGISTRY.get(name).per_tokens and (record.record_id, name, "full") not in done:
            start = time.perf_counter()
            yield row(name, "full", make_plan(name, inputs, full), start)
    for spec in settings.tokens:
        total = budget_tokens(spec, full)
        for name in names:
            if not REGISTRY.get(name).per_tokens or (record.record_id, name + suffix, str(spec)) in done:
                continue
            start = time.perf_counter()
            plan = make_plan(name, inputs, total)
            if plan is not None:
                yield row(name + suffix, str(spec), plan, start)


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
