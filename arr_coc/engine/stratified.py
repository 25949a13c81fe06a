"""Stratified sampling: every non-empty stratum of a grid over the image gets a token, the rest by importance.

The strata split each image's own valid extent (not the padded canvas); quotas are proportional to a
stratum's relevance mass with capacity caps (`allocate_quotas`); within a stratum the most relevant cells
are taken. `StratifiedSampler` (`arr_coc.engine.samplers`) and the learned adaptive stratified sampler
both draw through `stratified_cells`. Notation as in `arr_coc.engine.selection`.
"""
from __future__ import annotations

import torch
from torch import Tensor

from arr_coc.engine.selection import Selection, check_budget, rank_cells, select_cells, shift_nonnegative, valid_extent


def _as_grid(grid: tuple[int, int] | Tensor, batch: int, device: torch.device) -> Tensor:
    g = torch.as_tensor(grid, dtype=torch.long, device=device)
    g = g.expand(batch, 2) if g.shape == (2,) else g
    if g.shape != (batch, 2) or bool((g < 1).any()):
        raise ValueError(f"grid must be (gh, gw) or [B, 2] with entries >= 1, got {grid}")
    return g


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
