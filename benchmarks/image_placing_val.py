"""Choosing how one image's own text lines' retrieval joins its relevance (VALIDATION questions only).

One image without a text layer is placed on its relevance plus a weight times its text lines' retrieval map
(:func:`arr_coc.contexts.allocate.image_placing`: the lines its text channels read, ranked by the ARR's retriever,
painted with their values). For each validation question this reads (Tesseract, the answer box + 8 px, the eval's
own ``allocation_rows``) the ``arr`` method's view with its relevance alone (weight 0) and at each ``--weights``
(with each ``--rerank N``: the image's N best lines reordered by the retriever's cross-encoder, 0 for none; with each
``--bm25 B``: the lines' BM25 fused into their retrieval scores at B, :func:`arr_coc.contexts.ranking.fuse_bm25`); prints
the mean reading per kind and writes them to ``--out``.

`arr-coc eval --split val` refuses these splits (the shipped scorer weights were chosen on them), so this script
calls the eval's parts directly: its figures choose the weight, and are no held-out result.

    python benchmarks/image_placing_val.py --dataset image-paraphrase          # all 121 validation questions
    python benchmarks/image_placing_val.py --dataset sroie --limit 60          # 60 balanced validation questions
    python benchmarks/image_placing_val.py --dataset funsd --limit 60 --budget 25%
"""
from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

import torch
from emit import emit  # the benchmark beside this one (a script's folder is on its path)
from tqdm import tqdm

from arr_coc import ARR
from arr_coc.allocators.methods import build_samplers
from arr_coc.contexts.allocate import image_placing
from arr_coc.contexts.line_values import TYPED_FLOOR
from arr_coc.data.datasets import balanced_subset, load_dataset
from arr_coc.data.image_paraphrase import load_image_paraphrase
from arr_coc.engine.channels.text import text_heights
from arr_coc.eval.reading import make_view_reader
from arr_coc.eval.run import allocation_rows
from arr_coc.eval.settings import EvalSettings

MARGIN = 8  # px around the answer box, the eval's default


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="image-paraphrase", help="image-paraphrase, sroie or funsd")
    ap.add_argument("--limit", type=int, default=None, help="balanced validation questions (sroie, funsd; default 60)")
    ap.add_argument("--budget", default="11%", help="the budget (a share of full resolution)")
    ap.add_argument("--weights", type=float, nargs="+", default=[0.5, 1.0], help="retrieval weights besides 0")
    ap.add_argument("--rerank", type=int, nargs="+", default=[0],
                    help="the cross-encoder reorders the image's best N lines (0: the retriever's order)")
    ap.add_argument("--bm25", type=float, nargs="+", default=[0.0],
                    help="BM25 weights fused into the lines' retrieval scores (0: the retriever's cosine alone)")
    ap.add_argument("--typed", type=float, nargs="+", default=[TYPED_FLOOR],
                    help="floors on the lines holding the question's answer type (a date, a person)")
    ap.add_argument("--out", type=Path, default=None, help="markdown file for the table")
    args = ap.parse_args()
    arr = ARR.from_pretrained("contextual").eval()  # what `arr-coc eval` builds by default
    settings = EvalSettings(methods=["arr"], budgets=[args.budget], reader="tesseract", reading="region", seed=0,
                            margin_px=MARGIN)
    reader, samplers = make_view_reader("tesseract", "region"), build_samplers(["arr"])
    if args.dataset == "image-paraphrase":
        records = load_image_paraphrase(split="val")[: args.limit]
    else:
        records = balanced_subset(load_dataset(args.dataset, split="val"), args.limit or 60)
    by_image = defaultdict(list)
    for r in records:
        by_image[r.image].append(r)
    weights = [0.0] + [w for w in args.weights if w != 0.0]
    # (weight, reranked lines, BM25 weight, typed floor)
    settings_ = [(0.0, 0, 0.0, args.typed[0])] + [(w, n, b, f) for w in weights if w for n in args.rerank
                                                  for b in args.bm25 for f in args.typed]
    rows = []
    for image, questions in tqdm(list(by_image.items()), desc=f"{args.dataset} val images"):
        with torch.no_grad():
            scene = arr.see(image)
            vector = arr.gestalt(scene, 1).vector
            height = text_heights(arr, scene)[0]
            for r in questions:
                relevance, query_emb = arr.score(scene, [r.question], vector)
                row = {"kind": r.kind}
                for w, n, b, f in settings_:
                    placing = image_placing(arr, scene, relevance.map, r.question, weight=w, rerank_top=n,
                                            bm25_weight=b, typed_floor=f)
                    out = next(x for x in allocation_rows(r, scene.canvas, placing, query_emb, samplers, reader,
                                                          settings, arr=arr, text_height=height)
                               if x["method"] == "arr")
                    row[w, n, b, f] = out["reading"]
                rows.append(row)
    kinds = ["all"] + sorted({r["kind"] for r in rows})
    lines = [f"made by: `python benchmarks/image_placing_val.py --dataset {args.dataset}"
             + (f" --limit {args.limit}" if args.limit else "") + f" --budget {args.budget} --weights "
             + " ".join(f"{w:g}" for w in args.weights)
             + (" --rerank " + " ".join(str(n) for n in args.rerank) if args.rerank != [0] else "")
             + (" --bm25 " + " ".join(f"{b:g}" for b in args.bm25) if args.bm25 != [0.0] else "")
             + (" --typed " + " ".join(f"{f:g}" for f in args.typed) if args.typed != [TYPED_FLOOR] else "")
             + "` (validation; reading = ANLS of the answer region)", "",
             "| kind (n) | " + " | ".join("relevance alone" if w == 0 else f"weight {w:g}"
                                          + (f", {n} lines reranked" if n else "") + (f", BM25 {b:g}" if b else "")
                                          + (f", typed floor {f:g}" if len(args.typed) > 1 else "")
                                          for w, n, b, f in settings_) + " |",
             "|---|" + "---:|" * len(settings_)]
    for k in kinds:
        sel = [r for r in rows if k == "all" or r["kind"] == k]
        lines.append(f"| {k} ({len(sel)}) | " + " | ".join(f"{sum(r[s] for r in sel) / len(sel):.3f}" for s in settings_)
                     + " |")
    emit("\n".join(lines) + "\n", args.out)


if __name__ == "__main__":
    main()
