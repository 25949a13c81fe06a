"""One training run: its settings (`TrainConfig`, also the flags of `arr-coc train`) and what it leaves (`Run`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from arr_coc.budget import Budget
from arr_coc.config import check_float, check_int

ESTIMATORS = ("soft", "gumbel", "straight_through")
OBJECTIVES = ("proxy", "vlm")
LEARNERS = ("scorer", "selector", "pruner")
RELAXATIONS = ("weighted", "candidates")


@dataclass
class TrainConfig:
    """One training run; each field's ``help`` is also its ``arr-coc train --<field>`` help text."""

    learner: str = field(default="scorer", metadata={
        "help": 'what to fit: the relevance "scorer", the pixel "selector" or the token "pruner"'})
    datasets: tuple[str, ...] = field(default=("funsd", "sroie", "coco"), metadata={"help": "datasets to train on"})
    data: str | None = field(default=None, metadata={
        "help": "datasets' root folder (default $ARR_COC_DATA, or ../shared/data beside a source checkout)"})
    limit: int | None = field(default=None, metadata={
        "help": "records per dataset (a seeded subset balanced over question kinds, then images)"})
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
        "help": "output folder: checkpoint.pt, config.json, <learner>/ (model.safetensors + config.json), "
                "metrics.json, loss.png"})
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
    fresh: bool = field(default=False, metadata={
        "help": "OUT holds an earlier run's checkpoint: replace it, its weights and reports (without --resume or "
                "--fresh such a run is refused)"})
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
        if self.budget.needs_text:  # the one parse of the run's budget (Budget.parse refuses anything else)
            raise ValueError(f"tokens {self.tokens!r} is a compression of a context's text; training examples are "
                             f"images: give a token count (529) or a share of full resolution (10%)")
        self.temperature = check_float("temperature", self.temperature)
        self.coverage_weight = check_float("coverage_weight", self.coverage_weight, strict=False)
        self.lr = check_float("lr", self.lr)
        for name in ("steps", "batch_size", "eval_every"):
            setattr(self, name, check_int(name, getattr(self, name)))
        self.seed = check_int("seed", self.seed, 0)

    @cached_property
    def budget(self) -> Budget:
        """``tokens`` as a :class:`~arr_coc.budget.Budget` (a count or a share)."""
        return Budget.parse(self.tokens)


@dataclass
class Run:
    """What a finished run leaves: its history and the held-out metrics."""

    history: list[dict] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0


SCORER_WEIGHTS_UNUSED = ("--scorer-weights {}: training starts from the hand-set scorer and writes new weights, so "
                         "these would be ignored; drop --scorer-weights (it is for look, ask and eval)")


def refuse_unused(cfg: TrainConfig, arr_config: Any) -> None:
    """Refuse, in one line, settings this run would not use: every option of `arr-coc train` acts or is refused.

    The VLM's settings act only with ``objective="vlm"``, ``candidates`` only with ``relaxation="candidates"``;
    a selector or pruner learns its own map, so the scorer and sampler settings are not theirs; and training
    always starts from the hand-set scorer, so scorer weights to load are never used.

    >>> from arr_coc.config import ARRConfig
    >>> refuse_unused(TrainConfig(vlm="tiny:llava"), ARRConfig())
    Traceback (most recent call last):
    ...
    ValueError: --vlm tiny:llava acts only with --objective vlm (objective 'proxy' runs no VLM); drop it or pass --objective vlm
    """
    from arr_coc.config import SamplerConfig, ScorerConfig

    base, scorer = TrainConfig(), ScorerConfig()

    def given(names: tuple[str, ...]) -> list[str]:
        return [f"--{n.replace('_', '-')}" + ("" if isinstance(getattr(cfg, n), bool) else f" {getattr(cfg, n)}")
                for n in names if getattr(cfg, n) != getattr(base, n)]

    def refuse(flags: list[str], why: str, fix: str) -> None:
        if flags:
            raise ValueError(f"{', '.join(flags)} act{'s' if len(flags) == 1 else ''} only {why}; drop "
                             f"{'it' if len(flags) == 1 else 'them'} or {fix}")

    if cfg.objective != "vlm":
        refuse(given(("vlm", "relaxation", "candidates", "device", "dtype", "gradient_checkpointing")),
               f"with --objective vlm (objective {cfg.objective!r} runs no VLM)", "pass --objective vlm")
    elif cfg.relaxation != "candidates":
        refuse(given(("candidates",)), f"with --relaxation candidates (relaxation {cfg.relaxation!r} encodes every "
                                       f"cell)", "pass --relaxation candidates")
    weights = arr_config.scorer.weights
    if weights not in ("auto", "none"):  # auto: the default, which training never loads either
        raise ValueError(SCORER_WEIGHTS_UNUSED.format(weights))
    if cfg.learner != "scorer":
        flags = [f"{flag} {now}" for flag, now, default in (
            ("--scorer", arr_config.scorer.name, scorer.name), ("--where-prior", arr_config.scorer.where_prior,
                                                                 scorer.where_prior),
            ("--sampler", arr_config.sampler.name, SamplerConfig().name)) if now != default]
        refuse(flags, f"with --learner scorer (a {cfg.learner} learns its own map, without the scorer and sampler)",
               "pass --learner scorer")
