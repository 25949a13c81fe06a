"""What every dataset loader shares: the dataset's folder and subfolders, JSON files, image sizes, ``others_px``."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from arr_coc.data.datasets import DatasetSpec, Record, default_root, records_by_image
from arr_coc.engine.imageio import image_size


def dataset_root(spec: DatasetSpec, root: Path | None) -> Path:
    """``root``, or the spec's default folder when None; raises when it does not exist."""
    root = default_root(spec.name) if root is None else Path(root)
    if not root.exists():
        raise FileNotFoundError(f"{spec.title} folder {root} not found; pass --data DIR or set ARR_COC_DATA")
    return root


def subfolder(title: str, root: Path, sub: str) -> Path:
    """``root / sub``, which must be a folder (its absence says ``root`` is not the dataset's folder)."""
    path = root / sub
    if not path.is_dir():
        raise FileNotFoundError(f"{title} folder {root} has no {sub}/ subfolder; is it the {title} folder?")
    return path


def read_json(path: Path) -> Any:
    """A JSON file's content; malformed JSON raises a one-line error naming the file."""
    try:
        return json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: malformed JSON ({e})") from None


def json_object(line: str, where: str) -> dict[str, Any]:
    """One JSON line that must be an object; malformed JSON or another type raises one line starting with ``where``."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: malformed JSON ({e})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    return obj


def image_wh(path: Path) -> tuple[int, int]:
    """(width, height) as displayed (EXIF orientation applied, as the pipeline sees it), from the header."""
    if not path.is_file():
        raise FileNotFoundError(f"image {path} not found")
    h, w = image_size(path)
    return w, h


def finish(title: str, root: Path, records: list[Record]) -> list[Record]:
    """Fill ``others_px`` with the answer boxes of the other records of the same image; none at all raises."""
    if not records:
        raise ValueError(f"no records found in {title} folder {root}")
    same = records_by_image(records)
    return [replace(r, others_px=tuple(b for o in same[r.image_id] if o is not r for b in o.boxes_px)) for r in records]
