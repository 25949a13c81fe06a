"""Shared fixtures: the bundled example and the real evaluation data beside the repository."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "receipt.jpg"
SHARED_DATA = Path(os.environ.get("ARR_COC_DATA", ROOT.parent / "shared" / "data"))


@pytest.fixture
def receipt() -> Path:
    return EXAMPLE


@pytest.fixture
def funsd_form() -> Path:
    images = SHARED_DATA / "funsd" / "training_data" / "images"
    if not images.is_dir():
        pytest.skip(f"FUNSD not found at {images} (set ARR_COC_DATA to the folder holding funsd/)")
    return sorted(images.glob("*.png"))[0]


@pytest.fixture
def coco_photo() -> Path:
    images = SHARED_DATA / "coco128" / "images" / "train2017"
    if not images.is_dir():
        pytest.skip(f"COCO128 not found at {images} (set ARR_COC_DATA to the folder holding coco128/)")
    return sorted(images.glob("*.jpg"))[0]
