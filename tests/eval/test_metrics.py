"""Every metric: box coverage of the saccades, and the answer metrics on hand-computed values."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from arr_coc.eval.metrics import (
    ANSWER_METRICS,
    allocation_metrics,
    anls,
    answer_score,
    box_mask,
    contains_score,
    normalize_text,
    relaxed_accuracy,
    vqa_accuracy,
    vqa_normalize,
)


def chosen_map(hc, wc, cells):
    m = torch.zeros(hc, wc, dtype=torch.bool)
    for y, x in cells:
        m[y, x] = True
    return m


def test_box_mask_counts_fractional_pixels_and_unions_overlaps():
    m = box_mask([(0.5, 0.5, 2.5, 1.0), (1.0, 0.0, 2.0, 3.0)], 3, 3)
    expected = torch.tensor([[0.25, 0.0, 0.0], [1.0, 1.0, 1.0], [0.25, 0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(m, expected)


def test_box_mask_clips_boxes_outside_the_canvas():
    assert box_mask([(-5, -5, 1, 1), (10, 10, 20, 20)], 4, 4).sum() == 1.0


def test_coverage_of_a_box_straddling_four_cells():
    # cell 10 px; answer box (5, 5)-(15, 25) covers 10 x 20 px over cells (0,0),(0,1),(0,2),(1,0),(1,1),(1,2)
    target = [(5.0, 5.0, 15.0, 25.0)]
    m = allocation_metrics(chosen_map(3, 3, [(0, 0), (1, 1)]), 10, target)
    # area in cell (0,0): 5x5=25; in cell (1,1): 5x10=50; total 200
    assert m.coverage == pytest.approx(75 / 200)
    assert m.hit == 0.0
    assert m.iou == pytest.approx(2 / 6)


def test_full_coverage_hits_and_iou_counts_extra_cells():
    target = [(0.0, 0.0, 10.0, 10.0)]
    m = allocation_metrics(chosen_map(2, 2, [(0, 0), (1, 1)]), 10, target)
    assert (m.coverage, m.hit, m.iou) == (1.0, 1.0, 0.5)


def test_region_wise_coverage_target_secondary_peripheral():
    # 4x4 cells of 10 px; target = top-left cell, secondary = bottom-right cell
    target, others = [(0, 0, 10, 10)], [(30, 30, 40, 40), (0, 0, 10, 10)]  # an "other" equal to the target
    m = allocation_metrics(chosen_map(4, 4, [(0, 0), (3, 3), (2, 2)]), 10, target, others)
    assert m.coverage == 1.0 and m.secondary == 1.0  # the overlap with the target is not counted twice
    assert m.peripheral == pytest.approx(100 / (1600 - 200))


def test_empty_regions_are_nan_not_zero():
    m = allocation_metrics(chosen_map(2, 2, [(0, 0)]), 10, [], [])
    assert math.isnan(m.coverage) and math.isnan(m.hit) and math.isnan(m.secondary)
    assert m.peripheral == pytest.approx(0.25)


# ----------------------------------------------------------------------------- answer metrics
def test_normalize_text_casefolds_and_collapses_whitespace():
    assert normalize_text("  TOTAL\t 42.00\n") == "total 42.00"


def test_anls_on_hand_computed_cases():
    assert anls("TOTAL 42.00", "total 42.00") == 1.0
    assert anls("42.0O", "42.00") == pytest.approx(0.8)  # 1 edit / 5 chars
    assert anls("21/11/26", "21/11/2026") == pytest.approx(0.8)  # 2 deletions / 10 chars
    assert anls("2l/1", "21/11/2026") == 0.0  # NL = 7/10 >= 0.5
    assert anls("abcde", "abxyz") == 0.0  # NL = 3/5 = 0.6 >= tau
    assert anls("abcd", "abxy") == 0.0  # NL = 0.5 is not < tau: cut to 0
    assert anls("abcd", "abxy", tau=0.6) == pytest.approx(0.5)
    assert anls("", "") == 1.0 and anls("", "42") == 0.0 and anls("42", "") == 0.0
    assert anls("42.00", ["total", "42.00"]) == 1.0  # max over ground truths
    with pytest.raises(ValueError, match="at least one"):
        anls("x", [])


def test_contains_score_ignores_neighbouring_words_but_not_misreadings():
    assert contains_score("Date: 21/11/2026", "21/11/2026") == 1.0
    assert anls("Date: 21/11/2026", "21/11/2026") == pytest.approx(0.625)  # 6 edits / 16 chars
    assert contains_score("Date: 21/11/2O26 due", "21/11/2026") == pytest.approx(0.9)
    assert contains_score("TOTAL 42 .00", "42.00") == pytest.approx(5 / 6)  # n+1 window "42 .00": 1 edit / 6
    assert contains_score("foo bar baz", "42.00") == 0.0
    assert contains_score("", "42.00") == 0.0 and contains_score("", "") == 1.0


@settings(max_examples=200, deadline=None)
@given(st.text("ab .", max_size=12), st.text("ab .", max_size=8))
def test_contains_score_is_never_below_anls(prediction, answer):
    assert contains_score(prediction, answer) >= anls(prediction, answer)


def test_vqa_accuracy_averages_min_matches_over_three_over_leave_one_out_subsets() -> None:
    ten = ["nokia"] * 6 + ["noika"] * 3 + ["phone"]
    assert vqa_accuracy("Nokia", ten) == 1.0  # 6 matches: every subset of 9 holds >= 5
    # "noika": leaving out one of its 3 leaves 2 (2/3), leaving out any of the 7 others leaves 3 (1)
    assert vqa_accuracy("noika", ten) == pytest.approx((3 * 2 / 3 + 7 * 1) / 10)
    # "phone": its own subset has 0 matches, the other 9 have 1 (1/3)
    assert vqa_accuracy("phone", ten) == pytest.approx(9 * (1 / 3) / 10)
    assert vqa_accuracy("samsung", ten) == 0.0
    assert vqa_accuracy("the two", ["2"] * 10) == 1.0  # articles dropped, number words to digits
    assert vqa_normalize("yes!") == "yes" and vqa_normalize("isnt") == "isn't" and vqa_normalize("a.m.") == "am"


def test_relaxed_accuracy_allows_five_percent_on_numbers_and_exact_otherwise() -> None:
    assert relaxed_accuracy("104.9", "100") == 1.0 and relaxed_accuracy("105.1", "100") == 0.0
    assert relaxed_accuracy("-95.5", "-100") == 1.0 and relaxed_accuracy("95", "-100") == 0.0
    assert relaxed_accuracy("Yes", "yes") == 1.0 and relaxed_accuracy("Yes.", "yes") == 0.0
    assert relaxed_accuracy("45%", "0.45") == 1.0 and relaxed_accuracy("45%", "45") == 0.0
    assert relaxed_accuracy("1", ["2", "1.02"]) == 1.0


def test_answer_score_follows_the_record_metric() -> None:
    assert ANSWER_METRICS.keys() == {"anls", "contains", "vqa_accuracy", "relaxed_accuracy"}
    assert answer_score("anls", "12/03/199", ["12/03/1998"]) == pytest.approx(0.9)  # 1 edit in 10 chars
    assert answer_score("anls", "12/03", ["12/03/1998"]) == 0.0  # NL 0.5 reaches tau
    # contains: the reading score, neighbouring words forgiven, the best reference counts
    assert answer_score("contains", "Date: 12/03/199", ["x", "12/03/1998"]) == pytest.approx(0.9)
    assert answer_score("anls", "Date: 12/03/199", ["x", "12/03/1998"]) == pytest.approx(1 - 7 / 15)  # 6 + 1 edits
    assert answer_score("contains", "Date: 12/03/199", ["x"]) == 0.0
    with pytest.raises(ValueError, match=r"at least one"):
        answer_score("contains", "a", [])
    with pytest.raises(ValueError, match=r"unknown answer metric 'bleu'; known: anls, contains, vqa_accuracy"):
        answer_score("bleu", "a", ["a"])
