"""Questions in a user's own words over 20-page contexts: both readings as a share of full resolution's, with intervals.

    python benchmarks/paraphrase_tables.py --dataset texlive-paraphrase --split test --sources pdf text
    python benchmarks/paraphrase_tables.py --dataset texlive-contexts --split test --sources pdf text

Questions: ``texlive-paraphrase`` (written by hand, in a user's words: :mod:`arr_coc.data.paraphrase`) or
``texlive-contexts`` (generated from the manuals' section titles and next words:
:func:`arr_coc.data.contexts.texlive_contexts`), over the PDF and / or its text layer re-set on pages (``text``).
For each question and compression c every method gets T = text tokens / c visual tokens (full, coc,
equal_split, uniform, first_pages, bm25_pages, retrieval_pages), and the one evaluation loop
(:func:`arr_coc.eval.evaluate.evaluate`) stores the rows in ``--out/<dataset>/<split>/<source>/records.jsonl`` as
they come (a rerun, or a larger ``--limit``, skips what is done). From them (:mod:`arr_coc.eval.paired`):

- ``tables.md``: per source, method and compression the region and the find reading, each as a share of full
  resolution's on the same questions with its 95 % paired bootstrap interval, the page hit, the strict page hit
  and the coverage; then per question kind;
- ``tables.csv``: the same aggregates, one line per source, kind, budget and method (no per-question rows);
- ``reading_vs_compression.png``: both shares against the compression actually sent, with the points other
  systems published on other data (DeepSeek-OCR on Fox, LensVLM), marked as such.
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import sys
from pathlib import Path
from typing import Any, Iterator

from arr_coc import ARR, ARRConfig
from arr_coc.config import TextureConfig
from arr_coc.contexts import tokenizer_name
from arr_coc.data.contexts import texlive_contexts
from arr_coc.data.paraphrase import paraphrase_context_set
from arr_coc.eval.evaluate import evaluate
from arr_coc.eval.paired import kind_table, loss_table, paired_kinds, paired_table, where_lost
from arr_coc.eval.settings import EvalSettings
from arr_coc.eval.store import RowStore

METHODS = ("full", "coc", "equal_split", "uniform", "first_pages", "bm25_pages", "retrieval_pages")
DATASETS = ("texlive-paraphrase", "texlive-contexts")
# Published figures of other systems on other data, drawn for orientation only (not comparable measurements):
# DeepSeek-OCR (Wei et al. 2025, "DeepSeek-OCR: Contexts Optical Compression"), OCR precision on Fox against
# text tokens / vision tokens; LensVLM: parity with reading the full text at ~4.3x.
DEEPSEEK_OCR = ((7.5, 97.3), (10.5, 96.5), (12.6, 87.0), (19.7, 59.0))
LENSVLM = ((4.3, 100.0),)


def items(args: argparse.Namespace, source: str) -> tuple[Iterator[Any], dict, list[dict]]:
    """The contexts of one source, at most ``--limit`` questions in all, how they were made (the rows' settings:
    the limit is left out, so a larger run reuses a smaller one's rows) and the windows the re-set text leaves out
    (said in the tables, not a setting of the rows)."""
    if args.dataset == "texlive-paraphrase":
        found, made, _ = paraphrase_context_set(split=args.split, limit=args.limit, dpi=args.dpi,
                                                source=None if source == "pdf" else source)
        return found, {k: v for k, v in made.items() if k not in ("limit", "skipped")}, made.get("skipped", [])
    made = {"split": args.split, "source": source, "pages": args.window, "dpi": args.dpi, "questions": args.questions,
            "seed": 0}
    found = texlive_contexts(args.split, pages=args.window, source=source, dpi=args.dpi, questions=args.questions)

    def limited() -> Iterator[Any]:
        left = args.limit
        for item in found:
            if left is not None and left <= 0:
                return
            qs = item.questions if left is None else item.questions[:left]
            left = None if left is None else left - len(qs)
            yield dataclasses.replace(item, questions=qs)

    return limited(), made, []


def run_source(args: argparse.Namespace, arr: ARR, source: str, folder: Path) -> tuple[list[dict], list[dict]]:
    """Evaluate one source (resumable) and return exactly the rows this run asks for, and the windows it left out."""
    contexts, made, skipped = items(args, source)
    settings = EvalSettings(methods=METHODS, budgets=[f"{c:g}x" for c in args.compression], reader=args.reader,
                            contexts=made, fresh=args.fresh)
    resolved, keys = settings.resolve("context"), set()

    def asked(found: Iterator[Any]) -> Iterator[Any]:
        for item in found:
            for q in item.questions:
                keys.update(resolved.keys(q.record_id))
            yield item

    jsonl = evaluate(asked(contexts), arr, folder, settings)
    return RowStore(jsonl.parent).rows(keys), skipped


def _compressions(summaries: dict[str, list[dict]]) -> set[tuple[str, float]]:
    """(budget, nominal compression) of every budget in the summaries."""
    return {(s["budget"], float(s["budget"][:-1])) for rows in summaries.values() for s in rows
            if s["budget"].endswith("x")}


def plot(summaries: dict[str, list[dict]], path: Path, title: str) -> Path:
    """Both readings as a share of full's against the compression sent, a line per method and source, with the
    published points of other systems."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 5.6), layout="constrained")
    ticks = sorted({4.3, *(c for _, c in _compressions(summaries))} | {10.0, 20.0})
    axes, colours = fig.subplots(1, 2, sharey=True), matplotlib.colormaps["tab10"]
    for ax, (col, name) in zip(axes, (("reading", "region reading"), ("reading_find", "find reading"))):
        for j, (source, summary) in enumerate(summaries.items()):
            for i, method in enumerate(METHODS[1:]):
                pts = sorted((s["compression"], 100 * s[f"{col}_share"], 100 * s[f"{col}_share_lo"],
                              100 * s[f"{col}_share_hi"]) for s in summary
                             if s["method"] == method and s[f"{col}_share"] == s[f"{col}_share"])
                if not pts:
                    continue
                x, y = [p[0] for p in pts], [p[1] for p in pts]
                err = [[max(0.0, p[1] - p[2]) if p[2] == p[2] else 0.0 for p in pts],
                       [max(0.0, p[3] - p[1]) if p[3] == p[3] else 0.0 for p in pts]]
                ax.errorbar(x, y, yerr=err, marker="o", ms=4, capsize=2, color=colours(i), ls=("-", "--")[j % 2],
                            label=f"{method} ({source})" if len(summaries) > 1 else method)
        ax.plot(*zip(*DEEPSEEK_OCR), "k*", ms=10, ls=":",
                label="DeepSeek-OCR, published: Fox OCR precision (other system, other data)")
        ax.plot(*zip(*LENSVLM), "kD", ms=7,
                label="LensVLM, published: parity with full text (other system, other data)")
        ax.axhline(100, color="grey", lw=0.8)
        ax.set_xscale("log")
        ax.set_xticks(ticks, [f"{t:g}x" for t in ticks])
        ax.minorticks_off()
        ax.set_xlabel("compression sent (text tokens / visual tokens)")
        ax.set_title(name)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("reading, % of full resolution's (same questions)")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=3, fontsize=8)
    fig.suptitle(title)
    fig.savefig(path, dpi=110)
    return path


README_METHODS = (("coc", "coc"), ("retrieval_pages", "retrieval pages"), ("bm25_pages", "BM25 pages"),
                  ("first_pages", "first pages"))
README_GOALS = (("10x", 0.95), ("20x", 0.90))  # coc's region reading as a share of full's


def readme_block(folder: Path, command: str) -> str:
    """The README's COC table, from ``folder``'s ``tables.csv`` (the PDF source, every kind): each method's region
    reading as a share of full resolution's at 10x / 20x, and coc's against its goals; a LookupError where the
    rows are not there yet.

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp())
    >>> rows = [{"source": "pdf", "kind": "all", "method": m, "budget": b, "n": 3, "reading_share": v}
    ...         for m, _ in README_METHODS for b, v in (("10x", 0.96), ("20x", 0.5))]
    >>> with open(d / "tables.csv", "w", newline="") as f:
    ...     w = csv.DictWriter(f, fieldnames=list(rows[0])); _ = w.writeheader(); w.writerows(rows)
    >>> print(readme_block(d, "python x.py").splitlines()[2])
    | share of full resolution's reading at 10x / 20x fewer visual than text tokens (95 % intervals: docs) | 96 / 50 % | 96 / 50 % | 96 / 50 % | 96 / 50 % |
    >>> readme_block(d, "python x.py").splitlines()[-1]
    '`python x.py`; goals: 10x >= 95 % met (96 %), 20x >= 90 % missed (50 %) ([docs/coc.md](docs/coc.md)).'
    """
    path = folder / "tables.csv"
    if not path.is_file():
        raise LookupError(f"{path} is not made yet")
    with open(path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if (r["source"], r["kind"]) == ("pdf", "all")]

    def share(method: str, budget: str) -> float:
        mine = [r for r in rows if (r["method"], r["budget"]) == (method, budget)]
        if not mine:
            raise LookupError(f"{path} has no {method} row at {budget}")
        return 100 * float(mine[0]["reading_share"])

    n = next((r["n"] for r in rows if r["method"] == "coc"), None)
    if n is None:
        raise LookupError(f"{path} has no coc rows")
    head = " | ".join(label for _, label in README_METHODS)
    cells = " | ".join(f"{share(m, '10x'):.0f} / {share(m, '20x'):.0f} %" for m, _ in README_METHODS)
    goals = ", ".join(f"{b} >= {100 * g:.0f} % {'met' if share('coc', b) >= 100 * g else 'missed'} "
                      f"({share('coc', b):.0f} %)" for b, g in README_GOALS)
    return (f"| {n} hand-written test questions, 20-page PDF windows (Tesseract reads what a VLM would get) | {head} |\n"
            f"|---|{'---:|' * len(README_METHODS)}\n"
            f"| share of full resolution's reading at 10x / 20x fewer visual than text tokens (95 % intervals: docs) "
            f"| {cells} |\n\n`{command}`; goals: {goals} ([docs/coc.md](docs/coc.md)).")


def mean(rows: list[dict], column: str) -> float:
    """``column``'s mean over the rows that hold it."""
    vals = [r[column] for r in rows if r.get(column) is not None]
    return sum(vals) / len(vals) if vals else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="texlive-paraphrase", choices=DATASETS)
    ap.add_argument("--split", default="test", choices=["val", "test"])
    ap.add_argument("--sources", nargs="+", default=["pdf"], choices=["pdf", "text"],
                    help="the PDF and/or its text layer re-set on pages (default pdf)")
    ap.add_argument("--compression", type=float, nargs="+", default=[5.0, 10.0, 20.0, 40.0])
    ap.add_argument("--limit", type=int, default=None, help="the first N questions (default: all of the split)")
    ap.add_argument("--window", type=int, default=20, help="texlive-contexts: pages per context")
    ap.add_argument("--questions", type=int, default=8, help="texlive-contexts: questions per context")
    ap.add_argument("--dpi", type=float, default=100.0)
    ap.add_argument("--reader", default="tesseract", choices=["tesseract", "rapidocr"])
    ap.add_argument("--channels", nargs="+", default=None, help="the ARR's channels (default: the pipeline's)")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "paraphrase")
    ap.add_argument("--fresh", action="store_true", help="replace rows of --out made with other settings")
    args = ap.parse_args()
    if args.limit is not None and args.limit < 1:
        ap.error(f"--limit must be at least 1 question, got {args.limit}")
    out = args.out / args.dataset / args.split
    out.mkdir(parents=True, exist_ok=True)
    arr = ARR(ARRConfig(texture=TextureConfig(channels=tuple(args.channels)) if args.channels
                        else TextureConfig())).eval()
    summaries, sections, aggregates = {}, [], []
    for source in args.sources:
        rows, left = run_source(args, arr, source, out / source)
        every = paired_kinds(rows, METHODS)
        aggregates += [{"source": source, **s} for s in every]
        summaries[source] = [s for s in every if s["kind"] == "all"]
        full = [r for r in rows if r["method"] == "full"]
        n_contexts = len({r["image_id"] for r in full})
        left_out = (f"Left out: {sum(x['questions'] for x in left)} questions in {len(left)} windows whose text the "
                    f"re-set font cannot draw ({', '.join(x['window'] for x in left)}).\n\n" if left else "")
        sections.append(f"### {source}: {len(full)} questions, {n_contexts} context{'s' * (n_contexts != 1)}\n\n"
                        f"{left_out}"
                        f"Full resolution (every page, the reference) reads region {mean(full, 'reading'):.3f}, "
                        f"find {mean(full, 'reading_find'):.3f}.\n\n{paired_table(summaries[source])}\n\n"
                        f"Per question kind: region / find reading as a share of full's on the kind's questions "
                        f"(n = questions of the kind):\n\n{kind_table([s for s in every if s['kind'] != 'all'])}\n\n"
                        f"Where coc falls short of full: its questions by how much of the answer's area its "
                        f"full-resolution cells hold, and the points of full's reading lost on them (full's minus "
                        f"coc's, over full's on all; the parts add up to 100 minus coc's share):\n\n"
                        f"{loss_table(where_lost(rows))}")
    cmd = "python benchmarks/paraphrase_tables.py " + " ".join(sys.argv[1:])
    title = f"{args.dataset} {args.split}: reading at equal visual tokens, as a share of full resolution's"
    png = plot(summaries, out / "reading_vs_compression.png", title)
    text = (f"made by: `{cmd}`\n\n{args.dataset}, split {args.split}; reader {args.reader}; contexts at "
            f"{args.dpi:g} dpi; text tokens by {tokenizer_name()}; every method sends T = text tokens / compression "
            "visual tokens. Readings: region (the answer's boxes + margin of what the VLM would see; the find "
            "reading where the answer has no box) and find (the answer page's whole view, the answer's best word "
            "window); shares and intervals are paired by question (95 % bootstrap, 2000 resamples). Page hit: "
            "the answer page gets a full-resolution token; strict: at least half of the answer's area does.\n\n"
            + "\n\n".join(sections) + f"\n\nPlot: {png.name}\n")
    (out / "tables.md").write_text(text)
    with open(out / "tables.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(aggregates[0]))
        w.writeheader()
        w.writerows(aggregates)
    print(text)


if __name__ == "__main__":
    main()
