"""Counts of the hand-written question sets: ``python -m arr_coc.data.paraphrase_stats``.

Per split: questions, documents (the largest share of one) or images, and kinds, of
``texlive-paraphrase`` (:mod:`arr_coc.data.paraphrase`) and ``image-paraphrase``
(:mod:`arr_coc.data.image_paraphrase`), and where the texlive answers sit (:func:`placement`):
on the manual's first page, on which pages of their windows, in full 20-page windows. Reads the
shipped files; the count of the split's manuals of 20 pages or more is added where the corpus is
installed.
"""
from __future__ import annotations

from collections import Counter

from arr_coc.data.image_paraphrase import image_paraphrase_rows
from arr_coc.data.paraphrase import TEXLIVE_FILE, WINDOW, WindowQuestion, parse_window_question, read_jsonl


def _kinds(kinds: list[str]) -> str:
    return ", ".join(f"{k} {n}" for k, n in sorted(Counter(kinds).items()))


def placement(questions: list[WindowQuestion]) -> dict[str, int]:
    """Where the answers of ``questions`` sit: counts of answers on the manual's page 1, on window pages
    1-5 / 6-10 / 11-15 / 16-20 and 6-20, and of questions in full ``WINDOW``-page windows."""
    at = Counter(min(3, (q.answer_page - q.pages[0]) // 5) for q in questions)
    return {"questions": len(questions), "page 1": sum(q.answer_page == 1 for q in questions),
            "1-5": at[0], "6-10": at[1], "11-15": at[2], "16-20": at[3], "6-20": at[1] + at[2] + at[3],
            "full windows": sum(q.pages[1] - q.pages[0] + 1 == WINDOW for q in questions)}


def _long_manuals(split: str) -> str:
    """How many manuals of the corpus's ``split`` have ``WINDOW`` pages or more (only they give full windows)."""
    from arr_coc.documents.corpus import documents
    from arr_coc.errors import MissingDependencyError

    try:
        return str(sum(d.n_pages >= WINDOW for d in documents(split=split)))
    except MissingDependencyError:
        return "? (corpus not installed)"


def _share(n: int, of: int) -> str:
    return f"{n} ({100 * n / of:.1f} %)"


def stats() -> str:
    """One line per set and split: questions, documents or images, kinds."""
    from pathlib import Path

    texlive = [parse_window_question(obj, where, Path(".")) for where, obj in read_jsonl(TEXLIVE_FILE)]
    images = image_paraphrase_rows()
    lines = []
    for split in ("train", "val", "test"):
        qs = [q for q in texlive if q.split == split]
        docs = Counter(q.document for q in qs)
        lines.append(f"texlive-paraphrase {split}: {len(qs)} questions, {len(docs)} documents (at most "
                     f"{max(docs.values())} from one), kinds: {_kinds([q.kind for q in qs])}")
        # where the answers sit: a method that sends a window's first pages must not win by construction
        p = placement(qs)
        long_docs = len({q.document for q in qs if q.pages[1] - q.pages[0] + 1 == WINDOW})
        lines.append(f"  answer on window pages 6-20: {_share(p['6-20'], len(qs))}; on the manual's page 1: "
                     f"{_share(p['page 1'], len(qs))}; on window pages 1-5 / 6-10 / 11-15 / 16-20: "
                     f"{p['1-5']} / {p['6-10']} / {p['11-15']} / {p['16-20']}")
        lines.append(f"  in full {WINDOW}-page windows: {_share(p['full windows'], len(qs))}, over {long_docs} of the "
                     f"split's {_long_manuals(split)} manuals of >= {WINDOW} pages")
    for split in ("val", "test"):
        rows = [r for r in images if r["split"] == split]
        n_images = len({(r["source"], r["image"]) for r in rows})
        lines.append(f"image-paraphrase {split}: {len(rows)} questions, {n_images} images, "
                     f"kinds: {_kinds([r['kind'] for r in rows])}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(stats())
