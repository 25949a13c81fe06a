"""The offline corpus of real PDFs: the LaTeX manuals of two Debian packages, split by document.

``texlive-latex-base-doc`` and ``texlive-latex-recommended-doc`` (installed by ``make setup``)
hold a few hundred born-digital manuals under /usr/share/doc/texlive-doc: typeset prose,
numbered sections, code listings, tables, with a text layer. The PDFs are the ones dpkg lists for
the two packages (so files other packages put in the same folder do not drift in).

A document is kept when its text layer is usable: on its first, middle and last page together
PDFium reads at least ``MIN_WORDS`` words, letters make at least ``MIN_LETTERS`` of the visible
characters, and unmapped glyphs (U+FFFD, private use) at most ``MAX_UNMAPPED`` of them - logos and
figures without text, or fonts without a Unicode map, drop out.

Splits are by document family, so that a manual and its code listing, or the 37 issues of one
newsletter, which share wording and layout, never fall on two sides. A family is the folder under
the doc root plus the file name up to its first ``-`` or ``_`` without trailing digits
(``latex/base/ltnews07.pdf`` -> ``latex/base/ltnews``, ``lthooks-code.pdf`` and ``lthooks-doc.pdf``
-> ``latex/base/lthooks``). The family is hashed (SHA-256, stable across machines and runs) into
[0, 1): below 0.2 is test, below 0.3 validation, the rest train (about 20 / 10 / 70 % of the
families). Documents of different families can still share a document class (many packages by
one author use one style), so "unseen layout" means an unseen document, not an unseen class.
"""
from __future__ import annotations

import hashlib
import os
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence, Union

from arr_coc.documents.pdf import open_pdf
from arr_coc.errors import MissingDependencyError

DOC_ROOT = Path("/usr/share/doc/texlive-doc")
PACKAGES = ("texlive-latex-base-doc", "texlive-latex-recommended-doc")
DPKG_INFO = Path("/var/lib/dpkg/info")
SPLITS = {"test": 0.2, "val": 0.1, "train": 0.7}  # shares of document families
# A usable text layer (see the module docstring); set from a scan of the two packages, where
# these drop the logo PDFs and figure-only samples and keep every manual.
MIN_WORDS = 100
MIN_LETTERS = 0.4
MAX_UNMAPPED = 0.01


@dataclass(frozen=True)
class Document:
    """One PDF of the corpus.

    Attributes:
        path: the file.
        name: its path under the doc root, e.g. ``latex/float/float.pdf``.
        family: the folder it sits in under the doc root (the unit of the split).
        split: ``train``, ``val`` or ``test``.
        n_pages: its page count.
    """

    path: str
    name: str
    family: str
    split: str
    n_pages: int


def family_of(name: str) -> str:
    """The family of a document named by its path under the doc root (see the module docstring).

    >>> family_of("latex/base/ltnews07.pdf"), family_of("latex/base/lthooks-code.pdf"), family_of("x.pdf")
    ('latex/base/ltnews', 'latex/base/lthooks', 'x')
    """
    folder, _, file = name.rpartition("/")
    stem = re.split(r"[-_]", file.rsplit(".", 1)[0], maxsplit=1)[0]
    stem = stem.rstrip("0123456789") or stem
    return f"{folder}/{stem}" if folder else stem


def split_of(family: str) -> str:
    """The split of a document family: a stable hash of its name, cut at the ``SPLITS`` shares.

    >>> split_of("latex/float") == split_of("latex/float")
    True
    >>> sorted({split_of(f"f{i}") for i in range(50)})
    ['test', 'train', 'val']
    """
    u = int(hashlib.sha256(family.encode("utf-8")).hexdigest()[:12], 16) / 16**12
    if u < SPLITS["test"]:
        return "test"
    if u < SPLITS["test"] + SPLITS["val"]:
        return "val"
    return "train"


def listed_pdfs(packages: Sequence[str] = PACKAGES, info: Path = DPKG_INFO) -> list[Path]:
    """The PDFs dpkg lists for the packages, sorted; raises if a package is not installed."""
    out: set[Path] = set()
    for pkg in packages:
        listing = info / f"{pkg}.list"
        if not listing.is_file():
            raise MissingDependencyError(
                f"the document corpus needs the Debian package {pkg}; run `make setup` "
                f"(or apt-get install {' '.join(packages)})"
            )
        for line in listing.read_text(encoding="utf-8").splitlines():
            if line.endswith(".pdf") and Path(line).is_file():
                out.add(Path(line))
    return sorted(out)


def text_layer_stats(path: Union[str, os.PathLike]) -> tuple[int, int, float, float]:
    """(pages, words, letter share, unmapped share) of the text on the first, middle and last page."""
    doc = open_pdf(path)
    try:
        n = len(doc)
        text = ""
        for i in sorted({0, n // 2, n - 1}):
            page = doc[i]
            tp = page.get_textpage()
            text += tp.get_text_range() + "\n"
            tp.close()
            page.close()
    finally:
        doc.close()
    visible = [c for c in text if not c.isspace()]
    letters = sum(c.isalpha() for c in visible)
    unmapped = sum(c == "\ufffd" or unicodedata.category(c) in ("Co", "Cn") for c in visible)
    return n, len(text.split()), letters / max(1, len(visible)), unmapped / max(1, len(visible))


def usable(words: int, letters: float, unmapped: float) -> bool:
    """Whether a text layer with these statistics is kept.

    >>> usable(2000, 0.7, 0.0), usable(0, 0.0, 0.0), usable(500, 0.7, 0.05)
    (True, False, False)
    """
    return words >= MIN_WORDS and letters >= MIN_LETTERS and unmapped <= MAX_UNMAPPED


def documents(paths: Iterable[Union[str, os.PathLike]] | None = None, root: Path = DOC_ROOT,
              split: str | None = None) -> list[Document]:
    """The corpus: every listed PDF with a usable text layer, with its family, split and page count.

    Args:
        paths: the PDFs to consider; default: those dpkg lists for ``PACKAGES``.
        root: the folder names and families are taken relative to.
        split: keep only this split (``train``, ``val``, ``test``); None keeps all.
    """
    if split is not None and split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
    out = []
    for p in (listed_pdfs() if paths is None else [Path(p) for p in paths]):
        rel = p.relative_to(root) if p.is_relative_to(root) else Path(p.name)
        family = family_of(rel.as_posix())
        s = split_of(family)
        if split is not None and s != split:
            continue
        n, words, letters, unmapped = text_layer_stats(p)
        if usable(words, letters, unmapped):
            out.append(Document(str(p), rel.as_posix(), family, s, n))
    return out


def summary(docs: Sequence[Document]) -> dict[str, dict[str, int]]:
    """Per split: documents, families and pages.

    >>> summary([Document("a.pdf", "x/a.pdf", "x", "test", 3), Document("b.pdf", "x/b.pdf", "x", "test", 2)])["test"]
    {'documents': 2, 'families': 1, 'pages': 5}
    """
    out = {}
    for s in SPLITS:
        ds = [d for d in docs if d.split == s]
        out[s] = {"documents": len(ds), "families": len({d.family for d in ds}), "pages": sum(d.n_pages for d in ds)}
    return out
