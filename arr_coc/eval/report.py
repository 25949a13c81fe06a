"""Reports of an evaluation folder, for both readers: summary rows, CSV, markdown tables, plots.

``write_reports`` turns ``records.jsonl`` into ``summary.csv``, ``summary.md`` (its first line names the
command that made it) and ``summary.png``: for the OCR readers (``reader="ocr"``) answer coverage and
reading accuracy against the share of full-resolution tokens; for the VLM reader (``reader="vlm"``)
the benchmark's score and what each answer cost (allocation, vision, prefill, decode time, FLOPs);
for questions over contexts (``reader="context"``, :mod:`arr_coc.eval.context_run`) page hit (and the
strict one), coverage and both readings (region, find) against the compression ratio, each reading also as
a share of full resolution's.
Every mean of a score a verdict is read from (``INTERVAL_COLUMNS``) carries its 95 % bootstrap interval
over the questions (:mod:`arr_coc.eval.intervals`): ``<column>_lo`` and ``<column>_hi`` in summary.csv,
``0.754 [0.694, 0.812]`` in summary.md.
"""
from __future__ import annotations

import csv
import math
from collections import defaultdict
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Sequence

from arr_coc.allocators.methods import METHODS as REGISTRY
from arr_coc.allocators.methods import methods_for
from arr_coc.engine.samplers import SAMPLERS
from arr_coc.eval.context_methods import CONTEXT_METHODS
from arr_coc.eval.intervals import bootstrap_mean
from arr_coc.eval.store import RowStore

COLUMNS = ("coverage", "hit", "iou", "secondary", "peripheral", "seen", "reading")  # seen: variable-size allocators
COST_COLUMNS = ("score", "alloc_ms", "vision_ms", "prefill_ms", "decode_ms", "flops")  # the VLM reader's
CONTEXT_COLUMNS = ("page_hit", "page_hit_strict", "coverage", "reading", "reading_find", "compression",
                   "text_tokens")  # questions over contexts
READERS = ("ocr", "vlm", "context")
# the scores verdicts are read from; the allocation diagnostics (hit, IoU, ...) and costs stay bare means
INTERVAL_COLUMNS = ("coverage", "reading", "reading_find", "score", "page_hit", "page_hit_strict")


def _mean(values: list) -> float:
    vals = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return sum(vals) / len(vals) if vals else float("nan")


def _stats(group: Sequence[dict], column: str) -> dict[str, float]:
    """``column``'s mean over ``group``, and its interval (``column_lo``, ``column_hi``) if it is a score."""
    values = [r.get(column) for r in group]
    if column not in INTERVAL_COLUMNS:
        return {column: _mean(values)}
    lo, hi = bootstrap_mean(values)
    return {column: _mean(values), f"{column}_lo": lo, f"{column}_hi": hi}


def summarize(rows: Sequence[dict], columns: Sequence[str] = COLUMNS,
              methods: Sequence[str] | None = None) -> list[dict]:
    """Mean of every metric in ``columns`` per (dataset, method, budget), in table order (``methods``' order,
    default the registry's); after each score of ``INTERVAL_COLUMNS`` its 95 % bootstrap interval
    (``<column>_lo``, ``<column>_hi``).

    >>> rows = [{"dataset": "d", "method": "topk", "budget": "25%", "tokens": 1, "full_tokens": 4, "reading": v}
    ...         for v in (0.5, 0.5, 0.5)]
    >>> {k: v for k, v in summarize(rows, ("reading",))[0].items() if k.startswith("reading")}
    {'reading': 0.5, 'reading_lo': 0.5, 'reading_hi': 0.5}
    """
    methods = list(REGISTRY.names()) if methods is None else list(methods)
    groups: dict[tuple[str, str, str], list[dict]] = defaultdict(list)
    for r in rows:
        groups[(r["dataset"], r["method"], r["budget"])].append(r)

    def order(key):
        dataset, method, budget = key
        b = -1.0 if budget == "full" else (float(budget[:-1]) if budget.endswith("%") else
                                           2e9 + float(budget[:-1]) if budget.endswith("x") else 1e9 + float(budget))
        return dataset, b, methods.index(method) if method in methods else len(methods)

    out = []
    for key in sorted(groups, key=order):
        g = groups[key]
        share = _mean([r["tokens"] / r["full_tokens"] for r in g])
        out.append({"dataset": key[0], "method": key[1], "budget": key[2], "n": len(g),
                    "tokens": _mean([r["tokens"] for r in g]), "share": share,
                    **{k: v for c in columns for k, v in _stats(g, c).items()}})
    return out


def summarize_kinds(rows: Sequence[dict], columns: Sequence[str] = COLUMNS,
                    methods: Sequence[str] | None = None) -> list[dict]:
    """:func:`summarize` over all rows (``kind`` "all") and, when the rows hold several question kinds
    (``Record.kind``: SROIE's keys, FUNSD's answer shapes, COCO's categories), per kind after it.

    >>> rows = [{"dataset": "d", "method": "topk", "budget": "25%", "tokens": 1, "full_tokens": 4, "kind": k,
    ...          "reading": v} for k, v in (("date", 1.0), ("total", 0.0), ("total", 0.5))]
    >>> [(s["kind"], s["n"], s["reading"]) for s in summarize_kinds(rows, ("reading",))]
    [('all', 3, 0.5), ('date', 1, 1.0), ('total', 2, 0.25)]
    """
    out = [{"dataset": s["dataset"], "kind": "all", **s} for s in summarize(rows, columns, methods)]
    kinds = sorted({r.get("kind") or "" for r in rows})
    if len(kinds) > 1:
        for kind in kinds:
            mine = [r for r in rows if (r.get("kind") or "") == kind]
            out += [{"dataset": s["dataset"], "kind": kind, **s} for s in summarize(mine, columns, methods)]
    return out


MAX_KIND_TABLE = 12  # more kinds (COCO's categories) stay in summary.csv: a table of 40 kinds reads as noise


def kind_table(summary: Sequence[dict], column: str) -> str:
    """One metric per question kind and method (rows) at every token count (columns), from :func:`summarize_kinds`.

    >>> rows = [{"kind": k, "method": "topk", "budget": "5%", "n": 10, "share": 0.05, "tokens": 26.0,
    ...          "reading": v} for k, v in (("all", 0.5), ("date", 0.9))]
    >>> print(kind_table(rows, "reading"))
    | kind (n) | method | 5% |
    |---|---|---:|
    | all (10) | topk | 0.500 |
    | date (10) | topk | 0.900 |
    """
    budgets = list(dict.fromkeys(s["budget"] for s in sorted(
        summary, key=lambda s: s["share"] * (s["budget"] != "full") - (s["budget"] == "full"))))
    cell = {(s["kind"], s["method"], s["budget"]): s for s in summary}
    pairs = list(dict.fromkeys((s["kind"], s["method"]) for s in summary))
    lines = ["| kind (n) | method | " + " | ".join(budgets) + " |", "|---|---|" + "---:|" * len(budgets)]
    for kind, method in pairs:
        n = max(cell[(kind, method, b)]["n"] for b in budgets if (kind, method, b) in cell)
        lines.append(f"| {kind} ({n}) | {method_label(method)} | " + " | ".join(
            fmt(cell[(kind, method, b)][column]) if (kind, method, b) in cell else "" for b in budgets) + " |")
    return "\n".join(lines)


@lru_cache(maxsize=None)
def method_label(method: str) -> str:
    """A method's name in tables: samplers with learnable parameters run untrained here, and say so.

    >>> method_label("topk"), method_label("log_polar"), method_label("adaptive_stratified@learned")
    ('topk', 'log_polar (untrained)', 'adaptive_stratified@learned (untrained)')
    """
    base = method.split("@")[0]
    if base in SAMPLERS.names() and any(True for _ in SAMPLERS.get(base)().parameters()):
        return f"{method} (untrained)"
    return method


def fmt(v: float, pct: bool = False) -> str:
    """A table cell: a share as a percentage, a mean to three decimals, a missing value as a dash.

    >>> fmt(0.25, pct=True), fmt(0.5), fmt(float("nan"))
    ('25%', '0.500', '—')
    """
    if v != v:
        return "—"
    return f"{100 * v:.0f}%" if pct else f"{v:.3f}"


def fmt_ci(s: dict, column: str, pct: bool = False) -> str:
    """A mean and its interval, as the summaries print them (the bare mean where there is no interval).

    >>> fmt_ci({"reading": 0.75, "reading_lo": 0.7, "reading_hi": 0.8}, "reading"), fmt_ci({"hit": 0.5}, "hit")
    ('0.750 [0.700, 0.800]', '0.500')
    >>> fmt_ci({"page_hit": 0.9, "page_hit_lo": 0.8, "page_hit_hi": 1.0}, "page_hit", pct=True)
    '90% [80%, 100%]'
    """
    lo, hi = s.get(f"{column}_lo", float("nan")), s.get(f"{column}_hi", float("nan"))
    if s[column] != s[column] or lo != lo:
        return fmt(s[column], pct)
    return f"{fmt(s[column], pct)} [{fmt(lo, pct)}, {fmt(hi, pct)}]"


def markdown_table(summary: Sequence[dict]) -> str:
    """The OCR readers' table: allocation metrics and reading accuracy per (budget, method)."""
    lines = ["| budget | method | tokens (share of full) | n | coverage | hit rate | IoU proxy | secondary "
             "| peripheral | seen | reading (ANLS) |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for s in summary:
        lines.append(f"| {s['budget']} | {method_label(s['method'])} | {s['tokens']:.0f} ({fmt(s['share'], True)}) | "
                     f"{s['n']} | " + " | ".join(fmt_ci(s, c) for c in COLUMNS) + " |")
    return "\n".join(lines)


def cost_table(summary: Sequence[dict], metric: str) -> str:
    """The VLM reader's table: accuracy and cost per (budget, method), to read accuracy against cost from."""
    lines = [f"| budget | method | tokens (share of full) | n | {metric} | alloc ms | vision ms | prefill ms "
             "| decode ms | TFLOPs |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for s in summary:
        lines.append(f"| {s['budget']} | {s['method']} | {s['tokens']:.0f} ({fmt(s['share'], True)}) | {s['n']} | "
                     f"{fmt_ci(s, 'score')} | {s['alloc_ms']:.1f} | {s['vision_ms']:.1f} | {s['prefill_ms']:.1f} | "
                     f"{s['decode_ms']:.1f} | {s['flops'] / 1e12:.4g} |")
    return "\n".join(lines)


def context_table(summary: Sequence[dict]) -> str:
    """Questions over contexts: page hits, coverage and both readings per (budget, method), each reading / full's.

    >>> rows = [{"dataset": "d", "method": m, "budget": b, "n": 2, "tokens": t, "compression": c, "page_hit": 1.0,
    ...          "page_hit_strict": h, "coverage": 1.0, "reading": r, "reading_find": f}
    ...         for m, b, t, c, h, r, f in (("full", "full", 900, 1.0, 1.0, 0.8, 0.9), ("coc", "10x", 90, 10.0, 0.5,
    ...                                                                                   0.6, 0.45))]
    >>> print(context_table(rows).splitlines()[-1])
    | 10x | coc | 90 | 10.0x | 2 | 100% | 50% | 100% | 0.600 | 75% | 0.450 | 50% |
    """
    full = {s["dataset"]: s for s in summary if s["method"] == "full"}

    def share(s: dict, column: str) -> str:
        ref = full.get(s["dataset"], {}).get(column, float("nan"))
        return fmt(s.get(column, float("nan")) / ref if ref == ref and ref > 0 else float("nan"), True)

    lines = ["| budget | method | tokens sent | compression | n | page hit | strict hit | coverage | reading "
             "(region) | region / full | reading (find) | find / full |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for s in summary:
        s = {"page_hit_strict": float("nan"), "reading_find": float("nan"), **s}  # rows made before these columns
        lines.append(f"| {s['budget']} | {s['method']} | {s['tokens']:.0f} | {s['compression']:.1f}x | {s['n']} | "
                     f"{fmt_ci(s, 'page_hit', True)} | {fmt_ci(s, 'page_hit_strict', True)} | "
                     f"{fmt_ci(s, 'coverage', True)} | {fmt_ci(s, 'reading')} | {share(s, 'reading')} | "
                     f"{fmt_ci(s, 'reading_find')} | {share(s, 'reading_find')} |")
    return "\n".join(lines)


def pivot_table(summary: Sequence[dict], column: str) -> str:
    """One metric as methods x budgets (the mean tokens sent in each header), for READMEs.

    >>> rows = [{"method": "topk", "budget": "25%", "tokens": 247.0, "share": 0.25, "reading": 0.5},
    ...         {"method": "full", "budget": "full", "tokens": 989.0, "share": 1.0, "reading": 0.8}]
    >>> print(pivot_table(rows, "reading"))
    | method | full (989 tok) | 25% (247 tok) |
    |---|---:|---:|
    | full | 0.800 |  |
    | topk |  | 0.500 |
    """
    budgets = list(dict.fromkeys(s["budget"] for s in sorted(
        summary, key=lambda s: s["share"] * (s["budget"] != "full") - (s["budget"] == "full"))))
    tokens = {b: sum(s["tokens"] for s in summary if s["budget"] == b) / sum(1 for s in summary if s["budget"] == b)
              for b in budgets}
    seen = list(dict.fromkeys(s["method"] for s in summary))
    known = REGISTRY.names()
    methods = [m for m in known if m in seen] + [m for m in seen if m not in known]  # e.g. topk@learned
    cell = {(s["method"], s["budget"]): s[column] for s in summary}
    lines = ["| method | " + " | ".join(f"{b} ({tokens[b]:.0f} tok)" for b in budgets) + " |",
             "|---|" + "---:|" * len(budgets)]
    for m in methods:
        lines.append(f"| {method_label(m)} | "
                     + " | ".join(fmt(cell[(m, b)]) if (m, b) in cell else "" for b in budgets) + " |")
    return "\n".join(lines)


def write_reports(jsonl: Path, out_dir: Path | None = None, keys: Iterable[tuple[str, str, str]] | None = None, *,
                  made_by: str, reader: str = "ocr") -> tuple[Path, Path, Path]:
    """records.jsonl -> summary.csv, summary.md and summary.png beside it (or in ``out_dir``).

    Args:
        jsonl: an evaluation folder's ``records.jsonl``.
        out_dir: where the reports go (default: beside ``jsonl``).
        keys: (record_id, method, budget), e.g. :func:`arr_coc.eval.store.requested` for a run: the tables
            hold exactly those rows; without it every row of the folder counts once.
        made_by: the command that made the rows, written as the first line of summary.md.
        reader: ``ocr`` (the OCR readers' rows), ``vlm`` (the model's answers and their cost) or ``context``
            (questions over contexts: :mod:`arr_coc.eval.context_run`).

    Raises:
        ValueError: no rows for ``keys``, or an unknown ``reader``.
    """
    if reader not in READERS:
        raise ValueError(f"unknown reader {reader!r}; choose one of {', '.join(READERS)}")
    rows = RowStore(jsonl.parent).rows(keys)
    if not rows:
        raise ValueError(f"{jsonl} holds no rows for the records, methods and token counts asked for")
    columns = {"ocr": COLUMNS, "vlm": COST_COLUMNS, "context": CONTEXT_COLUMNS}[reader]
    every = summarize_kinds(rows, columns, CONTEXT_METHODS if reader == "context" else None)  # "all", then per kind
    summary = [{k: v for k, v in s.items() if k != "kind"} for s in every if s["kind"] == "all"]
    table = {"ocr": markdown_table, "context": context_table}.get(
        reader, lambda s: cost_table(s, rows[0]["metric"]))(summary)
    kinds = sorted({s["kind"] for s in every} - {"all"})
    if kinds:
        column = "score" if reader == "vlm" else "reading" if any(s["reading"] == s["reading"] for s in summary) \
            else "coverage"
        table += f"\n\nPer question kind, {column} (mean over the kind's questions):\n\n" + (
            kind_table(every, column) if len(kinds) <= MAX_KIND_TABLE
            else f"{len(kinds)} kinds: their rows are in summary.csv (column kind).")
    out_dir = out_dir or jsonl.parent
    csv_path, md_path, png_path = out_dir / "summary.csv", out_dir / "summary.md", out_dir / "summary.png"
    with csv_path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(every[0]))
        w.writeheader()
        w.writerows(every)
    md_path.write_text(f"made by: {made_by}\n\n{table}\n")
    if reader == "ocr":
        plot_summary(summary, png_path)
    elif reader == "context":
        plot_contexts(summary, png_path)
    else:
        plot_costs(summary, png_path, rows[0]["metric"], rows[0].get("model", ""))
    return csv_path, md_path, png_path


def _figure():
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.2), layout="constrained")
    return fig, fig.subplots(1, 2), matplotlib.colormaps["tab20"]


def _plot_methods(summary: Sequence[dict], path: Path, panels: Sequence[tuple[str, str]], x: Any, xlabel: str,
                  methods: Sequence[str], dashed: Sequence[str], title: str, label: Any = str) -> Path:
    """Two panels (column, y label) of one metric against ``x(summary row)``, a line per method; full as a level."""
    fig, axes, colours = _figure()
    for ax, (col, ylabel) in zip(axes, panels):
        for i, method in enumerate(methods):  # one colour per method in both panels
            pts = sorted((x(s), s[col]) for s in summary if s["method"] == method and s[col] == s[col])
            if not pts:
                continue
            if method == "full":
                ax.axhline(pts[0][1], color="k", ls="--", lw=1, label="full resolution")
                continue
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color=colours(i),
                    ls=":" if method in dashed else "-", label=label(method))
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    axes[int(not axes[0].get_lines())].legend(fontsize=8)  # COCO has no reading panel to hold it
    fig.suptitle(f"{summary[0]['dataset'] if summary else ''}: {title}")
    fig.savefig(path, dpi=110)
    return path


def plot_summary(summary: Sequence[dict], path: Path) -> Path:
    """Reading accuracy and answer coverage vs share of full-resolution tokens, one line per method."""
    return _plot_methods(summary, path, (("reading", "reading accuracy (ANLS of OCR)"),
                                         ("coverage", "answer-box coverage")),
                         lambda s: 100 * s["share"], "tokens sent (% of full resolution)", methods_for("ocr"),
                         ("uniform_image", "random"), "what survives at equal token budgets", method_label)


def plot_contexts(summary: Sequence[dict], path: Path) -> Path:
    """Questions over contexts: both readings (region, find) against the compression ratio, one line per method
    (without a reader, the two page hits)."""
    read = any(s["reading"] == s["reading"] for s in summary)
    panels = ((("reading", "reading, region (contains ANLS of OCR)"),
               ("reading_find", "reading, find (best window of the page's OCR)")) if read else
              (("page_hit", "page hit (any full-resolution token)"), ("page_hit_strict", "strict page hit")))
    return _plot_methods(summary, path, panels,
                         lambda s: s["compression"], "compression (text tokens / visual tokens sent)",
                         CONTEXT_METHODS, ("uniform",), "questions over whole contexts at equal visual tokens")


def plot_costs(summary: Sequence[dict], path: Path, metric: str, model: str = "") -> Path:
    """The VLM's score vs visual tokens sent and vs estimated TFLOPs per answer, one line per method."""
    fig, axes, colours = _figure()
    for i, method in enumerate(methods_for("vlm")):
        pts = sorted((s["tokens"], s["flops"] / 1e12, s["score"]) for s in summary if s["method"] == method)
        if not pts:
            continue
        for ax, x in ((axes[0], 0), (axes[1], 1)):
            if method == "full":
                ax.axhline(pts[0][2], color="k", ls="--", lw=1, label="full resolution")
            else:
                ax.plot([p[x] for p in pts], [p[2] for p in pts], marker="o", color=colours(i), label=method,
                        ls=":" if method == "native_budget" else "-")
    for ax, label in ((axes[0], "visual tokens sent"), (axes[1], "estimated TFLOPs per answer")):
        ax.set_xlabel(label)
        ax.set_ylabel(metric)
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{summary[0]['dataset'] if summary else ''}: {model} answering at equal visual tokens")
    fig.savefig(path, dpi=110)
    return path

