"""The leakage check: shipped weights are never scored on images they learned from."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from arr_coc.weights.files import LEARNED_FORMAT, LEARNED_KINDS, SCORER_FORMAT
from arr_coc.weights.folders import read_weights
from arr_coc.weights.registry import entries, entry_of

SCORER_FREE = ("full", "native_budget", "uniform_image")  # methods the relevance scorer plays no part in


def trained_on(path: str | Path) -> tuple[str, ...]:
    """The datasets a weights file from ``arr-coc train`` learned from (its saved training settings)."""
    saved = read_weights(path, (SCORER_FORMAT, LEARNED_FORMAT), "weights made by `arr-coc train`")
    return tuple(saved.get("train_config", {}).get("datasets", ()))


def refuse_leakage(dataset: str, split: str | None, arr: Any, methods: Sequence[str],
                   learned: dict | None = None) -> None:
    """Refuse to score shipped trained weights on images they may have learned from.

    The shipped scorers, selector and pruner were trained on the train split of their datasets (and
    chosen on val): on those datasets only ``split="test"`` is held out. Raises ``ValueError`` saying so.
    """
    if split == "test":
        return
    shipped = []
    scorer = entry_of(arr.weights_source)
    if scorer is not None and any(m not in SCORER_FREE for m in methods):
        shipped.append(("scorer", scorer))
    known = entries()
    shipped += [(m, known[m]) for m in LEARNED_KINDS
                if m in methods and str((learned or {}).get(m, "auto")) == "auto" and m in known]
    for what, entry in shipped:
        datasets = trained_on(entry.path)
        if dataset in datasets:
            raise ValueError(f"the shipped {what} weights (arr_coc/weights/{entry.file}/) were trained on the train "
                             f"images of {', '.join(datasets)} and chosen on val; scoring them on {dataset} "
                             f"{'--split ' + split if split else 'without --split test'} would count images they "
                             f"learned from: add --split test (or pass --scorer-weights none or your own weights)")
