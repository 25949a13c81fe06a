"""Loading trained weights into what uses them: the ARR's scorer and sampler, the selector and the pruner.

Every loader takes ``"auto"`` (the registry's default entry, or nothing where none fits), a shipped
name, or a path (a weights folder, or an older ``.pt`` file), and checks what must fit (the fields, the
tensors against the module, channels, query encoder, cell) with a one-line error naming the file.
"""
from __future__ import annotations

import importlib
import inspect
from pathlib import Path
from typing import Any, Sequence

from torch import nn

from arr_coc.errors import WeightsError
from arr_coc.weights.catalog import resolve
from arr_coc.weights.checks import check_fields, check_names, check_sizes, check_state
from arr_coc.weights.files import LEARNED_FORMAT, LEARNED_KINDS, SCORER_FORMAT
from arr_coc.weights.folders import pretrained_path, read_weights

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


def scorer_file(arr: Any, **meta: Any) -> dict[str, Any]:
    """What a scorer weights file holds of ``arr`` (an ARR): its scorer and sampler tensors and what rebuilds them.

    ``meta``: more to record (``train_config``, ``metrics``, ``trained_on``, ...).
    """
    return {"format": SCORER_FORMAT, "scorer_name": arr.config.scorer.name, "channels": list(arr.channels),
            "query_encoder": encoder_name(arr.query_encoder), "scorer": arr.scorer.state_dict(),
            "sampler": arr.sampler.state_dict(), "arr_config": arr.config.to_dict(), **meta}


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
    saved = read_weights(path, SCORER_FORMAT, "scorer weights (made by `arr-coc train`)")
    check_fields(path, saved, {"scorer_name": str, "channels": list, "scorer": dict},
                 {"query_encoder": str, "sampler": dict, "arr_config": dict})
    channels = check_names(path, "channels", saved["channels"])
    fits = saved["scorer_name"] == arr.config.scorer.name and tuple(channels) == arr.channels
    if not fits:
        if auto:
            return "hand-set"
        raise WeightsError(f"{path} holds a {saved['scorer_name']!r} scorer for channels {channels}; "
                           f"this ARR has {arr.config.scorer.name!r} on {list(arr.channels)}")
    # Files written before the encoder was recorded were all trained on MiniLM questions (the default).
    trained_with, encoder = saved.get("query_encoder", "MiniLMQueryEncoder"), encoder_name(arr.query_encoder)
    if trained_with != encoder:
        if auto:
            return "hand-set"
        raise WeightsError(f"{path} was trained on questions embedded by {trained_with}, this ARR uses {encoder}; "
                           f"use that query encoder or train weights for this one")
    check_state(path, saved["scorer"], arr.scorer, "scorer")
    load_sampler = bool(saved.get("sampler")) and trained_sampler(path, saved) == arr.config.sampler.name
    if load_sampler:
        check_state(path, saved["sampler"], arr.sampler, "sampler")
    arr.scorer.load_state_dict(saved["scorer"])
    if load_sampler:
        arr.sampler.load_state_dict(saved["sampler"])
    return entry.source if entry is not None else str(path)


def trained_sampler(path: str | Path, saved: dict) -> str | None:
    """The sampler a scorer file trained alongside (its ``arr_config``), or None; checked when it holds parameters."""
    name = (saved.get("arr_config") or {}).get("sampler", {})
    name = name.get("name") if isinstance(name, dict) else None
    if saved.get("sampler") and not isinstance(name, str):
        raise WeightsError(f"{path}: holds sampler parameters, and its arr_config names no sampler they belong to")
    return name


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
    saved = read_weights(path, LEARNED_FORMAT, f"{kind} weights ({hint})")
    check_fields(path, saved, {"kind": str, "config": dict, "channels": list, "state": dict}, {"query_encoder": str})
    if saved["kind"] != kind:
        raise WeightsError(f"{path} holds {saved['kind']} weights, not {kind} weights; {hint}")
    module = _build(path, kind, saved["config"])
    cfg, saved_channels = module.config, check_names(path, "channels", saved["channels"])
    if kind == "pruner" and channels is not None and list(channels) != saved_channels:
        raise WeightsError(f"{path} prunes tokens of channels {saved_channels}, this ARR makes {list(channels)}; "
                           f"use those channels or {hint}")
    if kind == "pruner" and query_dim is not None and query_dim != cfg["query_dim"]:
        raise WeightsError(f"{path} expects {cfg['query_dim']}-wide query embeddings, got {query_dim}; {hint}")
    if kind == "pruner" and query_encoder is not None and saved.get("query_encoder", query_encoder) != query_encoder:
        raise WeightsError(f"{path} was trained on questions embedded by {saved['query_encoder']}, this ARR uses "
                           f"{query_encoder}; use that encoder or {hint}")
    if kind == "selector" and cell is not None and cell != cfg["cell"]:
        raise WeightsError(f"{path} scores {cfg['cell']} px cells, the canvas uses {cell} px; {hint} at that cell")
    check_state(path, saved["state"], module, "state")
    module.load_state_dict(saved["state"])
    return module.eval(), {k: v for k, v in saved.items() if k != "state"}


def _build(path: str | Path, kind: str, cfg: dict) -> nn.Module:
    """The empty module a file's ``config`` describes, or one line saying why the config builds none."""
    cls = _learned_class(kind)
    known = inspect.signature(cls).parameters
    unknown = sorted(set(cfg) - set(known))
    if unknown:
        raise WeightsError(f"{path}: config has {', '.join(map(repr, unknown))}, which a {kind} does not take "
                           f"(it takes {', '.join(known)})")
    bad = {k: v for k, v in cfg.items() if k != "keep_order" and not (isinstance(v, int) and not isinstance(v, bool))
           and v is not None}
    if bad:
        raise WeightsError(f"{path}: config {', '.join(f'{k}={v!r}' for k, v in bad.items())} must be whole numbers")
    check_sizes(path, cfg)  # before the layers are allocated
    try:
        return cls(**cfg)
    except (TypeError, ValueError, RuntimeError) as err:  # a size the layers refuse, e.g. a width of 0
        raise WeightsError(f"{path}: config {cfg} builds no {kind}: {str(err).strip().splitlines()[0]}") from None


def load_learned_methods(arr: Any, settings: Any) -> dict[str, nn.Module]:
    """The trained selector / pruner an evaluation asks for (``settings.methods``; files in ``settings.learned``,
    default the shipped ones), checked against the ARR's channels, query and cell."""
    paths = settings.learned or {}
    fit = dict(channels=arr.channels, query_dim=arr.query_encoder.dim, query_encoder=encoder_name(arr.query_encoder),
               cell=arr.config.canvas.cell)
    return {m: load_learned(m, paths.get(m, "auto"), **fit)[0] for m in LEARNED_KINDS if m in settings.methods}


def pretrained_config(spec: str | Path) -> tuple[Any, str]:
    """The ``ARRConfig`` scorer weights were trained in, set to load them, and their query encoder's class name.

    ``spec``: a shipped name (``log_polar``), a weights folder (or older ``.pt`` file), or a Hub id.
    """
    from dataclasses import replace

    from arr_coc.config import ARRConfig
    from arr_coc.weights.catalog import entries, is_name

    shipped = entries()
    path, weights = (shipped[str(spec)].path, str(spec)) if is_name(spec) and str(spec) in shipped else (None, None)
    if path is None:
        path = pretrained_path(spec)
        weights = str(path)
    saved = read_weights(path, SCORER_FORMAT, "scorer weights (made by `arr-coc train` or `save_pretrained`)")
    check_fields(path, saved, {"arr_config": dict}, {"query_encoder": str})
    # the sizes the ARR's modules will be built with, before any is; texture options are the channels' own settings
    check_sizes(path, {k: v for k, v in saved["arr_config"].items() if k != "texture"}, "arr_config")
    try:
        config = ARRConfig.from_dict(saved["arr_config"])
    except (TypeError, ValueError, AttributeError) as err:
        raise WeightsError(f"{path}: arr_config builds no ARRConfig ({str(err).strip().splitlines()[0]})") from None
    return replace(config, scorer=replace(config.scorer, weights=weights)), saved.get("query_encoder",
                                                                                        "MiniLMQueryEncoder")
