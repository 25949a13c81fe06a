"""Choosing the context ranking's weights on validation documents: answer coverage over a grid of settings.

    python benchmarks/coc_tune.py --docs 5 --questions 6 --compression 10 20

The contexts and questions of ``benchmarks/coc_questions.py`` (made here the same way) (validation or train documents only: a
setting is never chosen on test documents). Each question's ranking parts
(:func:`arr_coc.contexts.rank_parts`) are computed once; every setting of the grid then ranks the
cells (:func:`arr_coc.contexts.ranking_score`, :func:`arr_coc.contexts.rank_cells`) with the K of
T = text tokens / compression, and scores the answer's coverage: the share of the answer boxes' area
inside the saccade cells of its page. ``quotes off`` reads the question with its quote marks removed,
so the text layer matches it as before the verbatim-quote rule (same relevance). No reader runs:
coverage is what the weights move, and the reading follows it. Writes grid.csv and summary.md in ``--out``.
"""
from __future__ import annotations

import argparse
import csv
import itertools
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import torch
from tqdm import tqdm

from arr_coc import ARR, ARRConfig
from arr_coc.budget import Budget
from arr_coc.config import TextureConfig
from arr_coc.contexts import rank_cells, rank_parts, ranking_score, see_context, text_tokens
from arr_coc.documents.corpus import documents
from arr_coc.documents.page import Context
from arr_coc.documents.pdf import read_pdf
from arr_coc.documents.questions import context_questions
from arr_coc.documents.text_pages import TextLayout, render_text
from arr_coc.engine.imageops import paint_boxes

CHANNELS = "rgb y x eccentricity edges edges_inv highpass lowpass saliency distance text_match key_value".split()


def contexts(split: str, n_docs: int, pages: int, dpi: float, sources: list[str]):
    """The first ``pages`` pages of the split's first ``n_docs`` documents (by name), as PDF and re-set text."""
    docs = sorted((d for d in documents(split=split) if d.n_pages >= pages), key=lambda d: d.name)[:n_docs]
    for d in docs:
        pdf = read_pdf(d.path, pages=f"1-{pages}", dpi=dpi)
        if "pdf" in sources:
            yield d.name, "pdf", pdf
        if "text" in sources:
            ctx = render_text("\n".join(p.text for p in pdf.pages), TextLayout(), f"{d.name} (text)")
            yield d.name, "text", Context(ctx.pages[:pages], ctx.source, ctx.meta)


def coverage(cells: torch.Tensor, boxes: list, size: tuple[int, int], cell: int) -> float:
    """The share of the answer boxes' area (canvas px) inside the chosen cells [k, 2] of their page."""
    mask = paint_boxes(torch.tensor(boxes, dtype=torch.float32), torch.ones(len(boxes)), size)
    hit = torch.zeros(size[0] // cell, size[1] // cell)
    hit[cells[:, 0], cells[:, 1]] = 1
    px = torch.zeros(size)
    px[: hit.shape[0] * cell, : hit.shape[1] * cell] = hit.repeat_interleave(cell, 0).repeat_interleave(cell, 1)
    return float((mask * px).sum() / mask.sum().clamp_min(1e-9))


def write(args: argparse.Namespace, grid: list[tuple], cov: dict[tuple, list[float]], docs: list[str], n_q: int) -> None:
    """grid.csv and summary.md in ``args.out``: each setting's mean coverage per source and compression."""
    cols = [(s, c) for s in args.sources for c in args.compression]
    with open(args.out / "grid.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["quotes", "text_weight", "page_weight", "near_weight", *(f"{s} {c:g}x" for s, c in cols), "mean"])
        rows = []
        for setting in grid:
            vals = [statistics.fmean(cov[(*setting, s, c)] or [float("nan")]) for s, c in cols]
            rows.append((*setting, *vals, statistics.fmean(vals)))
            w.writerow([*setting, *(round(v, 4) for v in rows[-1][4:])])
    cmd = "python benchmarks/coc_tune.py " + " ".join(sys.argv[1:])
    lines = [f"made by: `{cmd}`", "",
             f"{args.split} contexts ({len(docs)}): {', '.join(docs)}; {n_q} questions; "
             f"answer coverage (share of the answer boxes inside saccade cells), mean over questions.", "",
             "| quotes | text w | page w | near w | " + " | ".join(f"{s} {c:g}x" for s, c in cols) + " | mean |",
             "|---|---:|---:|---:|" + "---:|" * (len(cols) + 1)]
    for r in rows:
        lines.append(f"| {r[0]} | {r[1]:g} | {r[2]:g} | {r[3]:g} | " + " | ".join(f"{100 * v:.1f}%" for v in r[4:]) + " |")
    (args.out / "summary.md").write_text("\n".join(lines) + "\n")
    print((args.out / "summary.md").read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--split", default="val", choices=["train", "val"])
    ap.add_argument("--docs", type=int, default=5)
    ap.add_argument("--pages", type=int, default=20)
    ap.add_argument("--questions", type=int, default=6)
    ap.add_argument("--compression", type=float, nargs="+", default=[10.0, 20.0])
    ap.add_argument("--sources", nargs="+", default=["pdf", "text"], choices=["pdf", "text"])
    ap.add_argument("--dpi", type=float, default=100.0)
    ap.add_argument("--text-weight", type=float, nargs="+", default=[2.0, 4.0, 8.0])
    ap.add_argument("--page-weight", type=float, nargs="+", default=[1.0, 2.0, 4.0])
    ap.add_argument("--near-weight", type=float, nargs="+", default=[0.0, 1.0, 2.0, 4.0, 8.0])
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "coc" / "tune_val")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    arr = ARR(ARRConfig(texture=TextureConfig(channels=tuple(CHANNELS)))).eval()
    grid = list(itertools.product(("off", "on"), args.text_weight, args.page_weight, args.near_weight))
    cov: dict[tuple, list[float]] = defaultdict(list)
    n_q, docs = 0, set()
    for name, source, ctx in tqdm(list(contexts(args.split, args.docs, args.pages, args.dpi, args.sources)), desc="contexts"):
        qs = context_questions(ctx, args.questions)
        with torch.inference_mode():
            seen = see_context(arr, ctx)
        n_text = text_tokens("\n\n".join(p.text for p in ctx.pages))
        grids = [g for scene in seen.scenes for g in scene.extents]
        _, k0 = Budget.parse(2 * len(ctx)).split(grids)  # the benchmark's own call (coc_questions.py)
        for q in qs:
            with torch.inference_mode():
                on = rank_parts(arr, seen, q.question, k0)
                off = rank_parts(arr, seen, q.question.replace('"', ""), relevance=[p.relevance for p in on])
            a = q.page - ctx.pages[0].index
            image = seen.image(a)
            sy, sx = image.shape[-2] / ctx.pages[a].size[0], image.shape[-1] / ctx.pages[a].size[1]
            boxes = [(b[0] * sy, b[1] * sx, b[2] * sy, b[3] * sx) for b in q.boxes]
            n_q, docs = n_q + 1, docs | {f"{name} ({source})"}
            for quotes, tw, pw, nw in grid:
                scores = [ranking_score(p, tw, pw, nw) for p in (on if quotes == "on" else off)]
                for c in args.compression:
                    _, k = Budget.parse(max(2 * len(ctx), round(n_text / c))).split(grids)
                    cells = rank_cells(scores, k)[a]
                    cov[(quotes, tw, pw, nw, source, c)].append(coverage(cells, boxes, tuple(image.shape[-2:]), seen.scenes[0].canvas.cell))
        write(args, grid, cov, sorted(docs), n_q)  # after every context: a run cut short keeps what it has


if __name__ == "__main__":
    main()
