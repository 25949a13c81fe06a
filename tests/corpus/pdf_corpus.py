"""Small hostile PDFs written byte by byte: a page tree that names pages which do not load, pages of any size,
any page attribute (a /UserUnit), thousands of pages. Each is a few hundred bytes per page."""
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
