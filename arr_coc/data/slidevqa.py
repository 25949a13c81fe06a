"""SlideVQA (questions over slide decks): the official JSON-lines questions + slide images; metric ANLS.

The layout its authors distribute (Tanaka et al. 2023): ``annotations/qa/train.jsonl``, ``val.jsonl``,
``test.jsonl``, one question a line ``{"qa_id", "deck_name", "question", "answer", "evidence_pages":
[1-based slides], ...}``, and the slides of a deck ``images/<split>/<deck_name>/slide_<n>_1024.jpg``
(any ``slide_<n>[_...]`` image name). ``root`` is one ``.jsonl`` file or a folder searched for
``<split>.jsonl``; a deck is the folder named ``deck_name`` under ``root`` (or beside the file).

A record's ``pages`` are the deck's slides by number, ``answer_pages`` the evidence slides (0-based
indices into ``pages``), ``image`` the first evidence slide. Strict: every line a JSON object with a
non-empty question, an answer (text, or a number written as text), a deck folder holding slides,
evidence pages among them; a repeated ``qa_id`` raises naming both lines.
"""
from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from arr_coc.data.datasets import SPLITS, DatasetSpec, Record, register
from arr_coc.data.loading import finish, json_object
from arr_coc.data.vqa import IMAGE_SUFFIXES, answer_text, benchmark_record, question_id

SLIDE = re.compile(r"slide_(\d+)(?:_.*)?", re.I)


def _files(root: Path, split: str | None) -> list[Path]:
    if not root.exists():
        raise FileNotFoundError(f"SlideVQA path {root} not found; pass --data FILE_OR_DIR")
    if split is not None and split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
    if root.is_file():
        return [root]
    found = sorted(p for p in root.rglob("*.jsonl") if p.stem in SPLITS and (split is None or p.stem == split))
    if split is None and len({p.stem for p in found}) > 1:
        raise ValueError(f"SlideVQA folder {root} holds the splits {', '.join(sorted({p.stem for p in found}))}; "
                         f"choose one with --split or pass the file")
    if not found:
        raise ValueError(f"no SlideVQA question file{f' {split}.jsonl' if split else 's'} under {root}")
    return found


def deck_slides(folder: Path, where: str) -> dict[int, Path]:
    """Slide number -> image of a deck folder (``slide_<n>[_...]`` images); none raises."""
    slides: dict[int, Path] = {}
    for p in sorted(folder.iterdir()):
        m = SLIDE.fullmatch(p.stem)
        if m and p.suffix.lower() in IMAGE_SUFFIXES:
            n = int(m.group(1))
            if n in slides:
                raise ValueError(f"{where}: deck {folder} holds slide {n} twice ({slides[n].name}, {p.name})")
            slides[n] = p
    if not slides:
        raise FileNotFoundError(f"{where}: deck folder {folder} holds no slide_<n> images")
    return slides


def load_slidevqa(root: Path | None = None, *, split: str | None = None) -> list[Record]:
    """SlideVQA: the split's ``.jsonl`` questions over their decks' slides; one record per question."""
    if root is None:
        raise ValueError("SlideVQA has no default folder; pass --data FILE_OR_DIR (see arr_coc.data.slidevqa)")
    root = Path(root)
    files = _files(root, split)
    search = root if root.is_dir() else root.parent.parent.parent  # annotations/qa/x.jsonl -> the set's folder
    decks: dict[str, list[Path]] | None = None
    records, first = [], {}
    for path in files:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            where = f"{path}: line {n}"
            d = json_object(line, where)
            rid = question_id(d.get("qa_id"), f"{path.stem}:{n}", where)
            if rid in first:
                raise ValueError(f"SlideVQA: question id {rid!r} repeats: {first[rid]} and {where}")
            first[rid] = where
            deck = d.get("deck_name")
            if not isinstance(deck, str) or not deck or "/" in deck:
                raise ValueError(f"{where}: 'deck_name' must be a deck folder name")
            if decks is None:  # every folder by name, once
                decks = {}
                for p in search.rglob("*"):
                    if p.is_dir():
                        decks.setdefault(p.name, []).append(p)
            folders = decks.get(deck, [])
            if len(folders) != 1:
                raise FileNotFoundError(f"{where}: deck folder {deck!r} "
                                        f"{'not found' if not folders else 'is ambiguous'} under {search}")
            slides = deck_slides(folders[0], where)
            numbers = sorted(slides)
            evidence = d.get("evidence_pages", [])
            if not isinstance(evidence, list) or not all(isinstance(e, int) and not isinstance(e, bool)
                                                         and e in slides for e in evidence):
                raise ValueError(f"{where}: 'evidence_pages' must list slide numbers of deck {deck!r} "
                                 f"({numbers[0]}-{numbers[-1]}), got {evidence!r}")
            if d.get("answer") is None:
                raise ValueError(f"{where}: no 'answer'")
            answer = answer_text(d.get("answer"), where)
            at = tuple(numbers.index(e) for e in evidence)
            pages = tuple(slides[k] for k in numbers)
            r = benchmark_record(SLIDEVQA, rid, pages[at[0] if at else 0], deck, d.get("question"), (answer,), where)
            records.append(replace(r, pages=pages, answer_pages=at))
    return finish("SlideVQA", root, records)


# slide decks without answer boxes: the VLM reads every slide in one prompt
SLIDEVQA = register(DatasetSpec("slidevqa", "SlideVQA", load_slidevqa, splits="official", metric="anls",
                                reader="vlm"))
