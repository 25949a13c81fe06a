"""FUNSD, scanned forms: each question entity linked to answer entities -> the answers' text and boxes."""
from __future__ import annotations

import re
import warnings
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

from arr_coc.data.boxes import clip_boxes
from arr_coc.data.datasets import DatasetSpec, Record, register
from arr_coc.data.groups import form_labels, template_groups
from arr_coc.data.loading import dataset_root, finish, image_wh, read_json, subfolder

FUNSD_KINDS = ("date", "number", "short text", "long text")
_MONTH = r"(?:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]*\.?"
_DATE = re.compile(rf"\b\d{{1,4}}[/.-]\d{{1,2}}[/.-]\d{{2,4}}\b|{_MONTH}\s*\d|\d\s*{_MONTH}")


def answer_kind(answer: str) -> str:
    """A FUNSD question's kind, from the shape of its answer (FUNSD labels every key just "question").

    ``date`` (a numeric date or a month name next to a number), ``number`` (digits, no more letters
    than digits: amounts, codes, phone numbers), else ``short text`` (one or two words) or ``long text``.
    The shape is what changes how hard an answer is to read at few tokens: short, dense or long.

    Example:
        >>> [answer_kind(a) for a in ("4/19/74", "March 18, 1968", "(167) (83)", "N/A", "FULL PAGE", "Ad for Salem")]
        ['date', 'date', 'number', 'short text', 'short text', 'long text']
    """
    text = answer.strip().lower()
    if _DATE.search(text):
        return "date"
    digits, letters = sum(c.isdigit() for c in text), sum(c.isalpha() for c in text)
    if digits and letters <= digits:
        return "number"
    return "short text" if len(text.split()) <= 2 else "long text"


def _form_records(form: list[dict], stem: str, image: Path) -> list[Record]:
    ents = {e["id"]: e for e in form}
    # links are listed on both ends of a pair; keep each (question, answer) pair once
    pairs = {(q, a) for e in form for q, a in e.get("linking", []) if q in ents and a in ents}
    answers: dict[int, list[dict]] = defaultdict(list)
    for q, a in sorted(pairs):
        if ents[q]["label"] == "question" and ents[a]["label"] == "answer" and ents[a]["text"].strip():
            answers[q].append(ents[a])
    size = image_wh(image) if answers else (0, 0)
    records = []
    for q in sorted(answers):
        linked = sorted(answers[q], key=lambda e: (e["box"][1], e["box"][0]))  # reading order
        boxes = clip_boxes(((e["box"][1], e["box"][0], e["box"][3], e["box"][2]) for e in linked), size)
        question, answer = ents[q]["text"].strip(), " ".join(e["text"].strip() for e in linked)
        if boxes and question:
            records.append(Record(FUNSD.name, f"{stem}#{q}", image, stem, question, answer, boxes,
                                  metric=FUNSD.metric, kind=answer_kind(answer)))
    return records


def load_funsd(root: Path | None = None) -> list[Record]:
    """FUNSD forms: each question entity linked to answers -> the answers' text and boxes.

    ``root`` is the funsd folder or its ``training_data/``. The answer is the linked answers' texts in
    reading order (top-to-bottom, left-to-right) joined by a space; empty answers are skipped. A form's
    split group is its template: forms whose printed labels (question and header entities) mostly
    agree are one template (:func:`arr_coc.data.groups.template_groups`), whatever was filled in.
    """
    root = dataset_root(FUNSD, root)
    base = root / "training_data" if (root / "training_data").is_dir() else root
    ann_dir, img_dir = subfolder(FUNSD.title, base, "annotations"), subfolder(FUNSD.title, base, "images")
    records, silent, labels = [], [], {}
    for ann in sorted(ann_dir.glob("*.json")):
        data = read_json(ann)
        form = data.get("form") if isinstance(data, dict) else None
        if not isinstance(form, list):
            raise ValueError(f"{ann}: expected an object with a 'form' list of entities")
        try:
            found = _form_records(form, ann.stem, img_dir / f"{ann.stem}.png")
            labels[ann.stem] = form_labels([e["text"] for e in form if e["label"] in ("question", "header")])
        except (KeyError, TypeError, IndexError) as e:
            problem = f"{type(e).__name__}: {e}"
            raise ValueError(f"{ann}: malformed entity ({problem}); expected id, label, text, box, linking") from None
        records += found
        silent += [] if found else [ann.name]
    if silent and records:  # no records at all is an error of its own (in finish)
        shown = ", ".join(silent[:5]) + (f" and {len(silent) - 5} more" if len(silent) > 5 else "")
        warnings.warn(f"FUNSD: {len(silent)} form(s) give no records (no question linked to a non-empty "
                      f"answer in their 'linking' lists): {shown}", stacklevel=2)
    groups = template_groups(labels)
    return finish(FUNSD.title, root, [replace(r, group=groups[r.image_id]) for r in records])


FUNSD = register(DatasetSpec("funsd", "FUNSD", load_funsd, folder="funsd"))
