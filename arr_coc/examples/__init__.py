"""The bundled example images, found wherever the package is installed.

    >>> from arr_coc import examples
    >>> examples.path("receipt.jpg").name
    'receipt.jpg'
    >>> examples.names()
    ['form.jpg', 'photo.jpg', 'receipt.jpg']

They ship in the wheel as package data (the checkout's ``examples/*.jpg`` link to them), so code that
names ``examples.path("receipt.jpg")`` runs from any folder, where ``"examples/receipt.jpg"`` runs only
from the checkout's root. ``examples/make_*.py`` in the checkout draws them.
"""
from __future__ import annotations

from importlib import resources
from pathlib import Path

from arr_coc.registry import UnknownNameError

__all__ = ["names", "path"]

SUFFIXES = (".jpg", ".png", ".pdf", ".txt")


def names() -> list[str]:
    """The bundled files' names, sorted."""
    folder = resources.files(__name__)
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(SUFFIXES))


def path(name: str) -> Path:
    """The bundled file ``name`` (e.g. ``"receipt.jpg"``) as a path on disk; an unknown name lists the known ones."""
    if name not in names():
        raise UnknownNameError(f"no bundled example {name!r}; bundled: {', '.join(names())}")
    # a wheel installs package data as plain files, so the resource is a real path (not a zip member)
    return Path(str(resources.files(__name__) / name))
