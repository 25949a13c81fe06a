"""Samplers: pick exactly K token cells per image from a relevance map (top-K, NMS, stratified, baselines).

The samplers with learnable parameters (adaptive stratified, pseudo-log-polar) live in
`arr_coc.engine.learned_samplers` and register into the same `SAMPLERS`.

Notation: B images on a padded canvas of Hc x Wc token cells, N = Hc * Wc cells in flat raster order
(flat index = y * Wc + x), K the budget. Every sampler returns exactly K distinct valid cells per image,
ordered by relevance (high -> low, ties by lower flat index), or raises ValueError.
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from arr_coc.registry import Registry

SAMPLERS: Registry[type[Sampler]] = Registry("sampler")  # name -> Sampler subclass, built with keyword args


@dataclass
class Selection:
    """K chosen cells per image, ordered by relevance."""

    positions: Tensor  # [B, K, 2] (y, x) cells, int64
    scores: Tensor  # [B, K] relevance at positions, descending per row

    def mask(self, hc: int, wc: int) -> Tensor:
        """The chosen cells as a boolean map `[B, hc, wc]` (e.g. to score coverage of an answer box)."""
        flat = self.positions[..., 0] * wc + self.positions[..., 1]  # [B, K]
        out = torch.zeros(flat.shape[0], hc * wc, dtype=torch.bool, device=flat.device)
        return out.scatter_(1, flat, True).view(-1, hc, wc)


# ----------------------------------------------------------------------------- shared pieces


def as_budget(k: object) -> int:
    """K as an int; anything else (a float, a bool, a tensor of several values) is a TypeError.

    >>> as_budget(3), as_budget(torch.tensor(4))
    (3, 4)
    """
    try:
        if isinstance(k, bool):
            raise TypeError
        return operator.index(k)
    except TypeError:
        raise TypeError(f"budget K must be an int, got {type(k).__name__}") from None


def check_budget(relevance: Tensor, k: int, valid: Tensor | None = None) -> Tensor:
    """Validate a sampler call; returns the valid mask `[B, Hc, Wc]` bool (all True for None).

    Raises:
        ValueError: bad shapes, NaN/inf in a valid cell, K < 1, or K above some image's valid-cell count.
    """
    if relevance.ndim != 3 or not relevance.is_floating_point():
        raise ValueError(
            f"relevance must be a float [B, Hc, Wc] map, got {relevance.dtype} of shape {tuple(relevance.shape)}"
        )
    k = as_budget(k)
    if valid is None:
        valid = torch.ones(relevance.shape, dtype=torch.bool, device=relevance.device)
    elif valid.shape != relevance.shape or valid.dtype != torch.bool:
        raise ValueError(
            f"valid must be bool of shape {tuple(relevance.shape)}, got {valid.dtype} {tuple(valid.shape)}"
        )
    bad = int((~torch.isfinite(relevance) & valid).sum())
    if bad:
        raise ValueError(
            f"relevance has {bad} NaN/inf values in valid cells; fix the scorer or mark those cells invalid"
        )
    if k < 1:
        raise ValueError(f"budget K={k} must be at least 1")
    counts = valid.flatten(1).sum(1)  # [B]
    short = (counts < k).nonzero()
    if len(short):
        b = int(short[0])
        raise ValueError(
            f"budget K={k} exceeds the {int(counts[b])} valid cells of image {b}; "
            "lower --saccades or raise the canvas size"
        )
    return valid


def rank_cells(key: Tensor, eligible: Tensor) -> Tensor:
    """Flat cell indices `[B, N]`: eligible cells first, then `key` descending, ties by lower flat index.

    Two stable sorts (secondary key first) give the exact deterministic order torch.topk does not promise.
    """
    order = torch.sort(key, dim=1, descending=True, stable=True).indices  # [B, N]
    demote = (~eligible).gather(1, order).to(torch.uint8)
    return order.gather(1, torch.sort(demote, dim=1, stable=True).indices)


def select_cells(relevance: Tensor, chosen: Tensor, k: int) -> Selection:
    """Turn a flat mask `[B, N]` with exactly K True per row into a relevance-ordered Selection."""
    flat_rel = relevance.flatten(1)
    idx = rank_cells(flat_rel, chosen)[:, :k]  # [B, K] flat cells
    wc = relevance.shape[2]
    return Selection(torch.stack((idx // wc, idx % wc), dim=-1), flat_rel.gather(1, idx))


def valid_extent(valid: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Bounding box of each image's valid cells: (y0, x0, h, w), each `[B]` int64."""
    rows, cols = valid.any(2).long(), valid.any(1).long()  # [B, Hc], [B, Wc]
    y0, x0 = rows.argmax(1), cols.argmax(1)
    h = valid.shape[1] - rows.flip(1).argmax(1) - y0
    w = valid.shape[2] - cols.flip(1).argmax(1) - x0
    return y0, x0, h, w


def shift_nonnegative(relevance: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
    """Relevance minus its minimum over each image's valid cells (0 on invalid cells), and each image's span.

    The one way relevance becomes a non-negative mass (stratum importances, patch sums, centroids, weights):
    a scorer's additive offset then changes nothing (logits and logits + c give the same shifted map).

    Args:
        relevance: `[B, ...]` float.
        valid: bool, the shape of `relevance`.

    Returns:
        (shifted `[B, ...]` >= 0 with 0 on invalid cells, span `[B, 1, ...]` = max - min over valid cells).

    Example:
        >>> shifted, span = shift_nonnegative(torch.tensor([[3.0, -1.0, 9.0]]), torch.tensor([[True, True, False]]))
        >>> shifted.tolist(), span.tolist()
        ([[4.0, 0.0, 0.0]], [[4.0]])
    """
    keep = (-1,) + (1,) * (relevance.ndim - 1)  # [B, 1, ...]
    lo = relevance.masked_fill(~valid, math.inf).flatten(1).amin(1).view(keep)
    hi = relevance.masked_fill(~valid, -math.inf).flatten(1).amax(1).view(keep)
    return torch.where(valid, relevance - lo, 0.0), hi - lo


def cell_coordinates(valid: Tensor) -> Tensor:
    """Cell centres `[B, N, 2]` (y, x) normalised to [0, 1] over each image's own valid extent (padding ignored)."""
    y0, x0, h, w = valid_extent(valid)
    ys = torch.arange(valid.shape[1], device=valid.device)
    xs = torch.arange(valid.shape[2], device=valid.device)
    ny = (ys[None] - y0[:, None] + 0.5) / h[:, None]  # [B, Hc]
    nx = (xs[None] - x0[:, None] + 0.5) / w[:, None]  # [B, Wc]
    b, hc, wc = valid.shape
    return torch.stack((ny[:, :, None].expand(b, hc, wc), nx[:, None, :].expand(b, hc, wc)), -1).reshape(b, -1, 2)


def _as_grid(grid: tuple[int, int] | Tensor, batch: int, device: torch.device) -> Tensor:
    g = torch.as_tensor(grid, dtype=torch.long, device=device)
    g = g.expand(batch, 2) if g.shape == (2,) else g
    if g.shape != (batch, 2) or bool((g < 1).any()):
        raise ValueError(f"grid must be (gh, gw) or [B, 2] with entries >= 1, got {grid}")
    return g


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


# ----------------------------------------------------------------------------- stratified


def stratum_ids(valid: Tensor, grid: tuple[int, int] | Tensor) -> Tensor:
    """Stratum of every cell `[B, Hc, Wc]` int64 (row-major over the grid), -1 for invalid cells.

    Strata split each image's own valid extent (not the padded canvas) by cell index: extent row r goes
    to stratum row floor(r * gh / h). `grid` is (gh, gw) or `[B, 2]` per image.
    """
    g = _as_grid(grid, valid.shape[0], valid.device)
    y0, x0, h, w = valid_extent(valid)
    ys = torch.arange(valid.shape[1], device=valid.device)[None] - y0[:, None]  # [B, Hc]
    xs = torch.arange(valid.shape[2], device=valid.device)[None] - x0[:, None]  # [B, Wc]
    sy = (ys * g[:, :1]).div(h[:, None], rounding_mode="floor").clamp(min=0)
    sx = (xs * g[:, 1:]).div(w[:, None], rounding_mode="floor").clamp(min=0)
    ids = sy[:, :, None] * g[:, 1, None, None] + sx[:, None, :]  # [B, Hc, Wc]
    return torch.where(valid, ids, -1)


def _stratum_stats(relevance: Tensor, valid: Tensor, grid: tuple[int, int] | Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Stratum ids `[B, N]` (invalid -> S), cell counts and importances `[B, S]` (S = largest grid's strata)."""
    g = _as_grid(grid, relevance.shape[0], relevance.device)
    s = int(g.prod(1).max())
    sid = stratum_ids(valid, g).flatten(1)
    sid = torch.where(sid < 0, s, sid)
    flat_valid = valid.flatten(1)
    # Shift relevance to be positive: r - min + eps, eps = 1e-6 * range (1 for a flat map, giving every
    # cell equal weight), so importance is scale-invariant and a stratum's share never hits zero.
    shifted, span = shift_nonnegative(relevance.flatten(1).double(), flat_valid)  # [B, N], [B, 1]
    weight = torch.where(flat_valid, shifted + torch.where(span > 0, 1e-6 * span, 1.0), 0.0)
    counts = torch.zeros(shifted.shape[0], s + 1, dtype=torch.long, device=shifted.device)
    counts = counts.scatter_add_(1, sid, flat_valid.long())
    importance = torch.zeros_like(counts, dtype=torch.float64).scatter_add_(1, sid, weight)
    return sid, counts[:, :s], importance[:, :s]


def allocate_quotas(importance: Tensor, counts: Tensor, k: int) -> Tensor:
    """Tokens per stratum `[B, S]`: 1 per non-empty stratum, the rest proportional to importance.

    Largest-remainder rounding (ties to the lower stratum index) with capacity caps: a stratum whose
    proportional share reaches its cell count is filled and the surplus is shared among the others
    (water-filling; at most S rounds, each vectorised over the batch). Rows sum to exactly K.

    Example:
        >>> allocate_quotas(torch.tensor([[4.0, 0.1, 0.1, 0.1]]), torch.tensor([[4, 4, 4, 4]]), 8).tolist()
        [[4, 2, 1, 1]]
    """
    importance = importance.double()
    base = (counts > 0).long()
    over = (base.sum(1) > k).nonzero()
    if len(over):
        b = int(over[0])
        raise ValueError(
            f"K={k} is smaller than the {int(base[b].sum())} non-empty strata of image {b}; raise K, pass a coarser "
            "grid, or use StratifiedSampler, which coarsens it"
        )
    cap = (counts - base).clamp(min=0)
    left = (k - base.sum(1)).double()  # [B] tokens still to place
    filled = torch.zeros_like(counts)
    open_ = cap > 0
    for _ in range(counts.shape[1] + 1):  # each round fills >= 1 stratum, so the last one always breaks
        imp = torch.where(open_, importance, 0.0)
        share = left[:, None] * imp / imp.sum(1, keepdim=True).clamp_min(1e-300)
        full = open_ & (share >= cap)
        if not bool(full.any()):
            break
        filled = torch.where(full, cap, filled)
        left = left - torch.where(full, cap, 0).sum(1)
        open_ &= ~full
    share = torch.where(open_, share, 0.0)
    whole = share.floor().long()
    extra = left.round().long() - whole.sum(1)  # [B] seats for the largest remainders
    order = torch.sort(torch.where(open_, share - whole, -1.0), dim=1, descending=True, stable=True).indices
    positions = torch.arange(whole.shape[1], device=whole.device).expand_as(whole)
    seat = torch.zeros_like(whole).scatter_(1, order, positions)  # [B, S] remainder rank of each stratum
    return base + filled + whole + (seat < extra[:, None]).long()


def stratified_cells(
    relevance: Tensor, k: int, valid: Tensor | None = None, grid: tuple[int, int] | Tensor = (4, 4)
) -> Selection:
    """Stratified importance sampling: every non-empty stratum gets a token, the rest by importance.

    A stratum's importance is the sum over its valid cells of r - min(r) + eps, eps = 1e-6 * (max(r) - min(r))
    (1 on a flat map, making quotas proportional to cell counts): non-negative whatever the scorer's sign
    convention, and never zero. Quotas come from `allocate_quotas`; within a stratum the most relevant
    cells are taken (rank cells by (stratum, -relevance) and keep rank < quota). `grid` may differ per
    image (`[B, 2]`). Raises ValueError if K is below the number of non-empty strata of some image
    (`coarsen_grid` fixes that).

    Example:
        >>> rel = torch.tensor([[[0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0]]])
        >>> stratified_cells(rel, 6, grid=(1, 3)).positions[0, :, 1].tolist()
        [6, 7, 8, 3, 4, 0]
    """
    valid = check_budget(relevance, k, valid)
    sid, counts, importance = _stratum_stats(relevance, valid, grid)
    quota = torch.cat((allocate_quotas(importance, counts, k), torch.zeros_like(counts[:, :1])), 1)  # [B, S + 1]
    b, n = sid.shape
    order = rank_cells(relevance.flatten(1), valid.flatten(1))
    by_stratum = torch.sort(sid.gather(1, order), dim=1, stable=True)  # relevance order kept inside a stratum
    cells, s_of = order.gather(1, by_stratum.indices), by_stratum.values
    full_counts = torch.zeros_like(quota).scatter_add_(1, sid, torch.ones_like(sid))
    start = full_counts.cumsum(1) - full_counts
    rank_in = torch.arange(n, device=sid.device)[None] - start.gather(1, s_of)
    chosen = torch.zeros_like(valid.flatten(1)).scatter_(1, cells, rank_in < quota.gather(1, s_of))
    return select_cells(relevance, chosen, k)


def coarsen_grid(valid: Tensor, k: int, grid: tuple[int, int] | Tensor) -> Tensor:
    """Per-image grid `[B, 2]` shrunk (larger side first, height on ties) until K covers its non-empty strata."""
    g = _as_grid(grid, valid.shape[0], valid.device).clone()
    for _ in range(int(g.sum(1).max())):
        ids = stratum_ids(valid, g).flatten(1)
        s = int(g.prod(1).max())
        hits = torch.zeros(ids.shape[0], s + 1, dtype=torch.bool, device=ids.device)
        over = hits.scatter_(1, torch.where(ids < 0, s, ids), True)[:, :s].sum(1) > k  # [B]
        if not bool(over.any()):
            break
        shrink_h = g[:, 0] >= g[:, 1]
        g = g - over[:, None] * torch.stack((shrink_h, ~shrink_h), 1).long()
    return g


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
