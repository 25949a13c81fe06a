"""Unseen layouts: single pages of the offline LaTeX manuals, with questions and answer boxes from the text layer.

The pages come from :mod:`arr_coc.documents.corpus` (the PDFs of ``texlive-latex-base-doc`` and
``texlive-latex-recommended-doc``, split by document family: 70 / 10 / 20 % train / val / test),
the questions from :mod:`arr_coc.documents.questions` (the page number, a numbered section's title,
the words that follow a quoted phrase; the answer is never in its question; no table values, whose
columns the text layer does not mark). Every document gives up to ``PAGES_PER_DOCUMENT`` pages,
drawn by a hash of its name and the seed, past its first page (a title page), each read with its
neighbours so page numbers are checked against the pages around them. A page is rendered at
``DPI`` to a PNG in the cache folder, once; the records of a split are kept there as JSON.

``arr-coc eval texlive --split test`` reads the test documents only; the split is the corpus's own
(``splits="official"``), by document family, so no page of a test manual is ever trained on.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import re
from pathlib import Path

import numpy as np
from PIL import Image

from arr_coc.data.datasets import SPLITS, DatasetSpec, Record, register
from arr_coc.data.loading import finish

PAGES_PER_DOCUMENT = 2
DPI = 150.0  # the documents package's default: 10 pt body text ~21 px high
VERSION = 3  # of the cached records: bump when how pages, questions or their boxes are made changes (3: true page boxes)


def default_folder() -> Path:
    """Where rendered pages and records are cached: ``$ARR_COC_CACHE/texlive`` or ``~/.cache/arr_coc/texlive``."""
    base = os.environ.get("ARR_COC_CACHE")
    return (Path(base) if base else Path.home() / ".cache" / "arr_coc") / "texlive"


def chosen_pages(name: str, n_pages: int, seed: int = 0, k: int = PAGES_PER_DOCUMENT) -> list[int]:
    """The 0-based pages a document of ``n_pages`` gives: ``k`` past its first, drawn by a hash of its name.

    >>> chosen_pages("latex/float/float.pdf", 12) == chosen_pages("latex/float/float.pdf", 12)
    True
    >>> chosen_pages("a.pdf", 1), len(chosen_pages("a.pdf", 30)), 0 in chosen_pages("a.pdf", 3)
    ([], 2, False)
    """
    rng = random.Random(hashlib.sha256(f"{seed}:{name}".encode()).hexdigest())
    return sorted(rng.sample(range(1, n_pages), min(k, n_pages - 1))) if n_pages > 1 else []


def _page_file(folder: Path, name: str, page: int) -> Path:
    return folder / "pages" / f"{re.sub(r'[^A-Za-z0-9._-]+', '_', name.removesuffix('.pdf'))}-p{page + 1:03d}.png"


def _records_of(doc, folder: Path, seed: int) -> list[Record]:
    from arr_coc.documents.pdf import read_pdf
    from arr_coc.documents.questions import questions

    picked = chosen_pages(doc.name, doc.n_pages, seed)
    around = sorted({j for i in picked for j in (i - 1, i, i + 1) if 0 <= j < doc.n_pages})
    if not picked:
        return []
    ctx = read_pdf(doc.path, pages=around, dpi=DPI, render=False)
    records = []
    for q in questions(ctx, seed=seed):
        if q.page not in picked:
            continue
        image = _page_file(folder, doc.name, q.page)
        if not image.is_file():
            page = read_pdf(doc.path, pages=[q.page], dpi=DPI).pages[0]
            image.parent.mkdir(parents=True, exist_ok=True)
            pixels = (page.image.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
            tmp = image.with_suffix(f".{os.getpid()}.tmp.png")
            Image.fromarray(pixels).save(tmp)
            os.replace(tmp, image)
        image_id = f"{doc.name}#p{q.page + 1}"
        n = sum(r.image_id == image_id and r.record_id.split("#")[-1].startswith(q.kind) for r in records)
        records.append(Record(TEXLIVE.name, f"{image_id}#{q.kind}{n or ''}", image, image_id, q.question,
                              q.answers[0], tuple(q.boxes), answers=tuple(q.answers), metric=TEXLIVE.metric,
                              kind=q.kind, group=doc.family))
    return records


def load_texlive(root: Path | None = None, split: str | None = None, seed: int = 0) -> list[Record]:
    """Questions about single pages of the corpus's documents of ``split`` (None: all three splits).

    Args:
        root: the cache folder for rendered pages and records (default :func:`default_folder`).
        split: ``train``, ``val`` or ``test`` documents (the corpus's split by family).
        seed: which pages and quoted lines are drawn.
    """
    from arr_coc.documents.corpus import documents

    if split is not None and split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
    folder = default_folder() if root is None else Path(root)
    out: list[Record] = []
    for s in ([split] if split else list(SPLITS)):
        cached = folder / f"records-{s}-seed{seed}-v{VERSION}.json"
        if cached.is_file():
            rows = json.loads(cached.read_text())
            out += [Record(**{**r, "image": folder / r["image"], "boxes_px": tuple(map(tuple, r["boxes_px"])),
                              "answers": tuple(r["answers"]), "others_px": ()}) for r in rows]
            continue
        made = [r for doc in documents(split=s) for r in _records_of(doc, folder, seed)]
        folder.mkdir(parents=True, exist_ok=True)
        rows = [{**{k: getattr(r, k) for k in Record.__dataclass_fields__ if k != "others_px"},
                 "image": str(r.image.relative_to(folder))} for r in made]
        tmp = cached.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(rows, indent=0))
        os.replace(tmp, cached)
        out += made
    return finish(TEXLIVE.title, folder, out)


# official splits: the corpus's own, by document family (arr_coc.documents.corpus.split_of)
TEXLIVE = register(DatasetSpec("texlive", "TeX Live manuals", load_texlive, splits="official"))
