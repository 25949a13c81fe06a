"""A character's font box (ascent to descent across its advance) where PDFium's stands on the font's bounding box.

PDFium's loose character box (``FPDFText_GetLooseCharBox``, the convention of poppler's ``pdftotext -bbox``)
runs from the font's ascent to its descent, widened to the glyph's ink. Where the FontDescriptor gives neither
(``/Ascent 0 /Descent 0``, as many pdfTeX-made descriptors say), PDFium measures them itself: the top of the
font's capital A and the bottom of its g, and, where the (subset) font has no A or no g, the edge of the
/FontBBox. That edge bounds all the full font's glyphs, accented ones included, not its letters: texlive's
expl3.pdf sets its body text in such a font, boxed up to 1.128 em above the baseline while its ink reaches
0.753 em.

:func:`letter_metrics` completes PDFium's rule: an ascent (descent) PDFium took from the bounding box because the
font has no A (g) becomes the highest top (lowest bottom) of the font's letters that reach as high as an A
(as low as a g): the PDF reference defines Ascent as the height the font's glyphs reach, accented ones excluded.
PDFium does not say what the descriptor declared, so the fallback is recognised by its signature: one edge is
the bounding box's, the other the measured glyph's (a font with neither an A nor a g shows no such proof).
Every other ascent and descent is PDFium's. The bounding box is read from the embedded program (a Type 1
program's /FontBBox, a TrueType or OpenType 'head' table); a font without one (bare CFF, not embedded, a
damaged program) keeps PDFium's metrics.

Coordinates: PDF points, (left, bottom, right, top); metrics in em.
"""
from __future__ import annotations

import ctypes
import re
import string
import struct

import pypdfium2.raw as pdfium_c

Rect = tuple[float, float, float, float]  # (left, bottom, right, top) points
Metrics = tuple[float, float]  # (ascent, descent) em above the baseline

# The letters that reach as high as the A and as low as the g, in Latin fonts.
_ASCENDERS = string.ascii_uppercase + "bdfhkl"
_DESCENDERS = "jpqy"
# A Type 1 program's clear text ends at eexec; its /FontBBox and /FontMatrix are there.
_T1_BBOX = re.compile(rb"/FontBBox\s*[\[{]\s*(-?[\d.]+)\s+(-?[\d.]+)\s+(-?[\d.]+)\s+(-?[\d.]+)")
_T1_MATRIX = re.compile(rb"/FontMatrix\s*[\[{]\s*(?:-?[\d.]+\s+){3}(-?[\d.eE+-]+)")
# PDFium's metrics are whole thousandths of an em: a bounding box edge rounds to within half of one; a glyph's
# outline (read here from its points) and PDFium's glyph box (FreeType's) differ by up to ~1.1 (measured).
_SAME_BOX = 0.5
_SAME_GLYPH = 2.0


def _font_data(font) -> bytes:
    n = ctypes.c_size_t()
    if not pdfium_c.FPDFFont_GetFontData(font, None, 0, n) or n.value == 0:
        return b""
    buf = (ctypes.c_uint8 * n.value)()
    pdfium_c.FPDFFont_GetFontData(font, buf, n.value, n)
    return bytes(buf)


def program_bbox(data: bytes) -> tuple[float, float] | None:
    """(bottom, top) of an embedded font program's bounding box in thousandths of an em, or None.

    >>> program_bbox(b"%!PS-AdobeFont-1.0: X\\n/FontMatrix [0.001 0 0 0.001 0 0] readonly def\\n"
    ...              b"/FontBBox {-443 -292 1454 1128} readonly def\\ncurrentfile eexec")
    (-292.0, 1128.0)
    >>> program_bbox(b"not a font") is None
    True
    >>> program_bbox(b"true\\x00\\x09") is None  # a table directory cut short: a damaged program
    True
    """
    if data[:4] in (b"\x00\x01\x00\x00", b"true", b"OTTO"):  # sfnt: TrueType or OpenType
        try:
            (n_tables,) = struct.unpack_from(">H", data, 4)
            for k in range(n_tables):
                tag, _, offset, _ = struct.unpack_from(">4sIII", data, 12 + 16 * k)
                if tag == b"head":
                    (upem,) = struct.unpack_from(">H", data, offset + 18)
                    y_min, y_max = struct.unpack_from(">h2xh", data, offset + 38)
                    return (y_min * 1000 / upem, y_max * 1000 / upem) if upem else None
        except struct.error:  # a table past the end of the data: no bounding box to read, PDFium's metrics stand
            return None
        return None
    clear = data[: data.find(b"eexec")] if b"eexec" in data else b""
    m = _T1_BBOX.search(clear)
    if not m:
        return None
    fm = _T1_MATRIX.search(clear)
    scale = float(fm.group(1)) * 1000 if fm else 1.0  # glyph units to thousandths of an em
    return float(m.group(2)) * scale, float(m.group(4)) * scale


def glyph_reach(font, char: str) -> tuple[float, float] | None:
    """(bottom, top) em of the font's glyph for ``char``, or None where the font has none.

    From the outline's points (control points included: fonts put points at a letter's extremes, so these
    are the outline's own reach).
    """
    # PDFium returns the outline in em whatever the size; at size 1 it is em either way.
    path = pdfium_c.FPDFFont_GetGlyphPath(font, ord(char), ctypes.c_float(1.0))
    if not path:
        return None
    ys = []
    x, y = ctypes.c_float(), ctypes.c_float()
    for k in range(pdfium_c.FPDFGlyphPath_CountGlyphSegments(path)):
        if pdfium_c.FPDFPathSegment_GetPoint(pdfium_c.FPDFGlyphPath_GetGlyphPathSegment(path, k), x, y):
            ys.append(y.value)
    return (min(ys), max(ys)) if ys else None


def letter_metrics(font) -> Metrics | None:
    """(ascent, descent) em for the font box where PDFium took either from the font's bounding box; else None.

    PDFium's fallback is recognised by its signature: each edge is either the measured glyph's (A's top, g's
    bottom) or, where the font has no such glyph, the program's bounding box edge, and at least one of the two
    glyphs is there to show it (a font with neither, whose metrics equal its bounding box, may have declared
    them so: its metrics stand). An edge taken from the bounding box becomes the reach of the font's letters of
    that kind: capitals and ascenders (b d f h k l) for the ascent, descenders (j p q y) for the descent; with
    none of them the edge stays. None: PDFium's ascent and descent stand.
    """
    size = ctypes.c_float(1000.0)  # thousandths of an em, as the descriptor and the bounding box are
    a, d = ctypes.c_float(), ctypes.c_float()
    if not (pdfium_c.FPDFFont_GetAscent(font, size, a) and pdfium_c.FPDFFont_GetDescent(font, size, d)):
        return None
    cap, g = glyph_reach(font, "A"), glyph_reach(font, "g")
    if (cap is None) == (g is None):  # both measured (no bounding box edge), or neither (no proof of the fallback)
        return None
    bbox = program_bbox(_font_data(font))
    if bbox is None:
        return None
    if cap is None:
        fallback = abs(a.value - bbox[1]) <= _SAME_BOX and abs(d.value - g[0] * 1000) <= _SAME_GLYPH
    else:
        fallback = abs(a.value - cap[1] * 1000) <= _SAME_GLYPH and abs(d.value - bbox[0]) <= _SAME_BOX
    if not fallback:
        return None
    reach = [r for r in (glyph_reach(font, c) for c in (_ASCENDERS if cap is None else _DESCENDERS)) if r is not None]
    if not reach:
        return None
    if cap is None:
        return max(top for _, top in reach), d.value / 1000
    return a.value / 1000, min(bottom for bottom, _ in reach)


def page_fonts(page) -> dict[int, Metrics]:
    """Font handle -> :func:`letter_metrics` of each font the page's text objects (form XObjects' included) are
    set in, where it replaces PDFium's; most pages have none, and their characters need no look-up."""
    out: dict[int, Metrics] = {}
    seen: set[int] = set()

    def visit(count: int, get) -> None:
        for j in range(count):
            obj = get(j)
            kind = pdfium_c.FPDFPageObj_GetType(obj)
            if kind == pdfium_c.FPDF_PAGEOBJ_FORM:
                visit(pdfium_c.FPDFFormObj_CountObjects(obj), lambda k, form=obj: pdfium_c.FPDFFormObj_GetObject(form, k))
            elif kind == pdfium_c.FPDF_PAGEOBJ_TEXT:
                font = pdfium_c.FPDFTextObj_GetFont(obj)
                key = ctypes.cast(font, ctypes.c_void_p).value
                if key and key not in seen:
                    seen.add(key)
                    metrics = letter_metrics(font)
                    if metrics is not None:
                        out[key] = metrics

    visit(pdfium_c.FPDFPage_CountObjects(page), lambda j: pdfium_c.FPDFPage_GetObject(page, j))
    return out


def font_box(textpage, i: int, loose: Rect, tight: Rect, fonts: dict[int, Metrics]) -> Rect:
    """Character ``i``'s font box: PDFium's loose box, its ascent and descent from :func:`letter_metrics` where
    that replaces them.

    Args:
        textpage: the raw PDFium text page.
        i: the character's index.
        loose: PDFium's loose box of the character; tight: its glyph box (ink), which the font box holds.
        fonts: :func:`page_fonts` of the page.
    """
    obj = pdfium_c.FPDFText_GetTextObject(textpage, i)
    metrics = fonts.get(ctypes.cast(pdfium_c.FPDFTextObj_GetFont(obj), ctypes.c_void_p).value) if obj else None
    if metrics is None:
        return loose
    # PDFium's loose box: the text-space rect from descent to ascent x font size, through the character's matrix.
    m = pdfium_c.FS_MATRIX()
    ox, oy = ctypes.c_double(), ctypes.c_double()
    if not (pdfium_c.FPDFText_GetMatrix(textpage, i, m) and pdfium_c.FPDFText_GetCharOrigin(textpage, i, ox, oy)):
        return loose
    size = pdfium_c.FPDFText_GetFontSize(textpage, i)
    ascent, descent = metrics
    left, bottom, right, top = loose
    if abs(m.b) < 1e-9 and abs(m.c) < 1e-9:  # upright or upside down: the em runs along y
        lo, hi = sorted((oy.value + m.d * size * descent, oy.value + m.d * size * ascent))
        return left, min(lo, tight[1]), right, max(hi, tight[3])
    if abs(m.a) < 1e-9 and abs(m.d) < 1e-9:  # a quarter turn: the em runs along x
        lo, hi = sorted((ox.value + m.c * size * descent, ox.value + m.c * size * ascent))
        return min(lo, tight[0]), bottom, max(hi, tight[2]), top
    return loose  # turned at another angle or skewed: PDFium's box
