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
from arr_coc.documents.pdf import MAX_PAGE_PIXELS

# A text file is read whole before it is laid out: 4 MB is ~1000 default pages, far past any context.
MAX_TEXT_BYTES = 4 * 2**20


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
        if self.width * self.height > MAX_PAGE_PIXELS:
            raise ValueError(f"a {self.width} x {self.height} px text page is more than {MAX_PAGE_PIXELS // 1_000_000} "
                             f"million pixels; choose a smaller --page-width / --page-height")
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


# A word this long is measured whole only when short: a longer one is broken by galloping from its start,
# so breaking costs about (its length x log of the column's characters), not its length squared.
_WHOLE = 1024


def _pieces(font: ImageFont.FreeTypeFont, word: str, room: int) -> list[str]:
    """The word itself, or, when wider than the column, its longest leading runs of characters that fit.

    Each run is found by doubling a length that fits until one does not, then bisecting between the two
    (a prefix only widens as it grows), so a run of n characters costs O(n log n) and a word O(len log room).
    """
    if len(word) <= _WHOLE and _width(font, word) <= room:
        return [word]
    out: list[str] = []
    start, n = 0, len(word)
    while start < n:
        lo, hi = 1, None  # lo characters fit (one is taken even when wider than the column)
        while start + lo < n:
            probe = min(2 * lo, n - start)
            if _width(font, word[start:start + probe]) <= room:
                lo = probe
            else:
                hi = probe - 1
                break
        hi = lo if hi is None else hi
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if _width(font, word[start:start + mid]) <= room else (lo, mid - 1)
        out.append(word[start:start + lo])
        start += lo
    return out


def missing_glyphs(text: str, font_path: str) -> list[str]:
    """The distinct printable characters of ``text`` the font file has no glyph for, in order of appearance."""
    from matplotlib.ft2font import FT2Font

    have = set(FT2Font(font_path).get_charmap())
    missing = {ch for ch in set(text) if not ch.isspace() and ch.isprintable() and ord(ch) not in have}
    if not missing:
        return []
    order: dict[str, None] = {}
    for ch in text:  # one pass; stops once every missing character has been met
        if ch in missing and ch not in order:
            order[ch] = None
            if len(order) == len(missing):
                break
    return list(order)


def undrawable(text: str, layout: TextLayout = TextLayout()) -> list[str]:
    """The characters of ``text`` the layout's font cannot draw (:func:`missing_glyphs`): what :func:`layout_text`
    would refuse, asked before setting anything.

    >>> undrawable("naïve ก"), undrawable("naïve")
    (['ก'], [])
    """
    return missing_glyphs(text, _font(layout.font, layout.size)[1])


def _check_drawable(text: str, layout: TextLayout, font_path: str, source: str) -> None:
    missing = missing_glyphs(text, font_path)
    if missing:
        shown = ", ".join(f"{c!r} U+{ord(c):04X}" for c in missing[:5])
        raise ValueError(f"{source} has {len(missing)} distinct characters the font {layout.font!r} cannot draw "
                         f"({shown}{', ...' if len(missing) > 5 else ''}): they would be drawn as empty boxes; set "
                         f"the text in a font that has them with --font / TextLayout(font=) (e.g. 'Noto Sans CJK JP' "
                         f"from the Debian package fonts-noto-cjk for Chinese and Japanese), or remove them")


@dataclass
class TextSetting:
    """A text laid out on pages (every word's pen position), drawn a page at a time by :meth:`page`.

    Attributes:
        layout: the layout it was set in.
        source: the name recorded as the pages' source.
        placed: per page, (word, pen x, baseline y) of every word.
        breaks: per page, the index of each line's first word.
        font_path: the font file.
    """

    layout: TextLayout
    source: str
    placed: list[list[tuple[str, int, int]]]
    breaks: list[list[int]]
    font_path: str

    def __len__(self) -> int:
        return len(self.placed)

    @property
    def size(self) -> tuple[int, int]:
        """(H, W) of every page, px."""
        return self.layout.height, self.layout.width

    @property
    def meta(self) -> dict:
        return {"kind": "text", "source": self.source, "n_pages": len(self), **asdict(self.layout),
                "font_file": Path(self.font_path).name, "renderer": f"Pillow {PIL.__version__}"}

    def page(self, i: int) -> Page:
        """Page ``i`` drawn: [3, H, W] float32 pixels, its words and lines."""
        layout = self.layout
        font, _ = _font(layout.font, layout.size)
        img = Image.new("L", (layout.width, layout.height), 255)
        draw = ImageDraw.Draw(img)
        words = []
        for word, x, y in self.placed[i]:
            draw.text((x, y), word, font=font, fill=0, anchor="ls")
            up, lft, down, rgt = _extent(font, word)
            box: Box = (float(y + up), float(x + lft), float(y + down), float(x + rgt))
            words.append(Word(word, box))
        arr = np.asarray(img.convert("RGB"), dtype=np.float32) / 255.0
        image = torch.from_numpy(arr).permute(2, 0, 1).contiguous()
        lines = lines_from_breaks(words, self.breaks[i], [float(layout.size)] * len(self.breaks[i]))
        return Page(image, words, lines, i, self.source, None, (layout.height, layout.width))


def layout_text(text: str, layout: TextLayout = TextLayout(), source: str = "<text>",
                max_pages: int | None = None) -> TextSetting:
    """Lays ``text`` out on pages without drawing them: one line per input line, wrapped at whitespace.

    Linear in the text (a word wider than the column is broken in O(len log column)); past ``max_pages``
    pages the layout stops and the text is refused in one line, so a long text costs no more than the pages
    it may fill. Characters the font cannot draw are refused (:func:`missing_glyphs`), naming them.
    """
    font, font_path = _font(layout.font, layout.size)
    _check_drawable(text, layout, font_path, source)
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
            if max_pages is not None and len(pages) >= max_pages:
                raise ValueError(f"{source} needs more than {max_pages} pages at {layout.size} px on {layout.width}x"
                                 f"{layout.height} px pages (counted while laying it out, before drawing); a context "
                                 f"holds at most {max_pages}: shorten the text, or raise --max-pages / max_pages=")
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
    return TextSetting(layout, source, pages, breaks, font_path)


def render_text(text: str, layout: TextLayout = TextLayout(), source: str = "<text>",
                max_pages: int | None = None) -> Context:
    """Sets ``text`` on pages: one line per input line, wrapped at whitespace, blank lines and indents kept.

    Args:
        text: the text; tabs count as spaces.
        layout: font, size, page size, margins, line spacing.
        source: the name recorded as the pages' source.
        max_pages: more pages are refused while laying out, before any is drawn (None: no bound).

    Returns:
        A Context whose meta records the layout, the font file and the renderer.

    >>> ctx = render_text("Hello world")
    >>> [w.text for w in ctx.pages[0].words], ctx.pages[0].size
    (['Hello', 'world'], (1120, 896))
    """
    setting = layout_text(text, layout, source, max_pages)
    return Context([setting.page(i) for i in range(len(setting))], source, setting.meta)


def read_text_file(path: Union[str, os.PathLike]) -> str:
    """A UTF-8 text file's text; a file over :data:`MAX_TEXT_BYTES` is refused before it is read."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"no such text file: {p}")
    n = p.stat().st_size
    if n > MAX_TEXT_BYTES:
        raise ValueError(f"{p} is {n / 2**20:.1f} MB of text; a context sets at most {MAX_TEXT_BYTES // 2**20} MB "
                         f"on pages (about 1000 pages), and at most --max-pages of them: split the file")
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{p} is not UTF-8 text ({e.reason} at byte {e.start}); convert it to UTF-8 first") from None
