"""The reranked coupling: the cross-encoder puts the saccades on a paraphrased line that word overlap ranks below."""
import torch

from arr_coc.contexts.line_values import line_values
from arr_coc.contexts.ranking import line_scores, rank_cells, ranking_score, text_parts
from arr_coc.engine.query import HashingQueryEncoder
from arr_coc.engine.retrieval import cross_encoder, load_retriever

CELL = 28
QUESTION = "When was this version released?"
ANSWER = "2019/12/17 v2.1"  # shares no word with the question
WORDY = "This version of the manual"  # shares two
LINES = [(ANSWER, (28.0, 0.0, 50.0, 560.0)), (WORDY, (112.0, 0.0, 134.0, 560.0))]
SIZE = (280, 560)  # one page of 10 x 20 cells


def chosen_rows(rerank) -> set[int]:
    """The cell rows of the page's best 20 cells (one line's width): lines first ranked by hashed words (the
    model-free retriever), then, with ``rerank``, both reordered by it."""
    h = load_retriever("hashing")
    scores = line_scores([h.passages([t for t, _ in LINES])], h.queries([QUESTION])[0])
    values = line_values(scores, [False], rerank, top=1, rerank_top=2, boost=0.0, spread=0.0, front_floor=0.0)
    words = [(w, b) for t, b in LINES for w in t.split()[-1:]]  # no word of either line matches the question
    parts = text_parts(CELL, [SIZE], [torch.zeros(10, 20)], [words], [LINES], QUESTION, retrieved=values)
    cells = rank_cells([ranking_score(p) for p in parts], 20)[0]
    return set(cells[:, 0].tolist())


def test_the_cross_encoder_puts_the_saccades_on_the_paraphrased_line():
    r = load_retriever()
    logits = r.rerank(QUESTION, [ANSWER, WORDY]).tolist()
    assert logits[0] > logits[1] + 3.0, logits  # -0.21 against -6.55 here
    assert chosen_rows(lambda picked: r.rerank(QUESTION, [LINES[i][0] for _, i in picked])) == {1}  # y 28-50: row 1


def test_word_overlap_alone_puts_them_on_the_line_sharing_more_words():
    """The control: the hashing retriever's order, not reranked, ranks the other line first."""
    assert chosen_rows(None) == {4}  # y 112-134 px: row 4


def test_a_model_free_retriever_has_no_reranker_and_a_model_retriever_loads_it_on_first_use():
    assert not hasattr(load_retriever("hashing"), "rerank")
    from arr_coc.engine.pipeline import ARR

    assert not hasattr(ARR(query_encoder=HashingQueryEncoder()).retriever, "rerank")
    r = load_retriever()
    assert r._reranker is None
    r.rerank(QUESTION, [ANSWER])
    assert r._reranker is cross_encoder()  # the process's one cross-encoder, which the text channels read too
