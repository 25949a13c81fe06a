"""Files of a training run: its folder (never taken over silently), the resumable checkpoint (refused under other
settings, checked against the model) and the weights it exports (a folder of model.safetensors + config.json)."""
from __future__ import annotations

import fcntl
import json
import os
import shutil
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterator

import torch
from torch import nn

from arr_coc.config import ARRConfig
from arr_coc.errors import UserError, WeightsError
from arr_coc.train.recipe import TrainConfig
from arr_coc.weights import (
    CONFIG,
    LEARNED_FORMAT,
    MODEL,
    SCORER_FORMAT,
    atomic_save,
    atomic_write,
    check_fields,
    check_state,
    encoder_name,
    is_name,
    load_file,
    publish,
    read_weights,
    save_folder,
    scorer_file,
)

CHECKPOINT_FORMAT = "arr-coc-train/1"
# fields that may change between a run and its resume; every other field must match
RESUMABLE = ("steps", "eval_every", "out", "resume", "fresh", "progress", "device", "gradient_checkpointing")
CHECKPOINT = "checkpoint.pt"
# what a run writes into its folder besides the checkpoint (`--fresh` removes them with it)
RUN_FILES = ("config.json", "metrics.json", "loss.png")
LEARNER_FOLDERS = ("scorer", "selector", "pruner")  # <learner>/ weights folders (and <learner>.pt of an older arr-coc)
LOCK = ".train.lock"  # held by a running run for its lifetime: two runs never share one folder


@contextmanager
def run_lock(out: Path, rank: int = 0) -> Iterator[None]:
    """Hold ``out`` for one run (rank 0's, for all its processes) until it ends; a second run is refused at once.

    An exclusive ``fcntl`` lock on ``out/.train.lock`` holding the run's process id; the system releases it
    when the process dies, so a killed run never blocks the next. A folder this call had to create is
    removed again when the run is refused before it wrote anything.

    Raises:
        UserError: another run holds the folder; one line naming its process id.
    """
    if rank != 0:
        yield
        return
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    with open(out / LOCK, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            pid = handle.read().strip() or "unknown"
            raise UserError(f"{out} is in use by another training run (process {pid}); wait for it to finish or "
                            f"pass another --out") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        done = False
        try:
            yield
            done = True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
            if created and not done and [p.name for p in out.iterdir()] == [LOCK]:
                (out / LOCK).unlink(missing_ok=True)  # refused or failed before writing: leave no trace
                out.rmdir()


def claim_run_folder(out: Path, cfg: TrainConfig, rank: int = 0) -> Path:
    """The checkpoint path of a run into ``out``, after checking the folder is this run's to write.

    A folder holding an earlier run's checkpoint is continued (``--resume``), replaced (``--fresh``:
    its checkpoint, weights and reports are removed, by rank 0) or refused; ``--resume`` with no
    checkpoint to continue is refused too. Nothing is read or written before this check.

    Raises:
        UserError: one line naming the folder and the flag to use.
    """
    ckpt = out / CHECKPOINT
    if cfg.resume and cfg.fresh:
        raise UserError("--resume continues the run in OUT and --fresh replaces it; pass one of them")
    if cfg.resume and not ckpt.is_file():
        raise UserError(f"--resume: {out} holds no {CHECKPOINT} to continue from; drop --resume to start a new run")
    if ckpt.exists() and not (cfg.resume or cfg.fresh):
        raise UserError(f"{out} holds an earlier run's {CHECKPOINT}; rerun with --resume to continue it or --fresh to "
                        f"replace it, or pass another --out")
    taken = [name for name in (*RUN_FILES, *LEARNER_FOLDERS, *(f"{n}.pt" for n in LEARNER_FOLDERS))
             if (out / name).exists()]
    if taken and not ckpt.exists() and not cfg.fresh:  # files a run would overwrite, and no run to resume
        raise UserError(f"{out} already holds {', '.join(taken)}, which this run would overwrite; rerun with --fresh "
                        f"to replace them, or pass another --out")
    if cfg.fresh and rank == 0:
        for name in (CHECKPOINT, *RUN_FILES):
            (out / name).unlink(missing_ok=True)
        for learner in LEARNER_FOLDERS:
            if (out / learner).is_dir():
                shutil.rmtree(out / learner)
            (out / f"{learner}.pt").unlink(missing_ok=True)  # weights of an older arr-coc
    return ckpt


def save_checkpoint(path: Path, step: int, objective: nn.Module, optimizer: torch.optim.Optimizer,
                    history: list[dict], cfg: TrainConfig, arr_config: ARRConfig, query_encoder: str) -> None:
    """Write the checkpoint ``--resume`` continues from, and ``config.json`` beside it for people to read."""
    atomic_save({"format": CHECKPOINT_FORMAT, "step": step, "objective": objective.state_dict(),
                  "optimizer": optimizer.state_dict(), "history": history, "train_config": _norm(asdict(cfg)),
                  "arr_config": _norm(arr_config.to_dict()), "query_encoder": query_encoder}, path)
    text = json.dumps({"train": asdict(cfg), "arr": arr_config.to_dict(), "query_encoder": query_encoder}, indent=1,
                      default=str)
    atomic_write(path.parent / "config.json", lambda f: f.write(text.encode()))


def load_checkpoint(path: Path, cfg: TrainConfig, arr_config: ARRConfig, query_encoder: str) -> dict:
    """A checkpoint to resume from (tensors and plain values only: it cannot run code); a corrupt file,
    missing fields or a different configuration, query encoder included, is a clear error."""
    try:
        ckpt = load_file(path, CHECKPOINT_FORMAT, "an arr-coc training checkpoint")
        check_fields(path, ckpt, {"step": int, "objective": dict, "optimizer": dict, "history": list,
                                  "train_config": dict, "arr_config": dict}, {"query_encoder": str})
    except ValueError as err:
        raise WeightsError(f"{err}; rerun with --fresh to start afresh") from None
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


def resume_from(path: Path, ckpt: dict, objective: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Load a checked checkpoint into the objective and optimizer; tensors that do not fit are one line."""
    check_state(path, ckpt["objective"], objective, "objective")
    objective.load_state_dict(ckpt["objective"])
    try:
        optimizer.load_state_dict(ckpt["optimizer"])
    except (ValueError, KeyError, TypeError, RuntimeError) as err:  # the file's optimizer state, not our code
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise WeightsError(f"{path}: optimizer state does not fit this run ({first}); rerun with --fresh") from None


def _norm(v: Any) -> Any:  # as JSON sees it: tuples and lists compare equal
    return json.loads(json.dumps(v, default=str))


def export_weights(path: Path, arr: Any, cfg: TrainConfig, metrics: dict, trained_images: dict | None = None) -> Path:
    """The trained scorer (and sampler) as a weights folder, with what rebuilds it: channels, configs, metrics,
    and the content hash of every train and val image (``trained_images``, read by the leakage check)."""
    return save_folder(scorer_file(arr, train_config=asdict(cfg), metrics=metrics,
                                   trained_images=dict(trained_images or {})), path)


def export_run(out: Path, cfg: TrainConfig, arr: Any, learner: Any, metrics: dict,
               trained_images: dict | None = None) -> Path:
    """Write what a run trained into ``out``: the folder ``scorer/`` (scorer and sampler) or ``<learner>/``,
    each with ``trained_images`` (``{pixel digest: label}`` of its train and val images)."""
    if cfg.learner == "scorer":
        return export_weights(out / "scorer", arr, cfg, metrics, trained_images)
    from arr_coc.allocators.pruning import save_learned

    return save_learned(out / cfg.learner, cfg.learner, learner.net, arr.channels, metrics=metrics,
                        train_config=asdict(cfg), query_encoder=encoder_name(arr.query_encoder),
                        trained_images=dict(trained_images or {}))


def check_export(target: str, fresh: bool = False, learner: str | None = None) -> None:
    """Refuse, before any work, an ``--export`` target the trained weights could not go to.

    A registry name is the shipped entry of that name, replaced as a whole (its files are the package's own);
    ``auto`` and ``none`` are reserved, and ``selector`` / ``pruner`` hold only weights of that ``learner``.
    A path must be a folder (or nothing yet) holding neither ``model.safetensors`` nor ``config.json``,
    unless ``fresh``.

    Raises:
        UserError: one line naming the target and what to pass instead.
    """
    if is_name(target):
        if target in ("auto", "none"):
            raise UserError(f"--export {target}: the name is reserved (it means the default / no weights); "
                            f"choose another")
        if learner is not None and target in ("selector", "pruner") and learner != target:
            raise UserError(f"--export {target}: the name is for {target} weights, and this run trains the "
                            f"{learner}; choose another name")
        return
    path = Path(target)
    if path.exists() and not path.is_dir():
        raise UserError(f"--export {path} is a file; export into a folder (it gets {MODEL} and {CONFIG})")
    taken = [name for name in (MODEL, CONFIG) if (path / name).exists()]
    if taken and not fresh:
        raise UserError(f"--export {path} already holds {' and '.join(taken)}; rerun with --fresh to replace "
                        f"{'it' if len(taken) == 1 else 'them'}, or export into another folder")


def export(weights: Path, target: str, fresh: bool = False) -> str:
    """Publish a run's weights (`arr-coc train --export TARGET`); returns what was written.

    A bare name (``log_polar``) becomes the shipped entry of that name: ``arr_coc/weights/<name>/``
    and its line in the registry, loadable by name from then on. Anything else is a folder, and gets a copy;
    a folder already holding weights files is refused unless ``fresh`` (:func:`check_export`).
    """
    check_export(target, fresh)
    if is_name(target):
        entry = publish(weights, target)
        return f"{entry.path} (shipped as {target!r}: --{entry.kind}-weights {target} loads it)"
    saved = read_weights(weights, (SCORER_FORMAT, LEARNED_FORMAT), "weights made by `arr-coc train`")
    return str(save_folder(saved, Path(target)))
