"""The registry of shipped weights: each file in arr_coc/weights/, its format, what it was trained on, its settings.

``registry.json`` beside the files lists them by name. An entry is made from its file alone
(:func:`describe`), so the registry can be checked against the files; ``arr-coc train --export NAME``
(:func:`publish`) is the one way a file and its entry get here. Names load where a path would
(``--scorer-weights log_polar``); ``auto`` is the entry named after the scorer (``contextual``) or the
learned allocator (``selector``, ``pruner``).
"""
from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from arr_coc.weights.files import (
    LEARNED_FORMAT,
    LEARNED_KINDS,
    SCORER_FORMAT,
    file_sha256,
    load_file,
)

PACKAGED = Path(__file__).parent
MANIFEST = "registry.json"
SHIPPED = "trained, shipped: arr_coc/weights/"  # how a loaded ARR names shipped weights (``weights_source``)
# Settings that say where a run kept its files or how it showed progress, not what it learned.
_LOCAL = ("out", "features", "data", "resume", "progress", "device")


@dataclass(frozen=True)
class Entry:
    """One shipped weights file.

    ``trained_on`` says which images it learned from: ``datasets``, ``images`` (``"train"``: the train
    images of :func:`arr_coc.data.datasets.split_of`; val chose its settings, test was never seen),
    ``split`` (an official split asked for, or None), ``limit``, ``seed`` and ``hashed_images`` (how
    many train and val images the file records by pixel hash for the leakage check). ``sha256`` is the file's.
    """

    name: str
    file: str
    format: str
    kind: str  # "scorer" (with its sampler), "selector" or "pruner"
    sha256: str
    trained_on: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def path(self) -> Path:
        return PACKAGED / self.file

    @property
    def source(self) -> str:
        """What an ARR loaded from this entry reports as its ``weights_source``."""
        return SHIPPED + self.file

    @property
    def datasets(self) -> tuple[str, ...]:
        return tuple(self.trained_on.get("datasets", ()))


def _plain(v: Any) -> Any:
    return json.loads(json.dumps(v, default=str))


def describe(path: str | Path, name: str) -> Entry:
    """The registry entry of a weights file made by `arr-coc train` (scorer or selector / pruner weights)."""
    path = Path(path)
    saved = load_file(path, (SCORER_FORMAT, LEARNED_FORMAT), "weights made by `arr-coc train`")
    train = dict(saved.get("train_config") or {})
    trained_on = {"datasets": list(train.pop("datasets", ())), "images": "train", "split": train.pop("split", None),
                  "limit": train.pop("limit", None), "seed": train.pop("seed", None),
                  # the pixel hashes themselves live in the file (``trained_images``), where the leakage check reads them
                  "hashed_images": len(saved.get("trained_images") or {})}
    settings: dict[str, Any] = {"channels": list(saved.get("channels", ())),
                                "query_encoder": saved.get("query_encoder", "MiniLMQueryEncoder")}
    if saved["format"] == SCORER_FORMAT:
        kind = "scorer"
        sampler = saved.get("arr_config", {}).get("sampler", {}).get("name")  # trained with the scorer, if learnable
        settings |= {"scorer": saved["scorer_name"], "sampler": sampler}
    else:
        kind = saved["kind"]
        settings["config"] = saved["config"]
    settings["train"] = {k: v for k, v in train.items() if k not in _LOCAL}
    return Entry(name, f"{name}.pt", saved["format"], kind, file_sha256(path), _plain(trained_on), _plain(settings))


def entries(root: Path | None = None) -> dict[str, Entry]:
    """Every shipped entry by name (``root``: another registry folder, e.g. in tests)."""
    manifest = (root or PACKAGED) / MANIFEST
    if not manifest.is_file():
        return {}
    return {name: Entry(name=name, **fields) for name, fields in json.loads(manifest.read_text()).items()}


def entry(name: str, root: Path | None = None) -> Entry:
    """The shipped entry ``name``, or a one-line ``ValueError`` listing the names there are."""
    known = entries(root)
    if name not in known:
        raise ValueError(f"no shipped weights named {name!r}; choose one of {', '.join(sorted(known))} or give a path")
    return known[name]


def entry_of(source: str) -> Entry | None:
    """The entry an ARR's ``weights_source`` names, if it names a shipped one."""
    if not source.startswith(SHIPPED):
        return None
    return next((e for e in entries().values() if e.file == source[len(SHIPPED):]), None)


def resolve(spec: str | Path, default: str) -> tuple[Path, Entry | None]:
    """Where weights ``spec`` lives: ``"auto"`` is the entry ``default``, a shipped name its entry, else a path.

    Returns:
        The file and its entry (None for a path); an ``auto`` with no such entry gives a path that does not exist.
    """
    spec = str(spec)
    known = entries()
    name = default if spec == "auto" else spec
    if name in known:
        return known[name].path, known[name]
    if spec != "auto" and is_name(spec) and not Path(spec).exists():
        raise ValueError(f"no shipped weights named {spec!r}; choose one of {', '.join(sorted(known))} or give a path")
    return (PACKAGED / f"{default}.pt" if spec == "auto" else Path(spec)), None


def is_name(spec: str | Path) -> bool:
    """Whether ``spec`` reads as a registry name (a bare word: letters, digits, '_', '-') rather than a path."""
    return re.fullmatch(r"[A-Za-z0-9_-]+", str(spec)) is not None


def publish(src: str | Path, name: str, root: Path | None = None) -> Entry:
    """Copy trained weights into the registry as ``<name>.pt`` and record their entry (`arr-coc train --export`).

    Raises:
        ValueError: ``name`` is not a plain word, or ``src`` is not weights made by `arr-coc train`.
    """
    if not is_name(name):
        raise ValueError(f"weights name {name!r} must be letters, digits, '_' or '-' (it becomes <name>.pt)")
    if name in ("auto", "none"):
        raise ValueError(f"weights name {name!r} is reserved (it means the default / no weights); choose another")
    described = describe(src, name)  # checks the file before anything is written
    if name in LEARNED_KINDS and described.kind != name:  # "auto" for a selector / pruner is the entry of that name
        raise ValueError(f"the name {name!r} is for {name} weights, and {src} holds {described.kind} weights")
    root = root or PACKAGED
    tmp = root / f".{name}.pt.{os.getpid()}.tmp"
    shutil.copyfile(src, tmp)
    os.replace(tmp, root / described.file)
    manifest = root / MANIFEST
    table = json.loads(manifest.read_text()) if manifest.is_file() else {}
    table[name] = {k: v for k, v in asdict(described).items() if k != "name"}
    tmp = manifest.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(dict(sorted(table.items())), indent=1) + "\n")
    os.replace(tmp, manifest)
    return described
