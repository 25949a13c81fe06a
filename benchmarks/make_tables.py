"""`make tables`: the README's and docs' evaluation figures and console examples, remade from code and weights.

    python benchmarks/make_tables.py [--limit 40] [--goal-limit 120] [--coc-limit N] [--skip look ... bench] [--jobs 2]

Steps, each a command of its own (printed as it starts), each writing under benchmarks/results/:

* ``look``  -- ``arr-coc look examples/receipt.jpg "What is the total?" --top 4``: its output replaces the
  console blocks of README.md and docs/usage.md (line by line; the README keeps its ``...``);
* ``eval``  -- the region reading (OCR reads the answer box + margin of what the VLM gets), every method,
  FUNSD, SROIE, COCO and texlive (LaTeX manual pages, a layout nothing was trained on) test images, ``--limit`` balanced questions each, 5 / 10 / 25 / 50 % of the tokens;
* ``find``  -- the find reading (OCR reads the whole view, not told where the answer is), FUNSD, SROIE, texlive,
  full, uniform image and ``arr`` at the same token counts;
* ``goals`` -- full and ``arr`` at 6 % and 11 % of the tokens, both readings, FUNSD and SROIE, ``--goal-limit``
  balanced questions each (more than the headline's: a verdict needs the share's interval clear of the goal);
* ``allocators`` -- every allocator (samplers, variable-size patches, quadtree, the shipped selector and
  pruner) at 10 % and 25 %, region reading: the table of docs/allocators.md;
* ``coc`` -- ``benchmarks/paraphrase_tables.py``: the hand-written test questions (all 182, or the first ``--coc-limit``) over 20-page
  PDF windows at 10x and 20x (the README's COC table; tables and plot in results/paraphrase/);
* ``bench`` -- ``benchmarks/bench_vlm.py`` (the 3B timing: about an hour on two busy cores; ``--skip bench``).

Then the blocks between ``<!-- make tables: NAME -->`` and ``<!-- /make tables -->`` in README.md and
docs/evaluation.md are rewritten from the rows of exactly the questions asked (a folder's older rows of other
questions are not counted). Every evaluation resumes: a rerun skips the rows already written. The headline
carries the 95 % bootstrap intervals over the questions (:mod:`arr_coc.eval.intervals`) of full, the uniform
image and ``arr`` (every method's are in the summaries), the goal tables one beside every figure; a goal reads "met" or "missed" only when the interval of ``arr``'s share of
full resolution's reading lies wholly above or below it, else "undecided at n=...".
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shlex
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Callable, Sequence

from arr_coc.data.datasets import load_dataset
from arr_coc.eval.intervals import bootstrap_mean, bootstrap_ratio
from arr_coc.eval.report import summarize_kinds
from arr_coc.eval.store import RowStore, requested

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PARAPHRASE = RESULTS / "paraphrase" / "texlive-paraphrase" / "test"  # where the coc step's tables.csv lands
STEPS = ("look", "eval", "find", "goals", "allocators", "coc", "bench")
TOKENS = ("5%", "10%", "25%", "50%")
GOAL_TOKENS = ("6%", "11%")
GOALS = {"6%": 0.90, "11%": 0.95}  # reading at that share of the tokens, as a share of full resolution's
GOAL_LIMIT = 120  # FUNSD's test split has 25 dates: 120 balanced questions are 25 / 32 / 32 / 31 of its kinds
# the question-blind selector is in the allocators' table (docs/allocators.md), not the headline
EVAL_METHODS = ("full", "uniform_image", "random", "topk", "arr", "pruner")
FIND_METHODS = ("full", "uniform_image", "arr")
ALLOCATORS = ("full", "uniform_image", "random", "topk", "stratified", "patches", "patches_edges", "quadtree",
              "selector", "pruner")
ALLOCATOR_TOKENS = ("10%", "25%")
TITLES = {"funsd": "FUNSD forms (printed keys)", "sroie": "SROIE receipts", "coco": "COCO objects", "texlive": "LaTeX pages (unseen)"}
TEXT_DATASETS = ("funsd", "sroie", "texlive")  # the datasets with text to read (both readings)
ALLOCATOR_DATASETS = ("funsd", "sroie", "coco")  # the allocator table of docs/allocators.md
LOOK = ["look", "examples/receipt.jpg", "What is the total?", "--out", "out/receipt_arr.png", "--top", "4"]
LOOK_DOCS = ("README.md", "docs/usage.md")
DETERMINISTIC = ("question", "image", "tokens", "context", "top", "scorer")  # `look` lines a test compares


# ----------------------------------------------------------------------------- running the steps
def eval_command(dataset: str, reading: str, methods: Sequence[str], tokens: Sequence[str], out: Path,
                 limit: int) -> list[str]:
    """The ``arr-coc eval`` argument list of one dataset (COCO: no text, coverage only)."""
    reader = ["--reader", "none"] if dataset == "coco" else ["--reading", reading]
    return ["eval", dataset, "--split", "test", "--limit", str(limit), "--methods", *methods, "--tokens", *tokens,
            *reader, "--out", str(out.relative_to(ROOT)), "--fresh"]  # run from ROOT: the reports name it so  # --fresh: rows of other settings (weights) are replaced


def runs(steps: Sequence[str], limit: int, goal_limit: int) -> list[list[str]]:
    """Every evaluation of the chosen steps, as ``arr-coc`` argument lists."""
    todo = []
    if "goals" in steps:  # first: the cheapest rows and the ones the goals are read from
        todo += [eval_command(d, reading, ("full", "arr"), GOAL_TOKENS, RESULTS / folder, goal_limit)
                 for reading, folder in (("region", "goals"), ("find", "goals_find")) for d in ("funsd", "sroie")]
    if "eval" in steps:
        todo += [eval_command(d, "region", EVAL_METHODS, TOKENS, RESULTS / "eval", limit) for d in TITLES]
    if "find" in steps:
        todo += [eval_command(d, "find", FIND_METHODS, TOKENS, RESULTS / "eval_find", limit) for d in TEXT_DATASETS]
    if "allocators" in steps:
        todo += [eval_command(d, "region", ALLOCATORS, ALLOCATOR_TOKENS, RESULTS / "allocators", limit)
                 for d in ALLOCATOR_DATASETS]
    return todo


# one core per evaluation process, as run_eval.py sets it: jobs processes share the machine's cores
ONE_CORE = "import sys, torch; torch.set_num_threads(1); from arr_coc.cli import main; sys.exit(main(sys.argv[1:]))"


def checkout_env() -> dict[str, str]:
    """The environment of the ``arr-coc`` subprocesses: this checkout's ``arr_coc`` first on the path, so the
    tables are made by the code beside this script, not by another copy installed in the environment."""
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": str(ROOT) + (os.pathsep + path if path else "")}


def run_all(commands: list[list[str]], jobs: int) -> None:
    """``arr-coc`` commands, ``jobs`` at a time, each in its own one-core process; a failure stops the run."""
    running: list[subprocess.Popen] = []

    def reap(block: bool) -> None:
        for p in list(running):
            if (p.wait() if block else p.poll()) is not None:
                running.remove(p)
                if p.returncode:
                    raise SystemExit(f"arr-coc {shlex.join(p.args[3:])} failed with code {p.returncode}")

    for argv in commands:
        while len(running) >= jobs:
            reap(block=False)
            if len(running) >= jobs:
                time.sleep(1)
        print("arr-coc " + shlex.join(argv), flush=True)
        running.append(subprocess.Popen([sys.executable, "-c", ONE_CORE, *argv], cwd=ROOT, env=checkout_env(),
                                        stdout=subprocess.DEVNULL))
    reap(block=True)


def look_output() -> list[str]:
    """What ``arr-coc look`` prints on the bundled receipt now."""
    done = subprocess.run([sys.executable, "-m", "arr_coc.cli", *LOOK], cwd=ROOT, env=checkout_env(),
                          capture_output=True, text=True, check=True)
    return done.stdout.splitlines()


# ----------------------------------------------------------------------------- console blocks
def console_key(line: str) -> str:
    """What a ``look`` line reports: its label (``tokens``), or ``rank N`` for a saccade line.

    >>> console_key("    2: ( 38,  14) -> ( 1064,   392)  +9.051"), console_key("context       propositional 0.05")
    ('rank 2', 'context')
    """
    rank = re.match(r"\s+(\d+):", line)
    return f"rank {rank[1]}" if rank else (line.split() or [""])[0]


def look_block(text: str) -> tuple[int, int]:
    """Line span (start, end) of the ``look`` output in ``text``'s console block (after the ``$`` line)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("$ arr-coc look examples/receipt.jpg")) + 1
    return start, next(i for i in range(start, len(lines)) if lines[i].startswith("```"))


def refresh_console(text: str, fresh: Sequence[str]) -> str:
    """``text`` with each deterministic line of its ``look`` block replaced by the fresh line of the same key.

    ``...`` stays, and so do the timing lines (``stage ms``, ``model load``): they say how loaded the
    machine was, not what the code does, and a busy machine's would mislead.
    """
    lines = text.splitlines()
    start, end = look_block(text)
    by_key = {console_key(line): line for line in fresh
              if console_key(line).split()[0] in (*DETERMINISTIC, "rank", "picture")}
    lines[start:end] = [by_key.get(console_key(line), line) for line in lines[start:end]]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- tables
def step_rows(folder: Path, dataset: str, methods: Sequence[str], tokens: Sequence[str], limit: int,
              complete: bool = True) -> list[dict]:
    """Exactly the rows of this step's questions, methods and token counts.

    ``complete=False`` accepts missing rows: with a quadtree every row there counts (it has none below its
    first tiling), else only the questions whose every row is there (a run cut short); never none at all.
    """
    records = load_dataset(dataset, limit=limit, split="test")
    keys = requested(records, methods, tokens)
    rows = RowStore(folder / dataset).rows(keys)
    if len(rows) < len(keys) and complete:
        raise LookupError(f"{folder / dataset} holds {len(rows)} of the {len(keys)} rows asked for")
    if not complete:  # the questions whose every row is there (the n column says how many)
        have = Counter(r["record_id"] for r in rows)
        want = Counter(k[0] for k in keys)
        rows = [r for r in rows if have[r["record_id"]] == want[r["record_id"]]] if "quadtree" not in methods else rows
    if not rows:
        raise LookupError(f"{folder / dataset} holds none of the {len(keys)} rows asked for")
    return rows


def summary(folder: Path, dataset: str, methods: Sequence[str], tokens: Sequence[str], limit: int,
            complete: bool = True) -> list[dict]:
    """Per-kind summaries (means and their 95 % intervals) of :func:`step_rows`."""
    return summarize_kinds(step_rows(folder, dataset, methods, tokens, limit, complete))


def value(rows: list[dict], method: str, budget: str, column: str, kind: str = "all") -> float:
    found = [r[column] for r in rows if (r["method"], r["budget"], r["kind"]) == (method, budget, kind)]
    return found[0] if found else float("nan")


def cells(rows: list[dict], method: str, column: str) -> str:
    vals = [value(rows, method, b, column) for b in TOKENS]
    return "—" if all(v != v for v in vals) else " / ".join("—" if v != v else f"{v:.2f}" for v in vals)


def spans(rows: list[dict], method: str, column: str, budgets: Sequence[str] = TOKENS) -> str:
    """The 95 % intervals of ``method``'s ``column`` at ``budgets``, as ``lo–hi`` joined by `` / ``.

    >>> spans([{"method": "arr", "budget": "5%", "kind": "all", "reading_lo": 0.61, "reading_hi": 0.8}], "arr",
    ...       "reading", ("5%", "10%"))
    '0.61–0.80 / —'
    """
    out = []
    for b in budgets:
        lo, hi = value(rows, method, b, f"{column}_lo"), value(rows, method, b, f"{column}_hi")
        out.append("—" if lo != lo else f"{lo:.2f}–{hi:.2f}")
    return "—" if all(o == "—" for o in out) else " / ".join(out)


INTERVAL_METHODS = {"uniform_image": "uniform image", "arr": "**arr** (default)"}  # the headline's comparison


def headline(limit: int) -> str:
    """The README's table: both readings on the documents, coverage on COCO, every method at 5 / 10 / 25 / 50 %;
    full's 95 % interval beside its mean, the uniform image's and ``arr``'s (the comparison the text reads) in the
    last columns. A dataset whose rows are not all there yet (a run cut short) has a row saying so; with none
    there, LookupError."""
    names = {"uniform_image": "uniform image", "random": "random", "topk": "top-K", "arr": "**arr** (default)",
             "pruner": "pruner"}
    head = list(names.values()) + [f"{v}: 95 % intervals" for v in INTERVAL_METHODS.values()]
    lines = [f"| test images, {limit} balanced questions each; {' / '.join(t[:-1] for t in TOKENS)} % of the tokens | "
             + " | ".join(head) + " |", "|---|" + "---|" * len(head)]
    missing = []
    for dataset, title in TITLES.items():
        what = [("coverage", "coverage", "eval", EVAL_METHODS)] if dataset == "coco" else [
            ("region", "reading", "eval", EVAL_METHODS), ("find", "reading", "eval_find", FIND_METHODS)]
        for label, column, folder, methods in what:
            try:
                rows = summary(RESULTS / folder, dataset, methods, TOKENS, limit)
            except LookupError as err:  # a run not finished: its row says so, the others are remade
                missing.append(str(err))
                lines.append(f"| {title}, {label} | not remade yet (history: docs/evaluation.md#headline) |"
                             + " |" * (len(head) - 1))
                continue
            full = value(rows, "full", "full", column)
            lines.append(f"| {title}, {label} (full {full:.2f}, {spans(rows, 'full', column, ('full',))}) | "
                         + " | ".join([*(cells(rows, m, column) for m in names),
                                       *(spans(rows, m, column) for m in INTERVAL_METHODS)]) + " |")
    if len(missing) == len(lines) - 2:
        raise LookupError("; ".join(missing))
    return "\n".join(lines)


def verdict(lo: float, hi: float, goal: float, n: int) -> str:
    """A goal is met or missed only when the whole 95 % interval of the share lies on one side of it.

    >>> verdict(0.91, 0.97, 0.90, 120), verdict(0.80, 0.89, 0.90, 120), verdict(0.86, 0.93, 0.90, 40)
    ('met', 'missed', 'undecided at n=40')
    """
    if lo >= goal:
        return "met"
    return "missed" if hi < goal else f"undecided at n={n}"


def goal_cells(rows: list[dict], kind: str = "all") -> list[str]:
    """One goal row's cells from the raw rows of full and ``arr`` (``kind`` "all": every question): n, full's
    reading, then per goal ``arr``'s reading and its share of full's, each with its 95 % interval (the share's
    from resampling the questions as pairs), and the verdict read from the share's interval.

    >>> rows = [{"record_id": f"q{i}", "kind": "date", "method": m, "budget": b, "reading": v}
    ...         for i in range(4) for m, b, v in (("full", "full", 1.0), ("arr", "6%", 0.5), ("arr", "11%", 1.0))]
    >>> goal_cells(rows)
    ['4', '1.000 [1.00, 1.00]', '0.500 [0.50, 0.50]', '50.0 % [50.0, 50.0] missed', '1.000 [1.00, 1.00]', \
'100.0 % [100.0, 100.0] met']
    """
    mine = [r for r in rows if kind == "all" or r.get("kind") == kind]
    full = {r["record_id"]: r["reading"] for r in mine if r["method"] == "full"}

    def mean_ci(values: list[float]) -> str:
        lo, hi = bootstrap_mean(values)
        return f"{sum(values) / len(values):.3f} [{lo:.2f}, {hi:.2f}]"

    out = [str(len(full)), mean_ci(list(full.values()))]
    for budget, goal in GOALS.items():
        got = {r["record_id"]: r["reading"] for r in mine if (r["method"], r["budget"]) == ("arr", budget)}
        ids = [i for i in full if i in got]
        num, den = [got[i] for i in ids], [full[i] for i in ids]
        share = sum(num) / sum(den) if sum(den) else float("nan")
        lo, hi = bootstrap_ratio(num, den)
        out += [mean_ci(num), f"{100 * share:.1f} % [{100 * lo:.1f}, {100 * hi:.1f}] {verdict(lo, hi, goal, len(ids))}"]
    return out


def goal_table(limit: int, per_kind: bool) -> str:
    """Reading of ``arr`` at 6 % and 11 % of the tokens as a share of full resolution's, against the goals, with
    95 % intervals; a verdict only where the share's interval lies on one side of the goal."""
    lines = ["| test images, balanced questions | reading | n | full | `arr` at 6 % | share of full (goal ≥ 90 %) "
             "| `arr` at 11 % | share of full (goal ≥ 95 %) |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for dataset in ("funsd", "sroie"):
        for reading, folder in (("region", "goals"), ("find", "goals_find")):
            try:
                rows = step_rows(RESULTS / folder, dataset, ("full", "arr"), GOAL_TOKENS, limit, complete=False)
            except LookupError:
                lines.append(f"| {TITLES[dataset]} | {reading} | 0 | not run yet | | | | |")
                continue
            kinds = ["all", *sorted({r.get("kind") or "" for r in rows} - {""})] if per_kind else ["all"]
            for kind in kinds:
                label = TITLES[dataset] + ("" if kind == "all" else f": {kind}")
                lines.append(f"| {label} | {reading} | " + " | ".join(goal_cells(rows, kind)) + " |")
    return "\n".join(lines)


def kind_tables(limit: int) -> str:
    """Per question kind: full, uniform image and ``arr`` at every token count, both readings."""
    out = []
    for dataset in TEXT_DATASETS:
        for reading, folder, methods in (("region", "eval", EVAL_METHODS), ("find", "eval_find", FIND_METHODS)):
            rows = summary(RESULTS / folder, dataset, methods, TOKENS, limit)
            out += [f"{TITLES[dataset]}, {reading} reading (ANLS; {' / '.join(TOKENS)} of the tokens):", "",
                    "| kind | n | full | uniform image | `arr` |", "|---|---:|---:|---|---|"]
            for kind in dict.fromkeys(r["kind"] for r in rows):
                mine = [r for r in rows if r["kind"] == kind]
                n = next((r["n"] for r in mine if r["method"] == "full"), 0)
                out.append(f"| {kind} | {n} | {value(mine, 'full', 'full', 'reading', kind):.2f} | "
                           + " | ".join(" / ".join(f"{value(mine, m, b, 'reading', kind):.2f}" for b in TOKENS)
                                        for m in ("uniform_image", "arr")) + " |")
            out.append("")
    return "\n".join(out).strip()


def allocator_table(limit: int) -> str:
    """Every allocator at 10 % and 25 %: reading on the documents, coverage on COCO (seen at any size when it
    differs; [n/limit] where fewer questions had a row, as a quadtree below its first tiling)."""
    head = [f"{TITLES[d].split()[0]} {b}" for d in ALLOCATOR_DATASETS for b in ALLOCATOR_TOKENS]
    lines = ["| method | " + " | ".join(head) + " |", "|---|" + "---:|" * len(head)]
    found = {d: summary(RESULTS / "allocators", d, ALLOCATORS, ALLOCATOR_TOKENS, limit, complete=False)
             for d in ALLOCATOR_DATASETS}
    for method in ALLOCATORS:
        row = []
        for d, rows in found.items():
            column = "coverage" if d == "coco" else "reading"
            for b in ALLOCATOR_TOKENS:
                mine = [r for r in rows if (r["kind"], r["method"]) == ("all", method)
                        and r["budget"] == ("full" if method == "full" else b)]
                if not mine or (method == "full" and b != ALLOCATOR_TOKENS[0]):
                    row.append("")
                    continue
                r = mine[0]
                text = "—" if r[column] != r[column] else f"{r[column]:.2f}"
                if d == "coco" and r.get("seen") == r.get("seen") and abs(r["seen"] - r[column]) > 0.005:
                    text += f" (seen {r['seen']:.2f})"
                row.append(text + (f" [{r['n']}/{limit}]" if r["n"] < limit else ""))
        lines.append(f"| {method} | " + " | ".join(row) + " |")
    return "\n".join(lines)


# name: (documents, the steps whose rows it reads, maker(options)); a block none of whose steps ran stays as it is
# (--skip goals keeps the goals)
BLOCKS: dict[str, tuple[str, tuple[str, ...], Callable[[argparse.Namespace], str]]] = {
    "headline": ("README.md docs/evaluation.md", ("eval", "find"), lambda a: headline(a.limit)),
    "goals": ("README.md", ("goals",), lambda a: goal_table(a.goal_limit, per_kind=False)),
    "goals-per-kind": ("docs/evaluation.md", ("goals",), lambda a: goal_table(a.goal_limit, per_kind=True)),
    "kinds": ("docs/evaluation.md", ("eval", "find"), lambda a: kind_tables(a.limit)),
    "allocators": ("docs/allocators.md", ("allocators",), lambda a: allocator_table(a.limit)),
    "coc": ("README.md", ("coc",), lambda a: coc_block(a.coc_limit)),
}


def coc_command(limit: int | None) -> list[str]:
    """The ``coc`` step: hand-written test questions over the PDF windows, 10x and 20x (rows resume); ``limit``:
    the first N questions (None: all of the test split)."""
    return ["python", "benchmarks/paraphrase_tables.py", "--dataset", "texlive-paraphrase", "--split", "test",
            "--sources", "pdf", "--compression", "10", "20", *(["--limit", str(limit)] if limit else [])]


def coc_block(limit: int | None) -> str:
    """The README's COC table from the coc step's ``tables.csv`` (``paraphrase_tables.readme_block``)."""
    spec = importlib.util.spec_from_file_location("paraphrase_tables", ROOT / "benchmarks" / "paraphrase_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.readme_block(PARAPHRASE, shlex.join(coc_command(limit)))


def replace_block(text: str, name: str, body: str) -> str:
    """``text`` with the lines between ``<!-- make tables: name -->`` and ``<!-- /make tables -->`` set to ``body``.

    >>> replace_block("a\\n<!-- make tables: t -->\\nold\\n<!-- /make tables -->\\nb\\n", "t", "new")
    'a\\n<!-- make tables: t -->\\nnew\\n<!-- /make tables -->\\nb\\n'
    """
    pattern = re.compile(rf"(<!-- make tables: {re.escape(name)} -->\n).*?(<!-- /make tables -->)", re.S)
    if not pattern.search(text):
        raise ValueError(f"no '<!-- make tables: {name} -->' ... '<!-- /make tables -->' block to rewrite")
    return pattern.sub(lambda m: m[1] + body + "\n" + m[2], text, count=1)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=40, help="balanced test questions per dataset (headline, "
                    "per-kind and allocator tables)")
    ap.add_argument("--goal-limit", type=int, default=GOAL_LIMIT, help="balanced test questions per dataset "
                    "of the goal tables")
    ap.add_argument("--skip", nargs="*", default=[], choices=STEPS, help="steps not to run (their tables are "
                    "still rewritten from the rows already there)")
    ap.add_argument("--coc-limit", type=int, default=None,
                    help="the first N hand-written test questions of the coc step (default: all 182)")
    ap.add_argument("--jobs", type=int, default=2, help="evaluations run at once (one core each)")
    args = ap.parse_args(argv)
    steps = [s for s in STEPS if s not in args.skip]
    if "look" in steps:
        print("arr-coc " + shlex.join(LOOK), flush=True)
        fresh = look_output()
        for doc in LOOK_DOCS:
            (ROOT / doc).write_text(refresh_console((ROOT / doc).read_text(), fresh))
    run_all(runs(steps, args.limit, args.goal_limit), args.jobs)
    if "coc" in steps:
        subprocess.run([sys.executable, *coc_command(args.coc_limit)[1:]], cwd=ROOT, env=checkout_env(), check=True)
    if "bench" in steps:
        subprocess.run([sys.executable, "benchmarks/bench_vlm.py"], cwd=ROOT, check=True)
    if "allocators" in steps:  # report.md and allocators.png drawn from the summaries just written
        subprocess.run([sys.executable, "benchmarks/run_allocators.py", "--from-summaries"], cwd=ROOT, check=True)
    for name, (docs, needs, make) in BLOCKS.items():
        if not set(needs) & set(steps):
            print(f"\n{name} ({docs}) left as it is: its step was skipped")
            continue
        try:
            body = make(args)
        except LookupError as err:  # a step not run yet (or cut short): its block stays as it is
            print(f"\n{name} ({docs}) left as it is: {err}")
            continue
        for doc in docs.split():
            (ROOT / doc).write_text(replace_block((ROOT / doc).read_text(), name, body))
        print(f"\n{name} ({docs}):\n{body}")


if __name__ == "__main__":
    main()
