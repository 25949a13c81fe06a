"""Training features: what the scorer sees for each record, computed once per image and cached on disk.

Shapes: ``C`` channels of the ARR's texture (question channels included, in its channel order),
``Hc, Wc`` the record's image in token cells, ``Dq`` query width, ``G`` gestalt-vector width.

The texture (OCR, saliency networks, filters) is the slow part of the pipeline and does not
depend on the scorer's weights, so training reads it from this cache and costs milliseconds per
step. A cache folder belongs to one channel set and cell size; another set is refused, not mixed.
"""
from __future__ import annotations

import hashlib
import json
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import Tensor
from tqdm import tqdm

from arr_coc.data.boxes import box_mask, scale_boxes
from arr_coc.data.datasets import Record
from arr_coc.engine.imageops import to_uint8
from arr_coc.weights import atomic_save, encoder_name, load_file

FEATURES_FORMAT = "arr-coc-features/1"


@dataclass
class Example:
    """One record's scorer inputs and its answer target."""

    cells: Tensor  # [C, Hc, Wc] float16 cell texture
    query: Tensor  # [Dq] question embedding
    gestalt: Tensor  # [G] gestalt vector of the image
    target: Tensor  # [Hc, Wc] float32, share of each cell covered by the answer boxes
    record_id: str
    image_id: str
    dataset: str
    image: str = ""  # the image file, for objectives that look at pixels (answer cross-entropy)
    question: str = ""
    answer: str = ""
    pixels: Tensor | None = None  # [3, Hc * cell, Wc * cell] uint8 canvas, for allocators that look at pixels
    group: str = ""  # the record's split group (Record.group); "" = its image

    @property
    def split_group(self) -> str:
        """What :func:`arr_coc.data.datasets.split_of` hashes, as for the record."""
        return self.group or self.image_id

    @property
    def grid(self) -> tuple[int, int]:
        return tuple(self.target.shape)  # type: ignore[return-value]


def cell_target(boxes_px: Sequence[tuple[float, float, float, float]], grid: tuple[int, int], cell: int) -> Tensor:
    """Exact share of each cell's area covered by the union of canvas-pixel boxes: [Hc, Wc] float32.

    >>> cell_target([(0, 0, 2, 3)], (2, 2), 2).tolist()
    [[1.0, 0.5], [0.0, 0.0]]
    """
    hc, wc = grid
    mask = box_mask(boxes_px, hc * cell, wc * cell)  # [H, W] float64
    return mask.view(hc, cell, wc, cell).mean((1, 3)).float()


def cache_key(arr) -> str:
    """What makes cached features valid: the channel set, their options, the cell and the canvas limits."""
    c = arr.config
    spec = {"channels": list(arr.channels), "options": c.texture.options, "canvas": vars(c.canvas),
            "query_encoder": encoder_name(arr.query_encoder)}
    return hashlib.blake2b(json.dumps(spec, sort_keys=True, default=str).encode(), digest_size=8).hexdigest()


@torch.no_grad()
def image_features(arr, records: Sequence[Record]) -> dict:
    """Features of one image's records: shared image channels once, question channels per record."""
    scene = arr.see(records[0].image)
    canvas, (hc, wc) = scene.canvas, scene.extents[0]
    vector = arr.gestalt(scene, 1).vector[0]
    out = {"format": FEATURES_FORMAT, "image_cells": scene.cell_texture[0, :, :hc, :wc].half(), "gestalt": vector.float(),
           "records": {}}
    for r in records:
        if r.image_id != records[0].image_id:
            raise ValueError(f"records of one image expected, got {r.image_id} and {records[0].image_id}")
        query = arr.query_encoder.encode([r.question])[0]
        full = arr.cell_stack(scene, [r.question])[0]
        target = cell_target(scale_boxes(r.boxes_px, canvas.scales[0]), (hc, wc), canvas.cell)
        out["records"][r.record_id] = {"cells": full[:, :hc, :wc].half(), "query": query.float(),
                                       "target": target}
    return out


def build_examples(arr, records: Sequence[Record], cache_dir: str | Path, *, progress: bool = True) -> list[Example]:
    """Examples for ``records``, computing and caching (one file per image) what is missing.

    Interrupted runs lose at most the image in progress; a rerun computes only what is missing.
    """
    folder = Path(cache_dir) / cache_key(arr)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "channels.json").write_text(json.dumps({"channels": list(arr.channels)}))
    by_image: dict[tuple[str, str], list[Record]] = defaultdict(list)
    for r in records:
        by_image[(r.dataset, r.image_id)].append(r)
    examples = []
    for (dataset, image_id), recs in tqdm(by_image.items(), desc="features", disable=not progress):
        path = folder / cache_file(dataset, image_id)
        data = _load(path)
        if data is None or not all(r.record_id in data["records"] for r in recs):
            data = image_features(arr, recs)
            atomic_save(data, path)
        for r in recs:
            d = data["records"][r.record_id]
            examples.append(Example(d["cells"], d["query"], data["gestalt"], d["target"], r.record_id,
                                    r.image_id, r.dataset, str(r.image), r.question, r.answer, group=r.group))
    return examples


def example_pixels(example: Example, canvas_config: Any) -> Tensor:
    """The example's image on its canvas, unpadded: [3, Hc * cell, Wc * cell] float in [0, 1].

    The canvas must have the grid the features were computed on; a different one means the cache is
    stale and is a clear error.
    """
    from arr_coc.engine.canvas import make_canvas

    c = canvas_config
    canvas = make_canvas(example.image, cell=c.cell, min_pixels=c.min_pixels, max_pixels=c.max_pixels)
    h, w = canvas.sizes[0]
    if (h // c.cell, w // c.cell) != example.grid:
        raise ValueError(f"{example.image} makes a {h // c.cell}x{w // c.cell} canvas, its features {example.grid}: "
                         f"rebuild the feature cache")
    return canvas.pixels[0, :, :h, :w]


def attach_pixels(examples: Sequence[Example], canvas_config: Any, *, progress: bool = True) -> None:
    """Give every example its image's canvas pixels (uint8, one tensor shared per image), in place.

    For learners that read pixels (the patch selector); see `example_pixels`.
    """
    shared: dict[str, Tensor] = {}
    for e in tqdm(examples, desc="pixels", disable=not progress):
        if e.image not in shared:
            shared[e.image] = to_uint8(example_pixels(e, canvas_config))
        e.pixels = shared[e.image]


def cache_file(dataset: str, image_id: str) -> str:
    """The cache file of one image: ``<dataset>-<image_id>.pt``, or a hashed name when the id is not a plain
    file name (a JSONL image id defaults to the image's path, slashes and all).

    >>> cache_file("funsd", "0000971160"), cache_file("jsonl", "/data/scans/a.png")
    ('funsd-0000971160.pt', 'jsonl-a.png-0e5b2f8fd49c0905.pt')
    """
    name = f"{dataset}-{image_id}"
    if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,150}", name):
        return name + ".pt"
    digest = hashlib.blake2b(f"{dataset}/{image_id}".encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()
    tail = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(image_id).name)[-60:]
    return f"{dataset}-{tail}-{digest}.pt"


def _load(path: Path) -> dict | None:
    """A cached image's features; None when absent or not a features file (recomputed and overwritten).

    Read with ``weights_only=True``: a cache file can hold tensors and plain values, never code.
    """
    if not path.exists():
        return None
    try:
        return load_file(path, FEATURES_FORMAT, "cached training features")
    except ValueError:  # damaged by a crash outside our atomic writes, foreign, or an older layout: recompute
        return None


def collate(examples: Sequence[Example]) -> dict[str, Tensor]:
    """Pad a list of examples to one batch: cells [B, C, H, W], valid [B, H, W], target, query, gestalt
    (and pixels [B, 3, H * cell, W * cell] when every example carries them)."""
    h = max(e.grid[0] for e in examples)
    w = max(e.grid[1] for e in examples)
    b, c = len(examples), examples[0].cells.shape[0]
    cells = torch.zeros(b, c, h, w)
    valid = torch.zeros(b, h, w, dtype=torch.bool)
    target = torch.zeros(b, h, w)
    for i, e in enumerate(examples):
        eh, ew = e.grid
        cells[i, :, :eh, :ew], valid[i, :eh, :ew], target[i, :eh, :ew] = e.cells.float(), True, e.target
    out = {"cells": cells, "valid": valid, "target": target, "query": torch.stack([e.query for e in examples]),
           "gestalt": torch.stack([e.gestalt for e in examples])}
    if all(e.pixels is not None for e in examples):  # [B, 3, H * cell, W * cell] float in [0, 1]
        cell = examples[0].pixels.shape[1] // examples[0].grid[0]
        out["pixels"] = torch.zeros(b, 3, h * cell, w * cell)
        for i, e in enumerate(examples):
            out["pixels"][i, :, :e.pixels.shape[1], :e.pixels.shape[2]] = e.pixels.float() / 255
    return out
