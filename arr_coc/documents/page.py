"""A document page as the pipeline sees it: rendered pixels plus the words on it, each with its box.

Both producers (:func:`arr_coc.documents.pdf.read_pdf` for born-digital PDFs and
:func:`arr_coc.documents.text_pages.render_text` for plain text) return a :class:`Context`: the
pages of one source in reading order. A box is ``(y0, x0, y1, x1)`` in the rendered page's pixels
(floats; y down, ``y1``/``x1`` exclusive), the same order the rest of the project uses for cells.

Shapes: ``Page.image`` [3, H, W] float32 in [0, 1], as :func:`arr_coc.engine.canvas.load_image` returns.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple, Sequence

import torch

Box = tuple[float, float, float, float]  # (y0, x0, y1, x1) px


class Word(NamedTuple):
    """One word: its text and its box; unpacks as ``text, box``."""

    text: str
    box: Box


class Line(NamedTuple):
    """One line of text: the indices of its words in ``Page.words`` and its font size in page pixels."""

    words: tuple[int, ...]
    size: float


def union(boxes: Sequence[Box]) -> Box:
    """The smallest box holding every box.

    >>> union([(1.0, 2.0, 3.0, 4.0), (0.0, 5.0, 2.0, 6.0)])
    (0.0, 2.0, 3.0, 6.0)
    """
    if not boxes:
        raise ValueError("union of no boxes is undefined; pass at least one box")
    return (min(b[0] for b in boxes), min(b[1] for b in boxes), max(b[2] for b in boxes), max(b[3] for b in boxes))


@dataclass
class Page:
    """One rendered page and its words.

    Attributes:
        image: [3, H, W] float32 in [0, 1]; None when only the text layer was read.
        words: every word in reading order, boxes in this image's pixels.
        lines: the lines in reading order, each naming its words.
        index: 0-based page index in the source (not the printed folio).
        source: the file the page came from (or a name for an in-memory text).
        dpi: the render resolution for a PDF; None for rendered text (its pixels are the unit).
        size: (height, width) of the rendered page in pixels, known even when ``image`` is None.
    """

    image: torch.Tensor | None
    words: list[Word]
    lines: list[Line]
    index: int
    source: str
    dpi: float | None
    size: tuple[int, int]

    def __post_init__(self) -> None:
        if self.image is not None and tuple(self.image.shape) != (3, *self.size):
            raise ValueError(f"page image has shape {tuple(self.image.shape)}, expected (3, {self.size[0]}, {self.size[1]})")

    def line_text(self, i: int) -> str:
        """The text of line ``i``: its words joined by single spaces."""
        return " ".join(self.words[w].text for w in self.lines[i].words)

    def line_box(self, i: int) -> Box:
        """The box of line ``i`` (the union of its words' boxes)."""
        return union([self.words[w].box for w in self.lines[i].words])

    @property
    def text(self) -> str:
        """The page's text, one line per line."""
        return "\n".join(self.line_text(i) for i in range(len(self.lines)))


@dataclass
class Context:
    """The pages of one source in reading order, and how they were made.

    Attributes:
        pages: the pages.
        source: the file (or name) they came from.
        meta: the producer's settings and facts about the source (page count, dpi, font, ...),
            recorded so a result can say exactly what was rendered.
    """

    pages: list[Page]
    source: str
    meta: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.pages)


def lines_from_breaks(words: Sequence[Word], breaks: Sequence[int], sizes: Sequence[float]) -> list[Line]:
    """Lines from the index of each line's first word (``breaks``, ascending) and each line's font size.

    >>> ws = [Word("a", (0, 0, 1, 1)), Word("b", (0, 2, 1, 3)), Word("c", (2, 0, 3, 1))]
    >>> lines_from_breaks(ws, [0, 2], [10.0, 12.0])
    [Line(words=(0, 1), size=10.0), Line(words=(2,), size=12.0)]
    """
    ends = list(breaks[1:]) + [len(words)]
    return [Line(tuple(range(a, b)), float(s)) for a, b, s in zip(breaks, ends, sizes) if b > a]
