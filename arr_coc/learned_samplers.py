"""Samplers with learnable parameters: adaptive stratified (grid from the query) and pseudo-log-polar.

Both register into `arr_coc.samplers.SAMPLERS` and keep its contract: exactly K distinct valid cells
per image, ordered by relevance. Notation as in `arr_coc.samplers`.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from arr_coc.samplers import (
    SAMPLERS,
    Sampler,
    Selection,
    cell_coordinates,
    check_budget,
    coarsen_grid,
    rank_cells,
    select_cells,
    stratified_cells,
)


def foveated_bin_centres(
    n_bins: int = 273, foveal_fraction: float = 0.25, foveal_sigma: float = 0.05, seed: int = 0
) -> Tensor:
    """Initial bin centres `[n_bins, 2]` (y, x) in [0, 1]^2: a Gaussian fovea at the centre plus uniform periphery.

    A fixed seed makes construction deterministic (two samplers built alike select alike).
    """
    g = torch.Generator().manual_seed(seed)
    n_fovea = int(foveal_fraction * n_bins)
    fovea = (torch.randn(n_fovea, 2, generator=g) * foveal_sigma + 0.5).clamp(0, 1)
    return torch.cat((fovea, torch.rand(n_bins - n_fovea, 2, generator=g)))


def gaze_point(relevance: Tensor, valid: Tensor | None = None, mode: str = "argmax") -> Tensor:
    """Gaze `[B, 2]` (y, x) in [0, 1] over the valid extent: the most relevant cell, or the centroid of
    relevance shifted to be non-negative (`mode="centroid"`; differentiable, pulled to the middle by diffuse maps)."""
    valid = torch.ones_like(relevance, dtype=torch.bool) if valid is None else valid
    coords = cell_coordinates(valid).to(relevance.dtype)  # [B, N, 2]
    rel, flat_valid = relevance.flatten(1), valid.flatten(1)
    if mode == "argmax":
        best = rank_cells(rel, flat_valid)[:, :1]  # [B, 1]
        return coords.gather(1, best[..., None].expand(-1, 1, 2))[:, 0]
    if mode != "centroid":
        raise ValueError(f"gaze mode must be 'argmax' or 'centroid', got {mode!r}")
    rel = rel.masked_fill(~flat_valid, 0.0)
    w = (rel - rel.masked_fill(~flat_valid, math.inf).amin(1, keepdim=True)).masked_fill(~flat_valid, 0.0)
    w = torch.where(w.sum(1, keepdim=True) > 0, w, flat_valid.to(w.dtype))  # a flat map looks at the middle
    return (w[..., None] * coords).sum(1) / w.sum(1)[:, None]


def _recentred(centres: Tensor, gaze: Tensor) -> Tensor:
    # Move the layout's (0.5, 0.5) onto the gaze; clamping folds bins that fall off the image onto its border.
    return (centres.to(gaze.dtype)[None] - 0.5 + gaze[:, None]).clamp(0, 1)  # [B, n_bins, 2]


def log_polar_assignment(
    coords: Tensor, centres: Tensor, gaze: Tensor, temperature: float = 0.05, valid: Tensor | None = None
) -> Tensor:
    """Soft assignment `[B, N, n_bins]` of cells to gaze-recentred bins (differentiable in centres and gaze).

    a[b, j, i] = softmax_i(-|p_j - c_i|^2 / (2 temperature^2)): a Gaussian kernel of bandwidth
    `temperature` (normalised units) shared out over bins. Invalid cells (`valid` `[B, N]`) get zero rows.
    """
    d2 = ((coords[:, :, None] - _recentred(centres, gaze)[:, None]) ** 2).sum(-1)  # [B, N, n_bins]
    a = torch.softmax(-d2 / (2 * temperature**2), dim=-1)
    return a if valid is None else a * valid[..., None].to(a.dtype)


def bin_coverage_loss(assignment: Tensor, min_mass: float = 0.5) -> Tensor:
    """Penalty for dead bins: mean over images of sum_i relu(min_mass - mass_i)^2, mass_i = sum_j a[b, j, i].

    The seed counted bins below 0.5 (zero gradient); the squared hinge keeps the same target smoothly.
    """
    return torch.relu(min_mass - assignment.sum(1)).pow(2).sum(1).mean()


def log_polar_cells(
    relevance: Tensor,
    k: int,
    centres: Tensor,
    valid: Tensor | None = None,
    gaze: Tensor | None = None,
    temperature: float = 0.05,
    bin_weight: float = 1.0,
) -> Selection:
    """Hard pseudo-log-polar selection: top-K of relevance plus proximity to the bins.

    score_j = (r_j - min r) / (max r - min r) + bin_weight * exp(-min_i |p_j - c_i|^2 / (2 temperature^2)),
    with c_i the bins recentred on `gaze` (default: the most relevant cell). Dense foveal bins favour cells
    near the gaze; peripheral bins keep a sparse spread elsewhere. Returned in relevance order.

    Example:
        >>> sel = log_polar_cells(torch.rand(2, 6, 6), 5, foveated_bin_centres(20))
        >>> tuple(sel.positions.shape)
        (2, 5, 2)
    """
    valid = check_budget(relevance, k, valid)
    if gaze is not None and gaze.shape != (relevance.shape[0], 2):
        raise ValueError(f"gaze must be [B, 2] (y, x) in [0, 1], got shape {tuple(gaze.shape)}")
    gaze = gaze_point(relevance, valid) if gaze is None else gaze.to(relevance.dtype)
    coords = cell_coordinates(valid).to(relevance.dtype)
    bins = _recentred(centres.detach(), gaze)
    d2 = torch.cdist(coords, bins, compute_mode="donot_use_mm_for_euclid_dist").amin(2) ** 2  # [B, N], exact per pair
    flat_valid = valid.flatten(1)
    rel = relevance.detach().flatten(1).masked_fill(~flat_valid, 0.0)
    lo = rel.masked_fill(~flat_valid, math.inf).amin(1, keepdim=True)
    span = rel.masked_fill(~flat_valid, -math.inf).amax(1, keepdim=True) - lo
    score = (rel - lo) / span.clamp_min(1e-30) + bin_weight * torch.exp(-d2 / (2 * temperature**2))
    chosen = torch.zeros_like(flat_valid).scatter_(1, rank_cells(score, flat_valid)[:, :k], True)
    return select_cells(relevance, chosen, k)



# ----------------------------------------------------------------------------- registered modules


@SAMPLERS.register("adaptive_stratified")
class AdaptiveStratifiedSampler(Sampler):
    """Stratified sampling with a per-image grid predicted from the query embedding.

    `grid_predictor` (query_dim -> hidden -> 2) maps to (gh, gw) = 1 + round(sigmoid(out) * (max_grid - 1)),
    each in [1, max_grid]. Rounding is not differentiable: train the predictor with a score-function or
    search objective, not through the selection. Images get their own grids in one vectorised pass;
    grids too fine for K are coarsened as in `StratifiedSampler`. Weights are initialised from `seed`.
    """

    def __init__(self, query_dim: int = 384, hidden: int = 64, max_grid: int = 8, seed: int = 0) -> None:
        super().__init__()
        self.max_grid = max_grid
        self.grid_predictor = nn.Sequential(nn.Linear(query_dim, hidden), nn.ReLU(), nn.Linear(hidden, 2))
        g = torch.Generator().manual_seed(seed)
        for layer in (self.grid_predictor[0], self.grid_predictor[2]):  # torch's default init, but seeded
            bound = 1 / math.sqrt(layer.in_features)
            nn.init.uniform_(layer.weight, -bound, bound, generator=g)
            nn.init.uniform_(layer.bias, -bound, bound, generator=g)

    def predict_grid(self, query_emb: Tensor) -> Tensor:
        """Grid `[B, 2]` (gh, gw) int64 per query."""
        dim = self.grid_predictor[0].in_features
        if query_emb.ndim != 2 or query_emb.shape[1] != dim:
            raise ValueError(f"query_emb must be [B, {dim}], got shape {tuple(query_emb.shape)}")
        out = self.grid_predictor(query_emb.to(self.grid_predictor[0].weight.dtype))
        return 1 + torch.round(torch.sigmoid(out) * (self.max_grid - 1)).long()

    def forward(self, relevance, k, *, valid=None, query_emb=None, generator=None) -> Selection:
        if query_emb is None:
            raise ValueError("adaptive_stratified predicts its grid from the query: pass query_emb [B, D]")
        valid = check_budget(relevance, k, valid)
        if query_emb.shape[0] != relevance.shape[0]:
            raise ValueError(f"query_emb has {query_emb.shape[0]} rows for {relevance.shape[0]} relevance maps")
        grid = self.predict_grid(query_emb).to(relevance.device)
        return stratified_cells(relevance, k, valid, coarsen_grid(valid, k, grid))


@SAMPLERS.register("log_polar")
class PseudoLogPolarSampler(Sampler):
    """Pseudo-log-polar sampler with learnable bin centres (`log_polar_cells`, `log_polar_assignment`).

    Args:
        n_bins: number of bins (273 = the default budget, one bin per saccade).
        temperature: kernel bandwidth in normalised units; 0.05 ~ the bin spacing of 273 bins over [0, 1]^2.
        bin_weight: weight of bin proximity against min-max-normalised relevance in the hard score.
        gaze_mode: "argmax" (fovea on the peak, like a saccade target) or "centroid".
        foveal_fraction, foveal_sigma, seed: initial layout (25% of bins N(0.5, 0.05^2), rest uniform).
    """

    def __init__(
        self,
        n_bins: int = 273,
        temperature: float = 0.05,
        bin_weight: float = 1.0,
        gaze_mode: str = "argmax",
        foveal_fraction: float = 0.25,
        foveal_sigma: float = 0.05,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.temperature, self.bin_weight, self.gaze_mode = temperature, bin_weight, gaze_mode
        centres = foveated_bin_centres(n_bins, foveal_fraction, foveal_sigma, seed)
        self.bin_centres = nn.Parameter(centres)  # [n_bins, 2] (y, x) in [0, 1]

    def forward(
        self, relevance, k, *, valid=None, query_emb=None, generator=None, gaze: Tensor | None = None
    ) -> Selection:
        valid = check_budget(relevance, k, valid)
        gaze = gaze_point(relevance, valid, self.gaze_mode) if gaze is None else gaze
        return log_polar_cells(relevance, k, self.bin_centres, valid, gaze, self.temperature, self.bin_weight)

    def soft_assignment(self, relevance: Tensor, valid: Tensor | None = None, gaze: Tensor | None = None) -> Tensor:
        """Differentiable soft assignment `[B, N, n_bins]` of the canvas cells to the recentred bins."""
        valid = torch.ones_like(relevance, dtype=torch.bool) if valid is None else valid
        gaze = gaze_point(relevance, valid, self.gaze_mode) if gaze is None else gaze
        coords = cell_coordinates(valid).to(self.bin_centres.dtype)
        return log_polar_assignment(coords, self.bin_centres, gaze.to(coords.dtype), self.temperature, valid.flatten(1))

    def coverage_loss(self, assignment: Tensor, min_mass: float = 0.5) -> Tensor:
        """`bin_coverage_loss` of a `soft_assignment` output."""
        return bin_coverage_loss(assignment, min_mass)
