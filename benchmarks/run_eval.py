"""Run `arr-coc eval` on the three bundled-elsewhere datasets and collect the tables for the README.

    python benchmarks/run_eval.py [--limit 40] [--jobs 2] [--split test] [--out benchmarks/results/eval]

Test images by default: the shipped scorer, pruner and selector were trained on the training images and the
default was chosen on the validation images (docs/defaults.md). Each dataset runs in its own process (Tesseract is single-threaded); results are resumable: a rerun
skips the records already in OUT/<dataset>/records.jsonl.
"""
from __future__ import annotations

import argparse
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATASETS = ("funsd", "sroie", "coco")


def run_one(name: str, limit: int, out: Path, split: str, extra: list[str]) -> str:
    import torch

    torch.set_num_threads(1)  # one core per dataset process
    from arr_coc.cli import main
    from arr_coc.data.datasets import DATASETS as SPECS

    reader = [] if SPECS.get(name).reader else ["--reader", "none"]  # the spec's reader: COCO has no text to read
    code = main(["eval", name, "--limit", str(limit), "--split", split, "--out", str(out), *reader, *extra])
    if code:
        raise SystemExit(f"eval {name} failed with code {code}")
    from arr_coc.eval.report import pivot_table, summarize
    from arr_coc.eval.store import RowStore

    summary = summarize(RowStore(out / name).rows())
    tables = [f"{col} (mean over records)\n\n{pivot_table(summary, col)}" for col in ("reading", "coverage")
              if any(s[col] == s[col] for s in summary if s["method"] != "full")]
    return "\n\n".join(tables)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=40)
    ap.add_argument("--split", choices=("val", "test"), default="test",
                    help="images to evaluate: test to report, val to choose a setting")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "eval")
    ap.add_argument("--datasets", nargs="+", default=list(DATASETS))
    ap.add_argument("extra", nargs=argparse.REMAINDER, help="further `arr-coc eval` flags after --")
    args = ap.parse_args()
    extra = [a for a in args.extra if a != "--"]
    with ProcessPoolExecutor(args.jobs) as pool:
        futures = {n: pool.submit(run_one, n, args.limit, args.out, args.split, extra) for n in args.datasets}
        text = "\n\n".join(f"### {name}\n\n{fut.result()}" for name, fut in futures.items())
    (args.out / "tables.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
