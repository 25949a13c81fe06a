"""Channel ablation: coverage and reading with and without each question-coupled channel.

Runs `arr-coc eval` per (channel set, dataset) with top-K and stratified at 10% and 25% of the
full-resolution tokens (the same seeded records for every channel set), then joins the summaries into one
table.

    python benchmarks/run_ablation.py [--limit 100] [--jobs 2] [--split test]

Test images by default (the shipped scorer was trained on the training images). A channel set other than
the default runs with the hand-set scorer, since the shipped weights fit the default channels only.
"""
from __future__ import annotations

import argparse
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
METHODS = ("topk", "stratified")
BUDGETS = ("10%", "25%")
CONFIGS = {  # name -> (channels, datasets)
    "mvp": (("mvp",), ("funsd", "sroie", "coco")),  # the 13 question-blind channels alone
    "+text": (("mvp", "text_match", "key_value"), ("funsd", "sroie")),
    "+objects": (("mvp", "objects"), ("coco",)),
    "+learned_saliency": (("mvp", "learned_saliency"), ("funsd", "sroie", "coco")),
    "+all": (("mvp", "text_match", "key_value", "objects", "learned_saliency"), ("funsd", "sroie", "coco")),
    "default": (("default",), ("funsd", "sroie", "coco")),  # what ships: mvp + text + learned_saliency
}


def run(config: str, dataset: str, limit: int, split: str = "test") -> Path:
    import torch

    torch.set_num_threads(1)
    from arr_coc.cli import main

    channels, _ = CONFIGS[config]
    out = RESULTS / "ablation" / config.lstrip("+")
    reader = ["--reader", "none"] if dataset == "coco" else []
    code = main(["eval", dataset, "--limit", str(limit), "--split", split, "--out", str(out), "--methods", *METHODS,
                 "--tokens", *BUDGETS, "--channels", *channels, *reader])
    if code:
        raise SystemExit(f"{config} {dataset} failed ({code})")
    return out / dataset / "records.jsonl"


def table(limit: int) -> str:
    """Every channel set on the same records: the ones all runs of a dataset have finished."""
    from arr_coc.eval.report import summarize
    from arr_coc.eval.store import RowStore

    lines = ["| dataset | channels | n | budget | method | coverage | hit rate | reading (ANLS) |",
             "|---|---|---:|---|---|---:|---:|---:|"]
    runs = [(c, RESULTS / "ablation" / c.lstrip("+")) for c in CONFIGS]
    fmt = lambda v: "—" if v != v else f"{v:.3f}"
    for dataset in ("funsd", "sroie", "coco"):
        found = {}
        for name, folder in runs:
            path = folder / dataset / "records.jsonl"
            if dataset in CONFIGS[name][1] and path.exists():
                rows = RowStore(path.parent).rows()
                found[name] = [r for r in rows if r["method"] in METHODS and r["budget"] in BUDGETS]
        if not found:
            continue
        done = [{r["record_id"] for r in rows if sum(1 for q in rows if q["record_id"] == r["record_id"])
                 == len(METHODS) * len(BUDGETS)} for rows in found.values()]
        common = set.intersection(*done)
        for name, rows in found.items():
            for s in summarize([r for r in rows if r["record_id"] in common]):
                lines.append(f"| {dataset} | {name} | {s['n']} | {s['budget']} | {s['method']} | "
                             f"{fmt(s['coverage'])} | {fmt(s['hit'])} | {fmt(s['reading'])} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=100)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS))
    ap.add_argument("--table-only", action="store_true")
    ap.add_argument("--split", choices=("val", "test"), default="test")
    args = ap.parse_args()
    if not args.table_only:
        jobs = [(c, d) for c in args.configs for d in CONFIGS[c][1]]
        with ProcessPoolExecutor(args.jobs) as pool:
            for fut in [pool.submit(run, c, d, args.limit, args.split) for c, d in jobs]:
                fut.result()
    text = table(args.limit)
    (RESULTS / "ablation" / "summary.md").parent.mkdir(parents=True, exist_ok=True)
    (RESULTS / "ablation" / "summary.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
