"""The ranking's retrieval part: a question in its own words finds its line where word matching finds another."""
from types import SimpleNamespace

import pytest
import torch

from arr_coc.contexts.allocate import allocate, allocate_images, image_placing, question_scores
from arr_coc.contexts.line_embeddings import LineEmbeddings
from arr_coc.contexts.ranking import (
    BM25_WEIGHT,
    bm25_line_scores,
    fuse_bm25,
    line_scores,
    rank_cells,
    ranking_score,
    text_parts,
)
from arr_coc.engine.pipeline import ARR
from arr_coc.engine.query import HashingQueryEncoder
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


# A question naming its package (a rare word, printed on the answer's line) whose closest line in meaning answers nothing
MAINTAINER = "Who maintains xcolor?"
NAMED = "xcolor: Dr. Uwe Kern"
VAGUE = "The maintainer of the colour package is named in its readme"


def test_bm25_line_scores_are_bm25s_over_the_context_lines_split_by_page():
    import bm25s

    pages = [[NAMED, VAGUE], [], ["xcolor and xcolor again"]]
    got = bm25_line_scores(pages, MAINTAINER)
    assert [len(g) for g in got] == [2, 0, 1]
    index = bm25s.BM25()  # the same index by hand: every line of the context a document, the question's known words
    index.index(bm25s.tokenize([NAMED, VAGUE, "xcolor and xcolor again"], stopwords="en", show_progress=False),
                show_progress=False)
    assert torch.equal(torch.cat(got), torch.tensor(index.get_scores(["xcolor"]), dtype=torch.float32))
    assert got[0][0] > 0 and got[0][1] == 0 and got[2][0] > got[0][0]  # twice the word in a shorter line ranks higher
    assert [g.tolist() for g in bm25_line_scores(pages, "Which typeface?")] == [[0.0, 0.0], [], [0.0]]  # no word
    assert [g.tolist() for g in bm25_line_scores([[], []], MAINTAINER)] == [[], []]


def test_fuse_bm25_adds_the_weight_times_bm25_over_the_context_best():
    cos, bm = [torch.tensor([0.5, 0.75]), torch.tensor([0.25])], [torch.tensor([4.0, 0.0]), torch.tensor([2.0])]
    assert [s.tolist() for s in fuse_bm25(cos, bm, 0.25)] == [[0.5 + 0.25, 0.75], [0.25 + 0.125]]  # exact in binary
    for unchanged in (fuse_bm25(cos, bm, 0.0), fuse_bm25(cos, [torch.zeros(2), torch.zeros(1)], 0.25)):
        assert all(a is b for a, b in zip(unchanged, cos))


def test_bm25_fused_into_the_line_scores_moves_the_named_line_first_and_the_cosine_alone_does_not():
    arr = SimpleNamespace(retriever=load_retriever())
    lines = [[(NAMED, (0.0, 0.0, 20.0, 200.0))], [(VAGUE, (40.0, 0.0, 60.0, 560.0))]]  # a page each: passages alone
    emb = LineEmbeddings.see(arr.retriever, lines)
    cosine = torch.cat(question_scores(arr, emb, lines, MAINTAINER))  # the default: no BM25
    fused = torch.cat(question_scores(arr, emb, lines, MAINTAINER, bm25_weight=0.05))
    assert BM25_WEIGHT == 0.0 and cosine[1] > cosine[0] + 0.02  # the control: the retriever's cosine prefers VAGUE
    assert torch.equal(fused, cosine + torch.tensor([0.05, 0.0]))  # NAMED holds the context's best BM25
    assert fused[0] > fused[1]
    for bad in (-0.05, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=r"bm25_weight must be a finite number >= 0, got "):
            question_scores(arr, emb, lines, MAINTAINER, bm25_weight=bad)


@pytest.mark.parametrize("weights, name", [
    ({"bm25_weight": -0.05}, "bm25_weight"),
    ({"bm25_weight": float("nan"), "retrieval_weight": 0.0}, "bm25_weight"),  # checked though no line is scored
    ({"retrieval_weight": float("nan")}, "retrieval_weight"),
    ({"text_weight": float("inf")}, "text_weight"),
    ({"page_weight": -1.0}, "page_weight"),
    ({"near_weight": -4}, "near_weight"),
    ({"image_retrieval_weight": -0.5}, "image_retrieval_weight"),
])
def test_a_ranking_weight_below_0_or_not_finite_is_refused_before_the_context_is_opened(tmp_path, weights, name):
    arr, missing = ARR(query_encoder=HashingQueryEncoder()), tmp_path / "missing.pdf"
    with pytest.raises(FileNotFoundError, match="no such PDF"):  # the control: good weights reach the context
        allocate(arr, missing, "What is the total?", "100")
    with pytest.raises(ValueError, match=rf"^{name} must be a finite number >= 0, got "):
        allocate(arr, missing, "What is the total?", "100", **weights)


def test_one_image_weights_are_refused_before_the_image_is_seen():
    arr = ARR(query_encoder=HashingQueryEncoder())
    with pytest.raises(ValueError, match=r"^bm25_weight must be a finite number >= 0, got -1.0$"):
        allocate_images(arr, [torch.rand(3, 56, 56)], ["What is the total?"], "10", bm25_weight=-1.0)
    with pytest.raises(ValueError, match=r"^image_retrieval_weight must be a finite number >= 0, got nan$"):
        allocate_images(arr, [torch.rand(3, 56, 56)], ["What is the total?"], "10", image_retrieval_weight=float("nan"))
    with pytest.raises(ValueError, match=r"^weight must be a finite number >= 0, got -1.0$"):
        image_placing(arr, None, None, "What is the total?", weight=-1.0)  # refused before the scene is read
    assert len(allocate_images(arr, [torch.rand(3, 56, 56)], ["What is the total?"], "10")) == 1  # control


def test_numpy_weights_are_numbers_and_checked_as_such():
    import numpy as np

    from arr_coc.contexts.allocate import check_ranking_weights

    check_ranking_weights(retrieval_weight=np.float32(8.0), bm25_weight=np.float64(0.05))  # numpy's scalars pass
    with pytest.raises(ValueError, match=r"^bm25_weight must be a finite number >= 0, got "):
        check_ranking_weights(bm25_weight=np.float32("nan"))
    with pytest.raises(TypeError, match=r"^page_weight must be a number, got tensor\(2\.\) \(Tensor\)$"):
        check_ranking_weights(page_weight=torch.tensor(2.0))
