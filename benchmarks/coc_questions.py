"""Questions over a long context: one budget over 10-60 pages vs uniform downscale, first pages, equal split, BM25.

    python benchmarks/coc_questions.py --split test --docs 3 --pages 20 --questions 6 --compression 5 10 20

Contexts: the first ``--pages`` pages of each corpus document of the split with at least that many
pages (``arr_coc.documents.corpus``; test documents are never used to choose a setting), as the PDF
(rendered at ``--dpi``, its text layer) and as its text layer re-set with ``render_text`` (``text``).
Questions: :func:`arr_coc.documents.questions.context_questions` (section titles and next words, each
answer unique in the context and never in its question). For each question and each compression
ratio c, T = text tokens / c visual tokens go to every method (equal tokens):

- ``coc``: :func:`arr_coc.contexts.allocate_context` (a gestalt per page + one ranking of all cells);
- ``equal split``: the same gestalts, K split equally over the pages, each page's best cells by the same scores;
- ``uniform``: every page downscaled to T / pages tokens (what rendering at a lower DPI gives);
- ``first pages``: pages in order at full resolution while they fit, the rest downscaled onto the next;
- ``bm25 pages``: pages ranked by BM25 (bm25s) over their text layer, at full resolution while they
  fit, the rest downscaled onto the next; ``full``: every page at full resolution (the reference).

Metrics on the answer's page: page hit (it gets full-resolution tokens), answer coverage (share of the
answer boxes' area inside full-resolution cells), reading: the OCR reader (``--reader``) reads the
answer region from exactly what the VLM would see (``arr_coc.eval.reading.render``), scored by
``contains_score`` (ANLS over the best word window). Writes rows.csv, summary.md in ``--out``.
"""
from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import bm25s
import torch
from tqdm import tqdm

from arr_coc import ARR, ARRConfig
from arr_coc.config import TextureConfig
from arr_coc.contexts import allocate_context, rank_cells, see_context, split_context, text_tokens, tokenizer_name
from arr_coc.documents.corpus import documents
from arr_coc.documents.page import Context
from arr_coc.documents.pdf import read_pdf
from arr_coc.documents.questions import context_questions
from arr_coc.documents.text_pages import TextLayout, render_text
from arr_coc.eval.reading import contains_score, make_reader, read_region, render
from arr_coc.imageops import paint_boxes
from arr_coc.plan import Plan
from arr_coc.views import downsampled_grid

METHODS = ("coc", "equal split", "uniform", "first pages", "bm25 pages")
# Qwen2.5-VL-3B on this CPU (benchmarks/results/bench_vlm.md): full resolution, 2334 prompt tokens,
# 105.5 s of tower + prefill; the VLM time a token costs, for the time-saved estimate.
VLM_MS_PER_TOKEN = 105507 / 2334


def contexts(split: str, n_docs: int, pages: int, dpi: float, sources: list[str]):
    docs = sorted((d for d in documents(split=split) if d.n_pages >= pages), key=lambda d: d.name)[:n_docs]
    for d in docs:
        pdf = read_pdf(d.path, pages=f"1-{pages}", dpi=dpi)
        if "pdf" in sources:
            yield d.name, "pdf", pdf
        if "text" in sources:
            ctx = render_text("\n".join(p.text for p in pdf.pages), TextLayout(), f"{d.name} (text)")
            yield d.name, "text", Context(ctx.pages[:pages], ctx.source, ctx.meta)


def cells_plan(grid, gestalt, cells) -> Plan:
    return Plan("x", "cells", tuple(grid), gestalt=gestalt, cells=cells.reshape(-1, 2))


def whole_pages(order, grids, total) -> dict[int, Plan]:
    """Pages in ``order`` at full resolution while they fit; the rest downscaled onto the next page."""
    plans, left = {}, total
    for i in order:
        full = grids[i][0] * grids[i][1]
        if full <= left:
            plans[i], left = Plan("x", "full", tuple(grids[i])), left - full
        elif left >= 1:
            plans[i], left = Plan("x", "native", tuple(grids[i]), native=left), 0
        if left == 0:
            break
    return plans


def methods(alloc, grids, total, bm25_order) -> dict[str, dict[int, Plan]]:
    n = len(grids)
    gestalts, k = split_context(grids, tokens=total)
    scores = [p.relevance for p in alloc.pages]
    out = {"coc": {i: cells_plan(grids[i], gestalts[i], c) for i, c in enumerate(rank_cells(scores, k))}}
    share = [k // n + (i < k % n) for i in range(n)]
    out["equal split"] = {i: cells_plan(grids[i], gestalts[i], rank_cells([scores[i]], min(share[i], scores[i].numel()))[0])
                          for i in range(n)}
    per = [total // n + (i < total % n) for i in range(n)]
    out["uniform"] = {i: Plan("x", "native", tuple(grids[i]), native=per[i]) for i in range(n)}
    out["first pages"] = whole_pages(range(n), grids, total)
    out["bm25 pages"] = whole_pages(bm25_order, grids, total)
    return out


def sent(plan: Plan | None) -> int:
    if plan is None:
        return 0
    if plan.kind == "native":
        gh, gw = downsampled_grid(*plan.grid, plan.native)
        return gh * gw
    return plan.tokens


def score(plan: Plan | None, image, cell, boxes, answers, reader) -> tuple[int, float, float]:
    """(page hit, answer coverage, reading) of one page's plan; a page not sent scores 0."""
    if plan is None:
        return 0, 0.0, 0.0
    hc, wc = plan.grid
    if plan.kind == "full":
        hit_cells = torch.ones(hc, wc)
    elif plan.kind == "cells":
        hit_cells = torch.zeros(hc, wc)
        hit_cells[plan.cells[:, 0], plan.cells[:, 1]] = 1
    else:
        hit_cells = torch.zeros(hc, wc)
    mask = paint_boxes(torch.tensor(boxes, dtype=torch.float32), torch.ones(len(boxes)), tuple(image.shape[-2:]))
    full_px = hit_cells.repeat_interleave(cell, 0).repeat_interleave(cell, 1)
    coverage = float((mask * full_px).sum() / mask.sum().clamp_min(1e-9))
    view = render(plan, image, cell)
    reading = contains_score(read_region(reader, view, boxes), list(answers))
    return int(hit_cells.sum() > 0), coverage, reading


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--split", default="test", choices=["train", "val", "test"])
    ap.add_argument("--docs", type=int, default=3, help="documents (sorted by name) with at least --pages pages")
    ap.add_argument("--pages", type=int, default=20, help="pages per context (the first pages of each document)")
    ap.add_argument("--questions", type=int, default=6, help="questions per context")
    ap.add_argument("--compression", type=float, nargs="+", default=[5.0, 10.0, 20.0])
    ap.add_argument("--sources", nargs="+", default=["pdf", "text"], choices=["pdf", "text"])
    ap.add_argument("--dpi", type=float, default=100.0)
    ap.add_argument("--reader", default="tesseract", choices=["tesseract", "rapidocr"])
    ap.add_argument("--text-weight", type=float, default=None, help="ranking weight (default: the library's)")
    ap.add_argument("--page-weight", type=float, default=None, help="ranking weight (default: the library's)")
    ap.add_argument("--channels", nargs="+", default=None, help="the ARR's channels (default: the pipeline's)")
    ap.add_argument("--out", type=Path, default=None, help="default benchmarks/results/coc/<split>")
    ap.add_argument("--bm25-rank", action="store_true",
                    help="only print where BM25 ranks each question's page (text alone: no allocation, no reading)")
    ap.add_argument("--summarize", action="store_true",
                    help="only remake summary.md from the rows.csv and timing.csv of --out (a run cut short)")
    args = ap.parse_args()
    out = args.out or Path(__file__).parent / "results" / "coc" / args.split
    out.mkdir(parents=True, exist_ok=True)
    if args.summarize:
        rows = list(csv.DictReader(open(out / "rows.csv")))
        for r in rows:
            for k in ("page_hit", "pages", "budget", "tokens", "text_tokens", "page"):
                r[k] = int(r[k])
            for k in ("compression", "coverage", "reading", "full_reading"):
                r[k] = float(r[k])
        timing = [(t["source"], int(t["pages"]), float(t["see_ms"]), float(t["alloc_ms"]), float(t["full_tokens"]))
                  for t in csv.DictReader(open(out / "timing.csv"))]
        (out / "summary.md").write_text(summary(rows, timing, args))
        print((out / "summary.md").read_text())
        return
    if args.bm25_rank:
        ranks = []
        for name, source, ctx in contexts(args.split, args.docs, args.pages, args.dpi, args.sources):
            texts = [p.text for p in ctx.pages]
            retriever = bm25s.BM25()
            retriever.index(bm25s.tokenize(texts, stopwords="en", show_progress=False), show_progress=False)
            for q in context_questions(ctx, args.questions):
                ids, _ = retriever.retrieve(bm25s.tokenize([q.question], stopwords="en", show_progress=False),
                                            k=len(texts), show_progress=False)
                ranks.append([int(i) for i in ids[0]].index(q.page - ctx.pages[0].index) + 1)
                print(f"{name} {source}: {q.question!r} page {q.page + 1}: BM25 rank {ranks[-1]}")
        print(f"BM25 ranks the answer's page first for {sum(r == 1 for r in ranks)} of {len(ranks)} questions")
        return
    weights = {k: v for k, v in (("text_weight", args.text_weight), ("page_weight", args.page_weight)) if v is not None}
    reader = make_reader(args.reader)
    arr = ARR(ARRConfig(texture=TextureConfig(channels=tuple(args.channels)) if args.channels else TextureConfig())).eval()
    rows, timing = [], []
    ctxs = list(contexts(args.split, args.docs, args.pages, args.dpi, args.sources))
    for name, source, ctx in tqdm(ctxs, desc="contexts"):
        qs = context_questions(ctx, args.questions)
        if not qs:
            continue
        start = time.perf_counter()
        with torch.inference_mode():
            seen = see_context(arr, ctx)
        see_ms = (time.perf_counter() - start) * 1e3
        n_text = text_tokens("\n\n".join(p.text for p in ctx.pages))
        texts = [p.text for p in ctx.pages]
        retriever = bm25s.BM25()
        retriever.index(bm25s.tokenize(texts, stopwords="en", show_progress=False), show_progress=False)
        for q in tqdm(qs, desc=f"{name} {source}", leave=False):
            start = time.perf_counter()
            with torch.inference_mode():
                alloc = allocate_context(arr, seen, q.question, tokens=2 * len(ctx), **weights)
            alloc_ms = (time.perf_counter() - start) * 1e3
            timing.append((source, len(ctx), see_ms, alloc_ms, sum(p.plan.full_tokens for p in alloc.pages)))
            docs_ids, _ = retriever.retrieve(bm25s.tokenize([q.question], stopwords="en", show_progress=False),
                                             k=len(texts), show_progress=False)
            order = [int(i) for i in docs_ids[0]]
            grids = [p.plan.grid for p in alloc.pages]
            a = q.page - ctx.pages[0].index
            page, cell = alloc.pages[a], alloc.pages[a].cell
            sy, sx = page.image.shape[-2] / ctx.pages[a].size[0], page.image.shape[-1] / ctx.pages[a].size[1]
            boxes = [(b[0] * sy, b[1] * sx, b[2] * sy, b[3] * sx) for b in q.boxes]
            full = score(Plan("x", "full", tuple(page.plan.grid)), page.image, cell, boxes, q.answers, reader)
            for c in args.compression:
                total = max(2 * len(ctx), round(n_text / c))
                for method, plans in methods(alloc, grids, total, order).items():
                    hit, cov, reading = score(plans.get(a), page.image, cell, boxes, q.answers, reader)
                    rows.append(dict(doc=name, source=source, pages=len(ctx), question=q.question, answer=q.answers[0],
                                     kind=q.kind, page=a, compression=c, budget=total,
                                     tokens=sum(sent(p) for p in plans.values()), text_tokens=n_text, method=method,
                                     page_hit=hit, coverage=round(cov, 4), reading=round(reading, 4),
                                     full_reading=round(full[2], 4)))
        write_rows(out, rows, timing)  # after every context: a long run keeps what it has
    (out / "summary.md").write_text(summary(rows, timing, args))
    print((out / "summary.md").read_text())


def write_rows(out: Path, rows: list[dict], timing: list[tuple]) -> None:
    if not rows:
        return
    with open(out / "rows.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    with open(out / "timing.csv", "w", newline="") as f:
        csv.writer(f).writerows([("source", "pages", "see_ms", "alloc_ms", "full_tokens"), *timing])


def summary(rows, timing, args) -> str:
    cmd = "python benchmarks/coc_questions.py " + " ".join(a for a in sys.argv[1:] if a != "--summarize")
    groups = defaultdict(list)
    for r in rows:
        groups[(r["source"], r["compression"], r["method"])].append(r)
    n_q = len({(r["doc"], r["source"], r["question"]) for r in rows})
    docs = sorted({r["doc"] for r in rows})
    lines = [f"made by: `{cmd}`", "",
             f"{args.split} documents ({len(docs)}): {', '.join(docs)}; {n_q} questions; contexts of "
             f"{args.pages} pages at {args.dpi:g} dpi; ARR channels {', '.join(args.channels or ['the defaults'])}; text tokens by {tokenizer_name()}; reader {args.reader} "
             "(contains_score); equal visual tokens T = text tokens / compression for every method.", "",
             "| source | compression | T (mean) | method | page hit | coverage | reading | reading / full |",
             "|---|---:|---:|---|---:|---:|---:|---:|"]
    for (source, c, method), rs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1], METHODS.index(kv[0][2]))):
        mean = lambda k: statistics.fmean(r[k] for r in rs)  # noqa: E731
        full = mean("full_reading")
        lines.append(f"| {source} | {c:g}x | {mean('budget'):.0f} | {method} | {100 * mean('page_hit'):.0f}% | "
                     f"{100 * mean('coverage'):.0f}% | {mean('reading'):.3f} | "
                     f"{100 * mean('reading') / full if full else float('nan'):.0f}% |")
    fulls = {s: statistics.fmean(r["full_reading"] for r in rows if r["source"] == s and r["method"] == "coc")
             for s in sorted({r["source"] for r in rows})}
    lines += ["", "Full resolution (every page, the reference) reads: "
              + ", ".join(f"{s} {v:.3f}" for s, v in fulls.items()) + "."]
    for source in sorted({t[0] for t in timing}):
        ts = [t for t in timing if t[0] == source]
        see = statistics.median(t[2] for t in ts)
        alloc = statistics.median(t[3] for t in ts)
        full_tokens = statistics.median(t[4] for t in ts)
        lines.append(f"\nAllocation, {source} ({ts[0][1]} pages, CPU, median): pages seen once {see / 1e3:.1f} s "
                     f"(canvas + texture), each question {alloc / 1e3:.1f} s (text channels + scoring + ranking). "
                     f"VLM time at full resolution for {full_tokens:.0f} visual tokens, estimated from the bench_vlm "
                     f"figures (Qwen2.5-VL-3B, {VLM_MS_PER_TOKEN:.0f} ms per token on this CPU): "
                     f"{full_tokens * VLM_MS_PER_TOKEN / 1e3:.0f} s.")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
