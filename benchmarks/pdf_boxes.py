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
"""
from __future__ import annotations

import argparse
import difflib
import html
import re
import shutil
import statistics
import subprocess
import sys
import time
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import pypdfium2 as pdfium

from arr_coc.documents.corpus import documents
from arr_coc.documents.pdf import open_pdf, page_words, read_pdf

DPI = 100.0
GOAL_PX = 2.0  # the bound each PDF's median must meet
_WORD = re.compile(r'<word xMin="([-\d.]+)" yMin="([-\d.]+)" xMax="([-\d.]+)" yMax="([-\d.]+)">(.*?)</word>')


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


def poppler_words(path: str, page: int) -> list[tuple[str, tuple[float, float]]]:
    """(text, (y, x) centre in display points) of each word poppler reads on the 0-based page."""
    if shutil.which("pdftotext") is None:
        sys.exit("pdftotext not found: apt-get install poppler-utils (make setup installs it)")
    out = subprocess.run(["pdftotext", "-q", "-bbox", "-cropbox", "-f", str(page + 1), "-l", str(page + 1),
                          path, "-"], capture_output=True, text=True, check=True).stdout
    return [(html.unescape(t), ((float(y0) + float(y1)) / 2, (float(x0) + float(x1)) / 2))
            for x0, y0, x1, y1, t in _WORD.findall(out)]


def _fold(text: str) -> str:
    return unicodedata.normalize("NFKC", text)


def matched_offsets(ours: list[tuple[str, tuple[float, float]]],
                    theirs: list[tuple[str, tuple[float, float]]]) -> Pairs:
    """(dy, dx) between the centres of every pair of words in an equal run of the two reading-order lists.

    >>> matched_offsets([("a", (0, 0)), ("b", (3, 4)), ("x", (0, 0))], [("a", (0, 0)), ("b", (0, 0)), ("c", (9, 9))])
    [(0, 0), (3, 4)]
    """
    sm = difflib.SequenceMatcher(None, [_fold(t) for t, _ in ours], [_fold(t) for t, _ in theirs], autojunk=False)
    out = []
    for block in sm.get_matching_blocks():
        for k in range(block.size):
            (ya, xa), (yb, xb) = ours[block.a + k][1], theirs[block.b + k][1]
            out.append((ya - yb, xa - xb))
    return out


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
    """The first, middle and last page of one PDF compared with poppler, font and ink boxes."""
    doc = open_pdf(path)
    n = len(doc)
    ctx = read_pdf(path, pages=sorted({0, n // 2, n - 1}), dpi=dpi, render=False)
    font: Pairs = []
    ink: Pairs = []
    words = 0
    for page in ctx.pages:
        pdf_page = doc[page.index]
        (h, w), (dw, dh) = page.size, pdf_page.get_size()  # px and display points: read_pdf's scale
        loose, _, _ = page_words(pdf_page, (h / dh, w / dw), loose=True)
        pdf_page.close()
        theirs = [(t, (y * h / dh, x * w / dw)) for t, (y, x) in poppler_words(path, page.index)]
        font += matched_offsets(_centres(loose), theirs)
        ink += matched_offsets(_centres(page.words), theirs)
        words += len(page.words)
    doc.close()
    return PdfOffsets(name, inherited_box(path), words, font, ink)


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
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pdf", nargs="*", help="PDFs to compare instead of the corpus")
    ap.add_argument("--dpi", type=float, default=DPI)
    ap.add_argument("--out", type=Path, help="write the tables here (markdown)")
    ap.add_argument("--letter-geometry", action="store_true",
                    help="the negative control: page boxes from pypdfium2's get_cropbox() (US Letter where inherited)")
    args = ap.parse_args(argv)
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
