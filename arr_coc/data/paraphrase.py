"""Questions in a user's own words over the LaTeX manuals: ``texlive-paraphrase``, written by hand.

Each question was written by reading one page of a manual of the corpus's train, validation or
test split (:mod:`arr_coc.documents.corpus`, split by document family; a manual's split is the
corpus's, never chosen here) and asks for a short span printed on that page the way a user
would ask for it: the question shares no content word with its answer and quotes no phrase of
the page (:mod:`arr_coc.data.paraphrase_rules`). It comes with a window of the document, up to 20
pages that hold the answer page, so that it is asked of a context, not of the page. The window is
not chosen by hand: :func:`window_for` gives the whole manual when it has at most 20 pages and
otherwise draws the window's first page, uniformly among those whose window holds the answer page,
from a hash of ``WINDOW_SEED``, the document and the question, so where in its window an answer
lies does not follow from how the set was written.

The questions ship as ``arr_coc/data/questions/texlive-paraphrase.jsonl``, one object a line::

    {"id": "val-001", "split": "val", "document": "latex/amscls/amsmidx.pdf", "pages": "1-3",
     "answer_page": 1, "question": "Who wrote ...?", "answers": ["Barbara Beeton"], "kind": "front"}

``document`` is the PDF's path under the corpus's doc root, ``pages`` a 1-based range inside the
document, ``answer_page`` the answer's page in the document (1-based, inside ``pages``),
``answers`` the accepted answers exactly as printed. Kinds (``KINDS``): ``front`` (title page:
title, author, version, date), ``name`` (an option, command, environment or file from what it
does), ``value`` (defaults, lengths, units, numbers), ``fact`` (who, which, when), ``table`` (a
table cell, a contents line), ``listing`` (what a code listing or example holds).

The ``train`` questions (250 over 42 train manuals, at most 6 a manual, written under the same rules) are for
learning from: nothing is chosen on them and no table reports them; ``val`` chooses, ``test`` reports.

``python -m arr_coc.data.paraphrase_stats`` prints the counts of both hand-written sets (this
one and :mod:`arr_coc.data.image_paraphrase`).
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Union

from arr_coc.data.datasets import SPLITS, DatasetSpec, Record, register

QUESTIONS = Path(__file__).with_name("questions")
TEXLIVE_FILE = QUESTIONS / "texlive-paraphrase.jsonl"
KINDS = ("front", "name", "value", "fact", "table", "listing")
WINDOW = 20  # pages of a question's context (fewer where the manual is shorter)
WINDOW_SEED = 0  # of the draw that places a window over a long manual (window_for)


@dataclass(frozen=True)
class WindowQuestion:
    """One hand-written question over a window of pages of one manual.

    Attributes:
        id: unique in the set, e.g. ``val-001``.
        split: the corpus's split of the manual (``val`` or ``test``).
        document: the PDF's path under the corpus's doc root.
        path: the PDF on this machine.
        pages: (first, last) page of the window, 1-based, inclusive.
        answer_page: the answer's page in the document, 1-based, inside ``pages``.
        question: the question.
        answers: the accepted answers, as printed on the answer page.
        kind: one of ``KINDS``.
    """

    id: str
    split: str
    document: str
    path: Path
    pages: tuple[int, int]
    answer_page: int
    question: str
    answers: tuple[str, ...]
    kind: str

    @property
    def page_range(self) -> str:
        """The window as ``look --pages`` takes it, e.g. ``"3-22"``."""
        return f"{self.pages[0]}-{self.pages[1]}"


def window_for(document: str, n_pages: int, answer_page: int, question: str,
               seed: int = WINDOW_SEED) -> tuple[int, int]:
    """The window (first, last page, 1-based) of a question on ``answer_page`` of a manual of ``n_pages``.

    A manual of at most ``WINDOW`` pages is its own window. Over a longer one the window's first page
    is drawn uniformly from those that keep the answer page and the whole window inside the manual,
    by a hash of ``seed``, ``document`` and ``question``: an answer deep in a long manual falls on any
    of the window's pages alike, and the draw is the same on every machine.

    Example:
        >>> window_for("a.pdf", 8, 5, "Who?")
        (1, 8)
        >>> window_for("a.pdf", 100, 1, "Who?"), window_for("a.pdf", 100, 100, "Who?")
        ((1, 20), (81, 100))
        >>> first, last = window_for("a.pdf", 100, 50, "Who?"); last - first + 1, first <= 50 <= last
        (20, True)
    """
    if not 1 <= answer_page <= n_pages:
        raise ValueError(f"answer page {answer_page} lies outside the document's {n_pages} pages")
    if n_pages <= WINDOW:
        return 1, n_pages
    rng = random.Random(hashlib.sha256(f"{seed}:{document}:{question}".encode()).hexdigest())
    first = rng.randint(max(1, answer_page - WINDOW + 1), min(answer_page, n_pages - WINDOW + 1))
    return first, first + WINDOW - 1


def _text(obj: dict, key: str, where: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{where}: {key!r} must be a non-empty string, got {value!r}")
    return value


def parse_window_question(obj: Any, where: str, root: Path) -> WindowQuestion:
    """One line's object as a :class:`WindowQuestion`; a bad field raises one line starting with ``where``.

    Example:
        >>> q = parse_window_question({"id": "a", "split": "val", "document": "x.pdf", "pages": "2-5",
        ...     "answer_page": 3, "question": "Who?", "answers": ["Me"], "kind": "fact"}, "f:1", Path("/d"))
        >>> q.path, q.pages, q.page_range
        (PosixPath('/d/x.pdf'), (2, 5), '2-5')
        >>> parse_window_question({**q.__dict__, "pages": "2-5", "answer_page": 9}, "f:1", Path("/d"))
        Traceback (most recent call last):
        ...
        ValueError: f:1: 'answer_page' 9 lies outside the window 2-5
    """
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    split, document, kind = _text(obj, "split", where), _text(obj, "document", where), _text(obj, "kind", where)
    if split not in SPLITS:
        raise ValueError(f"{where}: 'split' must be one of {', '.join(SPLITS)}, got {split!r}")
    if kind not in KINDS:
        raise ValueError(f"{where}: 'kind' must be one of {', '.join(KINDS)}, got {kind!r}")
    m = re.fullmatch(r"(\d+)-(\d+)", str(obj.get("pages", "")))
    if not m or not 1 <= int(m[1]) <= int(m[2]):
        raise ValueError(f"{where}: 'pages' must be a 1-based range FIRST-LAST, got {obj.get('pages')!r}")
    pages = (int(m[1]), int(m[2]))
    at = obj.get("answer_page")
    if isinstance(at, bool) or not isinstance(at, int):
        raise ValueError(f"{where}: 'answer_page' must be a whole page number, got {at!r}")
    if not pages[0] <= at <= pages[1]:
        raise ValueError(f"{where}: 'answer_page' {at} lies outside the window {pages[0]}-{pages[1]}")
    answers = obj.get("answers")
    if not isinstance(answers, list) or not answers or not all(isinstance(a, str) and a.strip() for a in answers):
        raise ValueError(f"{where}: 'answers' must be a non-empty list of non-empty strings, got {answers!r}")
    return WindowQuestion(_text(obj, "id", where), split, document, root / document, pages, at,
                          _text(obj, "question", where), tuple(answers), kind)


def read_jsonl(path: Path) -> list[tuple[str, Any]]:
    """(``FILE:LINE``, object) for every non-blank line; malformed JSON raises one line naming it."""
    out = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                out.append((f"{path}:{n}", json.loads(line)))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: malformed JSON ({e})") from None
    return out


def texlive_paraphrase(split: str | None = None, *, path: Union[str, os.PathLike, None] = None,
                       root: Union[str, os.PathLike, None] = None) -> list[WindowQuestion]:
    """The hand-written questions of ``split`` (``train``, ``val``, ``test``; None: all), in file order.

    Args:
        split: keep only this split.
        path: the JSONL file (default: the shipped ``TEXLIVE_FILE``).
        root: the corpus's doc root the documents are named under (default: the installed corpus's).

    Raises:
        ValueError: a bad line (naming it), a repeated id, or an unknown split.
        MissingDependencyError: a manual is not installed (the corpus's Debian packages).
    """
    from arr_coc.documents.corpus import DOC_ROOT, PACKAGES
    from arr_coc.errors import MissingDependencyError

    if split is not None and split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
    base = DOC_ROOT if root is None else Path(root)
    out, seen = [], set()
    for where, obj in read_jsonl(Path(path) if path is not None else TEXLIVE_FILE):
        q = parse_window_question(obj, where, base)
        if q.id in seen:
            raise ValueError(f"{where}: id {q.id!r} is used twice")
        seen.add(q.id)
        if split is None or q.split == split:
            out.append(q)
    missing = sorted({q.document for q in out if not q.path.is_file()})
    if missing:
        raise MissingDependencyError(f"{len(missing)} manual(s) not found under {base}, e.g. {missing[0]}; install "
                                     f"the Debian packages {' '.join(PACKAGES)} (make setup)")
    return out


def load_texlive_paraphrase(root: Path | None = None, *, split: str | None = None) -> list[Record]:
    """The questions as records: ``image`` is the PDF, ``image_id`` names the document and window, ``group`` its
    family, ``answer_pages`` the answer's 0-based page in the document.

    ``root`` is a JSONL file of the same form instead of the shipped one (None: the shipped set).
    """
    from arr_coc.documents.corpus import family_of

    return [Record(TEXLIVE_PARAPHRASE.name, q.id, q.path, f"{q.document}#{q.page_range}", q.question, q.answers[0],
                   (), answers=q.answers, metric=TEXLIVE_PARAPHRASE.metric, kind=q.kind,
                   group=family_of(q.document), answer_pages=(q.answer_page - 1,))
            for q in texlive_paraphrase(split, path=root)]


def paraphrase_context_set(root: Path | None = None, *, split: str | None = None, limit: int | None = None,
                           seed: int = 0, dpi: float | None = None, source: str | None = None) -> tuple[Any, dict, str]:
    """The questions as contexts for the OCR readers: each window of a manual one context, the answer found on its
    page's text layer (every occurrence a candidate; none found: the find reading).

    ``source``: ``pdf`` (None; the window rendered at ``dpi``) or ``text`` (the window's text layer re-set on pages,
    :func:`text_windows`; rows in the output's ``text`` subfolder). A window whose text the re-set font cannot draw
    is left out of the text source with a warning and listed in the returned settings' ``skipped``
    (:func:`drawable_windows`).
    """
    from arr_coc.data.context_jsonl import ContextLine, context_items
    from arr_coc.data.contexts import CONTEXT_DPI, CONTEXT_SOURCES
    from arr_coc.documents.corpus import family_of

    if source not in (None, *CONTEXT_SOURCES):
        raise ValueError(f"unknown context source {source!r}; choose one of {', '.join(CONTEXT_SOURCES)}")
    qs = texlive_paraphrase(split, path=root)[:limit]
    dpi = CONTEXT_DPI if dpi is None else dpi
    made = {"split": split, "limit": limit, "dpi": dpi, "data": None if root is None else str(root)}
    if source == "text":
        read = window_texts(qs, dpi)
        kept, skipped = drawable_windows(qs, read)
        return text_windows(kept, dpi, read), {**made, "source": "text", **({"skipped": skipped} if skipped else {})}, \
            "text"
    lines = [ContextLine(q.id, q.id, q.path, q.page_range, q.question, q.answers, q.answer_page, kind=q.kind,
                         name=q.document) for q in qs]
    items = context_items(lines, TEXLIVE_PARAPHRASE.name, dpi, require_found=False)
    for item in items:
        item.group = family_of(item.group)
    return iter(items), made, ""


SLACK_WORDS = 3  # a word wider than the column is broken when re-set: the answer page's words may shift by a few


def window_texts(qs: list[WindowQuestion], dpi: float) -> dict[tuple[str, str], tuple[list[str], list[int]]]:
    """Each window's text layer: (document, page range) -> (each page's text, its page number), read once."""
    from arr_coc.documents.pdf import read_pdf

    out: dict[tuple[str, str], tuple[list[str], list[int]]] = {}
    for q in qs:
        if (q.document, q.page_range) not in out:
            pdf = read_pdf(q.path, pages=q.page_range, dpi=dpi, render=False)
            out[q.document, q.page_range] = [p.text for p in pdf.pages], [p.index + 1 for p in pdf.pages]
    return out


def drawable_windows(qs: list[WindowQuestion], read: dict) -> tuple[list[WindowQuestion], list[dict]]:
    """The questions whose window's text the re-set font can draw, and the windows it cannot (each with its questions
    and the characters it lacks; warned about in one line): such a window cannot be re-set (:func:`layout_text`
    refuses it), so its questions are left out of the text source and said to be, not failed mid-run."""
    import warnings

    from arr_coc.documents.text_pages import TextLayout, undrawable

    asked = {(q.document, q.page_range) for q in qs}
    missing = {key: undrawable("\n".join(texts)) for key, (texts, _) in read.items() if key in asked}
    bad = {key for key, chars in missing.items() if chars}
    skipped = [{"window": f"{d}#{r}", "questions": sum((q.document, q.page_range) == (d, r) for q in qs),
                "missing_characters": len(missing[d, r])} for d, r in sorted(bad)]
    if skipped:
        which = "; ".join(f"{s['window']}: {s['missing_characters']} characters" for s in skipped)
        warnings.warn(f"{len(skipped)} window(s) left out of the re-set text ({sum(s['questions'] for s in skipped)} "
                      f"questions): the font {TextLayout().font!r} cannot draw their characters ({which})",
                      stacklevel=2)
    return [q for q in qs if (q.document, q.page_range) not in bad], skipped


def text_windows(qs: list[WindowQuestion], dpi: float, read: dict | None = None) -> Iterator[Any]:
    """Each window's text layer re-set on pages (``render_text``, as ``texlive-contexts --source text`` sets a
    document), one context per window, made as they are taken (``read``: the windows' texts from
    :func:`window_texts`, else read here).

    A question's answer page is where the words of its PDF page were set: the first re-set page whose share of
    them holds the answer (every occurrence there a candidate), else the one holding most of them (no boxes: the
    find reading). Every re-set page is kept (a 20-page window sets on ~35), so no answer is cut off.
    """
    from arr_coc.data.context_jsonl import find_answer
    from arr_coc.data.contexts import ContextItem, ContextQuestion
    from arr_coc.documents.corpus import family_of
    from arr_coc.documents.text_pages import TextLayout, layout_text, render_text

    groups: dict[tuple[str, str], list[WindowQuestion]] = {}
    for q in qs:
        groups.setdefault((q.document, q.page_range), []).append(q)
    for (document, window), group in groups.items():
        texts, numbers = (read or window_texts(group, dpi))[document, window]
        joined, name = "\n".join(texts), f"{document} (text)"
        setting = layout_text(joined, TextLayout(), name)  # where every word goes; pages drawn when needed
        starts = [0]
        for placed in setting.placed:
            starts.append(starts[-1] + len(placed))
        questions = []
        for q in group:
            at = numbers.index(q.answer_page)
            w0 = sum(len(t.split()) for t in texts[:at])
            w1 = w0 + len(texts[at].split())
            spans = [(i, max(starts[i], w0 - SLACK_WORDS), min(starts[i + 1], w1 + SLACK_WORDS))
                     for i in range(len(setting))]
            spans = [sp for sp in spans if sp[1] < sp[2]]
            page, found = max(spans, key=lambda sp: sp[2] - sp[1])[0], ()
            for i, lo, hi in spans:
                words = setting.page(i).words[lo - starts[i]: hi - starts[i]]
                found = tuple(find_answer(words, q.answers))
                if found:
                    page = i
                    break
            questions.append(ContextQuestion(q.id, q.question, q.answers, (page,), (), q.kind, found=found))
        yield ContextItem(TEXLIVE_PARAPHRASE.name, f"{document}#{window}#text",
                          lambda t=joined, n=name: render_text(t, TextLayout(), n), questions, family_of(document))


# whole contexts without answer boxes (the boxes are found on the text layer when a context is read)
TEXLIVE_PARAPHRASE = register(DatasetSpec("texlive-paraphrase", "TeX Live paraphrased questions",
                                          load_texlive_paraphrase, splits="official", reader="vlm",
                                          contexts=paraphrase_context_set, context_options=("dpi", "source"),
                                          documents_of="texlive"))

