"""Evaluation datasets: real images with a question, the answer text and the answer boxes.

Every loader turns a folder into a list of :class:`Record` and is registered in ``DATASETS``
(``funsd``, ``sroie``, ``coco``, ``jsonl`` here; ``docvqa``, ``infovqa``, ``textvqa``, ``chartqa`` in
:mod:`arr_coc.data.vqa`, whose records have no boxes); :func:`load_dataset` adds a reproducible subset.

Boxes are ``(y0, x0, y1, x1)`` in original image pixels (float) of the image as displayed, i.e. after its
EXIF orientation, which is how the pipeline reads it (:func:`arr_coc.imageio.image_size`). Sources that store
``[x0, y0, x1, y1]`` are converted here. Every box is clipped to its image and boxes of zero area
after clipping are dropped; a record left without boxes is dropped too (a JSONL record raises).

JSONL format (bring your own data), one JSON object per line; blank lines are ignored::

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
  default the image path) groups records of one image, which fills ``others_px``.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import random
import re
import warnings
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from rapidfuzz import fuzz

from arr_coc.imageio import image_size
from arr_coc.query import question_problem
from arr_coc.registry import Registry

Box = tuple[float, float, float, float]  # (y0, x0, y1, x1) original px

SROIE_QUESTIONS = {"company": "What is the company name?", "date": "What is the date?",
                   "address": "What is the address?", "total": "What is the total?"}
SROIE_MAX_RUN = 6  # an address or company name spans at most ~4 OCR lines; 6 leaves slack
SROIE_MIN_SIMILARITY = 0.8  # below this the best run is usually a different field; skip rather than guess
_FOLDERS = {"funsd": "funsd", "sroie": "sroie", "coco": "coco128"}
_TITLES = {"funsd": "FUNSD", "sroie": "SROIE", "coco": "COCO128", "jsonl": "JSONL"}


@dataclass(frozen=True)
class Record:
    """One evaluation question about one image, with the boxes that hold its answer."""

    dataset: str  # registry name, e.g. "funsd"
    record_id: str  # unique within the dataset, stable across runs (used to resume)
    image: Path  # image file
    image_id: str  # records of the same image share it
    question: str
    answer: str  # text to read; "" when there is nothing to read (COCO)
    boxes_px: tuple[Box, ...]  # answer boxes (y0, x0, y1, x1), original px
    others_px: tuple[Box, ...] = ()  # answer boxes of the OTHER records of the same image
    # every accepted answer (DocVQA's list, TextVQA's 10 annotators); () = just ``answer``
    answers: tuple[str, ...] = ()
    metric: str = "anls"  # how a predicted answer is scored: anls, vqa_accuracy, relaxed_accuracy

    @property
    def references(self) -> tuple[str, ...]:
        """The answers a prediction is scored against."""
        return self.answers or (self.answer,)


@dataclass
class SroieReport:
    """How the SROIE answer boxes were recovered: pass one to :func:`load_sroie` to fill it."""

    exact: int = 0  # some line contains the whole value
    fuzzy: int = 0  # best run of consecutive lines with similarity >= SROIE_MIN_SIMILARITY
    skipped: list[str] = field(default_factory=list)  # record ids with no acceptable match

    def summary(self) -> str:
        return f"SROIE boxes: {self.exact} exact, {self.fuzzy} fuzzy, {len(self.skipped)} skipped"


DATASETS: Registry[Callable[..., list[Record]]] = Registry("dataset")


def default_root(name: str) -> Path:
    """The dataset's folder in the shared data directory (``$ARR_COC_DATA`` or ``<repo>/../shared/data``)."""
    if name not in _FOLDERS:
        raise ValueError(f"dataset {name!r} has no default folder; pass its path (--data PATH)")
    env = os.environ.get("ARR_COC_DATA")
    base = Path(env) if env else Path(__file__).resolve().parents[3] / "shared" / "data"
    return base / _FOLDERS[name]


SPLITS = ("train", "val", "test")


def split_of(image_id: str, dataset: str, shares: tuple[float, float, float] = (0.6, 0.15, 0.25)) -> str:
    """Deterministic train / val / test split by image: all questions of an image go together.

    Training (``arr-coc train``) learns on ``train``, watches ``val``; reports use ``test`` only.

    >>> split_of("0000971160", "funsd") in SPLITS
    True
    """
    u = int.from_bytes(hashlib.blake2b(f"{dataset}/{image_id}".encode(), digest_size=8).digest(), "little") / 2**64
    return "train" if u < shares[0] else "val" if u < shares[0] + shares[1] else "test"


def load_dataset(
    name: str, root: Path | str | None = None, *, limit: int | None = None, seed: int = 0,
    split: str | None = None,
) -> list[Record]:
    """Load a registered dataset, optionally a reproducible subset spread over the images.

    With ``limit``, image ids are shuffled with ``seed`` and records are taken round-robin (the first
    record of every image in that order, then the second, ...), so ``limit=20`` on 149 forms gives 20
    forms, not 20 questions of one form, and a smaller limit is a prefix of a larger one.

    Args:
        name: registered dataset name (``DATASETS.names()``).
        root: the dataset folder (or JSONL file); None = :func:`default_root`.
        limit: keep at most this many records (positive); None keeps all, in loader order.
        seed: seed of the image shuffle.
        split: keep only the images of this split (:func:`split_of`), before ``limit``; benchmarks
            with official splits (DocVQA, InfoVQA, TextVQA, ChartQA) read that split's files instead.
    """
    loader = DATASETS.get(name)
    if getattr(loader, "official_splits", False):  # a benchmark's own train / val / test files
        records = loader(None if root is None else Path(root), split=split)
    else:
        records = loader(None if root is None else Path(root))
    if split is not None and not getattr(loader, "official_splits", False):
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
        records = [r for r in records if split_of(r.image_id, r.dataset) == split]
    if limit is None:
        return records
    if limit <= 0:
        raise ValueError(f"limit must be a positive number of records, got {limit}")
    by_image = _by_image(records)
    order = sorted(by_image)
    random.Random(seed).shuffle(order)
    picked: list[Record] = []
    for depth in range(max(len(v) for v in by_image.values())):
        picked += [by_image[i][depth] for i in order if depth < len(by_image[i])]
    return picked[:limit]


def clip_boxes(boxes: Iterable[Box], size: tuple[int, int]) -> tuple[Box, ...]:
    """Clip (y0, x0, y1, x1) boxes to an image of ``size=(width, height)`` and drop empty ones.

    Example:
        >>> clip_boxes([(-5, 10, 20, 900), (30, 30, 30, 40)], (640, 480))
        ((0.0, 10.0, 20.0, 640.0),)
    """
    w, h = float(size[0]), float(size[1])
    out = []
    for y0, x0, y1, x1 in boxes:
        b = (min(max(y0, 0.0), h), min(max(x0, 0.0), w), min(max(y1, 0.0), h), min(max(x1, 0.0), w))
        if b[2] > b[0] and b[3] > b[1]:
            out.append((float(b[0]), float(b[1]), float(b[2]), float(b[3])))
    return tuple(out)


def _by_image(records: list[Record]) -> dict[str, list[Record]]:
    groups: dict[str, list[Record]] = defaultdict(list)
    for r in records:
        groups[r.image_id].append(r)
    return groups


def _root(name: str, root: Path | None) -> Path:
    root = default_root(name) if root is None else Path(root)
    if not root.exists():
        raise FileNotFoundError(f"{_TITLES[name]} folder {root} not found; pass --data DIR or set ARR_COC_DATA")
    return root


def _subfolder(name: str, root: Path, sub: str) -> Path:
    path = root / sub
    if not path.is_dir():
        title = _TITLES[name]
        raise FileNotFoundError(f"{title} folder {root} has no {sub}/ subfolder; is it the {title} folder?")
    return path


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: malformed JSON ({e})") from None


def _image_size(path: Path) -> tuple[int, int]:
    """(width, height) as displayed (EXIF orientation applied, as the pipeline sees it), from the header."""
    if not path.is_file():
        raise FileNotFoundError(f"image {path} not found")
    h, w = image_size(path)
    return w, h


def _finish(name: str, root: Path, records: list[Record]) -> list[Record]:
    """Fill ``others_px`` with the answer boxes of the other records of the same image."""
    if not records:
        raise ValueError(f"no records found in {_TITLES[name]} folder {root}")
    same = _by_image(records)
    return [replace(r, others_px=tuple(b for o in same[r.image_id] if o is not r for b in o.boxes_px)) for r in records]


def _funsd_records(form: list[dict], stem: str, image: Path) -> list[Record]:
    ents = {e["id"]: e for e in form}
    # links are listed on both ends of a pair; keep each (question, answer) pair once
    pairs = {(q, a) for e in form for q, a in e.get("linking", []) if q in ents and a in ents}
    answers: dict[int, list[dict]] = defaultdict(list)
    for q, a in sorted(pairs):
        if ents[q]["label"] == "question" and ents[a]["label"] == "answer" and ents[a]["text"].strip():
            answers[q].append(ents[a])
    size = _image_size(image) if answers else (0, 0)
    records = []
    for q in sorted(answers):
        linked = sorted(answers[q], key=lambda e: (e["box"][1], e["box"][0]))  # reading order
        boxes = clip_boxes(((e["box"][1], e["box"][0], e["box"][3], e["box"][2]) for e in linked), size)
        question, answer = ents[q]["text"].strip(), " ".join(e["text"].strip() for e in linked)
        if boxes and question:
            records.append(Record("funsd", f"{stem}#{q}", image, stem, question, answer, boxes))
    return records


@DATASETS.register("funsd")
def load_funsd(root: Path | None = None) -> list[Record]:
    """FUNSD forms: each question entity linked to answers -> the answers' text and boxes.

    ``root`` is the funsd folder or its ``training_data/``. The answer is the linked answers' texts in
    reading order (top-to-bottom, left-to-right) joined by a space; empty answers are skipped.
    """
    root = _root("funsd", root)
    base = root / "training_data" if (root / "training_data").is_dir() else root
    ann_dir, img_dir = _subfolder("funsd", base, "annotations"), _subfolder("funsd", base, "images")
    records, silent = [], []
    for ann in sorted(ann_dir.glob("*.json")):
        data = _read_json(ann)
        form = data.get("form") if isinstance(data, dict) else None
        if not isinstance(form, list):
            raise ValueError(f"{ann}: expected an object with a 'form' list of entities")
        try:
            found = _funsd_records(form, ann.stem, img_dir / f"{ann.stem}.png")
        except (KeyError, TypeError, IndexError) as e:
            problem = f"{type(e).__name__}: {e}"
            raise ValueError(f"{ann}: malformed entity ({problem}); expected id, label, text, box, linking") from None
        records += found
        silent += [] if found else [ann.name]
    if silent and records:  # no records at all is an error of its own (below)
        shown = ", ".join(silent[:5]) + (f" and {len(silent) - 5} more" if len(silent) > 5 else "")
        warnings.warn(f"FUNSD: {len(silent)} form(s) give no records (no question linked to a non-empty "
                      f"answer in their 'linking' lists): {shown}", stacklevel=2)
    return _finish("funsd", root, records)


def normalise(text: str) -> str:
    """Upper-case alphanumerics only: how SROIE keys are compared with OCR transcripts.

    Example:
        >>> normalise("No.53, Jalan Sagu 18 ")
        'NO53JALANSAGU18'
    """
    return re.sub(r"[^0-9A-Z]", "", text.upper())


def read_sroie_lines(path: Path) -> list[tuple[Box, str]]:
    """Lines of a SROIE ``box/NNN.csv`` (``x1,y1,...,x4,y4,transcript``) as (bounding box, transcript).

    Example:
        >>> import tempfile; p = Path(tempfile.mkdtemp()) / "0.csv"
        >>> _ = p.write_text("10,5,90,5,90,25,10,25,TOTAL, RM 9.00\\n")
        >>> read_sroie_lines(p)
        [((5.0, 10.0, 25.0, 90.0), 'TOTAL, RM 9.00')]
    """
    lines = []
    for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        m = re.fullmatch(r"((?:\s*-?[\d.]+\s*,){8})(.*)", line)
        if not m:
            raise ValueError(f"{path}:{n}: expected x1,y1,x2,y2,x3,y3,x4,y4,transcript, got {line[:60]!r}")
        xy = [float(v) for v in m[1].split(",")[:8]]
        lines.append(((min(xy[1::2]), min(xy[0::2]), max(xy[1::2]), max(xy[0::2])), m[2].strip()))
    return lines


def _contains(line: str, value: str) -> bool:
    """Normalised ``value`` in raw ``line`` without eating into a longer number: 9.00 is not in 19.00.

    The digit boundary is checked on the raw text, so "25/12/2018 8:13" still holds the date 25/12/2018.
    """
    norm, where = "", []  # where[i]: index in ``line`` of the i-th normalised character
    for i, ch in enumerate(line):
        kept = normalise(ch)
        norm += kept
        where += [i] * len(kept)
    for m in re.finditer(re.escape(value), norm):
        start, end = where[m.start()], where[m.end() - 1]
        before, after = line[start - 1 : start] if start else "", line[end + 1 : end + 2]
        if not (value[0].isdigit() and before.isdigit()) and not (value[-1].isdigit() and after.isdigit()):
            return True
    return False


def match_sroie_value(value: str, lines: Sequence[tuple[Box, str]]) -> tuple[str, tuple[Box, ...]]:
    """Recover the boxes of a key value from the OCR lines: ``("exact" | "fuzzy" | "none", boxes)``.

    Every line whose normalised transcript contains the whole normalised value; else the run of up to
    ``SROIE_MAX_RUN`` consecutive lines most similar to the value (rapidfuzz ratio >= 0.8).

    Example:
        >>> lines = [((0, 0, 10, 50), "NO.53, JALAN SAGU 18,"), ((10, 0, 20, 50), "TAMAN DAYA,"),
        ...          ((20, 0, 30, 50), "TOTAL 9.00"), ((30, 0, 40, 50), "SUBTOTAL 19.00")]
        >>> match_sroie_value("9.00", lines)  # not in 19.00
        ('exact', ((20, 0, 30, 50),))
        >>> match_sroie_value("NO.53 JALAN SAGU 18 TAMAN DAYA", lines)[0]
        'fuzzy'
    """
    target = normalise(value)
    if not target:
        return "none", ()
    norm = [normalise(t) for _, t in lines]
    exact = tuple(b for b, t in lines if _contains(t, target))
    if exact:
        return "exact", exact
    best, span = 0.0, (0, 0)
    for i in range(len(lines)):
        for j in range(i + 1, min(i + SROIE_MAX_RUN, len(lines)) + 1):
            score = fuzz.ratio("".join(norm[i:j]), target) / 100
            if score > best:
                best, span = score, (i, j)
    if best >= SROIE_MIN_SIMILARITY:
        return "fuzzy", tuple(b for b, _ in lines[span[0] : span[1]])
    return "none", ()


@DATASETS.register("sroie")
def load_sroie(root: Path | None = None, *, report: SroieReport | None = None) -> list[Record]:
    """SROIE receipts: company, date, address and total, with boxes recovered from the OCR lines.

    ``root`` holds ``img/``, ``box/`` and ``key/``. Records whose value matches no line well enough
    are skipped; pass a :class:`SroieReport` to learn how many matched exactly, fuzzily or not at all.
    """
    root = _root("sroie", root)
    img_dir, box_dir, key_dir = (_subfolder("sroie", root, s) for s in ("img", "box", "key"))
    report = SroieReport() if report is None else report
    records = []
    for key in sorted(key_dir.glob("*.json")):
        values = _read_json(key)
        if not isinstance(values, dict):
            raise ValueError(f"{key}: expected an object with company, date, address and total")
        csv, image = box_dir / f"{key.stem}.csv", img_dir / f"{key.stem}.jpg"
        if not csv.is_file():
            raise FileNotFoundError(f"{csv} not found (the OCR lines of {key.name})")
        size, lines = _image_size(image), read_sroie_lines(csv)
        for name, question in SROIE_QUESTIONS.items():
            value = str(values.get(name) or "").strip()
            if not normalise(value):
                continue
            rid = f"{key.stem}#{name}"
            how, boxes = match_sroie_value(value, lines)
            boxes = clip_boxes(boxes, size)
            if not boxes:
                report.skipped.append(rid)
                continue
            setattr(report, how, getattr(report, how) + 1)
            records.append(Record("sroie", rid, image, key.stem, question, value, boxes))
    return _finish("sroie", root, records)


def read_class_names(path: Path) -> dict[int, str]:
    """Class names of a YOLO ``classes.yaml`` (``names:`` then ``id: name`` or ``- name`` lines), without PyYAML.

    Example:
        >>> import tempfile; p = Path(tempfile.mkdtemp()) / "c.yaml"
        >>> _ = p.write_text("path: .\\nnames:\\n  0: person\\n  9: traffic light\\n")
        >>> read_class_names(p)
        {0: 'person', 9: 'traffic light'}
    """
    names: dict[int, str] = {}
    inside = False
    for line in path.read_text(encoding="utf-8").splitlines():
        text = line.split("#", 1)[0].rstrip()
        if not text.strip():
            continue
        if not line[0].isspace():
            inside = text.strip() == "names:"
            continue
        item = re.fullmatch(r"\s*(?:(\d+)\s*:|-)\s*(.+)", text)
        if inside and item:
            names[int(item[1]) if item[1] else len(names)] = item[2].strip().strip("'\"")
    if not names:
        raise ValueError(f"{path}: no class names found (expected 'names:' followed by '  0: person' lines)")
    return names


@DATASETS.register("coco")
def load_coco(root: Path | None = None) -> list[Record]:
    """COCO in YOLO format: one record per (image, category present): "Where is the <category>?" -> boxes.

    ``root`` holds ``images/train2017``, ``labels/train2017`` and ``classes.yaml``. Label files
    without an image are skipped; images without a label file have no objects, hence no records.
    """
    root = _root("coco", root)
    img_dir, lbl_dir = (_subfolder("coco", root, f"{d}/train2017") for d in ("images", "labels"))
    if not (root / "classes.yaml").is_file():
        raise FileNotFoundError(f"COCO128 folder {root} has no classes.yaml (the class id -> name map)")
    names = read_class_names(root / "classes.yaml")
    records = []
    for lbl in sorted(lbl_dir.glob("*.txt")):
        image = next((p for e in (".jpg", ".png", ".jpeg") if (p := img_dir / f"{lbl.stem}{e}").is_file()), None)
        if image is None:
            continue
        w, h = _image_size(image)
        boxes: dict[int, list[Box]] = defaultdict(list)
        for n, line in enumerate(lbl.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                cls, cx, cy, bw, bh = int(line.split()[0]), *(float(v) for v in line.split()[1:])
            except ValueError:
                raise ValueError(f"{lbl}:{n}: expected 'class cx cy w h' (normalised), got {line[:60]!r}") from None
            if cls not in names:
                raise ValueError(f"{lbl}:{n}: class {cls} is not in classes.yaml ({len(names)} names)")
            # rounded to 1/100 px: sub-pixel noise of the normalised format, not information
            box = ((cy - bh / 2) * h, (cx - bw / 2) * w, (cy + bh / 2) * h, (cx + bw / 2) * w)
            boxes[cls].append(tuple(round(v, 2) for v in box))  # type: ignore[arg-type]
        for cls in sorted(boxes):
            kept = clip_boxes(boxes[cls], (w, h))
            if kept:
                question = f"Where is the {names[cls]}?"
                records.append(Record("coco", f"{lbl.stem}#{names[cls]}", image, lbl.stem, question, "", kept))
    return _finish("coco", root, records)


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
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: malformed JSON ({e})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(obj).__name__}")
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


@DATASETS.register("jsonl")
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
            size = _image_size(obj["image"])
            boxes = clip_boxes(obj["boxes"], size)
            if not boxes:
                raise ValueError(f"{where}: every box lies outside the {size[0]}x{size[1]} image {obj['image']}")
        image_id = str(obj.get("image_id", obj["image"]))
        answers = obj.get("answers", ())
        records.append(Record("jsonl", rid, obj["image"], image_id, obj["question"], obj["answer"], boxes,
                              answers=answers, metric="vqa_accuracy" if answers else "anls"))
    return _finish("jsonl", path, records)
