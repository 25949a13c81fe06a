"""Relevance at token-cell resolution: three ways of knowing, mixed by the query and the gestalt.

* propositional — information content (edges, high-pass, nearness to structure),
* perspectival  — salience (saliency, centre bias, motion),
* participatory — query <-> content coupling: per-channel weights predicted from the query
  embedding, plus a fixed positive weight on the question-coupled channels (``text_match``,
  ``key_value``, ``objects``, ``clip``); zero when no such channel is in the texture, until trained;
  and a query-weighted prior over where on the image the answer lies (:func:`where_basis`), zero
  until trained.
The propositional and perspectival maps are standardised per image; the participatory map keeps its
absolute level (a question that matches nothing must not be stretched into a peak). The three are
mixed by context weights = softmax(MLP([query, gestalt])). :class:`MVPScorer` is the first,
86-weight prototype, kept as a training baseline.

Shapes: B images, C texture channels, (Hc, Wc) token cells; ``valid`` [B, Hc, Wc] marks real cells.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from arr_coc.registry import Registry

SCORERS: Registry[type[nn.Module]] = Registry("scorer")

PROPOSITIONAL = {"edges": 1.0, "highpass": 1.0, "distance": -1.0}  # text and structure carry information
PERSPECTIVAL = {"saliency": 1.0, "eccentricity": -0.5, "motion": 1.0,  # what stands out, mild centre bias
                "learned_saliency": 1.0}
# Question-coupled channels start with a fixed positive weight (the participatory bias): they already
# score "how well this place matches the question" in [0, 1]. They are not standardised, so a question
# that matches nothing adds nothing; 3.0 puts a perfect match level with a +3 sigma structure peak.
PARTICIPATORY = {"text_match": 3.0, "key_value": 3.0, "objects": 3.0, "clip": 3.0, "first_look": 3.0}
# Where on the page a question's answer tends to be (a receipt's company name at the top, its total
# near the bottom, a photo's object near the centre): Gaussian bumps along each axis of the image,
# weighted by the query; zero until trained.
WHERE_ROWS, WHERE_COLS = 8, 4


@dataclass
class Relevance:
    map: Tensor  # [B, Hc, Wc] mixed relevance (0 on padding cells)
    parts: Tensor  # [B, 3, Hc, Wc] propositional, perspectival (standardised), participatory (absolute)
    weights: Tensor  # [B, 3] context weights (rows sum to 1 for the contextual scorer)
    scale: Tensor | None = None  # [3] what each part's weight was multiplied by in ``map``; None = 1 (as trained)


def part_scale(scale: Sequence[float] | Tensor | None, like: Tensor) -> Tensor | None:
    """Check an ablation scale of the three parts -> [3] like ``like``; None stays None (no scaling).

    >>> part_scale((1, 0, 0.5), torch.zeros(1)).tolist(), part_scale(None, torch.zeros(1))
    ([1.0, 0.0, 0.5], None)
    """
    if scale is None:
        return None
    s = torch.as_tensor(scale, dtype=like.dtype, device=like.device).flatten()
    if s.numel() != 3 or not torch.isfinite(s).all() or (s < 0).any():
        raise ValueError(f"part scale must be three finite numbers >= 0 (propositional, perspectival, "
                         f"participatory; 1 = as trained, 0 = off), got {scale!r}")
    return s


def mix(parts: Tensor, weights: Tensor, scale: Tensor | None = None) -> Tensor:
    """The relevance map: parts [B, 3, Hc, Wc] weighted by weights [B, 3], each part's weight times ``scale`` [3].

    Scaling multiplies a part's context weight (no renormalisation), so 1 keeps the trained mix and
    0 removes that way of knowing; the other parts keep exactly their trained contribution.

    >>> parts, w = torch.ones(1, 3, 1, 1), torch.tensor([[0.2, 0.3, 0.5]])
    >>> round(float(mix(parts, w)), 4), round(float(mix(parts, w, torch.tensor([1., 0., 2.]))), 4)
    (1.0, 1.2)
    """
    w = weights if scale is None else weights * scale
    return (parts * w[:, :, None, None]).sum(1)


def standardize(maps: Tensor, valid: Tensor, eps: float = 1e-6) -> Tensor:
    """Z-score each map of each image over its valid cells; a constant map becomes 0, padding 0.

    Args:
        maps: [B, N, Hc, Wc]
        valid: [B, Hc, Wc] bool

    >>> z = standardize(torch.tensor([[[[1., 3.], [5., 7.]]]]), torch.ones(1, 2, 2, dtype=torch.bool))
    >>> z.mean().abs() < 1e-6, round(float(z.std(unbiased=False)), 4)
    (tensor(True), 1.0)
    """
    w = valid[:, None].to(maps)  # [B, 1, Hc, Wc]
    n = w.sum((2, 3), keepdim=True)
    mean = (maps * w).sum((2, 3), keepdim=True) / n
    var = (((maps - mean) * w) ** 2).sum((2, 3), keepdim=True) / n
    return (maps - mean) / (var.sqrt() + eps) * w


def gather_channels(cell_texture: Tensor, layout: dict[str, slice], names: Sequence[str]) -> Tensor:
    """Stack the named channels (those present in ``layout``) -> [B, n, Hc, Wc]."""
    picked = [cell_texture[:, layout[n]] for n in names if n in layout]
    if not picked:
        B, _, Hc, Wc = cell_texture.shape
        return cell_texture.new_zeros(B, 0, Hc, Wc)
    return torch.cat(picked, dim=1)


def where_basis(valid: Tensor, rows: int = WHERE_ROWS, cols: int = WHERE_COLS) -> Tensor:
    """Position features of every cell: [B, rows + cols, Hc, Wc], 0 on padding.

    Each image's valid cells span [0, 1] down and across (so a padded canvas and the same image
    alone agree); feature i < rows is a Gaussian bump of the height centred at (i + 0.5) / rows
    with sigma 1 / rows, the others bumps of the width.

    >>> b = where_basis(torch.ones(1, 4, 2, dtype=torch.bool), rows=2, cols=1)
    >>> b.shape, [round(v, 3) for v in b[0, :, 0, 0].tolist()]
    (torch.Size([1, 3, 4, 2]), [0.969, 0.458, 0.969])
    """
    if valid.dim() != 3 or valid.dtype != torch.bool:
        raise ValueError(f"valid must be a bool [B, Hc, Wc] tensor, got {valid.dtype} {tuple(valid.shape)}")
    B, Hc, Wc = valid.shape
    dtype = torch.get_default_dtype()
    h = valid.any(2).sum(1).clamp(min=1).to(dtype)  # [B] valid rows
    w = valid.any(1).sum(1).clamp(min=1).to(dtype)  # [B] valid columns
    y = (torch.arange(Hc, device=valid.device, dtype=dtype)[None] + 0.5) / h[:, None]  # [B, Hc]
    x = (torch.arange(Wc, device=valid.device, dtype=dtype)[None] + 0.5) / w[:, None]  # [B, Wc]

    def bumps(t: Tensor, n: int) -> Tensor:  # [B, L] -> [B, n, L]
        centres = (torch.arange(n, device=t.device, dtype=t.dtype) + 0.5) / n
        return torch.exp(-0.5 * ((t[:, None, :] - centres[None, :, None]) * n) ** 2)

    by_row = bumps(y, rows)[:, :, :, None].expand(B, rows, Hc, Wc)
    by_col = bumps(x, cols)[:, :, None, :].expand(B, cols, Hc, Wc)
    return torch.cat([by_row, by_col], 1) * valid[:, None]


def linear_map(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """Per-image channel weighting: x [B, n, Hc, Wc], weight [n] or [B, n] -> [B, Hc, Wc]."""
    w = weight if weight.dim() == 2 else weight[None].expand(x.shape[0], -1)
    out = torch.einsum("bnhw,bn->bhw", x, w)
    return out if bias is None else out + bias.view(-1, 1, 1)


def _check(cell_texture: Tensor, valid: Tensor, width: int) -> None:
    if cell_texture.dim() != 4 or cell_texture.shape[1] != width:
        raise ValueError(f"cell texture must be [B, {width}, Hc, Wc], got {tuple(cell_texture.shape)}")
    if valid.shape != (cell_texture.shape[0], *cell_texture.shape[2:]):
        raise ValueError(f"valid must be {(cell_texture.shape[0], *cell_texture.shape[2:])}, got {tuple(valid.shape)}")


@SCORERS.register("contextual")
class ContextualScorer(nn.Module):
    """Propositional + perspectival + participatory scorers mixed by context weights.

    Args:
        layout: channel name -> slice of the texture (``arr_coc.engine.texture.channel_layout``).
        query_dim: query embedding width.
        gestalt_dim: gestalt vector width (the texture width for the built-in gestalt).
        hidden: width of the context-weight MLP.
        participatory: channels the query can weight; None = all of them.

    Example:
        >>> layout = {"edges": slice(0, 1), "saliency": slice(1, 2)}
        >>> s = ContextualScorer(layout, query_dim=8, gestalt_dim=2)
        >>> r = s(torch.rand(2, 2, 5, 6), torch.randn(2, 8), torch.rand(2, 2), torch.ones(2, 5, 6, dtype=torch.bool))
        >>> r.map.shape, torch.allclose(r.weights.sum(-1), torch.ones(2))
        (torch.Size([2, 5, 6]), True)
    """

    def __init__(self, layout: dict[str, slice], query_dim: int = 384, gestalt_dim: int | None = None,
                 hidden: int = 64, participatory: Sequence[str] | None = None) -> None:
        super().__init__()
        self.layout = dict(layout)
        self.width = max(s.stop for s in layout.values())
        self.prop_names = [n for n in PROPOSITIONAL if n in layout]
        self.persp_names = [n for n in PERSPECTIVAL if n in layout]
        self.part_names = list(participatory) if participatory is not None else list(layout)
        unknown = [n for n in self.part_names if n not in layout]
        if unknown:
            raise ValueError(f"participatory channels {unknown} are not in the texture ({list(layout)})")
        # Hand-set starting weights: the heads begin as the documented priors and stay learnable.
        self.prop = nn.Parameter(torch.tensor([PROPOSITIONAL[n] for n in self.prop_names]))
        self.persp = nn.Parameter(torch.tensor([PERSPECTIVAL[n] for n in self.persp_names]))
        n_part = sum(layout[n].stop - layout[n].start for n in self.part_names)
        self.part = nn.Linear(query_dim, n_part)  # query -> how much each channel matters for it
        nn.init.zeros_(self.part.weight)
        with torch.no_grad():
            self.part.bias.copy_(torch.cat([torch.full((layout[n].stop - layout[n].start,), PARTICIPATORY.get(n, 0.0))
                                            for n in self.part_names]))
        self.where = nn.Linear(query_dim, WHERE_ROWS + WHERE_COLS)  # query -> where its answer tends to be
        nn.init.zeros_(self.where.weight)
        nn.init.zeros_(self.where.bias)
        gestalt_dim = self.width if gestalt_dim is None else gestalt_dim
        self.context = nn.Sequential(nn.Linear(query_dim + gestalt_dim, hidden), nn.ReLU(), nn.Linear(hidden, 3))
        nn.init.zeros_(self.context[2].weight)  # equal 1/3 mixing until trained
        nn.init.zeros_(self.context[2].bias)

    def forward(self, cell_texture: Tensor, query_emb: Tensor, gestalt_vec: Tensor, valid: Tensor,
                scale: Sequence[float] | Tensor | None = None, where: float = 1.0) -> Relevance:
        """Relevance of every cell; ``scale`` [3] multiplies each part's context weight (see :func:`mix`),
        ``where`` the query-weighted where prior (1 = as trained, 0 = off)."""
        _check(cell_texture, valid, self.width)
        scale = part_scale(scale, cell_texture)
        z = lambda names: standardize(gather_channels(cell_texture, self.layout, names), valid)  # noqa: E731
        prop = linear_map(z(self.prop_names), self.prop)
        persp = linear_map(z(self.persp_names), self.persp)
        # participatory: coupling channels keep their absolute [0, 1] match level, the others are z-scored
        part_in = torch.cat([gather_channels(cell_texture, self.layout, [n]) * valid[:, None] if n in PARTICIPATORY
                             else z([n]) for n in self.part_names], 1)
        part = linear_map(part_in, self.part(query_emb), None)
        if where:
            part = part + where * linear_map(where_basis(valid).to(part_in), self.where(query_emb))
        parts = torch.cat([standardize(torch.stack([prop, persp], 1), valid), part[:, None] * valid[:, None]], 1)
        weights = torch.softmax(self.context(torch.cat([query_emb, gestalt_vec], -1)), -1)  # [B, 3]
        return Relevance(map=mix(parts, weights, scale), parts=parts, weights=weights, scale=scale)


@SCORERS.register("mvp")
class MVPScorer(nn.Module):
    """The prototype scorer: 86 learnable weights on raw [0, 1] channels.

    info (edges, edges_inv, highpass: 3) + perspectival (eccentricity, saliency: 2) + a per-channel
    participatory head (C + 1) + tension weights (3) + an 8x8 spatial prior over the image (64).
    It ignores the query until a query-coupling channel is in the texture; it exists as the
    baseline for training with the proxy objective.

    >>> layout = {n: slice(i, i + 1) for i, n in enumerate(["edges", "edges_inv", "highpass", "eccentricity", "saliency"])}
    >>> s = MVPScorer(layout)
    >>> sum(p.numel() for p in s.parameters())
    78
    """

    def __init__(self, layout: dict[str, slice], query_dim: int = 384, gestalt_dim: int | None = None,
                 hidden: int = 64, prior_grid: int = 8) -> None:
        super().__init__()
        self.layout = dict(layout)
        self.width = max(s.stop for s in layout.values())
        self.info_names = [n for n in ("edges", "edges_inv", "highpass") if n in layout]
        self.persp_names = [n for n in ("eccentricity", "saliency") if n in layout]
        seed_info = {"edges": 0.4, "edges_inv": 0.3, "highpass": 0.3}  # the seed's starting values
        seed_persp = {"eccentricity": 0.6, "saliency": 0.4}
        self.info = nn.Parameter(torch.tensor([seed_info[n] for n in self.info_names]))
        self.persp = nn.Parameter(torch.tensor([seed_persp[n] for n in self.persp_names]))
        self.part = nn.Parameter(torch.zeros(self.width))
        self.part_bias = nn.Parameter(torch.zeros(1))
        self.tension = nn.Parameter(torch.tensor([0.33, 0.33, 0.34]))
        self.prior = nn.Parameter(torch.zeros(1, 1, prior_grid, prior_grid))

    def spatial_prior(self, valid: Tensor) -> Tensor:
        """The learned 8x8 prior stretched over each image's own extent -> [B, Hc, Wc]."""
        B, Hc, Wc = valid.shape
        rows = valid.any(2).sum(1).to(self.prior)  # [B] valid rows
        cols = valid.any(1).sum(1).to(self.prior)
        y = (torch.arange(Hc).to(self.prior)[None] + 0.5) / rows[:, None] * 2 - 1  # [B, Hc] in [-1, 1]
        x = (torch.arange(Wc).to(self.prior)[None] + 0.5) / cols[:, None] * 2 - 1
        grid = torch.stack(torch.broadcast_tensors(x[:, None, :], y[:, :, None]), -1)  # [B, Hc, Wc, 2] (x, y)
        prior = F.grid_sample(self.prior.expand(B, -1, -1, -1), grid, align_corners=False, padding_mode="border")
        return prior[:, 0]

    def forward(self, cell_texture: Tensor, query_emb: Tensor, gestalt_vec: Tensor, valid: Tensor,
                scale: Sequence[float] | Tensor | None = None, where: float = 1.0) -> Relevance:
        """Relevance of every cell; ``scale`` [3] multiplies each tension weight, ``where`` the spatial prior."""
        _check(cell_texture, valid, self.width)
        scale = part_scale(scale, cell_texture)
        info = linear_map(gather_channels(cell_texture, self.layout, self.info_names), self.info)
        persp = linear_map(gather_channels(cell_texture, self.layout, self.persp_names), self.persp)
        part = linear_map(cell_texture, self.part, self.part_bias.expand(cell_texture.shape[0]))
        parts = torch.stack([info, persp, part], 1) * valid[:, None]  # [B, 3, Hc, Wc]
        weights = self.tension[None].expand(cell_texture.shape[0], -1)
        mixed = mix(parts, weights, scale) + where * self.spatial_prior(valid)
        return Relevance(map=mixed * valid, parts=parts, weights=weights, scale=scale)
