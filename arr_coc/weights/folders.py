"""Weights as the Hub keeps them: a folder of ``model.safetensors`` (the tensors) and ``config.json`` (the rest).

A weights file is a ``dict`` with a ``"format"`` tag whose state dicts (the format's
:data:`STATE_DICTS`) hold the tensors. In a folder the tensors go to ``model.safetensors`` as
``<state dict>.<key>`` and everything else to ``config.json``; the same JSON rides in the safetensors
header, so a lone ``.safetensors`` file (an upload in the microscope) is whole too. Reading checks
each piece and names the file and what is wrong in one line.
"""
from __future__ import annotations

import json
import re
import warnings
from pathlib import Path
from typing import Any

from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from arr_coc.errors import WeightsError
from arr_coc.weights.files import LEARNED_FORMAT, SCORER_FORMAT, atomic_write, load_file

MODEL, CONFIG = "model.safetensors", "config.json"
META = "arr_coc_config"  # the safetensors header key holding config.json's text
STATE_DICTS = {SCORER_FORMAT: ("scorer", "sampler"), LEARNED_FORMAT: ("state",)}  # the tensors of each format


def save_folder(saved: dict[str, Any], folder: str | Path) -> Path:
    """Write ``saved`` (a weights dict of a format in :data:`STATE_DICTS`) as ``folder/model.safetensors`` +
    ``folder/config.json``, each file atomically; returns the folder."""
    folder = Path(folder)
    groups = STATE_DICTS[saved["format"]]
    tensors = {f"{g}.{k}": v.detach().cpu().contiguous().clone() for g in groups for k, v in saved[g].items()}
    config = {k: v for k, v in saved.items() if k not in groups}
    text = json.dumps(json.loads(json.dumps(config, default=str)), indent=1) + "\n"  # tuples as lists, as read back
    blob = save_safetensors(tensors, metadata={META: text})  # one key: the header is the same bytes every time
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write(folder / MODEL, lambda f: f.write(blob))
    atomic_write(folder / CONFIG, lambda f: f.write(text.encode()))
    return folder


def is_folder_weights(path: str | Path) -> bool:
    """Whether ``path`` is weights of the folder kind: a folder, a ``.safetensors`` file or a ``config.json``."""
    path = Path(path)
    return path.is_dir() or path.suffix == ".safetensors" or path.name == CONFIG


def read_folder(path: str | Path, fmts: tuple[str, ...], what: str) -> dict[str, Any]:
    """The weights dict of a folder (or of its ``model.safetensors`` / ``config.json``, or of a lone ``.safetensors``
    file carrying its config), checked down to the tensors' names; a one-line :class:`WeightsError` otherwise."""
    path = Path(path)
    folder = path if path.is_dir() else path.parent
    model = folder / MODEL if path.is_dir() or path.name == CONFIG else path
    # a folder needs its config.json; a lone file reads the copy in its header (an upload has nothing beside it)
    config_path = folder / CONFIG if path.is_dir() or path.name == CONFIG or (folder / CONFIG).is_file() and \
        model.name == MODEL else None
    if path.is_dir() and not (model.is_file() or (folder / CONFIG).is_file()):
        raise WeightsError(f"{path}: holds neither {MODEL} nor {CONFIG}; expected {what}")
    if not model.is_file():
        raise WeightsError(f"{model}: no such file; expected {what}")
    try:
        blob = model.read_bytes()
        tensors = load_safetensors(blob)
        header = _header(blob)
    except (SafetensorError, ValueError, OSError) as err:
        raise WeightsError(f"{model} is not a safetensors file (its header does not read: {type(err).__name__}); "
                           f"expected {what}") from None
    if config_path is not None and not config_path.is_file():
        raise WeightsError(f"{config_path}: no such file; {model} needs it beside it ({what})")
    source, text = (config_path, _read_text(config_path)) if config_path is not None else (model, header.get(META))
    if text is None:
        raise WeightsError(f"{model} carries no config (no {CONFIG} beside it, none in its header); expected {what}")
    try:
        saved = json.loads(text)
    except json.JSONDecodeError as err:
        raise WeightsError(f"{source} is not JSON ({err}); expected the config of {what}") from None
    if not isinstance(saved, dict):
        raise WeightsError(f"{source} holds a JSON {type(saved).__name__}, not an object; expected the config of {what}")
    if "format" not in saved:
        raise WeightsError(f"{source} has no format tag; expected {what} ({' or '.join(map(repr, fmts))})")
    if saved["format"] not in fmts:
        raise WeightsError(f"{source} holds {saved['format']!r}, not {what} ({' or '.join(map(repr, fmts))})")
    groups = STATE_DICTS[saved["format"]]
    stray = sorted(k for k in tensors if k.split(".", 1)[0] not in groups or "." not in k)
    if stray:
        raise WeightsError(f"{model} holds tensors outside {', '.join(groups)}: {', '.join(stray[:3])}")
    for g in groups:
        if g in saved:
            raise WeightsError(f"{source} has a field {g!r}, which belongs in {MODEL} as tensors")
        saved[g] = {k.split(".", 1)[1]: v for k, v in tensors.items() if k.split(".", 1)[0] == g}
    return saved


def _header(blob: bytes) -> dict[str, str]:
    """The safetensors header's ``__metadata__`` (strings only), read from its 8-byte length prefix."""
    size = int.from_bytes(blob[:8], "little")
    return json.loads(blob[8:8 + size]).get("__metadata__") or {}


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise WeightsError(f"{path} is not text ({err.reason} at byte {err.start}); expected a JSON config") from None


def read_weights(path: str | Path, fmt: str | tuple[str, ...], what: str) -> dict[str, Any]:
    """A weights dict from a folder (or its files) or from an older ``.pt`` file, which loads with a one-line
    ``FutureWarning`` saying how to convert it."""
    fmts = (fmt,) if isinstance(fmt, str) else tuple(fmt)
    if is_folder_weights(path):
        return read_folder(path, fmts, what)
    saved = load_file(path, fmts, what)
    warnings.warn(f"{path}: weights in a .pt file are deprecated; convert them once with "
                  f"`python -m arr_coc.weights.convert {path}` (a folder of {MODEL} + {CONFIG})", FutureWarning,
                  stacklevel=3)
    return saved


def pretrained_path(spec: str | Path) -> Path:
    """Where ``from_pretrained`` reads: an existing folder or file as it is, else a Hub id (``owner/name``)
    fetched with ``huggingface_hub.snapshot_download`` (its config.json and model.safetensors only)."""
    path = Path(spec)
    if path.exists():
        return path
    if re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", str(spec)) is None:
        raise WeightsError(f"{spec}: no such weights folder (nor a Hub id such as owner/name)")
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(str(spec), allow_patterns=[MODEL, CONFIG]))
