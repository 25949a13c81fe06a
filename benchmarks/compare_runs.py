"""Two runs of the same context questions side by side: what one change did, question by question.

    python benchmarks/compare_runs.py BEFORE/records.jsonl AFTER/records.jsonl --labels "no floor" "answer types" \\
        --methods coc equal_split --out results/....md

Each ``records.jsonl`` is a run of ``benchmarks/paraphrase_tables.py`` (or ``arr-coc eval`` over contexts) on the same
questions, made with two versions of the code. Rows are paired by (record, method, budget); per method and budget
the table gives the questions both runs hold, how many rows are the same in every reading (a change that should not
touch a question leaves its row as it was), the mean region reading (``--reading find``: the find reading) of each run with the mean paired difference and
its 95 % bootstrap interval (:func:`arr_coc.eval.intervals.bootstrap_mean` over the per-question differences), and
the strict page hits of each (over the questions whose answer has a box); then the same per question kind for
``--kind-methods``.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections import defaultdict
from pathlib import Path
from typing import Sequence

from emit import emit  # the benchmark beside this one (a script's folder is on its path)

from arr_coc.eval.intervals import bootstrap_mean
from arr_coc.eval.paired import budget_order, mean_present

SAME = ("reading", "reading_find", "coverage", "page_hit_strict", "tokens")
COLUMNS = {"region": "reading", "find": "reading_find"}  # --reading: the rows' column it compares


def load(path: Path) -> dict[tuple[str, str, str], dict]:
    """The run's rows by (record, method, budget); a record seen twice keeps its last row (a resumed run)."""
    out = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                out[(r["record_id"], r["method"], str(r["budget"]))] = r
    return out


def compare(a: dict, b: dict, methods: Sequence[str] | None = None, by_kind: bool = False,
            column: str = "reading") -> list[dict]:
    """Per (method, budget[, kind]) the paired figures of runs ``a`` and ``b`` (rows by (record, method, budget)):
    ``column`` ``reading`` (the region reading) or ``reading_find`` (the find reading).

    >>> a = {("q1", "coc", "10x"): {"reading": 0.5, "kind": "k", "page_hit_strict": 0.0},
    ...      ("q2", "coc", "10x"): {"reading": 1.0, "kind": "k", "page_hit_strict": 1.0}}
    >>> b = {("q1", "coc", "10x"): {"reading": 1.0, "kind": "k", "page_hit_strict": 1.0},
    ...      ("q2", "coc", "10x"): {"reading": 1.0, "kind": "k", "page_hit_strict": 1.0}}
    >>> r = compare(a, b)[0]
    >>> r["n"], r["same"], r["a"], r["b"], r["diff"], r["strict_a"], r["strict_b"]
    (2, 1, 0.75, 1.0, 0.25, 0.5, 1.0)
    """
    groups: dict[tuple, list[tuple[dict, dict]]] = defaultdict(list)
    for key in sorted(a.keys() & b.keys()):
        _, method, budget = key
        if methods and method not in methods:
            continue
        ra, rb = a[key], b[key]
        group = (method, budget, ra.get("kind", "")) if by_kind else (method, budget)
        groups[group].append((ra, rb))
    def order(g):  # a method, then its budgets by ratio ("full" first), then kinds
        return g[0][0], -1.0 if g[0][1] == "full" else budget_order(g[0][1]), g[0][2:]

    out = []
    for group, pairs in sorted(groups.items(), key=order):
        ra_vals = [float(ra[column]) for ra, _ in pairs]
        rb_vals = [float(rb[column]) for _, rb in pairs]
        diffs = [y - x for x, y in zip(ra_vals, rb_vals)]
        lo, hi = bootstrap_mean(diffs)  # (nan, nan) for one question
        out.append({"method": group[0], "budget": group[1], "kind": group[2] if by_kind else "", "n": len(pairs),
                    "same": sum(all(ra.get(k) == rb.get(k) for k in SAME) for ra, rb in pairs),
                    "a": sum(ra_vals) / len(pairs), "b": sum(rb_vals) / len(pairs), "diff": sum(diffs) / len(pairs),
                    "lo": lo, "hi": hi,
                    "strict_a": mean_present([ra.get("page_hit_strict") for ra, _ in pairs]),
                    "strict_b": mean_present([rb.get("page_hit_strict") for _, rb in pairs])})
    return out


def table(rows: list[dict], labels: Sequence[str], by_kind: bool = False) -> str:
    head = ["method", "budget"] + (["kind"] if by_kind else []) + [
        "n", "rows unchanged", f"reading: {labels[0]}", f"reading: {labels[1]}", "difference [95 %]",
        f"strict hit: {labels[0]}", f"strict hit: {labels[1]}"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * (2 + by_kind) + "---:|" * 7]
    for r in rows:
        cells = [r["method"], r["budget"]] + ([r["kind"]] if by_kind else []) + [
            str(r["n"]), str(r["same"]), f"{r['a']:.3f}", f"{r['b']:.3f}",
            f"{r['diff']:+.3f} [{r['lo']:+.3f}, {r['hi']:+.3f}]", f"{r['strict_a']:.0%}", f"{r['strict_b']:.0%}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--labels", nargs=2, default=["before", "after"])
    ap.add_argument("--methods", nargs="*", default=None, help="methods to compare (default: every method)")
    ap.add_argument("--kind-methods", nargs="*", default=["coc"], help="methods also compared per question kind")
    ap.add_argument("--reading", default="region", choices=list(COLUMNS), help="the reading compared")
    ap.add_argument("--out", type=Path, default=None, help="also write the tables here")
    args = ap.parse_args(argv)
    for path in (args.before, args.after):
        if not path.is_file():
            ap.error(f"{path}: no such records file (a records.jsonl of paraphrase_tables.py's --out)")
    a, b = load(args.before), load(args.after)
    text = "\n\n".join([
        f"made by: `python benchmarks/compare_runs.py {shlex.join(sys.argv[1:] if argv is None else argv)}`",
        f"Rows paired by (question, method, budget); reading = the {args.reading} reading; rows unchanged: the same "
        f"{', '.join(SAME)} in both runs; the difference's interval: 95 % bootstrap over the questions.",
        table(compare(a, b, args.methods, column=COLUMNS[args.reading]), args.labels),
        "Per question kind:",
        table(compare(a, b, args.kind_methods, by_kind=True, column=COLUMNS[args.reading]), args.labels,
              by_kind=True)]) + "\n"
    emit(text, args.out)


if __name__ == "__main__":
    main()
