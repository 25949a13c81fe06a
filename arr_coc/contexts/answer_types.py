"""What kind of span a question asks for, and the lines that hold one: a date, a version, a person's name.

A question asked in its user's words often shares nothing with the line that answers it: "Who wrote the package for
smart page references?" is answered by a title page's line "Frank Mittelbach", "Which version is this package
documentation?" by "2019/12/15 v1.7". A retrieval model ranks those lines low (a name or a date says nothing about
the question's topic), but the question names the *type* of its answer. :func:`answer_types` reads that type from
the question's own words (``when`` / ``what date``, ``which version`` / ``what release``, ``who``) and
:func:`typed_lines` finds the lines whose text has that form (a date in numbers or with a month's name, a version
number, a line that is only a person's name); :func:`~arr_coc.contexts.line_values.line_values` floors their values
(``TYPED_FLOOR``, chosen on validation questions: docs/coc.md, "Answer types").

>>> answer_types("Who wrote the package for smart page references?"), answer_types("What does \\\\relax do?")
(('person',), ())
>>> [m.tolist() for m in typed_lines([["2019/12/15 v1.7", "Frank Mittelbach", "The package"]], ("version",))]
[[True, False, False]]
"""
from __future__ import annotations

import re
from typing import Sequence

import torch
from torch import Tensor

from arr_coc.engine.channels.text_layer import without_quotes

Box = tuple[float, float, float, float]  # (y0, x0, y1, x1) px

_MONTH = r"(jan|feb|mar|apr|may|jun|jul|aug|sep|sept|oct|nov|dec)[a-z]*\.?"
_YEAR = r"(1[89]|20)\d\d"
_UPPER, _LOWER = "A-ZÀ-ÖØ-Þ", "a-zß-öø-ÿ'’-"  # Latin-1 letters too: "Gäßlein", "Jürgen"
_WORD = rf"([{_UPPER}][{_LOWER}]+|[{_UPPER}]\.)"
_NAME = rf"{_WORD}(\s+({_WORD}|(van|von|de|der|la|du)(?=\s+[{_UPPER}]))){{1,3}}"
_MARKS = r"[∗*†‡\d]*"

# the question's words that name its answer's type
QUESTION_TYPES: dict[str, re.Pattern[str]] = {
    "date": re.compile(r"^\W*when\b|\b(on|by|until|since|from)\s+what\s+(day|date)\b|\b(what|which)\s+(day|date|year)\b"
                       r"|\bdated\b", re.I),
    "version": re.compile(r"\b(what|which)\s+(version|release)\b|\bthe\s+version\s+(number\s+)?of\b"
                          r"|\bversion\s+(number\s+)?is\b", re.I),
    "person": re.compile(r"\bwho(m)?\b", re.I),
}

# a line holding a span of that type
LINE_TYPES: dict[str, re.Pattern[str]] = {
    "date": re.compile(rf"\b{_YEAR}[-/.](0?[1-9]|1[0-2])[-/.](0?[1-9]|[12]\d|3[01])\b"
                       rf"|\b\d{{1,2}}(st|nd|rd|th)?\s+{_MONTH},?\s+{_YEAR}\b"
                       rf"|\b{_MONTH}\s+(\d{{1,2}}(st|nd|rd|th)?,?\s+)?{_YEAR}\b", re.I),
    "version": re.compile(r"\bv\d+(\.\d+)+[a-z]?\b|\bversion\s+(number\s+)?v?\d+(\.\d+)*[a-z]?\b"
                          r"|\brelease\s+v?\d+(\.\d+)+[a-z]?\b", re.I),
    # the whole line is one to three names of 2-4 capitalised words or initials ("Frank Mittelbach", "by Will
    # Robertson", "Philipp Lehman, Joseph Wright", "Bernd Raichle†"), footnote marks allowed
    "person": re.compile(rf"^(by\s+)?{_NAME}{_MARKS}(\s*(,|and|&)\s*{_NAME}{_MARKS}){{0,2}}$"),
}
TYPES = tuple(QUESTION_TYPES)


def answer_types(question: str) -> tuple[str, ...]:
    """The answer types the question asks for (in :data:`TYPES` order; none for most questions).

    >>> answer_types("When was this release dated?"), answer_types("What happens when the box is full?")
    (('date',), ())
    >>> answer_types("Which version is this?"), answer_types("How many fonts does the bold version get?")
    (('version',), ())
    >>> answer_types('What comes after "the author who wrote"?')  # a quote is the page's words
    ()
    """
    asked = without_quotes(question)  # a quoted phrase is the page's words, not what the question asks for
    return tuple(t for t, p in QUESTION_TYPES.items() if p.search(asked))


def typed_lines(pages: Sequence[Sequence[str]], types: Sequence[str]) -> list[Tensor]:
    """Per page, ``[L_i]`` bool: which of its lines' texts hold a span of any of ``types`` (all False for none).

    >>> [m.tolist() for m in typed_lines([["Released 2022-04-20", "by Will Robertson", "Use \\\\foo here"]],
    ...                                  ("date", "person"))]
    [[True, True, False]]
    """
    unknown = [t for t in types if t not in LINE_TYPES]
    if unknown:
        raise ValueError(f"unknown answer types {unknown}; known: {', '.join(TYPES)}")
    return matching_lines(pages, [LINE_TYPES[t] for t in types])


def matching_lines(pages: Sequence[Sequence[str]], patterns: Sequence[re.Pattern[str]]) -> list[Tensor]:
    """Per page, ``[L_i]`` bool: which of its lines' texts (stripped) any of ``patterns`` finds a match in.

    >>> [m.tolist() for m in matching_lines([["  v1.2 ", "none"]], [re.compile(r"^v\\d")])]
    [[True, False]]
    """
    return [torch.tensor([any(p.search(text.strip()) for p in patterns) for text in page], dtype=torch.bool)
            for page in pages]


def question_typed_lines(question: str, pages: Sequence[Sequence[str]]) -> list[Tensor] | None:
    """:func:`typed_lines` for the types ``question`` asks for (:func:`answer_types`); None where it asks for none,
    so an untyped question makes no pass over the lines.

    >>> question_typed_lines("Who wrote it?", [["by Will Robertson", "Use it"]])[0].tolist()
    [True, False]
    >>> question_typed_lines("What does it do?", [["by Will Robertson"]]) is None
    True
    """
    types = answer_types(question)
    return typed_lines(pages, types) if types else None


# The shape of the answer in the manual's own notation, where the question names it: a command ("Which command
# defines ...", "Which macro gives ..."), a file ("Which file is read ..."), a length ("How wide is ...", "What
# indent ..."). A line holding a token of that shape may be the answer however little else of it meets the question.
_TEX_UNIT = r"(\\p@|pt|em|ex|mm|cm|in|bp|mu|sp|pc|dd|cc)\b"
SHAPES: dict[str, tuple[re.Pattern[str], re.Pattern[str]]] = {
    "command": (re.compile(r"\b(which|what)\s+(?!(does|do|did|is|are|was|were|can|could|should|will|would)\b)"
                           r"([\w-]+\s+){0,2}(command|macro|control\s+sequence|conditional|test|switch)\b", re.I),
                re.compile(r"\\[A-Za-z@]{2,}")),
    "file": (re.compile(r"\b(which|what)\s+(?!(does|do|did|is|are|was|were|can|could|should|will|would)\b)"
                        r"([\w-]+\s+){0,2}file\b", re.I),
             re.compile(r"\b[\w@-]+\.(tex|sty|cls|dtx|cfg|def|fd|ins|lua|ltx|bib|bst|ldf|clo|fdd|txt)\b")),
    "length": (re.compile(r"^\W*(how\s+(wide|tall|high|deep|far|long|much\s+(space|room|gap|vertical|horizontal))"
                          r"|(what|which)\s+(?!(does|do|did|is|are|was|were|can|could|should|will|would)\b)"
                          r"([\w-]+\s+){0,2}(width|height|depth|length|distance|gap|space|spacing|skip"
                          r"|glue|kern|indent|indentation|size|separation))\b", re.I),
               re.compile(rf"-?\d*\.?\d+\s*{_TEX_UNIT}")),
}


def asked_shapes(question: str, shapes: Sequence[str] = tuple(SHAPES)) -> tuple[str, ...]:
    """The answer shapes of ``shapes`` the question names (:data:`SHAPES`; none for most questions).

    >>> asked_shapes("Which command assigns a switch's state?"), asked_shapes("How wide is the rule drawn?")
    (('command',), ('length',))
    >>> asked_shapes('Which file is read for every calendar?'), asked_shapes("Who wrote it?")
    (('file',), ())
    """
    asked = without_quotes(question)
    return tuple(t for t in shapes if SHAPES[t][0].search(asked))


def shaped_lines(question: str, pages: Sequence[Sequence[str]], shapes: Sequence[str] = tuple(SHAPES)
                 ) -> list[Tensor] | None:
    """Per page, ``[L_i]`` bool: the lines holding a token of a shape the question names (:func:`asked_shapes`);
    None where it names none.

    >>> pages = [["\\\\lgblkcircle  black large circle", "a big disc"]]
    >>> shaped_lines("Which macro gives the big disc?", pages)[0].tolist()
    [True, False]
    >>> shaped_lines("What does it do?", [["\\\\relax"]]) is None
    True
    """
    patterns = shape_patterns(question, shapes)
    return None if patterns is None else matching_lines(pages, patterns)


def shaped_words(question: str, words: Sequence[Sequence[tuple[str, Box]]], shapes: Sequence[str] = tuple(SHAPES)
                 ) -> list[list[Box]] | None:
    """Per page, the boxes of the words holding a token of a shape the question names (where a line's retrieval value
    goes: :func:`~arr_coc.contexts.ranking.retrieval_map`); None where it names none. A token set as two words
    ("4 pt") is in no word: its line keeps its value on all of it.

    >>> shaped_words("Which macro gives the big disc?", [[("\\\\lgblkcircle", (0, 0, 9, 40)), ("disc", (0, 50, 9, 70))]])
    [[(0, 0, 9, 40)]]
    >>> shaped_words("What does it do?", [[("\\\\relax", (0, 0, 9, 40))]]) is None
    True
    """
    patterns = shape_patterns(question, shapes)
    if patterns is None:
        return None
    return [[box for text, box in page if any(p.search(text) for p in patterns)] for page in words]


def shape_patterns(question: str, shapes: Sequence[str] = tuple(SHAPES)) -> list[re.Pattern[str]] | None:
    """The token patterns of the shapes of ``shapes`` the question names (:func:`asked_shapes`); None where it names
    none; an unknown shape is refused.

    >>> len(shape_patterns("Which file is read first?")), shape_patterns("Which is read first?")
    (1, None)
    """
    unknown = [t for t in shapes if t not in SHAPES]
    if unknown:
        raise ValueError(f"unknown answer shapes {unknown}; known: {', '.join(SHAPES)}")
    names = asked_shapes(question, shapes)
    return [SHAPES[t][1] for t in names] if names else None
