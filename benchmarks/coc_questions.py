"""Questions over a long context: one budget over 10-60 pages vs uniform downscale, first pages, equal split, BM25.

    python benchmarks/coc_questions.py --split test --docs 3 --window 20 --questions 6 --compression 5 10 20

Contexts: the first ``--window`` pages of each corpus document of the split with at least that many
pages (``arr_coc.documents.corpus``; test documents are never used to choose a setting), as the PDF
(rendered at ``--dpi``, its text layer) and as its text layer re-set with ``render_text`` (``text``).
Questions: :func:`arr_coc.documents.questions.context_questions` (section titles and next words, each
answer unique in the context and never in its question). For each question and each compression
ratio c, T = text tokens / c visual tokens go to every method (equal tokens):

- ``coc``: :func:`arr_coc.contexts.allocate` (a gestalt per page + one ranking of all cells);
- ``equal split``: the same gestalts, K split equally over the pages, each page's best cells by the same scores;
- ``uniform``: every page downscaled to T / pages tokens (what rendering at a lower DPI gives);
- ``first pages``: pages in order at full resolution while they fit, the rest downscaled onto the next;
- ``bm25 pages``: pages ranked by BM25 (bm25s) over their text layer, at full resolution while they
  fit, the rest downscaled onto the next; ``full``: every page at full resolution (the reference).

Metrics on the answer's page: page hit (it gets full-resolution tokens), answer coverage (share of the
answer boxes' area inside full-resolution cells), reading: the OCR reader (``--reader``) reads the
answer region from exactly what the VLM would see (``arr_coc.eval.reading.render``), scored by
``contains_score`` (ANLS over the best word window).

A thin driver over the library's context evaluation (what ``arr-coc eval texlive-contexts`` runs):
contexts and questions from :func:`arr_coc.data.contexts.texlive_contexts`, the methods from
:mod:`arr_coc.eval.context_methods`, the rows from :func:`arr_coc.eval.evaluate.evaluate`
into ``--out/<source>/records.jsonl`` (resumable); this script writes them as rows.csv, timing.csv and
summary.md in ``--out``.
"""
from __future__ import annotations

import argparse
import csv
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from arr_coc import ARR, ARRConfig
from arr_coc.config import TextureConfig
from arr_coc.contexts import tokenizer_name
from arr_coc.data.contexts import texlive_contexts
from arr_coc.eval.context_methods import BM25Pages
from arr_coc.eval.evaluate import evaluate
from arr_coc.eval.settings import EvalSettings
from arr_coc.eval.store import RowStore

# the library's method names -> this benchmark's table labels (as published in docs/coc.md)
LABELS = {"coc": "coc", "equal_split": "equal split", "uniform": "uniform", "first_pages": "first pages",
          "bm25_pages": "bm25 pages"}
METHODS = tuple(LABELS.values())
# Qwen2.5-VL-3B on this CPU (benchmarks/results/bench_vlm_cpu_runs/3b_batch1_d056676.md): full resolution, 2334 prompt tokens,
# 105.5 s of tower + prefill; the VLM time a token costs, for the time-saved estimate.
VLM_MS_PER_TOKEN = 105507 / 2334


def contexts(args: argparse.Namespace, source: str):
    return texlive_contexts(args.split, pages=args.window, source=source, dpi=args.dpi, questions=args.questions,
                            n_docs=args.docs)


def table_rows(store_rows: list[dict], source: str) -> tuple[list[dict], list[tuple]]:
    """The library's rows of one source as this benchmark's rows.csv rows and timing.csv rows."""
    full = {r["record_id"]: r["reading"] for r in store_rows if r["method"] == "full"}
    rows, timing = [], {}
    for r in store_rows:
        if r["method"] == "full":
            continue
        rows.append(dict(doc=r["image_id"].split("#")[0], source=source, pages=r["pages"], question=r["question"],
                         answer=r["answer"], kind=r["kind"], page=r["answer_pages"][0],
                         compression=float(r["budget"][:-1]), budget=r["budget_tokens"], tokens=r["tokens"],
                         text_tokens=r["text_tokens"], method=LABELS[r["method"]], page_hit=int(r["page_hit"]),
                         coverage=round(r["coverage"], 4), reading=round(r["reading"], 4),
                         full_reading=round(full[r["record_id"]], 4)))
        timing[r["record_id"]] = (source, r["pages"], r["see_ms"], r["alloc_ms"], r["full_tokens"])
    return rows, list(timing.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--split", default="test", choices=["train", "val", "test"])
    ap.add_argument("--docs", type=int, default=3, help="documents (sorted by name) with at least --window pages")
    ap.add_argument("--window", type=int, default=20, help="pages per context (the first pages of each document)")
    ap.add_argument("--questions", type=int, default=6, help="questions per context")
    ap.add_argument("--compression", type=float, nargs="+", default=[5.0, 10.0, 20.0])
    ap.add_argument("--sources", nargs="+", default=["pdf", "text"], choices=["pdf", "text"])
    ap.add_argument("--dpi", type=float, default=100.0)
    ap.add_argument("--reader", default="tesseract", choices=["tesseract", "rapidocr"])
    ap.add_argument("--text-weight", type=float, default=None, help="ranking weight (default: the library's)")
    ap.add_argument("--page-weight", type=float, default=None, help="ranking weight (default: the library's)")
    ap.add_argument("--channels", nargs="+", default=None, help="the ARR's channels (default: the pipeline's)")
    ap.add_argument("--out", type=Path, default=None, help="default benchmarks/results/coc/<split>")
    ap.add_argument("--fresh", action="store_true", help="replace rows of --out made with other settings")
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
        for source in args.sources:
            for item in contexts(args, source):
                ctx = item.load()
                bm25 = BM25Pages([p.text for p in ctx.pages])
                for q in item.questions:
                    ranks.append(bm25.rank(q.question).index(q.pages[0]) + 1)
                    print(f"{item.context_id.split('#')[0]} {source}: {q.question!r} page "
                          f"{ctx.pages[q.pages[0]].index + 1}: BM25 rank {ranks[-1]}")
        print(f"BM25 ranks the answer's page first for {sum(r == 1 for r in ranks)} of {len(ranks)} questions")
        return
    arr = ARR(ARRConfig(texture=TextureConfig(channels=tuple(args.channels)) if args.channels else TextureConfig())).eval()
    rows, timing = [], []
    for source in args.sources:
        settings = EvalSettings(methods=("full", *LABELS), budgets=[f"{c:g}x" for c in args.compression],
                                       reader=args.reader, text_weight=args.text_weight, page_weight=args.page_weight,
                                       contexts={"split": args.split, "source": source, "pages": args.window,
                                                 "dpi": args.dpi, "questions": args.questions, "seed": 0},
                                       fresh=args.fresh)
        jsonl = evaluate(contexts(args, source), arr, out / source, settings)
        keys = set().union(*(settings.keys(q) for item in contexts(args, source) for q in item.questions))
        got, times = table_rows(RowStore(jsonl.parent).rows(keys), source)
        rows += got
        timing += times
    write_rows(out, rows, timing)
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
             f"{args.window} pages at {args.dpi:g} dpi; ARR channels {', '.join(args.channels or ['the defaults'])}; text tokens by {tokenizer_name()}; reader {args.reader} "
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
