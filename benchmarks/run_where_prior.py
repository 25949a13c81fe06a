"""The where prior on layouts it never saw: the trained scorer with and without it, beside the uniform image.

    python benchmarks/run_where_prior.py --split val --limit 30        # choose the default (validation)
    python benchmarks/run_where_prior.py --split test --limit 40       # report it (test)

For each record of the datasets asked (default ``texlive``: single pages of LaTeX manuals no shipped
weights were trained on), the image's features are computed once (cached in out/features) and the
shipped scorer scores them twice: as trained (``topk``: the default ``arr`` method) and with its
query-weighted where prior off (``topk@noprior``, ``ScorerConfig.where_prior = 0``); the uniformly
downsampled image of the same token count and full resolution are read beside them, by Tesseract
on the answer region. Rows go to benchmarks/results/where_prior/<dataset>-<split>/ (resumable),
the reading table to its summary.md.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch
from tqdm import tqdm

from arr_coc.allocators.methods import build_samplers
from arr_coc.config import ARRConfig, ScorerConfig
from arr_coc.data.datasets import load_dataset
from arr_coc.engine.canvas import make_canvas
from arr_coc.engine.pipeline import ARR
from arr_coc.eval.reading import READERS
from arr_coc.eval.report import pivot_table, summarize
from arr_coc.eval.run import allocation_rows
from arr_coc.eval.settings import EvalSettings
from arr_coc.eval.store import RowStore
from arr_coc.train.features import build_examples, collate
from arr_coc.weights import refuse_leakage

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "where_prior"
METHODS = ("full", "uniform_image", "topk")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--datasets", nargs="+", default=["texlive"])
    p.add_argument("--split", choices=("val", "test"), required=True)
    p.add_argument("--limit", type=int, default=30, help="records per dataset (a seeded subset spread over images)")
    p.add_argument("--tokens", nargs="+", default=["5%", "10%", "25%", "50%"])
    args = p.parse_args(argv)
    hand = ARR(ARRConfig(scorer=ScorerConfig(weights="none"))).eval()  # features do not depend on weights
    shipped = ARR(ARRConfig(), query_encoder=hand.query_encoder).eval()
    settings = EvalSettings(methods=METHODS, budgets=args.tokens)
    samplers, reader = build_samplers(METHODS), READERS.get("tesseract")()
    for name in args.datasets:
        records = load_dataset(name, limit=args.limit, split=args.split)
        refuse_leakage(name, args.split, shipped, ("topk",), images=sorted({r.image for r in records}))
        examples = {e.record_id: e for e in build_examples(hand, records, ROOT / "out" / "features")}
        store = RowStore(OUT / f"{name}-{args.split}")
        done = store.done()
        with torch.no_grad():
            for record in tqdm(records, desc=f"{name} {args.split}"):
                e = examples[record.record_id]
                c = shipped.config.canvas
                canvas = make_canvas(record.image, cell=c.cell, min_pixels=c.min_pixels, max_pixels=c.max_pixels)
                batch = collate([e])
                for where, suffix in ((1.0, ""), (0.0, "@noprior")):
                    rel = shipped.scorer(batch["cells"], batch["query"], batch["gestalt"], batch["valid"], where=where)
                    store.append(allocation_rows(record, canvas, rel.map, batch["query"], samplers, reader, settings,
                                                 done, suffix))
        summary = summarize(store.rows())
        table = pivot_table(summary, "reading")
        command = f"python benchmarks/run_where_prior.py --datasets {name} --split {args.split} --limit {args.limit}"
        (store.folder / "summary.md").write_text(f"{command}\n\nreading ({len(records)} questions):\n\n{table}")
        print(f"## {name} {args.split} ({len(records)} questions, {len({r.image_id for r in records})} images)\n")
        print(table)


if __name__ == "__main__":
    main()
