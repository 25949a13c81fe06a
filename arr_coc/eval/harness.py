"""Weights an evaluation scores with: their digest, what they were trained on, the trained allocators a run loads.

The evaluation itself lives in :mod:`arr_coc.eval.run` (the OCR loop), :mod:`arr_coc.eval.vlm_reader`
(the VLM loop) and :mod:`arr_coc.eval.report` (tables and plots); its methods in
:mod:`arr_coc.allocators.methods`.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Sequence

import torch

from arr_coc.allocators.methods import LEARNED_METHODS, SCORER_FREE
from arr_coc.allocators.pruning import LEARNED_FORMAT
from arr_coc.pipeline import ARR, SCORER_FORMAT
from arr_coc.query import encoder_name
from arr_coc.weights import load_file


def weights_digest(*modules: torch.nn.Module) -> str:
    """A short hash of modules' weights: two runs agree on it only if they scored with the same numbers."""
    h = hashlib.blake2b(digest_size=8)
    for module in modules:
        for name, t in module.state_dict().items():
            h.update(name.encode())
            h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def trained_on(path: Path) -> tuple[str, ...]:
    """The datasets a weights file from ``arr-coc train`` learned from (its saved training settings)."""
    saved = load_file(path, (SCORER_FORMAT, LEARNED_FORMAT), "weights made by `arr-coc train`")
    return tuple(saved.get("train_config", {}).get("datasets", ()))


def refuse_leakage(dataset: str, split: str | None, arr: ARR, methods: Sequence[str],
                   learned: dict | None = None) -> None:
    """Refuse to score the shipped trained weights on images they may have learned from.

    The packaged scorer, selector and pruner were trained on the train split of their datasets (and
    chosen on val): on those datasets only ``split="test"`` is held out. Raises ``ValueError`` saying so.
    """
    from arr_coc.weights import PACKAGED

    if split == "test":
        return
    shipped = []
    if arr.weights_source.startswith("trained, shipped") and any(m not in SCORER_FREE for m in methods):
        shipped.append(("scorer", PACKAGED / f"{arr.config.scorer.name}.pt"))
    shipped += [(m, PACKAGED / f"{m}.pt") for m in LEARNED_METHODS
                if m in methods and str((learned or {}).get(m, "auto")) == "auto"]
    for what, path in shipped:
        datasets = trained_on(path)
        if dataset in datasets:
            raise ValueError(f"the shipped {what} weights (arr_coc/weights/{path.name}) were trained on the train "
                             f"images of {', '.join(datasets)} and chosen on val; scoring them on {dataset} "
                             f"{'--split ' + split if split else 'without --split test'} would count images they "
                             f"learned from: add --split test (or pass --scorer-weights none or your own weights)")


def load_learned_methods(arr: ARR, settings: Any) -> dict[str, Any]:
    """The trained selector / pruner a run asks for (``settings.methods``, weights ``settings.learned``),
    checked against the ARR's channels, query and cell."""
    from arr_coc.allocators.pruning import load_learned

    paths = settings.learned or {}
    fit = dict(channels=arr.channels, query_dim=arr.query_encoder.dim, query_encoder=encoder_name(arr.query_encoder),
               cell=arr.config.canvas.cell)
    return {m: load_learned(m, paths.get(m, "auto"), **fit)[0] for m in LEARNED_METHODS if m in settings.methods}
