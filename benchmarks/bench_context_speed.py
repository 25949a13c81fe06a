"""Time of seeing a 20-page PDF once and of each question over it, as ``arr-coc eval contexts`` allocates for coc.

One window of a LaTeX manual of the corpus's validation split (:func:`arr_coc.documents.corpus.documents`, rendered
by ``read_pdf(..., pages="1-20", dpi=100)`` as the context evals do) is seen once (:func:`arr_coc.contexts.see_context`,
its lines embedded for the retrieval part), then each hand-written ``texlive-paraphrase`` validation question of that
document whose answer lies in the window is allocated as the eval's ``coc`` method does at ``--compression 10``:
``allocate(arr, seen, question, Budget.parse(T))`` with T = the context's text tokens / 10. The ARR is the eval's
default (default channels, MiniLM questions, bge-small int8 retrieval). Reported: the see time, the first question
(it embeds the pages' lines for the text channels unless the see did) and the median / min / max of the others, with
the stages' medians from the allocation's own timings (perf_counter around each stage).

Times on a shared CPU are noisy: ``--before DIR`` (a checkout of other code, e.g. ``git worktree add /tmp/before
main``) runs that code and this one in turn, each in a fresh process, ``--repeats`` times, and reports each side's
medians and their ratio, and whether both made the same allocations (every page's cells, in order).

    python benchmarks/bench_context_speed.py --before /tmp/before --repeats 2

``--documents A B ...`` times this code alone over several windows (pages 1-20 of each), one row a window and the
medians over them: what a user's first question costs across manuals, not on one.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCUMENT = "latex/oberdiek/pdfrender.pdf"  # the validation manual with the most questions on pages 1-20
PAGES, DPI, COMPRESSION = "1-20", 100.0, 10.0
SEE_STAGES = ("canvas", "texture", "coupling", "retrieval")
QUESTION_STAGES = ("query", "coupling", "scoring", "retrieval", "text_layer", "selection")


def child(document: str, limit: int | None, threads: int | None, query_batch: int | None = None,
          layer: str | None = None) -> dict:
    """This process's code: see the window once, allocate every question; times (ms) and the allocations' digest."""
    import torch

    if threads:
        torch.set_num_threads(threads)  # this benchmark process only
    from tqdm import tqdm

    from arr_coc.budget import Budget
    from arr_coc.config import ARRConfig
    from arr_coc.contexts import allocate, see_context, text_tokens
    from arr_coc.data.paraphrase import texlive_paraphrase
    from arr_coc.documents.corpus import documents
    from arr_coc.documents.pdf import read_pdf
    from arr_coc.engine.pipeline import ARR
    from arr_coc.engine.query import MiniLMQueryEncoder
    from arr_coc.eval.context_run import page_texts

    doc = next(d for d in documents(split="val") if d.name == document)
    first, last = (int(v) for v in PAGES.split("-"))
    questions = [q.question for q in texlive_paraphrase("val") if q.document == document
                 and first <= q.answer_page <= last][:limit]
    encoder = MiniLMQueryEncoder() if query_batch is None else MiniLMQueryEncoder(batch_size=query_batch)
    arr = ARR(ARRConfig(), query_encoder=encoder.load()).eval()  # the eval's default ARR
    arr.retriever.queries(["warm up"])  # the models' loading is not the context's time
    start, cpu = time.perf_counter(), time.process_time()
    context = read_pdf(doc.path, pages=PAGES, dpi=DPI)
    with torch.inference_mode():
        seen = see_context(arr, context) if layer is None else see_context(arr, context, layer_relevance=layer)
    see_ms, see_cpu = (time.perf_counter() - start) * 1e3, (time.process_time() - cpu) * 1e3
    texts = page_texts(seen)
    grids = [g for scene in seen.scenes for g in scene.extents]
    total = Budget.parse(f"{COMPRESSION:g}x").total(sum(h * w for h, w in grids),
                                                      text_tokens=text_tokens("\n\n".join(texts)), pages=len(seen))
    rows, digest, cells = [], hashlib.blake2b(digest_size=8), []
    for q in tqdm(questions, desc="questions", file=sys.stderr):
        start, cpu = time.perf_counter(), time.process_time()
        with torch.inference_mode():
            out = allocate(arr, seen, q, Budget.parse(total)) if layer is None else \
                allocate(arr, seen, q, Budget.parse(total), layer_relevance=layer)
        rows.append({"ms": (time.perf_counter() - start) * 1e3, "cpu": (time.process_time() - cpu) * 1e3,
                     **out.timings_ms})
        for p in out.pages:
            digest.update(json.dumps([p.index, p.plan.cells.tolist()]).encode())
        cells.append([[p.index, *c] for p in out.pages for c in p.plan.cells.tolist()])
    return {"see_ms": see_ms, "see_cpu": see_cpu, "see": seen.timings_ms, "questions": rows, "tokens": total, "pages": len(seen),
            "digest": digest.hexdigest(), "n": len(questions), "cells": cells}


def run_side(root: Path, document: str, limit: int | None, threads: int | None, query_batch: int | None = None,
             layer: str | None = None) -> dict:
    """One fresh process of the code under ``root`` (``layer``: its ``layer_relevance``)."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--document", document]
    cmd += ([] if limit is None else ["--limit", str(limit)]) + ([] if threads is None else ["--threads", str(threads)])
    cmd += [] if query_batch is None else ["--query-batch", str(query_batch)]
    cmd += [] if layer is None else ["--layer-relevance", layer]
    done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True, check=True, cwd=root)
    return json.loads(done.stdout.strip().splitlines()[-1])


def med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summary(runs: list[dict]) -> dict:
    """Medians over every run of a side: see, first question, the other questions (and min/max), each stage."""
    later = [r for run in runs for r in run["questions"][1:]]
    out = {"see": med([r["see_ms"] for r in runs]), "first": med([r["questions"][0]["ms"] for r in runs]),
           "question": med([r["ms"] for r in later]), "min": min(r["ms"] for r in later),
           "max": max(r["ms"] for r in later), "see_cpu": med([r["see_cpu"] for r in runs]),
           "question_cpu": med([r["cpu"] for r in later])}
    out.update({f"see/{s}": med([r["see"].get(s, 0.0) for r in runs]) for s in SEE_STAGES})
    out.update({f"q/{s}": med([r.get(s, 0.0) for r in later]) for s in QUESTION_STAGES})
    return out


def table(sides: dict[str, dict]) -> list[str]:
    names = list(sides)
    rows = ["| time (ms, medians) | " + " | ".join(names) + (" | ratio |" if len(names) == 2 else " |"),
            "|---|" + "---:|" * (len(names) + (len(names) == 2))]
    labels = [("see (20 pages)", "see"), ("  see: CPU time (all threads)", "see_cpu"),
              *((f"  see: {s}", f"see/{s}") for s in SEE_STAGES), ("first question", "first"),
              ("each later question", "question"), ("  min", "min"), ("  max", "max"),
              ("  CPU time (all threads)", "question_cpu"),
              *((f"  question: {s}", f"q/{s}") for s in QUESTION_STAGES)]
    for label, key in labels:
        vals = [sides[n][key] for n in names]
        ratio = f" | {vals[0] / vals[1]:.2f}x" if len(vals) == 2 and vals[1] > 0 else (" | " if len(vals) == 2 else "")
        rows.append(f"| {label} | " + " | ".join(f"{v:.0f}" for v in vals) + ratio + " |")
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--document", default=DOCUMENT, help="a validation manual, named under the corpus's doc root")
    p.add_argument("--limit", type=int, default=None, help="at most this many questions")
    p.add_argument("--repeats", type=int, default=1, help="fresh processes per side (interleaved with --before)")
    p.add_argument("--before", type=Path, default=None, help="a checkout of the code to compare with")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "context_speed.md")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    p.add_argument("--query-batch", type=int, default=None,
                   help="MiniLM's batch_size (default: the encoder's, 256); not the eval's ARR, its vectors differ in the last bits")
    p.add_argument("--layers", action="store_true",
                   help="this code twice: text-layer pages ranked on the ARR's relevance, then on their ink (the default)")
    p.add_argument("--documents", nargs="+", default=None,
                   help="several validation manuals, pages 1-20 of each: this code alone, one row a window")
    p.add_argument("--layer-relevance", default=None, help=argparse.SUPPRESS)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.document, args.limit, args.threads, args.query_batch, args.layer_relevance)))
        return
    if args.layers and args.before:
        p.error("--layers compares this code with itself: leave --before out")
    if args.documents:
        if args.before or args.layers:
            p.error("--documents times this code alone over several windows: leave --before and --layers out")
        windows(args)
        return
    roots = {"this code": (ROOT, None)} if args.before is None else {"before": (args.before.resolve(), None),
                                                                     "this code": (ROOT, None)}
    if args.layers:
        roots = {"ARR relevance": (ROOT, "arr"), "ink (default)": (ROOT, "ink")}
    runs: dict[str, list[dict]] = {n: [] for n in roots}
    for _ in range(args.repeats):
        for name, (root, layer) in roots.items():  # interleaved: both sides see the same load
            runs[name].append(run_side(root, args.document, args.limit, args.threads, args.query_batch, layer))
            print(f"{name}: see {runs[name][-1]['see_ms']:.0f} ms, questions "
                  f"{[round(r['ms']) for r in runs[name][-1]['questions']]} ms, allocations {runs[name][-1]['digest']}",
                  flush=True)
    one = runs[list(roots)[-1]][0]
    same = len({run["digest"] for side in runs.values() for run in side}) == 1
    cmd = "python benchmarks/bench_context_speed.py" + (f" --before {args.before}" if args.before else "") \
        + f" --repeats {args.repeats}" + (f" --limit {args.limit}" if args.limit else "") \
        + (f" --threads {args.threads}" if args.threads else "") \
        + (f" --query-batch {args.query_batch}" if args.query_batch else "") + (" --layers" if args.layers else "")
    lines = ["# Context speed: a 20-page PDF seen once, then each question (coc at 10x)", "",
             f"`{args.document}` pages {PAGES} at {DPI:g} dpi ({one['pages']} pages), {one['n']} texlive-paraphrase "
             f"validation questions, coc at {COMPRESSION:g}x = {one['tokens']} tokens; {args.repeats} fresh process(es)"
             f" per side{', the sides interleaved' if args.before else ''}; {os.cpu_count()} CPU cores shared with "
             f"other work, torch threads: {args.threads or 'default'}, MiniLM batch: {args.query_batch or 'default'}. 'each later question': every question after "
             "the first, over all runs.", "",
             *table({n: summary(r) for n, r in runs.items()}), ""]
    if args.before:
        lines += [f"Same allocations (every page's cells, in order, every question): {'yes' if same else 'NO'}.", ""]
    if args.layers:
        a, b = (runs[n][0]["cells"] for n in roots)
        shared = [len({tuple(c) for c in x} & {tuple(c) for c in y}) / max(1, len(x)) for x, y in zip(a, b)]
        lines += [f"Saccade cells the two rankings share (per question, then the median): "
                  f"{statistics.median(shared):.0%} (min {min(shared):.0%}); the allocations differ by design "
                  f"(what decides them is measured on validation questions in docs/coc.md, not here).", ""]
    lines += [f"`{cmd}`", ""]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))


def windows(args: argparse.Namespace) -> None:
    """This code over several windows, ``--repeats`` fresh processes each: one row a window, then the medians."""
    rows, firsts, laters, sees = [], [], [], []
    for document in args.documents:
        runs = [run_side(ROOT, document, args.limit, args.threads, args.query_batch) for _ in range(args.repeats)]
        s = summary(runs)
        sees.append(s["see"])
        firsts.append(s["first"])
        laters += [r["ms"] for run in runs for r in run["questions"][1:]]
        rows.append(f"| `{document}` | {runs[0]['n']} | {runs[0]['tokens']} | {s['see']:.0f} | {s['first']:.0f} | "
                    f"{s['question']:.0f} | {s['max']:.0f} |")
        print(rows[-1], flush=True)
    cmd = "python benchmarks/bench_context_speed.py --documents " + " ".join(args.documents) \
        + f" --repeats {args.repeats}" + (f" --limit {args.limit}" if args.limit else "")
    lines = ["# Context speed over several windows: each seen once, then its questions (coc at 10x)", "",
             f"Pages {PAGES} of each validation manual at {DPI:g} dpi; its texlive-paraphrase validation questions on "
             f"those pages{f' (at most {args.limit})' if args.limit else ''}; {args.repeats} fresh process(es) a "
             f"window; {os.cpu_count()} CPU cores shared with other work. Times in ms: medians over the window's "
             "processes; 'later': every question after a process's first.", "",
             "| window | questions | tokens at 10x | see | first question | later (median) | later (max) |",
             "|---|---:|---:|---:|---:|---:|---:|", *rows,
             f"| **median over the {len(rows)} windows** | | | **{med(sees):.0f}** | **{med(firsts):.0f}** | "
             f"**{med(laters):.0f}** | {max(laters):.0f} |", "",
             f"Sees over 5 s: {sum(v > 5000 for v in sees)} of {len(sees)} windows; first questions over 2 s: "
             f"{sum(v > 2000 for v in firsts)} of {len(firsts)}; later questions over 2 s: {sum(v > 2000 for v in laters)} of {len(laters)}.", "",
             f"`{cmd}`", ""]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
