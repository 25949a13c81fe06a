import pytest
import torch
from tolerances import ARR_MAP, SCORER, assert_close_reduction, assert_far, reduction_atol

from arr_coc.engine.relevance import SCORERS, ContextualScorer, MVPScorer, standardize

NAMES = ["rgb", "y", "x", "eccentricity", "edges", "edges_inv", "highpass", "lowpass", "motion", "saliency", "distance"]
LAYOUT = {}
_i = 0
for _n in NAMES:
    _w = 3 if _n == "rgb" else 1
    LAYOUT[_n] = slice(_i, _i + _w)
    _i += _w
WIDTH = _i  # 13


def inputs(B=2, H=6, W=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(B, WIDTH, H, W, generator=g), torch.randn(B, 384, generator=g),
            torch.rand(B, WIDTH, generator=g), torch.ones(B, H, W, dtype=torch.bool))


def test_standardize_gives_zero_mean_unit_std_on_valid_cells_and_zero_on_padding():
    x = torch.rand(2, 3, 5, 5)
    valid = torch.ones(2, 5, 5, dtype=torch.bool)
    valid[1, 3:] = False
    z = standardize(x, valid)
    for b in range(2):
        v, raw = z[b][:, valid[b]], x[b][:, valid[b]]
        # standardise (mean, variance, divide) and then the test's own mean or std: sums of at most 25 cells. The
        # centring's rounding is of the values (up to max |x|), which the division by the std amplifies; the
        # std is std / (std + eps) by construction (standardize's eps = 1e-6), not 1
        std = raw.std(1, unbiased=False)
        scale = float(raw.abs().max() / std.min())
        assert_close_reduction(v.mean(1), torch.zeros(3), reduction_len=25, depth=4, scale=scale)
        assert_close_reduction(v.std(1, unbiased=False), std / (std + 1e-6), reduction_len=25, depth=5, scale=scale)
    assert z[1][:, ~valid[1]].abs().sum() == 0


def test_standardize_maps_a_constant_map_to_zero():
    z = standardize(torch.full((1, 1, 4, 4), 3.0), torch.ones(1, 4, 4, dtype=torch.bool))
    assert torch.equal(z, torch.zeros(1, 1, 4, 4))


def test_context_weights_start_as_equal_thirds_and_sum_to_one():
    r = ContextualScorer(LAYOUT)(*inputs())
    torch.testing.assert_close(r.weights, torch.full((2, 3), 1 / 3))
    assert r.map.shape == (2, 6, 7) and r.parts.shape == (2, 3, 6, 7)


def test_participatory_is_zero_until_the_query_weights_a_channel():
    s = ContextualScorer(LAYOUT)
    tex, q, g, valid = inputs()
    assert s(tex, q, g, valid).parts[:, 2].abs().max() == 0
    with torch.no_grad():  # make the query's first coordinate weight the "x" channel
        s.part.weight[LAYOUT["x"].start, 0] = 1.0
    tex[:, LAYOUT["x"]] = torch.linspace(0, 1, 7).expand(6, 7)
    q[:, 0] = torch.tensor([1.0, -1.0])  # two queries pulling opposite ways
    part = s(tex, q, g, valid).parts[:, 2]
    assert (part[0, :, -1] > part[0, :, 0]).all() and (part[1, :, -1] < part[1, :, 0]).all()


def test_propositional_prefers_cells_with_edges():
    s = ContextualScorer(LAYOUT)
    tex, q, g, valid = inputs()
    tex[:, LAYOUT["edges"]] = 0.0
    tex[:, LAYOUT["edges"], 2, 3] = 1.0
    prop = s(tex, q, g, valid).parts[:, 0]
    assert (prop.flatten(1).argmax(1) == 2 * 7 + 3).all()


@pytest.mark.parametrize("name", SCORERS.names())
def test_batch_equals_single_images(name):
    torch.manual_seed(0)
    s = SCORERS.get(name)(LAYOUT)
    tex, q, g, valid = inputs(B=3)
    valid[2, 4:] = False
    full = s(tex, q, g, valid).map
    for b in range(3):
        one = s(tex[b:b + 1], q[b:b + 1], g[b:b + 1], valid[b:b + 1]).map
        assert_close_reduction(full[b:b + 1], one, **SCORER)
    assert full[2][~valid[2]].abs().sum() == 0


@pytest.mark.parametrize("name", SCORERS.names())
def test_gradients_reach_every_parameter(name):
    s = SCORERS.get(name)(LAYOUT)
    with torch.no_grad():  # move off the zero init so every path carries gradient
        for p in s.parameters():
            p.add_(0.1 * torch.randn_like(p))
    tex, q, g, valid = inputs()
    (s(tex, q, g, valid).map * torch.randn(2, 6, 7)).sum().backward()
    for n, p in s.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, n


def test_mvp_scorer_has_the_seeds_weights_and_86_parameters():
    s = MVPScorer(LAYOUT)
    assert sum(p.numel() for p in s.parameters()) == 86
    assert s.info.tolist() == pytest.approx([0.4, 0.3, 0.3])
    assert s.tension.tolist() == pytest.approx([0.33, 0.33, 0.34])


def test_mvp_spatial_prior_stretches_over_each_image():
    s = MVPScorer(LAYOUT)
    with torch.no_grad():
        s.prior.zero_()
        s.prior[0, 0, :, 4:] = 1.0  # right half of the image
    valid = torch.zeros(2, 8, 16, dtype=torch.bool)
    valid[0] = True
    valid[1, :, :8] = True  # second image is half as wide
    p = s.spatial_prior(valid)
    # 8 cells wide: cell centres fall on the prior's own centres, so values are exact
    assert p[1, :, :4].abs().max() == 0 and torch.allclose(p[1, :, 4:8], torch.ones(8, 4))
    # 16 cells wide: bilinear, the two cells at the step read a quarter and three quarters
    assert p[0, :, :7].abs().max() == 0 and torch.allclose(p[0, :, 9:], torch.ones(8, 7))
    torch.testing.assert_close(p[0, :, 7:9], torch.tensor([0.25, 0.75]).expand(8, 2))


def test_scorers_work_on_a_subset_of_channels():
    layout = {"rgb": slice(0, 3), "edges": slice(3, 4)}
    r = ContextualScorer(layout, gestalt_dim=4)(torch.rand(1, 4, 5, 5), torch.randn(1, 384), torch.rand(1, 4),
                                                torch.ones(1, 5, 5, dtype=torch.bool))
    assert torch.isfinite(r.map).all()


def test_unknown_participatory_channel_raises():
    with pytest.raises(ValueError, match=r"participatory channels \['clip'\] are not in the texture"):
        ContextualScorer(LAYOUT, participatory=["clip"])


def test_wrong_texture_width_raises_with_the_shape():
    tex, q, g, valid = inputs()
    with pytest.raises(ValueError, match=r"\[B, 13, Hc, Wc\], got \(2, 5, 6, 7\)"):
        ContextualScorer(LAYOUT)(tex[:, :5], q, g, valid)


def test_unknown_scorer_lists_the_known_ones():
    with pytest.raises(KeyError, match="unknown scorer 'clip'; known: contextual, mvp"):
        SCORERS.get("clip")


def test_coupling_channels_keep_their_absolute_level_so_no_match_adds_nothing():
    layout = dict(LAYOUT, text_match=slice(WIDTH, WIDTH + 1))
    s = ContextualScorer(layout, gestalt_dim=WIDTH)  # the gestalt reads the question-free channels only
    tex, q, g, valid = inputs()
    tex = torch.cat([tex, torch.zeros(2, 1, 6, 7)], 1)
    tex[0, WIDTH] = 1e-4 * torch.rand(6, 7)  # image 0: nothing matches (tiny noise must stay tiny)
    tex[1, WIDTH, 2, 5] = 1.0  # image 1: one cell matches the question perfectly
    part = s(tex, q, g, valid).parts[:, 2].detach()
    assert part[0].abs().max() < 1e-3
    assert float(part[1, 2, 5]) == pytest.approx(3.0) and part[1].flatten().topk(2).values[1] == 0


@pytest.mark.parametrize("name", ["contextual", "mvp"])
def test_part_scale_of_ones_is_the_trained_map_and_zero_removes_exactly_that_part(name):
    scorer = SCORERS.get(name)(LAYOUT)
    with torch.no_grad():  # non-trivial weights, so every part and every context weight matters
        for p in scorer.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    base = scorer(*inputs())
    assert torch.equal(scorer(*inputs(), scale=(1, 1, 1)).map, base.map)
    off = scorer(*inputs(), scale=(1, 0, 1))
    w = base.weights
    removed = base.parts[:, 1] * w[:, 1, None, None]
    atol = assert_close_reduction(off.map, base.map - removed, reduction_len=3, depth=2)  # the mix of 3 parts
    assert_far(removed, torch.zeros_like(removed), atol=atol)  # negative control: the perspectival part did contribute
    assert torch.equal(off.parts, base.parts) and torch.equal(off.weights, base.weights)
    assert off.scale.tolist() == [1.0, 0.0, 1.0]
    doubled = scorer(*inputs(), scale=(0, 0, 2))
    expect = 2 * base.parts[:, 2] * w[:, 2, None, None]
    if name == "mvp":
        expect = expect + scorer.spatial_prior(inputs()[3])  # the prior is not one of the three parts
    assert_close_reduction(doubled.map, expect * inputs()[3], reduction_len=3, depth=2)  # the mix, the prior added


@pytest.mark.parametrize("bad", [(1, 1), (1, -1, 1), (1, float("nan"), 1)])
def test_part_scale_refuses_anything_but_three_non_negative_numbers(bad):
    with pytest.raises(ValueError, match="part scale must be three finite numbers >= 0"):
        ContextualScorer(LAYOUT)(*inputs(), scale=bad)


def test_where_basis_spans_each_images_valid_cells_so_padding_changes_nothing():
    from arr_coc.engine.relevance import WHERE_COLS, WHERE_ROWS, where_basis

    alone = where_basis(torch.ones(1, 4, 6, dtype=torch.bool))
    padded_valid = torch.zeros(2, 7, 9, dtype=torch.bool)
    padded_valid[0, :4, :6] = True  # the same image on a larger canvas, beside a full one
    padded_valid[1] = True
    padded = where_basis(padded_valid)
    assert padded.shape == (2, WHERE_ROWS + WHERE_COLS, 7, 9)
    atol = assert_close_reduction(padded[0, :, :4, :6], alone[0], reduction_len=1, depth=4)  # elementwise bumps
    assert padded[0, :, 4:].abs().sum() == 0 and padded[0, :, :, 6:].abs().sum() == 0
    # negative control: the full 7x9 image's bumps sit elsewhere on its first 4x6 cells
    assert_far(padded[1, :, :4, :6], alone[0], atol=atol)
    # the first row bump peaks on the top row, the last on the bottom row; columns likewise
    assert alone[0, 0, :, 0].argmax() == 0 and alone[0, WHERE_ROWS - 1, :, 0].argmax() == 3
    assert alone[0, WHERE_ROWS, 0].argmax() == 0 and alone[0, -1, 0].argmax() == 5


def test_where_prior_is_off_until_trained_and_then_moves_the_map_where_the_query_says():
    from arr_coc.engine.relevance import WHERE_ROWS, where_basis

    s = ContextualScorer(LAYOUT)
    tex, q, g, valid = inputs()
    before = s(tex, q, g, valid)
    assert s.where.weight.abs().sum() == 0 and s.where.bias.abs().sum() == 0
    with torch.no_grad():  # the query's first coordinate asks for the top of the image
        s.where.weight[0, 0] = 2.0
    q[:, 0] = torch.tensor([1.0, -1.0])
    after = s(tex, q, g, valid)
    shift = after.parts[:, 2] - before.parts[:, 2]
    expected = torch.einsum("bnhw,bn->bhw", where_basis(valid), torch.nn.functional.pad(
        (2.0 * q[:, :1]), (0, s.where.out_features - 1)))
    assert_close_reduction(shift, expected, reduction_len=where_basis(valid).shape[1], depth=2)  # over the bumps
    assert shift[0, 0].min() > shift[0, -1].max() and shift[1, 0].max() < shift[1, -1].min()
    assert WHERE_ROWS > 1


def test_where_prior_receives_gradient_through_the_soft_topk():
    from arr_coc.engine.soft_topk import soft_topk

    s = ContextualScorer(LAYOUT)
    tex, q, g, valid = inputs()
    target = torch.zeros(2, 6, 7)
    target[:, 0] = 1.0  # the answer is on the top row
    chosen = soft_topk(s(tex, q, g, valid).map.flatten(1), 5, 0.5)
    (-(chosen * target.flatten(1)).sum()).backward()
    assert s.where.weight.grad is not None and s.where.weight.grad.abs().sum() > 0
    assert s.where.bias.grad[0] < 0  # more weight on the top-row bump covers more of the answer


@pytest.mark.parametrize("name", ["contextual", "mvp"])
def test_where_scale_zero_is_the_scorer_without_its_prior_and_one_is_as_trained(name):
    s = SCORERS.get(name)(LAYOUT)
    tex, q, g, valid = inputs()
    with torch.no_grad():  # a trained-looking prior: the answer at the top of the image
        if name == "contextual":
            s.where.bias[0] = 3.0
        else:
            s.prior[0, 0, 0] = 3.0
    on, off, half = (s(tex, q, g, valid, where=w).map for w in (1.0, 0.0, 0.5))
    with torch.no_grad():
        (s.where.bias if name == "contextual" else s.prior).zero_()
    assert torch.equal(off, s(tex, q, g, valid).map)  # off: exactly the map with no prior at all (+ 0 x prior)
    # linear in the scale: the prior times 0.5 added, then the difference (3 roundings of the map's scale)
    atol = assert_close_reduction(half - off, 0.5 * (on - off), reduction_len=1, depth=3,
                                  scale=float(on.detach().abs().max()))
    assert_far(on, off, atol=atol)  # negative control: the prior moved the map


def test_the_shipped_scorer_has_no_where_prior_so_the_option_changes_nothing():
    """Trained with the prior off, the shipped scorer's prior is exactly zero: scale 1 sends what scale 0 sends."""
    from arr_coc import ARR
    from arr_coc.config import ARRConfig, ScorerConfig

    arr = ARR.from_pretrained("contextual")
    assert arr.scorer.where.weight.abs().sum() == 0 and arr.scorer.where.bias.abs().sum() == 0
    from pathlib import Path

    image, question = Path(__file__).parents[1] / "examples" / "receipt.jpg", "What is the date?"
    scene = arr.see(image)
    vector = arr.gestalt(scene, 1).vector
    off = arr.score(scene, [question], vector)[0].map
    arr.config = ARRConfig(**{**arr.config.__dict__, "scorer": ScorerConfig(**{**arr.config.scorer.__dict__,
                                                                               "where_prior": 1.0})})
    assert arr.config.scorer.where_prior == 1.0
    assert torch.equal(arr.score(scene, [question], vector)[0].map, off)
    with torch.no_grad():  # negative control: a prior that is there moves the map
        arr.scorer.where.bias[0] = 3.0
    assert_far(arr.score(scene, [question], vector)[0].map, off, atol=reduction_atol(off, **ARR_MAP))
