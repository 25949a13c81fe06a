import math

import pytest
import torch

from arr_coc.eval.metrics import allocation_metrics, box_mask


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
