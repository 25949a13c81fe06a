"""Evaluation harness: does the allocation keep the answer? dataset x method x budget, at equal tokens.

For every record (image, question, answer, answer boxes) and every token budget it measures where
the saccades landed (:mod:`arr_coc.eval.metrics`) and whether a real OCR engine still reads the answer
in what the VLM would see (:mod:`arr_coc.eval.reading`): the foveated view for the samplers, one
uniformly downsampled image with the same token count, and the full-resolution canvas (upper bound).

Rows go to ``<out>/<dataset>/records.jsonl`` one record at a time (:class:`arr_coc.eval.store.RowStore`):
an interrupted run loses at most the record in flight and a rerun skips what is done; the folder
records the settings that made its rows and refuses a run with other settings; concurrent runs into
one folder never write a row twice. :func:`summarize` turns the rows into a CSV, a markdown table and
plots, covering exactly the records, methods and budgets a run asked for.
"""
from __future__ import annotations

import hashlib
import inspect
import json
import math
import time
from collections import defaultdict
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Protocol, Sequence

import torch
from torch import Tensor
from tqdm import tqdm

from arr_coc.data.datasets import Record
from arr_coc.config import check_float, check_int
from arr_coc.eval.metrics import allocation_metrics
from arr_coc.eval.store import SETTINGS_FORMAT, RowStore, requested
from arr_coc.budget import budget_tokens, split_budget
from arr_coc.pipeline import ARR
from arr_coc.eval.reading import READERS, contains_score, downsampled_view, foveated_view, read_region, scale_boxes
from arr_coc.registry import Registry
from arr_coc.samplers import SAMPLERS, topk_cells
from arr_coc.weights import (  # noqa: F401  (trained_on: callers still import it from here)
    load_learned_methods, refuse_leakage, trained_on, weights_digest)

DEFAULT_BUDGETS = ("5%", "10%", "25%", "50%")
MARGIN_PX = 8  # canvas px around the answer box when reading: room for ascenders without the next field


@dataclass
class RecordInputs:
    """What every allocation method may look at for one record: a one-image canvas cropped to its
    ``hc x wc`` cells, the question's relevance and embedding, the answer boxes in canvas pixels."""

    canvas: Any
    pixels: Tensor  # [3, hc * cell, wc * cell]
    relevance: Tensor  # [1, Hc, Wc]
    query_emb: Tensor
    target: list
    others: list
    samplers: dict  # name -> sampler instance
    maps: dict[str, Tensor]  # the trained allocators' own maps (learned_maps)
    seed: int  # the record's seed (random baseline, stochastic samplers)
    patch_options: dict
    keep_cells: bool = False  # rows list the chosen cells (saccade methods)

    @property
    def cell(self) -> int:
        return self.canvas.cell

    @property
    def cells_hw(self) -> tuple[int, int]:
        return self.canvas.sizes[0][0] // self.cell, self.canvas.sizes[0][1] // self.cell


@dataclass
class Allocated:
    """One method's answer at one budget: the pixels the reader sees, the tokens sent, the metrics."""

    view: Tensor
    tokens: int
    metrics: dict


class EvalMethod(Protocol):
    """An allocation method of the evaluation table.

    ``uses_scorer``: its rows depend on the relevance (False: one row per record whatever the scorer).
    ``per_budget``: one row per token budget (False: one row at the budget "full").
    ``allocate`` returns None where the method has nothing to send at this budget (a quadtree below its
    starting tiling, a trained allocator without weights).
    """

    uses_scorer: bool
    per_budget: bool

    def allocate(self, inputs: RecordInputs, total: int, grid: tuple[int, int], k: int) -> Allocated | None: ...


_NAN = float("nan")
_BLIND = {"coverage": _NAN, "hit": _NAN, "iou": _NAN, "secondary": _NAN, "peripheral": _NAN}


@dataclass(frozen=True)
class FullResolution:
    """The upper bound: every cell at full resolution."""

    uses_scorer: bool = False
    per_budget: bool = False

    def allocate(self, inputs: RecordInputs, total: int, grid: tuple[int, int], k: int) -> Allocated:
        everything = {"coverage": 1.0, "hit": 1.0, "iou": _NAN, "secondary": 1.0, "peripheral": 1.0}
        return Allocated(inputs.pixels, inputs.canvas.full_tokens[0], everything)


@dataclass(frozen=True)
class DownsampledImage:
    """The field's baseline: the whole image downsampled to the budget's token count."""

    uses_scorer: bool = False
    per_budget: bool = True

    def allocate(self, inputs: RecordInputs, total: int, grid: tuple[int, int], k: int) -> Allocated:
        view, used = downsampled_view(inputs.pixels, total, inputs.cell)
        return Allocated(view, used, _BLIND)


def _saccade_view(inputs: RecordInputs, sel: Any, grid: tuple[int, int], k: int) -> Allocated:
    hc, wc = inputs.cells_hw
    chosen = sel.mask(*inputs.canvas.grid)[0, :hc, :wc]
    metrics = allocation_metrics(chosen, inputs.cell, inputs.target, inputs.others).as_dict()
    if inputs.keep_cells:
        metrics["cells"] = sel.positions[0].tolist()
    view = foveated_view(inputs.pixels, sel.positions[0], inputs.cell, grid)
    return Allocated(view, grid[0] * grid[1] + k, metrics)


@dataclass(frozen=True)
class SamplerMethod:
    """Gestalt + K one-cell saccades from a sampler of :data:`arr_coc.samplers.SAMPLERS` on the relevance."""

    name: str
    uses_scorer: bool = True
    per_budget: bool = True

    def allocate(self, inputs: RecordInputs, total: int, grid: tuple[int, int], k: int) -> Allocated:
        generator = torch.Generator().manual_seed(inputs.seed)
        sel = inputs.samplers[self.name](inputs.relevance, k, valid=inputs.canvas.valid, query_emb=inputs.query_emb,
                                         generator=generator)
        return _saccade_view(inputs, sel, grid, k)


@dataclass(frozen=True)
class ArrSampler:
    """Gestalt + K saccades from the evaluated ARR's own sampler, called as ARR.forward calls it: with no
    options, what `arr-coc look`, `ask` and ARR() send."""

    uses_scorer: bool = True
    per_budget: bool = True

    def allocate(self, inputs: RecordInputs, total: int, grid: tuple[int, int], k: int) -> Allocated | None:
        if "arr" not in inputs.samplers:
            return None
        sel = inputs.samplers["arr"](inputs.relevance, k, valid=inputs.canvas.valid, query_emb=inputs.query_emb)
        return _saccade_view(inputs, sel, grid, k)


@dataclass(frozen=True)
class LearnedMethod:
    """Gestalt + the top K cells of a trained allocator's own map (arr_coc.allocators.pruning)."""

    name: str
    uses_scorer: bool = True
    per_budget: bool = True

    def allocate(self, inputs: RecordInputs, total: int, grid: tuple[int, int], k: int) -> Allocated | None:
        if self.name not in inputs.maps:
            return None
        return _saccade_view(inputs, topk_cells(inputs.maps[self.name], k, inputs.canvas.valid), grid, k)


@dataclass(frozen=True)
class PatchMethod:
    """Gestalt + variable-size squares from a patcher of :data:`arr_coc.allocators.patching.PATCHERS`,
    driven by the query's ``relevance`` or the image's Sobel ``edges`` (query-blind)."""

    patcher: str
    driver: str = "relevance"
    uses_scorer: bool = True
    per_budget: bool = True

    def allocate(self, inputs: RecordInputs, total: int, grid: tuple[int, int], k: int) -> Allocated | None:
        from arr_coc.allocators.patching import BudgetTooSmallError

        try:
            return Allocated(*_patch_view(self.patcher, self.driver, inputs.relevance, k, inputs.canvas, grid,
                                          inputs.target, inputs.others, inputs.patch_options))
        except BudgetTooSmallError:  # a quadtree cannot start below its first tiling: no row
            return None


# Every method of the table, in table order: the upper bound, the field's baseline, then the allocators.
EVAL_METHODS: Registry[EvalMethod] = Registry("evaluation method")
for _name, _method in (
        ("full", FullResolution()), ("uniform_image", DownsampledImage()),
        ("random", SamplerMethod("random", uses_scorer=False)), ("topk", SamplerMethod("topk")),
        ("arr", ArrSampler()), ("nms", SamplerMethod("nms")), ("stratified", SamplerMethod("stratified")),
        ("adaptive_stratified", SamplerMethod("adaptive_stratified")), ("log_polar", SamplerMethod("log_polar")),
        ("patches", PatchMethod("saliency")), ("patches_edges", PatchMethod("saliency", "edges")),
        ("quadtree", PatchMethod("quadtree")), ("selector", LearnedMethod("selector")),
        ("pruner", LearnedMethod("pruner"))):
    EVAL_METHODS.register(_name)(_method)
METHODS = tuple(EVAL_METHODS.names())
# trained allocators (arr_coc.allocators.pruning): top-K of their own map
LEARNED_METHODS = tuple(n for n in METHODS if isinstance(EVAL_METHODS.get(n), LearnedMethod))


def _record_seed(seed: int, record_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{seed}:{record_id}".encode(), digest_size=8).digest(), "little") >> 1


@dataclass
class EvalSettings:
    methods: Sequence[str] = METHODS
    budgets: Sequence[str | int] = DEFAULT_BUDGETS
    reader: str | None = "tesseract"  # None: coverage only
    seed: int = 0
    margin_px: int = MARGIN_PX
    patch_options: dict | None = None  # keyword options of the patchers, e.g. {"size_prior": 2.0}
    learned: dict | None = None  # weights of "selector" / "pruner" (default: the packaged ones)
    keep_cells: bool = False  # rows also hold the chosen cells ("cells": [[y, x], ...]) of the cell methods
    fresh: bool = False  # replace rows of an output folder made with other settings (else: refuse)

    def __post_init__(self) -> None:
        if isinstance(self.methods, str) or isinstance(self.budgets, (str, int)):
            raise TypeError("methods and budgets are lists, e.g. methods=('topk',), budgets=('25%',)")
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown:
            raise ValueError(f"unknown methods {unknown}; known: {', '.join(METHODS)}")
        if not self.methods or not self.budgets:
            raise ValueError("name at least one method and one budget")
        if self.reader is not None:
            READERS.get(self.reader)  # fail now, not after the first image
        for b in self.budgets:
            budget_tokens(b, 10**9)
        self.seed = check_int("seed", self.seed, 0)
        self.margin_px = check_int("margin", self.margin_px, 0)
        if (self.patch_options or {}).get("size_prior") is not None:
            check_float("size_prior", self.patch_options["size_prior"], strict=False)


def _done_keys(path: Path) -> set[tuple[str, str, str]]:
    """Keys of the rows already in ``<folder>/records.jsonl`` (see :class:`RowStore`)."""
    return RowStore(path.parent).done()


def _keys(record: Record, settings: EvalSettings) -> list[tuple[str, str, str]]:
    return sorted(requested([record], settings.methods, settings.budgets))


def run_settings(arr: ARR, settings: EvalSettings) -> dict:
    """Everything besides its key that a row depends on: recorded in the output folder and checked."""
    c = arr.config
    encoder = arr.query_encoder
    return {"format": SETTINGS_FORMAT, "channels": list(arr.channels), "texture_options": c.texture.options,
            "canvas": vars(c.canvas), "gestalt_grid": c.gestalt.grid, "scorer": c.scorer.name,
            "sampler": {"name": c.sampler.name, "kwargs": c.sampler.kwargs},  # the "arr" method's sampler
            "scorer_weights": weights_digest(arr.scorer), "weights_source": arr.weights_source,
            "query_encoder": f"{type(encoder).__name__}/{encoder.dim}", "reader": settings.reader,
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
    reader = READERS.get(settings.reader)() if settings.reader else None
    samplers = {m: SAMPLERS.get(m)() for m in settings.methods if m in SAMPLERS}
    if "arr" in settings.methods:
        samplers["arr"] = arr.select
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
            todo = [r for r in recs if not set(_keys(r, settings)) <= done]
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
                    store.append(_evaluate_record(record, scene, vector, arr, samplers, reader, settings, done,
                                                  learned))
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


def _evaluate_record(record, scene, vector, arr, samplers, reader, settings, done, learned=None) -> Iterable[dict]:
    relevance, query_emb = arr.score(scene, [record.question], vector)
    maps = learned_maps(learned, arr, scene, record.question, query_emb) if learned else None
    yield from allocation_rows(record, scene.canvas, relevance.map, query_emb, samplers, reader, settings, done,
                               maps=maps)


def allocation_rows(record: Record, canvas: Any, relevance: Tensor, query_emb: Tensor, samplers: dict,
                    reader: Any, settings: EvalSettings, done: set = frozenset(), suffix: str = "",
                    maps: dict[str, Tensor] | None = None) -> Iterable[dict]:
    """Rows of one record (a one-image canvas) for every method and budget, given its relevance map.

    ``suffix`` tells scorers apart in one table (``topk@learned``); the scorer-free rows (full,
    uniform image, random) come only with the empty suffix. ``maps`` holds the trained allocators' own
    maps (:func:`learned_maps`); their methods are skipped without one.
    """
    cell = canvas.cell
    hc, wc = canvas.sizes[0][0] // cell, canvas.sizes[0][1] // cell
    full = canvas.full_tokens[0]
    _check_boxes(record, canvas.image_sizes[0])
    target = scale_boxes(record.boxes_px, canvas.scales[0])
    inputs = RecordInputs(canvas, canvas.pixels[0, :, : hc * cell, : wc * cell], relevance, query_emb, target,
                          scale_boxes(record.others_px, canvas.scales[0]), samplers, maps or {},
                          _record_seed(settings.seed, record.record_id), settings.patch_options or {},
                          settings.keep_cells)
    readable = reader is not None and bool(record.answer.strip())

    def row(method: str, budget: str, got: Allocated, start: float) -> dict:
        prediction = read_region(reader, got.view, target, settings.margin_px) if readable else None
        return {
            "dataset": record.dataset, "record_id": record.record_id, "image_id": record.image_id,
            "question": record.question, "answer": record.answer, "method": method, "budget": budget,
            "tokens": got.tokens, "full_tokens": full, **got.metrics, "prediction": prediction,
            "reading": contains_score(prediction, record.answer) if readable else None,
            "ms": round((time.perf_counter() - start) * 1e3, 1),
        }

    methods = [(name, EVAL_METHODS.get(name)) for name in settings.methods]
    methods = [(name, m) for name, m in methods if m.uses_scorer or not suffix]  # one scorer-free row is enough
    for name, method in methods:
        if not method.per_budget and (record.record_id, name, "full") not in done:
            start = time.perf_counter()
            yield row(name, "full", method.allocate(inputs, full, (hc, wc), 0), start)
    for spec in settings.budgets:
        total = budget_tokens(spec, full)
        grid, k = split_budget(total, (hc, wc))
        for name, method in methods:
            if not method.per_budget or (record.record_id, name + suffix, str(spec)) in done:
                continue
            start = time.perf_counter()
            got = method.allocate(inputs, total, grid, k)
            if got is not None:
                yield row(name + suffix, str(spec), got, start)


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


def _patch_view(name: str, driver: str, relevance: Tensor, k: int, canvas: Any, grid: tuple[int, int], target,
                others, options: dict) -> tuple[Tensor, int, dict]:
    """A variable-size allocator's view (gestalt + patches, each seen at one cell), tokens, metrics.

    ``driver`` is the map it allocates by: the query's ``relevance`` or the image's Sobel ``edges``
    (query-blind). Coverage, hit and IoU count the answer seen at full resolution (1x1 patches);
    ``seen`` adds the answer seen through larger, shrunk patches.
    """
    from arr_coc.eval.metrics import box_mask
    from arr_coc.allocators.patching import PATCHERS, edge_density, render_patches
    from arr_coc.eval.reading import gestalt_view

    cell = canvas.cell
    hc, wc = canvas.sizes[0][0] // cell, canvas.sizes[0][1] // cell
    saliency = relevance if driver == "relevance" else edge_density(canvas.pixels, cell)
    patcher = PATCHERS.get(name)
    accepted = inspect.signature(patcher).parameters  # e.g. size_prior reaches the square patches only
    patches = patcher(saliency, k, valid=canvas.valid, pixels=canvas.pixels,
                      **{key: v for key, v in options.items() if key in accepted})
    boxes = patches.boxes[0][: int(patches.counts[0])]
    pixels = canvas.pixels[0, :, : hc * cell, : wc * cell]
    view = render_patches(pixels, boxes, cell, gestalt_view(pixels, cell, grid))
    sizes = patches.mask(*canvas.grid)[0, :hc, :wc]  # [hc, wc] size of the patch over each cell, 0 = none
    metrics = allocation_metrics(sizes == 1, cell, target, others).as_dict()
    answer = box_mask(target, hc * cell, wc * cell)
    seen_px = (sizes > 0).double().repeat_interleave(cell, 0).repeat_interleave(cell, 1)
    metrics["seen"] = float((answer * seen_px).sum() / answer.sum()) if answer.sum() > 0 else float("nan")
    return view, grid[0] * grid[1] + int(patches.counts[0]), metrics


# ----------------------------------------------------------------------------- tables and plots

COLUMNS = ("coverage", "hit", "iou", "secondary", "peripheral", "seen", "reading")  # seen: variable-size allocators


def _mean(values: list) -> float:
    vals = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return sum(vals) / len(vals) if vals else float("nan")


def summarize(rows: Sequence[dict], columns: Sequence[str] = COLUMNS, methods: Sequence[str] = METHODS) -> list[dict]:
    """Mean of every metric in ``columns`` per (dataset, method, budget), in table order (``methods``' order)."""
    groups: dict[tuple[str, str, str], list[dict]] = defaultdict(list)
    for r in rows:
        groups[(r["dataset"], r["method"], r["budget"])].append(r)

    def order(key):
        dataset, method, budget = key
        b = -1.0 if budget == "full" else (float(budget[:-1]) if budget.endswith("%") else 1e9 + float(budget))
        return dataset, b, methods.index(method) if method in methods else len(methods)

    out = []
    for key in sorted(groups, key=order):
        g = groups[key]
        share = _mean([r["tokens"] / r["full_tokens"] for r in g])
        out.append({"dataset": key[0], "method": key[1], "budget": key[2], "n": len(g),
                    "tokens": _mean([r["tokens"] for r in g]), "share": share,
                    **{c: _mean([r.get(c) for r in g]) for c in columns}})
    return out


@lru_cache(maxsize=None)
def method_label(method: str) -> str:
    """A method's name in tables: samplers with learnable parameters run untrained here, and say so.

    >>> method_label("topk"), method_label("log_polar"), method_label("adaptive_stratified@learned")
    ('topk', 'log_polar (untrained)', 'adaptive_stratified@learned (untrained)')
    """
    base = method.split("@")[0]
    if base in SAMPLERS.names() and any(True for _ in SAMPLERS.get(base)().parameters()):
        return f"{method} (untrained)"
    return method


def _fmt(v: float, pct: bool = False) -> str:
    if v != v:
        return "—"
    return f"{100 * v:.0f}%" if pct else f"{v:.3f}"


def markdown_table(summary: Sequence[dict]) -> str:
    lines = ["| budget | method | tokens (share of full) | n | coverage | hit rate | IoU proxy | secondary "
             "| peripheral | seen | reading (ANLS) |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for s in summary:
        lines.append(f"| {s['budget']} | {method_label(s['method'])} | {s['tokens']:.0f} ({_fmt(s['share'], True)}) | {s['n']} | "
                     + " | ".join(_fmt(s[c]) for c in COLUMNS) + " |")
    return "\n".join(lines)


def pivot_table(summary: Sequence[dict], column: str) -> str:
    """One metric as methods x budgets (the mean tokens sent in each header), for READMEs.

    >>> rows = [{"method": "topk", "budget": "25%", "tokens": 247.0, "share": 0.25, "reading": 0.5},
    ...         {"method": "full", "budget": "full", "tokens": 989.0, "share": 1.0, "reading": 0.8}]
    >>> print(pivot_table(rows, "reading"))
    | method | full (989 tok) | 25% (247 tok) |
    |---|---:|---:|
    | full | 0.800 |  |
    | topk |  | 0.500 |
    """
    budgets = list(dict.fromkeys(s["budget"] for s in sorted(summary, key=lambda s: s["share"] * (s["budget"] != "full") - (s["budget"] == "full"))))
    tokens = {b: sum(s["tokens"] for s in summary if s["budget"] == b) / sum(1 for s in summary if s["budget"] == b)
              for b in budgets}
    seen = list(dict.fromkeys(s["method"] for s in summary))
    methods = [m for m in METHODS if m in seen] + [m for m in seen if m not in METHODS]  # e.g. topk@learned
    cell = {(s["method"], s["budget"]): s[column] for s in summary}
    lines = ["| method | " + " | ".join(f"{b} ({tokens[b]:.0f} tok)" for b in budgets) + " |",
             "|---|" + "---:|" * len(budgets)]
    for m in methods:
        lines.append(f"| {method_label(m)} | " + " | ".join(_fmt(cell[(m, b)]) if (m, b) in cell else "" for b in budgets) + " |")
    return "\n".join(lines)


def write_reports(jsonl: Path, out_dir: Path | None = None, keys: Iterable[tuple[str, str, str]] | None = None
                  ) -> tuple[Path, Path, Path]:
    """records.jsonl -> summary.csv, summary.md and summary.png beside it (or in ``out_dir``).

    ``keys`` (record_id, method, budget), e.g. :func:`arr_coc.eval.store.requested` for a run, limits the
    tables to exactly those rows; without it every row of the folder counts once.
    """
    import csv

    rows = RowStore(jsonl.parent).rows(keys)
    if not rows:
        raise ValueError(f"{jsonl} holds no rows for the records, methods and budgets asked for")
    summary = summarize(rows)
    out_dir = out_dir or jsonl.parent
    csv_path, md_path, png_path = out_dir / "summary.csv", out_dir / "summary.md", out_dir / "summary.png"
    with csv_path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(summary[0]))
        w.writeheader()
        w.writerows(summary)
    md_path.write_text(markdown_table(summary) + "\n")
    plot_summary(summary, png_path)
    return csv_path, md_path, png_path


def plot_summary(summary: Sequence[dict], path: Path) -> Path:
    """Reading accuracy and answer coverage vs share of full-resolution tokens, one line per method."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.2), layout="constrained")
    axes = fig.subplots(1, 2)
    dataset = summary[0]["dataset"] if summary else ""
    for ax, col, label in ((axes[0], "reading", "reading accuracy (ANLS of OCR)"),
                           (axes[1], "coverage", "answer-box coverage")):
        for i, method in enumerate(METHODS):  # one colour per method in both panels
            pts = sorted((s["share"], s[col]) for s in summary if s["method"] == method and s[col] == s[col])
            if not pts:
                continue
            if method == "full":
                ax.axhline(pts[0][1], color="k", ls="--", lw=1, label="full resolution")
                continue
            ax.plot([100 * p[0] for p in pts], [p[1] for p in pts], marker="o", color=matplotlib.colormaps["tab20"](i),
                    ls=":" if method in ("uniform_image", "random") else "-", label=method_label(method))
        ax.set_xlabel("tokens sent (% of full resolution)")
        ax.set_ylabel(label)
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    axes[int(not axes[0].get_lines())].legend(fontsize=8)  # COCO has no reading panel to hold it
    fig.suptitle(f"{dataset}: what survives at equal token budgets")
    fig.savefig(path, dpi=110)
    return path
