"""Questions people ask of document pages, made from the text layer, each with its answer's boxes.

Three kinds, each read off the words and lines of a :class:`~arr_coc.documents.page.Context`:

- ``page_number``: "What is the page number?" The answer is the printed folio: a line holding
  only a number (arabic, or lower-case roman as front matter uses) that is the topmost or the
  bottommost line of the page, with nothing else beside it. Its box is that line's box. Over a
  context of 3+ such pages, an arabic folio counts only where folio minus page index is the
  context's most common offset (page numbers run with the pages; a stray code-line number does not).
- ``section_title``: "What is the title of section 3.2?" From numbered headings: a line whose
  first word is a section number (``3``, ``3.2``, ``3.2.1``) followed by words with a letter, set
  larger than the document's body text (the median line size, weighted by words), starting at the
  left edge of the page's text column, and not continued on a next line of the same size. The answer is the title without the number, its box
  the title words' box. Numbers that head two lines of the context are skipped (ambiguous).
- ``next_words``: 'What comes after "..."?' The quoted phrase is the last ``PHRASE_WORDS`` words
  of a body-size line; the answer is the first ``ANSWER_WORDS`` words of the next line (a
  different line, directly below in the same column), so the question never quotes its answer.
  The phrase must occur once in the whole context (as a run of words, across line ends), lines
  ending in a hyphen are passed over (the answer would be half a word), and every word of the
  phrase and of the answer must hold a letter (no dot leaders, contents-list page numbers or
  tables of numbers). Lines are drawn by a generator seeded from the source and page.

A table value ("What is the value in row X, column Y?") needs column structure the text layer
does not mark; it is not generated here.

Every question is checked last: its answer (case-folded) must not occur in its question text.

Over a long context (:func:`context_questions`) a question must point at one page of many:
``page_number`` is left out (every page has one), section numbers and quoted phrases are already
unique in the whole context, and a next-words answer must not occur elsewhere in the context
either, so reading it anywhere but its page cannot score.
Boxes are (y0, x0, y1, x1) in the rendered page's pixels.
"""
from __future__ import annotations

import hashlib
import random
import re
from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from arr_coc.documents.page import Box, Context, Page, union

KINDS = ("page_number", "section_title", "next_words")
PHRASE_WORDS = 4  # long enough to be unique on a page of prose, short enough to read as a quote
ANSWER_WORDS = 3
# Arabic folios, or the lower-case roman numerals (i to xxxix) of front matter.
_FOLIO = re.compile(r"\d{1,4}|(?=[ivx])x{0,3}(?:ix|iv|v?i{0,3})")
_SECTION = re.compile(r"([1-9]\d?(?:\.\d{1,2}){0,3})")
# A heading is set this much larger than body text (LaTeX's \subsection is \large: 12 pt over 10 pt).
HEADING_RATIO = 1.08


@dataclass(frozen=True)
class Question:
    """One question about one page.

    Attributes:
        source: the document it was made from.
        page: 0-based index of the page in the source.
        question: the question text.
        answers: accepted answers (the first is the text as printed).
        boxes: where the answer is on the page, px (y0, x0, y1, x1).
        kind: one of ``KINDS``.
    """

    source: str
    page: int
    question: str
    answers: tuple[str, ...]
    boxes: tuple[Box, ...]
    kind: str


def body_size(ctx: Context) -> float:
    """The body text size of a context, px: the median line size, each line weighted by its words."""
    sizes = [ln.size for p in ctx.pages for ln in p.lines for _ in ln.words]
    return float(np.median(sizes)) if sizes else 0.0


def _folio(page: Page) -> tuple[str, Box] | None:
    """The printed page number and its box, if the topmost or bottommost line is a lone number."""
    if len(page.lines) < 2:
        return None
    boxes = [page.line_box(i) for i in range(len(page.lines))]
    top = min(range(len(boxes)), key=lambda i: boxes[i][0])
    bottom = max(range(len(boxes)), key=lambda i: boxes[i][2])
    for i in (bottom, top):
        text = page.line_text(i)
        if not _FOLIO.fullmatch(text):
            continue
        y0, _, y1, _ = boxes[i]
        beside = [j for j, b in enumerate(boxes) if j != i and b[0] < y1 and b[2] > y0]
        if not beside:  # a number sharing its row with a running head is a header, not a lone folio
            return text, boxes[i]
    return None


def _consistent_folios(ctx: Context) -> dict[int, tuple[str, Box]]:
    """Each page's folio, keeping arabic ones only where folio - page index agrees with most pages.

    A lone number at the foot of one page may be a code line's number; printed page numbers run with
    the pages. With fewer than 3 arabic folios there is nothing to agree with and all are kept.
    """
    found = {p.index: f for p in ctx.pages if (f := _folio(p))}
    offsets = Counter(int(t) - i for i, (t, _) in found.items() if t.isdigit())
    if sum(offsets.values()) < 3:
        return found
    offset = offsets.most_common(1)[0][0]
    return {i: (t, b) for i, (t, b) in found.items() if not t.isdigit() or int(t) - i == offset}


def _headings(page: Page, body: float) -> Iterable[tuple[str, str, Box]]:
    """(number, title, title box) of each numbered heading on a page."""
    lefts = [page.line_box(i)[1] for i, ln in enumerate(page.lines) if abs(ln.size - body) < 0.1 * body]
    if not lefts:
        return
    # The text column's left edge: where most body lines start (indents, margin notes and centred lines
    # are fewer), found to within 1 % of the page width.
    step = 0.01 * page.size[1]
    column = Counter(round(x / step) for x in lefts).most_common(1)[0][0] * step
    for i, line in enumerate(page.lines):
        words = [page.words[w] for w in line.words]
        if len(words) < 2 or len(words) > 14 or line.size < HEADING_RATIO * body:
            continue
        # Headings start at the column edge (or hang their number left of it); a centred
        # "15 February 2006" on a title page does neither.
        if min(abs(words[0].box[1] - column), abs(words[1].box[1] - column)) > 0.02 * page.size[1]:
            continue
        m = _SECTION.fullmatch(words[0].text)
        # A wide gap ends the title: what follows is a margin note set on the heading's line.
        end = next((k for k in range(2, len(words)) if words[k].box[1] - words[k - 1].box[3] > 1.5 * line.size),
                   len(words))
        words = words[:end]
        title = " ".join(w.text for w in words[1:])
        if not m or not re.search(r"[A-Za-z]", title) or ". ." in title:
            continue
        nxt = page.lines[i + 1] if i + 1 < len(page.lines) else None
        if nxt and abs(nxt.size - line.size) < 0.05 * line.size and not _SECTION.fullmatch(page.words[nxt.words[0]].text):
            continue  # the title may run on to the next line: its answer would be cut
        yield m.group(1), title, union([w.box for w in words[1:]])


def _below(a: Box, b: Box, size: float) -> bool:
    """Whether line box ``b`` sits directly below line box ``a`` in the same column."""
    gap = b[0] - a[2]
    overlap = min(a[3], b[3]) - max(a[1], b[1])
    return -0.2 * size < gap < 1.2 * size and overlap > 0.5 * min(a[3] - a[1], b[3] - b[1])


def _rng(source: str, page: int, seed: int) -> random.Random:
    """A generator for one page that does not depend on the order pages are visited in."""
    return random.Random(hashlib.sha256(f"{seed}:{source}:{page}".encode()).hexdigest())


def _next_words(page: Page, body: float, ngrams: Counter, rng: random.Random, n: int) -> list[Question]:
    """Up to ``n`` next-words questions from one page (see the module docstring)."""
    out = []
    order = list(range(len(page.lines) - 1))
    rng.shuffle(order)
    for i in order:
        if len(out) == n:
            break
        a, b = page.lines[i], page.lines[i + 1]
        if len(a.words) < PHRASE_WORDS + 2 or len(b.words) < ANSWER_WORDS + 1:
            continue
        if abs(a.size - body) > 0.1 * body or abs(b.size - body) > 0.1 * body:
            continue
        if not _below(page.line_box(i), page.line_box(i + 1), body):
            continue
        phrase = tuple(page.words[w].text for w in a.words[-PHRASE_WORDS:])
        answer_words = [page.words[w] for w in b.words[:ANSWER_WORDS]]
        if phrase[-1].endswith("-") or ngrams[phrase] != 1:
            continue
        # Words with letters only: dot leaders, page numbers of a contents list and code tables
        # make phrases nobody would quote.
        if not all(re.search(r"[^\W\d_]", w) for w in (*phrase, *(w.text for w in answer_words))):
            continue
        q = f'What comes after "{" ".join(phrase)}"?'
        out.append(Question(page.source, page.index, q, (" ".join(w.text for w in answer_words),),
                            (union([w.box for w in answer_words]),), "next_words"))
    return out


def _word_ngrams(ctx: Context, n: int) -> Counter:
    """Counts of every run of ``n`` words in the context, across line and page ends."""
    words = [w.text for p in ctx.pages for w in p.words]
    return Counter(tuple(words[i:i + n]) for i in range(len(words) - n + 1))


def leaks(q: Question) -> bool:
    """Whether any answer occurs in its question (case-folded): such a question is never emitted.

    >>> leaks(Question("s", 0, 'What comes after "a b"?', ("b",), ((0, 0, 1, 1),), "next_words"))
    True
    """
    text = q.question.casefold()
    return any(a.casefold() in text for a in q.answers)


def questions(ctx: Context, kinds: Sequence[str] = KINDS, per_page: int = 1, seed: int = 0) -> list[Question]:
    """The questions of a context, page by page, in ``kinds`` order within a page.

    Args:
        ctx: pages with words and lines (images are not needed).
        kinds: which kinds to make.
        per_page: at most this many next-words questions per page (the other kinds have one answer).
        seed: varies which lines next-words questions quote.
    """
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise ValueError(f"unknown question kind(s) {bad}; choose from {', '.join(KINDS)}")
    body = body_size(ctx)
    heads = {p.index: list(_headings(p, body)) for p in ctx.pages} if "section_title" in kinds else {}
    numbers = Counter(num for hs in heads.values() for num, _, _ in hs)
    ngrams = _word_ngrams(ctx, PHRASE_WORDS) if "next_words" in kinds else Counter()
    folios = _consistent_folios(ctx) if "page_number" in kinds else {}
    out: list[Question] = []
    for page in ctx.pages:
        made: list[Question] = []
        for kind in kinds:
            if kind == "page_number":
                folio = folios.get(page.index)
                if folio:
                    made.append(Question(page.source, page.index, "What is the page number?", (folio[0],),
                                         (folio[1],), kind))
            elif kind == "section_title":
                for num, title, box in heads[page.index]:
                    if numbers[num] == 1:
                        made.append(Question(page.source, page.index, f"What is the title of section {num}?",
                                             (title,), (box,), kind))
            else:
                made.extend(_next_words(page, body, ngrams, _rng(page.source, page.index, seed), per_page))
        out.extend(q for q in made if not leaks(q))
    return out


CONTEXT_KINDS = ("section_title", "next_words")


def context_questions(ctx: Context, n: int, seed: int = 0, kinds: Sequence[str] = CONTEXT_KINDS) -> list[Question]:
    """Up to ``n`` questions over a whole context, each pointing at one page (see the module docstring).

    Drawn with a generator seeded from the source and ``seed``, at most one per page while pages
    remain, so the answers spread over the context; returned in page order.
    """
    bad = [k for k in kinds if k not in CONTEXT_KINDS]
    if bad:
        raise ValueError(f"kind(s) {bad} do not point at one page of a context; choose from {', '.join(CONTEXT_KINDS)}")
    text = " ".join(w.text for p in ctx.pages for w in p.words).casefold()
    pool = [q for q in questions(ctx, kinds, per_page=2, seed=seed) if text.count(q.answers[0].casefold()) == 1]
    rng = random.Random(hashlib.sha256(f"{seed}:{ctx.source}".encode()).hexdigest())
    rng.shuffle(pool)
    picked: list[Question] = []
    used: set[int] = set()
    for q in pool + pool:  # first one per page, then the rest
        if len(picked) == n:
            break
        if q in picked or (q.page in used and len(used) < len({p.page for p in pool})):
            continue
        picked.append(q)
        used.add(q.page)
    return sorted(picked, key=lambda q: (q.page, q.question))
