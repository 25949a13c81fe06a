"""What training minimises: the learner's map, its soft top-K selection and the proxy or VLM loss; hard top-K metrics.

Shapes: ``B`` examples in a batch, ``C`` channels, ``H, W`` padded cell grid, ``n`` valid cells.

Objectives: ``proxy`` -- the share of the answer boxes' area that a soft top-K selection of the
relevance covers, plus the coverage term of ``soft_topk.coverage_loss``; ``vlm`` -- the answer's cross-entropy
through a frozen VLM adapter fed the softly selected tokens.
"""
from __future__ import annotations

import hashlib
from typing import Any, Sequence

import torch
from torch import Tensor, nn

from arr_coc.budget import Budget
from arr_coc.engine.soft_topk import coverage_loss, standardized_soft_topk
from arr_coc.train.features import Example, collate
from arr_coc.train.recipe import ESTIMATORS, LEARNERS, RELAXATIONS, TrainConfig

PRUNER_HIDDEN = 32  # the pruner's bottleneck: its tokens are only C (~16) channels wide
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def seed_of(*parts: Any) -> int:
    """A 63-bit seed from any parts: the same parts, the same seed, in every process."""
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "little") >> 1


def budget_k(example: Example, budget: Budget | str) -> int:
    """Saccades K for an example at the run's token budget (the evaluation's gestalt/saccade split)."""
    return Budget.parse(budget).split([tuple(example.grid)])[1]


class Learner(nn.Module):
    """What a run fits, seen as one map [B, H, W] per batch (higher = spend a token there).

    ``scorer``: the ARR's relevance scorer on the cached texture (the default). ``selector``: a
    `PatchSelector` CNN on the canvas pixels, blind to the question. ``pruner``: a `TokenPruner` MLP
    over every cell's encoded token -- here the texture stack's C-channel vector -- and the question
    embedding, i.e. pruning after everything was encoded.
    """

    def __init__(self, kind: str, net: nn.Module, where: float = 1.0) -> None:
        super().__init__()
        if kind not in LEARNERS:
            raise ValueError(f"unknown learner {kind!r}; choose one of {', '.join(LEARNERS)}")
        self.kind, self.net = kind, net
        self.where = where  # the scorer's where prior, trained as it will be used (ScorerConfig.where_prior)

    @classmethod
    def build(cls, kind: str, arr: Any, channels: int) -> "Learner":
        from arr_coc.allocators.pruning import PatchSelector, TokenPruner

        if kind == "selector":
            return cls(kind, PatchSelector(cell=arr.config.canvas.cell))
        if kind == "pruner":
            return cls(kind, TokenPruner(channels, query_dim=arr.query_encoder.dim, hidden=PRUNER_HIDDEN))
        return cls(kind, arr.scorer, arr.config.scorer.where_prior)

    def forward(self, batch: dict[str, Tensor]) -> Tensor:
        if self.kind == "scorer":
            return self.net(batch["cells"], batch["query"], batch["gestalt"], batch["valid"], where=self.where).map
        if self.kind == "pruner":
            b, c, h, w = batch["cells"].shape
            return self.net.score(batch["cells"].flatten(2).transpose(1, 2), batch["query"]).view(b, h, w)
        if "pixels" not in batch:
            raise ValueError("the selector reads pixels: attach them with arr_coc.features.attach_pixels")
        return self.net.importance(batch["pixels"], batch["valid"])


def as_learner(model: nn.Module) -> Learner:
    return model if isinstance(model, Learner) else Learner("scorer", model)


class Objective(nn.Module):
    """The trainable parts (scorer + sampler, or a selector / pruner) and the loss; DDP wraps this module."""

    def __init__(self, scorer: nn.Module, sampler: nn.Module, cfg: TrainConfig, vlm: Any = None,
                 canvas: Any = None) -> None:
        super().__init__()
        if cfg.estimator not in ESTIMATORS:
            raise ValueError(f"unknown estimator {cfg.estimator!r}; choose one of {', '.join(ESTIMATORS)}")
        if cfg.relaxation not in RELAXATIONS:
            raise ValueError(f"unknown relaxation {cfg.relaxation!r}; choose one of {', '.join(RELAXATIONS)}")
        if cfg.candidates < 1:
            raise ValueError(f"candidates must be >= 1 (the top candidates*K cells are encoded), got {cfg.candidates}")
        self.scorer, self.sampler, self.cfg = as_learner(scorer), sampler, cfg
        self.vlm, self.canvas = vlm, canvas  # frozen adapter (a plain object: DDP never sees its weights)

    def selection(self, batch: dict[str, Tensor], ks: Sequence[int], seeds: Sequence[int]) -> tuple[Tensor, Tensor]:
        """Relevance [B, H, W] and the soft selection weights [B, H, W] (0 off the image, sum K).

        Each example draws its Gumbel noise from its own seed, so how a batch is split over
        processes does not change what any example sees.
        """
        rel = self.scorer(batch)  # [B, H, W]
        weights = torch.zeros_like(rel)
        for b, (k, seed) in enumerate(zip(ks, seeds)):
            v = batch["valid"][b]
            r = rel[b][v]
            # z-scored, so the temperature is in standard deviations on every image
            w = standardized_soft_topk(r[None], k, self.cfg.temperature, gumbel=self.cfg.estimator == "gumbel",
                                       generator=torch.Generator().manual_seed(seed),
                                       straight_through=self.cfg.estimator == "straight_through")
            weights[b] = weights[b].masked_scatter(v, w[0].to(weights))
        return rel, weights

    def forward(self, batch: dict[str, Tensor], ks: Sequence[int], seeds: Sequence[int]
                ) -> tuple[Tensor, dict[str, float]]:
        from arr_coc.engine.learned_samplers import sampler_loss

        rel, weights = self.selection(batch, ks, seeds)
        area = batch["target"].flatten(1).sum(1)  # [B]
        share = (weights * batch["target"]).flatten(1).sum(1) / area.clamp_min(1e-9)
        has = area > 0  # an answer without area (none here) teaches nothing
        proxy = 1 - share[has].mean() if has.any() else rel.sum() * 0
        # one token's worth of mass per region of a 4x4 grid -- or what the smallest budget can give
        cover = coverage_loss(weights, grid=(4, 4), min_mass=min(1.0, 0.5 * min(ks) / 16), valid=batch["valid"])
        main = proxy if self.vlm is None else self.answer_loss(batch, rel, weights, ks)
        loss = main + self.cfg.coverage_weight * cover
        extra = None if self.scorer.kind != "scorer" else sampler_loss(self.sampler, rel, batch["valid"], batch["query"], batch["target"], list(ks),
                             temperature=self.cfg.temperature,
                             generator=torch.Generator().manual_seed(seed_of(*seeds)))
        if extra is not None:
            loss = loss + extra
        parts = {"proxy": float(proxy.detach()), "coverage": float(cover.detach())}
        if self.vlm is not None:
            parts["answer_ce"] = float(main.detach())
        return loss, parts

    def answer_loss(self, batch: dict[str, Tensor], rel: Tensor, weights: Tensor, ks: Sequence[int]) -> Tensor:
        """Answer cross-entropy of the frozen VLM fed the gestalt of the evaluation's budget split and the
        tokens scaled by their soft selection weights: every cell (``weighted``) or only the top
        ``candidates * K`` of the relevance, encoded sparse as inference encodes its top K (``candidates``)."""
        from arr_coc.train.features import example_pixels
        from arr_coc.vlm.answer_loss import answer_loss, top_cells

        examples = batch["examples"]
        images = [example_pixels(e, self.canvas) for e in examples]
        maps = [weights[b, :e.grid[0], :e.grid[1]] for b, e in enumerate(examples)]
        cells = None
        if self.cfg.relaxation == "candidates":
            cells = [top_cells(rel[b, :e.grid[0], :e.grid[1]], self.cfg.candidates * k)
                     for b, (e, k) in enumerate(zip(examples, ks))]
        budget = self.cfg.budget
        gestalt = [budget.split([tuple(e.grid)])[0][0] for e in examples]
        device = self.vlm.model.device
        with torch.autocast(device.type, dtype=DTYPES[self.cfg.dtype], enabled=self.cfg.dtype != "float32"):
            loss = answer_loss(self.vlm, images, [e.question for e in examples], [e.answer for e in examples],
                               maps, cells=cells, gestalt=gestalt, checkpointing=self.cfg.gradient_checkpointing)
        return loss.float().to(rel.device)


@torch.no_grad()
def hard_metrics(scorer: nn.Module, examples: Sequence[Example], budget: Budget | str, *, random_seed: int | None = None
                 ) -> dict[str, float]:
    """Top-K of the scorer's relevance (or a `Learner`'s map, or K random cells) against the answer: IoU
    (the training proxy) and covered share of the answer's area, means over examples."""
    learner, ious, shares = as_learner(scorer), [], []
    for i in range(0, len(examples), 8):
        chunk = examples[i:i + 8]
        batch = collate(chunk)
        rel = learner(batch)
        for b, e in enumerate(chunk):
            v, t = batch["valid"][b], batch["target"][b]
            score = rel[b][v]
            if random_seed is not None:
                score = torch.rand(score.shape, generator=torch.Generator().manual_seed(seed_of(random_seed, e.record_id)))
            chosen = torch.zeros_like(score, dtype=torch.bool)
            chosen[score.topk(budget_k(e, budget)).indices] = True
            answer = t[v] > 0
            union = int((chosen | answer).sum())
            if union == 0 or not answer.any():
                continue
            ious.append(int((chosen & answer).sum()) / union)
            shares.append(float((chosen.float() * t[v]).sum() / t[v].sum()))
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
    return {"iou": mean(ious), "coverage": mean(shares), "n": len(ious)}
