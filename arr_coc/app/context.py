"""The microscope over a context: a PDF or several images -> one budget over the pages, the strip, one page opened.

The pages go through the same ARR the image view uses (shipped scorer, default channels, the
microscope's shared OCR cache), with :func:`arr_coc.contexts.allocate_context`: every page a small
gestalt, the saccades ranked over all pages. What the page shows: the totals with the text tokens
and the compression ratio, a table of pages (gestalt, saccades, where the text came from), the pages
as a strip, and the page the user opens at full size with its saccades outlined.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from arr_coc.app.service import Microscope, Settings, check_question, read_upload
from arr_coc.contexts import ContextAllocation, allocate_context
from arr_coc.contexts.inputs import is_pdf
from arr_coc.documents.pdf import DEFAULT_DPI
from arr_coc.viz import page_strip

MAX_APP_PAGES = 30  # one request on a shared CPU; `arr-coc look --max-pages` takes more
STRIP_HEIGHT = 240
PAGE_HEIGHT = 900


def run_context(scope: Microscope, paths: Sequence[str | Path], question: str | None, tokens: Any,
                pages: str | None = None, dpi: float = DEFAULT_DPI) -> ContextAllocation:
    """Allocate ``tokens`` over the uploaded PDF (``pages``: a 1-based range) or images, for ``question``."""
    q = check_question(question)
    if not paths:
        raise ValueError("upload a PDF or several images first")
    whole = isinstance(tokens, (int, float)) and not isinstance(tokens, bool) and float(tokens).is_integer()
    if not whole or tokens < 2:
        raise ValueError(f"the tokens T must be a whole number of at least 2 (a gestalt and a saccade), got {tokens}")
    pdfs = [p for p in paths if is_pdf(Path(p))]
    if pdfs and len(paths) > 1:
        raise ValueError("upload one PDF, or several images, not both")
    context = str(pdfs[0]) if pdfs else [read_upload(p) for p in paths]
    arr = scope.arr(Settings(cell=scope.cell))
    with torch.inference_mode():
        return allocate_context(arr, context, q, tokens=int(tokens), pages=(pages or None) if pdfs else None,
                                dpi=dpi, max_pages=MAX_APP_PAGES)


def context_summary(alloc: ContextAllocation) -> str:
    """Markdown: the totals, the compression ratio and a row per page."""
    ratio = ("no text found, so no compression ratio" if alloc.compression is None else
             f"{alloc.text_tokens} text tokens ({alloc.tokenizer}) -> **compression {alloc.compression:.1f}x**")
    lines = [f"**{len(alloc.pages)} pages**: sent **{alloc.tokens}** visual tokens = {alloc.gestalt_tokens} gestalt + "
             f"{alloc.saccades} saccades, of {alloc.full_tokens} at full resolution; {ratio}.", "",
             "| page | gestalt | saccades | text from |", "|---:|---:|---:|---|"]
    for p in alloc.pages:
        g = p.plan.gestalt
        lines.append(f"| {p.index + 1} | {g[0]}x{g[1]} | {p.saccades} | {p.text_from} |")
    return "\n".join(lines)


def strip(alloc: ContextAllocation, height: int = STRIP_HEIGHT) -> np.ndarray:
    """[height, W, 3] uint8: every page with its saccades outlined."""
    return page_strip([p.image for p in alloc.pages], [p.plan.cells for p in alloc.pages], alloc.pages[0].cell,
                      height)


def open_page(alloc: ContextAllocation, number: Any, height: int = PAGE_HEIGHT) -> np.ndarray:
    """[height, W, 3] uint8: page ``number`` (1-based, as listed) with its saccades outlined."""
    listed = [p.index + 1 for p in alloc.pages]
    if number not in listed:
        raise ValueError(f"page {number} is not in this context; open one of {listed[0]}-{listed[-1]}")
    p = alloc.pages[listed.index(number)]
    return page_strip([p.image], [p.plan.cells], p.cell, height)
