"""The ranking's retrieval part: a question in its own words finds its line where word matching finds another."""
import torch

from arr_coc.contexts.ranking import line_scores, rank_cells, ranking_score, text_parts
from arr_coc.engine.retrieval import load_retriever

CELL = 28
QUESTION = "Which option changes the character between the integer and fractional parts?"
# the answer's line shares no content word with the question; the other line shares two
ANSWER = "decimalsymbol=comma  prints a comma as the decimal separator"
WORDY = "Each chapter has parts and the option list is long"
LINES = [(ANSWER, (28.0, 0.0, 50.0, 560.0)), (WORDY, (112.0, 0.0, 134.0, 560.0))]
SIZE = (280, 560)  # one page of 10 x 20 cells


def chosen_rows(retriever_name: str, retrieval_weight: float = 8.0) -> set[int]:
    """The cell rows of the page's best 20 cells (one line's width) when the lines are ranked by the retriever."""
    r = load_retriever(retriever_name)
    scores = line_scores([r.passages([t for t, _ in LINES])], r.queries([QUESTION])[0])
    words = [(w, b) for t, b in LINES for w in t.split()[:1]]  # no word of either line matches the question
    parts = text_parts(CELL, [SIZE], [torch.zeros(10, 20)], [words], [LINES], QUESTION, scores, top=1)
    cells = rank_cells([ranking_score(p, retrieval_weight=retrieval_weight) for p in parts], 20)[0]
    return set(cells[:, 0].tolist())


def test_the_default_retriever_puts_the_saccades_on_the_paraphrased_line():
    r = load_retriever()
    s = (r.passages([ANSWER, WORDY]) @ r.queries([QUESTION])[0]).tolist()
    assert s[0] > s[1] + 0.03, s  # 0.635 against 0.576 here
    assert chosen_rows(r.name) == {1}  # y 28-50 px: the answer's line, row 1


def test_word_overlap_puts_them_on_the_line_sharing_more_words():
    """The control: hashed words (what matching words does) rank the other line first."""
    assert chosen_rows("hashing") == {4}  # y 112-134 px: row 4


def test_without_the_retrieval_weight_neither_line_is_preferred():
    rows = chosen_rows(load_retriever().name, retrieval_weight=0.0)
    assert rows == {0}  # every cell ties at 0: the first 20 cells in reading order, row 0
