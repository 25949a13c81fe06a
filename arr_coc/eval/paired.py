"""Paired tables over contexts: each method's readings as a share of full resolution's on the same questions.

A method's mean reading means little beside full resolution's over *other* questions (a hard question left out of
one mean moves it by points). :func:`paired_summary` pairs every row of a method with the ``full`` row of the same
question and takes, per (dataset, budget, method): both readings (``reading``: the region reading, ``reading_find``:
the find reading, :mod:`arr_coc.eval.context_run`) with their 95 % bootstrap intervals, each as a share of full's
on the same questions with the paired bootstrap interval of the ratio (:func:`arr_coc.eval.intervals.bootstrap_ratio`),
and the means of the page hit, the strict page hit and the coverage. :func:`paired_table` and :func:`kind_table`
write them as markdown.
"""
from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Sequence

from arr_coc.eval.context_methods import CONTEXT_METHODS
from arr_coc.eval.intervals import bootstrap_mean, bootstrap_ratio
from arr_coc.eval.report import fmt, fmt_ci

READINGS = ("reading", "reading_find")
MEANS = ("page_hit", "page_hit_strict", "coverage")


def _ok(v: Any) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v))


def mean_present(values: Sequence[Any]) -> float:
    """The mean of the values that are there (None and NaN left out: a strict hit is blank where the answer has no
    box); NaN where none is."""
    vals = [v for v in values if _ok(v)]
    return sum(vals) / len(vals) if vals else float("nan")


def budget_order(budget: str) -> float:
    """Where a budget label sorts: compressions by their ratio, then counts, then shares.

    >>> sorted(["20x", "5x", "10x"], key=budget_order)
    ['5x', '10x', '20x']
    """
    if budget.endswith("x"):
        return float(budget[:-1])
    return 1e9 + float(budget[:-1]) if budget.endswith("%") else 2e9 + float(budget)


def paired_summary(rows: Sequence[dict], methods: Sequence[str] = CONTEXT_METHODS) -> list[dict]:
    """Per (dataset, budget, method) other than ``full``: both readings, each as a share of full's on the same
    questions (the ``<reading>_share`` keys, with ``_lo`` / ``_hi``), and the hit and coverage means.

    A question counts in a reading's share when both its row and its ``full`` row hold that reading.

    >>> rows = [{"dataset": "d", "record_id": q, "method": m, "budget": b, "tokens": t, "compression": c,
    ...          "reading": r, "reading_find": r, "page_hit": 1.0, "page_hit_strict": 1.0, "coverage": 1.0}
    ...         for q, m, b, t, c, r in (("a", "full", "full", 100, 1, 0.8), ("b", "full", "full", 100, 1, 0.4),
    ...                                  ("a", "coc", "10x", 10, 10, 0.4), ("b", "coc", "10x", 10, 10, 0.2))]
    >>> s = paired_summary(rows)[0]
    >>> s["method"], s["n"], round(s["reading"], 3), round(s["reading_full"], 3), s["reading_share"]
    ('coc', 2, 0.3, 0.6, 0.5)
    >>> s["reading_share_lo"], s["reading_share_hi"]  # each question's share is 0.5: no resample moves it
    (0.5, 0.5)
    """
    full = {(r["dataset"], r["record_id"]): r for r in rows if r["method"] == "full"}
    groups: dict[tuple[str, str, str], list[dict]] = defaultdict(list)
    for r in rows:
        if r["method"] != "full":
            groups[(r["dataset"], r["budget"], r["method"])].append(r)
    order = list(methods)

    def key(k: tuple[str, str, str]) -> tuple:
        return k[0], budget_order(k[1]), order.index(k[2]) if k[2] in order else len(order), k[2]

    out = []
    for k in sorted(groups, key=key):
        g = groups[k]
        s: dict[str, Any] = {"dataset": k[0], "budget": k[1], "method": k[2], "n": len(g),
                             "tokens": mean_present([r["tokens"] for r in g]),
                             "compression": mean_present([r.get("compression") for r in g])}
        for col in READINGS:
            pairs = [(r.get(col), full[(r["dataset"], r["record_id"])].get(col)) for r in g
                     if (r["dataset"], r["record_id"]) in full]
            pairs = [(a, b) for a, b in pairs if _ok(a) and _ok(b)]
            mine, ref = [a for a, _ in pairs], [b for _, b in pairs]
            s[col], (s[f"{col}_lo"], s[f"{col}_hi"]) = mean_present(mine), bootstrap_mean(mine)
            s[f"{col}_full"], s[f"{col}_pairs"] = mean_present(ref), len(pairs)
            share = s[col] / s[f"{col}_full"] if pairs and s[f"{col}_full"] > 0 else float("nan")
            s[f"{col}_share"], (s[f"{col}_share_lo"], s[f"{col}_share_hi"]) = share, bootstrap_ratio(mine, ref)
        for col in MEANS:
            s[col] = mean_present([r.get(col) for r in g])
        out.append(s)
    return out


def paired_kinds(rows: Sequence[dict], methods: Sequence[str] = CONTEXT_METHODS) -> list[dict]:
    """:func:`paired_summary` over every row (``kind`` "all"), then over each question kind's rows."""
    out = [{"kind": "all", **s} for s in paired_summary(rows, methods)]
    for kind in sorted({r.get("kind") or "" for r in rows}):
        out += [{"kind": kind, **s} for s in paired_summary([r for r in rows if (r.get("kind") or "") == kind],
                                                            methods)]
    return out


def paired_table(summary: Sequence[dict]) -> str:
    """One line per (budget, method): tokens, both readings and their shares of full's (95 % intervals), hits.

    >>> s = {"budget": "10x", "method": "coc", "n": 2, "tokens": 10.0, "compression": 10.0, "reading": 0.3,
    ...      "reading_lo": 0.2, "reading_hi": 0.4, "reading_share": 0.5, "reading_share_lo": 0.4,
    ...      "reading_share_hi": 0.6, "reading_find": 0.3, "reading_find_lo": float("nan"),
    ...      "reading_find_hi": float("nan"), "reading_find_share": float("nan"), "page_hit": 1.0,
    ...      "page_hit_strict": 0.5, "coverage": 0.25}
    >>> print(paired_table([s]).splitlines()[-1])
    | 10x | coc | 2 | 10 | 10.0x | 0.300 [0.200, 0.400] | 50% [40%, 60%] | 0.300 | — | 100% | 50% | 25% |
    """
    lines = ["| budget | method | n | tokens sent | compression | reading (region) | region / full "
             "| reading (find) | find / full | page hit | strict hit | coverage |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for s in summary:
        lines.append(f"| {s['budget']} | {s['method']} | {s['n']} | {s['tokens']:.0f} | {s['compression']:.1f}x | "
                     f"{fmt_ci(s, 'reading')} | {fmt_ci(s, 'reading_share', True)} | {fmt_ci(s, 'reading_find')} | "
                     f"{fmt_ci(s, 'reading_find_share', True)} | {fmt(s['page_hit'], True)} | "
                     f"{fmt(s['page_hit_strict'], True)} | {fmt(s['coverage'], True)} |")
    return "\n".join(lines)


def kind_table(every: Sequence[dict]) -> str:
    """Per question kind and method, at every budget: the region and the find reading as shares of full's
    (``region / find``), from :func:`paired_kinds`.

    >>> every = [{"kind": k, "method": "coc", "budget": "10x", "n": n, "reading_share": r, "reading_find_share": f,
    ...           "reading_full": 0.8, "reading_find_full": 0.9} for k, n, r, f in (("all", 4, 0.5, 0.25),
    ...                                                                            ("name", 1, 1.0, float("nan")))]
    >>> print(kind_table(every))
    | kind (n) | full: region / find | method | 10x |
    |---|---:|---|---:|
    | all (4) | 0.800 / 0.900 | coc | 50% / 25% |
    | name (1) | 0.800 / 0.900 | coc | 100% / — |
    """
    budgets = sorted({s["budget"] for s in every}, key=budget_order)
    cell = {(s["kind"], s["method"], s["budget"]): s for s in every}
    pairs = list(dict.fromkeys((s["kind"], s["method"]) for s in every))
    lines = ["| kind (n) | full: region / find | method | " + " | ".join(budgets) + " |",
             "|---|---:|---|" + "---:|" * len(budgets)]
    for kind, method in pairs:
        got = [cell[(kind, method, b)] for b in budgets if (kind, method, b) in cell]
        ref = f"{fmt(got[0]['reading_full'])} / {fmt(got[0]['reading_find_full'])}"
        lines.append(f"| {kind} ({max(s['n'] for s in got)}) | {ref} | {method} | " + " | ".join(
            f"{fmt(c['reading_share'], True)} / {fmt(c['reading_find_share'], True)}"
            if (c := cell.get((kind, method, b))) else "" for b in budgets) + " |")
    return "\n".join(lines)


COVERED = ("whole", "part", "none", "no box")  # the loss table's parts (:func:`covered_part`), in its order


def covered_part(coverage: Any) -> str:
    """Which part of the loss table a row's ``coverage`` (the share of the answer's area in full-resolution cells)
    falls in: all of it, part, none, or no box (None: the answer has no box on its page).

    >>> [covered_part(c) for c in (1.0, 0.5, 0.0, None)]
    ['whole', 'part', 'none', 'no box']
    """
    if not _ok(coverage):
        return "no box"
    c = float(coverage)
    return "whole" if c >= 1 - 1e-6 else "part" if c > 0 else "none"


def where_lost(rows: Sequence[dict], method: str = "coc") -> list[dict]:
    """Where ``method``'s readings fall short of full's: per budget and reading, its questions split by how much of
    the answer's area its full-resolution cells hold (:func:`covered_part`: whole, part, none, or no box: ``coverage``
    is None where the answer has no box on its page), each part's points of full's reading lost, sum over its questions
    of (full's - the method's) / the sum of full's over all of them; the parts add up to 100 x (1 - the share of
    :func:`paired_summary`).

    >>> rows = [{"dataset": "d", "record_id": q, "method": m, "budget": b, "reading": r, "reading_find": r,
    ...          "coverage": c} for q, m, b, r, c in (("a", "full", "full", 1.0, 1.0), ("b", "full", "full", 1.0, 1.0),
    ...                                              ("a", "coc", "10x", 1.0, 1.0), ("b", "coc", "10x", 0.5, 0.0))]
    >>> [(s["covered"], s["n"], s["lost"]) for s in where_lost(rows) if s["reading"] == "reading"]
    [('whole', 1, 0.0), ('none', 1, 25.0)]
    """
    full = {(r["dataset"], r["record_id"]): r for r in rows if r["method"] == "full"}
    out = []
    for budget in sorted({r["budget"] for r in rows if r["method"] == method}, key=budget_order):
        mine = [r for r in rows if r["method"] == method and r["budget"] == budget]
        for col in READINGS:
            pairs = [(r, full[k][col]) for r in mine if (k := (r["dataset"], r["record_id"])) in full
                     and _ok(r.get(col)) and _ok(full[k].get(col))]
            total = sum(ref for _, ref in pairs)
            for name in COVERED:
                part = [(r[col], ref) for r, ref in pairs if covered_part(r.get("coverage")) == name]
                if part:
                    lost = 100 * sum(ref - got for got, ref in part) / total if total > 0 else float("nan")
                    out.append({"budget": budget, "method": method, "reading": col, "covered": name, "n": len(part),
                                "lost": lost})
    return out


def loss_table(lost: Sequence[dict]) -> str:
    """:func:`where_lost` as markdown: a line per budget and coverage, the points of full's region and find reading
    lost there.

    >>> print(loss_table([{"budget": "10x", "method": "coc", "reading": r, "covered": "none", "n": 3, "lost": 12.5}
    ...                   for r in READINGS]))
    | budget | the answer's area in full-resolution cells | questions | region: points of full's lost | find: points lost |
    |---|---|---:|---:|---:|
    | 10x | none | 3 | 12.5 | 12.5 |
    """
    cell = {(s["budget"], s["covered"], s["reading"]): s for s in lost}
    lines = ["| budget | the answer's area in full-resolution cells | questions | region: points of full's lost "
             "| find: points lost |", "|---|---|---:|---:|---:|"]
    for budget, covered in dict.fromkeys((s["budget"], s["covered"]) for s in lost):
        region, find = cell.get((budget, covered, "reading")), cell.get((budget, covered, "reading_find"))
        n = max(s["n"] for s in (region, find) if s)
        lines.append(f"| {budget} | {covered} | {n} | " + " | ".join(
            f"{s['lost']:.1f}" if s else "—" for s in (region, find)) + " |")
    return "\n".join(lines)
