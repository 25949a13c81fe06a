"""Where the commands write their files: under ``out/`` in the current folder unless ``--out`` says otherwise.

One folder for every command (``look``'s pictures, ``eval``'s rows and reports in ``out/eval``,
``train``'s run in ``out/train``), never beside the input: a bundled example or a shared document may
sit in a folder the user cannot or should not write to.
"""
from __future__ import annotations

from pathlib import Path

OUT = Path("out")  # relative: the folder the command runs in


def picture(source: str | Path, suffix: str) -> Path:
    """The default picture of a command on ``source``: ``out/<source's stem><suffix>.png``.

    >>> picture("/data/scans/receipt.jpg", "_arr").as_posix()
    'out/receipt_arr.png'
    """
    return OUT / f"{Path(source).stem}{suffix}.png"
