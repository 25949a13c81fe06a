"""Specification tests for arr_coc.engine.soft_topk: exact-K soft weights, honest gradients, smooth coverage."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tolerances import assert_close_reduction, assert_far

from arr_coc.engine.samplers import topk_cells
from arr_coc.engine.soft_topk import coverage_loss, soft_topk, standardized_soft_topk


@settings(max_examples=50, deadline=None)
@given(
    b=st.integers(1, 3),
    n=st.integers(1, 60),
    data=st.data(),
    temperature=st.sampled_from([1e-3, 0.05, 0.5, 5.0]),
    seed=st.integers(0, 2**31 - 1),
)
def test_soft_topk_rows_sum_to_k_with_weights_in_unit_interval(b, n, data, temperature, seed):
    k = data.draw(st.integers(1, n))
    scores = torch.randn(b, n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 3
    w = soft_topk(scores, k, temperature)
    assert w.shape == (b, n) and w.dtype == torch.float64
    assert torch.allclose(w.sum(1), torch.full((b,), float(k), dtype=torch.float64), atol=1e-9)
    assert bool(((w >= 0) & (w <= 1)).all())
    # Higher scores never get less weight.
    order = scores.argsort(1)
    assert bool((w.gather(1, order).diff(dim=1) >= -1e-12).all())


def test_soft_topk_float32_rows_sum_to_k():
    w = soft_topk(torch.randn(4, 2304), 273, 0.05)
    assert w.dtype == torch.float32
    assert torch.allclose(w.sum(1), torch.full((4,), 273.0), rtol=1e-5)


def test_soft_topk_approaches_the_hard_mask_at_low_temperature():
    scores = torch.tensor([[0.3, 2.0, -1.0, 1.5, 0.9]])
    w = soft_topk(scores, 2, temperature=1e-3)
    assert torch.allclose(w, torch.tensor([[0.0, 1.0, 0.0, 1.0, 0.0]]), atol=1e-6)


def test_soft_topk_passes_gradcheck_in_float64():
    scores = torch.randn(2, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0), requires_grad=True)
    assert torch.autograd.gradcheck(lambda s: soft_topk(s, 2, 0.7), (scores,))
    assert torch.autograd.gradcheck(lambda s: soft_topk(s, 5, 0.2), (scores,))


def test_soft_topk_gradient_keeps_the_sum_fixed():
    scores = torch.randn(3, 10, dtype=torch.float64, requires_grad=True)
    w = soft_topk(scores, 4, 0.5)
    (grad,) = torch.autograd.grad(w.sum(), scores)
    assert torch.allclose(grad, torch.zeros_like(grad), atol=1e-12)  # sum(w) = k whatever the scores


def test_straight_through_forward_is_the_hard_topk_mask_with_a_soft_gradient():
    rel = torch.rand(2, 5, 6, generator=torch.Generator().manual_seed(2), requires_grad=True)
    w = soft_topk(rel.flatten(1), 7, 0.1, straight_through=True)
    hard = topk_cells(rel.detach(), 7).mask(5, 6).flatten(1).float()
    assert torch.equal(w, hard)
    target = torch.zeros(2, 30)
    target[:, :10] = 1.0
    (w * target).sum().backward()
    assert rel.grad is not None and rel.grad.abs().sum() > 0


def test_gumbel_noise_is_deterministic_for_a_seed():
    scores = torch.zeros(2, 50)

    def draw(seed):
        return soft_topk(scores, 5, 0.1, gumbel=True, generator=torch.Generator().manual_seed(seed))

    assert torch.equal(draw(7), draw(7))
    assert not torch.equal(draw(7), draw(8))
    assert torch.allclose(draw(7).sum(1), torch.full((2,), 5.0))
    hard = soft_topk(scores, 5, 0.1, gumbel=True, generator=torch.Generator().manual_seed(7), straight_through=True)
    assert torch.equal(hard.sum(1), torch.full((2,), 5.0)) and set(hard.unique().tolist()) == {0.0, 1.0}


def test_soft_topk_with_k_equal_to_n_selects_everything():
    assert torch.equal(soft_topk(torch.randn(2, 4), 4), torch.ones(2, 4))


@pytest.mark.parametrize(
    "scores, k, temperature, match",
    [
        (torch.zeros(2, 4), 0, 0.1, "k=0"),
        (torch.zeros(2, 4), 5, 0.1, "k=5"),
        (torch.zeros(2, 4), 2, 0.0, "temperature"),
        (torch.tensor([[0.0, float("nan")]]), 1, 0.1, "NaN"),
        (torch.zeros(4), 1, 0.1, r"\[B, N\]"),
    ],
)
def test_soft_topk_rejects_bad_arguments(scores, k, temperature, match):
    with pytest.raises(ValueError, match=match):
        soft_topk(scores, k, temperature)


def test_coverage_loss_penalises_starved_strata():
    w = torch.zeros(2, 4, 4)
    w[0, :2, :2] = 1.0  # image 0: everything in one stratum of a 2x2 grid -> 3 empty strata
    w[1] = 0.25  # image 1: mass 1 in every stratum -> covered
    assert coverage_loss(w, grid=(2, 2), reduction="none").tolist() == [3.0, 0.0]
    assert coverage_loss(w, grid=(2, 2)).item() == 1.5
    assert coverage_loss(w, grid=(2, 2), min_mass=2.0, reduction="none").tolist() == [3 * 2.0**2, 4 * 1.0**2]


def test_coverage_loss_ignores_strata_without_valid_cells():
    valid = torch.zeros(1, 4, 6, dtype=torch.bool)
    valid[0, :, :4] = True  # padded image: strata split its 4x4 extent
    w = torch.where(valid, 0.25, 0.0)
    assert coverage_loss(w, grid=(2, 2), valid=valid).item() == 0.0
    valid[0, :2, 2:4] = False  # the top-right stratum loses all its cells: no longer counted
    assert coverage_loss(w, grid=(2, 2), valid=valid).item() == 0.0
    assert coverage_loss(w, grid=(2, 2), valid=valid, min_mass=2.0).item() == 3 * 1.0**2
    # A grid finer than the canvas only counts occupied strata: 4 rows x 6 cols occupied, mass 0.25 or 0.
    assert coverage_loss(torch.full((1, 4, 6), 0.25), grid=(8, 8)).item() == 24 * 0.75**2


def test_coverage_loss_passes_gradcheck_in_float64():
    w = torch.rand(2, 5, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(1), requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: coverage_loss(x, grid=(2, 3), min_mass=3.0), (w,))


def test_coverage_loss_gradient_flows_to_scores_through_soft_topk():
    rel = torch.zeros(1, 8, 8)
    rel[0, :2, :2] = 5.0
    rel.requires_grad_(True)
    w = soft_topk(rel.flatten(1), 8, 0.5).view(1, 8, 8)
    coverage_loss(w, grid=(2, 2), min_mass=2.0).backward()
    # Descending the loss must raise the scores of starved strata relative to the crowded one.
    assert rel.grad[0, 4:, 4:].mean() < 0 < rel.grad[0, :2, :2].mean()


def test_standardized_soft_topk_is_soft_topk_of_population_z_scores_and_ignores_scale_and_offset():
    g = torch.Generator().manual_seed(3)
    scores = torch.randn(2, 9, generator=g, dtype=torch.float64)
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, 6:] = False
    w = standardized_soft_topk(scores, 3, 0.3, mask)
    real = scores[1, :6]
    z = (real - real.mean()) / real.std(unbiased=False)  # population std: the spread of the row itself
    # float64: the masked standardisation (mean, variance, divide) and the bisection's sum of 9 sigmoids; a
    # threshold off by one rounding moves w by up to |z| / temperature roundings
    atol = assert_close_reduction(w[1, :6], soft_topk(z[None], 3, 0.3)[0], reduction_len=9, depth=5,
                                  scale=float(z.abs().max()) / 0.3)
    assert_far(w[1, :6], soft_topk(((real - real.mean()) / real.std())[None], 3, 0.3)[0], atol=atol)
    assert torch.equal(w[1, 6:], torch.zeros(3, dtype=torch.float64))
    moved = 7 * scores - 4  # its z-scores carry roundings of |7 s - 4| / (7 std) instead of |z|
    assert_close_reduction(standardized_soft_topk(moved, 3, 0.3, mask), w, reduction_len=9, depth=6,
                           scale=float(moved.abs().max() / (7 * scores.std(unbiased=False))) / 0.3)
    assert torch.allclose(w.sum(1), torch.full((2,), 3.0, dtype=torch.float64))
