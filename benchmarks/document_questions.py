"""The document corpus and its questions: sizes per split, question counts per kind, a sample drawn to PNGs.

    python benchmarks/document_questions.py --splits test val --sample 12 --out /tmp/doc_questions

Prints the corpus (documents, families, pages per split) and, for each split asked, how many
questions of each kind its pages give; then draws a sample of test questions (an equal share per
kind, drawn with a fixed seed) on their rendered pages, answer boxes in red, for checking by eye.
"""
from __future__ import annotations

import argparse
import json
import random
from collections import Counter
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from arr_coc.documents.corpus import documents, summary
from arr_coc.documents.pdf import read_pdf
from arr_coc.documents.questions import KINDS, Question, questions


def draw(q: Question, dpi: float, path: Path) -> None:
    """Renders the question's page, outlines its answer boxes and writes the question above."""
    page = read_pdf(q.source, pages=[q.page], dpi=dpi).pages[0]
    img = Image.fromarray((page.image.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8))
    d = ImageDraw.Draw(img)
    for y0, x0, y1, x1 in q.boxes:
        d.rectangle([x0 - 2, y0 - 2, x1 + 2, y1 + 2], outline=(255, 0, 0), width=2)
    banner = Image.new("RGB", (img.width, 40), (255, 255, 220))
    ImageDraw.Draw(banner).text((8, 4), f"{q.question}\n-> {q.answers[0]}   [{q.kind}, p{q.page + 1}]", fill=(0, 0, 0))
    out = Image.new("RGB", (img.width, img.height + 40))
    out.paste(banner, (0, 0))
    out.paste(img, (0, 40))
    out.save(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--splits", nargs="+", default=["test", "val"], choices=["train", "val", "test"])
    ap.add_argument("--sample", type=int, default=12, help="test questions drawn to PNGs (0: none)")
    ap.add_argument("--dpi", type=float, default=100.0)
    ap.add_argument("--out", type=Path, default=Path("/tmp/doc_questions"))
    args = ap.parse_args()
    docs = documents()
    print(json.dumps(summary(docs)))
    by_split: dict[str, list[Question]] = {}
    for split in args.splits:
        qs: list[Question] = []
        for doc in (d for d in docs if d.split == split):
            qs += questions(read_pdf(doc.path, dpi=args.dpi, render=False))
        by_split[split] = qs
        counts = Counter(q.kind for q in qs)
        print(split, {k: counts[k] for k in KINDS}, "pages with a question:", len({(q.source, q.page) for q in qs}))
    if args.sample and "test" in by_split:
        args.out.mkdir(parents=True, exist_ok=True)
        rng = random.Random(0)
        per_kind = max(1, args.sample // len(KINDS))
        for kind in KINDS:
            pool = [q for q in by_split["test"] if q.kind == kind]
            for n, q in enumerate(rng.sample(pool, min(per_kind, len(pool)))):
                path = args.out / f"{kind}_{n}.png"
                draw(q, args.dpi, path)
                print(path, Path(q.source).name, f"p{q.page + 1}", q.question, "->", q.answers[0])


if __name__ == "__main__":
    main()
