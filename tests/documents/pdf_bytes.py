"""Hand-written PDFs for the page tests: boxes and /Rotate on the page tree or the page, words in one font."""
from __future__ import annotations

from typing import Sequence

Drawn = tuple[str, float, float, float]  # text, x and y of the baseline's left end in points, font size
HELVETICA = b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>"


def pdf_bytes(words: list[Drawn], tree: str = "", page: str = "", font: bytes = HELVETICA,
              extra: Sequence[bytes] = (), content: bytes | None = None, resources: str = "") -> bytes:
    """A one-page PDF drawing ``words``, whose /Pages node carries ``tree`` and whose page carries ``page``.

    ``tree`` and ``page`` are raw dictionary entries, e.g. ``"/MediaBox [0 0 595 842] /Rotate 90"``: an
    entry on the tree and none on the page is inherited (PDF 1.7 section 7.7.3.4). ``font`` is the font
    dictionary (object 3) and ``extra`` the objects it refers to, numbered from 6 on. ``content``, given,
    is the page's content stream instead of the words' (e.g. text turned by its text matrix); ``resources``
    are raw entries added to the page's resources (e.g. ``"/XObject << /Fm1 8 0 R >>"``).
    """
    content = content if content is not None else b"".join(b"BT /F1 %g Tf %g %g Td (%s) Tj ET\n" % (s, x, y, t.encode("latin-1")) for t, x, y, s in words)
    objs = [b"<< /Type /Catalog /Pages 2 0 R >>",
            b"<< /Type /Pages /Kids [4 0 R] /Count 1 " + tree.encode() + b" >>",
            font,
            b"<< /Type /Page /Parent 2 0 R /Resources << /Font << /F1 3 0 R >> " + resources.encode()
            + b" >> /Contents 5 0 R "
            + page.encode() + b" >>",
            b"<< /Length %d >>\nstream\n" % len(content) + content + b"endstream", *extra]
    out, offsets = b"%PDF-1.7\n", []
    for i, o in enumerate(objs, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % i + o + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objs) + 1) + b"".join(b"%010d 00000 n \n" % o for o in offsets)
    return out + b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objs) + 1, xref)
