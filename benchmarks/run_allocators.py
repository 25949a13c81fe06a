"""Every allocator at equal tokens on held-out images: samplers, variable-size patches, quadtree, learned.

    python benchmarks/run_allocators.py [--limit 40] [--tokens 10% 25%] [--skip-train]

1. Trains the two learned allocators with ``arr_coc.train.loop`` (defaults: proxy objective at 10%,
   300 steps, training images only) -- ``--learner selector`` (a CNN on the pixels, blind to the
   question) and ``--learner pruner`` (an MLP over every cell's encoded token and the question) --
   into out/train_<learner>/, and evaluates those weights (shipping them is `arr-coc train ... --resume
   --export <learner>`, printed at the end). ``--skip-train`` evaluates what out/train_<learner>/ already holds.
2. Runs the evaluation harness on the test split (never trained on, never used to choose a
   setting) of FUNSD, SROIE and COCO for every allocator: full resolution, one uniformly
   downsampled image, random cells, top-K and stratified samplers, relevance-driven and
   edge-driven variable-size patches (size prior from benchmarks/tune_patches.py), the
   relevance quadtree, the patch selector and the token pruner. Rows go to
   benchmarks/results/allocators/<dataset>/records.jsonl (resumable).
3. Writes benchmarks/results/allocators/report.md (reading ANLS on the documents; answer coverage
   at full resolution and answer area seen at any size everywhere) and allocators.png.
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from arr_coc.data.datasets import load_dataset  # noqa: E402
from arr_coc.engine.pipeline import ARR  # noqa: E402
from arr_coc.eval.evaluate import evaluate  # noqa: E402
from arr_coc.eval.report import pivot_table, summarize, write_reports  # noqa: E402
from arr_coc.eval.settings import EvalSettings, known_methods  # noqa: E402
from arr_coc.eval.store import RowStore  # noqa: E402
from arr_coc.train import TrainConfig, train  # noqa: E402

DATASETS = ("funsd", "sroie", "coco")
ALLOCATORS = ("full", "uniform_image", "random", "topk", "stratified", "patches", "patches_edges", "quadtree",
              "selector", "pruner")
OUT = ROOT / "benchmarks" / "results" / "allocators"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--limit", type=int, default=40, help="test records per dataset")
    p.add_argument("--tokens", nargs="+", default=["10%", "25%"], help="total visual tokens per row (counts or shares)")
    p.add_argument("--skip-train", action="store_true", help="evaluate the weights already in out/train_<learner>")
    p.add_argument("--from-summaries", action="store_true",
                   help="train and evaluate nothing: rewrite report.md and allocators.png from the committed "
                        "<dataset>/summary.csv (what `make tables` writes there)")
    args = p.parse_args(argv)
    if args.from_summaries:
        summaries = {name: read_summary(OUT / name / "summary.csv") for name in DATASETS}
        made_by = "python benchmarks/run_allocators.py --from-summaries"
        (OUT / "report.md").write_text(f"made by: `{made_by}` (from the rows of {made_from(OUT)})\n\n"
                                       + report_tables(summaries))
        plot(summaries, OUT / "allocators.png")
        return
    weights, hints = {}, []
    for learner in ("selector", "pruner"):
        out = ROOT / "out" / f"train_{learner}"
        cfg = TrainConfig(learner=learner, out=str(out), features=str(ROOT / "out" / "features"),
                          fresh=not args.skip_train)
        if not args.skip_train:
            train(cfg)
        weights[learner] = str(out / learner)
        hints.append(f"to ship {weights[learner]}: arr-coc train --learner {learner} --out {out} --features "
                     f"{cfg.features} --resume --export {learner}")
        (OUT / "train").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(out / "metrics.json", OUT / "train" / f"{learner}_metrics.json")
        shutil.copyfile(out / "loss.png", OUT / "train" / f"{learner}_loss.png")
    arr = ARR().eval()
    settings = EvalSettings(methods=ALLOCATORS, budgets=args.tokens, learned=weights)
    summaries = {}
    for name in DATASETS:
        records = load_dataset(name, limit=args.limit, split="test")
        jsonl = evaluate(records, arr, OUT / name, settings)
        write_reports(jsonl, made_by="python benchmarks/run_allocators.py " + " ".join(argv or sys.argv[1:]))
        summaries[name] = summarize(RowStore(jsonl.parent).rows())
    report = report_tables(summaries)
    (OUT / "report.md").write_text(report)
    plot(summaries, OUT / "allocators.png")
    print(report)
    print("\n".join(hints))


def read_summary(path: Path) -> list[dict]:
    """The overall rows (kind ``all``) of an evaluation's summary.csv, numbers as floats (empty / nan: nan)."""
    import csv

    with path.open() as f:
        rows = [r for r in csv.DictReader(f) if r.get("kind", "all") == "all"]
    text = ("dataset", "kind", "method", "budget")
    return [{k: v if k in text else int(v) if k == "n" else float(v or "nan") for k, v in r.items()} for r in rows]


def made_from(folder: Path) -> str:
    """The commands that made each dataset's summary (their summary.md's first line)."""
    lines = [(folder / name / "summary.md").read_text().splitlines()[0] for name in DATASETS]
    return "; ".join(f"`{line.removeprefix('made by: ').strip('`')}`" for line in lines)


def report_tables(summaries: dict[str, list[dict]]) -> str:
    parts = []
    for name, summary in summaries.items():
        parts.append(f"## {name} (test images, {max(s['n'] for s in summary)} questions)")
        for column, what in (("reading", "reading (ANLS of OCR on what the VLM would see)"),
                             ("coverage", "answer area covered at full resolution"),
                             ("seen", "answer area seen at any resolution (variable-size allocators)")):
            if any(s.get(column) == s.get(column) for s in summary):
                parts.append(f"{what}:\n\n" + pivot_table(summary, column))
    return "\n\n".join(parts) + "\n"


def plot(summaries: dict[str, list[dict]], path: Path) -> Path:
    """Per dataset: the headline metric (reading on documents, coverage on COCO) per allocator and budget."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(13, 3.8), layout="constrained")
    axes = fig.subplots(1, len(summaries))
    for ax, (name, summary) in zip(axes, summaries.items()):
        column = "reading" if any(s["reading"] == s["reading"] for s in summary) else "coverage"
        budgets = sorted({s["budget"] for s in summary if s["budget"] != "full"}, key=lambda b: float(b[:-1]))
        methods = [m for m in known_methods("tesseract", "image") if m != "full" and any(s["method"] == m for s in summary)]
        width = 0.8 / len(budgets)
        for j, b in enumerate(budgets):
            vals = {s["method"]: s[column] for s in summary if s["budget"] == b}
            ax.bar([i + j * width for i in range(len(methods))], [vals.get(m, 0.0) for m in methods], width,
                   label=f"{b} of full-resolution tokens")
        full = [s[column] for s in summary if s["method"] == "full"]
        if full and full[0] == full[0]:
            ax.axhline(full[0], color="k", ls="--", lw=1, label="full resolution")
        ax.set_xticks([i + width * (len(budgets) - 1) / 2 for i in range(len(methods))], methods, rotation=60,
                      ha="right", fontsize=8)
        ax.set_title(f"{name}: {column}")
        ax.set_ylim(0, 1.02)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.savefig(path, dpi=110)
    return path


if __name__ == "__main__":
    main()
