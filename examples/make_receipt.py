"""Render the bundled receipt, ``arr_coc/examples/receipt.jpg``: a shop receipt with a known total.

The image ships in the wheel as package data; ``examples/receipt.jpg`` in the checkout links to it.

Deterministic (fixed seed); fonts come from matplotlib's bundled DejaVu. Run:
    python examples/make_receipt.py
"""
from __future__ import annotations

from pathlib import Path

import matplotlib
import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

FONT_DIR = Path(matplotlib.get_data_path()) / "fonts" / "ttf"
ITEMS = [
    ("Sourdough loaf", 1, 4.20), ("Oat milk 1L", 2, 1.85), ("Free-range eggs x12", 1, 3.95),
    ("Cheddar 400g", 1, 5.10), ("Bananas (kg)", 1, 1.32), ("Coffee beans 250g", 1, 7.49),
    ("Tomatoes on vine", 1, 2.30), ("Dish soap", 1, 2.15), ("Basmati rice 1kg", 1, 2.89),
]


def render(path: Path, scale: float = 1.6) -> Path:
    """Render at ``scale`` x a 620 px wide layout (1.6: ~990x1480 px, the size of a phone scan)."""
    s = lambda v: int(round(v * scale))  # noqa: E731
    width = s(620)
    mono = ImageFont.truetype(str(FONT_DIR / "DejaVuSansMono.ttf"), s(19))
    bold = ImageFont.truetype(str(FONT_DIR / "DejaVuSansMono-Bold.ttf"), s(26))
    head = ImageFont.truetype(str(FONT_DIR / "DejaVuSans-Bold.ttf"), s(34))
    lines: list[tuple[str, ImageFont.FreeTypeFont, str]] = [
        ("CORNER GROCER", head, "center"), ("12 Harbour Street, Leith", mono, "center"),
        ("VAT No. GB 294 1177 06", mono, "center"), ("", mono, "left"),
        ("Date: 21/11/2026      Time: 14:37", mono, "left"), ("Receipt #: 0048-2231", mono, "left"),
        ("-" * 44, mono, "left"),
    ]
    total = 0.0
    for name, qty, price in ITEMS:
        total += qty * price
        lines.append((f"{name:<26}{qty:>3} {qty * price:>8.2f}", mono, "left"))
    vat = total - total / 1.2
    lines += [
        ("-" * 44, mono, "left"), (f"{'SUBTOTAL':<30}{total:>8.2f}", mono, "left"),
        (f"{'VAT 20% incl.':<30}{vat:>8.2f}", mono, "left"), ("", mono, "left"),
        (f"TOTAL      GBP {total:>9.2f}", bold, "left"), ("", mono, "left"),
        (f"{'CARD  **** 4417':<30}{total:>8.2f}", mono, "left"), ("", mono, "left"),
        ("Thank you for shopping with us!", mono, "center"), ("Returns within 28 days", mono, "center"),
    ]
    height = s(60) + sum(s(44) if f is not mono else s(30) for _, f, _ in lines) + s(60)
    img = Image.new("L", (width, height), 250)
    draw = ImageDraw.Draw(img)
    y = s(50)
    for text, font, align in lines:
        w = draw.textlength(text, font=font)
        x = (width - w) / 2 if align == "center" else s(40)
        draw.text((x, y), text, fill=25, font=font)
        y += s(44) if font is not mono else s(30)
    # Thermal paper: slight blur and grain, so the image is not unnaturally clean.
    rng = np.random.default_rng(0)
    arr = np.asarray(img.filter(ImageFilter.GaussianBlur(0.6 * scale)), dtype=np.float32)
    arr = np.clip(arr + rng.normal(0, 4, arr.shape), 0, 255).astype(np.uint8)
    Image.fromarray(arr).save(path, quality=88)
    return path


if __name__ == "__main__":
    print(render(Path(__file__).resolve().parents[1] / "arr_coc" / "examples" / "receipt.jpg"))  # package data
