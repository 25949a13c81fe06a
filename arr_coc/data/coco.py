"""COCO128 in YOLO format: one record per (image, category present), "Where is the <category>?" -> its boxes."""
from __future__ import annotations

import math
import re
from collections import defaultdict
from pathlib import Path

from arr_coc.data.boxes import Box, clip_boxes
from arr_coc.data.datasets import DatasetSpec, Record, register
from arr_coc.data.loading import dataset_root, finish, image_wh, subfolder


def read_class_names(path: Path) -> dict[int, str]:
    """Class names of a YOLO ``classes.yaml`` (``names:`` then ``id: name`` or ``- name`` lines), without PyYAML.

    Example:
        >>> import tempfile; p = Path(tempfile.mkdtemp()) / "c.yaml"
        >>> _ = p.write_text("path: .\\nnames:\\n  0: person\\n  9: traffic light\\n")
        >>> read_class_names(p)
        {0: 'person', 9: 'traffic light'}
    """
    names: dict[int, str] = {}
    inside = False
    for line in path.read_text(encoding="utf-8").splitlines():
        text = line.split("#", 1)[0].rstrip()
        if not text.strip():
            continue
        if not line[0].isspace():
            inside = text.strip() == "names:"
            continue
        item = re.fullmatch(r"\s*(?:(\d+)\s*:|-)\s*(.+)", text)
        if inside and item:
            names[int(item[1]) if item[1] else len(names)] = item[2].strip().strip("'\"")
    if not names:
        raise ValueError(f"{path}: no class names found (expected 'names:' followed by '  0: person' lines)")
    return names


def load_coco(root: Path | None = None) -> list[Record]:
    """COCO in YOLO format: one record per (image, category present): "Where is the <category>?" -> boxes.

    ``root`` holds ``images/train2017``, ``labels/train2017`` and ``classes.yaml``. Label files
    without an image are skipped; images without a label file have no objects, hence no records.
    Boxes are clipped to their image; a box holding NaN or Infinity, of zero or negative size, or
    lying wholly outside its image raises, naming the label file and line (as JSONL refuses them).
    """
    root = dataset_root(COCO, root)
    img_dir, lbl_dir = (subfolder(COCO.title, root, f"{d}/train2017") for d in ("images", "labels"))
    if not (root / "classes.yaml").is_file():
        raise FileNotFoundError(f"{COCO.title} folder {root} has no classes.yaml (the class id -> name map)")
    names = read_class_names(root / "classes.yaml")
    records = []
    for lbl in sorted(lbl_dir.glob("*.txt")):
        image = next((p for e in (".jpg", ".png", ".jpeg") if (p := img_dir / f"{lbl.stem}{e}").is_file()), None)
        if image is None:
            continue
        w, h = image_wh(image)
        boxes: dict[int, list[Box]] = defaultdict(list)
        for n, line in enumerate(lbl.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                cls, cx, cy, bw, bh = int(line.split()[0]), *(float(v) for v in line.split()[1:])
            except ValueError:
                raise ValueError(f"{lbl}:{n}: expected 'class cx cy w h' (normalised), got {line[:60]!r}") from None
            if cls not in names:
                raise ValueError(f"{lbl}:{n}: class {cls} is not in classes.yaml ({len(names)} names)")
            if not all(math.isfinite(v) for v in (cx, cy, bw, bh)):
                raise ValueError(f"{lbl}:{n}: the box holds NaN or Infinity; boxes are finite (cx cy w h, normalised)")
            if bw <= 0 or bh <= 0:
                raise ValueError(f"{lbl}:{n}: the box needs w > 0 and h > 0 (cx cy w h, normalised)")
            # rounded to 1/100 px: sub-pixel noise of the normalised format, not information
            corners = ((cy - bh / 2) * h, (cx - bw / 2) * w, (cy + bh / 2) * h, (cx + bw / 2) * w)
            box = tuple(round(v, 2) for v in corners)
            if not clip_boxes([box], (w, h)):  # type: ignore[list-item]
                raise ValueError(f"{lbl}:{n}: the box lies outside the {w}x{h} image {image.name}")
            boxes[cls].append(box)  # type: ignore[arg-type]
        for cls in sorted(boxes):
            kept = clip_boxes(boxes[cls], (w, h))
            if kept:
                question = f"Where is the {names[cls]}?"
                records.append(Record(COCO.name, f"{lbl.stem}#{names[cls]}", image, lbl.stem, question, "", kept,
                                      metric=COCO.metric, kind=names[cls]))
    return finish(COCO.title, root, records)


# the answers are boxes, not text: evaluated by coverage alone, no reader
COCO = register(DatasetSpec("coco", "COCO128", load_coco, reader=None, folder="coco128"))
