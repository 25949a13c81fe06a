"""Choose the size prior of the variable-size patches on validation images (never on test ones).

    python benchmarks/tune_patches.py [--limit 30] [--priors 0.5 1 1.5 2 3]

``saliency_patches`` scores a square of side s by its relevance mass / s**alpha: small alpha buys
large, shrunk squares (more of the page seen, less of it legible), large alpha buys 1x1 cells
(alpha >= 2 ranks by mean, so 1x1 cells win ties only at alpha > 2). For every alpha and budget this
runs the evaluation harness's ``patches`` (relevance-driven) and ``patches_edges`` (Sobel-driven)
rows on the validation split of FUNSD and SROIE and reports OCR reading (ANLS), answer coverage at
full resolution and answer area seen at any size. The alpha with the best mean reading over both
datasets and budgets is printed; ``arr_coc.allocators.patching.SIZE_PRIOR`` holds the chosen value.
Rows go to benchmarks/results/patching/tune/records.jsonl (resumable), the table to tune.md/png.
"""
from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

import torch
from tqdm import tqdm

from arr_coc.data.datasets import load_dataset
from arr_coc.engine.pipeline import ARR
from arr_coc.eval.reading import READERS
from arr_coc.eval.run import allocation_rows
from arr_coc.eval.settings import EvalSettings
from arr_coc.eval.store import RowStore

ROOT = Path(__file__).resolve().parents[1]

OUT = ROOT / "benchmarks" / "results" / "patching" / "tune"
METHODS = ("patches", "patches_edges")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--limit", type=int, default=30, help="validation records per dataset")
    p.add_argument("--priors", type=float, nargs="+", default=[0.5, 1.0, 1.5, 2.0, 3.0])
    p.add_argument("--tokens", nargs="+", default=["10%", "25%"], help="total visual tokens per row (counts or shares)")
    p.add_argument("--datasets", nargs="+", default=["funsd", "sroie"])
    args = p.parse_args(argv)
    store = RowStore(OUT)
    done = store.done()
    arr = ARR().eval()
    reader = READERS.get("tesseract")()
    records = [r for name in args.datasets for r in load_dataset(name, limit=args.limit, split="val")]
    with torch.no_grad():
        for record in tqdm(records, desc="val records"):
            scene = arr.see(record.image)
            relevance, query = arr.score(scene, [record.question], arr.gestalt(scene, 1).vector)
            for alpha in args.priors:
                settings = EvalSettings(methods=METHODS, budgets=args.tokens,
                                        patch_options={"size_prior": alpha})
                store.append(allocation_rows(record, scene.canvas, relevance.map, query, {}, reader, settings, done,
                                             suffix=f"@{alpha:g}"))
    rows = store.rows()
    table, best = report(rows, args.priors)
    (OUT / "tune.md").write_text(table + "\n")
    plot(rows, args.priors, OUT / "tune.png")
    print(table)
    print(f"\nbest size prior on validation images (mean reading, relevance-driven patches): {best:g}")


def _means(rows: list[dict]) -> dict[tuple, dict[str, float]]:
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        method, alpha = r["method"].rsplit("@", 1)
        groups[(method, float(alpha), r["dataset"], r["budget"])].append(r)

    def mean(g, key):
        vals = [r[key] for r in g if r.get(key) is not None and r[key] == r[key]]
        return sum(vals) / len(vals) if vals else float("nan")

    return {k: {"reading": mean(g, "reading"), "coverage": mean(g, "coverage"), "seen": mean(g, "seen"), "n": len(g)}
            for k, g in groups.items()}


def report(rows: list[dict], priors: list[float]) -> tuple[str, float]:
    """Markdown (method, alpha) x (dataset, budget) of reading / coverage / seen; the best alpha."""
    means = _means(rows)
    cols = sorted({(k[2], k[3]) for k in means}, key=lambda c: (c[0], float(c[1].rstrip("%"))))
    lines = ["| method | size prior | " + " | ".join(f"{d} {b}" for d, b in cols) + " | mean reading |",
             "|---|---:|" + "---:|" * (len(cols) + 1)]
    score = {}
    for method in METHODS:
        for alpha in priors:
            cells = [means.get((method, alpha, d, b)) for d, b in cols]
            readings = [c["reading"] for c in cells if c]
            score[(method, alpha)] = sum(readings) / len(readings) if readings else float("nan")
            lines.append(f"| {method} | {alpha:g} | " + " | ".join(
                f"{c['reading']:.2f} / {c['coverage']:.2f} / {c['seen']:.2f}" if c else "" for c in cells)
                + f" | {score[(method, alpha)]:.3f} |")
    lines.append("\nEach cell: reading (ANLS) / answer coverage at full resolution / answer area seen at any size.")
    best = max(priors, key=lambda a: score[("patches", a)])
    return "\n".join(lines), best


def plot(rows: list[dict], priors: list[float], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    means = _means(rows)
    cols = sorted({(k[2], k[3]) for k in means})
    fig = Figure(figsize=(11, 3.6), layout="constrained")
    axes = fig.subplots(1, 2, sharey=True)
    for ax, method in zip(axes, METHODS):
        for i, (d, b) in enumerate(cols):
            pts = [(a, means[(method, a, d, b)]) for a in priors if (method, a, d, b) in means]
            ax.plot([a for a, _ in pts], [m["reading"] for _, m in pts], "o-", color=f"C{i}", label=f"{d} {b} reading")
            ax.plot([a for a, _ in pts], [m["seen"] for _, m in pts], ":", color=f"C{i}", label=f"{d} {b} seen")
        ax.set_title(f"{method} (validation images)")
        ax.set_xlabel("size prior alpha (score = mass / side^alpha)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("reading ANLS (solid), answer seen (dotted)")
    axes[1].legend(fontsize=7)
    fig.savefig(path, dpi=110)
    return path


if __name__ == "__main__":
    main()
