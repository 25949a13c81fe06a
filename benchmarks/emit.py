"""What the benchmark scripts end with: print the report, and write it to ``--out`` when one is given."""
from __future__ import annotations

from pathlib import Path


def emit(text: str, out: Path | None) -> None:
    """Print ``text``; write it to ``out`` too (its folder made), where one is given."""
    print(text)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
