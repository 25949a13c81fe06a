"""Specification tests for arr_coc.engine.samplers: every registered sampler keeps the budget contract."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tolerances import assert_close_reduction

from arr_coc.engine.learned_samplers import PseudoLogPolarSampler
from arr_coc.engine.samplers import SAMPLERS, nms_cells, topk_cells, uniform_cells
from arr_coc.engine.selection import check_budget, shift_nonnegative
from arr_coc.engine.stratified import _stratum_stats, allocate_quotas, coarsen_grid, stratified_cells, stratum_ids

QUERY_DIM = 384
INSTANCES = {name: SAMPLERS.get(name)() for name in SAMPLERS.names()}


def stratified_quotas(relevance, k, valid=None, grid=(4, 4)):
    """(quotas, cell counts) of `stratified_cells`, each `[B, S]` in row-major stratum order: its own steps."""
    valid = check_budget(relevance, k, valid)
    _, counts, importance = _stratum_stats(relevance, valid, grid)
    return allocate_quotas(importance, counts, k), counts


def make_valid(kind: str, b: int, h: int, w: int, g: torch.Generator) -> torch.Tensor:
    if kind == "full":
        return torch.ones(b, h, w, dtype=torch.bool)
    if kind == "padded":  # each image a top-left rectangle of the canvas, as a padded batch has
        hs = torch.randint(1, h + 1, (b,), generator=g)
        ws = torch.randint(1, w + 1, (b,), generator=g)
        rows = torch.arange(h)[None, :, None] < hs[:, None, None]
        return rows & (torch.arange(w)[None, None, :] < ws[:, None, None])
    valid = torch.rand(b, h, w, generator=g) < 0.6
    seed_cell = torch.randint(0, h * w, (b,), generator=g)
    return valid.flatten(1).scatter(1, seed_cell[:, None], True).view(b, h, w)


@st.composite
def problems(draw, max_side: int = 20):
    b, h, w = draw(st.integers(1, 3)), draw(st.integers(1, max_side)), draw(st.integers(1, max_side))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    valid = make_valid(draw(st.sampled_from(["full", "padded", "random"])), b, h, w, g)
    rel = torch.rand(b, h, w, generator=g)
    if draw(st.booleans()):  # few levels: plenty of ties
        rel = (rel * 3).floor()
    rel = rel.masked_fill(~valid, float("nan"))  # padding content must never matter
    k = draw(st.integers(1, int(valid.flatten(1).sum(1).min())))
    return rel, valid, k, torch.randn(b, QUERY_DIM, generator=g)


def call(name, rel, k, valid=None, query=None, seed=0):
    return INSTANCES[name](rel, k, valid=valid, query_emb=query, generator=torch.Generator().manual_seed(seed))


def assert_contract(sel, rel, valid, k):
    b, h, w = rel.shape
    assert sel.positions.shape == (b, k, 2) and sel.positions.dtype == torch.int64
    assert sel.scores.shape == (b, k)
    y, x = sel.positions[..., 0], sel.positions[..., 1]
    assert bool(((y >= 0) & (y < h) & (x >= 0) & (x < w)).all())
    flat = y * w + x
    for row in flat:
        assert len(set(row.tolist())) == k, "positions must be distinct"
    assert bool(valid.flatten(1).gather(1, flat).all()), "only valid cells"
    assert torch.equal(sel.scores, rel.flatten(1).gather(1, flat))
    later_lower = sel.scores[:, 1:] < sel.scores[:, :-1]
    tie_in_order = (sel.scores[:, 1:] == sel.scores[:, :-1]) & (flat[:, 1:] > flat[:, :-1])
    assert bool((later_lower | tie_in_order).all()), "ordered by relevance, ties by lower flat index"


@pytest.mark.parametrize("name", SAMPLERS.names())
@settings(max_examples=40, deadline=None)
@given(problem=problems())
def test_every_sampler_returns_exactly_k_distinct_valid_cells_by_relevance(name, problem):
    rel, valid, k, query = problem
    sel = call(name, rel, k, valid, query)
    assert_contract(sel, rel, valid, k)
    again = call(name, rel, k, valid, query)
    assert torch.equal(sel.positions, again.positions), "deterministic for the same inputs and seed"
    for i in range(rel.shape[0]):
        alone = call(name, rel[i : i + 1], k, valid[i : i + 1], query[i : i + 1])
        assert torch.equal(alone.positions[0], sel.positions[i]), "batching never changes an image's selection"


@pytest.mark.parametrize("name", SAMPLERS.names())
def test_every_sampler_rejects_a_budget_above_the_valid_cells(name):
    valid = torch.ones(2, 16, 20, dtype=torch.bool)
    valid[1, :, 16:] = False  # image 1 has 256 valid cells
    rel, query = torch.rand(2, 16, 20), torch.randn(2, QUERY_DIM)
    msg = "budget K=300 exceeds the 256 valid cells of image 1; lower --saccades or raise the canvas size"
    with pytest.raises(ValueError, match=msg):
        call(name, rel, 300, valid, query)
    with pytest.raises(ValueError, match="K=0"):
        call(name, rel, 0, valid, query)
    rel[0, 3, 4] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        call(name, rel, 5, valid, query)


def test_topk_equals_torch_topk_on_a_map_without_ties():
    rel = torch.rand(3, 9, 11, generator=torch.Generator().manual_seed(1))
    sel = topk_cells(rel, 17)
    ref = torch.topk(rel.flatten(1), 17)
    assert torch.equal(sel.positions[..., 0] * 11 + sel.positions[..., 1], ref.indices)
    assert torch.equal(sel.scores, ref.values)


def test_topk_breaks_ties_by_lower_flat_index():
    sel = topk_cells(torch.tensor([[[1.0, 2.0, 2.0], [2.0, 0.0, 1.0]]]), 4)
    assert sel.positions[0].tolist() == [[0, 1], [0, 2], [1, 0], [0, 0]]


@settings(max_examples=40, deadline=None)
@given(problem=problems(), gh=st.integers(1, 5), gw=st.integers(1, 5))
def test_stratified_gives_every_nonempty_stratum_a_token(problem, gh, gw):
    rel, valid, k, _ = problem
    ids = stratum_ids(valid, (gh, gw))
    nonempty = torch.stack([(ids == s).flatten(1).any(1) for s in range(gh * gw)], 1)  # [B, S]
    k = max(k, int(nonempty.sum(1).max()))
    if k > int(valid.flatten(1).sum(1).min()):
        with pytest.raises(ValueError):
            stratified_cells(rel, k, valid, (gh, gw))
        return
    quotas, counts = stratified_quotas(rel, k, valid, (gh, gw))
    sel = stratified_cells(rel, k, valid, (gh, gw))
    assert_contract(sel, rel, valid, k)
    assert torch.equal(quotas.sum(1), torch.full((rel.shape[0],), k))
    assert bool((quotas <= counts).all()), "a stratum never gets more tokens than cells"
    assert bool((quotas[nonempty] >= 1).all()) and bool((quotas[~nonempty] == 0).all())
    got = ids.flatten(1).gather(1, sel.positions[..., 0] * rel.shape[2] + sel.positions[..., 1])
    assert torch.equal(torch.stack([(got == s).sum(1) for s in range(gh * gw)], 1), quotas)


def test_stratified_quotas_match_a_hand_computed_case():
    # 2x2 strata of 4 cells; stratum 0 holds all the relevance. K=8: one token each, 4 left; stratum 0's
    # share (~4) exceeds its 3 spare cells, so it is filled and the last token goes to the tie-winner 1.
    rel = torch.zeros(1, 4, 4)
    rel[0, :2, :2] = 1.0
    quotas, counts = stratified_quotas(rel, 8, grid=(2, 2))
    assert quotas.tolist() == [[4, 2, 1, 1]] and counts.tolist() == [[4, 4, 4, 4]]
    # Proportional without caps: importances ~0, 3, 6 share 3 spare tokens as 0, 1, 2.
    line = torch.tensor([[[0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0]]])
    assert stratified_quotas(line, 6, grid=(1, 3))[0].tolist() == [[1, 2, 3]]
    assert allocate_quotas(torch.tensor([[1.0, 1.0, 2.0]]), torch.tensor([[9, 9, 9]]), 7).tolist() == [[2, 2, 3]]


def test_stratified_strata_follow_each_images_valid_extent():
    valid = torch.zeros(1, 4, 6, dtype=torch.bool)
    valid[0, :4, :4] = True  # right two columns are padding
    ids = stratum_ids(valid, (2, 2))[0]
    assert ids[:, :4].tolist() == [[0, 0, 1, 1], [0, 0, 1, 1], [2, 2, 3, 3], [2, 2, 3, 3]]
    assert bool((ids[:, 4:] == -1).all())


def test_stratified_module_coarsens_a_grid_too_fine_for_k():
    rel = torch.rand(1, 8, 8, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="non-empty strata"):
        stratified_cells(rel, 3, grid=(4, 4))
    assert coarsen_grid(torch.ones(1, 8, 8, dtype=torch.bool), 3, (4, 4)).tolist() == [[1, 2]]
    sel = INSTANCES["stratified"](rel, 3)
    assert torch.equal(sel.positions, stratified_cells(rel, 3, grid=(1, 2)).positions)


def test_adaptive_stratified_uses_each_querys_own_grid():
    sampler = SAMPLERS.get("adaptive_stratified")()
    first, last = sampler.grid_predictor[0], sampler.grid_predictor[2]
    with torch.no_grad():  # grid depends on query[0]: 0 -> 1x1, 1 -> 8x8
        first.weight.zero_(), first.bias.zero_(), last.weight.zero_()
        first.weight[0, 0] = 1.0
        last.weight[:, 0] = 10.0
        last.bias.fill_(-5.0)
    query = torch.zeros(2, QUERY_DIM)
    query[1, 0] = 1.0
    assert sampler.predict_grid(query).tolist() == [[1, 1], [8, 8]]
    rel = torch.rand(2, 16, 16, generator=torch.Generator().manual_seed(3))
    sel = sampler(rel, 70, query_emb=query)
    assert torch.equal(sel.positions[0], topk_cells(rel[:1], 70).positions[0])
    assert torch.equal(sel.positions[1], stratified_cells(rel[1:], 70, grid=(8, 8)).positions[0])
    with pytest.raises(ValueError, match="query_emb"):
        sampler(rel, 70)


def test_adaptive_stratified_construction_is_deterministic():
    a, b = SAMPLERS.get("adaptive_stratified")(), SAMPLERS.get("adaptive_stratified")()
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    grid = a.predict_grid(torch.randn(5, QUERY_DIM))
    assert bool(((grid >= 1) & (grid <= 8)).all())


@settings(max_examples=40, deadline=None)
@given(problem=problems(), metric=st.sampled_from(["chebyshev", "euclidean"]))
def test_nms_keeps_min_distance_when_feasible(problem, metric):
    rel, valid, _, _ = problem
    # Each pick suppresses at most 9 (Chebyshev 2) or 29 (Euclidean 3) cells, so this K always fits.
    min_distance, area = (2, 9) if metric == "chebyshev" else (3, 29)
    k = max(1, int(valid.flatten(1).sum(1).min()) // area)
    sel = nms_cells(rel, k, valid, min_distance, metric)
    assert_contract(sel, rel, valid, k)
    d = (sel.positions[:, :, None] - sel.positions[:, None]).abs().float()  # [B, K, K, 2]
    dist = d.amax(-1) if metric == "chebyshev" else d.norm(dim=-1)
    off_diagonal = ~torch.eye(k, dtype=torch.bool)
    assert bool((dist[:, off_diagonal] >= min_distance).all())


def test_nms_fills_with_the_best_suppressed_cells():
    rel = torch.tensor([[[4.0, 3.0, 2.0, 1.0]]])
    assert nms_cells(rel, 2).positions[0, :, 1].tolist() == [0, 2]
    assert nms_cells(rel, 3).positions[0, :, 1].tolist() == [0, 1, 2]  # cell 1 (3.0) beats cell 3 (1.0)
    assert torch.equal(nms_cells(rel, 3, min_distance=1).positions, topk_cells(rel, 3).positions)


def test_log_polar_gradients_reach_bin_centres_through_soft_assignment():
    sampler = PseudoLogPolarSampler(n_bins=20)
    rel, valid = torch.rand(2, 6, 7), torch.ones(2, 6, 7, dtype=torch.bool)
    valid[1, :, 5:] = False
    a = sampler.soft_assignment(rel, valid)
    assert a.shape == (2, 42, 20)
    # each valid cell shares out one unit: a softmax over 20 bins (its normaliser), then their sum
    assert_close_reduction(a.sum(-1), valid.flatten(1).float(), reduction_len=20, depth=2)
    sampler.coverage_loss(a, min_mass=5.0).backward()
    grad = sampler.bin_centres.grad
    assert grad is not None and bool(torch.isfinite(grad).all()) and grad.abs().sum() > 0


def test_log_polar_construction_is_deterministic_and_foveal():
    a, b = PseudoLogPolarSampler(), PseudoLogPolarSampler()
    assert torch.equal(a.bin_centres, b.bin_centres) and a.bin_centres.shape == (273, 2)
    near_centre = ((a.bin_centres - 0.5).abs().amax(1) < 0.2).sum()
    assert near_centre >= 68  # the 25% foveal bins (sigma 0.05) plus peripheral ones that land there


def test_log_polar_concentrates_near_the_gaze():
    rel = torch.zeros(1, 20, 20)
    sel = PseudoLogPolarSampler()(rel, 12, gaze=torch.tensor([[0.2, 0.8]]))
    centre = sel.positions[0].float().mean(0)
    assert abs(centre[0] - 3.5) < 2.5 and abs(centre[1] - 15.5) < 2.5


def test_uniform_picks_an_even_lattice():
    sel = uniform_cells(torch.zeros(1, 6, 6), 9)
    assert sorted(map(tuple, sel.positions[0].tolist())) == [(y, x) for y in (1, 3, 5) for x in (1, 3, 5)]
    valid = torch.zeros(1, 6, 8, dtype=torch.bool)
    valid[0, :4, :4] = True  # a padded image only spreads over its own extent
    sel = uniform_cells(torch.zeros(1, 6, 8), 4, valid)
    assert sorted(map(tuple, sel.positions[0].tolist())) == [(1, 1), (1, 3), (3, 1), (3, 3)]


def test_random_depends_on_the_seed_and_reaches_every_cell():
    rel = torch.zeros(1, 3, 3)
    picks = {tuple(call("random", rel, 1, seed=s).positions[0, 0].tolist()) for s in range(100)}
    assert len(picks) == 9
    a, b = call("random", torch.rand(1, 10, 10), 5, seed=1), call("random", torch.rand(1, 10, 10), 5, seed=2)
    assert not torch.equal(a.positions.sort(1).values, b.positions.sort(1).values)


def test_selection_mask_marks_the_chosen_cells():
    sel = topk_cells(torch.tensor([[[0.1, 0.9], [0.5, 0.3]]]), 2)
    assert sel.mask(2, 2).tolist() == [[[False, True], [True, False]]]


def test_shift_nonnegative_subtracts_the_valid_minimum_zeroes_padding_and_ignores_an_offset():
    rel = torch.tensor([[[2.0, -3.0], [5.0, -9.0]], [[1.0, 1.0], [1.0, 4.0]]])
    valid = torch.tensor([[[True, True], [True, False]], [[True, True], [True, True]]])
    shifted, span = shift_nonnegative(rel, valid)
    assert shifted.tolist() == [[[5.0, 0.0], [8.0, 0.0]], [[0.0, 0.0], [0.0, 3.0]]]  # -9 is padding: not the min
    assert span.tolist() == [[[8.0]], [[3.0]]]
    again, _ = shift_nonnegative(rel + 100.0, valid)
    assert torch.equal(again, shifted)
