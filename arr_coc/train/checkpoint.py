"""Files of a training run: the resumable checkpoint (refused under other settings) and the weights it exports."""
from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import nn

from arr_coc.config import ARRConfig
from arr_coc.train.config import TrainConfig
from arr_coc.weights import (
    SCORER_FORMAT,
    atomic_save,
    encoder_name,
    is_name,
    load_file,
    publish,
)

CHECKPOINT_FORMAT = "arr-coc-train/1"
WEIGHTS_FORMAT = SCORER_FORMAT  # what ARR loads as ScorerConfig.weights
# fields that may change between a run and its resume; every other field must match
RESUMABLE = ("steps", "eval_every", "out", "resume", "progress", "device", "gradient_checkpointing")


def save_checkpoint(path: Path, step: int, objective: nn.Module, optimizer: torch.optim.Optimizer,
                    history: list[dict], cfg: TrainConfig, arr_config: ARRConfig, query_encoder: str) -> None:
    """Write the checkpoint ``--resume`` continues from, and ``config.json`` beside it for people to read."""
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


def _norm(v: Any) -> Any:  # as JSON sees it: tuples and lists compare equal
    return json.loads(json.dumps(v, default=str))


def export_weights(path: Path, arr: Any, cfg: TrainConfig, metrics: dict, trained_images: dict | None = None) -> Path:
    """The trained scorer (and sampler) with what it needs to be rebuilt: channels, configs, metrics, and the
    content hash of every train and val image (``trained_images``, read by the leakage check)."""
    atomic_save({"format": WEIGHTS_FORMAT, "scorer_name": arr.config.scorer.name, "channels": list(arr.channels),
                  "query_encoder": encoder_name(arr.query_encoder),
                  "scorer": arr.scorer.state_dict(), "sampler": arr.sampler.state_dict(),
                  "arr_config": arr.config.to_dict(), "train_config": asdict(cfg), "metrics": metrics,
                  "trained_images": dict(trained_images or {})}, path)
    return path


def export_run(out: Path, cfg: TrainConfig, arr: Any, learner: Any, metrics: dict,
               trained_images: dict | None = None) -> Path:
    """Write what a run trained into ``out``: ``scorer.pt`` (scorer and sampler) or ``<learner>.pt``, each with
    ``trained_images`` (``{pixel digest: label}`` of its train and val images)."""
    if cfg.learner == "scorer":
        return export_weights(out / "scorer.pt", arr, cfg, metrics, trained_images)
    from arr_coc.allocators.pruning import save_learned

    return save_learned(out / f"{cfg.learner}.pt", cfg.learner, learner.net, arr.channels, metrics=metrics,
                        train_config=asdict(cfg), query_encoder=encoder_name(arr.query_encoder),
                        trained_images=dict(trained_images or {}))


def export(weights: Path, target: str) -> str:
    """Publish a run's weights (`arr-coc train --export TARGET`); returns what was written.

    A bare name (``log_polar``) becomes the shipped entry of that name: ``arr_coc/weights/<name>.pt``
    and its line in the registry, loadable by name from then on. Anything else is a path, and gets a copy.
    """
    if is_name(target):
        entry = publish(weights, target)
        return f"{entry.path} (shipped as {target!r}: --{entry.kind}-weights {target} loads it)"
    path = Path(target)
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(weights, path)
    return str(path)
