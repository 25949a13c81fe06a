"""An evaluation output folder: rows keyed by (record, method, budget), the settings that made them, a lock.

``records.jsonl`` holds one JSON row per line (strict JSON: a missing value is ``null``, never ``NaN``);
``settings.json`` records everything that changes a row besides its key (channels, scorer and its
weights' hash, query encoder, reader, ...). A run with other settings is refused (or, with ``fresh``,
replaces the old rows), so a table never mixes rows of two configurations. Every read and write of
the folder holds an exclusive ``fcntl`` lock and rows are appended only for keys not yet present, so
concurrent runs into one folder never duplicate a row; a line cut by a killed run is dropped and redone.
Every write is whole or nothing (:func:`~arr_coc.weights.atomic_write`, :func:`~arr_coc.weights.atomic_append`):
a full disk is one line, and leaves the files as they were.
"""
from __future__ import annotations

import fcntl
import json
import math
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from arr_coc.weights.files import atomic_append, atomic_write

Key = tuple[str, str, str]  # (record_id, method, budget)
SETTINGS_FORMAT = "arr-coc-eval/1"


def strict_json(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None, so it dumps as strict JSON.

    >>> strict_json({"iou": float("nan"), "hits": [1.0, float("inf")]})
    {'iou': None, 'hits': [1.0, None]}
    """
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    return value


def row_key(row: dict) -> Key:
    return row["record_id"], row["method"], row["budget"]


class RowStore:
    """The rows of one evaluation folder, shared safely by every process that writes into it.

    Example:
        >>> import tempfile
        >>> store = RowStore(Path(tempfile.mkdtemp()))
        >>> store.append([{"record_id": "a", "method": "topk", "budget": "25%", "iou": float("nan")}])
        1
        >>> store.append([{"record_id": "a", "method": "topk", "budget": "25%", "iou": 0.5}])  # already there
        0
        >>> store.rows()
        [{'record_id': 'a', 'method': 'topk', 'budget': '25%', 'iou': None}]
    """

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.path = self.folder / "records.jsonl"
        self.settings_path = self.folder / "settings.json"

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Exclusive access to the folder across processes (released when the process dies, too)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / ".lock", "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def claim(self, settings: dict, per_method: dict[str, Any] | None = None, *, fresh: bool = False) -> str | None:
        """Make the folder hold rows of ``settings``; returns a note when old rows were dropped.

        ``per_method`` holds what only some methods' rows depend on (a trained allocator's weights): a
        method's entry must match the saved one when both runs have it; entries add up across runs.

        Raises:
            ValueError: the folder holds rows made with other settings and ``fresh`` is False.
        """
        settings = {**settings, "per_method": dict(per_method or {})}
        with self.locked():
            saved = self._saved_settings()
            rows_exist = self.path.exists() and self.path.stat().st_size > 0
            if saved is not None and _compatible(saved, settings):
                self._write_settings({**settings, "per_method": {**saved.get("per_method", {}),
                                                                  **settings["per_method"]}})
                return None
            if saved is None and not rows_exist:
                self._write_settings(settings)
                return None
            if saved is None:
                what = "rows without a record of their settings (made by an older arr-coc)"
            else:
                what = "rows made with other settings (" + describe_difference(saved, settings) + ")"
            if not fresh:
                raise ValueError(f"{self.folder} holds {what}; rerun with --fresh to replace them, "
                                 f"or pass another --out")
            self.path.unlink(missing_ok=True)
            for name in ("summary.csv", "summary.md", "summary.png"):
                (self.folder / name).unlink(missing_ok=True)
            self._write_settings(settings)
            return f"{self.folder}: replaced {what}"

    def done(self) -> set[Key]:
        """Keys already written (by this or any other process)."""
        with self.locked():
            return {row_key(r) for r in self._read()}

    def append(self, rows: Iterable[dict]) -> int:
        """Append the rows whose key is not yet in the file, atomically with respect to other writers."""
        rows = list(rows)
        if not rows:
            return 0
        with self.locked():
            done = {row_key(r) for r in self._read()}
            fresh = []
            for r in rows:
                if row_key(r) not in done:
                    done.add(row_key(r))
                    fresh.append(json.dumps(strict_json(r), allow_nan=False) + "\n")
            if fresh:
                atomic_append(self.path, "".join(fresh).encode("utf-8"))
            return len(fresh)

    def rows(self, keys: Iterable[Key] | None = None) -> list[dict]:
        """Rows, one per key (the first written wins), in file order; only ``keys`` when given."""
        with self.locked():
            rows = self._read()
        wanted = None if keys is None else set(keys)
        seen: set[Key] = set()
        out = []
        for r in rows:
            k = row_key(r)
            if k in seen or (wanted is not None and k not in wanted):
                continue
            seen.add(k)
            out.append(r)
        return out

    def _read(self) -> list[dict]:
        """Rows on disk; a last line cut by a killed writer is removed (call with the lock held)."""
        if not self.path.exists():
            return []
        text = self.path.read_text(encoding="utf-8")
        if text and not text.endswith("\n"):
            text = text[: text.rfind("\n") + 1]
            atomic_write(self.path, lambda f: f.write(text.encode("utf-8")))
        rows = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                row_key(row)
            except (json.JSONDecodeError, KeyError, TypeError) as err:
                raise ValueError(f"{self.path}:{n}: damaged row ({type(err).__name__}: {err}); delete that line "
                                 f"(it is redone) or rerun with --fresh") from None
            rows.append(row)
        return rows

    def _saved_settings(self) -> dict | None:
        if not self.settings_path.exists():
            return None
        try:
            saved = json.loads(self.settings_path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ValueError(f"{self.settings_path} is damaged ({err}); rerun with --fresh") from None
        return saved if isinstance(saved, dict) else {"format": repr(saved)}

    def _write_settings(self, settings: dict) -> None:
        text = json.dumps(settings, indent=1, sort_keys=True) + "\n"
        atomic_write(self.settings_path, lambda f: f.write(text.encode("utf-8")))


def _compatible(saved: dict, now: dict) -> bool:
    base = lambda d: {k: v for k, v in d.items() if k != "per_method"}  # noqa: E731
    old, new = saved.get("per_method", {}), now.get("per_method", {})
    return base(saved) == base(now) and all(old[m] == new[m] for m in set(old) & set(new))


def describe_difference(saved: dict, now: dict, limit: int = 3) -> str:
    """The settings that differ, ``name: saved -> now``, at most ``limit`` of them.

    >>> describe_difference({"scorer": "mvp", "seed": 0}, {"scorer": "contextual", "seed": 0})
    "scorer: 'mvp' -> 'contextual'"
    """
    def short(v: Any) -> str:
        text = repr(v)
        return text if len(text) <= 60 else text[:57] + "..."

    flat = lambda d: {**{k: v for k, v in d.items() if k != "per_method"},  # noqa: E731
                      **{f"{m} weights": v for m, v in d.get("per_method", {}).items()}}
    saved, now = flat(saved), flat(now)
    keys = sorted(k for k in set(saved) | set(now) if not k.endswith(" weights") or (k in saved and k in now))
    diff = [f"{k}: {short(saved.get(k))} -> {short(now.get(k))}" for k in keys if saved.get(k) != now.get(k)]
    more = f"; and {len(diff) - limit} more" if len(diff) > limit else ""
    return "; ".join(diff[:limit]) + more


def requested(records: Sequence[Any], methods: Sequence[str], tokens: Sequence[Any]) -> set[Key]:
    """The keys a run asks for: every record x method x token spec (the key's ``budget``; ``full`` once per record)."""
    keys = set()
    for r in records:
        if "full" in methods:
            keys.add((r.record_id, "full", "full"))
        keys |= {(r.record_id, m, str(b)) for b in tokens for m in methods if m != "full"}
    return keys
