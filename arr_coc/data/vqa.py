"""Reading the official VQA benchmarks' files: annotation JSON or parquet exports, split choice, image lookup.

The loaders of DocVQA, InfoVQA (:mod:`arr_coc.data.docvqa`), TextVQA (:mod:`arr_coc.data.textvqa`)
and ChartQA (:mod:`arr_coc.data.chartqa`) read the benchmark as its authors distribute it, or the
Hugging Face ``datasets`` parquet export of it, from a local path (nothing is downloaded), through
:func:`read_benchmark`; each module holds only its JSON layout. Records carry every reference
answer (``Record.answers``) and the benchmark's metric (``Record.metric``, from its spec: ``anls``,
``vqa_accuracy``, ``relaxed_accuracy``); they have no answer boxes (the VLM reader needs none).

``root`` is one annotation file, or a folder searched for the file of the requested official
``split`` (``train``, ``val``, ``test``; a folder holding one split needs none):

- DocVQA: ``{"data": [{"questionId", "question", "image": "documents/x.png", "answers": [...]}]}``
  (``val_v1.0.json``, ``val_v1.0_withQT.json``); images resolved against the JSON's folder, its
  parent, or by file name under the searched folder (``spdocvqa_images/``).
- InfoVQA: the same, with ``"image_local_name": "x.jpeg"`` (``infographicsVQA_val_v1.0_withQT.json``).
- TextVQA: ``{"data": [{"question_id", "question", "image_id", "answers": [10 strings]}]}``
  (``TextVQA_0.5.1_val.json``), images ``<image_id>.jpg`` in ``train_images/`` (train and val)
  or ``test_images/``. OCR tokens in the file are not used: the model reads the image.
- ChartQA: ``[{"imgname", "query", "label"}]`` (``test/test_human.json``,
  ``test/test_augmented.json``; a split folder holds both), images in ``png/`` beside the JSON.
- Parquet (``*.parquet``, e.g. ``validation-00000-of-00006.parquet``; the split is the file name's
  prefix, ``validation`` = ``val``): columns ``question`` or ``query``; ``answers``, ``label`` or
  ``answer`` (a string or a list); ``image`` as ``{"bytes", "path"}``; ``questionId`` or
  ``question_id`` when present. Images are written once, named by content, to
  ``$ARR_COC_CACHE/images`` (default ``~/.cache/arr-coc/images``). Needs ``pyarrow``.

Official test splits of DocVQA, InfoVQA and TextVQA hide their answers (they are scored by the
benchmarks' servers); loading one raises and says so.

Loading is strict and loud; every error names the row (``<file>: item N`` or ``<file>: row N``):

- An answer (or label) is text; a JSON number or boolean becomes the text it is written as
  (``3`` -> ``"3"``, ``2.5`` -> ``"2.5"``, ``true`` -> ``"true"``), which is what the official
  scorers compare; an object, a list inside the list, NaN or Infinity raises (by type, never repr).
- A question id is text or an integer; an id repeated across the files read raises naming both rows.
- Questions without an answer are left out and named in one warning.
- A parquet image is decoded once, before it is cached: a bad one raises naming its row.
"""
from __future__ import annotations

import hashlib
import io
import json
import math
import os
import re
import warnings
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from PIL import Image, UnidentifiedImageError

from arr_coc.data.datasets import SPLITS, DatasetSpec, Record
from arr_coc.data.loading import finish, read_json
from arr_coc.engine.imageio import DECODE_ERRORS, MAX_IMAGE_PIXELS

# a located record: (where it was read, e.g. "val.json: item 3", the record)
Located = tuple[str, Record]
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp", ".gif", ".webp")


def image_cache_dir() -> Path:
    """Where images decoded from parquet files go: ``$ARR_COC_CACHE/images`` or ``~/.cache/arr-coc/images``."""
    base = os.environ.get("ARR_COC_CACHE")
    return (Path(base) if base else Path.home() / ".cache" / "arr-coc") / "images"


def _split_token(name: str, split: str) -> bool:
    """Whether a file name names the split as a word: ``val_v1.0.json`` is val, ``evaluation.json`` is not.

    >>> _split_token("TextVQA_0.5.1_val.json", "val"), _split_token("train_v1.0.json", "val")
    (True, False)
    """
    words = set(re.split(r"[^a-z]+", name.lower()))
    return split in words or (split == "val" and "validation" in words)


def _files(title: str, annotation: str, root: Path, split: str | None, suffix: str) -> list[Path]:
    """The annotation files (``.json``, names matching ``annotation``) or parquet shards of ``split`` under ``root``."""
    if not root.exists():
        raise FileNotFoundError(f"{title} path {root} not found; pass --data FILE_OR_DIR")
    if split is not None and split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
    if root.is_file():
        if split is not None and not _split_token(root.name, split) and not _split_token(root.parent.name, split):
            raise ValueError(f"{root.name} is not the {split} split of {title}; pass that split's file, "
                             f"or its folder with --split {split}")
        return [root]
    pattern = re.compile(annotation, re.I) if suffix == ".json" else re.compile(r".*\.parquet", re.I)
    found = sorted(p for p in root.rglob(f"*{suffix}") if pattern.fullmatch(p.name))
    if split is not None:
        found = [p for p in found if _split_token(p.name, split) or _split_token(p.parent.name, split)]
    # val_v1.0_withQT.json repeats val_v1.0.json with question types: read one of the two
    plain_of_qt = {p.parent / re.sub(r"_withqt", "", p.name, flags=re.I) for p in found if "withqt" in p.name.lower()}
    found = [p for p in found if p not in plain_of_qt]
    splits = {s for s in SPLITS if any(_split_token(p.name, s) or _split_token(p.parent.name, s) for p in found)}
    if split is None and len(splits) > 1:
        raise ValueError(f"{title} folder {root} holds the splits {', '.join(sorted(splits))}; choose one with "
                         f"--split or pass the file")
    return found


def _json_type(value: Any) -> str:
    """What JSON calls the type of a value that is not text or a number (a message names it, never the value)."""
    return {dict: "object", list: "list", tuple: "list", type(None): "null", bool: "boolean"}.get(
        type(value), type(value).__name__)


def answer_text(value: Any, where: str) -> str:
    """One answer as text: a string as it is; a number or true / false as its JSON text.

    The official scorers (ANLS, VQA accuracy, ChartQA's relaxed accuracy) compare text, and a
    label stored as a JSON number or boolean stands for the text it is written as: ``3`` -> ``"3"``,
    ``2.5`` -> ``"2.5"``, ``true`` -> ``"true"``. Anything else (an object, a list, NaN or Infinity)
    is not an answer and raises, naming the row ``where`` and the type, never the value.

    >>> answer_text(3, "x"), answer_text(2.5, "x"), answer_text(True, "x"), answer_text("Yes", "x")
    ('3', '2.5', 'true', 'Yes')
    """
    if isinstance(value, str):
        return value
    if isinstance(value, (bool, int)) or (isinstance(value, float) and math.isfinite(value)):
        return json.dumps(value)  # bool before int: JSON's true / false, not Python's True / False
    kind = "NaN or Infinity" if isinstance(value, float) else f"a JSON {_json_type(value)}"
    raise ValueError(f"{where}: an answer is {kind}; answers are text, numbers or true / false")


def as_answers(value: Any, where: str) -> tuple[str, ...]:
    """An annotation's answers as a tuple of strings: one scalar, a list of them, or None (a hidden test answer).

    Scalars become text by :func:`answer_text`; None items of a list are left out (no answer given).

    >>> as_answers(["12", 12, None], "x"), as_answers(None, "x")
    (('12', '12'), ())
    """
    if value is None:
        return ()
    if isinstance(value, (list, tuple)):
        return tuple(answer_text(v, where) for v in value if v is not None)
    return (answer_text(value, where),)


def question_id(value: Any, default: str, where: str) -> str:
    """A question's id as text: a string or an integer as written, ``default`` when absent (None).

    >>> question_id(49153, "x:0", "x"), question_id(None, "x:0", "x")
    ('49153', 'x:0')
    """
    if value is None:
        return default
    if isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
        return str(value)
    raise ValueError(f"{where}: the question id is a JSON {_json_type(value)}; expected text or an integer")


def benchmark_record(spec: DatasetSpec, rid: str, image: Path, image_id: str, question: Any,
                     answers: tuple[str, ...], where: str) -> Record:
    """One question with every reference answer, scored by the spec's metric; no boxes."""
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"{where}: question {rid!r} is empty or not a string")
    # the answer shown and trained on: the most frequent reference (TextVQA's 10 annotators disagree)
    top = Counter(answers).most_common(1)[0][0] if answers else ""
    return Record(spec.name, rid, image, image_id, question.strip(), top, (), answers=answers,
                  metric=spec.metric)


class ImageFinder:
    """Resolves an annotation's image name: against given folders first, then by file name under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._index: dict[str, list[Path]] | None = None  # file name -> paths, built on the first miss

    def find(self, name: str, bases: Iterable[Path], where: str) -> Path:
        for base in bases:
            if (base / name).is_file():
                return base / name
        if self._index is None:
            self._index = {}
            for p in self.root.rglob("*"):
                if p.suffix.lower() in IMAGE_SUFFIXES:
                    self._index.setdefault(p.name, []).append(p)
        hits = self._index.get(Path(name).name, [])
        if len(hits) == 1:
            return hits[0]
        if hits:
            raise ValueError(f"{where}: image {name} is ambiguous under {self.root} ({len(hits)} files); "
                             f"pass the annotation file beside its images")
        raise FileNotFoundError(f"{where}: image {name} not found beside the annotations or under {self.root}")


def _shown(items: list[str]) -> str:
    """The first five of ``items`` joined, and how many more."""
    return "; ".join(items[:5]) + (f"; and {len(items) - 5} more" if len(items) > 5 else "")


def _checked(title: str, files: list[tuple[Path, list[Located]]]) -> list[Record]:
    """The records of every file: unique ids; questions without answers left out in ONE warning.

    A file none of whose questions has an answer is an official test split (scored by the benchmark's
    server) and raises; a repeated question id raises naming both rows.
    """
    first: dict[str, str] = {}  # question id -> where it was read
    records: list[Record] = []
    unanswered: list[str] = []
    for source, located in files:
        if located and not any(r.answers for _, r in located):
            raise ValueError(f"{source} has no answers (an official test split is scored by the {title} "
                             f"server); evaluate on val")
        for where, r in located:
            if r.record_id in first:
                raise ValueError(f"{title}: question id {r.record_id!r} repeats: {first[r.record_id]} and {where}")
            first[r.record_id] = where
            if r.answers:
                records.append(r)
            else:
                unanswered.append(f"{where} (id {r.record_id!r})")
    if unanswered and records:  # no records at all is an error of its own (in finish)
        warnings.warn(f"{title}: {len(unanswered)} question(s) have no answer and are left out: "
                      f"{_shown(unanswered)}", stacklevel=4)  # the loader's caller
    return records


def read_benchmark(spec: DatasetSpec, root: Path | None, split: str | None, annotation: str,
                   read_json_file: Callable[[Path, ImageFinder], list[Located]]) -> list[Record]:
    """The records of ``split`` under ``root``: its annotation JSON files or its parquet shards.

    Question ids must be unique across the files read; questions without an answer are left out
    and named in one warning (a file with no answer at all is a hidden test split and raises).

    Args:
        spec: the benchmark (title in messages, name and metric of the records).
        root: an annotation file, a parquet file, or a folder searched for them.
        split: the official split (``train``, ``val``, ``test``); None when ``root`` holds one split.
        annotation: regular expression a JSON file name matches when it is an annotation file.
        read_json_file: ``(file, finder) -> [(where, record)]`` of one annotation file (the
            benchmark's layout), ``where`` naming the item, e.g. ``"<file>: item 3"``.
    """
    if root is None:
        raise ValueError(f"{spec.title} has no default folder; pass --data FILE_OR_DIR (see arr_coc.data.vqa)")
    root = Path(root)
    parquet = root.suffix == ".parquet" or (root.is_dir() and any(root.rglob("*.parquet")))
    files = _files(spec.title, annotation, root, split, ".parquet" if parquet else ".json")
    if not files:
        which = f" for split {split}" if split else ""
        raise ValueError(f"no {spec.title} annotation files{which} under {root}")
    finder = ImageFinder(root if root.is_dir() else root.parent.parent)
    read = [(f, _parquet_records(spec, f) if parquet else read_json_file(f, finder)) for f in files]
    return finish(spec.title, root, _checked(spec.title, read))


def json_items(path: Path) -> list[dict]:
    """The question objects of an annotation file: its ``data`` list, or the file's top-level list."""
    data = read_json(path)
    items = data.get("data") if isinstance(data, dict) else data
    if not isinstance(items, list) or not all(isinstance(d, dict) for d in items):
        raise ValueError(f"{path}: expected {{\"data\": [{{...}}, ...]}} or a list of objects")
    return items


# ----------------------------------------------------------------------------------------- parquet
def _rows(path: Path) -> Iterator[dict]:
    try:
        import pyarrow.parquet as pq
    except ImportError as err:
        raise ImportError("reading parquet needs pyarrow: pip install pyarrow (or 'arr-coc[test]')") from err
    for batch in pq.ParquetFile(path).iter_batches(batch_size=64):
        yield from batch.to_pylist()


def _image_problem(data: bytes) -> str | None:
    """Why image bytes cannot be read (None when they decode): checked once, before they are cached."""
    try:
        with warnings.catch_warnings():  # PIL warns between its two limits; the size is checked just below
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as img:
                w, h = img.size
                if w * h > MAX_IMAGE_PIXELS or w < 1 or h < 1:
                    return f"it is {w}x{h} px; an image needs 1 to {MAX_IMAGE_PIXELS} pixels"
                img.load()  # the whole decode: a truncated or damaged file fails here, not in the pipeline
    except UnidentifiedImageError:
        return "not a format PIL recognises (PNG, JPEG, TIFF, ...)"
    except DECODE_ERRORS as e:
        return f"{type(e).__name__}: {e}"
    return None


def _cached_image(image: Any, where: str) -> Path:
    """An image cell ``{"bytes", "path"}`` written once to the cache, named by its content.

    The bytes are decoded before they are written, so a bad image is reported by its row (``where``),
    not later by its cache file name.
    """
    data = image.get("bytes") if isinstance(image, dict) else image
    if not isinstance(data, (bytes, bytearray)) or not data:
        raise ValueError(f"{where}: the image column holds no bytes")
    suffix = Path(str(image.get("path") or "") if isinstance(image, dict) else "").suffix.lower()
    digest = hashlib.blake2b(data, digest_size=16).hexdigest()
    out = image_cache_dir() / f"{digest}{suffix if suffix in IMAGE_SUFFIXES else '.png'}"
    if not out.is_file():
        problem = _image_problem(bytes(data))
        if problem:
            raise ValueError(f"{where}: the image cannot be read ({problem})")
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, out)  # concurrent loaders (one per rank) write the same bytes: last one wins, whole
    return out


def _parquet_records(spec: DatasetSpec, path: Path) -> list[Located]:
    records = []
    for n, row in enumerate(_rows(path)):
        where = f"{path}: row {n}"
        question = row.get("question", row.get("query"))
        key = next((k for k in ("answers", "label", "answer") if k in row), None)
        if key is None or "image" not in row:
            raise ValueError(f"{where}: expected columns question (or query), answers (or label / answer) and image; "
                             f"got {', '.join(row)}")
        answers = as_answers(row[key], where)
        img = _cached_image(row["image"], where)
        rid = question_id(row.get("questionId", row.get("question_id")), f"{path.stem}:{n}", where)
        records.append((where, benchmark_record(spec, rid, img, img.stem, question, answers, where)))
    return records
