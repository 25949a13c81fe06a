"""Your own questions over your own documents: ``arr-coc eval contexts --data FILE.jsonl``.

One question a line (blank lines are ignored)::

    {"document": "manual.pdf", "pages": "1-20", "question": "Which option sets the margin?",
     "answers": ["margin"], "answer_page": 7}

- ``document``: a PDF, a text file (``.txt``, ``.md``, ``.rst``, ``.tex``) or a list of page images,
  paths relative to the JSONL file's folder (or absolute).
- ``pages`` (optional, PDFs only): the window asked over, a 1-based range as ``look --pages`` takes
  it (``"1-20"``, ``"3,7-9"``); default every page.
- ``question``: non-empty. ``answers``: a non-empty list of the accepted answers (``"answer"``, one
  string, also works).
- ``answer_page``: the answer's page, numbered in the document (1-based), inside ``pages``.
- ``boxes`` (optional): the answer's boxes on that page, ``[x0, y0, x1, y1]`` in the page's pixels
  (a PDF rendered at the run's ``--dpi``, a text page as set, an image as displayed). Without them
  the answer is found on the page's text layer, every occurrence a candidate (the best one counts);
  a page without the answer on its text layer (or an image page, which has none) needs ``boxes``.
- ``id`` (optional, default ``<file stem>:<line>``), unique; ``kind`` (optional): tables add a row per kind.

Questions over the same document and pages form one context, seen once. A bad line raises one line
starting ``FILE:LINE:``.
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence, Union

from arr_coc.data.boxes import Box
from arr_coc.data.contexts import CONTEXT_DPI, ContextItem, ContextQuestion
from arr_coc.data.datasets import DatasetSpec, Record, register, split_of

CONTEXTS = "contexts"  # the dataset name of arr-coc eval


@dataclass(frozen=True)
class ContextLine:
    """One checked line: a question over a window of one document.

    Attributes:
        where: ``FILE:LINE``, what its errors start with.
        id: the question's id.
        document: the PDF or text file, or the page images.
        pages: the 1-based range asked over (None: every page).
        question: the question. answers: the accepted answers.
        answer_page: the answer's page in the document, 1-based.
        boxes: the answer's boxes on that page, (y0, x0, y1, x1) px; () = find it on the text layer.
        kind: the question's kind ("" = one kind).
        name: the document as the line names it (its first page for images): the context's id.
    """

    where: str
    id: str
    document: Union[Path, tuple[Path, ...]]
    pages: str | None
    question: str
    answers: tuple[str, ...]
    answer_page: int
    boxes: tuple[Box, ...] = ()
    kind: str = ""
    name: str = ""


def _text(obj: dict, key: str, where: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{where}: {key!r} must be a non-empty string, got {value!r}")
    return value


def _boxes(value: Any, where: str) -> tuple[Box, ...]:
    ok = isinstance(value, list) and value and all(
        isinstance(b, list) and len(b) == 4 and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                    and math.isfinite(v) for v in b) and b[2] > b[0] and b[3] > b[1]
        for b in value)
    if not ok:
        raise ValueError(f"{where}: 'boxes' must be a list of [x0, y0, x1, y1] with x1 > x0 and y1 > y0, got {value!r}")
    return tuple((float(b[1]), float(b[0]), float(b[3]), float(b[2])) for b in value)


def parse_context_line(obj: Any, where: str, folder: Path) -> ContextLine:
    """One line's object, checked field by field (not the document's contents: :func:`context_items`)."""
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    for key in ("document", "question", "answer_page"):
        if key not in obj:
            raise ValueError(f"{where}: missing field {key!r}")
    if "answers" not in obj and "answer" not in obj:
        raise ValueError(f"{where}: missing field 'answers'")
    doc = obj["document"]
    if isinstance(doc, list) and doc and all(isinstance(d, str) and d.strip() for d in doc):
        document: Union[Path, tuple[Path, ...]] = tuple(folder / d for d in doc)
    elif isinstance(doc, str) and doc.strip():
        document = folder / doc
    else:
        raise ValueError(f"{where}: 'document' must be a file name or a list of page images, got {doc!r}")
    answers = obj.get("answers", [obj.get("answer")])
    if not isinstance(answers, list) or not answers or not all(isinstance(a, str) and a.strip() for a in answers):
        raise ValueError(f"{where}: 'answers' must be a non-empty list of non-empty strings, got {answers!r}")
    at = obj["answer_page"]
    if isinstance(at, bool) or not isinstance(at, int) or at < 1:
        raise ValueError(f"{where}: 'answer_page' must be a page number, 1-based, got {at!r}")
    pages = obj.get("pages")
    if pages is not None and not isinstance(pages, str):
        raise ValueError(f"{where}: 'pages' must be a 1-based range like \"1-20\", got {pages!r}")
    kind = obj.get("kind", "")
    if not isinstance(kind, str):
        raise ValueError(f"{where}: 'kind' must be a string, got {kind!r}")
    default_id = f"{Path(where.rsplit(':', 1)[0]).stem}:{where.rsplit(':', 1)[1]}"
    qid = _text(obj, "id", where) if "id" in obj else default_id
    boxes = _boxes(obj["boxes"], where) if "boxes" in obj else ()
    return ContextLine(where, qid, document, pages, _text(obj, "question", where), tuple(answers), at, boxes, kind,
                       doc[0] if isinstance(doc, list) else doc)


def _key(text: str) -> str:
    return re.sub(r"\W+", "", text.casefold())


def find_answer(words: Sequence[Any], answers: Sequence[str]) -> list[tuple[Box, ...]]:
    """Every occurrence of an answer among a page's words, each its words' boxes: the letters and digits compared,
    case, spaces and punctuation aside (a text layer splits ``4pt`` or ``\\cmd.`` its own way), whole words; where
    there are none, the words that hold an answer inside them.

    >>> ws = [("The", (0, 0, 9, 20)), ("total:", (0, 25, 9, 60)), ("9.00", (0, 65, 9, 90)), ("9", (20, 0, 29, 9)),
    ...       (".00.", (20, 10, 29, 25)), ("9.001", (30, 0, 39, 25))]
    >>> find_answer(ws, ["9.00"])
    [((0, 65, 9, 90),), ((20, 0, 29, 9), (20, 10, 29, 25))]
    >>> find_answer(ws, ["00.1"]), find_answer(ws, ["7"])
    ([((30, 0, 39, 25),)], [])
    """
    keys = [_key(w[0]) for w in words]
    targets, found = list({_key(a): None for a in answers if _key(a)}), []
    for target in targets:
        for i in range(len(keys)):
            text, j = "", i
            while keys[i] and j < len(keys) and target.startswith(text + keys[j]):
                text, j = text + keys[j], j + 1
                if text == target:
                    found.append(tuple(words[k][1] for k in range(i, j)))
                    break
    if not found:  # printed inside a longer word (code: \\def~{\\nobreakspace}): that word's box
        found = [(w[1],) for w, k in zip(words, keys) if any(t in k for t in targets)]
    return found


def _window(line: ContextLine, dpi: float) -> tuple[list[int], Callable[[], Any], Any]:
    """(the 1-based page numbers of the line's context, its loader, its pages read for their text layer or None)."""
    from arr_coc.documents.pdf import read_pdf
    from arr_coc.documents.text_pages import TextLayout, read_text_file, render_text

    doc = line.document
    paths = doc if isinstance(doc, tuple) else (doc,)
    missing = [p for p in paths if not p.is_file()]
    if missing:
        raise ValueError(f"{line.where}: document {missing[0]} not found")
    try:
        if isinstance(doc, tuple):
            if line.pages is not None:
                raise ValueError("'pages' chooses pages of a PDF; list the page images instead")
            return list(range(1, len(doc) + 1)), lambda: [str(p) for p in doc], None
        with open(doc, "rb") as f:
            pdf = doc.suffix.lower() == ".pdf" or b"%PDF-" in f.read(1024)
        if pdf:
            text = read_pdf(doc, pages=line.pages, dpi=dpi, render=False)
            return ([p.index + 1 for p in text.pages], lambda: read_pdf(doc, pages=line.pages, dpi=dpi), text)
        if line.pages is not None:
            raise ValueError(f"'pages' chooses pages of a PDF; {doc.name} is not one")
        ctx = render_text(read_text_file(doc), TextLayout(), str(doc))  # as see_context sets a text file
        return list(range(1, len(ctx) + 1)), lambda: ctx, ctx
    except (ValueError, OSError) as err:
        raise ValueError(f"{line.where}: cannot read {doc if not isinstance(doc, tuple) else 'the pages'}: "
                         f"{err}") from None


def context_items(lines: Sequence[ContextLine], dataset: str = CONTEXTS, dpi: float = CONTEXT_DPI,
                  require_found: bool = True) -> list[ContextItem]:
    """The lines as contexts: one per document and window, in order of first use, each read once for its text layer.

    ``require_found``: a line without boxes whose answer is not on its page's text layer raises; False keeps it
    without boxes (read by the find reading, not told where).
    """
    groups: dict[tuple, list[ContextLine]] = {}
    for line in lines:
        groups.setdefault((line.document, line.pages), []).append(line)
    items, seen = [], set()
    for (document, _), group in groups.items():
        numbers, load, text = _window(group[0], dpi)
        questions = []
        for line in group:
            if line.id in seen:
                raise ValueError(f"{line.where}: id {line.id!r} is used twice")
            seen.add(line.id)
            if line.answer_page not in numbers:
                window = line.pages or f"1-{len(numbers)}"
                raise ValueError(f"{line.where}: 'answer_page' {line.answer_page} lies outside the pages {window}")
            at = numbers.index(line.answer_page)
            found: tuple = ()
            if not line.boxes:
                found = tuple(find_answer(text.pages[at].words, line.answers)) if text is not None else ()
                if not found and require_found:
                    raise ValueError(f"{line.where}: no answer ({' / '.join(line.answers)}) on the text layer of "
                                     f"page {line.answer_page}; give its 'boxes'")
            questions.append(ContextQuestion(line.id, line.question, line.answers, (at,), line.boxes, line.kind,
                                             found=found))
        name = group[0].name or _name(document)
        context_id = name + (f"#{group[0].pages}" if group[0].pages else "")
        items.append(ContextItem(dataset, context_id, load, questions, name))
    return items


def _name(document: Union[Path, tuple[Path, ...]]) -> str:
    """A document's file name (its first page's for images): what its split is drawn from, the same anywhere."""
    return (document[0] if isinstance(document, tuple) else document).name


def read_lines(path: Path) -> list[ContextLine]:
    """Every non-blank line of ``path`` checked (:func:`parse_context_line`); malformed JSON names its line."""
    path = Path(path)
    out = []
    for n, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if text.strip():
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: malformed JSON ({e})") from None
            out.append(parse_context_line(obj, f"{path}:{n}", path.parent))
    if not out:
        raise ValueError(f"no question in {path}; write one JSON object a line (docs/coc.md)")
    return out


def load_contexts(root: Union[str, os.PathLike, None] = None, *, split: str | None = None, limit: int | None = None,
                  seed: int = 0, dpi: float | None = None) -> tuple[Iterator[ContextItem], dict, str]:
    """``contexts`` as a :class:`~arr_coc.data.datasets.DatasetSpec` reads it: the questions of the JSONL file
    ``root`` (the first ``limit``; of the documents of ``split`` by :func:`~arr_coc.data.datasets.split_of`)."""
    if root is None or not Path(root).is_file():
        raise ValueError(f"{CONTEXTS} reads your questions: pass --data FILE.jsonl (one question a line, docs/coc.md)"
                         + ("" if root is None else f"; {root} is not a file"))
    lines = read_lines(Path(root))
    if split is not None:
        lines = [ln for ln in lines if split_of(ln.name, CONTEXTS) == split]
    lines = lines[:limit]
    dpi = CONTEXT_DPI if dpi is None else dpi
    made = {"data": str(root), "split": split, "limit": limit, "dpi": dpi}
    return iter(context_items(lines, CONTEXTS, dpi)), made, ""


def load_context_records(root: Union[str, os.PathLike, None] = None) -> list[Record]:
    """The questions as the VLM reader takes them: multi-page records (``Record.pages``), so every ``document`` must
    be a list of page images (a PDF or a text file is read by the OCR readers)."""
    if root is None or not Path(root).is_file():
        raise ValueError(f"{CONTEXTS} reads your questions: pass --data FILE.jsonl (one question a line, docs/coc.md)")
    records = []
    for line in read_lines(Path(root)):
        if not isinstance(line.document, tuple):
            raise ValueError(f"{line.where}: the VLM reads contexts of page images ('document': a list of images); "
                             f"read {line.name} with an OCR reader (--reader tesseract or rapidocr)")
        missing = [p for p in line.document if not p.is_file()]
        if missing:
            raise ValueError(f"{line.where}: document {missing[0]} not found")
        if line.answer_page > len(line.document):
            raise ValueError(f"{line.where}: 'answer_page' {line.answer_page} lies outside the pages "
                             f"1-{len(line.document)}")
        records.append(Record(CONTEXTS, line.id, line.document[line.answer_page - 1], line.name, line.question,
                              line.answers[0], (), answers=line.answers, kind=line.kind,
                              group=line.name, pages=line.document, answer_pages=(line.answer_page - 1,)))
    if len({r.record_id for r in records}) < len(records):
        raise ValueError(f"{root}: an id is used twice")
    return records


CONTEXTS_SPEC = register(DatasetSpec(CONTEXTS, "Your questions over your documents", load_context_records,
                                     contexts=load_contexts, context_options=("dpi",)))
