"""Write the bundled photo, ``arr_coc/examples/photo.jpg``: scikit-image's "Chelsea the cat", enlarged 2x.

The image ships in the wheel as package data; ``examples/photo.jpg`` in the checkout links to it.

The photograph is CC0 (no copyright restrictions; by Stefan van der Walt), shipped inside scikit-image
as ``skimage.data.chelsea()``. Enlarged to 902 x 600 px so the default 273-saccade budget fits the
canvas (21 x 32 cells of 28 px). Run:
    python examples/make_photo.py
"""
from __future__ import annotations

from pathlib import Path

from PIL import Image
from skimage.data import chelsea


def render(path: Path) -> Path:
    img = Image.fromarray(chelsea())
    img.resize((img.width * 2, img.height * 2), Image.Resampling.BICUBIC).save(path, quality=88)
    return path


if __name__ == "__main__":
    print(render(Path(__file__).resolve().parents[1] / "arr_coc" / "examples" / "photo.jpg"))  # package data
