"""The leakage check: shipped or saved weights are never scored on images they learned from or were chosen on.

Two checks, both before any work. By name: the shipped weights' registry entry lists the datasets
they trained on, and only ``--split test`` of those is held out. By content: weights made by
`arr-coc train` carry a hash of every image of their train and val splits (``trained_images``), and
an evaluation holding any of those images is refused whatever loaded it (a dataset, a JSONL of the
same files) and however the weights were named (a registry name, ``auto``, or the file's path).

The content hash (:func:`pixel_digest`) is the SHA-256 of the decoded pixels (RGB, EXIF orientation
applied) and their size, not of the file's bytes: it catches a copy, a renamed file, a file with
its metadata stripped or changed, and a lossless re-encoding (PNG <-> TIFF / BMP / lossless WebP, a
rotation baked into the pixels); it does not catch a lossy re-encoding (JPEG re-compressed), a
resize or a crop, whose pixels differ.
"""
from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from PIL import Image, ImageOps

from arr_coc.weights.catalog import entries, entry_of, resolve
from arr_coc.weights.files import LEARNED_FORMAT, LEARNED_KINDS, SCORER_FORMAT
from arr_coc.weights.folders import read_weights

SCORER_FREE = ("full", "native_budget", "uniform_image")  # methods the relevance scorer plays no part in


def trained_on(path: str | Path) -> tuple[str, ...]:
    """The datasets a weights file from ``arr-coc train`` learned from (its saved training settings)."""
    saved = read_weights(path, (SCORER_FORMAT, LEARNED_FORMAT), "weights made by `arr-coc train`")
    return tuple(saved.get("train_config", {}).get("datasets", ()))


def pixel_digest(image: str | Path) -> str:
    """The content hash of an image file: SHA-256 of its decoded RGB pixels and size, hex (see the module doc).

    Example:
        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp())
        >>> Image.new("RGB", (4, 3), "red").save(folder / "a.png")
        >>> Image.new("RGB", (4, 3), "red").save(folder / "b.bmp")  # the same pixels, another format
        >>> pixel_digest(folder / "a.png") == pixel_digest(folder / "b.bmp")
        True
    """
    path = Path(image)
    stat = path.stat()
    return _digest(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


@lru_cache(maxsize=4096)
def _digest(path: str, size: int, mtime_ns: int) -> str:  # size and mtime: a rewritten file is hashed again
    with Image.open(path) as im:
        rgb = ImageOps.exif_transpose(im).convert("RGB")
    h = hashlib.sha256(f"rgb {rgb.width}x{rgb.height}\n".encode())
    h.update(rgb.tobytes())
    return h.hexdigest()


def image_digests(images: Iterable[tuple[str | Path, str]]) -> dict[str, str]:
    """``{pixel_digest: label}`` of (image file, label) pairs, as training records what it saw; missing files skipped."""
    out: dict[str, str] = {}
    for image, label in images:
        if str(image) and Path(image).is_file():
            out.setdefault(pixel_digest(image), label)
    return out


@lru_cache(maxsize=64)
def _trained_images(path: str, mtime_ns: int) -> dict[str, str]:
    saved = read_weights(path, (SCORER_FORMAT, LEARNED_FORMAT), "weights made by `arr-coc train`")
    return dict(saved.get("trained_images") or {})


def trained_images(path: str | Path) -> dict[str, str]:
    """``{pixel_digest: label}`` of the images a weights file learned from or was chosen on; {} when it predates them."""
    path = Path(path)
    return _trained_images(str(path.resolve()), path.stat().st_mtime_ns)


def weights_in_play(arr: Any, methods: Sequence[str], learned: Mapping[str, Any] | None = None) -> list[Path]:
    """The trained weights files an evaluation of ``methods`` would use: the ARR's scorer, the selector, the pruner."""
    files = []
    if any(m not in SCORER_FREE for m in methods):
        entry = entry_of(arr.weights_source)
        source = entry.path if entry is not None else Path(arr.weights_source)
        if arr.weights_source != "hand-set" and source.exists():
            files.append(source)
    for m in LEARNED_KINDS:
        if m in methods:
            path, _ = resolve(str((learned or {}).get(m, "auto")), m)
            if path.exists():
                files.append(path)
    return files


def refuse_seen_images(images: Iterable[str | Path], weights: Sequence[Path]) -> None:
    """Raise a one-line ``ValueError`` naming the first image any of ``weights`` learned from or was chosen on."""
    known = [(w, trained_images(w)) for w in weights]
    known = [(w, seen) for w, seen in known if seen]
    if not known:
        return
    for image in images:
        digest = pixel_digest(image)
        for w, seen in known:
            if digest in seen:
                raise ValueError(f"{image} has the pixels of {seen[digest]}, which the weights {w} learned from or "
                                 f"were chosen on; evaluate on images they never saw (--split test) or pass other "
                                 f"weights (--scorer-weights none)")


def refuse_leakage(dataset: str, split: str | None, arr: Any, methods: Sequence[str],
                   learned: dict | None = None, images: Iterable[str | Path] = ()) -> None:
    """Refuse to score trained weights on images they may have learned from, by dataset name and by content.

    The shipped scorers, selector and pruner were trained on the train split of their datasets (and
    chosen on val): on those datasets only ``split="test"`` is held out. Whatever the dataset, split
    or weights path, an image among ``images`` whose pixels a weights file in play recorded as trained
    on (:func:`refuse_seen_images`) is refused. Raises ``ValueError`` saying so.
    """
    if split != "test":
        _refuse_by_name(dataset, split, arr, methods, learned)
    refuse_seen_images(images, weights_in_play(arr, methods, learned))


def _refuse_by_name(dataset: str, split: str | None, arr: Any, methods: Sequence[str], learned: dict | None) -> None:
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
