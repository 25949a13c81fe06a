"""Samplers: pick exactly K token cells per image from a relevance map (top-K, NMS, stratified, baselines).

The samplers with learnable parameters (adaptive stratified, pseudo-log-polar) live in
`arr_coc.engine.learned_samplers` and register into the same `SAMPLERS`; the stratified algorithm is
`arr_coc.engine.stratified`. Every sampler keeps the contract of `arr_coc.engine.selection`: exactly K
distinct valid cells per image, ordered by relevance (high -> low, ties by lower flat index), or ValueError.

Notation: B images on a padded canvas of Hc x Wc token cells, N = Hc * Wc cells in flat raster order
(flat index = y * Wc + x), K the budget.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from arr_coc.engine.selection import Selection, check_budget, rank_cells, select_cells, valid_extent
from arr_coc.engine.stratified import coarsen_grid, stratified_cells
from arr_coc.registry import Registry

SAMPLERS: Registry[type[Sampler]] = Registry("sampler")  # name -> Sampler subclass, built with keyword args


# ----------------------------------------------------------------------------- top-K and NMS


def topk_cells(relevance: Tensor, k: int, valid: Tensor | None = None) -> Selection:
    """The K most relevant valid cells (ties by lower flat index).

    Example:
        >>> topk_cells(torch.tensor([[[0.1, 0.9], [0.5, 0.3]]]), 2).positions.tolist()
        [[[0, 1], [1, 0]]]
    """
    valid = check_budget(relevance, k, valid)
    best = rank_cells(relevance.flatten(1), valid.flatten(1))[:, :k]  # [B, K] flat cells
    chosen = torch.zeros_like(valid.flatten(1)).scatter_(1, best, True)
    return select_cells(relevance, chosen, k)


def nms_cells(
    relevance: Tensor, k: int, valid: Tensor | None = None, min_distance: float = 2, metric: str = "chebyshev"
) -> Selection:
    """Greedy non-maximum suppression, still exactly K cells.

    Cells are taken in relevance order; each pick suppresses every cell closer than `min_distance` cells
    (Chebyshev max(|dy|, |dx|) or Euclidean), so chosen cells are pairwise >= `min_distance` apart
    whenever the picks suffice. `min_distance=1` is plain top-K; 2 means no two chosen cells touch,
    not even diagonally. When suppression leaves fewer than K picks, the remaining slots go to the most
    relevant suppressed cells (the budget is exact; spacing is then best effort). The loop runs over the
    K picks; each step suppresses a fixed stencil of offsets around every image's pick at once.

    Example:
        >>> rel = torch.tensor([[[9.0, 8.0, 1.0], [7.0, 0.0, 2.0]]])
        >>> nms_cells(rel, 2).positions.tolist()
        [[[0, 0], [1, 2]]]
    """
    valid = check_budget(relevance, k, valid)
    if metric not in ("chebyshev", "euclidean") or not min_distance >= 1:
        raise ValueError(
            f"need metric 'chebyshev' or 'euclidean' and min_distance >= 1, got {metric!r}, {min_distance}"
        )
    b, hc, wc = relevance.shape
    n = hc * wc
    flat_rel, flat_valid = relevance.flatten(1), valid.flatten(1)
    order = rank_cells(flat_rel, flat_valid)
    rank = torch.empty_like(order).scatter_(1, order, torch.arange(n, device=order.device).expand(b, n))  # [B, N]
    # A pick suppresses a fixed stencil of offsets, so each step touches |stencil| cells, not the canvas.
    r = math.ceil(min_distance) - 1
    dy, dx = torch.meshgrid(*(torch.arange(-r, r + 1, device=relevance.device),) * 2, indexing="ij")
    near = torch.maximum(dy.abs(), dx.abs()) if metric == "chebyshev" else torch.hypot(dy.float(), dx.float())
    dy, dx = dy[near < min_distance], dx[near < min_distance]  # [M] stencil, includes (0, 0)
    # Availability is kept in rank order, so the best available cell is the first 1 (one argmax per step).
    available = torch.cat((flat_valid.gather(1, order), torch.zeros_like(flat_valid[:, :1])), 1).to(torch.uint8)
    chosen = torch.zeros_like(flat_valid)
    rank = torch.cat((rank, torch.full_like(rank[:, :1], n)), 1)  # [B, N + 1]; column N = sink for off-canvas
    for _ in range(k):
        first = available.argmax(1, keepdim=True)  # [B, 1] rank of the best available cell
        has = available.gather(1, first).bool()
        if not bool(has.any()):
            break
        pick = order.gather(1, first.clamp(max=n - 1))  # [B, 1] flat cell
        chosen.scatter_(1, pick, has | chosen.gather(1, pick))
        ny, nx = pick // wc + dy, pick % wc + dx  # [B, M]
        inside = (ny >= 0) & (ny < hc) & (nx >= 0) & (nx < wc)
        available.scatter_(1, rank.gather(1, torch.where(inside, ny * wc + nx, n)), 0)
    need = k - chosen.sum(1, keepdim=True)  # [B, 1]
    spare = rank_cells(flat_rel, flat_valid & ~chosen)
    fill = torch.arange(n, device=order.device)[None] < need
    chosen = chosen.scatter(1, spare, fill | chosen.gather(1, spare))
    return select_cells(relevance, chosen, k)


# ----------------------------------------------------------------------------- baselines


def lattice_cells(valid: Tensor, k: int) -> Tensor:
    """A K-point lattice `[B, K, 2]` (y, x) cells filling each valid extent: r rows (~sqrt(K h / w)) of
    nearly equal length, rows and points within a row at evenly spaced cell centres; always K distinct cells."""
    y0, x0, h, w = valid_extent(valid)
    rows = torch.round(torch.sqrt(k * h / w)).long()
    rows = torch.maximum(torch.minimum(rows, h.clamp(max=k)), (k + w - 1) // w)[:, None]  # [B, 1]; row length <= w
    j = torch.arange(k, device=valid.device)[None]  # [1, K]
    i = ((j + 1) * rows - 1) // k  # [B, K] lattice row of point j
    first = (i * k) // rows
    length = ((i + 1) * k) // rows - first
    y = y0[:, None] + ((2 * i + 1) * h[:, None]) // (2 * rows)
    x = x0[:, None] + ((2 * (j - first) + 1) * w[:, None]) // (2 * length)
    return torch.stack((y, x), -1)


def uniform_cells(relevance: Tensor, k: int, valid: Tensor | None = None) -> Selection:
    """K evenly spaced valid cells: the `lattice_cells` lattice; if the valid region is not a full rectangle,
    the K valid cells nearest to a lattice point (Euclidean cell distance, ties by flat index).

    Example:
        >>> sorted(map(tuple, uniform_cells(torch.zeros(1, 4, 4), 4).positions[0].tolist()))
        [(1, 1), (1, 3), (3, 1), (3, 3)]
    """
    valid = check_budget(relevance, k, valid)
    lattice = lattice_cells(valid, k)  # [B, K, 2]
    hc, wc = valid.shape[1:]
    cells = torch.stack(torch.meshgrid(torch.arange(hc), torch.arange(wc), indexing="ij"), -1).view(1, -1, 2)
    cells = cells.to(valid.device, torch.float32).expand(valid.shape[0], -1, -1)  # [B, N, 2]
    # Elementwise (not matmul) distances: exact, so lattice cells score exactly 0 and batching changes nothing.
    dist = torch.cdist(cells, lattice.float(), compute_mode="donot_use_mm_for_euclid_dist").amin(2)  # [B, N]
    flat_valid = valid.flatten(1)
    chosen = torch.zeros_like(flat_valid).scatter_(1, rank_cells(-dist, flat_valid)[:, :k], True)
    return select_cells(relevance, chosen, k)


def random_cells(
    relevance: Tensor, k: int, valid: Tensor | None = None, generator: torch.Generator | None = None
) -> Selection:
    """K distinct valid cells uniformly at random: the K valid cells with the smallest random keys.

    One key field `[Hc, Wc]` is drawn per call and shared by the batch, so a selection depends on the
    generator, canvas and valid mask only, never on the image's place in the batch.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> tuple(random_cells(torch.zeros(2, 3, 3), 4, generator=g).positions.shape)
        (2, 4, 2)
    """
    valid = check_budget(relevance, k, valid)
    device = generator.device if generator is not None else relevance.device
    keys = torch.rand(valid[0].numel(), generator=generator, device=device).to(relevance.device)
    flat_valid = valid.flatten(1)
    chosen = torch.zeros_like(flat_valid).scatter_(1, rank_cells(-keys.expand_as(flat_valid), flat_valid)[:, :k], True)
    return select_cells(relevance, chosen, k)


def module_dtype(module: nn.Module) -> torch.dtype | None:
    """The dtype of a module's first floating parameter (what its inputs are cast to), None without one.

    >>> module_dtype(nn.Linear(2, 2).double()), module_dtype(TopKSampler())
    (torch.float64, None)
    """
    return next((p.dtype for p in module.parameters() if p.is_floating_point()), None)


def select(sampler: nn.Module, relevance: Tensor, k: int, *, valid: Tensor | None = None,
           query_emb: Tensor | None = None, seed: int | None = None) -> Selection:
    """The one way a sampler is called: ``sampler`` on a detached relevance map [B, Hc, Wc], K cells each.

    ``ARR.forward``, every allocation method of :mod:`arr_coc.allocators.methods` and the VLM path
    call samplers through here, so a sampler sees the same arguments wherever it runs. ``seed``
    seeds a fresh CPU generator (the stochastic samplers draw from it; None: torch's global one).

    Example:
        >>> select(TopKSampler(), torch.tensor([[[0.1, 0.9], [0.5, 0.3]]]), 2).positions.tolist()
        [[[0, 1], [1, 0]]]
    """
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    dtype = module_dtype(sampler)  # a learned sampler moved to float64 / bfloat16 reads in its own precision
    if dtype is not None:
        relevance, query_emb = relevance.to(dtype), None if query_emb is None else query_emb.to(dtype)
    return sampler(relevance.detach(), k, valid=valid, query_emb=query_emb, generator=generator)


# ----------------------------------------------------------------------------- registered modules


class Sampler(nn.Module):
    """Base sampler: `forward(relevance [B, Hc, Wc], k, *, valid, query_emb, generator) -> Selection`."""

    def forward(
        self,
        relevance: Tensor,
        k: int,
        *,
        valid: Tensor | None = None,
        query_emb: Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> Selection:
        raise NotImplementedError


@SAMPLERS.register("topk")
class TopKSampler(Sampler):
    """Plain top-K (`topk_cells`)."""

    def forward(self, relevance, k, *, valid=None, query_emb=None, generator=None) -> Selection:
        return topk_cells(relevance, k, valid)


@SAMPLERS.register("nms")
class NMSSampler(Sampler):
    """Greedy NMS (`nms_cells`). Default min_distance=2 (Chebyshev): no two saccades touch, so a budget
    spreads over twice the area per axis while a 48x48 canvas still fits 576 > 273 separated picks."""

    def __init__(self, min_distance: float = 2, metric: str = "chebyshev") -> None:
        super().__init__()
        self.min_distance, self.metric = min_distance, metric

    def forward(self, relevance, k, *, valid=None, query_emb=None, generator=None) -> Selection:
        return nms_cells(relevance, k, valid, self.min_distance, self.metric)


@SAMPLERS.register("stratified")
class StratifiedSampler(Sampler):
    """Stratified sampling (`stratified_cells`) on a (4, 4) grid. When K is below an image's number of
    non-empty strata the grid is coarsened for that image (`coarsen_grid`) instead of raising."""

    def __init__(self, grid: tuple[int, int] = (4, 4)) -> None:
        super().__init__()
        self.grid = tuple(grid)

    def forward(self, relevance, k, *, valid=None, query_emb=None, generator=None) -> Selection:
        valid = check_budget(relevance, k, valid)
        return stratified_cells(relevance, k, valid, coarsen_grid(valid, k, self.grid))


@SAMPLERS.register("uniform")
class UniformSampler(Sampler):
    """Evenly spaced cells (`uniform_cells`), the query-blind baseline."""

    def forward(self, relevance, k, *, valid=None, query_emb=None, generator=None) -> Selection:
        return uniform_cells(relevance, k, valid)


@SAMPLERS.register("random")
class RandomSampler(Sampler):
    """Uniformly random cells (`random_cells`); without a generator, one seeded with `seed` keeps runs repeatable."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        self.seed = seed

    def forward(self, relevance, k, *, valid=None, query_emb=None, generator=None) -> Selection:
        generator = torch.Generator().manual_seed(self.seed) if generator is None else generator
        return random_cells(relevance, k, valid, generator)
