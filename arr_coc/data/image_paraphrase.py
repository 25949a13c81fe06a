"""Questions in a user's own words over single receipts (SROIE) and forms (FUNSD): ``image-paraphrase``.

Each record is one of the dataset's own annotated answers (SROIE's company, date, address and
total; a FUNSD question entity's linked answers) with its boxes, asked the way a user would ask
("How much was paid in the end?", "Who sold this?", "When was this fax sent?") instead of by the
field's label. The answers and boxes are the annotation's, copied as they are; only the question
is new, written by hand, and shares no content word with its answers
(:mod:`arr_coc.data.paraphrase_rules`). The images are those of the validation and test splits of
the project's group split (:func:`arr_coc.data.datasets.split_of` of the receipt's company or the
form's template group), which the file records per line.

``arr_coc/data/questions/image-paraphrase.jsonl``, one object a line::

    {"id": "val-001", "split": "val", "source": "sroie", "image": "003", "source_id": "003#total",
     "question": "How much was paid in the end?", "answers": ["9.00"], "boxes": [[y0, x0, y1, x1]],
     "kind": "receipt total", "group": "company:003"}

``image`` is the file's stem in the dataset (``sroie/img/STEM.jpg``, ``funsd/.../images/STEM.png``),
``source_id`` the dataset's own record id, ``boxes`` the answer's boxes in image pixels
(y0, x0, y1, x1), ``group`` the split group. Kinds: ``receipt`` + the SROIE key, ``form`` + FUNSD's
answer shape (:func:`arr_coc.data.funsd.answer_kind`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from arr_coc.data.datasets import SPLITS, DatasetSpec, Record, default_root, register
from arr_coc.data.loading import finish
from arr_coc.data.paraphrase import QUESTIONS, read_jsonl

IMAGE_FILE = QUESTIONS / "image-paraphrase.jsonl"
SOURCES = ("sroie", "funsd")
FIELDS = ("id", "split", "source", "image", "source_id", "question", "kind", "group")


def image_paraphrase_rows(path: Path | None = None) -> list[dict[str, Any]]:
    """The checked lines of the JSONL file (default: the shipped ``IMAGE_FILE``), as objects, in file order.

    Raises:
        ValueError: one line naming the file and line: a missing or empty field, an unknown split or
            source, answers not a non-empty list of strings, a box not four numbers, a repeated id.
    """
    rows, seen = [], set()
    for where, obj in read_jsonl(Path(path) if path is not None else IMAGE_FILE):
        if not isinstance(obj, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(obj).__name__}")
        for key in FIELDS:
            if not isinstance(obj.get(key), str) or not obj[key].strip():
                raise ValueError(f"{where}: {key!r} must be a non-empty string, got {obj.get(key)!r}")
        if obj["split"] not in SPLITS:
            raise ValueError(f"{where}: 'split' must be one of {', '.join(SPLITS)}, got {obj['split']!r}")
        if obj["source"] not in SOURCES:
            raise ValueError(f"{where}: 'source' must be one of {', '.join(SOURCES)}, got {obj['source']!r}")
        answers, boxes = obj.get("answers"), obj.get("boxes")
        if not isinstance(answers, list) or not answers or not all(isinstance(a, str) and a.strip() for a in answers):
            raise ValueError(f"{where}: 'answers' must be a non-empty list of non-empty strings, got {answers!r}")
        if not isinstance(boxes, list) or not boxes or not all(
                isinstance(b, list) and len(b) == 4 and all(isinstance(v, (int, float)) for v in b) for b in boxes):
            raise ValueError(f"{where}: 'boxes' must be a non-empty list of [y0, x0, y1, x1], got {boxes!r}")
        if obj["id"] in seen:
            raise ValueError(f"{where}: id {obj['id']!r} is used twice")
        seen.add(obj["id"])
        rows.append(obj)
    return rows


def image_file(data: Path, source: str, stem: str) -> Path:
    """Where a dataset keeps an image: ``sroie/img/STEM.jpg``, ``funsd/[training_data/]images/STEM.png``."""
    if source == "sroie":
        return data / "sroie" / "img" / f"{stem}.jpg"
    funsd = data / "funsd"
    base = funsd / "training_data" if (funsd / "training_data").is_dir() else funsd
    return base / "images" / f"{stem}.png"


def load_image_paraphrase(root: Path | None = None, *, split: str | None = None) -> list[Record]:
    """The questions as records over the images of ``root`` (the folder holding ``sroie/`` and ``funsd/``).

    ``root`` None is the evaluation data folder (``$ARR_COC_DATA`` or ``../shared/data``).
    """
    if split is not None and split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
    data = default_root(IMAGE_PARAPHRASE.name) if root is None else Path(root)
    records = []
    for r in image_paraphrase_rows():
        if split is not None and r["split"] != split:
            continue
        image = image_file(data, r["source"], r["image"])
        if not image.is_file():
            raise FileNotFoundError(f"image {image} not found; pass the folder holding sroie/ and funsd/ "
                                    f"(--data DIR or ARR_COC_DATA)")
        records.append(Record(IMAGE_PARAPHRASE.name, r["id"], image, f"{r['source']}:{r['image']}", r["question"],
                              r["answers"][0], tuple(tuple(float(v) for v in b) for b in r["boxes"]),
                              answers=tuple(r["answers"]), metric=IMAGE_PARAPHRASE.metric, kind=r["kind"],
                              group=f"{r['source']}:{r['group']}"))
    return finish(IMAGE_PARAPHRASE.title, data, records)


# folder "": the evaluation data folder itself, which holds both datasets' folders
IMAGE_PARAPHRASE = register(DatasetSpec("image-paraphrase", "Paraphrased receipts and forms", load_image_paraphrase,
                                        splits="official", folder=""))
