"""Loading trained weights into what uses them: the ARR's scorer and sampler, the selector and the pruner.

Every loader takes ``"auto"`` (the registry's default entry, or nothing where none fits), a shipped
name, or a path, and checks what must fit (channels, query encoder, cell) with a one-line error.
"""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Sequence

from torch import nn

from arr_coc.weights.files import (
    LEARNED_FORMAT,
    LEARNED_KINDS,
    SCORER_FORMAT,
    load_file,
)
from arr_coc.weights.registry import resolve

# The module a selector / pruner file rebuilds, named rather than imported: the classes live in
# arr_coc.allocators, a layer above this one, and are imported the first time such a file is loaded.
LEARNED_CLASSES = {"selector": "arr_coc.allocators.pruning:PatchSelector",
                   "pruner": "arr_coc.allocators.pruning:TokenPruner"}


def encoder_name(encoder: object) -> str:
    """What trained weights record about the questions' encoder, and are checked against when loaded.

    >>> class HashingQueryEncoder: ...
    >>> encoder_name(HashingQueryEncoder())
    'HashingQueryEncoder'
    """
    return type(encoder).__name__


def load_scorer_weights(arr: Any, spec: str) -> str:
    """Load trained scorer (and sampler) weights into ``arr`` (an ARR); returns where they came from.

    ``"auto"`` takes the shipped entry named after the scorer (``contextual``) when it was trained on
    the same channels and query encoder, else keeps the hand-set initialisation; ``"none"`` keeps it;
    a shipped name or a path must fit, or it is an error. The sampler's trained parameters load too
    when the file trained the sampler ``arr`` uses.
    """
    if spec == "none":
        return "hand-set"
    auto = spec == "auto"
    path, entry = resolve(spec, arr.config.scorer.name)
    if auto and not path.exists():
        return "hand-set"
    saved = load_file(path, SCORER_FORMAT, "scorer weights (made by `arr-coc train`)")
    fits = saved["scorer_name"] == arr.config.scorer.name and tuple(saved["channels"]) == arr.channels
    if not fits:
        if auto:
            return "hand-set"
        raise ValueError(f"{path} holds a {saved['scorer_name']!r} scorer for channels {saved['channels']}; "
                         f"this ARR has {arr.config.scorer.name!r} on {list(arr.channels)}")
    # Files written before the encoder was recorded were all trained on MiniLM questions (the default).
    trained_with, encoder = saved.get("query_encoder", "MiniLMQueryEncoder"), encoder_name(arr.query_encoder)
    if trained_with != encoder:
        if auto:
            return "hand-set"
        raise ValueError(f"{path} was trained on questions embedded by {trained_with}, this ARR uses {encoder}; "
                         f"use that query encoder or train weights for this one")
    arr.scorer.load_state_dict(saved["scorer"])
    if saved.get("sampler") and saved["arr_config"]["sampler"]["name"] == arr.config.sampler.name:
        arr.sampler.load_state_dict(saved["sampler"])
    return entry.source if entry is not None else str(path)


def _learned_class(kind: str) -> type[nn.Module]:
    module, name = LEARNED_CLASSES[kind].split(":")
    return getattr(importlib.import_module(module), name)


def load_learned(kind: str, spec: str | Path = "auto", *, channels: Sequence[str] | None = None,
                 query_dim: int | None = None, query_encoder: str | None = None, cell: int | None = None
                 ) -> tuple[nn.Module, dict]:
    """A trained `PatchSelector` ("selector") or `TokenPruner` ("pruner") and its saved metadata.

    ``spec`` "auto" is the shipped entry of that name; a shipped name or a path loads that file. The
    checks that follow say what does not fit: the pruner's token channels and query width, the selector's cell.
    """
    if kind not in LEARNED_KINDS:
        raise ValueError(f"unknown learned allocator {kind!r}; choose one of {', '.join(LEARNED_KINDS)}")
    path, _ = resolve(spec, kind)
    hint = f"train one with `arr-coc train --learner {kind}`"
    saved = load_file(path, LEARNED_FORMAT, f"{kind} weights ({hint})")
    if saved.get("kind") != kind:
        raise ValueError(f"{path} holds {saved.get('kind')} weights, not {kind} weights; {hint}")
    cfg = saved["config"]
    if kind == "pruner" and channels is not None and list(channels) != saved["channels"]:
        raise ValueError(f"{path} prunes tokens of channels {saved['channels']}, this ARR makes {list(channels)}; "
                         f"use those channels or {hint}")
    if kind == "pruner" and query_dim is not None and query_dim != cfg["query_dim"]:
        raise ValueError(f"{path} expects {cfg['query_dim']}-wide query embeddings, got {query_dim}; {hint}")
    if kind == "pruner" and query_encoder is not None and saved.get("query_encoder", query_encoder) != query_encoder:
        raise ValueError(f"{path} was trained on questions embedded by {saved['query_encoder']}, this ARR uses "
                         f"{query_encoder}; use that encoder or {hint}")
    if kind == "selector" and cell is not None and cell != cfg["cell"]:
        raise ValueError(f"{path} scores {cfg['cell']} px cells, the canvas uses {cell} px; {hint} at that cell")
    module = _learned_class(kind)(**cfg)
    module.load_state_dict(saved["state"])
    return module.eval(), {k: v for k, v in saved.items() if k != "state"}


def load_learned_methods(arr: Any, settings: Any) -> dict[str, nn.Module]:
    """The trained selector / pruner an evaluation asks for (``settings.methods``; files in ``settings.learned``,
    default the shipped ones), checked against the ARR's channels, query and cell."""
    paths = settings.learned or {}
    fit = dict(channels=arr.channels, query_dim=arr.query_encoder.dim, query_encoder=encoder_name(arr.query_encoder),
               cell=arr.config.canvas.cell)
    return {m: load_learned(m, paths.get(m, "auto"), **fit)[0] for m in LEARNED_KINDS if m in settings.methods}
