"""Choose the default allocation on validation images: which sampler reads at least as well as the
uniformly downsampled image and as top-K at every budget, on forms, receipts and photos.

    python benchmarks/run_defaults.py [--limit 30] [--jobs 2] [--candidates topk stratified nms pruner] [--out DIR]

Evaluates the validation images of the group splits (never trained on) on FUNSD and SROIE
(Tesseract ANLS) and COCO (answer coverage; every validation question) for the candidates: the
samplers on the shipped trained scorer and default channels (top-K, stratified, NMS), the trained
token pruner, and the uniformly downsampled image. Rows go to DIR/<dataset>/ (resumable; not
committed); the tables, the per-budget verdict with a 95 % paired bootstrap interval of each margin,
go to DIR/report.md.

Why not `arr-coc eval --split val`: the shipped weights record the pixel hash of every validation
image, because training measured them on it every `eval_every` steps (a curve, loss.png; the last step
is exported, no checkpoint is picked by it), and `eval` refuses any recorded image. Choosing among
samplers for those fixed weights is what validation images are for, so this script runs the same
evaluation (:func:`arr_coc.eval.evaluate.evaluate`) without that refusal; the test images stay refused.
"""
from __future__ import annotations

import argparse
import random
import shlex
import sys
from concurrent.futures import ProcessPoolExecutor
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

OUT = ROOT / "benchmarks" / "results" / "defaults" / f"val_{date.today():%Y%m%d}"
CANDIDATES = ("topk", "stratified", "nms", "pruner")
BUDGETS = ("5%", "10%", "25%", "50%")
DATASETS = {"funsd": "reading", "sroie": "reading", "coco": "coverage"}  # the headline metric of each
REFERENCES = ("uniform_image", "topk")  # a candidate must be at least as good as the better of these


def run(dataset: str, limit: int, candidates: tuple[str, ...], out: Path, made_by: str) -> Path:
    import torch

    torch.set_num_threads(1)  # one core per dataset process (a script's own process, not library code)
    from arr_coc.config import ARRConfig
    from arr_coc.data.datasets import load_dataset
    from arr_coc.engine.pipeline import ARR
    from arr_coc.eval.evaluate import evaluate
    from arr_coc.eval.report import write_reports
    from arr_coc.eval.settings import EvalSettings
    from arr_coc.eval.store import requested
    from arr_coc.weights import PACKAGED

    records = load_dataset(dataset, split="val", limit=None if dataset == "coco" else limit, seed=0)
    arr = ARR(ARRConfig()).eval()  # the default: shipped contextual scorer, default channels, top-K
    if arr.weights_source == "hand-set":
        raise SystemExit("the shipped contextual weights did not load; nothing to choose for")
    methods = ["full", "uniform_image", *candidates]
    learned = {"selector": "auto", "pruner": str(PACKAGED / "pruner")}
    settings = EvalSettings(methods=methods, budgets=BUDGETS, seed=0, learned=learned,
                            reader=None if DATASETS[dataset] == "coverage" else "tesseract")
    jsonl = evaluate(records, arr, out / dataset, settings, progress=False)
    write_reports(jsonl, keys=requested(records, methods, BUDGETS), made_by=made_by)
    return jsonl


def interval(diffs: list[float], draws: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95 % percentile bootstrap interval of the mean of paired differences (questions resampled)."""
    rng = random.Random(seed)
    n = len(diffs)
    means = sorted(sum(rng.choice(diffs) for _ in range(n)) / n for _ in range(draws))
    return means[int(0.025 * draws)], means[int(0.975 * draws) - 1]


def verdict(rows: dict[str, list[dict]], candidates: tuple[str, ...]) -> str:
    """Per candidate and (dataset, budget): its mean margin over the better of the references, with a
    95 % paired bootstrap interval (the better reference is chosen on the means, then paired per question)."""
    cols = [(d, b) for d in DATASETS for b in BUDGETS]
    lines = ["| candidate | " + " | ".join(f"{d} {b}" for d, b in cols) + " | never below (mean) |"
             " below beyond its interval |",
             "|---|" + "---:|" * len(cols) + "---|---|"]
    for cand in candidates:
        cells, ok, beyond = [], True, []
        for d, b in cols:
            metric = DATASETS[d]
            per = {}  # method -> {record_id: value}
            for r in rows[d]:
                if r["budget"] == b and r.get(metric) == r.get(metric) and r.get(metric) is not None:
                    per.setdefault(r["method"], {})[r["record_id"]] = r[metric]
            refs = [m for m in REFERENCES if m in per]
            if cand not in per or not refs:
                cells.append("")
                continue
            means = {m: sum(per[m].values()) / len(per[m]) for m in (*refs, cand)}
            ref = max(refs, key=lambda m: means[m])
            shared = sorted(set(per[cand]) & set(per[ref]))
            diffs = [per[cand][k] - per[ref][k] for k in shared]
            margin = sum(diffs) / len(diffs)
            lo, hi = interval(diffs)
            ok &= margin >= 0
            if hi < 0:
                beyond.append(f"{d} {b}")
            cells.append(f"{margin:+.3f} [{lo:+.3f}, {hi:+.3f}]")
        lines.append(f"| {cand} | " + " | ".join(cells) + f" | {'yes' if ok else 'no'} | "
                     f"{', '.join(beyond) or 'none'} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=30, help="validation questions of FUNSD and SROIE")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--table-only", action="store_true")
    ap.add_argument("--candidates", nargs="+", default=list(CANDIDATES), help="methods to choose among")
    ap.add_argument("--out", type=Path, default=OUT, help="result folder (default: val_<today>)")
    args = ap.parse_args()
    made_by = "python benchmarks/run_defaults.py " + shlex.join(sys.argv[1:])
    candidates = tuple(args.candidates)
    if not args.table_only:
        with ProcessPoolExecutor(args.jobs) as pool:
            futures = [pool.submit(run, d, args.limit, candidates, args.out, made_by) for d in DATASETS]
            for fut in futures:
                fut.result()
    from arr_coc.eval.report import pivot_table, summarize
    from arr_coc.eval.store import RowStore

    rows, parts = {}, [f"made by: `{made_by}`"]
    for d, column in DATASETS.items():
        rows[d] = RowStore(args.out / d).rows()
        summary = summarize(rows[d])
        n = max(s["n"] for s in summary)
        parts.append(f"### {d}: {column} ({n} validation questions)\n\n{pivot_table(summary, column)}")
    parts.append("### margin over the better of uniform_image and topk (headline metric), "
                 "mean [95 % paired bootstrap interval]\n\n" + verdict(rows, candidates))
    text = "\n\n".join(parts) + "\n"
    (args.out / "report.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
