"""Counts of the hand-written question sets: ``python -m arr_coc.data.paraphrase_stats``.

Per split: questions, documents (the largest share of one) or images, and kinds, of
``texlive-paraphrase`` (:mod:`arr_coc.data.paraphrase`) and ``image-paraphrase``
(:mod:`arr_coc.data.image_paraphrase`). Reads the shipped files only: neither the manuals nor the
images are needed.
"""
from __future__ import annotations

from collections import Counter

from arr_coc.data.image_paraphrase import image_paraphrase_rows
from arr_coc.data.paraphrase import TEXLIVE_FILE, parse_window_question, read_jsonl


def _kinds(kinds: list[str]) -> str:
    return ", ".join(f"{k} {n}" for k, n in sorted(Counter(kinds).items()))


def stats() -> str:
    """One line per set and split: questions, documents or images, kinds."""
    from pathlib import Path

    texlive = [parse_window_question(obj, where, Path(".")) for where, obj in read_jsonl(TEXLIVE_FILE)]
    images = image_paraphrase_rows()
    lines = []
    for split in ("val", "test"):
        qs = [q for q in texlive if q.split == split]
        docs = Counter(q.document for q in qs)
        lines.append(f"texlive-paraphrase {split}: {len(qs)} questions, {len(docs)} documents (at most "
                     f"{max(docs.values())} from one), kinds: {_kinds([q.kind for q in qs])}")
        # where the answers sit: front matter is page 1, and a short manual is a short window
        at = Counter(min(3, (q.answer_page - q.pages[0]) // 5) for q in qs)
        lines.append(f"  answer on the document's page 1: {sum(q.answer_page == 1 for q in qs)}; windows of 20 pages: "
                     f"{sum(q.pages[1] - q.pages[0] + 1 == 20 for q in qs)}; answer on window pages 1-5 / 6-10 / 11-15 / "
                     f"16-20: {' / '.join(str(at[i]) for i in range(4))}")
    for split in ("val", "test"):
        rows = [r for r in images if r["split"] == split]
        n_images = len({(r["source"], r["image"]) for r in rows})
        lines.append(f"image-paraphrase {split}: {len(rows)} questions, {n_images} images, "
                     f"kinds: {_kinds([r['kind'] for r in rows])}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(stats())
