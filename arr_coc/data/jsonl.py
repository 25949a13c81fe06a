"""JSONL records, bring your own data: one JSON object per line with the image, question, answer and boxes.

JSONL format, one JSON object per line; blank lines are ignored::

    {"image": "scans/a.png", "question": "What is the total?", "answer": "9.00",
     "boxes": [[120, 840, 260, 872]], "id": "a-total", "image_id": "a"}

- ``image``: path, absolute or relative to the JSONL file's folder.
- ``question``: non-empty string. ``answer``: string, ``""`` when there is nothing to read.
- ``boxes``: non-empty list of ``[x0, y0, x1, y1]`` in image pixels as displayed (EXIF orientation
  applied; the common convention; the loader converts to ``(y0, x0, y1, x1)``), finite, with ``x1 > x0``
  and ``y1 > y0``. Optional: records without boxes serve the answer objective (``arr-coc train
  --objective vlm``) and the VLM reader, not the box metrics.
- VQAv2 style: ``"answers"`` instead of (or beside) ``"answer"``, a list of strings or of
  ``{"answer": ...}`` objects; every one is a reference (scored by VQA accuracy), the most frequent
  is the answer trained on::

    {"image": "COCO_val2014_000000000042.jpg", "question": "How many dogs?",
     "answers": [{"answer": "2"}, {"answer": "2"}, {"answer": "two"}]}
- ``id`` (optional, default ``"<file stem>:<line>"``) must be unique; ``image_id`` (optional,
  default the image path) groups records of one image, which fills ``others_px``. ``kind`` (optional
  string) is the question's kind: ``--limit`` balances over kinds and reports add a row per kind.

Every box is clipped to its image and boxes of zero area after clipping are dropped; a record whose
boxes all lie outside its image raises.
"""
from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

from arr_coc.data.boxes import Box, clip_boxes
from arr_coc.data.datasets import DatasetSpec, Record, register
from arr_coc.data.loading import finish, image_wh, json_object
from arr_coc.engine.query import question_problem


def jsonl_format_help() -> str:
    """The JSONL format for bringing your own data (the module docstring's description)."""
    return __doc__[__doc__.index("JSONL format") :].strip() if __doc__ else ""


def parse_jsonl_line(line: str, where: str, folder: Path) -> dict[str, Any]:
    """Check one JSONL line and return its fields, boxes as (y0, x0, y1, x1); errors start with ``where``.

    Example:
        >>> line = '{"image": "a.png", "question": "Total?", "answer": "9", "boxes": [[1, 2, 30, 40]]}'
        >>> parse_jsonl_line(line, "d.jsonl:1", Path("/data"))["boxes"]
        [(2.0, 1.0, 40.0, 30.0)]
        >>> parse_jsonl_line(line.replace("[1, 2, 30, 40]", "[30, 2, 1, 40]"), "d.jsonl:1", Path("/data"))
        Traceback (most recent call last):
        ...
        ValueError: d.jsonl:1: box 0 [30, 2, 1, 40] needs x1 > x0 and y1 > y0 ([x0, y0, x1, y1], px)
    """
    obj = json_object(line, where)
    missing = [k for k in ("image", "question") if k not in obj] + (["answer"] if not {"answer", "answers"} & set(obj) else [])
    if missing:
        raise ValueError(f"{where}: missing key(s) {', '.join(missing)}; see jsonl_format_help()")
    if "answers" in obj:
        answers = obj["answers"]
        texts = [a.get("answer") if isinstance(a, dict) else a for a in answers] if isinstance(answers, list) else None
        if not texts or not all(isinstance(t, str) for t in texts):
            raise ValueError(f"{where}: 'answers' must be a non-empty list of strings or of {{\"answer\": string}}")
        obj = {**obj, "answers": tuple(texts), "answer": obj.get("answer", Counter(texts).most_common(1)[0][0])}
    if not isinstance(obj["question"], str) or question_problem(obj["question"]):
        problem = question_problem(obj["question"]) if isinstance(obj["question"], str) else "is not a string"
        raise ValueError(f"{where}: 'question' {problem}")
    if not isinstance(obj["answer"], str):
        raise ValueError(f"{where}: 'answer' must be a string (\"\" when there is nothing to read)")
    if "boxes" in obj and (not isinstance(obj["boxes"], list) or not obj["boxes"]):
        raise ValueError(f"{where}: 'boxes' must be a non-empty list of [x0, y0, x1, y1] (or left out)")
    boxes = []
    for i, b in enumerate(obj.get("boxes", [])):
        numbers = isinstance(b, list) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in b)
        if not numbers or len(b) != 4:
            raise ValueError(f"{where}: box {i} {json.dumps(b)} is not 4 numbers [x0, y0, x1, y1]")
        if not all(math.isfinite(v) for v in b):
            raise ValueError(f"{where}: box {i} {json.dumps(b)} holds NaN or Infinity; boxes are finite pixels")
        x0, y0, x1, y1 = (float(v) for v in b)
        if x1 <= x0 or y1 <= y0:
            raise ValueError(f"{where}: box {i} {json.dumps(b)} needs x1 > x0 and y1 > y0 ([x0, y0, x1, y1], px)")
        boxes.append((y0, x0, y1, x1))
    image = Path(obj["image"])
    image = image if image.is_absolute() else folder / image
    return {**obj, "image": image, "question": obj["question"].strip(), "boxes": boxes}


def load_jsonl(root: Path | None = None) -> list[Record]:
    """Records from a JSONL file (or a folder holding exactly one); format: :func:`jsonl_format_help`."""
    if root is None:
        raise ValueError("the jsonl dataset needs a file: pass --data FILE.jsonl (format: jsonl_format_help())")
    path = Path(root)
    if not path.exists():
        raise FileNotFoundError(f"JSONL file {path} not found; pass --data FILE.jsonl")
    if path.is_dir():
        found = sorted(path.glob("*.jsonl"))
        if len(found) != 1:
            raise ValueError(f"JSONL folder {path} holds {len(found)} .jsonl files; expected exactly one: pass the file")
        path = found[0]
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        line = path.read_bytes()[: e.start].count(b"\n") + 1
        raise ValueError(f"{path}:{line}: not UTF-8 text ({e.reason}); save the file as UTF-8") from None
    records, ids = [], set()
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        obj = parse_jsonl_line(line, where, path.parent)
        if not obj["image"].is_file():
            raise FileNotFoundError(f"{where}: image {obj['image']} not found")
        rid = str(obj.get("id", f"{path.stem}:{n}"))
        if rid in ids:
            raise ValueError(f"{where}: duplicate id {rid!r}")
        ids.add(rid)
        boxes: tuple[Box, ...] = ()
        if obj["boxes"]:
            size = image_wh(obj["image"])
            boxes = clip_boxes(obj["boxes"], size)
            if not boxes:
                raise ValueError(f"{where}: every box lies outside the {size[0]}x{size[1]} image {obj['image']}")
        image_id = str(obj.get("image_id", obj["image"]))
        answers = obj.get("answers", ())
        records.append(Record(JSONL.name, rid, obj["image"], image_id, obj["question"], obj["answer"], boxes,
                              answers=answers, metric="vqa_accuracy" if answers else JSONL.metric,
                              kind=str(obj.get("kind", ""))))
    return finish(JSONL.title, path, records)


JSONL = register(DatasetSpec("jsonl", "JSONL", load_jsonl))
