"""The one way every arr-coc file is written and read: atomically (whole or not at all), a ``dict`` with a ``"format"`` tag.

Every file arr-coc writes (weights, checkpoints, pictures, metrics) goes through :func:`atomic_write`:
a temporary file beside the target, renamed over it once complete, removed on any failure (a full
disk ends in one line saying where and how much space is free). Training checkpoints, feature caches
and weights of the older ``.pt`` kind are read with ``torch.load(weights_only=True)``, so a file from
someone else can hold tensors and plain values but never code.
"""
from __future__ import annotations

import errno
import hashlib
import os
import pickle
import shutil
from pathlib import Path
from typing import IO, Any, Callable

import torch

from arr_coc.errors import DiskFullError, WeightsError

SCORER_FORMAT = "arr-coc-scorer/2"  # trained relevance scorer (and the sampler trained with it)
LEARNED_FORMAT = "arr-coc-allocator/1"  # trained selector or pruner (arr_coc.allocators.pruning)
LEARNED_KINDS = ("selector", "pruner")  # what a LEARNED_FORMAT file holds, in the evaluation's table order


_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # no room: the disk, the user's quota, the process's file size limit


def open_temp(path: Path) -> IO[bytes]:
    """How :func:`atomic_write` opens its temporary file (tests pass another opener to fail on purpose)."""
    return open(path, "wb")


def open_append(path: Path) -> IO[bytes]:
    """How :func:`atomic_append` opens the file it appends to (tests pass another opener to fail on purpose)."""
    return open(path, "ab")


def atomic_write(path: str | Path, write: Callable[[IO[bytes]], Any], *,
                 opener: Callable[[Path], IO[bytes]] | None = None) -> Path:
    """Write ``path`` through ``write(file)`` whole or not at all: a temporary file beside it, renamed once complete.

    A failure (a full disk, an interruption, an error in ``write``) removes the temporary file and
    leaves the earlier ``path`` as it was, or none.

    Raises:
        DiskFullError: no space (or quota, or file-size limit) left; one line naming the path and the space free.

    Example:
        >>> import tempfile
        >>> p = atomic_write(Path(tempfile.mkdtemp()) / "a.txt", lambda f: f.write(b"whole"))
        >>> p.read_bytes(), [q.name for q in p.parent.iterdir()]
        (b'whole', ['a.txt'])
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with (opener or open_temp)(tmp) as f:
            write(f)
        os.replace(tmp, path)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        full = disk_full(path, err)
        if full is not None:
            raise full from None
        raise
    return path


def atomic_append(path: str | Path, data: bytes, *, opener: Callable[[Path], IO[bytes]] | None = None) -> None:
    """Append ``data`` to ``path`` whole or not at all: on any failure the file is cut back to its earlier length.

    For files that grow by appends (an evaluation's ``records.jsonl``), where rewriting the whole file for each
    append would cost its size every time. The data is on disk (``fsync``) when this returns.

    Raises:
        DiskFullError: no space left; one line naming the path and the space free, the file as it was.

    Example:
        >>> import tempfile
        >>> p = Path(tempfile.mkdtemp()) / "rows.jsonl"
        >>> atomic_append(p, b"a\\n"); atomic_append(p, b"b\\n"); p.read_bytes()
        b'a\\nb\\n'
    """
    path = Path(path)
    with (opener or open_append)(path) as f:
        start = f.seek(0, os.SEEK_END)
        try:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        except BaseException as err:
            f.truncate(start)  # shrinking needs no space: the rows before are kept, none half-written
            full = disk_full(path, err)
            if full is not None:
                raise full from None
            raise


def disk_full(path: str | Path, err: BaseException) -> DiskFullError | None:
    """The one-line :class:`DiskFullError` for a failed write of ``path`` when ``err`` means no space left, else None."""
    full = _full(err)
    if full is None:
        return None
    path = Path(path)
    return DiskFullError(f"{path}: {os.strerror(full).lower()} while writing it ({_free(path.parent)} free there); "
                         f"nothing was written: free some space or write elsewhere")


def _full(err: BaseException | None) -> int | None:
    """The errno of a full disk behind ``err``, if any (torch.save reports a failed write in a RuntimeError whose
    context is the OSError)."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in _FULL:
            return err.errno
        err = err.__cause__ or err.__context__
    return None


def _free(folder: Path) -> str:
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return "unknown space"
    return next(f"{free / 1024 ** i:.1f} {unit}" for i, unit in enumerate(("B", "KiB", "MiB", "GiB", "TiB"))
                if free < 1024 ** (i + 1) or unit == "TiB")


def atomic_save(obj: dict, path: str | Path) -> Path:
    """Write ``obj`` with ``torch.save`` through :func:`atomic_write`: the old file or the new one, never half of one."""
    return atomic_write(path, lambda f: torch.save(obj, f))


def load_file(path: str | Path, fmt: str | tuple[str, ...], what: str) -> dict[str, Any]:
    """Read an arr-coc file of format ``fmt`` (tensors and plain values only) or raise a one-line ``WeightsError``.

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
        arr_coc.errors.WeightsError: ... holds 'demo/1', not scorer weights (made by `arr-coc train`) ('other/1')
    """
    path = Path(path)
    fmts = (fmt,) if isinstance(fmt, str) else tuple(fmt)
    if not path.is_file():
        raise WeightsError(f"{path}: no such file; expected {what}")
    with path.open("rb") as f:
        head = f.read(4)
    if not (head.startswith(b"PK\x03\x04") or head[:1] == b"\x80"):  # torch.save's zip, or an old pickle
        raise WeightsError(f"{path} is not a file torch.save wrote (it begins {head!r}); expected {what}")
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError, AttributeError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise WeightsError(f"{path} cannot be read as {what}: {first}") from None
    if not isinstance(saved, dict) or saved.get("format") not in fmts:
        tag = saved.get("format") if isinstance(saved, dict) else type(saved).__name__
        raise WeightsError(f"{path} holds {tag!r}, not {what} ({' or '.join(map(repr, fmts))})")
    return saved


def file_sha256(path: str | Path) -> str:
    """The SHA-256 of a file's bytes, hex; of a folder, of its files' names and bytes in name order.

    What the registry records of each shipped file or weights folder.
    """
    path = Path(path)
    h = hashlib.sha256()
    if path.is_dir():
        for child in sorted(p for p in path.iterdir() if p.is_file()):
            h.update(f"{child.name}\0{file_sha256(child)}\0".encode())
        return h.hexdigest()
    with path.open("rb") as f:
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
