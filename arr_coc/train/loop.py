"""The training loop (`arr-coc train`): the relevance scorer, a learnable sampler, or a selector / pruner,
with the texture and the VLM frozen.

The same command runs in one process or under ``torchrun --nproc_per_node N``
(DistributedDataParallel; gloo on CPU, nccl on GPU): every rank takes its slice of the same global
batch, so N processes take the steps one process takes. The objective is :mod:`arr_coc.train.objective`'s,
the files :mod:`arr_coc.train.checkpoint`'s.
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn
from tqdm import tqdm

from arr_coc.config import ARRConfig
from arr_coc.data.datasets import split_of
from arr_coc.train.checkpoint import (
    claim_run_folder,
    export_run,
    load_checkpoint,
    resume_from,
    run_lock,
    save_checkpoint,
)
from arr_coc.train.features import Example, build_examples, collate
from arr_coc.train.objective import (
    DTYPES,
    Learner,
    Objective,
    budget_k,
    hard_metrics,
    seed_of,
)
from arr_coc.train.recipe import LEARNERS, Run, TrainConfig, refuse_unused
from arr_coc.weights import atomic_write, encoder_name, image_digests

__all__ = ["Run", "TrainConfig", "accumulate", "batch_indices", "plot_history", "train"]


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
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed_of(seed, epoch))).tolist()
        out += perm[pos:pos + batch - len(out)]
    return out


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
    if cfg.candidates < 1:
        raise ValueError(f"candidates must be >= 1 (the top candidates*K cells are encoded), got {cfg.candidates}")
    arr_config = arr_config or ARRConfig()
    refuse_unused(cfg, arr_config)  # every setting acts, or the run is refused before any work
    out = Path(cfg.out)
    with run_lock(out, rank):  # held until the run ends: a second run into this folder is refused at once
        # before any work: an earlier run's files are never replaced silently
        ckpt_path = claim_run_folder(out, cfg, rank)
        return _train(cfg, arr_config, out, ckpt_path, rank, world, examples, query_encoder)


def _train(cfg: TrainConfig, arr_config: ARRConfig, out: Path, ckpt_path: Path, rank: int, world: int,
           examples: Sequence[Example] | None, query_encoder: Any) -> Run:
    """The run itself, in a folder already claimed (and locked) for it."""
    from arr_coc.engine.pipeline import ARR

    vlm = _frozen_vlm(cfg, arr_config)
    torch.manual_seed(cfg.seed)
    # training starts from the hand-set initialisation, never from previously shipped weights
    arr_config = replace(arr_config, scorer=replace(arr_config.scorer, weights="none"))
    arr = ARR(arr_config, query_encoder=query_encoder)
    arr.scorer.requires_grad_(cfg.learner == "scorer")
    if not arr_config.scorer.where_prior:  # the where prior is off: its weights take no part, so they take no step
        for name in ("where", "prior"):  # the contextual scorer's where head, the mvp scorer's spatial prior
            if getattr(arr.scorer, name, None) is not None:
                getattr(arr.scorer, name).requires_grad_(False)
    if examples is None:
        examples = _examples(arr, cfg, rank, world)
    split = {s: [e for e in examples if split_of(e.split_group, e.dataset) == s] for s in ("train", "val", "test")}
    if vlm is not None:  # the answer objective needs an answer to read
        split["train"] = [e for e in split["train"] if e.answer.strip()]
    elif split["train"] and not any(float(e.target.sum()) > 0 for e in split["train"]):
        raise ValueError(f"objective 'proxy' needs answer boxes, and no training example has any (datasets "
                         f"{', '.join(sorted({e.dataset for e in split['train']}))}); train on answers with "
                         f"--objective vlm --vlm PATH_OR_ID")
    if not split["train"]:
        raise ValueError("no training examples: every image fell into the held-out splits; use more records")
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
    initial = {s: hard_metrics(learner, split[s], cfg.budget) for s in ("val", "test")}
    history, start = [], 0
    if cfg.resume:
        ckpt = load_checkpoint(ckpt_path, cfg, arr_config, encoder_name(arr.query_encoder))
        resume_from(ckpt_path, ckpt, objective, optimizer)
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
            row["val"] = hard_metrics(learner, split["val"], cfg.budget)
            if rank == 0:
                save_checkpoint(ckpt_path, step + 1, objective, optimizer, history + [row], cfg, arr_config,
                                encoder_name(arr.query_encoder))
        history.append(row)
        bar.set_postfix(loss=f"{row['loss']:.4f}")
    run = Run(history, seconds=time.perf_counter() - began)
    if rank == 0:
        run.metrics = {
            "tokens": cfg.tokens, "examples": {s: len(v) for s, v in split.items()},
            "initial": initial, "learned": {s: hard_metrics(learner, split[s], cfg.budget) for s in ("val", "test")},
            "random": {s: hard_metrics(learner, split[s], cfg.budget, random_seed=cfg.seed) for s in ("val", "test")},
            "train_seconds": run.seconds, "processes": world,
        }
        # what the leakage check refuses to score these weights on: the images they learned from or were chosen on
        seen = image_digests((e.image, f"{e.dataset} {s} image {e.image_id}") for s in ("train", "val") for e in split[s])
        export_run(out, cfg, arr, learner, run.metrics, seen)
        text = json.dumps(run.metrics, indent=1)
        atomic_write(out / "metrics.json", lambda f: f.write(text.encode()))
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
        seeds = [seed_of(cfg.seed, step, e.record_id) for e in micro]
        sync = world == 1 or j == cfg.accumulate - 1
        with nullcontext() if sync else model.no_sync():
            loss, p = model({**collate(micro), "examples": micro}, [budget_k(e, cfg.budget) for e in micro], seeds)
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
    try:
        atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=120))
    finally:
        plt.close(fig)
    return path
