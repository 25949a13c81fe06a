"""Tests for arr_coc.viz: the allocation picture and the tokens-per-region count behind it."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from arr_coc.viz import plot_allocation, tokens_per_region


def topk_positions(relevance: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    scores, flat = relevance.flatten().topk(k)
    return torch.stack((flat // relevance.shape[1], flat % relevance.shape[1]), -1), scores  # [K, 2] (y, x) cells


def test_plot_allocation_writes_one_png_of_the_fixed_size(tmp_path):
    rel = torch.rand(6, 9, generator=torch.Generator().manual_seed(0))
    pos, scores = topk_positions(rel, 12)
    out = plot_allocation(torch.rand(3, 6 * 28, 9 * 28), rel, pos, scores, 28, tmp_path / "new" / "dir" / "a.png",
                          gestalt_grid=(4, 4), title="query: total?", region_grid=(3, 3))
    assert out == tmp_path / "new" / "dir" / "a.png"
    with Image.open(out) as png:
        assert png.format == "PNG" and png.size == (1800, 600)
        pixels = np.asarray(png.convert("L"))
    assert pixels.std() > 10  # something was drawn, not a blank canvas


def test_plot_allocation_accepts_numpy_grayscale_and_an_empty_budget(tmp_path):
    out = plot_allocation(np.full((1, 64, 64), 0.5), np.zeros((2, 2)), np.zeros((0, 2)), np.zeros(0), 32,
                          str(tmp_path / "empty.png"), gestalt_grid=(2, 2), region_grid=(2, 2))
    with Image.open(out) as png:
        assert png.size == (1800, 600)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(image=torch.rand(64, 64)), r"image must be \[C, H, W\] with C in \(1, 3\), got \(64, 64\)"),
        (dict(image=torch.rand(3, 60, 64)), "image H=60, W=64 are not multiples of cell=32"),
        (dict(image=torch.rand(3, 64, 64) * 255), r"image values must lie in \[0, 1\]"),
        (dict(relevance=torch.rand(3, 2)), r"relevance must be \[Hc, Wc\] = \(2, 2\).*got \(3, 2\)"),
        (dict(scores=torch.rand(3)), r"positions must be \[K, 2\] and scores \[K\], got \(2, 2\) and \(3,\)"),
        (dict(positions=torch.zeros(2, 3)), r"got \(2, 3\)"),
        (dict(positions=torch.tensor([[0, 0], [2, 1]])), r"position \(y=2, x=1\) is outside the 2 x 2 cell grid"),
        (dict(cell=0), "cell must be a positive int"),
        (dict(gestalt_grid=(16,)), "gestalt_grid must be two positive ints"),
    ],
)
def test_plot_allocation_rejects_mismatched_inputs(tmp_path, kwargs, match):
    args = dict(image=torch.rand(3, 64, 64), relevance=torch.rand(2, 2), positions=torch.tensor([[0, 0], [1, 1]]),
                scores=torch.tensor([0.9, 0.1]), cell=32, path=tmp_path / "x.png", region_grid=(2, 2))
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        plot_allocation(**args)
    assert not (tmp_path / "x.png").exists()


def test_plot_allocation_clamps_the_region_grid_to_a_small_image(tmp_path):
    # a 2 x 7 cell banner under the default 8 x 8 regions: one region per cell along the short side
    out = plot_allocation(torch.rand(3, 64, 224), torch.rand(2, 7), torch.tensor([[0, 0], [1, 6]]),
                          torch.tensor([0.9, 0.1]), 32, tmp_path / "banner.png", gestalt_grid=(2, 2))
    assert Image.open(out).size == (1800, 600)
    with pytest.raises(ValueError, match=r"region_grid \(8, 8\) is finer than the cell grid \(2, 7\)"):
        tokens_per_region(torch.tensor([[0, 0]]), (2, 7), (8, 8))  # the counting function itself stays strict


def test_tokens_per_region_counts_saccades_and_spreads_the_gestalt_by_area():
    pos = torch.tensor([[0, 0], [0, 1], [1, 1], [5, 5], [5, 4]])  # [K, 2] (y, x) cells on a 6 x 6 grid
    counts = tokens_per_region(pos, (6, 6), (3, 3), gestalt_tokens=18)
    expected = torch.full((3, 3), 2.0, dtype=torch.float64)  # 18 gestalt tokens over 9 equal regions
    expected[0, 0] += 3
    expected[2, 2] += 2
    assert counts.dtype == torch.float64 and torch.equal(counts, expected)


def test_tokens_per_region_gives_uneven_regions_their_area_share():
    counts = tokens_per_region(torch.zeros(0, 2, dtype=torch.long), (5, 1), (2, 1), gestalt_tokens=10)
    assert counts.flatten().tolist() == [6.0, 4.0]  # rows 0-2 -> region 0, rows 3-4 -> region 1


def test_tokens_per_region_batches_like_one_call_per_image():
    pos = torch.tensor([[[0, 0], [3, 3]], [[3, 0], [3, 1]]])  # [B, K, 2]
    batched = tokens_per_region(pos, (4, 4), (2, 2), gestalt_tokens=0)
    assert batched.shape == (2, 2, 2)
    for b in range(2):
        assert torch.equal(batched[b], tokens_per_region(pos[b], (4, 4), (2, 2), gestalt_tokens=0))
    assert batched[1].tolist() == [[0.0, 0.0], [2.0, 0.0]]


def test_tokens_per_region_rejects_bad_positions_and_grids():
    with pytest.raises(ValueError, match=r"positions must be \[K, 2\] or \[B, K, 2\].*got \(4,\)"):
        tokens_per_region(torch.zeros(4), (4, 4), (2, 2), 0)
    with pytest.raises(ValueError, match="integer cells"):
        tokens_per_region(torch.tensor([[0.5, 1.0]]), (4, 4), (2, 2), 0)
    with pytest.raises(ValueError, match=r"\(y=0, x=-1\) is outside the 4 x 4 cell grid"):
        tokens_per_region(torch.tensor([[0, -1]]), (4, 4), (2, 2), 0)
    with pytest.raises(ValueError, match="gestalt_tokens must be a non-negative int"):
        tokens_per_region(torch.tensor([[0, 0]]), (4, 4), (2, 2), -1)
    with pytest.raises(ValueError, match="region_grid must be two positive ints"):
        tokens_per_region(torch.tensor([[0, 0]]), (4, 4), (0, 2), 0)


@given(
    Hc=st.integers(1, 50),
    Wc=st.integers(1, 50),
    data=st.data(),
)
@settings(max_examples=80, deadline=None)
def test_tokens_per_region_totals_saccades_plus_gestalt(Hc, Wc, data):
    Ry, Rx = data.draw(st.integers(1, Hc)), data.draw(st.integers(1, Wc))
    K = data.draw(st.integers(0, Hc * Wc))
    gestalt = data.draw(st.integers(0, 1024))
    flat = torch.randperm(Hc * Wc)[:K]
    pos = torch.stack((flat // Wc, flat % Wc), -1)  # [K, 2] (y, x) cells
    counts = tokens_per_region(pos, (Hc, Wc), (Ry, Rx), gestalt)
    saccades_only = tokens_per_region(pos, (Hc, Wc), (Ry, Rx), 0)
    assert counts.shape == (Ry, Rx)
    assert saccades_only.sum().item() == K and torch.equal(saccades_only, saccades_only.round())
    assert counts.sum().item() == pytest.approx(K + gestalt, abs=1e-9)
    assert (counts - saccades_only).sum().item() == pytest.approx(gestalt, abs=1e-9)
    assert (counts - saccades_only).min() >= 0
