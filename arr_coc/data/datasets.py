"""Datasets as small specs: :class:`Record`, :class:`DatasetSpec`, the ``DATASETS`` registry and :func:`load_dataset`.

A dataset is a :class:`DatasetSpec`: its name and title, the loader that turns a folder (or file)
into a list of :class:`Record`, how its records split into train / val / test, the answer metric
its records are scored with (a key of ``arr_coc.eval.metrics.ANSWER_METRICS``), the prompt
template the VLM reader asks with, and the reader it is evaluated with by default. One module per
family registers the specs: :mod:`~arr_coc.data.funsd`, :mod:`~arr_coc.data.sroie`,
:mod:`~arr_coc.data.coco`, :mod:`~arr_coc.data.jsonl` (bring your own data), and the official VQA
benchmarks :mod:`~arr_coc.data.docvqa` (DocVQA, InfoVQA), :mod:`~arr_coc.data.textvqa` and
:mod:`~arr_coc.data.chartqa`, which share their JSON / parquet reading in :mod:`~arr_coc.data.vqa`.

Adding a dataset is one file: write a loader ``load(root: Path | None) -> list[Record]`` (records
in a stable order; :func:`arr_coc.data.loading.finish` fills ``others_px``), :func:`register` its
spec, and import the module in ``arr_coc/data/__init__.py`` so ``arr-coc eval NAME`` finds it. A
spec also loads as it is, unregistered, e.g. a fixed JSONL file given a name of its own::

    >>> import json, tempfile
    >>> from PIL import Image
    >>> from arr_coc.data.jsonl import load_jsonl
    >>> folder = Path(tempfile.mkdtemp())
    >>> Image.new("RGB", (40, 30), "white").save(folder / "a.png")
    >>> _ = (folder / "toy.jsonl").write_text(json.dumps(
    ...     {"image": "a.png", "question": "What is the total?", "answer": "9", "boxes": [[2, 3, 20, 9]]}))
    >>> toy = DatasetSpec("toy", "Toy", lambda root: load_jsonl(folder / "toy.jsonl"))
    >>> [(r.record_id, r.question, r.answer, r.boxes_px, r.metric) for r in load_dataset(toy)]
    [('toy:1', 'What is the total?', '9', ((3.0, 2.0, 9.0, 20.0),), 'anls')]
    >>> toy.splits, toy.metric, toy.reader
    ('hash', 'anls', 'tesseract')

Boxes are ``(y0, x0, y1, x1)`` in original image pixels (float) of the image as displayed, i.e.
after its EXIF orientation, which is how the pipeline reads it (:func:`arr_coc.engine.imageio.image_size`).
"""
from __future__ import annotations

import hashlib
import os
import random
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal, Optional

from arr_coc.data.boxes import Box
from arr_coc.registry import Registry

SPLITS = ("train", "val", "test")
# the VLM reader's template ("{question}" is replaced by the record's question): the short-answer
# instruction the field's evaluations give Qwen-VL on DocVQA, InfoVQA, TextVQA and ChartQA
SHORT_ANSWER_PROMPT = "{question}\nAnswer the question using a single word or phrase."


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
    metric: str = "anls"  # how a predicted answer is scored: a key of arr_coc.eval.metrics.ANSWER_METRICS
    # the question's kind, what a balanced subset spreads over and reports break down by: SROIE's key
    # (company, date, address, total), FUNSD's answer shape (funsd.answer_kind), COCO's category; "" = one kind
    kind: str = ""
    # images that must fall on one side of a split (one company's receipts, one form template,
    # one document's pages: arr_coc.data.groups); "" = the image alone
    group: str = ""
    # a multi-page record (MP-DocVQA, SlideVQA): every page image in order (``image`` is the first answer
    # page, or the first page); () for a one-image record
    pages: tuple[Path, ...] = ()
    answer_pages: tuple[int, ...] = ()  # 0-based indices into ``pages`` of the pages holding the answer

    @property
    def split_group(self) -> str:
        """What :func:`split_of` hashes: the record's group, or its image when it has none."""
        return self.group or self.image_id

    @property
    def references(self) -> tuple[str, ...]:
        """The answers a prediction is scored against."""
        return self.answers or (self.answer,)


@dataclass(frozen=True)
class DatasetSpec:
    """What makes a dataset: how to load it, split it, score it, ask about it and read it.

    Attributes:
        name: registry name, also ``Record.dataset`` (``arr-coc eval NAME``).
        title: how messages and tables name it, e.g. ``"COCO128"``.
        load: ``load(root)`` -> records; with ``splits="official"`` ``load(root, split=...)``.
        splits: ``"hash"``: train / val / test by :func:`split_of` of the record's group
            (``Record.split_group``: its company, template or document; else its image);
            ``"official"``: the benchmark's own split files, chosen by the loader.
        metric: the answer metric its records carry (``Record.metric``), a key of
            ``arr_coc.eval.metrics.ANSWER_METRICS``.
        prompt: the VLM reader's template; ``{question}`` is replaced by the question.
        reader: the reader it is evaluated with by default: an OCR engine (``"tesseract"``) when
            the records have answer text and boxes, ``"vlm"`` when they have no boxes, None when
            there is no text to read (COCO: coverage only).
        folder: its folder under the shared data directory (:func:`default_root`); None when the
            user must pass a path.
        contexts: set when the records are whole contexts, read by the context reader of the loop:
            ``contexts(root, split=, limit=, seed=, **options)`` -> (the
            :class:`~arr_coc.data.contexts.ContextItem` s, how they were made, a subfolder of the
            output or ""); ``load`` then gives what the VLM reads (or raises, saying which reader).
        context_options: the ``arr-coc eval`` context options (``window``, ``dpi``, ...) ``contexts`` takes.
        documents_of: the dataset whose documents (and so whose split, which trained weights must not
            have seen) its records use; None: its own.
    """

    name: str
    title: str
    load: Callable[..., list[Record]]
    splits: Literal["hash", "official"] = "hash"
    metric: str = "anls"
    prompt: str = SHORT_ANSWER_PROMPT
    reader: Optional[str] = "tesseract"
    folder: Optional[str] = None
    contexts: Optional[Callable[..., tuple]] = None
    context_options: tuple[str, ...] = ()
    documents_of: Optional[str] = None

    def __post_init__(self) -> None:
        if self.splits not in ("hash", "official"):
            raise ValueError(f"dataset {self.name!r}: splits must be 'hash' or 'official', got {self.splits!r}")
        if "{question}" not in self.prompt:
            raise ValueError(f"dataset {self.name!r}: the prompt must hold {{question}}, got {self.prompt!r}")


DATASETS: Registry[DatasetSpec] = Registry("dataset")


def register(spec: DatasetSpec) -> DatasetSpec:
    """Add ``spec`` to ``DATASETS`` under its name (a duplicate name raises) and return it."""
    return DATASETS.register(spec.name)(spec)


def default_root(name: str) -> Path:
    """The dataset's folder in the evaluation data directory: ``$ARR_COC_DATA``, else ``../shared/data`` beside a
    source checkout.

    The fallback exists for evaluating from the project's own checkout (the benchmarks and the tests that read
    real data); an installed package has no such neighbour, so there the folder comes from ``--data`` or
    ``ARR_COC_DATA``.
    """
    folder = DATASETS.get(name).folder
    if folder is None:
        raise ValueError(f"dataset {name!r} has no default folder; pass its path (--data PATH)")
    env = os.environ.get("ARR_COC_DATA")
    if env:
        return Path(env) / folder
    checkout = Path(__file__).resolve().parents[2]
    if not (checkout / "pyproject.toml").is_file():  # installed: site-packages has no ../shared/data
        raise ValueError(f"no data folder for {name!r}: pass --data DIR or set ARR_COC_DATA (the ../shared/data "
                         f"default applies to a source checkout only)")
    return checkout.parent / "shared" / "data" / folder


def split_of(group: str, dataset: str, shares: tuple[float, float, float] = (0.6, 0.15, 0.25)) -> str:
    """Deterministic train / val / test split by group (``Record.split_group``): all its images go together.

    A group is an image, or the images a loader ties together (:mod:`arr_coc.data.groups`: one
    company's receipts, one form template). Training (``arr-coc train``) learns on ``train``, watches
    ``val``; reports use ``test`` only.

    >>> split_of("0000971160", "funsd") in SPLITS
    True
    """
    u = int.from_bytes(hashlib.blake2b(f"{dataset}/{group}".encode(), digest_size=8).digest(), "little") / 2**64
    return "train" if u < shares[0] else "val" if u < shares[0] + shares[1] else "test"


def load_dataset(
    name: str | DatasetSpec, root: Path | str | None = None, *, limit: int | None = None, seed: int = 0,
    split: str | None = None,
) -> list[Record]:
    """Load a registered dataset, optionally a reproducible subset balanced over question kinds and images.

    With ``limit``, :func:`balanced_subset` picks the records: the question kinds (``Record.kind``) take
    turns, each kind's pick preferring the least-used image, so ``limit=40`` on SROIE's test receipts
    is 10 company names, 10 dates, 10 addresses and 10 totals on 33 receipts, not 33 company names.

    Args:
        name: registered dataset name (``DATASETS.names()``), or a spec.
        root: the dataset folder (or file); None = :func:`default_root`.
        limit: keep at most this many records (positive); None keeps all, in loader order.
        seed: seed of the image and kind shuffles.
        split: keep only the groups of this split (:func:`split_of`), before ``limit``; benchmarks
            with official splits (DocVQA, InfoVQA, TextVQA, ChartQA) read that split's files instead.
    """
    spec = name if isinstance(name, DatasetSpec) else DATASETS.get(name)
    path = None if root is None else Path(root)
    if spec.splits == "official":  # a benchmark's own train / val / test files
        records = spec.load(path, split=split)
    else:
        records = spec.load(path)
        if split is not None:
            if split not in SPLITS:
                raise ValueError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
            records = [r for r in records if split_of(r.split_group, r.dataset) == split]
    if limit is None:
        return records
    return balanced_subset(records, limit, seed)


def balanced_subset(records: list[Record], limit: int, seed: int = 0) -> list[Record]:
    """A reproducible subset of ``limit`` records spread evenly over question kinds, then over images.

    Image ids and kinds are each shuffled with ``seed``; the kinds then take turns in that order, and
    each turn takes, of its kind's records not yet taken, one on an image used the fewest times so far
    (the earliest image in the shuffled order among those; a kind with none left drops out). Hence
    every kind gets ``limit // kinds`` or one more record while it has them (the first ``limit % kinds``
    kinds of the shuffled order get the extra one), no image gets a second record before every image
    of the kind has one, and a smaller limit is a prefix of a larger one. Records with one kind
    (``kind=""``) are the images round-robin: the first record of every image, then the second, ...

    Example:
        >>> rs = [Record("d", f"{i}#{k}", Path("x.png"), str(i), "q", "a", (), kind=k) for i in range(3)
        ...       for k in ("date", "total")]
        >>> sorted(Counter(r.kind for r in balanced_subset(rs, 4)).items())
        [('date', 2), ('total', 2)]
    """
    if limit <= 0:
        raise ValueError(f"limit must be a positive number of records, got {limit}")
    images = sorted({r.image_id for r in records})
    random.Random(seed).shuffle(images)
    place = {image: i for i, image in enumerate(images)}
    kinds = sorted({r.kind for r in records})
    random.Random(seed + 1).shuffle(kinds)
    queues = {k: [r for r in records if r.kind == k] for k in kinds}
    for queue in queues.values():  # stable: an image's records keep their loader order
        queue.sort(key=lambda r: place[r.image_id])
    used: Counter[str] = Counter()
    picked: list[Record] = []
    while len(picked) < limit and any(queues.values()):
        for kind in kinds:
            queue = queues[kind]
            if not queue or len(picked) == limit:
                continue
            best = min(range(len(queue)), key=lambda i: (used[queue[i].image_id], place[queue[i].image_id]))
            record = queue.pop(best)
            used[record.image_id] += 1
            picked.append(record)
    return picked


def records_by_image(records: list[Record]) -> dict[str, list[Record]]:
    """Records grouped by ``image_id``, each group in the given order."""
    groups: dict[str, list[Record]] = defaultdict(list)
    for r in records:
        groups[r.image_id].append(r)
    return groups
