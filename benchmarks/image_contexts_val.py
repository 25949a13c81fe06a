"""How a context of several images is ranked and placed (VALIDATION questions only).

A context's pages share its saccades by one ranking (every page's relevance plus the text match (4), the page's best
word (2), where a matched line's answer sits (4) and the lines' retrieval (8): a PDF's weights), and each page's
sampler places its share on its placing map (by default the ranking itself). One image alone is placed on its
relevance plus 0.5 x its lines' retrieval (`contexts.allocate.image_weights`), which on one image read above the PDF's
weights (docs/coc.md, "One image: its own lines retrieved"). This measures, on contexts of several images (no page has
a text layer), the default, the PDF's ranking with each page placed by its relevance plus ``--placing`` x its lines'
retrieval (`allocate`'s ``images_alone`` at that ``image_retrieval_weight``), and the ranking and placing both by the
relevance plus ``--retrieval`` x the retrieval.

Each validation question of image-paraphrase (a receipt or a form) is asked over a context of its own image and
the next ``--pages`` - 1 validation images (in file order, the answer's page at position question number mod
``--pages``), at ``--budget`` of the context's full tokens; `allocate` places them with each setting, and the
answer's page's view (its gestalt and its saccades, what the VLM would get of it) is read as `arr-coc eval` reads
one image: Tesseract on the answer box + 8 px, ANLS of the best window. Prints the mean reading per kind and the
answer page's share of the saccades, and writes them to ``--out``.

    python benchmarks/image_contexts_val.py --pages 4 --budget 11%

The figures choose the weights; they are no held-out result.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch
from emit import emit  # the benchmark beside this one (a script's folder is on its path)
from tqdm import tqdm

from arr_coc import ARR
from arr_coc.contexts import allocate, see_context
from arr_coc.contexts.ranking import BM25_WEIGHT, NEAR_WEIGHT, PAGE_WEIGHT, RETRIEVAL_WEIGHT, TEXT_WEIGHT
from arr_coc.data.boxes import scale_boxes
from arr_coc.data.image_paraphrase import load_image_paraphrase
from arr_coc.eval.intervals import bootstrap_mean, bootstrap_ratio
from arr_coc.eval.reading import best_window, make_view_reader, read_region, render

MARGIN = 8  # px around the answer box, the eval's default


def weight_pair(text: str) -> tuple[float, float]:
    """``--ranking``'s ``W:B``: a retrieval weight and a BM25 weight."""
    try:
        w, b = text.split(":")
        return float(w), float(b)
    except ValueError:
        raise argparse.ArgumentTypeError(f"takes W:B (a retrieval weight and a BM25 weight), got {text!r}") from None


def settings(retrievals: list[float], placings: list[float],
             rankings: list[tuple[float, float]] = ()) -> dict[str, dict[str, Any]]:
    """The settings compared: the PDF's ranking placed on it (the default), the PDF's ranking with each page placed,
    within its share, by its relevance plus each ``placings`` weight times its lines' retrieval (``images_alone``),
    the ranking by the relevance plus each ``retrievals`` weight times the retrieval (its pages placed on it), and the
    PDF's ranking at each other (retrieval weight, BM25 weight) of ``rankings``, placed on it."""
    pages = dict(text_weight=TEXT_WEIGHT, page_weight=PAGE_WEIGHT, near_weight=NEAR_WEIGHT,
                 retrieval_weight=RETRIEVAL_WEIGHT, bm25_weight=BM25_WEIGHT)
    name = f"ranking {TEXT_WEIGHT:g} / {PAGE_WEIGHT:g} / {NEAR_WEIGHT:g} / {RETRIEVAL_WEIGHT:g}, BM25 {BM25_WEIGHT:g}"
    out: dict[str, dict[str, Any]] = {f"{name}, placed on it": dict(pages)}
    for w in placings:
        out[f"{name}, placed at {w:g}"] = dict(pages, image_retrieval_weight=w, images_alone=True)
    for w in retrievals:
        out[f"ranking and placing: retrieval {w:g}"] = dict(text_weight=0.0, page_weight=0.0, near_weight=0.0,
                                                            retrieval_weight=w)
    for w, b in rankings:
        if (w, b) != (RETRIEVAL_WEIGHT, BM25_WEIGHT):
            out[f"ranking {TEXT_WEIGHT:g} / {PAGE_WEIGHT:g} / {NEAR_WEIGHT:g} / {w:g}, BM25 {b:g}, placed on it"] = dict(
                pages, retrieval_weight=w, bm25_weight=b)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pages", type=int, default=4, help="images per context")
    ap.add_argument("--budget", default="11%", help="the context's budget (a share of its full tokens)")
    ap.add_argument("--retrieval", type=float, nargs="*", default=[0.5],
                    help="retrieval weights the ranking and the placing use alone (the other parts 0)")
    ap.add_argument("--placing", type=float, nargs="*", default=[0.0, 0.5, 1.0],
                    help="under the pages' ranking, each page placed by its relevance plus this times its lines' "
                         "retrieval (allocate's images_alone at this image_retrieval_weight)")
    ap.add_argument("--ranking", nargs="*", type=weight_pair, default=[], metavar="W:B",
                    help="the PDF's ranking at these retrieval weights W and BM25 weights B as well (e.g. 8:0)")
    ap.add_argument("--limit", type=int, default=None, help="the first N questions")
    ap.add_argument("--split", default="val", choices=["val", "test"],
                    help="val chooses; test is read once, with the setting val chose")
    ap.add_argument("--out", type=Path, default=None, help="markdown file for the table")
    args = ap.parse_args()
    arr = ARR.from_pretrained("contextual").eval()
    reader = make_view_reader("tesseract", "region")
    every = load_image_paraphrase(split=args.split)
    records = every[: args.limit]
    images = list(dict.fromkeys(r.image for r in every))  # the split's images in file order
    ways = settings(args.retrieval, args.placing, args.ranking)
    rows = []
    for n, r in enumerate(tqdm(records, desc=f"image contexts ({args.split})")):
        i = images.index(r.image)
        others = [images[(i + j) % len(images)] for j in range(1, args.pages)]
        at = n % args.pages
        context = others[:at] + [r.image] + others[at:]
        row = {"kind": r.kind}
        with torch.no_grad():
            seen = see_context(arr, context)  # seen once, placed by every setting
        full = None
        for name, weights in ways.items():
            with torch.no_grad():
                out = allocate(arr, seen, r.question, args.budget, **weights)
            page = out.pages[at]
            h, w = page.image.shape[-2:]
            target = scale_boxes(r.boxes_px, (h / page.image_size[0], w / page.image_size[1]))
            text = read_region(reader, render(page.plan, page.image, page.cell), target, MARGIN)
            row[name] = (best_window(text, r.answer)[0], page.saccades / max(1, out.saccades))
            if full is None:  # the answer page's canvas itself: every cell at full resolution
                full = (best_window(read_region(reader, page.image, target, MARGIN), r.answer)[0], 1.0)
        row["full"] = full
        rows.append(row)
    kinds = ["all"] + sorted({r["kind"] for r in rows})
    lines = [f"made by: `python benchmarks/image_contexts_val.py --pages {args.pages} --budget {args.budget} "
             + "--retrieval " + "".join(f"{w:g} " for w in args.retrieval)
             + "--placing " + " ".join(f"{w:g}" for w in args.placing)
             + (" --ranking " + " ".join(f"{w:g}:{b:g}" for w, b in args.ranking) if args.ranking else "")
             + (f" --limit {args.limit}" if args.limit else "") + (" --split test" if args.split == "test" else "")
             + f"` (image-paraphrase {'validation' if args.split == 'val' else 'test'}; reading = ANLS "
             "of the answer region on the answer's page; share = the answer page's share of the context's saccades)",
             "", "| kind (n) | full | " + " | ".join(ways) + " |", "|---|" + "---:|" * (len(ways) + 1)]
    for k in kinds:
        sel = [r for r in rows if k == "all" or r["kind"] == k]
        cells = [f"{sum(r['full'][0] for r in sel) / len(sel):.3f}"] + [
            f"{sum(r[w][0] for r in sel) / len(sel):.3f} ({sum(r[w][1] for r in sel) / len(sel):.2f})" for w in ways]
        lines.append(f"| {k} ({len(sel)}) | " + " | ".join(cells) + " |")
    first = next(iter(ways))
    lo, hi = bootstrap_ratio([r[first][0] for r in rows], [r["full"][0] for r in rows])
    ratio = sum(r[first][0] for r in rows) / max(1e-9, sum(r["full"][0] for r in rows))
    lines += ["", f"`{first}` reads {100 * ratio:.1f} % of full [{100 * lo:.1f}, {100 * hi:.1f}] (paired bootstrap)."]
    if len(ways) > 1:
        lines += ["", f"Paired difference from `{first}` over the {len(rows)} questions (mean [95 % bootstrap "
                      "interval]):", ""]
    for w in list(ways)[1:]:
        diff = [r[w][0] - r[first][0] for r in rows]
        lo, hi = bootstrap_mean(diff)
        lines.append(f"- {w}: {sum(diff) / len(diff):+.3f} [{lo:+.3f}, {hi:+.3f}]")
    emit("\n".join(lines) + "\n", args.out)


if __name__ == "__main__":
    main()
