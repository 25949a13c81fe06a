"""Choose the default allocation on validation images: which sampler reads at least as well as the
uniformly downsampled image and as top-K at every budget, on forms, receipts and photos.

    python benchmarks/run_defaults.py [--limit 30] [--jobs 2] [--candidates topk stratified nms pruner]

Runs `arr-coc eval --split val` (images never trained on, never reported) on FUNSD and SROIE
(Tesseract ANLS) and COCO (answer coverage; every validation question) for the candidates: the
samplers on the shipped trained scorer and default channels (top-K, stratified, NMS), the trained
token pruner, and the uniformly downsampled image. Rows go to benchmarks/results/defaults/val/<dataset>/
(resumable); the tables and the per-budget verdict go to benchmarks/results/defaults/val/report.md.
"""
from __future__ import annotations

import argparse
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

OUT = ROOT / "benchmarks" / "results" / "defaults" / "val"
CANDIDATES = ("topk", "stratified", "nms", "pruner")
BUDGETS = ("5%", "10%", "25%", "50%")
DATASETS = {"funsd": "reading", "sroie": "reading", "coco": "coverage"}  # the headline metric of each


def run(dataset: str, limit: int, candidates: tuple[str, ...] = CANDIDATES) -> Path:
    import torch

    torch.set_num_threads(1)  # one core per dataset process
    from arr_coc.cli import main
    from arr_coc.weights import PACKAGED

    extra = ["--reader", "none"] if dataset == "coco" else ["--limit", str(limit)]
    # `eval` refuses the shipped weights on non-test images unless they are named: here they are being
    # chosen, which is what the validation images are for (they were never trained on)
    weights = ["--scorer-weights", str(PACKAGED / "contextual"), "--pruner-weights", str(PACKAGED / "pruner")]
    code = main(["eval", dataset, "--split", "val", "--methods", "full", "uniform_image", *candidates,
                 "--tokens", *BUDGETS, "--out", str(OUT), *weights, *extra])
    if code:
        raise SystemExit(f"eval {dataset} failed ({code})")
    return OUT / dataset / "records.jsonl"


def verdict(summaries: dict[str, list[dict]], candidates: tuple[str, ...] = CANDIDATES) -> str:
    """Per candidate: its margin over the better of uniform_image and top-K at each (dataset, budget)."""
    cols = [(d, b) for d in DATASETS for b in BUDGETS]
    lines = ["| candidate | " + " | ".join(f"{d} {b}" for d, b in cols) + " | never below |",
             "|---|" + "---:|" * len(cols) + "---|"]
    for cand in candidates:
        cells, ok = [], True
        for d, b in cols:
            value = {s["method"]: s[DATASETS[d]] for s in summaries[d] if s["budget"] == b}
            refs = [value[m] for m in ("uniform_image", "topk") if m in value and value[m] == value[m]]
            if cand not in value or not refs:
                cells.append("")
                continue
            margin = value[cand] - max(refs)
            ok &= margin >= 0
            cells.append(f"{margin:+.3f}")
        lines.append(f"| {cand} | " + " | ".join(cells) + f" | {'yes' if ok else 'no'} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=30, help="validation questions of FUNSD and SROIE")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--table-only", action="store_true")
    ap.add_argument("--candidates", nargs="+", default=list(CANDIDATES), help="methods to choose among")
    args = ap.parse_args()
    if not args.table_only:
        with ProcessPoolExecutor(args.jobs) as pool:
            for fut in [pool.submit(run, d, args.limit, tuple(args.candidates)) for d in DATASETS]:
                fut.result()
    from arr_coc.eval.report import pivot_table, summarize
    from arr_coc.eval.store import RowStore

    summaries, parts = {}, []
    for d, column in DATASETS.items():
        rows = RowStore(OUT / d).rows()
        summaries[d] = summarize(rows)
        n = max(s["n"] for s in summaries[d])
        parts.append(f"### {d}: {column} ({n} validation questions)\n\n{pivot_table(summaries[d], column)}")
    parts.append("### margin over the better of uniform_image and topk (headline metric)\n\n"
                 + verdict(summaries, tuple(args.candidates)))
    text = "\n\n".join(parts) + "\n"
    (OUT / "report.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
