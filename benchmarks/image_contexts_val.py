"""Choosing the ranking's weights for a context of several images (VALIDATION questions only).

A context of images (a few receipts, a scanned form's pages: no page has a text layer) is ranked as a PDF's pages
are: every page's relevance plus the text match (4), the page's best word (2), where a matched line's answer sits
(4) and the lines' retrieval (8). One image alone is placed on its relevance plus 0.5 x its lines' retrieval
(`contexts.allocate.image_weights`), which on one image read above those weights (docs/coc.md, "One image: its own
lines retrieved"). This measures both, and the retrieval alone at other weights, on contexts of several images.

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

import torch
from tqdm import tqdm

from arr_coc import ARR
from arr_coc.contexts import allocate, see_context
from arr_coc.contexts.ranking import NEAR_WEIGHT, PAGE_WEIGHT, RETRIEVAL_WEIGHT, TEXT_WEIGHT
from arr_coc.data.boxes import scale_boxes
from arr_coc.data.image_paraphrase import load_image_paraphrase
from arr_coc.eval.reading import best_window, make_view_reader, read_region, render

MARGIN = 8  # px around the answer box, the eval's default


def settings(retrievals: list[float]) -> dict[str, dict[str, float]]:
    """The weight settings compared: the pages' (a PDF's) and the retrieval alone at each weight (0.5: one image's)."""
    out = {f"pages' ({TEXT_WEIGHT:g} / {PAGE_WEIGHT:g} / {NEAR_WEIGHT:g} / {RETRIEVAL_WEIGHT:g})": dict(
        text_weight=TEXT_WEIGHT, page_weight=PAGE_WEIGHT, near_weight=NEAR_WEIGHT, retrieval_weight=RETRIEVAL_WEIGHT)}
    out["relevance alone"] = dict(text_weight=0.0, page_weight=0.0, near_weight=0.0, retrieval_weight=0.0)
    for w in retrievals:
        out[f"retrieval {w:g}"] = dict(text_weight=0.0, page_weight=0.0, near_weight=0.0, retrieval_weight=w)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pages", type=int, default=4, help="images per context")
    ap.add_argument("--budget", default="11%", help="the context's budget (a share of its full tokens)")
    ap.add_argument("--retrieval", type=float, nargs="+", default=[0.5, 2.0, 8.0],
                    help="retrieval weights tried alone (the other parts 0)")
    ap.add_argument("--limit", type=int, default=None, help="the first N validation questions")
    ap.add_argument("--out", type=Path, default=None, help="markdown file for the table")
    args = ap.parse_args()
    arr = ARR.from_pretrained("contextual").eval()
    reader = make_view_reader("tesseract", "region")
    records = load_image_paraphrase(split="val")[: args.limit]
    images = list(dict.fromkeys(r.image for r in load_image_paraphrase(split="val")))
    ways = settings(args.retrieval)
    rows = []
    for n, r in enumerate(tqdm(records, desc="image contexts (val)")):
        i = images.index(r.image)
        others = [images[(i + j) % len(images)] for j in range(1, args.pages)]
        at = n % args.pages
        context = others[:at] + [r.image] + others[at:]
        row = {"kind": r.kind}
        with torch.no_grad():
            seen = see_context(arr, context)  # seen once, placed by every setting
        for name, weights in ways.items():
            with torch.no_grad():
                out = allocate(arr, seen, r.question, args.budget, **weights)
            page = out.pages[at]
            h, w = page.image.shape[-2:]
            target = scale_boxes(r.boxes_px, (h / page.image_size[0], w / page.image_size[1]))
            text = read_region(reader, render(page.plan, page.image, page.cell), target, MARGIN)
            row[name] = (best_window(text, r.answer)[0], page.saccades / max(1, out.saccades))
        rows.append(row)
    kinds = ["all"] + sorted({r["kind"] for r in rows})
    lines = [f"made by: `python benchmarks/image_contexts_val.py --pages {args.pages} --budget {args.budget} "
             f"--retrieval {' '.join(f'{w:g}' for w in args.retrieval)}"
             + (f" --limit {args.limit}" if args.limit else "") + "` (image-paraphrase validation; reading = ANLS "
             "of the answer region on the answer's page; share = the answer page's share of the context's saccades)",
             "", "| kind (n) | " + " | ".join(ways) + " |", "|---|" + "---:|" * len(ways)]
    for k in kinds:
        sel = [r for r in rows if k == "all" or r["kind"] == k]
        cells = [f"{sum(r[w][0] for r in sel) / len(sel):.3f} ({sum(r[w][1] for r in sel) / len(sel):.2f})"
                 for w in ways]
        lines.append(f"| {k} ({len(sel)}) | " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
