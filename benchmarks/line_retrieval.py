"""Which text lines answer a question: BM25, the registered retrievers, their fusion with BM25, a cross-encoder.

For every question of ``texlive-paraphrase`` (a window of up to 20 pages of a LaTeX manual) each line of the
window's text layer is scored; for ``image-paraphrase`` (one receipt or form) each line of the dataset's own
OCR / entity annotation. A line *holds the answer* when it contains an accepted answer (both
``normalize_text``-ed; where no line does, letters and digits compared with spaces and punctuation aside, as
contexts find answers). Reported: answer-line recall@1/5/20 (the best answer line's rank), answer-page
recall@1/3 (a page scored by its best line; the manuals only), and cost on this machine: the median ms to
embed all lines of a 20-page window and the mean ms per question (embed it, score every line, rank pages).
CPU ms are the process's (all its threads): what the embedding costs whatever else runs on the machine. A tie
counts against the answer (BM25 scores many lines 0).

Fusion: ``cos + w * bm25 / max bm25 of the context``; ``w`` is chosen on the validation questions (best
texlive answer-line recall@5, then the smaller w). ``rerank``: the cross-encoder reorders the fused top
``RERANK_TOP`` lines. Test-split rows (``--test``) reuse the validation choices and are labelled.

    python benchmarks/line_retrieval.py --out benchmarks/results/line_retrieval.md [--test]
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import torch
from emit import emit  # the benchmark beside this one (a script's folder is on its path)
from tqdm import tqdm

from arr_coc.data.context_jsonl import find_answer
from arr_coc.eval.metrics import normalize_text

KS_LINE, KS_PAGE = (1, 5, 20), (1, 3)
WEIGHTS = (0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0)  # the fusion grid
RERANK_TOP = 30  # lines the cross-encoder reads per question: ~1 s on 2 cores


@dataclass
class Context:
    """One context's lines (text, page index) and its questions (question, answers, answer page index)."""

    name: str
    lines: list[str]
    pages: list[int]
    questions: list[tuple[str, tuple[str, ...], int]] = field(default_factory=list)
    n_pages: int = 1


def answer_lines(lines: list[str], answers: tuple[str, ...]) -> list[int]:
    """Indices of the lines holding an answer: normalised containment, else letters and digits only."""
    targets = [normalize_text(a) for a in answers]
    hit = [i for i, t in enumerate(lines) if any(a in normalize_text(t) for a in targets)]
    if hit:
        return hit
    return [i for i, t in enumerate(lines) if find_answer([(w, None) for w in t.split()], answers)]


def texlive_contexts(split: str) -> list[Context]:
    from arr_coc.data.paraphrase import texlive_paraphrase
    from arr_coc.documents.pdf import read_pdf

    groups: OrderedDict[tuple[str, str], list] = OrderedDict()
    for q in texlive_paraphrase(split):
        groups.setdefault((str(q.path), q.page_range), []).append(q)
    out = []
    for (path, pages), qs in tqdm(groups.items(), desc=f"texlive {split} text layers"):
        doc = read_pdf(path, pages=pages, render=False)
        lines, page_of = [], []
        for k, page in enumerate(doc.pages):
            for i in range(len(page.lines)):
                lines.append(page.line_text(i))
                page_of.append(k)
        first = int(pages.split("-")[0])
        out.append(Context(f"{qs[0].document}#{pages}", lines, page_of,
                           [(q.question, q.answers, q.answer_page - first) for q in qs], len(doc.pages)))
    return out


def image_contexts(split: str) -> list[Context]:
    from arr_coc.data.datasets import default_root
    from arr_coc.data.image_paraphrase import image_paraphrase_rows
    from arr_coc.data.sroie import read_sroie_lines

    data = default_root("image-paraphrase")
    out: OrderedDict[str, Context] = OrderedDict()
    for r in image_paraphrase_rows():
        if r["split"] != split:
            continue
        key = f"{r['source']}:{r['image']}"
        if key not in out:
            if r["source"] == "sroie":
                lines = [t for _, t in read_sroie_lines(data / "sroie" / "box" / f"{r['image']}.csv")]
            else:
                form = json.loads((data / "funsd" / "training_data" / "annotations" / f"{r['image']}.json").read_text())
                lines = [e["text"] for e in form["form"]]
            lines = [t for t in lines if t.strip()]
            out[key] = Context(key, lines, [0] * len(lines))
        out[key].questions.append((r["question"], tuple(r["answers"]), 0))
    return list(out.values())


def bm25_scores(ctx: Context) -> list[torch.Tensor]:
    """[L] BM25 score of every line for each question (bm25s, English stop words)."""
    import bm25s

    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize(ctx.lines, stopwords="en", show_progress=False), show_progress=False)
    vocab = retriever.vocab_dict
    out = []
    for q, _, _ in ctx.questions:
        toks = [t for t in bm25s.tokenize(q, stopwords="en", return_ids=False, show_progress=False)[0] if t in vocab]
        out.append(torch.tensor(retriever.get_scores(toks), dtype=torch.float32) if toks else torch.zeros(len(ctx.lines)))
    return out


def best_rank(scores: torch.Tensor, targets: list[int]) -> int:
    """1-based rank of the best target, ties counted against it; a huge rank when there is no target."""
    if not targets:
        return 10**9
    best = float(scores[targets].max())
    return int((scores >= best).sum())


def page_scores(scores: torch.Tensor, pages: list[int], n_pages: int) -> torch.Tensor:
    """[P] each page's best line score (-inf for a page without lines)."""
    out = torch.full((n_pages,), float("-inf"))
    return out.scatter_reduce(0, torch.tensor(pages, dtype=torch.long), scores, "amax") if pages else out


def evaluate(contexts: list[Context], scores: list[list[torch.Tensor]], with_pages: bool) -> dict[str, float]:
    """Recall figures (in %) of per-context, per-question line scores."""
    line_r, page_r, n = {k: 0 for k in KS_LINE}, {k: 0 for k in KS_PAGE}, 0
    for ctx, per_q in zip(contexts, scores):
        for (q, answers, page), s in zip(ctx.questions, per_q):
            n += 1
            r = best_rank(s, answer_lines(ctx.lines, answers))
            for k in KS_LINE:
                line_r[k] += r <= k
            if with_pages:
                pr = best_rank(page_scores(s, ctx.pages, ctx.n_pages), [page])
                for k in KS_PAGE:
                    page_r[k] += pr <= k
    out = {f"line@{k}": 100 * v / n for k, v in line_r.items()}
    if with_pages:
        out.update({f"page@{k}": 100 * v / n for k, v in page_r.items()})
    return out


def dense_scores(name: str, contexts: list[Context], timing: dict) -> list[list[torch.Tensor]]:
    """Cosine of every line to each question; records ms to embed each 20-page window and ms per question."""
    from arr_coc.engine.retrieval import load_retriever

    r = load_retriever(name, max_cached=0)  # no cache: every window and question is timed in full
    r.queries(["warm up"]), r.passages(["warm up"])  # loads the model outside the timings
    out = []
    for ctx in tqdm(contexts, desc=name):
        t, c = time.perf_counter(), time.process_time()
        p = r.passages(ctx.lines) if ctx.lines else torch.zeros(0, 1)  # [L, D]
        if ctx.n_pages == 20:
            timing.setdefault("window_ms", []).append(1000 * (time.perf_counter() - t))
            timing.setdefault("window_cpu_ms", []).append(1000 * (time.process_time() - c))
        per_q = []
        for q, _, _ in ctx.questions:
            t = time.perf_counter()
            s = (r.queries([q]) @ p.T)[0] if ctx.lines else torch.zeros(0)  # [L]
            page_scores(s, ctx.pages, ctx.n_pages).argsort(descending=True)
            timing.setdefault("question_ms", []).append(1000 * (time.perf_counter() - t))
            per_q.append(s)
        out.append(per_q)
    return out


def fuse(dense: list[list[torch.Tensor]], bm25: list[list[torch.Tensor]], w: float) -> list[list[torch.Tensor]]:
    """cos + w * bm25 / (the context's best bm25 for the question)."""
    return [[d + w * b / b.max().clamp(min=1e-9) if len(b) else d for d, b in zip(dq, bq)]
            for dq, bq in zip(dense, bm25)]


def rerank(contexts: list[Context], first: list[list[torch.Tensor]], timing: dict) -> list[list[torch.Tensor]]:
    """The cross-encoder's logits put the first stage's top RERANK_TOP lines above the rest, in its order."""
    from arr_coc.engine.retrieval import CrossEncoderReranker

    ce = CrossEncoderReranker()
    ce.rerank("warm up", ["warm up"])
    out = []
    for ctx, per_q in tqdm(list(zip(contexts, first)), desc="rerank"):
        row = []
        for (q, _, _), s in zip(ctx.questions, per_q):
            top = s.argsort(descending=True)[:RERANK_TOP]
            t = time.perf_counter()
            logits = ce.rerank(q, [ctx.lines[i] for i in top.tolist()])
            timing.setdefault("question_ms", []).append(1000 * (time.perf_counter() - t))
            new = s - s.max() - 1e3  # below every reranked line, in the first stage's order
            new[top] = logits - logits.min() + 1.0
            row.append(new)
        out.append(row)
    return out


def fmt_row(name: str, tex: dict, img: dict, timing: dict) -> str:
    cells = [f"{tex[f'line@{k}']:.1f}" for k in KS_LINE] + [f"{tex[f'page@{k}']:.1f}" for k in KS_PAGE]
    cells += [f"{img[f'line@{k}']:.1f}" for k in KS_LINE[:2]]
    win, cpu, qms = timing.get("window_ms"), timing.get("window_cpu_ms"), timing.get("question_ms")
    cells += [f"{statistics.median(win):.0f} / {statistics.median(cpu):.0f}" if win else "-",
              f"{statistics.mean(qms):.1f}" if qms else "-"]
    return f"| {name} | " + " | ".join(cells) + " |"


HEADER = ("| method | line R@1 | line R@5 | line R@20 | page R@1 | page R@3 | image line R@1 | image line R@5 "
          "| embed ms / 20-page window (median; wall / CPU) | ms / question (mean) |\n|" + " --- |" * 10)


def cached(cache: Path | None, key: str, compute):
    """``compute()``, or what it returned for ``key`` before (``--cache``: a folder of scores, never committed)."""
    path = cache / f"{re.sub(r'[^A-Za-z0-9._-]+', '_', key)}.pt" if cache else None  # an hf: model's path as one name
    if path and path.is_file():
        return torch.load(path)
    out = compute()
    if path:
        cache.mkdir(parents=True, exist_ok=True)
        torch.save(out, path)
    return out


def run_split(split: str, methods: list[str], weights: dict[str, float] | None, log, cache: Path | None = None,
              rerank_first: bool = True) -> tuple[list[str], dict]:
    """The table rows of one split; ``weights`` None chooses each fusion weight on this split (validation)."""
    tex, img = texlive_contexts(split), image_contexts(split)
    def found(cs: list[Context]) -> int:  # questions with at least one answer line (the others count as misses)
        return sum(bool(answer_lines(c.lines, a)) for c in cs for _, a, _ in c.questions)

    log(f"{split}: {sum(len(c.questions) for c in tex)} texlive questions over {len(tex)} windows "
        f"({sum(len(c.lines) for c in tex)} lines; {found(tex)} with an answer line), "
        f"{sum(len(c.questions) for c in img)} image questions ({found(img)} with an answer line)")
    rows, chosen, grid = [], {}, []

    def bm25_all():
        t0 = time.perf_counter()
        b_tex = [bm25_scores(c) for c in tqdm(tex, desc="bm25")]
        ms = [1000 * (time.perf_counter() - t0) / max(1, sum(len(c.questions) for c in tex))]
        return b_tex, [bm25_scores(c) for c in img], {"question_ms": ms}

    bm_tex, bm_img, tb = cached(cache, f"{split}-bm25", bm25_all)
    rows.append(fmt_row("BM25 (bm25s, lines)", evaluate(tex, bm_tex, True), evaluate(img, bm_img, False), tb))
    for name in methods:
        def dense_all(name=name):
            timing: dict = {}
            return dense_scores(name, tex, timing), dense_scores(name, img, {}), timing

        d_tex, d_img, timing = cached(cache, f"{split}-{name}", dense_all)
        rows.append(fmt_row(name, evaluate(tex, d_tex, True), evaluate(img, d_img, False), timing))
        if weights is None:
            scored = []
            for w in WEIGHTS:
                e = evaluate(tex, fuse(d_tex, bm_tex, w), True)
                grid.append(f"| {name} + {w:g} BM25 | " + " | ".join(f"{v:.1f}" for v in e.values()) + " |")
                scored.append((e["line@5"], -w, w))
            chosen[name] = max(scored)[2]
        w = (weights or chosen)[name]
        f_tex, f_img = fuse(d_tex, bm_tex, w), fuse(d_img, bm_img, w)
        rows.append(fmt_row(f"{name} + {w:g} x BM25", evaluate(tex, f_tex, True), evaluate(img, f_img, False), timing))
        if name == methods[0] and rerank_first:
            def rerank_all():
                rt: dict = {}
                r_tex, r_img = rerank(tex, f_tex, rt), rerank(img, f_img, {})
                rt["question_ms"] = [a + b for a, b in zip(timing["question_ms"], rt["question_ms"])]
                rt["window_ms"], rt["window_cpu_ms"] = timing.get("window_ms"), timing.get("window_cpu_ms")
                return r_tex, r_img, rt

            r_tex, r_img, rt = cached(cache, f"{split}-{name}-{w:g}-rerank", rerank_all)
            rows.append(fmt_row(f"{name} + {w:g} x BM25, top {RERANK_TOP} reranked by ms-marco-MiniLM-L-12",
                                evaluate(tex, r_tex, True), evaluate(img, r_img, False), rt))
    return rows, {"weights": weights or chosen, "grid": grid}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", default="bge-small,minilm", help="registered retrievers or hf:PATH_OR_ID "
                                                                  "(a sentence-transformers model), comma-separated; "
                                                                  "the first is also reranked")
    ap.add_argument("--test", action="store_true", help="also the test split, for the first method (the choice), with "
                                                              "the validation fusion weight")
    ap.add_argument("--out", type=Path, default=None, help="write the markdown here")
    ap.add_argument("--cache", type=Path, default=None, help="keep each method's scores here and reuse them")
    ap.add_argument("--no-rerank", action="store_true", help="leave out the cross-encoder row")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (this process; default: torch's)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    methods = [m for m in args.methods.split(",") if m]
    notes: list[str] = []
    rows, info = run_split("val", methods, None, notes.append, args.cache, not args.no_rerank)
    import os
    import sys

    load = os.getloadavg()[0]
    reused = " (scores and timings in the cache were measured by earlier runs of it)" if args.cache else ""
    md = [f"`python benchmarks/line_retrieval.py {' '.join(sys.argv[1:])}`{reused} on {os.cpu_count()} CPUs, load "
          f"average {load:.1f} when this table was made: wall ms share the CPUs with whatever else runs, CPU ms are "
          f"the process's own; `--threads` sets torch's threads (MiniLM), ONNX Runtime takes the cores.", "",
          "Validation questions (every choice is made here):", "", HEADER, *rows, "",
          "Fusion weights on validation (texlive: line R@1, R@5, R@20, page R@1, R@3):", "",
          "| fused | line R@1 | line R@5 | line R@20 | page R@1 | page R@3 |", "|" + " --- |" * 6, *info["grid"]]
    if args.test:
        t_rows, _ = run_split("test", methods[:1], info["weights"], notes.append, args.cache, not args.no_rerank)
        md += ["", f"Test questions ({methods[0]}, the choice; reported once, nothing chosen on them):", "", HEADER,
               *t_rows]
    md += ["", *[f"- {n}" for n in notes]]
    text = "\n".join(md) + "\n"
    emit(text, args.out)


if __name__ == "__main__":
    main()
