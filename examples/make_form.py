"""Render the bundled form page, ``arr_coc/examples/form.jpg``: a filled-in request form with known field values.

The image ships in the wheel as package data; ``examples/form.jpg`` in the checkout links to it.

Deterministic; fonts come from matplotlib's bundled DejaVu. Run:
    python examples/make_form.py
"""
from __future__ import annotations

from pathlib import Path

import matplotlib
import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

FONT_DIR = Path(matplotlib.get_data_path()) / "fonts" / "ttf"
FIELDS = [  # (key, value): keys printed, values "typed" into the boxes
    ("Name of requester:", "Dr. Ada Moreno"), ("Department:", "Materials Science"),
    ("Date of request:", "14 March 2026"), ("Project code:", "MS-2231-B"),
    ("Telephone:", "+44 131 650 2231"), ("Amount requested:", "GBP 4,870.00"),
]
ITEMS = [("Furnace thermocouples (type K)", "6", "312.00"), ("Alumina crucibles 50 ml", "40", "1,160.00"),
         ("Argon cylinder rental (3 months)", "1", "898.00"), ("Diamond saw blade 150 mm", "2", "2,500.00")]


def render(path: Path) -> Path:
    """An 850 x 1100 px page (A4-like proportions at ~100 dpi), grey, slightly blurred like a scan."""
    width, height = 850, 1100
    sans = ImageFont.truetype(str(FONT_DIR / "DejaVuSans.ttf"), 17)
    bold = ImageFont.truetype(str(FONT_DIR / "DejaVuSans-Bold.ttf"), 17)
    title = ImageFont.truetype(str(FONT_DIR / "DejaVuSans-Bold.ttf"), 28)
    typed = ImageFont.truetype(str(FONT_DIR / "DejaVuSansMono.ttf"), 18)
    img = Image.new("L", (width, height), 248)
    d = ImageDraw.Draw(img)
    d.text((width / 2, 60), "REQUEST FOR PURCHASE", font=title, fill=20, anchor="mm")
    d.text((width / 2, 95), "School of Engineering - Stores and Procurement", font=sans, fill=60, anchor="mm")
    d.line((60, 120, width - 60, 120), fill=40, width=2)
    y = 150
    for key, value in FIELDS:
        d.text((70, y + 8), key, font=bold, fill=25)
        d.rectangle((290, y, width - 70, y + 36), outline=90, width=1)
        d.text((300, y + 8), value, font=typed, fill=35)
        y += 56
    y += 20
    d.text((70, y), "Items", font=bold, fill=25)
    y += 30
    cols = (70, 520, 610, width - 70)
    d.rectangle((cols[0], y, cols[3], y + 34), outline=60, width=1, fill=225)
    for x, head in zip(cols, ("Description", "Qty", "Price (GBP)")):
        d.text((x + 8, y + 8), head, font=bold, fill=25)
    for desc, qty, price in ITEMS:
        y += 34
        d.rectangle((cols[0], y, cols[3], y + 34), outline=60, width=1)
        for x, text in zip(cols, (desc, qty, price)):
            d.text((x + 8, y + 8), text, font=typed, fill=35)
    for x in cols[1:3]:
        d.line((x, y - 34 * len(ITEMS), x, y + 34), fill=60, width=1)
    y += 80
    d.text((70, y), "Approved by budget holder:", font=bold, fill=25)
    d.line((340, y + 22, 600, y + 22), fill=60, width=1)
    d.text((350, y - 4), "K. Lindqvist", font=ImageFont.truetype(str(FONT_DIR / "DejaVuSerif-Italic.ttf"), 24),
           fill=50)
    d.text((630, y), "Date: 16/03/2026", font=typed, fill=35)
    d.text((width / 2, height - 50), "Form SP-7 (rev. 2024)  -  return to stores@engineering", font=sans, fill=90,
           anchor="mm")
    rng = np.random.default_rng(0)  # scanner blur and grain, so the page is not unnaturally clean
    arr = np.asarray(img.filter(ImageFilter.GaussianBlur(0.5)), dtype=np.float32)
    Image.fromarray(np.clip(arr + rng.normal(0, 3, arr.shape), 0, 255).astype(np.uint8)).save(path, quality=88)
    return path


if __name__ == "__main__":
    print(render(Path(__file__).resolve().parents[1] / "arr_coc" / "examples" / "form.jpg"))  # package data
