"""Differentiable stand-ins for top-K cell selection, for training scorers: soft top-K and a coverage penalty.

Hard top-K passes no gradient to the scores; these relaxations do. Use `soft_topk` weights in a loss
(e.g. overlap with answer boxes) and `coverage_loss` to keep the budget from collapsing into one region.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from arr_coc.engine.selection import rank_cells
from arr_coc.engine.stratified import stratum_ids

_BISECTION_STEPS = 64  # float64 threshold, range halves each step: exact to rounding after ~60 + log2(range)
# Padding sits this many temperatures below the lowest real score: sigmoid(-1e4) is 0 in float64,
# so soft weights put no mass on padding, yet the bisection bracket stays finite.
_PAD_GAP = 1e4


class _SigmoidTopK(torch.autograd.Function):
    """w = sigmoid(x - t) with t solving sum(w) = k; backward by implicit differentiation."""

    @staticmethod
    def forward(ctx, x: Tensor, k: int) -> Tensor:  # x = scores / temperature, float64 [B, N]
        # Bracket: at t = min(x) - c every weight is >= sigmoid(c), so sum > N - e^-5 > k;
        # at t = max(x) + c, sum < e^-5 < k.
        c = math.log(x.shape[1]) + 5.0
        lo, hi = x.amin(1, keepdim=True) - c, x.amax(1, keepdim=True) + c
        for _ in range(_BISECTION_STEPS):
            mid = (lo + hi) / 2
            over = torch.sigmoid(x - mid).sum(1, keepdim=True) > k  # sum decreases in t
            lo, hi = torch.where(over, mid, lo), torch.where(over, hi, mid)
        t = (lo + hi) / 2
        for _ in range(2):  # Newton polish so rows sum to k to float64 rounding; keep it inside the bracket
            w = torch.sigmoid(x - t)
            step = (w.sum(1, keepdim=True) - k) / (w * (1 - w)).sum(1, keepdim=True).clamp_min(1e-300)
            t = torch.where((t + step > lo) & (t + step < hi), t + step, t)
        w = torch.sigmoid(x - t)
        ctx.save_for_backward(w)
        return w

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        (w,) = ctx.saved_tensors
        d = w * (1 - w)  # sigmoid'; dt/dx_j = d_j / sum(d) keeps sum(w) = k
        mean = (grad * d).sum(1, keepdim=True) / d.sum(1, keepdim=True).clamp_min(1e-300)
        return d * (grad - mean), None


def gumbel_noise(shape: torch.Size | tuple[int, ...], generator: torch.Generator | None = None, device=None) -> Tensor:
    """Standard Gumbel(0, 1) samples (float64), -log(-log(u)) with u kept inside (0, 1)."""
    gen_device = generator.device if generator is not None else device
    u = torch.rand(shape, generator=generator, device=gen_device, dtype=torch.float64).clamp(1e-12, 1 - 1e-12)
    return -torch.log(-torch.log(u)).to(device)


def soft_topk(
    scores: Tensor,
    k: int,
    temperature: float = 0.1,
    *,
    gumbel: bool = False,
    generator: torch.Generator | None = None,
    straight_through: bool = False,
) -> Tensor:
    """Soft top-K weights `[B, N]` in [0, 1] that sum to exactly K per row.

    The relaxation is the binary-entropy-regularised projection onto the K-subset polytope, the
    Limited Multi-Label projection of Amos, Koltun & Kolter (2019, arXiv:1906.08707):
    w_i = sigmoid((s_i - t) / temperature), with the threshold t found per row by bisection so that
    sum(w) = K. The gradient comes from the implicit function theorem,
    dL/ds_j = w_j (1 - w_j) / temperature * (g_j - sum_i g_i w_i (1 - w_i) / sum_i w_i (1 - w_i)),
    so nothing is backpropagated through the bisection. As temperature -> 0 the weights approach
    the hard top-K mask.

    Args:
        scores: `[B, N]` float scores (e.g. a relevance map flattened).
        k: budget, 1 <= k <= N (k = N gives all ones).
        temperature: softness in score units.
        gumbel: add Gumbel(0, 1) noise to the scores first (Gumbel top-k trick, Kool et al. 2019;
            Xie & Ermon 2019): sampling K cells without replacement with probabilities ~ exp(scores).
        generator: makes the Gumbel noise repeatable.
        straight_through: forward returns the hard top-K mask of the (noisy) scores (ties to the lower
            index), backward uses the soft gradient.

    Example:
        >>> w = soft_topk(torch.tensor([[3.0, 1.0, 2.0, 0.0]]), 2, temperature=0.1)
        >>> round(w.sum().item(), 4), w.round().tolist()
        (2.0, [[1.0, 0.0, 1.0, 0.0]])
    """
    if scores.ndim != 2 or not scores.is_floating_point():
        raise ValueError(f"scores must be a float [B, N] tensor, got {scores.dtype} of shape {tuple(scores.shape)}")
    if not 1 <= k <= scores.shape[1]:
        raise ValueError(f"k={k} must lie in [1, {scores.shape[1]}] (the number of scores per row)")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if bool(torch.isnan(scores).any()):
        raise ValueError("scores contain NaN")
    x = scores.double()
    if gumbel:
        x = x + gumbel_noise(x.shape, generator, x.device)
    if k == scores.shape[1]:
        soft = x * 0 + 1  # every cell chosen; keeps the graph, zero gradient
    else:
        soft = _SigmoidTopK.apply(x / temperature, k)
    soft = soft.to(scores.dtype)
    if not straight_through:
        return soft
    top = rank_cells(x.detach(), torch.ones_like(x, dtype=torch.bool))[:, :k]
    hard = torch.zeros_like(soft).scatter_(1, top, 1.0)
    return hard + soft - soft.detach()


def standardized_soft_topk(
    scores: Tensor,
    k: int,
    temperature: float = 0.1,
    mask: Tensor | None = None,
    *,
    gumbel: bool = False,
    generator: torch.Generator | None = None,
    straight_through: bool = False,
) -> Tensor:
    """`soft_topk` of scores z-scored over each row's unmasked entries: `[B, N]` weights, K per row, 0 on the mask.

    Top-K ignores the scores' scale, so standardising first makes `temperature` mean the same on every row, in
    standard deviations: a scorer cannot escape (or sharpen) the relaxation by growing its outputs. The std is
    the population one (divided by the count, not count - 1): it is the spread of the row itself, not an
    estimate of a larger population, and it is defined for a single entry; a flat row has std 0, clamped to
    1e-6. Masked entries (padding, which may hold -inf) stay out of the statistics and the gradients and sit
    `_PAD_GAP` temperatures below the lowest real score, so they get no mass.

    Args:
        scores: `[B, N]` float.
        k: budget, 1 <= k <= the unmasked count of every row.
        temperature: softness in standard deviations.
        mask: `[B, N]` bool, True where an entry is real (None: all).
        gumbel, generator, straight_through: as in `soft_topk`.

    Example:
        >>> w = standardized_soft_topk(torch.tensor([[3.0, 1.0, 2.0, 9.0]]), 2, 0.1, torch.tensor([[1, 1, 1, 0]]).bool())
        >>> round(w.sum().item(), 4), w.round().tolist()
        (2.0, [[1.0, 0.0, 1.0, 0.0]])
    """
    mask = torch.ones_like(scores, dtype=torch.bool) if mask is None else mask
    s = torch.where(mask, scores, 0.0)  # [B, N]; -inf padding would poison the sums and their gradients
    count = mask.sum(1, keepdim=True)
    mean = s.sum(1, keepdim=True) / count
    std = ((torch.where(mask, s - mean, 0.0) ** 2).sum(1, keepdim=True) / count).sqrt().clamp_min(1e-6)
    z = (s - mean) / std
    floor = torch.where(mask, z, torch.inf).amin(1, keepdim=True).detach() - _PAD_GAP * temperature
    w = soft_topk(torch.where(mask, z, floor), k, temperature, gumbel=gumbel, generator=generator,
                  straight_through=straight_through)
    return w * mask


def coverage_loss(
    weights: Tensor,
    grid: tuple[int, int] = (8, 8),
    min_mass: float = 1.0,
    valid: Tensor | None = None,
    reduction: str = "mean",
) -> Tensor:
    """Smooth penalty for strata that receive too little selection mass (the coverage term: every region keeps some mass).

    The selection weights `[B, Hc, Wc]` (e.g. `soft_topk(rel.flatten(1), k).view_as(rel)`) are summed
    over the strata of a `grid` laid over each image's valid extent (the same strata as the stratified
    sampler, `stratum_ids`). Each non-empty stratum with mass m below `min_mass` costs
    relu(min_mass - m)^2; strata without valid cells cost nothing. The default `min_mass=1.0` asks for
    one token's worth of mass per stratum, as the stratified sampler guarantees. For a hard selection,
    `Selection.mask(hc, wc).float()` measures the same (without gradient).

    Args:
        weights: `[B, Hc, Wc]` float selection weights.
        grid: (gh, gw) strata per image.
        min_mass: mass below which a stratum is penalised.
        valid: `[B, Hc, Wc]` bool, None = all valid; invalid cells count for no stratum.
        reduction: "mean" or "sum" over images, or "none" for per-image `[B]` values.

    Example:
        >>> w = torch.zeros(1, 4, 4)
        >>> w[0, :2, :2] = 1.0  # all mass in the top-left stratum
        >>> coverage_loss(w, grid=(2, 2))
        tensor(3.)
    """
    if weights.ndim != 3 or not weights.is_floating_point():
        raise ValueError(
            f"weights must be a float [B, Hc, Wc] map, got {weights.dtype} of shape {tuple(weights.shape)}"
        )
    if valid is None:
        valid = torch.ones(weights.shape, dtype=torch.bool, device=weights.device)
    elif valid.shape != weights.shape or not bool(valid.flatten(1).any(1).all()):
        raise ValueError(
            f"valid must be bool {tuple(weights.shape)} with a valid cell per image, got {tuple(valid.shape)}"
        )
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    s = grid[0] * grid[1]
    sid = stratum_ids(valid, grid).flatten(1)  # [B, N], -1 = invalid
    sid = torch.where(sid < 0, s, sid)
    mass = torch.zeros(weights.shape[0], s + 1, dtype=weights.dtype, device=weights.device)
    mass = mass.scatter_add(1, sid, weights.flatten(1))[:, :s]  # [B, S]
    cells = torch.zeros(weights.shape[0], s + 1, dtype=torch.long, device=weights.device)
    occupied = cells.scatter_add_(1, sid, valid.flatten(1).long())[:, :s] > 0  # [B, S] non-empty strata
    per_image = (torch.relu(min_mass - mass).pow(2) * occupied).sum(1)  # [B]
    return {"mean": per_image.mean, "sum": per_image.sum, "none": lambda: per_image}[reduction]()
