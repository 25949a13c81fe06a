"""PDFs for the context checks: hostile ones written byte by byte (a page tree that names pages which do not load, pages of any size,
any page attribute such as /UserUnit, thousands of pages: a few hundred bytes a page) and long A4 documents with a text layer."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

A4 = "0 0 595.28 841.89"


def raw_pdf(path: Path, pages: Sequence[tuple[str, str] | None], count: int | None = None) -> Path:
    """A PDF whose pages are ``(MediaBox, extra page attributes)``, each saying "Hello page" in Helvetica; a None
    kid points at an object that does not exist, and ``count`` is the /Count the page tree claims."""
    content = b"BT /F1 24 Tf 72 700 Td (Hello page) Tj ET"
    objs = {1: "<< /Type /Catalog /Pages 2 0 R >>", 3: "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
            4: f"<< /Length {len(content)} >>\nstream\n{content.decode()}\nendstream"}
    kids = []
    for p in pages:
        if p is None:
            kids.append("999999 0 R")
            continue
        n = len(objs) + 2  # objects 1, 3, 4 and then one per page from 5
        objs[n] = (f"<< /Type /Page /Parent 2 0 R /MediaBox [{p[0]}] /Resources << /Font << /F1 3 0 R >> >> "
                   f"/Contents 4 0 R {p[1]}>>")
        kids.append(f"{n} 0 R")
    objs[2] = f"<< /Type /Pages /Kids [{' '.join(kids)}] /Count {len(kids) if count is None else count} >>"
    out = bytearray(b"%PDF-1.7\n")
    offsets = {}
    for k in sorted(objs):
        offsets[k] = len(out)
        out += f"{k} 0 obj\n{objs[k]}\nendobj\n".encode()
    xref, top = len(out), max(objs)
    out += f"xref\n0 {top + 1}\n0000000000 65535 f \n".encode()
    for k in range(1, top + 1):
        out += (f"{offsets[k]:010d} 00000 n \n" if k in offsets else "0000000000 65535 f \n").encode()
    out += f"trailer\n<< /Size {top + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    path.write_bytes(bytes(out))
    return path


def text_pdf(path: Path, pages: int, size_in: tuple[float, float] = (8.27, 11.69)) -> Path:
    """A PDF of ``pages`` pages (A4 by default) with a text layer: a numbered section heading and 40 lines of
    seeded random words each (matplotlib, TrueType fonts embedded)."""
    import random

    import matplotlib
    from matplotlib.backends.backend_pdf import PdfPages
    from matplotlib.figure import Figure

    rng = random.Random(0)
    words = "harbour lantern copper meadow violet engine quiet marble falcon river orchard silver candle".split()
    with matplotlib.rc_context({"pdf.fonttype": 42}), PdfPages(path) as pdf:
        for i in range(pages):
            fig = Figure(figsize=size_in)
            fig.text(0.1, 0.93, f"Section {i + 1}", fontsize=16)
            for j in range(40):
                fig.text(0.1, 0.88 - j * 0.02, " ".join(rng.choice(words) for _ in range(9)), fontsize=10)
            pdf.savefig(fig)
    return path
