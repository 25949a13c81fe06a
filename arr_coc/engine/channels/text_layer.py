"""Text-layer channel: the words of a page that ARE the question's words, matched exactly, no model, no OCR.

A born-digital PDF carries its text layer and a rendered text knows every word's box
(:mod:`arr_coc.documents`), so the question can be matched to the page's words directly: both are
cut into terms (case-folded, punctuation stripped at the ends, stop words and 1-character terms
dropped), and each page word whose term is a question term is painted over its box with the term's
weight. A word that also continues a pair of consecutive question terms (a quoted phrase, "section
3.2") counts ``1 + PHRASE_BONUS`` times per neighbour it pairs with, so the phrase outranks its words
scattered over the page. A phrase the question quotes ("...") and the page holds verbatim (the same
run of terms, stop words included) is the occurrence the question names: each of its words counts
``1 + 2 * PHRASE_BONUS`` times the weight of all the quote's terms, more than any partial match can.
Stop words alone never match; inside a verbatim quote they do ('after "and there is no"' names one
place, where its one content word "no" occurs all over).

Weights: ``options["text_layer"]["weights"]`` maps terms to weights (a context passes each term's
inverse page frequency over its pages, so words common to every page count little); by default every
term weighs 1. The map is divided by ``options["text_layer"]["norm"]`` when given (a context passes
one value for all its pages, keeping pages comparable), else by the image's own maximum.

Where the words come from: the per-image cache entry ``WORDS_ENTRY`` (a context seeds it with the
page's words in canvas pixels); a page nobody seeded (a scan) is read by RapidOCR, each line's words
boxed by their share of its characters.

Example:
    >>> from arr_coc.engine.cache import ImageCache
    >>> from arr_coc.engine.texture import compute_texture
    >>> page, cache = torch.ones(3, 28, 56), ImageCache()
    >>> _ = cache.get(WORDS_ENTRY, page, lambda: [("Total", (0.0, 0.0, 14.0, 28.0)), ("tax", (14.0, 28.0, 28.0, 56.0))])
    >>> tex = compute_texture(page[None], ("text_layer",), queries=["What is the total?"], cache=cache)
    >>> float(tex[0, 0, 7, 10]), float(tex[0, 0, 20, 40])
    (1.0, 0.0)
"""
from __future__ import annotations

import re
from functools import lru_cache
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch
from torch import Tensor

from arr_coc.engine.channel_registry import TextureInputs, register_channel
from arr_coc.engine.imageops import paint_boxes, paint_cells, to_hwc_uint8
from arr_coc.ocr import DET_LIMIT_SIDE_LEN, rapidocr_engine, require_rapidocr

WORDS_ENTRY = "page_words"  # cache entry: list of (text, (y0, x0, y1, x1) px) in the image's pixels
# A word pairing with a neighbour as the question pairs them counts this much more per neighbour.
PHRASE_BONUS = 1.0
# Question words that say what kind of question it is, not what it is about.
STOP_WORDS = frozenset("""a an the of in on at to for from by with and or is are was were be been what which who whom
whose where when why how does do did this that these those it its as into than then there their about after before
comes come say says said page number title section""".split())
_EDGE = re.compile(r"^[^\w]+|[^\w]+$")
_QUOTE = re.compile(r'"([^"]+)"|\u201c([^\u201d]+)\u201d')  # "straight" or \u201ccurly\u201d double quotes

Word = tuple[str, tuple[float, float, float, float]]


@lru_cache(maxsize=1 << 16)  # a context's words are matched again for every question
def term(word: str) -> str:
    """A word's matching form: case-folded, punctuation stripped at both ends (inner dots stay: ``3.2``).

    >>> term('"Hello,'), term("3.2"), term("(e.g.)")
    ('hello', '3.2', 'e.g')
    """
    return _EDGE.sub("", word.casefold())


def question_terms(question: str) -> list[str]:
    """The question's terms in order, stop words and 1-character terms dropped.

    >>> question_terms('What comes after "the float package"?')
    ['float', 'package']
    """
    return [t for t in (term(w) for w in question.split()) if len(t) > 1 and t not in STOP_WORDS]


def quoted_terms(question: str) -> list[tuple[str, ...]]:
    """The terms of each phrase the question quotes, stop words kept (a quote is meant word for word).

    >>> quoted_terms('What comes after "and there is no"?')
    [('and', 'there', 'is', 'no')]
    """
    return [t for m in _QUOTE.finditer(question) if (t := tuple(x for w in (m[1] or m[2]).split() if (x := term(w))))]


def without_quotes(question: str) -> str:
    """The question with every phrase it quotes left out (what the asker wrote, not what the page says).

    >>> without_quotes('What comes after "who wrote the"?')
    'What comes after ?'
    """
    return _QUOTE.sub("", question)


def word_values(words: Sequence[str], question: str, weights: Mapping[str, float] | None = None) -> list[float]:
    """Each word's match value: its term's weight if a question term, times 1 + PHRASE_BONUS per phrase neighbour;
    the words of a quote found verbatim: 1 + 2 PHRASE_BONUS times the quote's summed term weights.

    >>> word_values(["a", "float", "package", "here", "float"], 'What comes after "float package"?')
    [0.0, 6.0, 6.0, 0.0, 1.0]
    >>> word_values(["is", "no", "and", "there", "is", "no"], 'What comes after "and there is no"?')
    [0.0, 1.0, 12.0, 12.0, 12.0, 12.0]
    """
    q = question_terms(question)
    pairs = set(zip(q, q[1:]))
    terms = [term(w) for w in words]

    def weight(t: str) -> float:
        return 1.0 if weights is None else float(weights.get(t, 0.0))

    out = []
    for i, t in enumerate(terms):
        if t not in q:
            out.append(0.0)
            continue
        links = (i > 0 and (terms[i - 1], t) in pairs) + (i + 1 < len(terms) and (t, terms[i + 1]) in pairs)
        out.append(weight(t) * (1.0 + PHRASE_BONUS * links))
    kept = [i for i, t in enumerate(terms) if t]  # punctuation-only words are not words of a quote
    seq = [terms[i] for i in kept]
    for quote in quoted_terms(question):
        value = (1.0 + 2 * PHRASE_BONUS) * sum(weight(t) for t in quote)
        n = len(quote)
        for j in range(len(seq) - n + 1):
            if tuple(seq[j:j + n]) == quote:
                for i in kept[j:j + n]:
                    out[i] = max(out[i], value)
    return out


def match_map(words: Sequence[Word], question: str, size: tuple[int, int],
              weights: Mapping[str, float] | None = None) -> Tensor:
    """``[H, W]`` the matching words' boxes painted with their values (unnormalised; overlaps take the max)."""
    values = word_values([w for w, _ in words], question, weights)
    hit = [i for i, v in enumerate(values) if v > 0]
    if not hit:
        return torch.zeros(size)
    boxes = torch.tensor([words[i][1] for i in hit], dtype=torch.float32)
    return paint_boxes(boxes, torch.tensor([values[i] for i in hit]), size)


def match_cells(words: Sequence[Word], values: Sequence[float], size: tuple[int, int], cell: int,
                norm: float) -> Tensor:
    """``[H // cell, W // cell]`` the words' :func:`word_values` painted as :func:`match_map` paints them, over
    ``norm``, clamped to [0, 1] and averaged over each token cell: that map pooled to cells, to the last bit,
    painting only the cells a matching word touches.

    >>> words = [("Total", (0.0, 0.0, 14.0, 21.0)), ("tax", (14.0, 0.0, 28.0, 28.0))]
    >>> match_cells(words, [2.0, 0.0], (28, 56), 14, 2.0).tolist()
    [[1.0, 0.5, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]
    """
    hit = [i for i, v in enumerate(values) if v > 0]
    if not hit:
        return torch.zeros(size[0] // cell, size[1] // cell)
    boxes = torch.tensor([words[i][1] for i in hit], dtype=torch.float32)
    return paint_cells(boxes, torch.tensor([values[i] for i in hit]), size, cell, "mean",
                       lambda m: (m / norm).float().clamp(0, 1))


def ocr_words(image: Tensor, det_limit_side_len: int = DET_LIMIT_SIDE_LEN) -> list[Word]:
    """The words RapidOCR reads on ``image`` [3, H, W]: each line split at spaces, boxes by character share."""
    require_rapidocr("the text_layer channel on a page without a text layer")
    out = rapidocr_engine(det_limit_side_len)(np.ascontiguousarray(to_hwc_uint8(image.float())[..., ::-1]))
    words: list[Word] = []
    for quad, text in zip(out.boxes if out.boxes is not None else (), out.txts or ()):
        q = np.asarray(quad, dtype=np.float64)
        y0, x0, y1, x1 = q[:, 1].min(), q[:, 0].min(), q[:, 1].max(), q[:, 0].max()
        text = str(text)
        for m in re.finditer(r"\S+", text):
            a, b = m.start() / max(1, len(text)), m.end() / max(1, len(text))
            words.append((m.group(), (float(y0), float(x0 + a * (x1 - x0)), float(y1), float(x0 + b * (x1 - x0)))))
    return words


def image_words(cache: Any, image: Tensor, known: Callable[[], list[Word]] | None = None,
                det_limit_side_len: int = DET_LIMIT_SIDE_LEN) -> list[Word]:
    """One image's cached words: ``known()`` (a text layer) when given and not cached yet, else OCR."""
    return cache.get(WORDS_ENTRY, image, known if known is not None else (lambda: ocr_words(image, det_limit_side_len)))


@register_channel("text_layer", differentiable=False, needs_query=True)
def _text_layer(inputs: TextureInputs) -> Tensor:
    """Page words that are the question's words, exactly (text layer, or OCR on a scan): weighted, phrases first."""
    if inputs.queries is None:
        raise ValueError("the text_layer channel matches the question to the page's words: pass queries=")
    weights = inputs.option("text_layer", "weights")
    norm = inputs.option("text_layer", "norm")
    side = int(inputs.option("text_layer", "det_limit_side_len", DET_LIMIT_SIDE_LEN))
    size = tuple(inputs.pixels.shape[-2:])
    maps = []
    for i, (image, question) in enumerate(zip(inputs.pixels, inputs.queries)):
        text = inputs.known_text(i)  # a page's known words (its text layer): no OCR
        known = None if text is None else (lambda words=list(text.words): words)
        m = match_map(image_words(inputs.cache, image, known=known, det_limit_side_len=side), question, size, weights)
        top = float(norm) if norm is not None else float(m.max())
        maps.append(m / top if top > 0 else m)
    return torch.stack(maps)[:, None].to(inputs.pixels).clamp(0, 1)  # [B, 1, H, W]
