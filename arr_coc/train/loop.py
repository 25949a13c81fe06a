"""Training the relevance scorer (and any learnable sampler) with the texture and the VLM frozen.

Shapes: ``B`` examples in a batch, ``C`` channels, ``H, W`` padded cell grid, ``n`` valid cells.

Objectives: ``proxy`` -- the share of the answer boxes' area that a soft top-K selection of the
relevance covers, plus the coverage term of ``soft_topk.coverage_loss``; ``vlm`` -- the answer's cross-entropy
through a frozen VLM adapter fed the softly selected tokens. The same command runs in one process
or under ``torchrun --nproc_per_node N`` (DistributedDataParallel; gloo on CPU, nccl on GPU): every
rank takes its slice of the same global batch, so N processes take the steps one process takes.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn
from tqdm import tqdm

from arr_coc.config import ARRConfig, check_float, check_int
from arr_coc.pipeline import SCORER_FORMAT
from arr_coc.data.datasets import split_of
from arr_coc.budget import budget_tokens, split_budget
from arr_coc.train.features import Example, build_examples, collate
from arr_coc.query import encoder_name
from arr_coc.weights import atomic_save, load_file
from arr_coc.soft_topk import coverage_loss, standardized_soft_topk

CHECKPOINT_FORMAT = "arr-coc-train/1"
WEIGHTS_FORMAT = SCORER_FORMAT  # what ARR loads as ScorerConfig.weights
ESTIMATORS = ("soft", "gumbel", "straight_through")
OBJECTIVES = ("proxy", "vlm")
LEARNERS = ("scorer", "selector", "pruner")
PRUNER_HIDDEN = 32  # the pruner's bottleneck: its tokens are only C (~16) channels wide
# fields that may change between a run and its resume; every other field must match
RESUMABLE = ("steps", "eval_every", "out", "resume", "progress", "device", "gradient_checkpointing")
RELAXATIONS = ("weighted", "candidates")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass
class TrainConfig:
    """One training run; each field's ``help`` is also its ``arr-coc train --<field>`` help text."""

    learner: str = field(default="scorer", metadata={
        "help": 'what to fit: the relevance "scorer", the pixel "selector" or the token "pruner"'})
    datasets: tuple[str, ...] = field(default=("funsd", "sroie", "coco"), metadata={"help": "datasets to train on"})
    data: str | None = field(default=None, metadata={
        "help": "datasets' root folder (default ../shared/data or $ARR_COC_DATA)"})
    limit: int | None = field(default=None, metadata={"help": "records per dataset (a seeded subset spread over images)"})
    tokens: str = field(default="10%", metadata={
        "help": "total visual tokens per example, gestalt + K saccades split as in `arr-coc eval`: "
                "a token count (529) or a share of full resolution (10%)"})
    objective: str = field(default="proxy", metadata={
        "help": '"proxy" (answer-box overlap) or "vlm" (answer cross-entropy)'})
    estimator: str = field(default="soft", metadata={
        "help": "soft (soft top-K), gumbel (its Gumbel-perturbed version) or straight_through"})
    temperature: float = field(default=0.5, metadata={
        "help": "soft top-K temperature, in standard deviations of each image's relevance"})
    # a little mass in every region keeps second questions fed
    coverage_weight: float = field(default=0.05, metadata={"help": "weight of the coverage term of the loss"})
    steps: int = field(default=300, metadata={
        "help": "optimiser steps (about a minute on 2 CPU cores once features are cached)"})
    batch_size: int = field(default=16, metadata={"help": "global batch size, split over the ranks"})
    # Adam; the scorer has few weights, each with a clear scale
    lr: float = field(default=0.01, metadata={"help": "Adam learning rate"})
    eval_every: int = field(default=50, metadata={"help": "held-out evaluation and checkpoint every N steps"})
    seed: int = field(default=0, metadata={"help": "seed of the data order, Gumbel noise and subsets"})
    out: str = field(default="out/train", metadata={
        "help": "output folder: checkpoint.pt, config.json, <learner>.pt, metrics.json, loss.png"})
    features: str = field(default="out/features", metadata={
        "help": "cache of the texture features (one file per image)"})
    vlm: str | None = field(default=None, metadata={
        "help": 'model for objective "vlm" (a folder, hub id or tiny:<family>)'})
    relaxation: str = field(default="weighted", metadata={
        "help": 'objective "vlm": encode every cell, scaled by its soft weight ("weighted"), or only the top '
                'candidates*K cells of the relevance, sparse as at inference ("candidates")'})
    candidates: int = field(default=2, metadata={
        "help": 'relaxation "candidates": the top candidates*K cells of the relevance are encoded'})
    device: str = field(default="cpu", metadata={
        "help": "where the frozen VLM runs (cuda for a GPU); the scorer's few weights stay on the CPU"})
    dtype: str = field(default="float32", metadata={
        "help": "the frozen VLM's weights and autocast: float32 or bfloat16"})
    gradient_checkpointing: bool = field(default=False, metadata={
        "help": "recompute the frozen VLM's layer activations in the backward pass instead of keeping them"})
    accumulate: int = field(default=1, metadata={
        "help": "split each process's batch into N micro-batches whose gradients add up to the batch's"})
    split: str | None = field(default=None, metadata={
        "help": "only this official split of benchmarks that have one (docvqa, infovqa, textvqa, chartqa: train)"})
    resume: bool = field(default=False, metadata={"help": "continue from OUT/checkpoint.pt exactly where it stopped"})
    progress: bool = field(default=True, metadata={"help": "progress bars"})

    def __post_init__(self) -> None:
        from arr_coc.data.datasets import DATASETS

        for name, choices in (("learner", LEARNERS), ("objective", OBJECTIVES), ("estimator", ESTIMATORS)):
            if getattr(self, name) not in choices:
                raise ValueError(f"unknown {name} {getattr(self, name)!r}; choose one of {', '.join(choices)}")
        if isinstance(self.datasets, str):
            self.datasets = (self.datasets,)
        self.datasets = tuple(self.datasets)
        if not self.datasets:
            raise ValueError("datasets is empty; name at least one of " + ", ".join(DATASETS.names()))
        for name in self.datasets:
            DATASETS.get(name)
        if self.limit is not None:
            self.limit = check_int("limit", self.limit)
        budget_tokens(self.tokens, 10**9)  # '25%' or a token count
        self.temperature = check_float("temperature", self.temperature)
        self.coverage_weight = check_float("coverage_weight", self.coverage_weight, strict=False)
        self.lr = check_float("lr", self.lr)
        for name in ("steps", "batch_size", "eval_every"):
            setattr(self, name, check_int(name, getattr(self, name)))
        self.seed = check_int("seed", self.seed, 0)


@dataclass
class Run:
    """What a finished run leaves: its history and the held-out metrics."""

    history: list[dict] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0


def _seed(*parts: Any) -> int:
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "little") >> 1


def batch_indices(step: int, n: int, batch: int, seed: int) -> list[int]:
    """The global batch of ``step``: consecutive slices of one seeded permutation per epoch.

    Any step's batch is known without replaying the run, which is what makes ``--resume`` exact.

    >>> a = [i for s in range(5) for i in batch_indices(s, 10, 2, 0)]
    >>> sorted(a) == list(range(10))
    True
    """
    start, out = step * batch, []
    while len(out) < batch:
        epoch, pos = divmod(start + len(out), n)
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(_seed(seed, epoch))).tolist()
        out += perm[pos:pos + batch - len(out)]
    return out


def budget_k(example: Example, budget: str) -> int:
    """Saccades K for an example at the run's token budget (the evaluation's gestalt/saccade split)."""
    hc, wc = example.grid
    return split_budget(budget_tokens(budget, hc * wc), (hc, wc))[1]


class Learner(nn.Module):
    """What a run fits, seen as one map [B, H, W] per batch (higher = spend a token there).

    ``scorer``: the ARR's relevance scorer on the cached texture (the default). ``selector``: a
    `PatchSelector` CNN on the canvas pixels, blind to the question. ``pruner``: a `TokenPruner` MLP
    over every cell's encoded token -- here the texture stack's C-channel vector -- and the question
    embedding, i.e. pruning after everything was encoded.
    """

    def __init__(self, kind: str, net: nn.Module) -> None:
        super().__init__()
        if kind not in LEARNERS:
            raise ValueError(f"unknown learner {kind!r}; choose one of {', '.join(LEARNERS)}")
        self.kind, self.net = kind, net

    @classmethod
    def build(cls, kind: str, arr: Any, channels: int) -> "Learner":
        from arr_coc.allocators.pruning import PatchSelector, TokenPruner

        if kind == "selector":
            return cls(kind, PatchSelector(cell=arr.config.canvas.cell))
        if kind == "pruner":
            return cls(kind, TokenPruner(channels, query_dim=arr.query_encoder.dim, hidden=PRUNER_HIDDEN))
        return cls(kind, arr.scorer)

    def forward(self, batch: dict[str, Tensor]) -> Tensor:
        if self.kind == "scorer":
            return self.net(batch["cells"], batch["query"], batch["gestalt"], batch["valid"]).map
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
        from arr_coc.learned_samplers import sampler_loss

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
                             generator=torch.Generator().manual_seed(_seed(*seeds)))
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
        from arr_coc.vlm.objective import answer_loss, top_cells

        examples = batch["examples"]
        images = [example_pixels(e, self.canvas) for e in examples]
        maps = [weights[b, :e.grid[0], :e.grid[1]] for b, e in enumerate(examples)]
        cells = None
        if self.cfg.relaxation == "candidates":
            cells = [top_cells(rel[b, :e.grid[0], :e.grid[1]], self.cfg.candidates * k)
                     for b, (e, k) in enumerate(zip(examples, ks))]
        gestalt = [split_budget(budget_tokens(self.cfg.tokens, e.grid[0] * e.grid[1]), e.grid)[0] for e in examples]
        device = self.vlm.model.device
        with torch.autocast(device.type, dtype=DTYPES[self.cfg.dtype], enabled=self.cfg.dtype != "float32"):
            loss = answer_loss(self.vlm, images, [e.question for e in examples], [e.answer for e in examples],
                               maps, cells=cells, gestalt=gestalt, checkpointing=self.cfg.gradient_checkpointing)
        return loss.float().to(rel.device)


@torch.no_grad()
def hard_metrics(scorer: nn.Module, examples: Sequence[Example], budget: str, *, random_seed: int | None = None
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
                score = torch.rand(score.shape, generator=torch.Generator().manual_seed(_seed(random_seed, e.record_id)))
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


# ----------------------------------------------------------------------------- checkpoints


def save_checkpoint(path: Path, step: int, objective: nn.Module, optimizer: torch.optim.Optimizer,
                    history: list[dict], cfg: TrainConfig, arr_config: ARRConfig, query_encoder: str) -> None:
    atomic_save({"format": CHECKPOINT_FORMAT, "step": step, "objective": objective.state_dict(),
                  "optimizer": optimizer.state_dict(), "history": history, "train_config": _norm(asdict(cfg)),
                  "arr_config": _norm(arr_config.to_dict()), "query_encoder": query_encoder}, path)
    (path.parent / "config.json").write_text(json.dumps({"train": asdict(cfg), "arr": arr_config.to_dict(),
                                                         "query_encoder": query_encoder}, indent=1, default=str))


def load_checkpoint(path: Path, cfg: TrainConfig, arr_config: ARRConfig, query_encoder: str) -> dict:
    """A checkpoint to resume from (tensors and plain values only: it cannot run code); a corrupt file or
    a different configuration, query encoder included, is a clear error."""
    try:
        ckpt = load_file(path, CHECKPOINT_FORMAT, "an arr-coc training checkpoint")
    except ValueError as err:
        raise ValueError(f"{err}; delete it to start afresh") from None
    saved, now = ckpt["train_config"], asdict(cfg)
    diff = [k for k in now if k not in RESUMABLE and _norm(saved.get(k)) != _norm(now[k])]
    if _norm(ckpt["arr_config"]) != _norm(arr_config.to_dict()):
        diff.append("arr_config")
    if ckpt.get("query_encoder") != query_encoder:
        diff.append(f"query encoder {ckpt.get('query_encoder')} -> {query_encoder}")
    if diff:
        raise ValueError(f"checkpoint {path} was made with a different configuration ({', '.join(diff)}); "
                         f"resume with the same settings or use another --out")
    return ckpt


def _norm(v: Any) -> Any:
    return json.loads(json.dumps(v, default=str))


def export_weights(path: Path, arr: Any, cfg: TrainConfig, metrics: dict) -> Path:
    """The trained scorer (and sampler) with what it needs to be rebuilt: channels, configs, metrics."""
    atomic_save({"format": WEIGHTS_FORMAT, "scorer_name": arr.config.scorer.name, "channels": list(arr.channels),
                  "query_encoder": encoder_name(arr.query_encoder),
                  "scorer": arr.scorer.state_dict(), "sampler": arr.sampler.state_dict(),
                  "arr_config": arr.config.to_dict(), "train_config": asdict(cfg), "metrics": metrics}, path)
    return path


# ----------------------------------------------------------------------------- the loop


def _distributed() -> tuple[int, int]:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return (dist.get_rank(), world) if world > 1 else (0, 1)


def train(cfg: TrainConfig, arr_config: ARRConfig | None = None, *, examples: Sequence[Example] | None = None,
          query_encoder: Any = None) -> Run:
    """Train, evaluate on the held-out images every ``eval_every`` steps, checkpoint, export.

    ``examples`` (with their image ids) replaces reading the datasets, e.g. in tests.
    """
    from arr_coc.pipeline import ARR

    rank, world = _distributed()
    if cfg.batch_size % world:
        raise ValueError(f"batch size {cfg.batch_size} must split evenly over {world} processes")
    if cfg.accumulate < 1 or (cfg.batch_size // world) % cfg.accumulate:
        raise ValueError(f"--accumulate {cfg.accumulate} must split each process's {cfg.batch_size // world} "
                         f"examples into equal micro-batches")
    if cfg.dtype not in DTYPES:
        raise ValueError(f"unknown dtype {cfg.dtype!r}; choose one of {', '.join(DTYPES)}")
    if cfg.objective not in ("proxy", "vlm"):
        raise ValueError(f"unknown objective {cfg.objective!r}; choose proxy or vlm")
    if cfg.learner not in LEARNERS:
        raise ValueError(f"unknown learner {cfg.learner!r}; choose one of {', '.join(LEARNERS)}")
    vlm = _frozen_vlm(cfg, arr_config or ARRConfig())
    torch.manual_seed(cfg.seed)
    arr_config = arr_config or ARRConfig()
    # training starts from the hand-set initialisation, never from previously shipped weights
    arr_config = replace(arr_config, scorer=replace(arr_config.scorer, weights="none"))
    arr = ARR(arr_config, query_encoder=query_encoder)
    arr.scorer.requires_grad_(cfg.learner == "scorer")
    if examples is None:
        examples = _examples(arr, cfg, rank, world)
    split = {s: [e for e in examples if split_of(e.image_id, e.dataset) == s] for s in ("train", "val", "test")}
    if vlm is not None:  # the answer objective needs an answer to read
        split["train"] = [e for e in split["train"] if e.answer.strip()]
    elif split["train"] and not any(float(e.target.sum()) > 0 for e in split["train"]):
        raise ValueError(f"objective 'proxy' needs answer boxes, and no training example has any (datasets "
                         f"{', '.join(sorted({e.dataset for e in split['train']}))}); train on answers with "
                         f"--objective vlm --vlm PATH_OR_ID")
    if not split["train"]:
        raise ValueError("no training examples: every image fell into the held-out splits; use more records")
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    learner = Learner.build(cfg.learner, arr, examples[0].cells.shape[0])
    if cfg.learner == "selector":
        from arr_coc.train.features import attach_pixels

        attach_pixels(examples, arr_config.canvas, progress=cfg.progress and rank == 0)
    objective = Objective(learner, arr.sampler, cfg, vlm, arr_config.canvas)
    params = [p for p in objective.parameters() if p.requires_grad]
    model: nn.Module = objective
    if world > 1:
        model = nn.parallel.DistributedDataParallel(objective)
    optimizer = torch.optim.Adam(params, lr=cfg.lr)
    initial = {s: hard_metrics(learner, split[s], cfg.tokens) for s in ("val", "test")}
    history, start = [], 0
    ckpt_path = out / "checkpoint.pt"
    if cfg.resume and ckpt_path.exists():
        ckpt = load_checkpoint(ckpt_path, cfg, arr_config, encoder_name(arr.query_encoder))
        objective.load_state_dict(ckpt["objective"])
        optimizer.load_state_dict(ckpt["optimizer"])
        history, start = ckpt["history"], ckpt["step"]
    began = time.perf_counter()
    bar = tqdm(range(start, cfg.steps), desc="train", disable=not cfg.progress or rank != 0)
    for step in bar:
        idx = batch_indices(step, len(split["train"]), cfg.batch_size, cfg.seed)[rank::world]
        optimizer.zero_grad()
        value, parts = accumulate(model, [split["train"][i] for i in idx], cfg, step, world)
        optimizer.step()
        if world > 1:
            dist.all_reduce(value)
            value /= world
        row = {"step": step + 1, "loss": float(value), **parts}
        if (step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps:
            row["val"] = hard_metrics(learner, split["val"], cfg.tokens)
            if rank == 0:
                save_checkpoint(ckpt_path, step + 1, objective, optimizer, history + [row], cfg, arr_config,
                                encoder_name(arr.query_encoder))
        history.append(row)
        bar.set_postfix(loss=f"{row['loss']:.4f}")
    run = Run(history, seconds=time.perf_counter() - began)
    if rank == 0:
        run.metrics = {
            "tokens": cfg.tokens, "examples": {s: len(v) for s, v in split.items()},
            "initial": initial, "learned": {s: hard_metrics(learner, split[s], cfg.tokens) for s in ("val", "test")},
            "random": {s: hard_metrics(learner, split[s], cfg.tokens, random_seed=cfg.seed) for s in ("val", "test")},
            "train_seconds": run.seconds, "processes": world,
        }
        if cfg.learner == "scorer":
            export_weights(out / "scorer.pt", arr, cfg, run.metrics)
        else:
            from arr_coc.allocators.pruning import save_learned

            save_learned(out / f"{cfg.learner}.pt", cfg.learner, learner.net, arr.channels, metrics=run.metrics,
                         train_config=asdict(cfg), query_encoder=encoder_name(arr.query_encoder))
        (out / "metrics.json").write_text(json.dumps(run.metrics, indent=1))
        plot_history(history, out / "loss.png", initial["val"]["iou"])
    if world > 1:
        dist.barrier()
    return run


def accumulate(model: nn.Module, chunk: Sequence[Example], cfg: TrainConfig, step: int, world: int
               ) -> tuple[Tensor, dict[str, float]]:
    """Backward through ``cfg.accumulate`` equal micro-batches of this process's ``chunk``; returns the loss.

    Every loss term is a mean over examples (their gradient noise comes from per-example seeds), so
    micro-batch losses weighted by their share of the chunk add up to the gradient of the whole
    chunk, while only one micro-batch's activations are alive at a time. Under DDP only the last
    backward synchronises.
    """
    from contextlib import nullcontext

    size = len(chunk) // cfg.accumulate
    total, parts = torch.zeros(()), {}
    for j in range(cfg.accumulate):
        micro = list(chunk[j * size:(j + 1) * size])
        seeds = [_seed(cfg.seed, step, e.record_id) for e in micro]
        sync = world == 1 or j == cfg.accumulate - 1
        with nullcontext() if sync else model.no_sync():
            loss, p = model({**collate(micro), "examples": micro}, [budget_k(e, cfg.tokens) for e in micro], seeds)
            (loss * (size / len(chunk))).backward()
        total += loss.detach() * (size / len(chunk))
        for k, v in p.items():
            parts[k] = parts.get(k, 0.0) + v * size / len(chunk)
    return total, parts


def _frozen_vlm(cfg: TrainConfig, arr_config: ARRConfig) -> Any:
    """The VLM of the answer objective, frozen; its cell must be the canvas cell of the features."""
    if cfg.objective != "vlm":
        return None
    if not cfg.vlm:
        raise ValueError("objective 'vlm' needs --vlm PATH_OR_ID (a Qwen-VL / LLaVA checkpoint or tiny:<family>)")
    from arr_coc.vlm import load_vlm

    adapter = load_vlm(cfg.vlm, dtype=DTYPES[cfg.dtype], device=cfg.device)
    # tiny:<family> models are built in float32 on the CPU; a checkpoint is loaded in the dtype
    adapter.model.to(device=cfg.device, dtype=DTYPES[cfg.dtype]).requires_grad_(False).eval()
    if adapter.cell != arr_config.canvas.cell:
        raise ValueError(f"{cfg.vlm} uses {adapter.cell} px cells but the canvas uses {arr_config.canvas.cell} px; "
                         f"set CanvasConfig(cell={adapter.cell})")
    return adapter


def _examples(arr: Any, cfg: TrainConfig, rank: int, world: int) -> list[Example]:
    """Dataset records -> cached features; rank 0 computes, the others wait and read the cache."""
    from arr_coc.data.datasets import load_dataset

    def root(name: str) -> Path | None:  # one dataset: its own path (a jsonl file); several: their parent
        return None if cfg.data is None else Path(cfg.data) if len(cfg.datasets) == 1 else Path(cfg.data) / name

    records = [r for name in cfg.datasets
               for r in load_dataset(name, root(name), limit=cfg.limit, seed=cfg.seed, split=cfg.split)]
    boxless = [r for r in records if not r.boxes_px]
    if cfg.objective == "proxy" and boxless:
        raise ValueError(f"objective 'proxy' needs answer boxes, but {len(boxless)} {boxless[0].dataset} records have "
                         f"none (e.g. {boxless[0].record_id}); train on their answers with --objective vlm --vlm PATH_OR_ID")
    if rank == 0:
        examples = build_examples(arr, records, cfg.features, progress=cfg.progress)
    if world > 1:
        dist.barrier()
    if rank != 0:
        examples = build_examples(arr, records, cfg.features, progress=False)
    return examples


def plot_history(history: Sequence[dict], path: Path, initial_iou: float | None = None) -> Path:
    """Training loss and held-out IoU against steps (the initialisation's at step 0), as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot([h["step"] for h in history], [h["loss"] for h in history], lw=0.8, label="training loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    evals = [h for h in history if "val" in h and not math.isnan(h["val"]["iou"])]
    if initial_iou is not None and not math.isnan(initial_iou):
        evals = [{"step": 0, "val": {"iou": initial_iou}}] + evals
    if evals:
        ax2 = ax.twinx()
        ax2.plot([h["step"] for h in evals], [h["val"]["iou"] for h in evals], "o-", color="C1",
                 label="validation IoU (top-K)")
        ax2.set_ylabel("answer IoU on validation images")
        fig.legend(loc="upper center", ncol=2, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.9))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
