"""The one way every arr-coc file is written and read: a ``dict`` with a ``"format"`` tag, saved atomically.

Scorer weights, allocator weights, training checkpoints and feature caches are all read with
``torch.load(weights_only=True)``, so a file from someone else can hold tensors and plain values but
never code.
"""
from __future__ import annotations

import hashlib
import os
import pickle
from pathlib import Path
from typing import Any

import torch

SCORER_FORMAT = "arr-coc-scorer/2"  # trained relevance scorer (and the sampler trained with it)
LEARNED_FORMAT = "arr-coc-allocator/1"  # trained selector or pruner (arr_coc.allocators.pruning)
LEARNED_KINDS = ("selector", "pruner")  # what a LEARNED_FORMAT file holds, in the evaluation's table order


def atomic_save(obj: dict, path: str | Path) -> Path:
    """Write ``obj`` with ``torch.save``; a run killed mid-write leaves the old file or none, never half of one."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + f".{os.getpid()}.tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)
    return path


def load_file(path: str | Path, fmt: str | tuple[str, ...], what: str) -> dict[str, Any]:
    """Read an arr-coc file of format ``fmt`` (tensors and plain values only) or raise a one-line ``ValueError``.

    Args:
        path: the file.
        fmt: the accepted ``"format"`` tag(s).
        what: what the file should hold and which command makes it, for the message.

    Example:
        >>> import tempfile
        >>> p = atomic_save({"format": "demo/1", "x": torch.ones(2)}, Path(tempfile.mkdtemp()) / "d.pt")
        >>> load_file(p, "demo/1", "a demo")["x"]
        tensor([1., 1.])
        >>> load_file(p, "other/1", "scorer weights (made by `arr-coc train`)")
        Traceback (most recent call last):
        ...
        ValueError: ... holds 'demo/1', not scorer weights (made by `arr-coc train`) ('other/1')
    """
    path = Path(path)
    fmts = (fmt,) if isinstance(fmt, str) else tuple(fmt)
    if not path.is_file():
        raise ValueError(f"{path}: no such file; expected {what}")
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError, AttributeError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(f"{path} cannot be read as {what}: {first}") from None
    if not isinstance(saved, dict) or saved.get("format") not in fmts:
        tag = saved.get("format") if isinstance(saved, dict) else type(saved).__name__
        raise ValueError(f"{path} holds {tag!r}, not {what} ({' or '.join(map(repr, fmts))})")
    return saved


def file_sha256(path: str | Path) -> str:
    """The SHA-256 of a file's bytes, hex: what the registry records of each shipped file."""
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def weights_digest(*modules: torch.nn.Module) -> str:
    """A short hash of modules' weights: two runs agree on it only if they scored with the same numbers."""
    h = hashlib.blake2b(digest_size=8)
    for module in modules:
        for name, t in module.state_dict().items():
            h.update(name.encode())
            h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
