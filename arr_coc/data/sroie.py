"""SROIE receipts: company, date, address and total, with answer boxes recovered from the OCR lines."""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence

from rapidfuzz import fuzz

from arr_coc.data.boxes import Box, clip_boxes
from arr_coc.data.datasets import DatasetSpec, Record, register
from arr_coc.data.groups import company_groups
from arr_coc.data.loading import dataset_root, finish, image_wh, read_json, subfolder

SROIE_QUESTIONS = {"company": "What is the company name?", "date": "What is the date?",
                   "address": "What is the address?", "total": "What is the total?"}
SROIE_MAX_RUN = 6  # an address or company name spans at most ~4 OCR lines; 6 leaves slack
SROIE_MIN_SIMILARITY = 0.8  # below this the best run is usually a different field; skip rather than guess


@dataclass
class SroieReport:
    """How the SROIE answer boxes were recovered: pass one to :func:`load_sroie` to fill it."""

    exact: int = 0  # some line contains the whole value
    fuzzy: int = 0  # best run of consecutive lines with similarity >= SROIE_MIN_SIMILARITY
    skipped: list[str] = field(default_factory=list)  # record ids with no acceptable match

    def summary(self) -> str:
        return f"SROIE boxes: {self.exact} exact, {self.fuzzy} fuzzy, {len(self.skipped)} skipped"


def normalise(text: str) -> str:
    """Upper-case alphanumerics only: how SROIE keys are compared with OCR transcripts.

    Example:
        >>> normalise("No.53, Jalan Sagu 18 ")
        'NO53JALANSAGU18'
    """
    return re.sub(r"[^0-9A-Z]", "", text.upper())


def read_sroie_lines(path: Path) -> list[tuple[Box, str]]:
    """Lines of a SROIE ``box/NNN.csv`` (``x1,y1,...,x4,y4,transcript``) as (bounding box, transcript).

    Example:
        >>> import tempfile; p = Path(tempfile.mkdtemp()) / "0.csv"
        >>> _ = p.write_text("10,5,90,5,90,25,10,25,TOTAL, RM 9.00\\n")
        >>> read_sroie_lines(p)
        [((5.0, 10.0, 25.0, 90.0), 'TOTAL, RM 9.00')]
    """
    lines = []
    for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        m = re.fullmatch(r"((?:\s*-?[\d.]+\s*,){8})(.*)", line)
        if not m:
            raise ValueError(f"{path}:{n}: expected x1,y1,x2,y2,x3,y3,x4,y4,transcript, got {line[:60]!r}")
        xy = [float(v) for v in m[1].split(",")[:8]]
        lines.append(((min(xy[1::2]), min(xy[0::2]), max(xy[1::2]), max(xy[0::2])), m[2].strip()))
    return lines


def _contains(line: str, value: str) -> bool:
    """Normalised ``value`` in raw ``line`` without eating into a longer number: 9.00 is not in 19.00.

    The digit boundary is checked on the raw text, so "25/12/2018 8:13" still holds the date 25/12/2018.
    """
    norm, where = "", []  # where[i]: index in ``line`` of the i-th normalised character
    for i, ch in enumerate(line):
        kept = normalise(ch)
        norm += kept
        where += [i] * len(kept)
    for m in re.finditer(re.escape(value), norm):
        start, end = where[m.start()], where[m.end() - 1]
        before, after = line[start - 1 : start] if start else "", line[end + 1 : end + 2]
        if not (value[0].isdigit() and before.isdigit()) and not (value[-1].isdigit() and after.isdigit()):
            return True
    return False


def match_sroie_value(value: str, lines: Sequence[tuple[Box, str]]) -> tuple[str, tuple[Box, ...]]:
    """Recover the boxes of a key value from the OCR lines: ``("exact" | "fuzzy" | "none", boxes)``.

    Every line whose normalised transcript contains the whole normalised value; else the run of up to
    ``SROIE_MAX_RUN`` consecutive lines most similar to the value (rapidfuzz ratio >= 0.8).

    Example:
        >>> lines = [((0, 0, 10, 50), "NO.53, JALAN SAGU 18,"), ((10, 0, 20, 50), "TAMAN DAYA,"),
        ...          ((20, 0, 30, 50), "TOTAL 9.00"), ((30, 0, 40, 50), "SUBTOTAL 19.00")]
        >>> match_sroie_value("9.00", lines)  # not in 19.00
        ('exact', ((20, 0, 30, 50),))
        >>> match_sroie_value("NO.53 JALAN SAGU 18 TAMAN DAYA", lines)[0]
        'fuzzy'
    """
    target = normalise(value)
    if not target:
        return "none", ()
    norm = [normalise(t) for _, t in lines]
    exact = tuple(b for b, t in lines if _contains(t, target))
    if exact:
        return "exact", exact
    best, span = 0.0, (0, 0)
    for i in range(len(lines)):
        for j in range(i + 1, min(i + SROIE_MAX_RUN, len(lines)) + 1):
            score = fuzz.ratio("".join(norm[i:j]), target) / 100
            if score > best:
                best, span = score, (i, j)
    if best >= SROIE_MIN_SIMILARITY:
        return "fuzzy", tuple(b for b, _ in lines[span[0] : span[1]])
    return "none", ()


def load_sroie(root: Path | None = None, *, report: SroieReport | None = None) -> list[Record]:
    """SROIE receipts: company, date, address and total, with boxes recovered from the OCR lines.

    ``root`` holds ``img/``, ``box/`` and ``key/``. Records whose value matches no line well enough
    are skipped; pass a :class:`SroieReport` to learn how many matched exactly, fuzzily or not at all.
    A receipt's split group is its company (:func:`arr_coc.data.groups.company_groups`), so one
    shop's receipts never fall on both sides of a split.
    """
    root = dataset_root(SROIE, root)
    img_dir, box_dir, key_dir = (subfolder(SROIE.title, root, s) for s in ("img", "box", "key"))
    report = SroieReport() if report is None else report
    records, companies = [], {}
    for key in sorted(key_dir.glob("*.json")):
        values = read_json(key)
        if not isinstance(values, dict):
            raise ValueError(f"{key}: expected an object with company, date, address and total")
        csv, image = box_dir / f"{key.stem}.csv", img_dir / f"{key.stem}.jpg"
        if not csv.is_file():
            raise FileNotFoundError(f"{csv} not found (the OCR lines of {key.name})")
        size, lines = image_wh(image), read_sroie_lines(csv)
        companies[key.stem] = str(values.get("company") or "")
        for name, question in SROIE_QUESTIONS.items():
            value = str(values.get(name) or "").strip()
            if not normalise(value):
                continue
            rid = f"{key.stem}#{name}"
            how, boxes = match_sroie_value(value, lines)
            boxes = clip_boxes(boxes, size)
            if not boxes:
                report.skipped.append(rid)
                continue
            setattr(report, how, getattr(report, how) + 1)
            records.append(Record(SROIE.name, rid, image, key.stem, question, value, boxes, metric=SROIE.metric,
                                  kind=name))
    groups = company_groups(companies)
    return finish(SROIE.title, root, [replace(r, group=groups[r.image_id]) for r in records])


SROIE = register(DatasetSpec("sroie", "SROIE", load_sroie, folder="sroie"))
