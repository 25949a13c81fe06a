"""Samplers with learnable parameters: adaptive stratified (grid from the query) and pseudo-log-polar.

Both register into `arr_coc.engine.samplers.SAMPLERS` and keep its contract: exactly K distinct valid cells
per image, ordered by relevance. Notation as in `arr_coc.engine.samplers`.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from arr_coc.engine.samplers import SAMPLERS, Sampler
from arr_coc.engine.selection import (
    Selection,
    cell_coordinates,
    check_budget,
    rank_cells,
    select_cells,
    shift_nonnegative,
)
from arr_coc.engine.soft_topk import soft_topk
from arr_coc.engine.stratified import coarsen_grid, stratified_cells


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
    w, _ = shift_nonnegative(rel, flat_valid)  # [B, N]
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

    Counting the bins below 0.5 would have zero gradient; the squared hinge keeps that target smoothly.
    """
    return torch.relu(min_mass - assignment.sum(1)).pow(2).sum(1).mean()


def log_polar_scores(
    relevance: Tensor,
    centres: Tensor,
    valid: Tensor,
    gaze: Tensor,
    temperature: float = 0.05,
    bin_weight: float = 1.0,
    softness: float = 0.0,
) -> Tensor:
    """Log-polar score `[B, N]` of every cell (`log_polar_cells`' formula), differentiable in relevance and centres.

    `softness` s = 0 takes the exact min over bins: the hard sampler's score, bit for bit. s > 0 replaces the
    min by the soft-min -tau * logsumexp(-d2 / tau), tau = s * 2 temperature^2, smooth in the centres and at
    most tau * log(n_bins) below the min; the proximity term then is the 1/s-norm of the bins' Gaussian
    kernels (s = 1: their sum). Scores of invalid cells are meaningless.
    """
    coords = cell_coordinates(valid).to(relevance.dtype)  # [B, N, 2]
    bins = _recentred(centres, gaze)  # [B, n_bins, 2]
    if softness == 0:
        wide = torch.promote_types(coords.dtype, torch.float32)  # torch has no half-precision cdist on the CPU
        d2 = torch.cdist(coords.to(wide), bins.to(wide), compute_mode="donot_use_mm_for_euclid_dist").amin(2)
        d2 = (d2**2).to(coords.dtype)  # [B, N], exact per pair
    else:
        tau = softness * 2 * temperature**2
        d2 = -tau * torch.logsumexp(-((coords[:, :, None] - bins[:, None]) ** 2).sum(-1) / tau, dim=2)  # [B, N]
    flat_valid = valid.flatten(1)
    shifted, span = shift_nonnegative(relevance.flatten(1), flat_valid)  # [B, N], [B, 1]
    return shifted / span.clamp_min(1e-30) + bin_weight * torch.exp(-d2 / (2 * temperature**2))


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
    score = log_polar_scores(relevance.detach(), centres.detach(), valid, gaze, temperature, bin_weight)
    chosen = torch.zeros_like(valid.flatten(1)).scatter_(1, rank_cells(score, valid.flatten(1))[:, :k], True)
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
        return self.grid_of(self.grid_predictor(query_emb.to(self.grid_predictor[0].weight.dtype)))

    def grid_of(self, out: Tensor) -> Tensor:
        """Grid `[..., 2]` (gh, gw) int64 from the predictor's raw output `[..., 2]`."""
        return 1 + torch.round(torch.sigmoid(out) * (self.max_grid - 1)).long()

    def forward(self, relevance, k, *, valid=None, query_emb=None, generator=None) -> Selection:
        if query_emb is None:
            raise ValueError("adaptive_stratified predicts its grid from the query: pass query_emb [B, D]")
        valid = check_budget(relevance, k, valid)
        if query_emb.shape[0] != relevance.shape[0]:
            raise ValueError(f"query_emb has {query_emb.shape[0]} rows for {relevance.shape[0]} relevance maps")
        grid = self.predict_grid(query_emb).to(relevance.device)
        return stratified_cells(relevance, k, valid, coarsen_grid(valid, k, grid))

    def loss(self, relevance: Tensor, valid: Tensor, query_emb: Tensor | None, target: Tensor,
             k: int | Sequence[int], *, temperature: float = 0.1, generator: torch.Generator | None = None,
             n_samples: int = 8, sigma: float = 0.5) -> Tensor:
        """Training loss of the grid predictor: the rounded grid has no gradient, so the score-function
        estimator (`score_function_surrogate`) over `n_samples` hard stratified selections with grids from
        out + sigma * eps, eps `[B, n_samples, 2]` ~ N(0, I) drawn from ``generator`` (the global RNG if
        None). The value is 1 - mean share of the target `[B, Hc, Wc]` covered, the gradient the
        estimator's. Relevance is detached; images without target area are skipped; `k` is one budget or
        one per image; ``temperature`` is not used (the selections are hard).
        """
        relevance, valid, target, ks, has = _loss_inputs(relevance, valid, target, k)
        if query_emb is None or len(query_emb) != len(relevance):
            raise ValueError(f"adaptive_stratified needs query_emb [{len(relevance)}, D] to predict its grids")
        out = self.grid_predictor(query_emb.to(self.grid_predictor[0].weight.dtype))  # [B, 2]
        eps = torch.randn(*out.shape[:1], n_samples, 2, generator=generator,
                          device=generator.device if generator is not None else out.device).to(out)  # [B, n, 2]
        grids = self.grid_of(out.detach()[:, None] + sigma * eps)  # [B, n, 2]
        reward = torch.stack([_stratified_shares(r, v, t, kb, g) for r, v, t, kb, g in
                              zip(relevance, valid, target, ks, grids)])  # [B, n]
        loss = _masked_mean(1 - reward.mean(1), has)
        surrogate = _masked_mean(score_function_surrogate(out, eps, reward, sigma), has)
        return loss + surrogate - surrogate.detach()


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

    def soft_scores(
        self, relevance: Tensor, valid: Tensor | None = None, gaze: Tensor | None = None, softness: float = 0.1
    ) -> Tensor:
        """Smooth scores `[B, Hc, Wc]` (`log_polar_scores`); with softness=0 their top-K is `forward`'s selection."""
        valid = torch.ones_like(relevance, dtype=torch.bool) if valid is None else valid
        gaze = gaze_point(relevance, valid, self.gaze_mode) if gaze is None else gaze
        scores = log_polar_scores(
            relevance, self.bin_centres, valid, gaze.to(relevance.dtype), self.temperature, self.bin_weight, softness
        )
        return scores.view_as(relevance)

    def coverage_loss(self, assignment: Tensor, min_mass: float = 0.5) -> Tensor:
        """`bin_coverage_loss` of a `soft_assignment` output."""
        return bin_coverage_loss(assignment, min_mass)

    def loss(self, relevance: Tensor, valid: Tensor, query_emb: Tensor | None, target: Tensor,
             k: int | Sequence[int], *, temperature: float = 0.1, generator: torch.Generator | None = None) -> Tensor:
        """Training loss of the bin centres: 1 - mean share of the target `[B, Hc, Wc]` that a `soft_topk`
        (``temperature``) of `soft_scores` over the valid cells covers, plus SPREAD_WEIGHT times
        `bin_coverage_loss` so that no bin dies. Relevance is detached (the scorer has its own objective);
        images without target area are skipped; `k` is one budget or one per image. Deterministic:
        ``generator`` and ``query_emb`` are not used.
        """
        relevance, valid, target, ks, has = _loss_inputs(relevance, valid, target, k)
        gaze = gaze_point(relevance, valid, self.gaze_mode)
        scores = self.soft_scores(relevance, valid, gaze)  # [B, Hc, Wc]
        weights = torch.stack([
            torch.zeros_like(s).masked_scatter(v, soft_topk(s[v][None], kb, temperature)[0])
            for s, v, kb in zip(scores, valid, ks)
        ])  # [B, Hc, Wc], sums to K per image
        spread = bin_coverage_loss(self.soft_assignment(relevance, valid, gaze))
        return _masked_mean(1 - coverage_share(weights, target), has) + SPREAD_WEIGHT * spread


# ----------------------------------------------------------------------------- training the samplers' parameters

SPREAD_WEIGHT = 1e-3  # bin_coverage_loss weight: 273 dead bins cost 0.07 against 1 for a missed answer (a tie-breaker)


def coverage_share(weights: Tensor, target: Tensor) -> Tensor:
    """Share `[B]` of each image's target area that the (soft or hard) selection weights `[B, ...]` cover."""
    return (weights * target).flatten(1).sum(1) / target.flatten(1).sum(1).clamp_min(1e-12)


def score_function_surrogate(out: Tensor, eps: Tensor, reward: Tensor, sigma: float) -> Tensor:
    """Per-image surrogate `[B]` whose gradient in `out` `[B, 2]` is -mean_s((R_s - mean R) eps_s) / sigma.

    Gaussian-policy REINFORCE (an evolution strategy): `eps` `[B, n, 2]` are the noise draws that made the
    perturbed outputs out + sigma * eps, `reward` `[B, n]` their rewards. The mean reward is the baseline.
    """
    advantage = (reward - reward.mean(1, keepdim=True)).detach()  # [B, n]
    return -(advantage * (eps.detach() * out[:, None]).sum(-1)).mean(1) / sigma


def sampler_loss(
    sampler: nn.Module,
    relevance: Tensor,
    valid: Tensor,
    query_emb: Tensor | None,
    target: Tensor,
    k: int | Sequence[int],
    *,
    temperature: float = 0.1,
    generator: torch.Generator | None = None,
    **options: Any,
) -> Tensor | None:
    """The training loss of a sampler's own parameters: its ``loss`` method, or None when it has nothing to train.

    Each trainable sampler owns its loss (``PseudoLogPolarSampler.loss``, ``AdaptiveStratifiedSampler.loss``:
    1 - mean share of the target `[B, Hc, Wc]` its selection covers); a sampler with trainable parameters
    and no ``loss`` is refused. ``options`` reach the sampler's ``loss`` (e.g. ``n_samples``, ``sigma``).

    Example:
        >>> rel, valid, target = torch.rand(1, 6, 6), torch.ones(1, 6, 6, dtype=torch.bool), torch.zeros(1, 6, 6)
        >>> target[0, :2, :2] = 1.0
        >>> sampler_loss(PseudoLogPolarSampler(n_bins=8), rel, valid, None, target, 4).backward()
        >>> sampler_loss(SAMPLERS.get("topk")(), rel, valid, None, target, 4) is None
        True
    """
    if not any(p.requires_grad for p in sampler.parameters()):
        return None
    loss = getattr(sampler, "loss", None)
    if loss is None:
        raise TypeError(f"no training loss for {type(sampler).__name__}, which has trainable parameters")
    return loss(relevance, valid, query_emb, target, k, temperature=temperature, generator=generator, **options)


def _loss_inputs(relevance: Tensor, valid: Tensor, target: Tensor, k: int | Sequence[int]
                 ) -> tuple[Tensor, Tensor, Tensor, list[int], Tensor]:
    """Checked loss inputs: detached relevance, valid mask, target zeroed off the valid cells, one budget
    per image, and which images have target area (the others teach nothing and are skipped)."""
    valid = check_budget(relevance, 1, valid)  # shapes and NaN/inf; the budgets are checked per image below
    ks = list(k) if isinstance(k, Sequence) else [k] * len(relevance)
    if len(ks) != len(relevance):
        raise ValueError(f"need one budget per image ({len(relevance)}), got {len(ks)}")
    if target.shape != relevance.shape or bool((~torch.isfinite(target) & valid).any()):
        raise ValueError(f"target must be a finite map of shape {tuple(relevance.shape)}, got {tuple(target.shape)}")
    for b, (kb, n) in enumerate(zip(ks, valid.flatten(1).sum(1).tolist())):
        check_budget(relevance[:0], kb)  # K an int >= 1 (an empty batch has no cells to count)
        if kb > n:
            raise ValueError(f"budget K={kb} exceeds the {n} valid cells of image {b}; "
                             "lower --saccades or raise the canvas size")
    target = torch.where(valid, target, 0.0)  # padding cannot be selected
    return relevance.detach(), valid, target, ks, target.flatten(1).sum(1) > 0


def _stratified_shares(relevance: Tensor, valid: Tensor, target: Tensor, k: int, grids: Tensor) -> Tensor:
    # One image `[Hc, Wc]` under n grids `[n, 2]`: the n hard selections are one batched stratified call.
    n = len(grids)
    rel, val = relevance.expand(n, -1, -1), valid.expand(n, -1, -1)
    mask = stratified_cells(rel, k, val, coarsen_grid(val, k, grids)).mask(*relevance.shape)  # [n, Hc, Wc]
    return coverage_share(mask.to(target.dtype), target.expand(n, -1, -1))


def _masked_mean(values: Tensor, keep: Tensor) -> Tensor:
    # Mean over the kept images; 0 (still in the graph, zero gradient) when none is kept.
    return (values * keep).sum() / keep.sum().clamp_min(1)
