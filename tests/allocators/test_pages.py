"""retrieval_pages: whole pages in the retriever's order at exact totals; the order is the retriever's, not fixed."""
from __future__ import annotations

import pytest
from word_retriever import WordRetriever

from arr_coc.allocators.methods import METHODS, methods_for, page_plans
from arr_coc.allocators.pages import PagesInputs
from arr_coc.engine.views import downsampled_grid
from arr_coc.eval.context_methods import RetrievalPages
from arr_coc.eval.reading import rendered_tokens

GRIDS = [(4, 5), (3, 3), (6, 2)]  # 20 + 9 + 12 = 41 cells


def plans_of(order, total):
    return {i: (p.kind, p.native) for i, p in page_plans("retrieval_pages", PagesInputs(GRIDS, retrieval_order=order),
                                                          total).items()}


def test_retrieval_pages_is_a_context_method_of_the_registry_and_the_ocr_tables():
    entry = METHODS.get("retrieval_pages")
    assert entry.scopes == ("context",) and entry.needs == ("text",) and not entry.uses_scorer
    assert methods_for("ocr", scope="context")[-2:] == ("bm25_pages", "retrieval_pages")
    assert "retrieval_pages" not in methods_for("vlm", scope="context")


def test_whole_pages_in_the_retrievers_order_send_exactly_the_budget():
    # pages 1 and 2 whole (9 + 12 = 21 tokens): exactly T, page 0 gets nothing
    assert plans_of([1, 2, 0], 21) == {1: ("full", None), 2: ("full", None)}
    plans = page_plans("retrieval_pages", PagesInputs(GRIDS, retrieval_order=[1, 2, 0]), 21)
    assert sum(rendered_tokens(p) for p in plans.values()) == 21
    # T = 30: the 9 tokens left downscale page 0 (4 x 5 cells) onto what its grid holds of them
    assert plans_of([1, 2, 0], 30) == {1: ("full", None), 2: ("full", None), 0: ("native", 9)}
    plans = page_plans("retrieval_pages", PagesInputs(GRIDS, retrieval_order=[1, 2, 0]), 30)
    assert sum(rendered_tokens(p) for p in plans.values()) == 21 + downsampled_grid(4, 5, 9)[0] * \
        downsampled_grid(4, 5, 9)[1]
    assert plans_of([0, 1, 2], 41) == {i: ("full", None) for i in range(3)}  # every page fits at full resolution


def test_the_plan_follows_the_retrievers_order_and_a_different_order_gives_a_different_plan():
    lines = [["apples and pears", "lantern"], ["river notes"], ["the brass key is under the mat", "pears"]]
    retriever = WordRetriever()
    pages = RetrievalPages(retriever, lines)
    key, pears = pages.rank("where is the brass key"), pages.rank("apples")
    assert key[0] == 2 and pears[0] == 0 and retriever.passage_calls == 1  # the lines embedded once for both
    assert plans_of(key, 15) == {2: ("full", None), 0: ("native", 3)}
    assert plans_of(pears, 15) == {0: ("native", 15)}  # control: another question, another order, another plan
    # the same pages in reading order (first_pages) send page 0 first whatever the question asks
    first = {i: (p.kind, p.native) for i, p in page_plans("first_pages", PagesInputs(GRIDS), 15).items()}
    assert first == plans_of([0, 1, 2], 15) != plans_of(key, 15)


def test_a_page_scores_its_best_line_and_a_page_without_lines_ranks_last():
    pages = RetrievalPages(WordRetriever(), [[], ["river"], ["mat", "brass key"], ["   "]])
    scores = pages.scores("brass key")
    assert scores[2] == pytest.approx(1.0) and scores[1] == 0.0 and scores[0] == scores[3] == float("-inf")
    assert pages.rank("brass key") == [2, 1, 0, 3]  # ties keep reading order


def test_retrieval_pages_without_an_order_says_what_it_needs():
    with pytest.raises(ValueError, match=r"method 'retrieval_pages' needs the pages' retrieval order"):
        page_plans("retrieval_pages", PagesInputs(GRIDS, order=[2, 0, 1]), 30)
