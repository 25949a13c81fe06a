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
"""
from __future__ import annotations

import hashlib
import os
import re
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from arr_coc.data.datasets import SPLITS, DatasetSpec, Record
from arr_coc.data.loading import finish, read_json

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


def as_answers(value: Any) -> tuple[str, ...]:
    """An annotation's answers as a tuple of strings: one string, a list, or None (a hidden test answer)."""
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    return tuple(str(v) for v in value if v is not None)


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


def _answered(title: str, records: list[Record], source: Path) -> list[Record]:
    if records and not any(r.answers for r in records):
        raise ValueError(f"{source} has no answers (an official test split is scored by the {title} "
                         f"server); evaluate on val")
    return [r for r in records if r.answers]


def read_benchmark(spec: DatasetSpec, root: Path | None, split: str | None, annotation: str,
                   read_json_file: Callable[[Path, ImageFinder], list[Record]]) -> list[Record]:
    """The records of ``split`` under ``root``: its annotation JSON files or its parquet shards.

    Args:
        spec: the benchmark (title in messages, name and metric of the records).
        root: an annotation file, a parquet file, or a folder searched for them.
        split: the official split (``train``, ``val``, ``test``); None when ``root`` holds one split.
        annotation: regular expression a JSON file name matches when it is an annotation file.
        read_json_file: ``(file, finder) -> records`` of one annotation file (the benchmark's layout).
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
    records: list[Record] = []
    for f in files:
        records += _answered(spec.title, _parquet_records(spec, f) if parquet else read_json_file(f, finder), f)
    return finish(spec.title, root, records)


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


def _cached_image(image: Any, where: str) -> Path:
    """An image cell ``{"bytes", "path"}`` written once to the cache, named by its content."""
    data = image.get("bytes") if isinstance(image, dict) else image
    if not isinstance(data, (bytes, bytearray)) or not data:
        raise ValueError(f"{where}: the image column holds no bytes")
    suffix = Path(str(image.get("path") or "") if isinstance(image, dict) else "").suffix.lower()
    digest = hashlib.blake2b(data, digest_size=16).hexdigest()
    out = image_cache_dir() / f"{digest}{suffix if suffix in IMAGE_SUFFIXES else '.png'}"
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, out)  # concurrent loaders (one per rank) write the same bytes: last one wins, whole
    return out


def _parquet_records(spec: DatasetSpec, path: Path) -> list[Record]:
    records = []
    for n, row in enumerate(_rows(path)):
        where = f"{path}: row {n}"
        question = row.get("question", row.get("query"))
        answers = next((as_answers(row[k]) for k in ("answers", "label", "answer") if k in row), None)
        if answers is None or "image" not in row:
            raise ValueError(f"{where}: expected columns question (or query), answers (or label / answer) and image; "
                             f"got {', '.join(row)}")
        img = _cached_image(row["image"], where)
        rid = str(row.get("questionId", row.get("question_id", f"{path.stem}:{n}")))
        records.append(benchmark_record(spec, rid, img, img.stem, question, answers, where))
    return records
