"""The words whose font box is not PDFium's own: on every corpus PDF, did each come nearer poppler's box or not.

    python benchmarks/pdf_font_box.py --out benchmarks/results/pdf_font_box.md

:func:`arr_coc.documents.font_box.letter_metrics` replaces a font's ascent or descent where PDFium took it from
the font's bounding box (the descriptor declaring ``/Ascent 0 /Descent 0`` and the subset lacking the A or the g).
On the pages ``benchmarks/pdf_boxes.py`` compares (first, middle, last), every corpus PDF with such a font is
compared with poppler twice (:func:`benchmarks.pdf_boxes.pdf_offsets`): with the font boxes ``page_words(loose=True)``
draws, and with PDFium's own loose boxes (``font_box`` made the identity, the negative control). Per PDF: the fonts
and their metrics (em above the baseline), the words whose box moved, how many came nearer poppler's centre, and
the PDF's median centre offset both ways (px at 100 dpi).
"""
from __future__ import annotations

import argparse
import ctypes
import statistics
import time
from pathlib import Path

import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c
from pdf_boxes import DPI, pdf_offsets  # the sibling script: run as python benchmarks/pdf_font_box.py

from arr_coc.documents import pdf
from arr_coc.documents.corpus import documents
from arr_coc.documents.font_box import letter_metrics


def replaced_fonts(path: str) -> dict[str, tuple[tuple[float, float], tuple[float, float]]]:
    """Font name -> (PDFium's (ascent, descent), the font box's) em, for each font on the compared pages that
    :func:`letter_metrics` replaces."""
    out = {}
    doc = pdfium.PdfDocument(path)
    buf = ctypes.create_string_buffer(256)
    for index in sorted({0, len(doc) // 2, len(doc) - 1}):
        page = doc[index]
        tp = page.get_textpage()
        seen = set()
        for i in range(tp.count_chars()):
            obj = pdfium_c.FPDFText_GetTextObject(tp.raw, i)
            font = pdfium_c.FPDFTextObj_GetFont(obj) if obj else None
            key = ctypes.cast(font, ctypes.c_void_p).value if font else None
            if key is None or key in seen:
                continue
            seen.add(key)
            ours = letter_metrics(font)
            if ours is not None:
                pdfium_c.FPDFFont_GetBaseFontName(font, buf, 256)
                a, d = ctypes.c_float(), ctypes.c_float()
                pdfium_c.FPDFFont_GetAscent(font, ctypes.c_float(1.0), a)
                pdfium_c.FPDFFont_GetDescent(font, ctypes.c_float(1.0), d)
                out[buf.value.decode(errors="replace").split("+")[-1]] = ((a.value, d.value), ours)
        tp.close()
        page.close()
    doc.close()
    return out


def compare(path: str, name: str) -> dict:
    """One PDF's words matched with poppler's, with the font boxes and with PDFium's own."""
    ours = pdf_offsets(path, name, DPI)
    keep = pdf.font_box
    pdf.font_box = lambda textpage, i, loose, tight, fonts: loose
    try:
        own = pdf_offsets(path, name, DPI)
    finally:
        pdf.font_box = keep
    moved = [(a, b) for a, b in zip(own.distances(own.font), ours.distances(ours.font)) if abs(a - b) > 1e-9]
    return {"moved": moved, "own_median": own.median, "median": ours.median}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="write the table here (markdown)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    rows = []
    for doc in documents():
        fonts = replaced_fonts(doc.path)
        if fonts:
            rows.append((doc.name, fonts, compare(doc.path, doc.name)))
            print(doc.name, {k: v[1] for k, v in fonts.items()}, flush=True)
    moved = [m for _, _, r in rows for m in r["moved"]]
    nearer = sum(b < a for a, b in moved)
    lines = [f"{len(rows)} of {len(documents())} corpus PDFs have a font whose box PDFium drew from its bounding box; "
             f"{len(moved)} words moved, {nearer} nearer poppler's centre, {len(moved) - nearer} further; their mean "
             f"offset {statistics.mean(a for a, _ in moved):.2f} px with PDFium's own boxes, "
             f"{statistics.mean(b for _, b in moved):.2f} px with the font boxes.", "",
             "| PDF | fonts: PDFium's own -> font box ascent / descent (em) | words moved | nearer poppler | further | "
             "their mean offset (px): own -> font box | PDF median (px): own -> font box |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, fonts, r in rows:
        f = "; ".join(f"{k} {a:.3f} / {d:.3f} -> {oa:.3f} / {od:.3f}" for k, ((a, d), (oa, od)) in fonts.items())
        m = r["moved"]
        near = sum(b < a for a, b in m)
        means = (f"{statistics.mean(a for a, _ in m):.2f} -> {statistics.mean(b for _, b in m):.2f}" if m else "-")
        lines.append(f"| {name} | {f} | {len(m)} | {near} | {len(m) - near} | {means} | "
                     f"{r['own_median']:.2f} -> {r['median']:.2f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    print(f"{len(rows)} PDFs in {time.perf_counter() - t0:.0f} s")
    if args.out:
        args.out.write_text(f"# Font boxes from the letters against PDFium's own, both against poppler\n\n"
                            f"`python benchmarks/pdf_font_box.py --out {args.out}` (pypdfium2 {pdfium.PYPDFIUM_INFO}), "
                            f"first, middle and last page of each PDF, word centres at {DPI:g} dpi.\n\n" + text)


if __name__ == "__main__":
    main()
