"""MP-DocVQA (multi-page DocVQA): the official question JSON + page images, read over every page; metric ANLS.

The layout its authors distribute (Tito, Karatzas, Valveny 2023): ``qas/train.json``, ``qas/val.json``,
``qas/test.json``, each ``{"data": [{"questionId", "question", "doc_id", "page_ids": ["<doc>_p0", ...],
"answers": [...], "answer_page_idx": i}]}``, and the page images ``images/<page_id>.jpg``. ``root``
is one question file or a folder searched for the split's file (as :mod:`arr_coc.data.vqa` does);
a page image is looked up beside the file, in ``images/`` next to it or above it, then by file name
under the folder.

A record's ``pages`` are the page images in ``page_ids`` order, ``answer_pages`` the answer page
(``answer_page_idx``; absent on the hidden test split), ``image`` that page. Strict: ``page_ids`` is
a non-empty list of distinct names, ``answer_page_idx`` an integer page of the record; every page
image must exist; the answers, ids and unanswered questions follow :mod:`arr_coc.data.vqa`'s rules.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from arr_coc.data.datasets import DatasetSpec, Record, register
from arr_coc.data.vqa import ImageFinder, Located, as_answers, benchmark_record, json_items, question_id, read_benchmark


def page_list(value: object, where: str, field: str) -> list[str]:
    """A non-empty list of distinct non-empty strings, or a one-line error naming the item and field."""
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise ValueError(f"{where}: {field!r} must be a non-empty list of page names")
    if len(set(value)) != len(value):
        raise ValueError(f"{where}: {field!r} names a page twice")
    return value


def _mp_json(path: Path, finder: ImageFinder) -> list[Located]:
    records = []
    bases = (path.parent, path.parent / "images", path.parent.parent / "images", path.parent.parent)
    for n, d in enumerate(json_items(path)):
        where = f"{path}: item {n}"
        names = page_list(d.get("page_ids"), where, "page_ids")
        at = d.get("answer_page_idx")
        if at is not None and (isinstance(at, bool) or not isinstance(at, int) or not 0 <= at < len(names)):
            raise ValueError(f"{where}: 'answer_page_idx' must be a page index 0..{len(names) - 1}, got {at!r}")
        rid = question_id(d.get("questionId"), str(n), where)
        pages = tuple(finder.find(f"{name}.jpg" if not Path(name).suffix else name, bases, where) for name in names)
        doc = d.get("doc_id") if isinstance(d.get("doc_id"), str) else names[0]
        r = benchmark_record(MPDOCVQA, rid, pages[at or 0], doc, d.get("question"), as_answers(d.get("answers"), where),
                             where)
        records.append((where, replace(r, pages=pages, answer_pages=() if at is None else (at,))))
    return records


def load_mpdocvqa(root: Path | None = None, *, split: str | None = None) -> list[Record]:
    """MP-DocVQA: the official ``qas/<split>.json`` + page images; one record per question over all its pages."""
    return read_benchmark(MPDOCVQA, root, split, r"(train|val|test)\.json", _mp_json)


# multi-page documents without answer boxes: the VLM reads every page in one prompt
MPDOCVQA = register(DatasetSpec("mpdocvqa", "MP-DocVQA", load_mpdocvqa, splits="official", metric="anls",
                                reader="vlm"))
