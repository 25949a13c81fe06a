"""Word boxes against poppler's: the median centre offset of each PDF's words, in px at 100 dpi.

    python benchmarks/pdf_boxes.py --out benchmarks/results/pdf_boxes.md
    python benchmarks/pdf_boxes.py --pdf some.pdf other.pdf      # any PDFs instead of the corpus

For every corpus PDF (:func:`arr_coc.documents.corpus.documents`: the text-layer manuals of the two
texlive doc packages, all splits) and a few pages each (first, middle, last), the words
:func:`arr_coc.documents.pdf.read_pdf` finds are matched to poppler's (``pdftotext -bbox -cropbox``,
Debian poppler-utils, an independent PDF engine): both word lists, in reading order and NFKC-folded,
are aligned by ``difflib`` and every word inside an equal run is a pair. A pair's offset is the
distance between the two boxes' centres in the rendered image's pixels; a PDF's figure is the median
over its pairs.

Two boxes per word, through the same page geometry:

- ``font``: each character from its font's ascent to descent across its advance
  (``page_words(loose=True)``), poppler's own convention, so any offset left is the geometry's
  (page box, rotation, scale): the check that every PDF's median is within ``GOAL_PX``;
- ``ink``: the boxes ``read_pdf`` returns (around each glyph's ink, what the channels and answer boxes
  use); these sit inside the font boxes, so their centres also differ by where the ink lies between
  ascent and descent (vertical, a fraction of the font size), not by the geometry.

"Inherited" marks a PDF whose first page sets neither MediaBox nor CropBox itself (it takes them from
the page tree), the case where ``get_cropbox()`` answers US Letter.

Why a PDF's font boxes sit off poppler's (``--fonts PAGE``; printed for every PDF over ``GOAL_PX``, on
its worst page): every word both engines read is given the font of its first character
(``FPDFText_GetFontInfo``); per font, in em of the font's size above the baseline (``FPDFText_GetCharOrigin``):

- the font box's ascent and descent: what ``page_words(loose=True)`` draws each character in
  (:func:`arr_coc.documents.font_box.letter_metrics` where it replaces PDFium's), and PDFium's own
  (``FPDFFont_GetAscent`` / ``GetDescent``);
- poppler's: where ``pdftotext -bbox`` puts the word's top and bottom;
- the ink: the page rendered at ``INK_DPI`` in grey, the highest and lowest dark pixel (below 128) over the
  font's words, each word's columns searched from ``ABOVE`` em above its baseline to ``BELOW`` em below
  (no neighbouring line enters);

and the median vertical and horizontal offset of the word centres (ours minus poppler's, px).

    python benchmarks/pdf_boxes.py --pdf /usr/share/doc/texlive-doc/latex/l3kernel/expl3.pdf --fonts 16
"""
from __future__ import annotations

import argparse
import ctypes
import difflib
import html
import re
import shutil
import statistics
import subprocess
import sys
import time
import unicodedata
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c

from arr_coc.documents.corpus import documents
from arr_coc.documents.font_box import letter_metrics
from arr_coc.documents.pdf import open_pdf, page_words, read_pdf

DPI = 100.0
GOAL_PX = 2.0  # the bound each PDF's median must meet
_WORD = re.compile(r'<word xMin="([-\d.]+)" yMin="([-\d.]+)" xMax="([-\d.]+)" yMax="([-\d.]+)">(.*?)</word>')


INK_DPI = 600.0
ABOVE, BELOW = 0.9, 0.35  # em searched for ink above and below a word's baseline: no neighbouring line enters


def _font(tp: pdfium.PdfTextPage, i: int) -> tuple[str, float]:
    buf, flags = ctypes.create_string_buffer(256), ctypes.c_int()
    pdfium_c.FPDFText_GetFontInfo(tp.raw, i, buf, 256, flags)
    return buf.value.decode(errors="replace"), float(pdfium_c.FPDFText_GetFontSize(tp.raw, i))


def _origin(tp: pdfium.PdfTextPage, i: int) -> tuple[float, float]:
    x, y = ctypes.c_double(), ctypes.c_double()
    pdfium_c.FPDFText_GetCharOrigin(tp.raw, i, x, y)
    return x.value, y.value


def _metrics(tp: pdfium.PdfTextPage, i: int, size: float, fonts: dict) -> tuple[float, float, float, float]:
    """(ascent, descent) em of the character's font box, then PDFium's own (ascent, descent) em.

    ``fonts``: font handle -> its letter_metrics, filled here (one look at each font of the page)."""
    font = pdfium_c.FPDFTextObj_GetFont(pdfium_c.FPDFText_GetTextObject(tp.raw, i))
    asc, desc = ctypes.c_float(), ctypes.c_float()
    pdfium_c.FPDFFont_GetAscent(font, ctypes.c_float(size), asc)
    pdfium_c.FPDFFont_GetDescent(font, ctypes.c_float(size), desc)
    own = asc.value / size, desc.value / size
    key = ctypes.cast(font, ctypes.c_void_p).value
    if key not in fonts:
        fonts[key] = letter_metrics(font)
    return (*(fonts[key] or own), *own)


def first_chars(page: pdfium.PdfPage) -> list[tuple[float, float, str, float, tuple[float, ...]]]:
    """(x, baseline y from the top in points, font, size, :func:`_metrics`) of each word's first character.

    A word starts after a space or line break; characters drawn at a size under 2 pt (TeX's size-1 fonts
    scaled by the text matrix) are skipped, their em being unknown here.
    """
    tp = page.get_textpage()
    height = page.get_size()[1]
    out, start, fonts = [], True, {}
    for i in range(tp.count_chars()):
        ch = chr(pdfium_c.FPDFText_GetUnicode(tp.raw, i))
        if ch.isspace() or ch in "\r\n\x02":
            start = True
            continue
        if start:
            name, size = _font(tp, i)
            if size >= 2:
                x, y = _origin(tp, i)
                out.append((x, height - y, name, size, _metrics(tp, i, size, fonts)))
            start = False
    tp.close()
    return out


def font_table(path: str, page_index: int, ours: list, theirs: list, pairs: list[tuple[int, int]],
               scale_yx: tuple[float, float]) -> list[str]:
    """Markdown rows, one per font with matched words on the page.

    Args:
        path: the PDF.
        page_index: 0-based page.
        ours: our words' (text, (y, x) centre px) on the page; theirs: poppler's (text, (y0, x0, y1, x1) points).
        pairs: (index in ours, index in theirs) of each matched word.
        scale_yx: px per point of ``ours``, (y, x).
    """
    doc = pdfium.PdfDocument(path)
    page = doc[page_index]
    starts = first_chars(page)
    bitmap = page.render(scale=INK_DPI / 72, grayscale=True)
    ink = np.asarray(bitmap.to_pil().convert("L")) < 128
    bitmap.close()
    page.close()
    doc.close()
    px = INK_DPI / 72
    per_font: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for a, b in pairs:
        y0, x0, y1, x1 = theirs[b][1]
        # the first character whose origin lies at the word's left edge, on its line
        near = [s for s in starts if abs(s[0] - x0) < 1.0 and y0 - 1.0 <= s[1] <= y1 + 1.0]
        if not near:
            continue
        x, base, name, size, (asc, desc, own_asc, own_desc) = min(near, key=lambda s: abs(s[0] - x0))
        f = per_font[f"{name} {size:.2f} pt"]
        f["ours"].append((asc, desc))
        f["pdfium"].append((own_asc, own_desc))
        f["poppler"].append(((base - y0) / size, (base - y1) / size))
        top, bottom = int((base - ABOVE * size) * px), int((base + BELOW * size) * px) + 1
        cols = ink[max(0, top):bottom, int(x0 * px):int(x1 * px) + 1]
        rows = np.flatnonzero(cols.any(axis=1))
        if rows.size:
            f["ink"].append(((base * px - (max(0, top) + rows[0])) / (size * px),
                             (base * px - (max(0, top) + rows[-1] + 1)) / (size * px)))
        (oy, ox), ty, tx = ours[a][1], (y0 + y1) / 2 * scale_yx[0], (x0 + x1) / 2 * scale_yx[1]
        f["offset"].append((oy - ty, ox - tx))
    lines = ["| font | words | median dy, dx (px) | font box ascent / descent (em) | PDFium's own (em) | "
             "poppler top / bottom (em) | ink highest / lowest (em) |", "| --- | --- | --- | --- | --- | --- | --- |"]
    notes = []
    for name, f in sorted(per_font.items(), key=lambda kv: -len(kv[1]["offset"])):
        med = [statistics.median(v) for v in zip(*f["offset"])]
        ob = [statistics.median(v) for v in zip(*f["ours"])]
        pd = [statistics.median(v) for v in zip(*f["pdfium"])]
        pp = [statistics.median(v) for v in zip(*f["poppler"])]
        hi_lo = (max(t for t, _ in f["ink"]), min(b for _, b in f["ink"])) if f["ink"] else (float("nan"),) * 2
        lines.append(f"| {name} | {len(f['offset'])} | {med[0]:.2f}, {med[1]:.2f} | {ob[0]:.3f} / {ob[1]:.3f} | "
                     f"{pd[0]:.3f} / {pd[1]:.3f} | {pp[0]:.3f} / {pp[1]:.3f} | {hi_lo[0]:.3f} / {hi_lo[1]:.3f} |")
        centres = {"ours": sum(ob) / 2, "poppler": sum(pp) / 2, "ink": sum(hi_lo) / 2}
        if abs(centres["ours"] - centres["poppler"]) > 0.05 and f["ink"]:
            nearer = min(("ours", "poppler"), key=lambda k: abs(centres[k] - centres["ink"]))
            nearer = {"ours": "ours", "poppler": "poppler's"}[nearer]
            notes.append(f"{name}: the engines place its words differently; box centres "
                         f"{centres['ours']:.3f} em (ours), {centres['poppler']:.3f} em (poppler), the ink's "
                         f"{centres['ink']:.3f} em above the baseline: {nearer} is the nearer to the glyphs.")
    return lines + ([""] + notes if notes else [])


Pairs = list[tuple[float, float]]  # (dy, dx) px: our centre minus poppler's, one per matched word


def _median(values) -> float:
    values = list(values)
    return statistics.median(values) if values else float("nan")


@dataclass
class PdfOffsets:
    """One PDF's comparison: its name, whether its box is inherited, our words, each box kind's matched pairs."""

    name: str
    inherited: bool
    words: int
    font: Pairs
    ink: Pairs
    fonts: list[str] = field(default_factory=list)  # over the goal: its worst page's offsets by font

    @staticmethod
    def distances(pairs: Pairs) -> list[float]:
        return [(dy * dy + dx * dx) ** 0.5 for dy, dx in pairs]

    @property
    def median(self) -> float:
        """The font boxes' median centre offset (the geometry check)."""
        return _median(self.distances(self.font))

    @property
    def ink_median(self) -> float:
        return _median(self.distances(self.ink))


def poppler_boxes(path: str, page: int) -> list[tuple[str, tuple[float, float, float, float]]]:
    """(text, (y0, x0, y1, x1) in display points) of each word poppler reads on the 0-based page."""
    if shutil.which("pdftotext") is None:
        sys.exit("pdftotext not found: apt-get install poppler-utils (make setup installs it)")
    out = subprocess.run(["pdftotext", "-q", "-bbox", "-cropbox", "-f", str(page + 1), "-l", str(page + 1),
                          path, "-"], capture_output=True, text=True, check=True).stdout
    return [(html.unescape(t), (float(y0), float(x0), float(y1), float(x1))) for x0, y0, x1, y1, t in _WORD.findall(out)]


def poppler_words(path: str, page: int) -> list[tuple[str, tuple[float, float]]]:
    """(text, (y, x) centre in display points) of each word poppler reads on the 0-based page."""
    return [(t, ((y0 + y1) / 2, (x0 + x1) / 2)) for t, (y0, x0, y1, x1) in poppler_boxes(path, page)]


def _fold(text: str) -> str:
    return unicodedata.normalize("NFKC", text)


def match_pairs(ours: list[tuple[str, object]], theirs: list[tuple[str, object]]) -> list[tuple[int, int]]:
    """(index in ours, index in theirs) of every word in an equal run of the two reading-order lists.

    >>> match_pairs([("a", 0), ("b", 0), ("x", 0)], [("a", 0), ("b", 0), ("c", 0)])
    [(0, 0), (1, 1)]
    """
    sm = difflib.SequenceMatcher(None, [_fold(t) for t, _ in ours], [_fold(t) for t, _ in theirs], autojunk=False)
    return [(block.a + k, block.b + k) for block in sm.get_matching_blocks() for k in range(block.size)]


def matched_offsets(ours: list[tuple[str, tuple[float, float]]],
                    theirs: list[tuple[str, tuple[float, float]]]) -> Pairs:
    """(dy, dx) between the centres of every pair of words in an equal run of the two reading-order lists.

    >>> matched_offsets([("a", (0, 0)), ("b", (3, 4)), ("x", (0, 0))], [("a", (0, 0)), ("b", (0, 0)), ("c", (9, 9))])
    [(0, 0), (3, 4)]
    """
    return [(ours[a][1][0] - theirs[b][1][0], ours[a][1][1] - theirs[b][1][1]) for a, b in match_pairs(ours, theirs)]


def inherited_box(path: str) -> bool:
    """Whether the first page sets neither MediaBox nor CropBox in its own dictionary."""
    doc = pdfium.PdfDocument(path)
    try:
        page = doc[0]
        own = page.get_mediabox(fallback_ok=False) or page.get_cropbox(fallback_ok=False)
        page.close()
        return own is None
    finally:
        doc.close()


def _centres(words) -> list[tuple[str, tuple[float, float]]]:
    return [(w.text, ((w.box[0] + w.box[2]) / 2, (w.box[1] + w.box[3]) / 2)) for w in words]


def pdf_offsets(path: str, name: str, dpi: float = DPI) -> PdfOffsets:
    """The first, middle and last page of one PDF compared with poppler, font and ink boxes.

    A PDF whose font boxes' median is over ``GOAL_PX`` gets its worst page's offsets by font
    (:func:`font_table`: each engine's ascent and descent, and the ink).
    """
    doc = open_pdf(path)
    n = len(doc)
    ctx = read_pdf(path, pages=sorted({0, n // 2, n - 1}), dpi=dpi, render=False)
    font: Pairs = []
    ink: Pairs = []
    words = 0
    pages = []
    for page in ctx.pages:
        pdf_page = doc[page.index]
        (h, w), (dw, dh) = page.size, pdf_page.get_size()  # px and display points: read_pdf's scale
        loose, _, _ = page_words(pdf_page, (h / dh, w / dw), loose=True)
        pdf_page.close()
        boxes = poppler_boxes(path, page.index)
        theirs = [(t, ((y0 + y1) / 2 * h / dh, (x0 + x1) / 2 * w / dw)) for t, (y0, x0, y1, x1) in boxes]
        ours = _centres(loose)
        page_font = matched_offsets(ours, theirs)
        font += page_font
        ink += matched_offsets(_centres(page.words), theirs)
        words += len(page.words)
        pages.append((_median(PdfOffsets.distances(page_font)), page.index, ours, boxes, (h / dh, w / dw)))
    doc.close()
    result = PdfOffsets(name, inherited_box(path), words, font, ink)
    if result.median > GOAL_PX:
        _, index, ours, boxes, scale = max(pages, key=lambda p: p[0])
        result.fonts = [f"{name}, page {index + 1}:", "",
                        *font_table(path, index, ours, boxes, match_pairs(ours, boxes), scale)]
    return result


def page_fonts(path: str, index: int, dpi: float = DPI) -> list[str]:
    """:func:`font_table` of one page (0-based), our font boxes against poppler's at ``dpi``."""
    page_size = read_pdf(path, pages=[index], dpi=dpi, render=False).pages[0].size
    doc = open_pdf(path)
    page = doc[index]
    (dw, dh), (h, w) = page.get_size(), page_size
    loose, _, _ = page_words(page, (h / dh, w / dw), loose=True)
    page.close()
    doc.close()
    ours, theirs = _centres(loose), poppler_boxes(path, index)
    return font_table(path, index, ours, theirs, match_pairs(ours, theirs), (h / dh, w / dw))


def table(rows: list[PdfOffsets], worst: int = 15) -> str:
    """The summary and the worst PDFs as markdown."""
    scored = [r for r in rows if r.font]
    inh = [r for r in scored if r.inherited]
    font_all = [d for r in scored for d in r.distances(r.font)]
    ink_all = [d for r in scored for d in r.distances(r.ink)]
    lines = [
        "| boxes | PDFs compared | with inherited boxes | PDFs with median over "
        f"{GOAL_PX:g} px | worst PDF median (px) | median of all pairs (px) | pairs matched / our words |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for kind, all_d, med in (("font (geometry)", font_all, lambda r: r.median),
                             ("ink (read_pdf's)", ink_all, lambda r: r.ink_median)):
        lines.append(f"| {kind} | {len(scored)} | {len(inh)} | {sum(med(r) > GOAL_PX for r in scored)} | "
                     f"{max(med(r) for r in scored):.2f} | {_median(all_d):.2f} | {len(all_d)} / "
                     f"{sum(r.words for r in scored)} |")
    ink_dy = _median(abs(dy) for r in scored for dy, _ in r.ink)
    ink_dx = _median(abs(dx) for r in scored for _, dx in r.ink)
    lines += ["", f"Ink boxes, all pairs: median |dy| {ink_dy:.2f} px, median |dx| {ink_dx:.2f} px.", "",
              f"Worst {min(worst, len(scored))} PDFs by the font boxes' median centre offset:", "",
              "| PDF | inherited box | font median (px) | font 90th pct (px) | ink median (px) | ink median abs dy, abs dx (px) "
              "| pairs / our words |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in sorted(scored, key=lambda r: (-r.median, -r.ink_median))[:worst]:
        d = r.distances(r.font)
        p90 = statistics.quantiles(d, n=10)[-1] if len(d) > 1 else d[0]
        lines.append(f"| {r.name} | {'yes' if r.inherited else 'no'} | {r.median:.2f} | {p90:.2f} | "
                     f"{r.ink_median:.2f} | {_median(abs(dy) for dy, _ in r.ink):.2f}, "
                     f"{_median(abs(dx) for _, dx in r.ink):.2f} | {len(r.font)} / {r.words} |")
    if inh:
        lines += ["", "PDFs with inherited boxes:", "", "| PDF | font median (px) | ink median (px) |",
                  "| --- | --- | --- |"]
        lines += [f"| {r.name} | {r.median:.2f} | {r.ink_median:.2f} |" for r in sorted(inh, key=lambda r: r.name)]
    over = [r for r in scored if r.fonts]
    if over:
        lines += ["", f"PDFs over {GOAL_PX:g} px, their worst page by font (the font box's ascent / descent, PDFium's own, "
                      "poppler's top / bottom in em of the font's size above the baseline; the ink: the highest and lowest dark "
                      "pixel of the font's words rendered at 600 dpi). A font's words sit off poppler's by the "
                      "difference of the two boxes' (top + bottom) / 2 x its size; the ink says which "
                      "box is the nearer to the glyphs (`--pdf PDF --fonts PAGE`):", ""]
        for r in over:
            lines += r.fonts + [""]
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pdf", nargs="*", help="PDFs to compare instead of the corpus")
    ap.add_argument("--dpi", type=float, default=DPI)
    ap.add_argument("--out", type=Path, help="write the tables here (markdown)")
    ap.add_argument("--letter-geometry", action="store_true",
                    help="the negative control: page boxes from pypdfium2's get_cropbox() (US Letter where inherited)")
    ap.add_argument("--fonts", type=int, metavar="PAGE", help="only the offsets by font on this 1-based page of one --pdf")
    args = ap.parse_args(argv)
    if args.fonts is not None:
        if not args.pdf or len(args.pdf) != 1:
            ap.error("--fonts PAGE reads one PDF: give it as --pdf FILE")
        return print("\n".join(page_fonts(args.pdf[0], args.fonts - 1, args.dpi)))
    if args.letter_geometry:
        import arr_coc.documents.pdf as pdf

        pdf.display_frame = lambda page: (page.get_cropbox(), page.get_rotation())
    t0 = time.perf_counter()
    if args.pdf:
        todo = [(p, Path(p).name) for p in args.pdf]
    else:
        todo = [(d.path, d.name) for d in documents()]
    rows = []
    for path, name in todo:
        rows.append(pdf_offsets(path, name, args.dpi))
        print(f"{name}: median {rows[-1].median:.2f} px (ink {rows[-1].ink_median:.2f}) over {len(rows[-1].font)} words"
              f"{' (inherited box)' if rows[-1].inherited else ''}", flush=True)
    text = table(rows)
    print(text)
    print(f"{len(rows)} PDFs in {time.perf_counter() - t0:.0f} s")
    if args.out:
        head = (f"# Word boxes against poppler's `pdftotext -bbox`\n\n`python benchmarks/pdf_boxes.py"
                f"{'' if args.dpi == DPI else f' --dpi {args.dpi:g}'}{' --letter-geometry' if args.letter_geometry else ''} --out {args.out}`: every corpus PDF, "
                f"its first, middle and last page, word centres at {args.dpi:g} dpi "
                f"(pypdfium2 {pdfium.PYPDFIUM_INFO}, {subprocess.run(['pdftotext', '-v'], capture_output=True, text=True).stderr.splitlines()[0]}).\n\n")
        args.out.write_text(head + text)


if __name__ == "__main__":
    main()
