"""How far each training relaxation's answer loss is from the exact sparse inference path's, on tiny VLMs.

For each tiny random-weight family, ``--images`` random pages of 6 x 8 cells, one question and answer
each, and ``--maps`` random relevance maps per page: the answer cross-entropy of

* exact -- the top K cells of the relevance encoded sparse at weight one (what inference sends);
* weighted -- every cell encoded, scaled by the soft top-K of the z-scored relevance (temperature
  ``--temperature``, the training default);
* candidates -- only the top 2K cells encoded sparse, scaled by the same soft weights,

all with the gestalt of the evaluation's split of the tokens first (:func:`arr_coc.vlm.answer_loss.relaxation_gap`).
Reported: mean gap (relaxation - exact), mean |gap|, and the Pearson correlation of relaxation and
exact losses across the maps of one page (averaged over pages): a relaxation trains the scorer
well when it ranks relevance maps as the exact path does. Random weights: the figures show how the
relaxations differ structurally, not how a trained model's losses would.

    python benchmarks/bench_relaxation_gap.py [--images 8] [--maps 12] [--tokens 25%]
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any, Sequence

import torch
from tqdm import tqdm

from arr_coc.budget import Budget
from arr_coc.vlm import load_vlm
from arr_coc.vlm.answer_loss import relaxation_gap

ROOT = Path(__file__).resolve().parents[1]
FAMILIES = ("qwen2_5_vl", "qwen3_vl", "llava")
QUESTIONS = [("What is the total?", "12.50"), ("What is the date?", "2024-03-01"), ("Who signed?", "Ann Lee")]


def pearson(a: Sequence[float], b: Sequence[float]) -> float:
    return float(torch.corrcoef(torch.tensor([list(a), list(b)], dtype=torch.float64))[0, 1])


def measure(family: str, images: int, maps: int, tokens: str, temperature: float, seed: int) -> dict[str, Any]:
    adapter = load_vlm(f"tiny:{family}")
    adapter.model.requires_grad_(False).eval()
    grid = (6, 8)
    (gestalt,), k = Budget.parse(tokens).split([grid])
    g = torch.Generator().manual_seed(seed)
    gaps: dict[str, list[float]] = {"weighted": [], "candidates": []}
    corr: dict[str, list[float]] = {"weighted": [], "candidates": []}
    exact_all = []
    for i in tqdm(range(images), desc=family):
        img = torch.rand(3, grid[0] * adapter.cell, grid[1] * adapter.cell, generator=g)
        q, a = QUESTIONS[i % len(QUESTIONS)]
        rel = [torch.randn(grid, generator=g) for _ in range(maps)]
        out = relaxation_gap(adapter, [img] * maps, [q] * maps, [a] * maps, rel, [k] * maps,
                             temperature=temperature, gestalt=[gestalt] * maps)
        exact_all += out["exact"].tolist()
        for name in gaps:
            gaps[name] += out[f"gap_{name}"].tolist()
            corr[name].append(pearson(out[name].tolist(), out["exact"].tolist()))
    return {"family": family, "k": k, "gestalt": gestalt, "exact": statistics.mean(exact_all),
            **{f"{n}_gap": statistics.mean(v) for n, v in gaps.items()},
            **{f"{n}_abs": statistics.mean(abs(x) for x in v) for n, v in gaps.items()},
            **{f"{n}_corr": statistics.mean(v) for n, v in corr.items()}}


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=8)
    ap.add_argument("--maps", type=int, default=12, help="random relevance maps per page")
    ap.add_argument("--tokens", default="25%", help="visual tokens per page (gestalt + saccades): a count or a share")
    ap.add_argument("--temperature", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args(argv)
    rows = [measure(f, args.images, args.maps, args.tokens, args.temperature, args.seed) for f in FAMILIES]
    r0 = rows[0]
    lines = [f"Tiny random-weight VLMs, {args.images} random 6x8-cell pages x {args.maps} random relevance maps, "
             f"{args.tokens} tokens = gestalt {r0['gestalt'][0]}x{r0['gestalt'][1]} + K = {r0['k']}, soft top-K "
             f"temperature {args.temperature}; gap = relaxation loss - exact sparse loss (nats per answer token); "
             f"corr = Pearson correlation with the exact loss across one page's maps, mean over pages.", "",
             "| family | exact loss | weighted: mean gap | mean abs gap | corr | candidates (2K): mean gap | "
             "mean abs gap | corr |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['family']} | {r['exact']:.3f} | {r['weighted_gap']:+.3f} | {r['weighted_abs']:.3f} | "
                     f"{r['weighted_corr']:.2f} | {r['candidates_gap']:+.3f} | {r['candidates_abs']:.3f} | "
                     f"{r['candidates_corr']:.2f} |")
    print("\n".join(lines))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_relaxation_gap.md").write_text("\n".join(lines) + "\n")
    return rows


if __name__ == "__main__":
    main()
