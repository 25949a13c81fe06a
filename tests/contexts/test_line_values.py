"""The lines' retrieval values: the reranker's order, the next line, a document's title block; no model when model-free."""
import pytest
import torch

from arr_coc.contexts.line_values import front_values, line_values, reranked_values, spread_values, top_lines
from arr_coc.contexts.ranking import retrieval_values


def test_top_lines_ranks_across_pages_with_ties_to_the_earlier_page():
    scores = [torch.tensor([0.2, 0.9]), torch.tensor([]), torch.tensor([0.9, 0.5])]
    assert top_lines(scores, 3) == [(0, 1), (2, 0), (2, 1)]
    assert top_lines(scores, 0) == []


def test_the_reranker_reorders_the_chosen_lines_and_leaves_the_others():
    values = [torch.tensor([1.0, 0.5, 0.25]), torch.tensor([0.75])]
    picked = [(0, 0), (1, 0), (0, 1)]  # the first stage's order: values 1, 0.75, 0.5
    out = reranked_values(values, picked, torch.tensor([-3.0, 0.0, 5.0]), boost=0.0)
    assert [v.tolist() for v in out] == [[0.5, 1.0, 0.25], [0.75]]  # (0, 1) first, (1, 0), then (0, 0)
    same = reranked_values(values, picked, torch.tensor([5.0, 0.0, -3.0]), boost=0.0)
    assert [v.tolist() for v in same] == [v.tolist() for v in values]  # the first stage's own order: unchanged


def test_the_boost_adds_the_rerankers_ramp_scaled_to_one():
    out = reranked_values([torch.tensor([1.0, 0.5, 0.25])], [(0, 0), (0, 1)], torch.tensor([0.0, 1.0]), boost=1.0)
    # (0, 1) best: (1 + 2/2) / 2 = 1; (0, 0): (0.5 + 1/2) / 2 = 0.5; the unpicked line halves: 0.125
    assert out[0].tolist() == [0.5, 1.0, 0.125]


def test_spread_gives_the_next_line_a_share_within_its_page():
    values = [torch.tensor([0.0, 1.0, 0.0, 0.25]), torch.tensor([0.0])]
    assert [v.tolist() for v in spread_values(values, 0.5)] == [[0.0, 1.0, 0.5, 0.25], [0.0]]
    assert [v.tolist() for v in spread_values(values, 0.5, around=True)] == [[0.5, 1.0, 0.5, 0.25], [0.0]]
    assert [v.tolist() for v in spread_values(values, 0.0)] == [v.tolist() for v in values]


def test_the_front_floor_lifts_only_a_first_pages_first_lines():
    values = [torch.tensor([0.0, 0.75, 0.0]), torch.tensor([0.0, 0.0])]
    assert [v.tolist() for v in front_values(values, [True, False], 2, 0.5)] == [[0.5, 0.75, 0.0], [0.0, 0.0]]
    assert [v.tolist() for v in front_values(values, [False, False], 2, 0.5)] == [v.tolist() for v in values]


def test_line_values_without_a_reranker_is_the_retrievers_ramp():
    scores = [torch.tensor([0.9, 0.1, 0.5]), torch.tensor([0.7])]
    asked = []

    def rerank(picked):
        asked.append(picked)
        return torch.zeros(len(picked))

    plain = [v.tolist() for v in retrieval_values(scores, 2)]
    assert [v.tolist() for v in line_values(scores, [False, False], None, top=2, spread=0.0, front_floor=0.0)] == plain
    assert [v.tolist() for v in line_values(scores, [False, False], rerank, top=2, rerank_top=0, spread=0.0,
                                            front_floor=0.0)] == plain
    assert asked == []  # rerank_top 0: the reranker is never asked
    line_values(scores, [False, False], rerank, top=2, rerank_top=2)
    assert asked == [[(0, 0), (1, 0)]]


def test_keep_orders_the_reranked_lines_by_both_stages_and_zero_is_the_logits_alone():
    scores = [torch.tensor([0.9, 0.5, 0.1])]

    def rerank(picked):  # prefers the first stage's worst line, slightly
        return torch.tensor([0.0, 0.1, 0.2])[[i for _, i in picked]]

    kw = dict(top=3, rerank_top=3, boost=0.0, spread=0.0, front_floor=0.0, typed_floor=0.0)
    ramp = line_values(scores, [False], None, **kw)[0]
    assert ramp.tolist() == pytest.approx([1.0, 0.5, 0.0])  # the first stage's ramp
    assert line_values(scores, [False], rerank, keep=0.0, **kw)[0].tolist() == ramp.flip(0).tolist()  # logits' order
    # standardised, logits (-1, 0, 1) and cosines (1, 0, -1) with keep 2: keys (1, 0, -1), the first stage's order
    assert torch.equal(line_values(scores, [False], rerank, keep=2.0, **kw)[0], ramp)


def test_the_page_prior_lifts_a_line_by_its_pages_best_and_zero_changes_nothing():
    scores = [torch.tensor([0.5, 0.45]), torch.tensor([0.9, 0.1])]
    kw = dict(top=3, spread=0.0, front_floor=0.0, typed_floor=0.0)
    plain = line_values(scores, [False, False], page_prior=0.0, **kw)
    assert [v.tolist() for v in plain] == [v.tolist() for v in retrieval_values(scores, 3)]
    assert plain[0][1] > plain[1][1] == 0  # 0.45 on the weak page above 0.1 on the strong one
    lifted = line_values(scores, [False, False], page_prior=1.0, **kw)  # 0.95 against 0.1 + 0.9 = 1.0
    assert lifted[1][1] > lifted[0][1] == 0 and lifted[1][0] == 1.0
