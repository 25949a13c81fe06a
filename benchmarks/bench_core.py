"""Stage timings of the batched pipeline next to the design seeds' per-item loops.

A batch of 8 images of 1024x1024 px (a rendered receipt, photos and noise, resized), K = 273 saccades:
the median wall time of each stage, arr_coc's batched version and a per-image loop measured side by
side (interleaved, same process), and their ratio. The loops do the same work one image at a time:
the seeds' texture (with arr_coc's distance transform), the same scorer called per image on the same
cell tensors, the seeds' samplers and extraction loops. Writes a markdown table and a PNG of the ratios.

    python benchmarks/bench_core.py [--repeats 5] [--batch 8] [--size 1024] [--out benchmarks/results]
"""
from __future__ import annotations

import argparse
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch
from seed_loops import nms_seed_loop, stratified_seed_loop, texture_seed_loop  # beside this script
from tqdm import tqdm

from arr_coc.engine.canvas import make_canvas
from arr_coc.engine.extract import extract_gather, extract_grid_sample, extract_loop
from arr_coc.engine.query import HashingQueryEncoder
from arr_coc.engine.relevance import ContextualScorer
from arr_coc.engine.samplers import nms_cells, topk_cells
from arr_coc.engine.stratified import stratified_cells
from arr_coc.engine.texture import MVP_CHANNELS, channel_layout, compute_texture, pool_to_cells

ROOT = Path(__file__).resolve().parents[1]


def images(batch: int, size: int) -> list[torch.Tensor]:
    """The bundled receipt plus smooth noise photos-to-be: real structure at the requested size."""
    from arr_coc.engine.imageio import load_image
    from arr_coc.engine.imageops import resize

    receipt = load_image(ROOT / "examples" / "receipt.jpg")
    g = torch.Generator().manual_seed(0)
    out = [resize(receipt, (size, size))]
    while len(out) < batch:
        low = torch.rand(1, 3, 16, 16, generator=g)
        img = torch.nn.functional.interpolate(low, size=(size, size), mode="bicubic")[0]
        out.append((img + 0.05 * torch.rand(3, size, size, generator=g)).clamp(0, 1))
    return out


def median_ms(fn, repeats: int, bar) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
        bar.update()
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--saccades", type=int, default=273)
    ap.add_argument("--cell", type=int, default=28)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    torch.manual_seed(0)

    canvas = make_canvas(images(args.batch, args.size), cell=args.cell)
    pixels, cell, k = canvas.pixels, canvas.cell, args.saccades
    layout = channel_layout(MVP_CHANNELS)
    with torch.no_grad():
        texture = compute_texture(pixels)  # [B, C, H, W]
        cells = pool_to_cells(texture, cell)  # [B, C, Hc, Wc]
        scorer = ContextualScorer(layout, gestalt_dim=cells.shape[1])
        with torch.no_grad():  # a query-dependent participatory head, so both versions do the full work
            scorer.part.weight.normal_(0, 0.05)
        query = HashingQueryEncoder().encode(["What is the total?"] * args.batch)
        gestalt = cells.mean((2, 3))
        relevance = scorer(cells, query, gestalt, canvas.valid).map
        positions = stratified_cells(relevance, k, canvas.valid).positions

    cases = [  # (stage, what, batched, seed loop)
        ("texture", "13 channels, full resolution", lambda: pool_to_cells(compute_texture(pixels), cell),
         lambda: pool_to_cells(texture_seed_loop(pixels), cell)),
        ("scoring", "three scorers + context weights, same cell tensors",
         lambda: scorer(cells, query, gestalt, canvas.valid),
         lambda: [scorer(cells[b:b + 1], query[b:b + 1], gestalt[b:b + 1], canvas.valid[b:b + 1])
                  for b in range(args.batch)]),
        ("selection", "stratified 4x4", lambda: stratified_cells(relevance, k, canvas.valid),
         lambda: stratified_seed_loop(relevance, k)),
        ("selection", "NMS, no two picks adjacent", lambda: nms_cells(relevance, k, canvas.valid, 2),
         lambda: nms_seed_loop(relevance.clone(), k, 1)),
        ("selection", "top-K (reference: batched both)", lambda: topk_cells(relevance, k, canvas.valid),
         lambda: [topk_cells(relevance[b:b + 1], k) for b in range(args.batch)]),
        ("extraction", "gather vs per-patch loop", lambda: extract_gather(pixels, positions, cell),
         lambda: extract_loop(pixels, positions, cell)),
        ("extraction", "grid_sample (differentiable) vs loop",
         lambda: extract_grid_sample(pixels, positions.float(), cell), lambda: extract_loop(pixels, positions, cell)),
    ]
    rows = []
    with torch.no_grad(), tqdm(total=2 * args.repeats * len(cases), desc="bench_core") as bar:
        for stage, what, ours, seed in cases:
            ours(), seed()  # warm-up
            t_ours, t_seed = [], []
            for _ in range(args.repeats):  # interleaved, so both see the same machine load
                t_ours.append(median_ms(ours, 1, bar))
                t_seed.append(median_ms(seed, 1, bar))
            rows.append((stage, what, statistics.median(t_ours), statistics.median(t_seed)))

    hc, wc = canvas.grid
    head = (f"Batch {args.batch} x {args.size}x{args.size} px -> canvas {pixels.shape[-2]}x{pixels.shape[-1]} "
            f"({hc}x{wc} cells of {cell} px), K = {k}; median of {args.repeats} interleaved runs, "
            f"torch {torch.__version__}, {torch.get_num_threads()} threads, {platform.machine()}.")
    lines = [f"made by: `python benchmarks/bench_core.py{'' if len(sys.argv) < 2 else ' ' + shlex.join(sys.argv[1:])}`", "", head, "", "| stage | what | arr_coc batched (ms) | per-image loop (ms) | speed-up |",
             "|---|---|---:|---:|---:|"]
    for stage, what, a, s in rows:
        lines.append(f"| {stage} | {what} | {a:.1f} | {s:.1f} | {s / a:.1f}x |")
    table = "\n".join(lines)
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_core.md").write_text(table + "\n")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.6))
    labels = [f"{s}: {w}" for s, w, _, _ in rows]
    ax.barh(labels[::-1], [s / a for _, _, a, s in rows][::-1], color="#4C72B0")
    ax.axvline(1, color="k", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("speed-up of the batched stage over the per-image loop (x, log scale)")
    ax.set_title(f"batch {args.batch} x {args.size}^2 px, K = {k}")
    fig.tight_layout()
    fig.savefig(args.out / "bench_core.png", dpi=120)
    print(f"wrote {args.out / 'bench_core.md'} and {args.out / 'bench_core.png'}")


if __name__ == "__main__":
    main()
