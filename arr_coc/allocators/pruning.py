"""Learned allocators beside relevance + sampler: a patch selector on pixels and a post-encoding token pruner.

`PatchSelector` decides which token cells to encode before the vision tower runs (a small CNN on the
canvas pixels, top-K of its importance grid). `TokenPruner` decides which already encoded tokens reach
the LLM (an MLP over the tokens, optionally conditioned on the query). Both train through `soft_topk`.

Notation: B images (rows), N tokens per row (padded; `mask` marks real ones, as
`arr_coc.allocators.token_batches.pad_tokens` makes it), D token width, Dq query
width, K the budget; pixels `[B, 3, H, W]` on a canvas of Hc x Wc cells (H = Hc * cell), flat cell
index = y * Wc + x (raster order, as the Qwen adapters' `encode_native` emits tokens).
Hard selections are exactly K distinct unmasked items, ordered by score (high -> low, ties by lower
index), or a ValueError.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from arr_coc.engine.samplers import topk_cells
from arr_coc.engine.selection import Selection, as_budget, rank_cells
from arr_coc.weights import LEARNED_FORMAT, is_name, load_learned, pretrained_path, save_folder


def _check_k(k: int, mask: Tensor) -> None:
    """Raises unless 1 <= K <= the unmasked count of every row of `mask` `[B, N]`."""
    k = as_budget(k)
    if k < 1:
        raise ValueError(f"budget K={k} must be at least 1")
    counts = mask.sum(1)  # [B]
    short = (counts < k).nonzero()
    if len(short):
        b = int(short[0])
        raise ValueError(f"budget K={k} exceeds the {int(counts[b])} available tokens of row {b} "
                         f"(of {mask.shape[1]}, padding excluded); lower K or prune fewer")


def _check_scores(scores: Tensor, k: int, mask: Tensor | None) -> Tensor:
    """Validate `scores` `[B, N]` and `mask`; returns the mask (all True for None)."""
    if scores.ndim != 2 or not scores.is_floating_point():
        raise ValueError(f"scores must be a float [B, N] tensor, got {scores.dtype} of shape {tuple(scores.shape)}")
    if mask is None:
        mask = torch.ones(scores.shape, dtype=torch.bool, device=scores.device)
    elif mask.shape != scores.shape or mask.dtype != torch.bool:
        raise ValueError(f"mask must be bool of shape {tuple(scores.shape)}, got {mask.dtype} {tuple(mask.shape)}")
    bad = int((~torch.isfinite(scores) & mask).sum())
    if bad:
        raise ValueError(f"scores have {bad} NaN/inf values at unmasked tokens; fix the scorer or mask them out")
    _check_k(k, mask)
    return mask


def prune(tokens: Tensor, scores: Tensor, k: int, mask: Tensor | None = None,
          keep_order: bool = False) -> tuple[Tensor, Tensor]:
    """Keep the K best-scoring unmasked tokens: `(kept [B, K, D], keep_indices [B, K])`.

    Args:
        tokens: `[B, N, D]` encoded tokens.
        scores: `[B, N]` float, higher = keep; only unmasked entries must be finite.
        k: tokens kept per row; at most the unmasked count of every row.
        mask: `[B, N]` bool, False = padding (never kept); None = all real.
        keep_order: False returns tokens by descending score (ties by lower index), the order of a
            `Selection`; True re-sorts the same K by index, i.e. in encoder (raster) order, for
            consumers that read tokens as a sequence.

    Example:
        >>> tokens = torch.arange(8.0).view(1, 4, 2)
        >>> kept, idx = prune(tokens, torch.tensor([[0.1, 0.9, 0.9, 0.5]]), 2)
        >>> idx.tolist(), kept.tolist()
        ([[1, 2]], [[[2.0, 3.0], [4.0, 5.0]]])
    """
    if tokens.ndim != 3 or tokens.shape[:2] != scores.shape:
        raise ValueError(f"tokens must be [B, N, D] matching scores {tuple(scores.shape)}, got {tuple(tokens.shape)}")
    mask = _check_scores(scores, k, mask)
    idx = rank_cells(scores.detach(), mask)[:, :k]  # [B, K]
    if keep_order:
        idx = idx.sort(1).values
    return tokens.gather(1, idx[..., None].expand(-1, -1, tokens.shape[2])), idx


class Pretrained:
    """``from_pretrained`` / ``save_pretrained`` of a learned allocator (its ``kind``: selector or pruner)."""

    kind: str

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path = "auto") -> Any:
        """Trained weights, checked against the module they rebuild: ``"auto"`` (the shipped ones), a shipped name,
        a folder, or a Hub id (downloaded)."""
        spec = str(name_or_path)
        if not (is_name(spec) or Path(spec).exists()):
            name_or_path = pretrained_path(spec)
        return load_learned(cls.kind, name_or_path)[0]

    def save_pretrained(self, folder: str | Path, channels: Sequence[str] = (), **meta: Any) -> Path:
        """``folder/model.safetensors`` + ``folder/config.json``; ``channels``: the ARR channels it was fed."""
        return save_learned(Path(folder), self.kind, self, channels, **meta)  # type: ignore[arg-type]


class PatchSelector(Pretrained, nn.Module):
    """A small CNN that scores every token cell from the pixels, then keeps the top-K cells.

    Three convolutions: a `stem` x `stem` patchify (stride `stem`), a `cell/stem` x `cell/stem` one
    (stride `cell/stem`) that leaves one feature vector per token cell, and a 3x3 one over the cell grid
    to a single importance, so each cell also sees its 8 neighbours. At cell 28, width 16, stem 4 that
    is 13,489 parameters and ~50k multiply-adds per cell: negligible beside the vision tower it gates.
    Weights are drawn from `seed` without touching the global RNG.

    Example:
        >>> sel = PatchSelector(cell=8)
        >>> sel(torch.rand(2, 3, 32, 48), k=5).positions.shape
        torch.Size([2, 5, 2])
    """

    kind = "selector"

    def __init__(self, cell: int = 28, width: int = 16, stem: int = 4, seed: int = 0) -> None:
        super().__init__()
        if cell < 1 or stem < 1 or cell % stem:
            raise ValueError(f"stem={stem} must divide cell={cell} so the output is one value per cell")
        self.cell = cell
        self.config = {"cell": cell, "width": width, "stem": stem}  # what `arr_coc.weights.load_learned` rebuilds it from
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.net = nn.Sequential(
                nn.Conv2d(3, width, stem, stride=stem), nn.GELU(),
                nn.Conv2d(width, width, cell // stem, stride=cell // stem), nn.GELU(),
                nn.Conv2d(width, 1, 3, padding=1),
            )

    def importance(self, pixels: Tensor, valid: Tensor | None = None) -> Tensor:
        """Importance grid `[B, Hc, Wc]`, -inf on invalid cells (so no top-K can pick padding)."""
        if pixels.ndim != 4 or pixels.shape[1] != 3 or pixels.shape[2] % self.cell or pixels.shape[3] % self.cell:
            raise ValueError(f"pixels must be [B, 3, H, W] with H, W multiples of cell={self.cell}, got "
                             f"{tuple(pixels.shape)}; build them with arr_coc.engine.canvas.make_canvas(cell={self.cell})")
        b, _, h, w = pixels.shape
        if valid is not None and (valid.shape != (b, h // self.cell, w // self.cell) or valid.dtype != torch.bool):
            raise ValueError(f"valid must be bool [{b}, {h // self.cell}, {w // self.cell}], "
                             f"got {valid.dtype} {tuple(valid.shape)}")
        grid = self.net(pixels - 0.5)[:, 0]  # [B, Hc, Wc]; centred input suits the zero-mean init
        return grid if valid is None else grid.masked_fill(~valid, -torch.inf)

    def forward(self, pixels: Tensor, k: int, valid: Tensor | None = None) -> Selection:
        """The K most important valid cells, as a `Selection` in importance order."""
        return topk_cells(self.importance(pixels, valid), k, valid)


class TokenPruner(Pretrained, nn.Module):
    """Post-encoding pruning: an MLP scores each token (with the query, if `query_dim`), `prune` keeps K.

    The MLP is Linear(D + Dq, hidden) -> GELU -> Linear(hidden, 1); `hidden` defaults to D // 4 (at
    least 8), a bottleneck that keeps the scorer a small fraction of one LLM layer. `keep_order` is
    passed to `prune`. Weights are drawn from `seed` without touching the global RNG.

    Example:
        >>> pruner = TokenPruner(dim=16, query_dim=4)
        >>> kept, idx = pruner(torch.randn(2, 10, 16), k=3, query=torch.randn(2, 4))
        >>> tuple(kept.shape), tuple(idx.shape)
        ((2, 3, 16), (2, 3))
    """

    kind = "pruner"

    def __init__(self, dim: int, query_dim: int = 0, hidden: int | None = None, keep_order: bool = False,
                 seed: int = 0) -> None:
        super().__init__()
        self.dim, self.query_dim, self.keep_order = dim, query_dim, keep_order
        hidden = hidden or max(dim // 4, 8)
        self.config = {"dim": dim, "query_dim": query_dim, "hidden": hidden, "keep_order": keep_order}
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.mlp = nn.Sequential(nn.Linear(dim + query_dim, hidden), nn.GELU(), nn.Linear(hidden, 1))

    def score(self, tokens: Tensor, query: Tensor | None = None) -> Tensor:
        """Keep-scores `[B, N]` of tokens `[B, N, D]` (query `[B, Dq]` appended to every token)."""
        if tokens.ndim != 3 or tokens.shape[2] != self.dim:
            raise ValueError(f"tokens must be [B, N, {self.dim}], got {tuple(tokens.shape)}")
        if (query is None) != (self.query_dim == 0):
            raise ValueError(f"this pruner was built with query_dim={self.query_dim}: "
                             + ("pass query [B, Dq]" if query is None else "drop the query or rebuild with query_dim"))
        if query is not None:
            if query.shape != (tokens.shape[0], self.query_dim):
                raise ValueError(f"query must be [{tokens.shape[0]}, {self.query_dim}], got {tuple(query.shape)}")
            tokens = torch.cat((tokens, query[:, None].expand(-1, tokens.shape[1], -1).to(tokens)), 2)
        return self.mlp(tokens)[..., 0]

    def forward(self, tokens: Tensor, k: int, mask: Tensor | None = None,
                query: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """`(kept [B, K, D], keep_indices [B, K])`: `prune` with this pruner's scores."""
        return prune(tokens, self.score(tokens, query), k, mask, self.keep_order)


# ----------------------------------------------------------------------------- trained weights


def save_learned(path: Path, kind: str, module: nn.Module, channels: Sequence[str], **meta: Any) -> Path:
    """Write a trained selector or pruner as a folder (``model.safetensors`` + ``config.json``) with what rebuilds
    it (its config) and what it was fed (channels)."""
    return save_folder({"format": LEARNED_FORMAT, "kind": kind, "config": module.config, "channels": list(channels),
                        "state": module.state_dict(), **meta}, Path(path))
