"""Split groups: images that must fall on one side of a split (one company's receipts, one form's template).

A hash of the image id keeps every question of an image together, but two receipts of one shop or
two copies of one form template are near-identical, and splitting them tests on what was trained on.
A loader names each record's group (``Record.group``); :func:`arr_coc.data.datasets.split_of` then
hashes the group instead of the image. Groups are made by linking items whose keys are alike and
taking connected components, so "alike" need not be transitive in the data to be so in the split.
"""
from __future__ import annotations

import itertools
import re
from typing import Callable, Mapping

from rapidfuzz import fuzz

# printed template text two forms share, as a share of the labels either has (Jaccard): at 0.5 and
# above the FUNSD pairs are the same form filled in twice; below it they merely share words like "DATE:"
FORM_LABEL_OVERLAP = 0.5
COMPANY_SIMILARITY = 90  # rapidfuzz ratio of normalised names: "RSTORAN WAN SHENG" is "RESTORAN WAN SHENG"
# what a company name says about its legal form or branch rather than about who the company is
_COMPANY_NOISE = re.compile(r"\([^)]*\)|\b(?:SDN\.?\s*BHD|BHD|S/B|SB|CO|COMPANY|ENTERPRISE|TRADING)\b\.?")


def linked_groups(keys: Mapping[str, object], alike: Callable[[object, object], bool]) -> dict[str, str]:
    """Each item's group: the connected components of the "alike" graph, named by their smallest item.

    Args:
        keys: item id -> what is compared (a name, a set of labels).
        alike: whether two keys belong together; only needs to be symmetric.

    Example:
        >>> linked_groups({"a": 1, "b": 2, "c": 3, "d": 9}, lambda x, y: abs(x - y) <= 1)
        {'a': 'a', 'b': 'a', 'c': 'a', 'd': 'd'}
    """
    parent = {k: k for k in keys}

    def root(k: str) -> str:
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    for a, b in itertools.combinations(sorted(keys), 2):
        if alike(keys[a], keys[b]):
            ra, rb = root(a), root(b)
            parent[max(ra, rb)] = min(ra, rb)  # the smaller id names the group: independent of input order
    return {k: root(k) for k in keys}


def company_key(name: str) -> str:
    """A receipt's company as compared across receipts: upper-case alphanumerics without legal form or branch.

    Example:
        >>> company_key("MR. D.I.Y. (KUCHAI) SDN BHD"), company_key("MR D.I.Y. (JOHOR) SDN BHD")
        ('MRDIY', 'MRDIY')
    """
    return re.sub(r"[^0-9A-Z]", "", _COMPANY_NOISE.sub(" ", name.upper()))


def company_groups(companies: Mapping[str, str]) -> dict[str, str]:
    """Receipts by company: receipt id -> group, joining names equal or alike after :func:`company_key`.

    Example:
        >>> company_groups({"1": "RESTORAN WAN SHENG", "2": "RSTORAN WAN SHENG", "3": "AEON CO. (M) BHD"})
        {'1': 'company:1', '2': 'company:1', '3': 'company:3'}
    """
    keys = {k: company_key(v) for k, v in companies.items()}
    groups = linked_groups(keys, lambda a, b: a == b or fuzz.ratio(a, b) >= COMPANY_SIMILARITY)
    return {k: f"company:{g}" for k, g in groups.items()}


def form_labels(texts: list[str]) -> frozenset[str]:
    """A form's printed template text: its label entities normalised, those of 3+ characters (":" and "NO" say nothing)."""
    return frozenset(t for t in (re.sub(r"[^0-9A-Z]", "", s.upper()) for s in texts) if len(t) >= 3)


def template_groups(labels: Mapping[str, frozenset[str]]) -> dict[str, str]:
    """Forms by template: form id -> group, joining forms whose labels overlap by ``FORM_LABEL_OVERLAP`` or more.

    Example:
        >>> a, b = frozenset({"DATE", "NAME", "PHONE"}), frozenset({"DATE", "NAME", "PHONE", "FAX"})
        >>> template_groups({"x": a, "y": b, "z": frozenset({"DATE", "BRAND"})})
        {'x': 'template:x', 'y': 'template:x', 'z': 'template:z'}
    """
    def alike(a: frozenset[str], b: frozenset[str]) -> bool:
        return bool(a and b) and len(a & b) / len(a | b) >= FORM_LABEL_OVERLAP

    return {k: f"template:{g}" for k, g in linked_groups(labels, alike).items()}
