"""Tests for training the samplers' own parameters (their `loss` methods, `sampler_loss`, and the pieces)."""
from __future__ import annotations

import pytest
import torch
from tolerances import assert_close_reduction

from arr_coc.engine.learned_samplers import (
    SPREAD_WEIGHT,
    AdaptiveStratifiedSampler,
    PseudoLogPolarSampler,
    bin_coverage_loss,
    coverage_share,
    log_polar_scores,
    sampler_loss,
    score_function_surrogate,
)
from arr_coc.engine.samplers import SAMPLERS, Sampler
from arr_coc.engine.selection import rank_cells
from arr_coc.engine.soft_topk import soft_topk
from arr_coc.engine.stratified import coarsen_grid, stratified_cells


def padded_problem(seed: int = 0):
    """Two images on a 10 x 12 canvas (the second padded to 10 x 8) with an answer box each."""
    g = torch.Generator().manual_seed(seed)
    valid = torch.ones(2, 10, 12, dtype=torch.bool)
    valid[1, :, 8:] = False
    rel = torch.rand(2, 10, 12, generator=g).masked_fill(~valid, float("nan"))  # padding must never matter
    target = torch.zeros(2, 10, 12)
    target[0, 1:3, 8:11] = 1.0
    target[1, 6:9, 0:3] = 0.5
    return rel, valid, target, torch.randn(2, 384, generator=g)


def band_task() -> tuple[torch.Tensor, torch.Tensor]:
    """Relevance and target `[2, 16, 16]`: the answer is a full row (image 0) or column (image 1).

    A strong distractor in the corner takes top-K; the answer line is only locally the most relevant, so
    each stratum crossing it contributes one answer cell: with K = 16 the best grid is 2 x 8 for the row
    and 8 x 2 for the column (8 of 16 answer cells), while the initial 4 x 4 covers 4.
    """
    rel, target = torch.zeros(16, 16), torch.zeros(16, 16)
    rel[:4, :4] = 1.0
    rel[12, :], target[12, :] = 0.3, 1.0
    return torch.stack((rel, rel.T)), torch.stack((target, target.T))


def grid_shares(rel, valid, target, k, grids) -> torch.Tensor:
    """Hard stratified coverage shares `[B, n]` of each image under its grids `[B, n, 2]`."""
    rows = []
    for r, v, t, g in zip(rel, valid, target, grids):
        masks = [stratified_cells(r[None], k, v[None], coarsen_grid(v[None], k, gi[None])).mask(*r.shape) for gi in g]
        rows.append(coverage_share(torch.cat(masks).float(), t.expand(len(g), -1, -1)))
    return torch.stack(rows)


@pytest.mark.parametrize("name", SAMPLERS.names())
def test_every_sampler_gets_no_loss_or_a_finite_one_that_trains_all_its_parameters(name):
    sampler = SAMPLERS.get(name)()
    rel, valid, target, query = padded_problem()
    gen = torch.Generator().manual_seed(0)
    loss = sampler_loss(sampler, rel, valid, query, target, [30, 24], generator=gen)  # grids differ in reward
    params = list(sampler.parameters())
    if loss is None:
        assert not params
        return
    assert loss.ndim == 0 and bool(torch.isfinite(loss))
    loss.backward()
    assert all(p.grad is not None and bool(torch.isfinite(p.grad).all()) for p in params)
    assert sum(float(p.grad.abs().sum()) for p in params) > 0


def test_frozen_samplers_get_no_loss_and_unknown_trainable_ones_are_refused():
    rel, valid, target, query = padded_problem()
    assert sampler_loss(PseudoLogPolarSampler(n_bins=8).requires_grad_(False), rel, valid, query, target, 5) is None
    custom = Sampler()
    custom.weight = torch.nn.Parameter(torch.ones(1))
    with pytest.raises(TypeError, match="no training loss for Sampler"):
        sampler_loss(custom, rel, valid, query, target, 5)


def test_a_trainable_sampler_is_trained_through_its_own_loss_method():
    rel, valid, target, query = padded_problem()

    class Gained(Sampler):  # a sampler from outside the package: sampler_loss needs no change for it
        def __init__(self) -> None:
            super().__init__()
            self.gain = torch.nn.Parameter(torch.tensor(3.0))

        def loss(self, relevance, valid, query_emb, target, k, *, temperature, generator, margin=0.0):
            return (self.gain - temperature - margin) ** 2

    sampler = Gained()
    loss = sampler_loss(sampler, rel, valid, query, target, 5, temperature=0.5, margin=0.5)
    assert float(loss.detach()) == 4.0
    loss.backward()
    assert float(sampler.gain.grad) == 4.0  # d/dg (g - 1)^2 at g = 3
    log_polar, adaptive = PseudoLogPolarSampler(n_bins=8), AdaptiveStratifiedSampler(seed=1)
    assert torch.equal(sampler_loss(log_polar, rel, valid, query, target, 5, temperature=0.2),
                       log_polar.loss(rel, valid, query, target, 5, temperature=0.2))
    assert torch.equal(sampler_loss(adaptive, rel, valid, query, target, 5, generator=torch.Generator().manual_seed(3)),
                       adaptive.loss(rel, valid, query, target, 5, generator=torch.Generator().manual_seed(3)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_log_polar_hard_scores_select_exactly_what_the_sampler_selects(dtype):
    sampler = PseudoLogPolarSampler(n_bins=40).to(dtype)
    rel, valid, _, _ = padded_problem(1)
    rel = rel.to(dtype)
    for k in (1, 9, 40):
        chosen = sampler(rel, k, valid=valid).mask(10, 12)
        for softness in (0.0, 1e-4):
            scores = sampler.soft_scores(rel, valid, softness=softness).flatten(1)
            top = rank_cells(scores, valid.flatten(1))[:, :k]
            soft_chosen = torch.zeros_like(valid.flatten(1)).scatter_(1, top, True).view_as(valid)
            assert torch.equal(soft_chosen, chosen), (k, softness)


def test_log_polar_soft_scores_pass_gradcheck_in_centres_and_relevance():
    g = torch.Generator().manual_seed(0)
    centres = (0.3 + 0.4 * torch.rand(5, 2, generator=g, dtype=torch.float64)).requires_grad_()  # no clamping
    rel = torch.rand(1, 3, 4, generator=g, dtype=torch.float64).requires_grad_()
    valid, gaze = torch.ones(1, 3, 4, dtype=torch.bool), torch.full((1, 2), 0.5, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda r, c: log_polar_scores(r, c, valid, gaze, 0.2, 1.0, 0.5), (rel, centres))


def test_log_polar_training_moves_bins_onto_an_off_centre_answer():
    sampler = PseudoLogPolarSampler(n_bins=20, temperature=0.1)
    rel, valid = torch.zeros(1, 16, 16), torch.ones(1, 16, 16, dtype=torch.bool)
    rel[0, 8, 8] = 1.0  # gaze on the centre
    target = torch.zeros(1, 16, 16)
    target[0, 1:4, 11:14] = 1.0  # the answer sits in the top-right corner

    def shares() -> tuple[float, float]:
        with torch.no_grad():
            soft = soft_topk(sampler.soft_scores(rel, valid).flatten(1), 16, 0.1).view_as(rel)
            hard = sampler(rel, 16, valid=valid).mask(16, 16).float()
            return float(coverage_share(soft, target)), float(coverage_share(hard, target))

    soft_before, hard_before = shares()
    opt = torch.optim.Adam(sampler.parameters(), lr=0.02)
    for _ in range(30):
        opt.zero_grad()
        sampler_loss(sampler, rel, valid, None, target, 16).backward()
        opt.step()
    soft_after, hard_after = shares()
    assert soft_after > soft_before + 0.1 and hard_after > hard_before + 0.3


def test_score_function_surrogate_gradient_is_the_baselined_estimator():
    g = torch.Generator().manual_seed(0)
    out = torch.randn(3, 2, generator=g, dtype=torch.float64).requires_grad_()
    eps, reward = torch.randn(3, 16, 2, generator=g, dtype=torch.float64), torch.rand(3, 16, generator=g)
    score_function_surrogate(out, eps, reward.double(), 0.3).sum().backward()
    advantage = reward.double() - reward.double().mean(1, keepdim=True)
    expected = -(advantage[..., None] * eps).mean(1) / 0.3
    # float64 throughout: the centring, the mean over 16 samples, the division
    assert_close_reduction(out.grad, expected, reduction_len=16, depth=3)


def test_adaptive_loss_gradient_matches_the_estimator_on_the_hard_rewards():
    sampler, n, sigma = AdaptiveStratifiedSampler(query_dim=8, hidden=16), 6, 1.0
    rel, target = band_task()
    valid, query = torch.ones(2, 16, 16, dtype=torch.bool), torch.eye(2, 8)
    gen = torch.Generator().manual_seed(1)
    loss = sampler_loss(sampler, rel, valid, query, target, 16, generator=gen, n_samples=n, sigma=sigma)
    loss.backward()
    with torch.no_grad():
        out = sampler.grid_predictor(query)  # [2, 2]
    eps = torch.randn(2, n, 2, generator=torch.Generator().manual_seed(1))
    reward = grid_shares(rel, valid, target, 16, sampler.grid_of(out[:, None] + sigma * eps))  # [2, n]
    assert reward.std(1).min() > 0, "the rewards must differ for the check to mean something"
    assert float(loss.detach()) == pytest.approx(1 - float(reward.mean()))
    d_out = -((reward - reward.mean(1, keepdim=True))[..., None] * eps).mean(1) / sigma / 2  # mean over 2 images
    # d loss / d bias: centring, the mean over n samples, the scalings, the sum over 2 images (autograd's order)
    assert_close_reduction(sampler.grid_predictor[2].bias.grad, d_out.sum(0), reduction_len=2 * n, depth=5)


def test_adaptive_loss_is_deterministic_for_a_seed():
    rel, target = band_task()
    valid, query = torch.ones(2, 16, 16, dtype=torch.bool), torch.eye(2, 8)
    runs = []
    for _ in range(2):
        sampler = AdaptiveStratifiedSampler(query_dim=8, hidden=16)
        sampler_loss(sampler, rel, valid, query, target, 16, generator=torch.Generator().manual_seed(1)).backward()
        runs.append([p.grad for p in sampler.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*runs))


def test_adaptive_training_learns_each_querys_grid():
    sampler = AdaptiveStratifiedSampler(query_dim=8, hidden=16)
    rel, target = band_task()
    valid, query = torch.ones(2, 16, 16, dtype=torch.bool), torch.eye(2, 8)

    def predicted_shares() -> torch.Tensor:
        with torch.no_grad():
            return coverage_share(sampler(rel, 16, valid=valid, query_emb=query).mask(16, 16).float(), target)

    before = predicted_shares()
    opt, gen = torch.optim.Adam(sampler.parameters(), lr=0.05), torch.Generator().manual_seed(0)
    for _ in range(150):
        opt.zero_grad()
        sampler_loss(sampler, rel, valid, query, target, 16, generator=gen).backward()
        opt.step()
    after, (row_grid, column_grid) = predicted_shares(), sampler.predict_grid(query).tolist()
    assert after.mean() > before.mean() + 0.15 and bool((after >= 0.4).all())
    assert row_grid[1] > row_grid[0] and column_grid[0] > column_grid[1]  # more strata across the answer line


def test_images_without_answer_area_are_skipped():
    sampler = PseudoLogPolarSampler(n_bins=16)
    rel, valid, target, _ = padded_problem()

    def cover_part(rel, valid, target, k) -> float:  # the loss less its bin-spread term
        spread = bin_coverage_loss(sampler.soft_assignment(rel, valid))
        return float((sampler_loss(sampler, rel, valid, None, target, k) - SPREAD_WEIGHT * spread).detach())

    one_empty = torch.stack((target[0], torch.zeros(10, 12)))
    assert cover_part(rel, valid, one_empty, [5, 7]) == pytest.approx(cover_part(rel[:1], valid[:1], target[:1], 5))
    assert cover_part(rel, valid, torch.zeros_like(target), [5, 7]) == pytest.approx(0.0, abs=1e-7)


def test_bad_inputs_raise_clear_errors():
    rel, valid, target, query = padded_problem()
    log_polar, adaptive = PseudoLogPolarSampler(n_bins=8), AdaptiveStratifiedSampler()
    with pytest.raises(ValueError, match="budget K=90 exceeds the 80 valid cells of image 1"):
        sampler_loss(log_polar, rel, valid, query, target, [90, 90])
    with pytest.raises(ValueError, match="budget K=85 exceeds the 80 valid cells of image 1"):
        sampler_loss(adaptive, rel, valid, query, target, [110, 85])
    with pytest.raises(ValueError, match="K=0"):
        sampler_loss(log_polar, rel, valid, query, target, [3, 0])
    with pytest.raises(ValueError, match=r"one budget per image \(2\), got 3"):
        sampler_loss(log_polar, rel, valid, query, target, [3, 4, 5])
    with pytest.raises(TypeError, match="must be an int"):
        sampler_loss(log_polar, rel, valid, query, target, [3, 4.5])
    with pytest.raises(ValueError, match="target must be a finite map"):
        sampler_loss(log_polar, rel, valid, query, target[:, :5], 3)
    with pytest.raises(ValueError, match="target must be a finite map"):
        sampler_loss(adaptive, rel, valid, query, target.masked_fill(valid, float("nan")), 3)
    with pytest.raises(ValueError, match="valid must be bool"):
        sampler_loss(log_polar, rel, valid[:, :5], query, target, 3)
    with pytest.raises(ValueError, match="query_emb"):
        sampler_loss(adaptive, rel, valid, None, target, 3)
    bad = rel.clone()
    bad[0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        sampler_loss(log_polar, bad, valid, query, target, 3)
