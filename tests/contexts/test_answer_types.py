"""Answer types: a question that asks for a date, a version or a person, and the lines that hold one."""
from __future__ import annotations

import importlib

import pytest
import torch

from arr_coc import ARR, ARRConfig
from arr_coc.config import MVP_CHANNELS, TextureConfig
from arr_coc.contexts import allocate
from arr_coc.contexts.answer_types import TYPES, answer_types, asked_shapes, shaped_lines, shaped_words, typed_lines
from arr_coc.contexts.line_values import TYPED_FLOOR, line_values
from arr_coc.contexts.ranking import rank_cells, retrieval_map, text_parts
from arr_coc.documents.text_pages import TextLayout, render_text
from arr_coc.engine.query import HashingQueryEncoder


@pytest.mark.parametrize("question, types", [
    ("Who wrote the package for smart page references?", ("person",)),
    ("Besides its main author, who wrote the citation back-link package?", ("person",)),
    ("When was the experimental bit-vector package released?", ("date",)),
    ("On what date did this release of the argument-parsing package come out?", ("date",)),
    ("When is the manual dated?", ("date",)),
    ("Which version of the box-size package is this?", ("version",)),
    ("What release is the draft-detection package?", ("version",)),
    ("What is the version of the key-value package?", ("version",)),
    # controls: the same words in questions that ask for something else
    ("What happens when the box is full?", ()),
    ("How many fonts does the heavy version get by default?", ()),
    ("Which command registers a fresh family of marks?", ()),
    ("How wide is the rule?", ()),
    ('What comes after "the author who wrote"?', ()),  # the quote is the page's words
    ('Who wrote "the float package"?', ("person",)),  # the words outside it still ask
])
def test_the_question_names_its_answers_type(question, types):
    assert answer_types(question) == types


@pytest.mark.parametrize("kind, hits, misses", [
    ("date", ["2019-12-17", "Released 2022-04-20", "12 December 1995", "January 19, 2023", "\\date{2016/05/16}",
              "last revised March 2021"],
     ["The 2019 edition", "Section 12.3.4", "12/40 of the width", "v1.7"]),
    ("version", ["2019/12/15 v1.7", "Version 3.84", "This file has version number v1.15, last revised",
                 "release 2.1b"], ["The version of the font", "12.5pt", "Section 1.2"]),
    ("person", ["Frank Mittelbach", "by Will Robertson", "Philipp Lehman, Joseph Wright", "Bernd Raichle†",
                "Timothy Van Zandt", "D. E. Knuth", "Hubert Gäßlein"],
     ["Frank", "The package provides hooks.", "\\ProvidesPackage{amsxtra}", "frank mittelbach",
      "Frank Mittelbach wrote this package in 1995"]),
])
def test_lines_of_each_type_and_lines_that_only_look_like_one(kind, hits, misses):
    flags = typed_lines([hits, misses], (kind,))
    assert flags[0].tolist() == [True] * len(hits)
    assert flags[1].tolist() == [False] * len(misses)


def test_no_type_flags_no_line_and_an_unknown_type_is_refused():
    assert [m.tolist() for m in typed_lines([["2019/12/15 v1.7", "Frank Mittelbach"], []], ())] == [[False, False], []]
    with pytest.raises(ValueError, match=r"unknown answer types \['colour'\]; known: date, version, person"):
        typed_lines([["a"]], ("colour",))
    assert TYPES == ("date", "version", "person")


def test_typed_lines_pass_the_top_of_the_line_values_and_mismatched_pages_are_refused():
    scores = [torch.tensor([0.9, 0.8, 0.1]), torch.tensor([0.2])]
    typed = [torch.tensor([False, False, True]), torch.tensor([False])]
    plain = line_values(scores, [False, False], top=2, spread=0.0)
    lifted = line_values(scores, [False, False], top=2, spread=0.0, typed=typed)
    assert plain[0][2] == 0.0 and plain[0][0] == 1.0  # the third line is outside the top 2
    assert TYPED_FLOOR == 1.5  # above the best retrieved line's 1
    assert [v.tolist() for v in lifted] == [[1.0, plain[0][1].item(), 1.5], [0.0]]  # only the typed line moves
    assert [v.tolist() for v in line_values(scores, [False, False], top=2, spread=0.0, typed=typed,
                                            typed_floor=1.0)] == [[1.0, plain[0][1].item(), 1.0], [0.0]]  # a tie
    assert [v.tolist() for v in line_values(scores, [False, False], top=2, spread=0.0, typed=typed,
                                            typed_floor=0.0)] == [v.tolist() for v in plain]  # floor 0: off
    with pytest.raises(ValueError, match="typed lines"):
        line_values(scores, [False, False], typed=[torch.tensor([True])])


SMALL = TextLayout(size=14, width=420, height=280, margin=14)  # 15 x 10 cells of 28 px


def _manual() -> str:
    filler = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor " * 5
    return f"{filler}\nthe package wrote its hooks\n{filler}\n\nFrank Mittelbach\n\n{filler}"


def _word_cells(out, words: tuple[str, ...]) -> tuple[int, set[tuple[int, int]]]:
    """The page holding ``words`` and the cells they touch."""
    for p in out.pages:
        boxes = [b for w, b in p.words if w in words]
        if boxes:
            return p.index, {(y, x) for y0, x0, y1, x1 in boxes for y in range(int(y0) // 28, (int(y1) - 1) // 28 + 1)
                             for x in range(int(x0) // 28, (int(x1) - 1) // 28 + 1)}
    raise AssertionError(f"{words} were not set on any page")


def _author_cells(out) -> tuple[int, set[tuple[int, int]]]:
    """The page holding the author line and the cells its two words touch."""
    return _word_cells(out, ("Frank", "Mittelbach"))


def test_a_who_question_sends_the_name_line_at_full_resolution(monkeypatch):
    ctx = render_text(_manual(), SMALL)
    arr = ARR(ARRConfig(texture=TextureConfig(channels=MVP_CHANNELS)), query_encoder=HashingQueryEncoder()).eval()
    question = "Who wrote the package?"
    out = allocate(arr, ctx, question, 60)
    page, cells = _author_cells(out)
    assert page > 0  # not the first page: the title-block floor plays no part
    sent = {tuple(c) for c in out.pages[page].plan.cells.tolist()}
    assert out.tokens == 60 and cells <= sent
    # control: without the typed floor the line sharing the question's words takes the saccades, not the name
    monkeypatch.setattr(importlib.import_module("arr_coc.contexts.allocate"), "question_typed_lines",
                        lambda question, pages: typed_lines(pages, ()))
    blind = allocate(arr, ctx, question, 60)
    assert blind.tokens == 60 and not cells <= {tuple(c) for c in blind.pages[page].plan.cells.tolist()}


@pytest.mark.parametrize("question, shapes", [
    ("Which command registers a fresh family of marks?", ("command",)),
    ("Which internal macro typesets the title line of a major division?", ("command",)),
    ("What test tells whether a macro is a dimension register?", ("command",)),
    ("Which source file covers defining author-level macros?", ("file",)),
    ("How wide is the reference rule drawn to show the target width?", ("length",)),
    ("What indent do the list items get?", ("length",)),
    ("What negative mu spacing is put between repeated integrals?", ("length",)),
    ("Which vertical skip follows a chapter's title?", ("length",)),
    # controls: commands, files and lengths mentioned, but not asked for
    ("What does the command print?", ()),
    ("Who wrote the file?", ()),
    ("How many fonts does the bold version get?", ()),
    ('What comes after "which command"?', ()),  # the quote is the page's words
])
def test_the_question_names_its_answers_shape(question, shapes):
    assert asked_shapes(question) == shapes


def test_shaped_lines_are_raised_before_the_ramp_and_mismatches_are_refused():
    question = "Which command sets the gap between columns?"
    pages = [["The gap between columns is set as follows", "\\setcolumngap{<length>}", "see the gap below"]]
    shaped = shaped_lines(question, pages)
    assert [m.tolist() for m in shaped] == [[False, True, False]]
    assert shaped_lines("What does the gap do?", pages) is None and shaped_lines(question, pages, ("file",)) is None
    scores = [torch.tensor([0.8, 0.7, 0.75])]  # the command's line ranks last on its cosine
    raised = line_values(scores, [False], top=1, spread=0.0, shaped=shaped)
    plain = line_values(scores, [False], top=1, spread=0.0, shaped=shaped, shape_boost=0.0)
    assert [v.tolist() for v in raised] == [[0.0, 1.0, 0.0]] and [v.tolist() for v in plain] == [[1.0, 0.0, 0.0]]
    with pytest.raises(ValueError, match="shaped lines"):
        line_values(scores, [False], shaped=[torch.tensor([True])])
    with pytest.raises(ValueError, match="unknown answer shapes \\['url'\\]; known: command, file, length"):
        shaped_lines(question, pages, ("url",))


def test_a_which_command_question_sends_the_commands_line_at_full_resolution(monkeypatch):
    filler = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor " * 5
    ctx = render_text(f"{filler}\nthe gap between columns is discussed in a later chapter\n{filler}\n\n"
                      f"\\colsep{{<length>}}\nset the space between columns\n\n{filler}", SMALL)
    arr = ARR(ARRConfig(texture=TextureConfig(channels=MVP_CHANNELS)), query_encoder=HashingQueryEncoder()).eval()
    question = "Which command sets the gap between columns?"  # the prose line shares more of its words
    out = allocate(arr, ctx, question, 44)
    page, cells = _word_cells(out, ("\\colsep{<length>}",))
    sent = {tuple(c) for c in out.pages[page].plan.cells.tolist()}
    assert out.tokens == 44 and cells <= sent
    # control: without the shapes the line sharing the question's words takes the saccades, not the command
    monkeypatch.setattr(importlib.import_module("arr_coc.contexts.allocate"), "shaped_lines",
                        lambda question, pages: None)
    blind = allocate(arr, ctx, question, 44)
    assert blind.tokens == 44 and not cells <= {tuple(c) for c in blind.pages[page].plan.cells.tolist()}


def _command_lines(n: int) -> tuple[list, list]:
    """``n`` lines of a command (2 cells wide) and its prose (8 cells), one line per row of 28 px cells."""
    words, lines = [], []
    for i in range(n):
        y0, y1 = 28.0 * i + 4, 28.0 * i + 24
        words += [(f"\\cmd{'abc'[i]}", (y0, 0.0, y1, 56.0)), ("lorem ipsum dolor", (y0, 60.0, y1, 280.0))]
        lines.append((f"\\cmd{'abc'[i]} lorem ipsum dolor", (y0, 0.0, y1, 280.0)))
    return words, lines


def test_a_shaped_line_gives_its_value_to_its_commands_words_and_not_its_prose():
    words, lines = _command_lines(3)
    values = [torch.tensor([1.0, 0.75, 0.5])]
    question = "Which command draws the frame?"
    assert shaped_words(question, [words]) == [[words[0][1], words[2][1], words[4][1]]]
    part = text_parts(28, [(84, 280)], [torch.zeros(3, 10)], [words], [lines], question, retrieved=values)[0]
    assert part.retrieval.tolist() == [[v] * 2 + [0.0] * 8 for v in (1.0, 0.75, 0.5)]
    # the six best cells hold the three commands; painting whole lines, the first line's prose takes them
    best = {tuple(c) for c in rank_cells([part.retrieval], 6)[0].tolist()}
    assert best == {(r, c) for r in range(3) for c in range(2)}
    whole = text_parts(28, [(84, 280)], [torch.zeros(3, 10)], [words], [lines], question, retrieved=values,
                       rest=1.0)[0]
    assert whole.retrieval.tolist() == [[v] * 10 for v in (1.0, 0.75, 0.5)]
    assert {tuple(c) for c in rank_cells([whole.retrieval], 6)[0].tolist()} == {(0, c) for c in range(6)}
    # control: a question naming no shape paints whole lines; rest 0.25 keeps a quarter on the prose
    plain = text_parts(28, [(84, 280)], [torch.zeros(3, 10)], [words], [lines], "What draws the frame?",
                       retrieved=values)[0]
    assert shaped_words("What draws the frame?", [words]) is None and torch.equal(plain.retrieval, whole.retrieval)
    assert retrieval_map(lines, values[0], (84, 280), 28, tokens=[words[0][1]], rest=0.25)[0].tolist() == \
        [1.0, 1.0] + [0.25] * 8
    # a line whose token is set as two words ("4 pt") holds no shaped word: it keeps its whole value
    assert retrieval_map(lines, values[0], (84, 280), 28, tokens=[], rest=0.0).tolist() == whole.retrieval.tolist()
    with pytest.raises(ValueError, match="0 <= tail, rest <= 1"):
        retrieval_map(lines, values[0], (84, 280), 28, rest=1.5)
