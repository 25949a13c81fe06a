"""Evaluation harness: does the allocation keep the answer? dataset x method x budget, at equal tokens.

For every record (image, question, answer, answer boxes) and every token budget it measures where
the saccades landed (:mod:`arr_coc.eval.metrics`) and whether a real OCR engine still reads the answer
in what the VLM would see (:mod:`arr_coc.eval.reading`): the foveated view for the samplers, one
uniformly downsampled image with the same token count, and the full-resolution canvas (upper bound).

Rows are appended to ``<out>/<dataset>/records.jsonl`` one record at a time, so an interrupted run
loses at most the record in flight and a rerun skips what is done. :func:`summarize` turns the rows
into a CSV, a markdown table and plots.
"""
from __future__ import annotations

import hashlib
import inspect
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

from arr_coc.data.datasets import Record
from arr_coc.eval.metrics import allocation_metrics
from arr_coc.budget import budget_tokens, split_budget
from arr_coc.pipeline import ARR
from arr_coc.eval.reading import READERS, contains_score, downsampled_view, foveated_view, read_region, scale_boxes
from arr_coc.samplers import SAMPLERS, topk_cells

# Method order of every table: the upper bound, the field's baseline, then the allocators.
METHODS = ("full", "uniform_image", "random", "topk", "nms", "stratified", "adaptive_stratified", "log_polar",
           "patches", "patches_edges", "quadtree", "selector", "pruner")
# variable-size allocators (arr_coc.allocators.patching): registry name and the map that drives them
PATCH_METHODS = {"patches": ("saliency", "relevance"), "patches_edges": ("saliency", "edges"),
                 "quadtree": ("quadtree", "relevance")}
LEARNED_METHODS = ("selector", "pruner")  # trained allocators (arr_coc.allocators.pruning): top-K of their own map
DEFAULT_BUDGETS = ("5%", "10%", "25%", "50%")
MARGIN_PX = 8  # canvas px around the answer box when reading: room for ascenders without the next field


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

    def __post_init__(self) -> None:
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown:
            raise ValueError(f"unknown methods {unknown}; known: {', '.join(METHODS)}")
        if self.reader is not None:
            READERS.get(self.reader)  # fail now, not after the first image
        for b in self.budgets:
            budget_tokens(b, 10**9)


def _done_keys(path: Path) -> set[tuple[str, str, str]]:
    """Keys of the rows already written; a last line cut by an interruption is dropped (and redone)."""
    if not path.exists():
        return set()
    text = path.read_text()
    if text and not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]
        path.write_text(text)
    return {(row["record_id"], row["method"], row["budget"]) for row in map(json.loads, text.splitlines())}


def _keys(record: Record, settings: EvalSettings) -> list[tuple[str, str, str]]:
    keys = [(record.record_id, "full", "full")] if "full" in settings.methods else []
    return keys + [(record.record_id, m, str(b)) for b in settings.budgets for m in settings.methods if m != "full"]


def evaluate(records: Sequence[Record], arr: ARR, out_dir: Path, settings: EvalSettings | None = None,
             progress: bool = True) -> Path:
    """Evaluate ``records`` (grouped by image, so each texture is computed once); returns the JSONL path."""
    settings = settings or EvalSettings()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "records.jsonl"
    done = _done_keys(path)
    reader = READERS.get(settings.reader)() if settings.reader else None
    samplers = {m: SAMPLERS.get(m)() for m in settings.methods if m in SAMPLERS}
    learned = load_learned_methods(arr, settings)
    by_image: dict[str, list[Record]] = defaultdict(list)
    for r in records:
        by_image[r.image_id].append(r)
    bar = tqdm(total=len(records), desc=f"eval {records[0].dataset if records else ''}", disable=not progress)
    with path.open("a") as sink:
        for recs in by_image.values():
            todo = [r for r in recs if not set(_keys(r, settings)) <= done]
            bar.update(len(recs) - len(todo))
            if not todo:
                continue
            with torch.no_grad():
                scene = arr.see(todo[0].image)
                vector = arr.gestalt(scene, 1).vector
                for record in todo:
                    for row in _evaluate_record(record, scene, vector, arr, samplers, reader, settings, done,
                                                learned):
                        sink.write(json.dumps(row) + "\n")
                    sink.flush()
                    bar.update(1)
    bar.close()
    return path


SCORER_FREE = ("full", "native_budget", "uniform_image")  # methods the relevance scorer plays no part in


def trained_on(path: Path) -> tuple[str, ...]:
    """The datasets a weights file from ``arr-coc train`` learned from (its saved training settings)."""
    saved = torch.load(path, map_location="cpu", weights_only=True)
    return tuple(saved.get("train_config", {}).get("datasets", ()))


def refuse_leakage(dataset: str, split: str | None, arr: ARR, methods: Sequence[str],
                   learned: dict | None = None) -> None:
    """Refuse to score the shipped trained weights on images they may have learned from.

    The packaged scorer, selector and pruner were trained on the train split of their datasets (and
    chosen on val): on those datasets only ``split="test"`` is held out. Raises ``ValueError`` saying so.
    """
    from arr_coc.weights import PACKAGED

    if split == "test":
        return
    shipped = []
    if arr.weights_source.startswith("trained, shipped") and any(m not in SCORER_FREE for m in methods):
        shipped.append(("scorer", PACKAGED / f"{arr.config.scorer.name}.pt"))
    shipped += [(m, PACKAGED / f"{m}.pt") for m in LEARNED_METHODS
                if m in methods and str((learned or {}).get(m, "auto")) == "auto"]
    for what, path in shipped:
        datasets = trained_on(path)
        if dataset in datasets:
            raise ValueError(f"the shipped {what} weights (arr_coc/weights/{path.name}) were trained on the train "
                             f"images of {', '.join(datasets)} and chosen on val; scoring them on {dataset} "
                             f"{'--split ' + split if split else 'without --split test'} would count images they "
                             f"learned from: add --split test (or pass --scorer-weights none or your own weights)")


def load_learned_methods(arr: ARR, settings: EvalSettings) -> dict[str, Any]:
    """The trained selector / pruner a run asks for, checked against the ARR's channels, query and cell."""
    from arr_coc.allocators.pruning import load_learned

    paths = settings.learned or {}
    fit = dict(channels=arr.channels, query_dim=arr.query_encoder.dim, query_encoder=type(arr.query_encoder).__name__,
               cell=arr.config.canvas.cell)
    return {m: load_learned(m, paths.get(m, "auto"), **fit)[0] for m in LEARNED_METHODS if m in settings.methods}


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
    uniform image) come only with the empty suffix. ``maps`` holds the trained allocators' own maps
    (:func:`learned_maps`); their methods are skipped without one.
    """
    cell, pixels = canvas.cell, canvas.pixels[0]
    hc, wc = canvas.sizes[0][0] // cell, canvas.sizes[0][1] // cell
    full = canvas.full_tokens[0]
    target = scale_boxes(record.boxes_px, canvas.scales[0])
    others = scale_boxes(record.others_px, canvas.scales[0])
    readable = reader is not None and bool(record.answer.strip())

    def row(method: str, budget: str, tokens: int, view, metrics: dict, start: float) -> dict:
        prediction = read_region(reader, view, target, settings.margin_px) if readable else None
        return {
            "dataset": record.dataset, "record_id": record.record_id, "image_id": record.image_id,
            "question": record.question, "answer": record.answer, "method": method, "budget": budget,
            "tokens": tokens, "full_tokens": full, **metrics, "prediction": prediction,
            "reading": contains_score(prediction, record.answer) if readable else None,
            "ms": round((time.perf_counter() - start) * 1e3, 1),
        }

    nan = float("nan")
    blind = {"coverage": nan, "hit": nan, "iou": nan, "secondary": nan, "peripheral": nan}
    if (record.record_id, "full", "full") not in done and "full" in settings.methods and not suffix:
        start = time.perf_counter()
        everything = {"coverage": 1.0, "hit": 1.0, "iou": nan, "secondary": 1.0, "peripheral": 1.0}
        yield row("full", "full", full, pixels, everything, start)
    for spec in settings.budgets:
        total = budget_tokens(spec, full)
        grid, k = split_budget(total, (hc, wc))
        for method in settings.methods:
            if method == "full" or (record.record_id, method + suffix, str(spec)) in done:
                continue
            if suffix and method in ("uniform_image", "random"):  # they ignore the scorer: one row is enough
                continue
            start = time.perf_counter()
            if method == "uniform_image":
                view, used = downsampled_view(pixels[:, : hc * cell, : wc * cell], total, cell)
                yield row(method, str(spec), used, view, blind, start)
                continue
            if method in PATCH_METHODS:
                try:
                    view, used, metrics = _patch_view(*PATCH_METHODS[method], relevance, k, canvas, grid, target,
                                                      others, settings.patch_options or {})
                except ValueError as err:  # a quadtree cannot start below its first tiling: no row
                    if "starting squares" not in str(err):
                        raise
                    continue
                yield row(method + suffix, str(spec), used, view, metrics, start)
                continue
            if method in LEARNED_METHODS:
                if not maps or method not in maps:
                    continue
                sel = topk_cells(maps[method], k, canvas.valid)
            else:
                generator = torch.Generator().manual_seed(_record_seed(settings.seed, record.record_id))
                sel = samplers[method](relevance, k, valid=canvas.valid, query_emb=query_emb, generator=generator)
            chosen = sel.mask(*canvas.grid)[0, :hc, :wc]
            metrics = allocation_metrics(chosen, cell, target, others).as_dict()
            view = foveated_view(pixels[:, : hc * cell, : wc * cell], sel.positions[0], cell, grid)
            yield row(method + suffix, str(spec), grid[0] * grid[1] + k, view, metrics, start)


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


def _fmt(v: float, pct: bool = False) -> str:
    if v != v:
        return "—"
    return f"{100 * v:.0f}%" if pct else f"{v:.3f}"


def markdown_table(summary: Sequence[dict]) -> str:
    lines = ["| budget | method | tokens (share of full) | n | coverage | hit rate | IoU proxy | secondary "
             "| peripheral | seen | reading (ANLS) |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for s in summary:
        lines.append(f"| {s['budget']} | {s['method']} | {s['tokens']:.0f} ({_fmt(s['share'], True)}) | {s['n']} | "
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
        lines.append(f"| {m} | " + " | ".join(_fmt(cell[(m, b)]) if (m, b) in cell else "" for b in budgets) + " |")
    return "\n".join(lines)


def write_reports(jsonl: Path, out_dir: Path | None = None) -> tuple[Path, Path, Path]:
    """records.jsonl -> summary.csv, summary.md and summary.png beside it (or in ``out_dir``)."""
    import csv

    rows = [json.loads(line) for line in jsonl.read_text().splitlines() if line.strip()]
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
                    ls=":" if method in ("uniform_image", "random") else "-", label=method)
        ax.set_xlabel("tokens sent (% of full resolution)")
        ax.set_ylabel(label)
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    axes[int(not axes[0].get_lines())].legend(fontsize=8)  # COCO has no reading panel to hold it
    fig.suptitle(f"{dataset}: what survives at equal token budgets")
    fig.savefig(path, dpi=110)
    return path
