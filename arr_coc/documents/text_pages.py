"""Plain text rendered to pages in a stated font, size and page size, with every word's box exact.

A long text handed to a VLM as images (as Glyph and DeepSeek-OCR do) needs a rendering whose
settings are recorded and whose word boxes are known, so a question can be matched to its words
without OCR. Words are laid out greedily (word wrap at whitespace; a word wider than the text
column is broken at characters), each drawn by Pillow at an integer pen position on its baseline.

A word's box is the union of its advance (pen to pen + advance) and its ink, from the baseline
minus the font's ascent to the baseline plus its descent (wider where a glyph reaches further):
every pixel the word darkens lies inside its box, and no other word's box overlaps it, so the page
cropped to a box equals the word drawn alone at that box.

Shapes: ``Page.image`` [3, H, W] float32 in [0, 1]; boxes (y0, x0, y1, x1) px.
"""
from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Union

import numpy as np
import PIL
import torch
from matplotlib import font_manager
from PIL import Image, ImageDraw, ImageFont

from arr_coc.documents.page import Box, Context, Page, Word, lines_from_breaks


@dataclass(frozen=True)
class TextLayout:
    """How a text is set on pages; recorded in the output so a result says what was rendered.

    The defaults give a page of 32 x 40 cells of 28 px (Qwen-VL's token cell) with ~16 px body
    text: about the x-height of 10 pt print at 150 dpi, legible to OCR and to the VLM.
    """

    font: str = "DejaVu Sans"  # a family matplotlib ships, so every install renders the same glyphs
    size: int = 16  # font size in px (the em square)
    width: int = 896  # page width in px
    height: int = 1120  # page height in px
    margin: int = 48  # blank border on every side, px
    line_spacing: float = 1.2  # baseline-to-baseline distance as a multiple of ascent + descent

    def __post_init__(self) -> None:
        if self.size < 4:
            raise ValueError(f"font size must be at least 4 px, got {self.size}")
        if self.margin < 0 or self.width - 2 * self.margin < 4 * self.size or self.height - 2 * self.margin < 2 * self.size:
            raise ValueError(
                f"a {self.width} x {self.height} px page with {self.margin} px margins leaves no room for "
                f"{self.size} px text; enlarge the page or shrink the margin or font"
            )
        if self.line_spacing < 1.0:
            raise ValueError(f"line_spacing must be >= 1 so lines do not overlap, got {self.line_spacing}")


@lru_cache(maxsize=8)
def _font(family: str, size: int) -> tuple[ImageFont.FreeTypeFont, str]:
    """The Pillow font for a family matplotlib can find (no fallback to another family), and its file."""
    try:
        path = font_manager.findfont(font_manager.FontProperties(family=family), fallback_to_default=False)
    except ValueError:
        raise ValueError(f"font family {family!r} is not installed; use one matplotlib ships, e.g. 'DejaVu Sans'") from None
    return ImageFont.truetype(path, size), path


@lru_cache(maxsize=1 << 16)  # words repeat: a text's vocabulary is far smaller than its length
def _extent(font: ImageFont.FreeTypeFont, word: str) -> tuple[int, int, int, int]:
    """(up, left, down, right) of a word drawn with its pen at 0 on the baseline, integer px, ink and advance."""
    ascent, descent = font.getmetrics()
    left, top, right, bottom = font.getbbox(word, anchor="ls")
    advance = math.ceil(font.getlength(word))
    return min(-ascent, top), min(0, left), max(descent, bottom), max(advance, right)


def _width(font: ImageFont.FreeTypeFont, word: str) -> int:
    """The width of a word's box, px."""
    _, left, _, right = _extent(font, word)
    return right - left


def _pieces(font: ImageFont.FreeTypeFont, word: str, room: int) -> list[str]:
    """The word itself, or, when wider than the column, its longest leading runs of characters that fit."""
    out: list[str] = []
    if _width(font, word) <= room:
        return [word]
    while word:
        lo, hi = 1, len(word)  # the longest prefix that fits, by bisection (a prefix only widens as it grows)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if _width(font, word[:mid]) <= room else (lo, mid - 1)
        n = lo
        out.append(word[:n])
        word = word[n:]
    return out


def render_text(text: str, layout: TextLayout = TextLayout(), source: str = "<text>") -> Context:
    """Sets ``text`` on pages: one line per input line, wrapped at whitespace, blank lines and indents kept.

    Args:
        text: the text; tabs count as spaces.
        layout: font, size, page size, margins, line spacing.
        source: the name recorded as the pages' source.

    Returns:
        A Context whose meta records the layout, the font file and the renderer.

    >>> ctx = render_text("Hello world")
    >>> [w.text for w in ctx.pages[0].words], ctx.pages[0].size
    (['Hello', 'world'], (1120, 896))
    """
    font, font_path = _font(layout.font, layout.size)
    ascent, descent = font.getmetrics()
    pitch = math.ceil((ascent + descent) * layout.line_spacing)
    space = math.ceil(font.getlength(" "))
    left_edge, right_edge = layout.margin, layout.width - layout.margin
    bottom_edge = layout.height - layout.margin

    pages: list[list[tuple[str, int, int]]] = [[]]  # per page: (word, pen x, baseline y)
    breaks: list[list[int]] = [[]]  # per page: index of each line's first word
    baseline = layout.margin + ascent

    def new_line() -> None:
        nonlocal baseline
        baseline += pitch
        if baseline + descent > bottom_edge:
            pages.append([])
            breaks.append([])
            baseline = layout.margin + ascent

    first = True
    for raw in text.replace("\t", " ").splitlines():
        if not first:
            new_line()
        first = False
        pen = None  # None: nothing on this line yet
        # Leading spaces indent the line's first row (code and lists keep their shape), at most half the column.
        indent = min((len(raw) - len(raw.lstrip(" "))) * space, (right_edge - left_edge) // 2)
        for token in raw.split():
            for word in _pieces(font, token, right_edge - left_edge):
                up, lft, down, rgt = _extent(font, word)
                if pen is not None and pen + rgt > right_edge:
                    new_line()
                    pen = None
                if pen is None:
                    if left_edge + indent + rgt - lft > right_edge:
                        indent = 0
                    pen = left_edge + indent - lft  # ink reaching left of the pen still starts in the column
                    indent = 0
                    breaks[-1].append(len(pages[-1]))
                pages[-1].append((word, pen, baseline))
                pen += rgt + space
    out = []
    for i, (placed, brk) in enumerate(zip(pages, breaks)):
        img = Image.new("L", (layout.width, layout.height), 255)
        draw = ImageDraw.Draw(img)
        words = []
        for word, x, y in placed:
            draw.text((x, y), word, font=font, fill=0, anchor="ls")
            up, lft, down, rgt = _extent(font, word)
            box: Box = (float(y + up), float(x + lft), float(y + down), float(x + rgt))
            words.append(Word(word, box))
        arr = np.asarray(img.convert("RGB"), dtype=np.float32) / 255.0
        image = torch.from_numpy(arr).permute(2, 0, 1).contiguous()
        lines = lines_from_breaks(words, brk, [float(layout.size)] * len(brk))
        out.append(Page(image, words, lines, i, source, None, (layout.height, layout.width)))
    meta = {"kind": "text", "source": source, "n_pages": len(out), **asdict(layout),
            "font_file": Path(font_path).name, "renderer": f"Pillow {PIL.__version__}"}
    return Context(out, source, meta)


def render_text_file(path: Union[str, os.PathLike], layout: TextLayout = TextLayout()) -> Context:
    """Reads a UTF-8 text file and renders it with :func:`render_text`."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"no such text file: {p}")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{p} is not UTF-8 text ({e.reason} at byte {e.start}); convert it to UTF-8 first") from None
    return render_text(text, layout, str(p))
