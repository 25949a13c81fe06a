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


def shared_files(folder: str, pattern: str, name: str) -> list[Path]:
    """Files of the real evaluation data, or skip the test saying where they were looked for."""
    where = SHARED_DATA / folder
    if not where.is_dir():
        pytest.skip(f"{name} not found at {where} (set ARR_COC_DATA to the folder holding {folder.split('/')[0]}/)")
    return sorted(where.glob(pattern))


@pytest.fixture
def funsd_form() -> Path:
    return shared_files("funsd/training_data/images", "*.png", "FUNSD")[0]


@pytest.fixture
def coco_photo() -> Path:
    return shared_files("coco128/images/train2017", "*.jpg", "COCO128")[0]
