"""The evaluation loop: records x methods x budgets -> rows, one loop for every record kind and reader.

Records are images (:class:`arr_coc.data.datasets.Record`) or contexts (multi-page records, or
:class:`arr_coc.data.contexts.ContextItem`: a dataset is data, whichever its records are); what is seen once
(one image and its questions, one context and its questions) is a :class:`Unit`. A reader is a plug-in
(:class:`Reader`) that turns a unit's pending questions into rows:

- images, read by OCR (tesseract, rapidocr) or not read: :class:`arr_coc.eval.run.ImageReading`;
- contexts, read by OCR or not read: :class:`arr_coc.eval.context_run.ContextReading`;
- images or contexts answered by the VLM: :class:`arr_coc.eval.vlm_reader.VLMAnswers`.

Every row starts with the same columns (:func:`row`); each reader adds what it measures. Rows go to
``<out>/records.jsonl`` as they come (:class:`arr_coc.eval.store.RowStore`): an interrupted run loses at most
what was in flight and a rerun skips what is done; the folder records the settings that made its rows and
refuses a run with other settings; concurrent runs into one folder never write a row twice. Under
``torchrun --nproc_per_node N`` (a reader that shards: the VLM) every rank takes every N-th unit.
:mod:`arr_coc.eval.report` turns the rows into tables and plots.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Iterable, Iterator, Protocol, Sequence

import torch
import torch.distributed as dist
from tqdm import tqdm

from arr_coc.eval.settings import EvalSettings
from arr_coc.eval.store import RowStore


@dataclass
class Unit:
    """What is seen once: one image (``payload``: its Records) or one context (``payload``: a ContextItem, or the
    Records over one set of pages), and the questions asked of it (each with a ``record_id``)."""

    dataset: str
    ident: str
    questions: list
    payload: Any


class Reader(Protocol):
    """A reader plug-in of the loop (see the module docstring)."""

    desc: str  # the progress bar's label after "eval DATASET"
    shards: bool  # under torchrun, every rank takes its share of the units

    def identity(self) -> tuple[dict, dict]:
        """(what every row depends on besides its key, what only some methods' rows depend on)."""

    def rows(self, unit: Unit, todo: list, done: set) -> Iterator[list[dict]]:
        """Rows of the pending questions ``todo`` of ``unit`` (``done``: the keys already written)."""

    def flush(self) -> list[dict]:
        """Rows still held back (a batch not yet full) once every unit is done."""


def row(dataset: str, record_id: str, image_id: str, kind: str, question: str, answer: str, method: str,
        budget: str, tokens: int, full_tokens: int, reader: str | None, **measured: Any) -> dict:
    """One row: the same leading columns for every record kind and reader, then what the reader measured."""
    return {"dataset": dataset, "record_id": record_id, "image_id": image_id, "kind": kind, "question": question,
            "answer": answer, "method": method, "budget": budget, "tokens": tokens, "full_tokens": full_tokens,
            "reader": reader, **measured}


def scope_of(records: Sequence[Any]) -> str:
    """``context`` when the records are contexts (ContextItems, or Records with pages), else ``image``."""
    first = records[0] if records else None
    return "context" if first is not None and (hasattr(first, "questions") or getattr(first, "pages", ())) else "image"


def evaluate(records: Iterable[Any], arr: Any, out_dir: Path, settings: EvalSettings | None = None, *,
             adapter: Any = None, progress: bool = True) -> Path:
    """Evaluate every record x method x budget of ``settings`` into ``out_dir``; returns the rows' JSONL path.

    ``records``: image Records, multi-page Records, or ContextItems (a generator of them is read as it goes).
    ``adapter``: the VLM of ``settings.reader == "vlm"``.

    Raises:
        ValueError: ``out_dir`` holds rows made with other settings (unless ``settings.fresh``), a record cannot
            be read (named), a method or budget does not suit the records, or the reader needs what is missing.
    """
    records = iter(records)
    first = next(records, None)
    head = [] if first is None else [first]
    scope = scope_of(head)
    settings = (settings or EvalSettings(reader="vlm" if adapter is not None else "tesseract")).resolve(scope)
    stream = _chain(head, records)
    reader = make_reader(arr, settings, adapter, scope)
    rank, world, created = process_group(adapter.visual.device) if reader.shards else (0, 1, False)
    store = RowStore(Path(out_dir))
    identity, per_method = reader.identity()
    identity = json.loads(json.dumps(identity, default=str))
    # rank 0 claims first: with fresh it alone replaces old rows, before any rank appends new ones
    for turn in range(world):
        if turn == rank:
            store.claim(identity, per_method, fresh=settings.fresh and rank == 0)
        if world > 1:
            dist.barrier()
    units = _units(stream, scope, settings.reader == "vlm")
    if world > 1:
        units = (u for n, u in enumerate(units) if n % world == rank)
    # closed on the way out of an interruption too, so the message that follows starts its own line
    with tqdm(desc="eval", disable=not progress or rank != 0) as bar:
        for unit in units:
            bar.set_description(f"eval {unit.dataset}{reader.desc}", refresh=False)
            done = store.done()  # re-read: another run into the same folder may have done some
            todo = [q for q in unit.questions if not settings.keys(q.record_id) <= done]
            bar.update(len(unit.questions) - len(todo))
            if not todo:
                continue
            for rows in reader.rows(unit, todo, done):
                store.append(rows)
            bar.update(len(todo))
        store.append(reader.flush())
    if world > 1:
        dist.barrier()  # nobody reports before every rank has written its rows
    if created:
        dist.destroy_process_group()
    return store.path


def make_reader(arr: Any, settings: EvalSettings, adapter: Any, scope: str) -> Reader:
    """The reader plug-in of ``settings.reader`` for records of ``scope``."""
    if settings.reader == "vlm":
        from arr_coc.eval.vlm_reader import VLMAnswers

        if adapter is None:
            raise ValueError("the vlm reader needs the model: evaluate(..., adapter=load_vlm(...))")
        return VLMAnswers(arr, adapter, settings)
    if scope == "context":
        from arr_coc.eval.context_run import ContextReading

        return ContextReading(arr, settings)
    from arr_coc.eval.run import ImageReading

    return ImageReading(arr, settings)


def _chain(head: list, rest: Iterator[Any]) -> Iterator[Any]:
    yield from head
    yield from rest


def _units(records: Iterable[Any], scope: str, answered: bool) -> Iterator[Unit]:
    """The records grouped into what is seen once: a ContextItem as it is; Records by image (answered by the VLM,
    multi-page Records too: each is one prompt over its pages), or, read by OCR, multi-page Records by their pages."""
    if scope == "context" and not answered:
        from arr_coc.data.contexts import record_contexts

        records = iter(records)
        first = next(records, None)
        if first is None:
            return
        items = _chain([first], records) if hasattr(first, "questions") else record_contexts([first, *records])
        for item in items:
            yield Unit(item.dataset, item.context_id, list(item.questions), item)
        return
    groups: dict[str, list] = {}
    for r in records:
        if hasattr(r, "questions"):
            raise ValueError(f"context {r.context_id} is read by an OCR reader (--reader tesseract or rapidocr); the "
                             f"VLM reads records with pages (mpdocvqa, slidevqa)")
        if bool(r.pages) != (scope == "context"):
            raise ValueError(f"record {r.record_id} is {'one image' if not r.pages else 'a context (pages)'} among "
                             f"{'contexts' if scope == 'context' else 'images'}: a run's records are of one kind")
        groups.setdefault(r.image_id, []).append(r)
    for image_id, recs in groups.items():
        yield Unit(recs[0].dataset, image_id, recs, recs)


# ----------------------------------------------------------------------------- processes
def rank_device(device: str | None) -> str | None:
    """``cuda`` under torchrun -> this process's own GPU (``cuda:<LOCAL_RANK>``); anything else unchanged."""
    if device == "cuda" and "LOCAL_RANK" in os.environ:
        return f"cuda:{int(os.environ['LOCAL_RANK'])}"
    return device


def process_group(device: Any) -> tuple[int, int, bool]:
    """(rank, world, created): one process, or torchrun's (nccl when the model is on a GPU, gloo on the CPU);
    ``created`` when this call started the group (and its caller ends it)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return 0, 1, False
    created = not dist.is_initialized()
    if created:
        cuda = torch.device(device).type == "cuda"
        if cuda:
            torch.cuda.set_device(torch.device(device))
        # a rank waits at the end for the slowest one: hours, not torch's default minutes
        dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(hours=12))
    return dist.get_rank(), world, created


def shard(records: Sequence[Any], rank: int, world: int) -> list[Any]:
    """This rank's records: every ``world``-th image (all questions of an image stay together).

    >>> from arr_coc.data.datasets import Record
    >>> recs = [Record("d", f"{i}{q}", Path("x"), str(i), "q", "a", ()) for i in range(3) for q in "ab"]
    >>> [r.record_id for r in shard(recs, 1, 2)]
    ['1a', '1b']
    """
    images = list(dict.fromkeys(r.image_id for r in records))
    mine = {i for n, i in enumerate(images) if n % world == rank}
    return [r for r in records if r.image_id in mine]
