"""Train the shipped scorer and report it on held-out images: answer IoU and OCR reading accuracy.

    python benchmarks/run_training.py [--steps 300] [--test-limit 150]

1. Features of every FUNSD, SROIE and COCO record with the default channels (cached in
   out/features; the first run reads every page with OCR, ~30 min on 2 cores).
2. ``arr_coc.train.train``: proxy objective at a 10% token budget on the training images; the
   validation images are watched every 50 steps. Weights go to out/train/scorer/ (shipping them
   as the default is `arr-coc train ... --resume --export contextual`, printed at the end); metrics,
   config and the loss curve to benchmarks/results/train/.
3. On the test images only (never trained on, never used to choose anything): the evaluation
   harness's rows for the hand-set scorer and the learned one (``@learned``) at 10% and 25%,
   against full resolution, one uniformly downsampled image of the same token count, and random
   cells. Rows go to benchmarks/results/train/eval/<dataset>/records.jsonl (resumable).
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]

from arr_coc.allocators.methods import build_samplers  # noqa: E402
from arr_coc.config import ARRConfig, ScorerConfig  # noqa: E402
from arr_coc.data.datasets import load_dataset, split_of  # noqa: E402
from arr_coc.engine.canvas import make_canvas  # noqa: E402
from arr_coc.engine.pipeline import ARR  # noqa: E402
from arr_coc.eval.reading import READERS  # noqa: E402
from arr_coc.eval.report import markdown_table, pivot_table, plot_summary, summarize  # noqa: E402
from arr_coc.eval.run import allocation_rows  # noqa: E402
from arr_coc.eval.settings import EvalSettings  # noqa: E402
from arr_coc.eval.store import RowStore  # noqa: E402
from arr_coc.train import TrainConfig, hard_metrics, train  # noqa: E402
from arr_coc.train.features import build_examples, collate  # noqa: E402

DATASETS = ("funsd", "sroie", "coco")
OUT = ROOT / "benchmarks" / "results" / "train"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=TrainConfig.steps)
    p.add_argument("--test-limit", type=int, default=150, help="test records per dataset for the reading table")
    p.add_argument("--tokens", nargs="+", default=["10%", "25%"], help="total visual tokens per row (counts or shares)")
    p.add_argument("--skip-train", action="store_true", help="report the weights already in out/train")
    p.add_argument("--skip-reading", action="store_true", help="only the IoU table")
    args = p.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)

    config = ARRConfig(scorer=ScorerConfig(weights="none"))
    hand = ARR(config).eval()
    records = [r for name in DATASETS for r in load_dataset(name)]
    examples = build_examples(hand, records, ROOT / "out" / "features")
    cfg = TrainConfig(datasets=DATASETS, tokens="10%", steps=args.steps, out=str(ROOT / "out" / "train"),
                      fresh=not args.skip_train)
    weights = Path(cfg.out) / "scorer"
    if not args.skip_train:
        run = train(cfg, config, examples=examples, query_encoder=hand.query_encoder)
        for name in ("metrics.json", "loss.png", "config.json"):
            shutil.copyfile(Path(cfg.out) / name, OUT / name)
        print(json.dumps(run.metrics, indent=1))
        print(ship_hint(cfg, "contextual"))

    learned = ARR(ARRConfig(scorer=ScorerConfig(weights=str(weights))), query_encoder=hand.query_encoder).eval()
    iou = iou_table(hand, learned, [e for e in examples if split_of(e.split_group, e.dataset) == "test"])
    (OUT / "iou.md").write_text(iou)
    print(iou)
    if args.skip_reading:
        return
    by_id = {(e.dataset, e.record_id): e for e in examples}
    settings = EvalSettings(methods=("full", "uniform_image", "random", "topk", "stratified"), budgets=args.tokens)
    samplers = build_samplers(settings.methods)
    reader = READERS.get("tesseract")()
    report = []
    for name in DATASETS:
        test = load_dataset(name, limit=args.test_limit, split="test")
        store = RowStore(OUT / "eval" / name)
        done = store.done()
        with torch.no_grad():
            for record in tqdm(test, desc=f"reading {name}"):
                e = by_id[(record.dataset, record.record_id)]
                canvas = make_canvas(record.image, cell=config.canvas.cell, min_pixels=config.canvas.min_pixels,
                                     max_pixels=config.canvas.max_pixels)
                if canvas.grid != e.grid:
                    raise ValueError(f"{record.image}: canvas {canvas.grid} but features {e.grid}")
                batch = collate([e])
                for arr, suffix in ((hand, ""), (learned, "@learned")):
                    rel = arr.scorer(batch["cells"], batch["query"], batch["gestalt"], batch["valid"]).map
                    store.append(allocation_rows(record, canvas, rel, batch["query"], samplers, reader, settings,
                                                 done, suffix))
        summary = summarize(store.rows())
        plot_summary(summary, store.folder / "summary.png")
        report.append(f"## {name} (test images)\n\n" + markdown_table(summary))
        for column in ("reading", "coverage", "iou"):
            if any(r.get(column) == r.get(column) and r.get(column) is not None for r in summary):
                report.append(f"{column}:\n\n" + pivot_table(summary, column))
    (OUT / "reading.md").write_text("\n\n".join(report) + "\n")
    print("\n\n".join(report))


def ship_hint(cfg: TrainConfig, name: str) -> str:
    """How to ship a finished run as the weights ``name``: resume it at its last step and export (no retraining)."""
    return (f"weights: {cfg.out}/{cfg.learner}/; to ship them as {name!r}: arr-coc train --learner {cfg.learner} "
            f"--datasets {' '.join(cfg.datasets)} --steps {cfg.steps} --out {cfg.out} --resume --export {name}")


def iou_table(hand: ARR, learned: ARR, test: list) -> str:
    """Answer IoU (the seeds' proxy) and answer coverage of top-K at several budgets: initial, learned, random."""
    lines = ["| budget | dataset | n | IoU initial | IoU learned | IoU random | learned / initial "
             "| coverage initial | coverage learned |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for budget in ("3%", "5%", "10%", "25%"):
        for name in (*DATASETS, "all"):
            sub = [e for e in test if name in ("all", e.dataset)]
            i, j = hard_metrics(hand.scorer, sub, budget), hard_metrics(learned.scorer, sub, budget)
            r = hard_metrics(hand.scorer, sub, budget, random_seed=0)
            lines.append(f"| {budget} | {name} | {i['n']} | {i['iou']:.3f} | {j['iou']:.3f} | {r['iou']:.3f} | "
                         f"{j['iou'] / i['iou']:.2f}x | {i['coverage']:.3f} | {j['coverage']:.3f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
