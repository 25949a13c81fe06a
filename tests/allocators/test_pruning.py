"""Learned allocators: the pixel patch selector and the post-encoding token pruner."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tolerances import assert_far, reduction_atol

from arr_coc.allocators.pruning import PatchSelector, TokenPruner, _check_scores, prune
from arr_coc.allocators.token_batches import pad_tokens
from arr_coc.engine.samplers import topk_cells
from arr_coc.engine.selection import check_budget
from arr_coc.engine.soft_topk import standardized_soft_topk
from arr_coc.vlm.processing import all_cells


def soft_weights(scores: torch.Tensor, k: int, mask: torch.Tensor | None = None,
                 temperature: float = 0.5) -> torch.Tensor:
    """Differentiable keep-weights `[B, N]` in [0, 1], K per row, zero on padding: `prune`'s checks, then
    `standardized_soft_topk` (temperature in standard deviations of each row's unmasked scores)."""
    return standardized_soft_topk(scores, k, temperature, _check_scores(scores, k, mask))


def soft_selection(selector: PatchSelector, pixels: torch.Tensor, k: int, valid: torch.Tensor | None = None,
                   temperature: float = 0.5) -> torch.Tensor:
    """The selector's soft top-K weights `[B, Hc, Wc]` (sum K, zero on invalid cells): what a proxy loss trains."""
    imp = selector.importance(pixels, valid)
    valid = check_budget(imp, k, valid)
    return soft_weights(imp.flatten(1), k, valid.flatten(1), temperature).view_as(imp)


def soft_keep(pruner: TokenPruner, tokens: torch.Tensor, k: int, mask: torch.Tensor | None = None,
              query: torch.Tensor | None = None, temperature: float = 0.5) -> tuple[torch.Tensor, torch.Tensor]:
    """The pruner's training stand-in: `(tokens * weights [B, N, D], weights [B, N])`, all N kept, each scaled by
    its `soft_weights` keep-weight (K in total per row, 0 on padding)."""
    w = soft_weights(pruner.score(tokens, query), k, mask, temperature)
    return tokens * w[..., None], w


def reference_keep(scores: torch.Tensor, mask: torch.Tensor, k: int) -> list[list[int]]:
    """Brute force: per row, unmasked indices sorted by (-score, index), first K."""
    return [sorted((i for i in range(len(s)) if m[i]), key=lambda i: (-float(s[i]), i))[:k]
            for s, m in zip(scores, mask)]


# ----------------------------------------------------------------------------- prune


@pytest.mark.parametrize("seed", range(5))
def test_prune_keeps_the_brute_force_top_k_with_ties_by_index_and_never_padding(seed):
    g = torch.Generator().manual_seed(seed)
    b, n, d, k = 4, 12, 3, 5
    scores = torch.randint(0, 3, (b, n), generator=g).float()  # three values over 12 tokens: many ties
    mask = torch.rand(b, n, generator=g) < 0.7
    mask[:, :k] = True  # every row has at least K real tokens
    scores[~mask] = 10.0  # padding outscores everything, so choosing it would show
    tokens = torch.randn(b, n, d, generator=g)
    kept, idx = prune(tokens, scores, k, mask)
    assert idx.tolist() == reference_keep(scores, mask, k)
    assert torch.equal(kept, torch.stack([tokens[i, idx[i]] for i in range(b)]))
    assert bool(mask.gather(1, idx).all())


def test_prune_keep_order_returns_the_same_tokens_in_index_order():
    g = torch.Generator().manual_seed(0)
    tokens, scores = torch.randn(3, 9, 4, generator=g), torch.randn(3, 9, generator=g)
    _, by_score = prune(tokens, scores, 4)
    kept, in_order = prune(tokens, scores, 4, keep_order=True)
    assert torch.equal(in_order, by_score.sort(1).values)
    assert torch.equal(kept, tokens.gather(1, in_order[..., None].expand(-1, -1, 4)))
    assert bool((scores.gather(1, by_score).diff(dim=1) <= 0).all())


def test_prune_gathers_from_non_contiguous_tokens():
    tokens = torch.randn(2, 5, 6).transpose(0, 1).contiguous().transpose(0, 1)  # [2, 5, 6], not contiguous
    assert not tokens.is_contiguous()
    scores = torch.tensor([[0.0, 4.0, 1.0, 3.0, 2.0], [4.0, 3.0, 2.0, 1.0, 0.0]])
    kept, idx = prune(tokens, scores, 2)
    assert idx.tolist() == [[1, 3], [0, 1]]
    assert torch.equal(kept[0], tokens[0, [1, 3]]) and torch.equal(kept[1], tokens[1, [0, 1]])


def test_k_above_the_available_tokens_raises_naming_the_numbers():
    mask = torch.tensor([[True] * 6, [True, True, True, False, False, False]])
    with pytest.raises(ValueError, match=r"K=5 exceeds the 3 available tokens of row 1 \(of 6"):
        prune(torch.zeros(2, 6, 2), torch.zeros(2, 6), 5, mask)
    with pytest.raises(ValueError, match="K=0 must be at least 1"):
        prune(torch.zeros(1, 6, 2), torch.zeros(1, 6), 0)
    with pytest.raises(TypeError, match="K must be an int"):
        prune(torch.zeros(1, 6, 2), torch.zeros(1, 6), 2.0)


def test_nan_scores_raise_at_real_tokens_but_not_at_padding():
    scores = torch.tensor([[1.0, float("nan"), 2.0]])
    with pytest.raises(ValueError, match="1 NaN/inf values at unmasked tokens"):
        prune(torch.zeros(1, 3, 2), scores, 1)
    _, idx = prune(torch.zeros(1, 3, 2), scores, 2, torch.tensor([[True, False, True]]))
    assert idx.tolist() == [[2, 0]]


def test_prune_rejects_mismatched_shapes_with_the_shapes():
    with pytest.raises(ValueError, match=r"matching scores \(2, 5\), got \(2, 4, 3\)"):
        prune(torch.zeros(2, 4, 3), torch.zeros(2, 5), 1)
    with pytest.raises(ValueError, match="mask must be bool of shape"):
        prune(torch.zeros(2, 5, 3), torch.zeros(2, 5), 1, torch.ones(2, 5))


# ----------------------------------------------------------------------------- padding


def test_pruned_native_tokens_of_two_images_land_on_their_own_cells():
    grids = [(2, 3), (3, 2)]
    tokens, mask = pad_tokens([all_cells(h, w).float() for h, w in grids])  # each token holds its own (y, x)
    scores = torch.tensor([[5.0, 1, 4, 2, 3, 0], [0.0, 1, 2, 3, 4, 5]])
    kept, idx = prune(tokens, scores, 3, mask)
    wc = torch.tensor([w for _, w in grids])[:, None]  # raster index -> (y, x) on each image's own grid
    assert torch.equal(torch.stack((idx // wc, idx % wc), -1).float(), kept)


def test_pad_tokens_marks_padding():
    tokens, mask = pad_tokens([torch.ones(2, 3), torch.ones(4, 3)])
    assert tokens.shape == (2, 4, 3) and mask.sum(1).tolist() == [2, 4]
    assert float(tokens[0, 2:].abs().sum()) == 0.0
    with pytest.raises(ValueError, match="one D"):
        pad_tokens([torch.ones(2, 3), torch.ones(2, 4)])


# ----------------------------------------------------------------------------- soft weights


def test_soft_weights_sum_to_k_put_no_mass_on_padding_and_harden_at_low_temperature():
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(3, 10, generator=g)
    mask = torch.ones(3, 10, dtype=torch.bool)
    mask[1, 6:] = False
    w = soft_weights(scores, 4, mask, temperature=0.5)
    assert torch.allclose(w.sum(1), torch.full((3,), 4.0), atol=1e-5)
    assert float(w[1, 6:].abs().sum()) == 0.0
    hard = torch.zeros(3, 10).scatter_(1, prune(scores[..., None], scores, 4, mask)[1], 1.0)
    assert torch.equal(soft_weights(scores, 4, mask, temperature=1e-3).round(), hard)
    every = soft_weights(scores, 6, mask)  # row 1 has exactly 6 real tokens: all of them, fully
    assert torch.allclose(every[1], mask[1].float(), atol=1e-6)


def test_soft_weights_pass_gradcheck_in_float64():
    g = torch.Generator().manual_seed(1)
    scores = torch.randn(2, 6, dtype=torch.float64, generator=g, requires_grad=True)
    mask = torch.tensor([[True] * 6, [True, True, False, True, True, False]])
    assert torch.autograd.gradcheck(lambda s: soft_weights(s, 2, mask, 0.7), (scores,))


def test_soft_keep_passes_gradcheck_through_the_scorer_in_float64():
    pruner = TokenPruner(dim=4, hidden=3).double()
    tokens = torch.randn(2, 5, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(2),
                         requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: soft_keep(pruner, t, 2, temperature=0.7)[0], (tokens,))


# ----------------------------------------------------------------------------- TokenPruner


def test_token_pruner_equals_prune_of_its_scores_and_uses_the_query():
    pruner = TokenPruner(dim=8, query_dim=3)
    g = torch.Generator().manual_seed(3)
    tokens, query = torch.randn(2, 7, 8, generator=g), torch.randn(2, 3, generator=g)
    mask = torch.tensor([[True] * 7, [True] * 4 + [False] * 3])
    kept, idx = pruner(tokens, 3, mask, query)
    ref_kept, ref_idx = prune(tokens, pruner.score(tokens, query), 3, mask)
    assert torch.equal(idx, ref_idx) and torch.equal(kept, ref_kept)
    score = pruner.score(tokens, query)  # a small MLP over 8 + 3 inputs: 3 reductions
    assert_far(score, pruner.score(tokens, -query), atol=reduction_atol(score, reduction_len=11, depth=3))
    soft, w = soft_keep(pruner, tokens, 3, mask, query)
    assert torch.equal(soft, tokens * w[..., None]) and float(w[1, 4:].detach().sum()) == 0.0  # this product


def test_token_pruner_explains_a_missing_or_wrong_query():
    with pytest.raises(ValueError, match="query_dim=3: pass query"):
        TokenPruner(dim=8, query_dim=3)(torch.zeros(1, 4, 8), 2)
    with pytest.raises(ValueError, match="query_dim=0: drop the query"):
        TokenPruner(dim=8)(torch.zeros(1, 4, 8), 2, query=torch.zeros(1, 3))
    with pytest.raises(ValueError, match=r"tokens must be \[B, N, 8\], got \(1, 4, 6\)"):
        TokenPruner(dim=8)(torch.zeros(1, 4, 6), 2)


@pytest.mark.parametrize("build", [lambda s: TokenPruner(dim=8, query_dim=2, seed=s),
                                   lambda s: PatchSelector(cell=8, seed=s)])
def test_seeded_init_is_deterministic_and_leaves_the_global_rng_alone(build):
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    a, b, c = build(0).state_dict(), build(0).state_dict(), build(1).state_dict()
    assert torch.equal(torch.random.get_rng_state(), before)
    assert all(torch.equal(a[key], b[key]) for key in a)
    assert not all(torch.equal(a[key], c[key]) for key in a)


# ----------------------------------------------------------------------------- PatchSelector


def test_patch_selector_is_small_at_qwen_cells():
    n = sum(p.numel() for p in PatchSelector(cell=28).parameters())
    assert n == 13_489  # the figure in the class docstring
    with pytest.raises(ValueError, match="stem=5 must divide cell=28"):
        PatchSelector(cell=28, stem=5)


def test_patch_selector_rejects_pixels_off_the_cell_grid():
    with pytest.raises(ValueError, match=r"multiples of cell=8, got \(1, 3, 20, 16\).*make_canvas"):
        PatchSelector(cell=8).importance(torch.zeros(1, 3, 20, 16))
    with pytest.raises(ValueError, match=r"valid must be bool \[1, 2, 2\]"):
        PatchSelector(cell=8).importance(torch.zeros(1, 3, 16, 16), torch.ones(1, 3, 3, dtype=torch.bool))


SELECTOR = PatchSelector(cell=4, width=4, stem=2)


@settings(max_examples=30, deadline=None)
@given(hc=st.integers(1, 6), wc=st.integers(1, 6), b=st.integers(1, 3), data=st.data())
def test_patch_selector_picks_exactly_k_distinct_valid_cells_in_importance_order(hc, wc, b, data):
    seed = data.draw(st.integers(0, 2**16))
    g = torch.Generator().manual_seed(seed)
    pixels = torch.rand(b, 3, hc * 4, wc * 4, generator=g)
    valid = torch.zeros(b, hc, wc, dtype=torch.bool)
    for i in range(b):  # a padded canvas: each image fills a top-left rectangle
        valid[i, :data.draw(st.integers(1, hc)), :data.draw(st.integers(1, wc))] = True
    k = data.draw(st.integers(1, int(valid.flatten(1).sum(1).min())))
    with torch.no_grad():
        sel = SELECTOR(pixels, k, valid)
        ref = topk_cells(SELECTOR.importance(pixels, valid), k, valid)
    pos = sel.positions
    assert pos.shape == (b, k, 2)
    assert bool(((pos >= 0) & (pos < torch.tensor([hc, wc]))).all())
    flat = pos[..., 0] * wc + pos[..., 1]
    assert all(len(set(row)) == k for row in flat.tolist())
    assert bool(valid.flatten(1).gather(1, flat).all())
    assert bool((sel.scores.diff(dim=1) <= 0).all())
    assert torch.equal(pos, ref.positions)
    with torch.no_grad():
        w = soft_selection(SELECTOR, pixels, k, valid)
    assert torch.allclose(w.flatten(1).sum(1), torch.full((b,), float(k)), atol=1e-4)
    assert float(w[~valid].abs().sum()) == 0.0


CELL, GRID, SIDE = 8, 8, 2  # 8 px cells, an 8 x 8 cell canvas, a 2 x 2 cell answer square


def bright_squares(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Uniform noise images with one cell-aligned square of bright pixels; target = the square's cells."""
    g = torch.Generator().manual_seed(seed)
    pixels = torch.rand(n, 3, GRID * CELL, GRID * CELL, generator=g)
    target = torch.zeros(n, GRID, GRID)
    corners = torch.randint(0, GRID - SIDE + 1, (n, 2), generator=g).tolist()
    for i, (y, x) in enumerate(corners):
        square = 0.8 + 0.2 * torch.rand(3, SIDE * CELL, SIDE * CELL, generator=g)
        pixels[i, :, y * CELL:(y + SIDE) * CELL, x * CELL:(x + SIDE) * CELL] = square
        target[i, y:y + SIDE, x:x + SIDE] = 1.0
    return pixels, target


def test_patch_selector_learns_to_cover_the_answer_with_the_proxy_loss():
    k = SIDE * SIDE
    selector = PatchSelector(cell=CELL, seed=0)
    held_out = bright_squares(64, seed=1)

    def coverage() -> float:
        with torch.no_grad():
            chosen = selector(held_out[0], k).mask(GRID, GRID).float()
        return float((chosen * held_out[1]).sum() / held_out[1].sum())

    before = coverage()
    optimizer = torch.optim.Adam(selector.parameters(), lr=0.01)
    losses = []
    for step in range(30):
        pixels, target = bright_squares(16, seed=100 + step)
        weights = soft_selection(selector, pixels, k, temperature=0.5)
        loss = 1 - (weights * target).sum() / target.sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    after = coverage()
    assert before < 0.3 < 0.8 < after, (before, after)
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5


# ----------------------------------------------------------------------------- saved weights
def test_saved_selector_and_pruner_reload_bit_exactly(tmp_path):
    from arr_coc.allocators.pruning import save_learned
    from arr_coc.weights import load_learned

    pruner, selector = TokenPruner(6, query_dim=3, hidden=5, seed=4), PatchSelector(cell=8, width=4, seed=2)
    save_learned(tmp_path / "p", "pruner", pruner, ["a", "b"], metrics={"iou": 0.5})
    save_learned(tmp_path / "s", "selector", selector, ["a", "b"])
    p2, meta = load_learned("pruner", tmp_path / "p", channels=["a", "b"], query_dim=3)
    s2, _ = load_learned("selector", tmp_path / "s", cell=8)
    tokens, query, pixels = torch.randn(2, 7, 6), torch.randn(2, 3), torch.rand(1, 3, 16, 24)
    assert torch.equal(p2.score(tokens, query), pruner.score(tokens, query))
    assert torch.equal(s2.importance(pixels), selector.importance(pixels))
    assert meta["metrics"] == {"iou": 0.5} and meta["config"]["hidden"] == 5 and not p2.training


def test_saved_weights_that_do_not_fit_are_clear_errors(tmp_path):
    from arr_coc.allocators.pruning import save_learned
    from arr_coc.weights import load_learned

    save_learned(tmp_path / "p", "pruner", TokenPruner(6, query_dim=3), ["a", "b"])
    save_learned(tmp_path / "s", "selector", PatchSelector(cell=8, width=4), ["a", "b"])
    save_learned(tmp_path / "q", "pruner", TokenPruner(6, query_dim=3), ["a"], query_encoder="MiniLMQueryEncoder")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    cases = [
        (("pruner", tmp_path / "missing.pt"), {}, r"missing.pt: no such file; expected pruner weights \(train one "
                                                  r"with `arr-coc train --learner pruner`\)"),
        (("pruner", tmp_path / "s"), {}, "s holds selector weights, not pruner weights"),
        (("pruner", tmp_path / "junk.pt"), {}, r"junk.pt is not a file torch.save wrote \(it begins b'not '\); "
                                               "expected pruner weights"),
        (("pruner", tmp_path / "p"), {"channels": ["a", "c"]}, r"prunes tokens of channels \['a', 'b'\], "
                                                                  r"this ARR makes \['a', 'c'\]"),
        (("pruner", tmp_path / "p"), {"query_dim": 384}, "expects 3-wide query embeddings, got 384"),
        (("pruner", tmp_path / "q"), {"query_encoder": "HashingQueryEncoder"},
         "trained on questions embedded by MiniLMQueryEncoder, this ARR uses HashingQueryEncoder"),
        (("selector", tmp_path / "s"), {"cell": 28}, "scores 8 px cells, the canvas uses 28 px"),
        (("oracle",), {}, "unknown learned allocator 'oracle'; choose one of selector, pruner"),
    ]
    for args, kw, message in cases:
        with pytest.raises(ValueError, match=message):
            load_learned(*args, **kw)


def test_the_packaged_selector_and_pruner_fit_the_default_pipeline():
    from arr_coc.config import ARRConfig
    from arr_coc.engine.pipeline import PIPELINE_CHANNELS
    from arr_coc.weights import PACKAGED, load_learned

    for kind in ("selector", "pruner"):
        if not (PACKAGED / kind / "model.safetensors").exists():
            pytest.fail(f"arr_coc/weights/{kind}/ is missing: run benchmarks/run_allocators.py")
        net, meta = load_learned(kind, cell=ARRConfig().canvas.cell)
        # retrained on the group splits at 10 % of the tokens, the setting the defaults were chosen at
        assert meta["train_config"]["learner"] == kind and meta["train_config"]["tokens"] == "10%"
        assert meta["query_encoder"] == "MiniLMQueryEncoder"
    pruner, meta = load_learned("pruner", channels=meta["channels"], query_dim=384)
    assert pruner.config["dim"] == len(meta["channels"]) + 2  # rgb is three channels
    assert tuple(meta["channels"]) == tuple(PIPELINE_CHANNELS)
