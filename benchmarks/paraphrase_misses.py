"""Where coc's saccades went on the hand-written questions it missed: the pages and lines they covered.

Reads the rows ``paraphrase_tables.py`` stored (``records.jsonl`` of one source), takes the questions whose ``coc``
row at ``--budget`` missed strictly (less than half of the answer's area in full-resolution cells), allocates each
again exactly as the evaluation did (the window seen once, ``allocate`` at the row's token budget) and writes, per
question: the answer page's saccades against the pages that got most, and the lines that got most saccade cells
beside the answer's line. It chooses nothing: it explains a table already made.

    python benchmarks/paraphrase_misses.py --split test --budget 20x --limit 12 \\
        --out benchmarks/results/paraphrase/texlive-paraphrase/test/misses_20x.md
"""
from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import torch
from emit import emit  # the benchmark beside this one (a script's folder is on its path)
from tqdm import tqdm

from arr_coc import ARR, ARRConfig
from arr_coc.budget import Budget
from arr_coc.contexts import allocate, see_context
from arr_coc.data.paraphrase import paraphrase_context_set
from arr_coc.eval.metrics import normalize_text

RESULTS = Path(__file__).parent / "results" / "paraphrase"


def coc_rows(records: Path, budget: str) -> list[dict]:
    """The ``coc`` rows at ``budget``, in record order."""
    rows = [json.loads(line) for line in records.read_text().splitlines() if line.strip()]
    return [r for r in rows if r["method"] == "coc" and r["budget"] == budget]


def misses(records: Path, budget: str) -> list[dict]:
    """The ``coc`` rows at ``budget`` whose strict page hit is 0, in record order."""
    return [r for r in coc_rows(records, budget) if r["page_hit_strict"] == 0.0]


def line_cells(box: tuple[float, float, float, float], cell: int, cells: set[tuple[int, int]]) -> int:
    """How many of ``cells`` (y, x) a line's box (y0, x0, y1, x1 px) touches."""
    y0, x0, y1, x1 = (int(v // cell) for v in box)
    return sum((y, x) in cells for y in range(y0, y1 + 1) for x in range(x0, x1 + 1))


def short(text: str, n: int = 60) -> str:
    text = " ".join(text.split()).replace("|", "/")
    return text if len(text) <= n else text[: n - 1] + "…"


def explain(arr: ARR, seen, question, row: dict) -> str:
    """One missed question over its window ``seen`` (:func:`see_context`): where its saccades went."""
    with torch.inference_mode():
        alloc = allocate(arr, seen, question.question, Budget.parse(row["budget_tokens"]))
    per_page = Counter({j: p.saccades for j, p in enumerate(alloc.pages) if p.saccades})  # by position in the window
    answer = question.pages[0]
    wanted = [normalize_text(a) for a in question.answers]
    covered = []
    for j, p in enumerate(alloc.pages):
        cells = {tuple(c) for c in p.plan.cells.long().tolist()}
        for text, box in seen.lines[j]:
            n = line_cells(box, p.cell, cells) if cells else 0
            holds = any(w and w in normalize_text(text) for w in wanted)
            if n or (holds and j == answer):
                covered.append((n, j, text, holds))
    covered.sort(key=lambda c: -c[0])
    top = "; ".join(f"p{i + 1}: {n} \"{short(t)}\"" for n, i, t, _ in covered[:3])
    answer_lines = [c for c in covered if c[3] and c[1] == answer]
    at_answer = ", ".join(f"{n} cells \"{short(t, 40)}\"" for n, _, t, _ in answer_lines[:2]) or "not on a line"
    pages = ", ".join(f"p{i + 1}: {n}" for i, n in per_page.most_common(3))
    return (f"| {question.record_id} | {row['kind']} | {short(question.question, 70)} | {short(question.answers[0], 30)}"
            f" | p{answer + 1}: {per_page.get(answer, 0)} of {alloc.saccades} | {pages} | {at_answer} | {top} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--split", default="test", choices=["val", "test"])
    ap.add_argument("--budget", default="20x", help="the rows' budget, as stored (10x, 20x, ...)")
    ap.add_argument("--records", type=Path, default=None,
                    help="records.jsonl (default: results/paraphrase/texlive-paraphrase/SPLIT/pdf/records.jsonl)")
    ap.add_argument("--limit", type=int, default=12, help="at most this many missed questions")
    ap.add_argument("--out", type=Path, default=None, help="also write the table here")
    args = ap.parse_args()
    records = args.records or RESULTS / "texlive-paraphrase" / args.split / "pdf" / "records.jsonl"
    missed = misses(records, args.budget)
    chosen = {r["record_id"]: r for r in missed[: args.limit]}
    arr = ARR(ARRConfig()).eval()
    items, _, _ = paraphrase_context_set(split=args.split)
    lines = []
    with tqdm(total=len(chosen), desc="missed questions") as bar:
        for item in items:
            asked = [q for q in item.questions if q.record_id in chosen]
            if not asked:
                continue
            with torch.inference_mode():
                seen = see_context(arr, item.load())  # once per window, for all its missed questions
            for q in asked:
                lines.append(explain(arr, seen, q, chosen[q.record_id]))
                bar.update()
    n_coc = len(coc_rows(records, args.budget))
    text = (f"# coc's strict misses at {args.budget} ({args.split}): where the saccades went\n\n"
            f"{len(missed)} of {n_coc} questions put less than half of the answer's area in full-resolution cells; "
            f"the first {len(lines)} allocated again as the evaluation did. Answer page: its saccades of all sent; "
            "pages: the three that got most; answer line: the saccade cells on the line(s) holding the answer; "
            "lines: the three lines with most saccade cells.\n\n"
            "| id | kind | question | answer | answer page | pages | answer line | lines |\n"
            "|---|---|---|---|---|---|---|---|\n" + "\n".join(lines) + "\n\n"
            f"`python benchmarks/paraphrase_misses.py --split {args.split} --budget {args.budget} "
            f"--limit {args.limit}`\n")
    emit(text, args.out)


if __name__ == "__main__":
    main()
