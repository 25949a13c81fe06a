"""The registry of shipped weights: each folder in arr_coc/weights/, its format, what it was trained on, its settings.

``registry.json`` beside the folders (``<name>/model.safetensors`` + ``<name>/config.json``) lists
them by name; they are package data, found through :mod:`importlib.resources`. An entry is made from
its folder alone (:func:`describe`), so the registry can be checked against the files;
``arr-coc train --export NAME`` (:func:`publish`) is the one way a folder and its entry get here
(``python -m arr_coc.weights.convert`` turns older ``.pt`` entries into folders). Names load where a path would
(``--scorer-weights log_polar``); ``auto`` is the entry named after the scorer (``contextual``) or the
learned allocator (``selector``, ``pruner``).
"""
from __future__ import annotations

import json
import re
import shutil
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from arr_coc.weights.files import LEARNED_FORMAT, LEARNED_KINDS, SCORER_FORMAT, atomic_write, file_sha256
from arr_coc.weights.folders import read_weights, save_folder

# the shipped folders as package data (an installed wheel holds them beside this module)
PACKAGED = Path(str(resources.files(__package__)))
MANIFEST = "registry.json"
SHIPPED = "trained, shipped: arr_coc/weights/"  # how a loaded ARR names shipped weights (``weights_source``)
# Settings that say where a run kept its files or how it showed progress, not what it learned.
_LOCAL = ("out", "features", "data", "resume", "fresh", "progress", "device")


@dataclass(frozen=True)
class Entry:
    """One shipped weights file.

    ``trained_on`` says which images it learned from: ``datasets``, ``images`` (``"train"``: the train
    images of :func:`arr_coc.data.datasets.split_of`; val chose its settings, test was never seen),
    ``split`` (an official split asked for, or None), ``limit``, ``seed``, ``hashed_images`` (how many train
    and val images the file records by pixel hash, ``trained_images``, for the leakage check) and whatever else
    the file records under ``trained_on``. ``sha256`` is the folder's
    (:func:`~arr_coc.weights.files.file_sha256`); ``converted_from`` the ``.pt`` file it was converted from, if any.
    """

    name: str
    file: str
    format: str
    kind: str  # "scorer" (with its sampler), "selector" or "pruner"
    sha256: str
    trained_on: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    converted_from: dict[str, Any] | None = None

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
    """The registry entry of weights made by `arr-coc train` (scorer or selector / pruner weights), as ``<name>/``."""
    path = Path(path)
    saved = read_weights(path, (SCORER_FORMAT, LEARNED_FORMAT), "weights made by `arr-coc train`")
    train = dict(saved.get("train_config") or {})
    trained_on = {"datasets": list(train.pop("datasets", ())), "images": "train", "split": train.pop("split", None),
                  "limit": train.pop("limit", None), "seed": train.pop("seed", None),
                  # the pixel hashes themselves live in the file (``trained_images``), where the leakage check reads them
                  "hashed_images": len(saved.get("trained_images") or {}), **(saved.get("trained_on") or {})}
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
    return Entry(name, name, saved["format"], kind, file_sha256(path), _plain(trained_on), _plain(settings),
                 saved.get("converted_from"))


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
    return (PACKAGED / default if spec == "auto" else Path(spec)), None


def is_name(spec: str | Path) -> bool:
    """Whether ``spec`` reads as a registry name (a bare word: letters, digits, '_', '-') rather than a path."""
    return re.fullmatch(r"[A-Za-z0-9_-]+", str(spec)) is not None


def publish(src: str | Path, name: str, root: Path | None = None) -> Entry:
    """Write trained weights into the registry as the folder ``<name>/`` and record their entry (`arr-coc train --export`).

    ``src`` is a weights folder or an older ``.pt`` file (converted on the way, the file it came from
    recorded in the entry).

    Raises:
        ValueError: ``name`` is not a plain word, or ``src`` is not weights made by `arr-coc train`.
    """
    if not is_name(name):
        raise ValueError(f"weights name {name!r} must be letters, digits, '_' or '-' (it becomes the folder <name>/)")
    if name in ("auto", "none"):
        raise ValueError(f"weights name {name!r} is reserved (it means the default / no weights); choose another")
    saved = read_weights(src, (SCORER_FORMAT, LEARNED_FORMAT), "weights made by `arr-coc train`")
    kind = saved["kind"] if saved["format"] == LEARNED_FORMAT else "scorer"
    if name in LEARNED_KINDS and kind != name:  # "auto" for a selector / pruner is the entry of that name
        raise ValueError(f"the name {name!r} is for {name} weights, and {src} holds {kind} weights")
    root = root or PACKAGED
    if Path(src).is_file() and Path(src).suffix == ".pt":
        saved["converted_from"] = {"file": Path(src).name, "sha256": file_sha256(src)}
    target = root / name
    if target.is_dir():
        shutil.rmtree(target)  # a folder may only hold what this export writes: its digest covers every file
    save_folder(saved, target)
    described = describe(target, name)
    manifest = root / MANIFEST
    table = json.loads(manifest.read_text()) if manifest.is_file() else {}
    table[name] = {k: v for k, v in asdict(described).items() if k != "name"}
    text = json.dumps(dict(sorted(table.items())), indent=1) + "\n"
    atomic_write(manifest, lambda f: f.write(text.encode()))
    return described
