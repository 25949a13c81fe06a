"""Is the vision tower slower on scattered saccades than on one grid of as many tokens? bench_vlm's ``arr`` row against
``native_budget`` at equal tokens, the tower alone.

The Qwen2.5-VL-3B widths with ``--depth`` layers per tower (random weights), one page of ``--size`` px; three tower
calls of the same number of tokens (gestalt 8x8 + K saccades = a square grid), interleaved ``--repeats`` times:
(a) one grid of that many cells (what ``native_budget`` sends; no processor: the cells are cut from the page);
(b) gestalt + K cells scattered over the page (every third cell, as a relevance map spreads them);
(c) gestalt + K cells in one compact block. The window attention of the tower groups patches by windows of
4 x 4 cells: scattered cells make many small windows. Prints the median and range of each call.

    python benchmarks/sparse_tower.py [--depth 4] [--size 560] [--saccades 132] [--repeats 5]
"""
from __future__ import annotations

import argparse
import math
import statistics
import time

import torch
from qwen_3b import build_model, page, qwen25_vl_3b_config

from arr_coc.engine.plan import Plan
from arr_coc.vlm import encode
from arr_coc.vlm.processing import all_cells
from arr_coc.vlm.qwen import Qwen25VLAdapter


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--size", type=int, default=560)
    ap.add_argument("--saccades", type=int, default=132)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    config = qwen25_vl_3b_config(layers=args.depth)
    adapter = Qwen25VLAdapter(build_model(config, torch.bfloat16, small_config=qwen25_vl_3b_config(layers=1, vocab=64)))
    image, cell = page(args.size), adapter.cell
    grid = (args.size // cell, args.size // cell)
    side = math.isqrt(64 + args.saccades)
    if side * side != 64 + args.saccades:
        raise SystemExit(f"--saccades {args.saccades}: gestalt 8x8 + K must be a square")
    cells = all_cells(*grid)  # [N, 2] (y, x) raster order
    scattered = cells[::3][:args.saccades]
    if len(scattered) < args.saccades:
        raise SystemExit(f"--saccades {args.saccades} exceeds every third cell of the {grid} page")
    compact = torch.stack(torch.meshgrid(torch.arange(grid[0]), torch.arange(grid[1]), indexing="ij"), -1)
    compact = compact[:, :math.ceil(args.saccades / grid[0])].reshape(-1, 2)[:args.saccades]  # left columns
    small = image[:, :side * cell, :side * cell]
    calls = {f"(a) one {side}x{side} grid": lambda: encode(adapter, [Plan("grid", "full", (side, side))], [small]),
             "(b) gestalt + scattered cells": lambda: encode(
                 adapter, [Plan("arr", "cells", grid, gestalt=(8, 8), cells=scattered)], [image]),
             "(c) gestalt + one block of cells": lambda: encode(
                 adapter, [Plan("arr", "cells", grid, gestalt=(8, 8), cells=compact)], [image])}
    times: dict[str, list[float]] = {name: [] for name in calls}
    with torch.inference_mode():
        for call in calls.values():
            call()
        for _ in range(args.repeats):
            for name, call in calls.items():
                start = time.perf_counter()
                vis = call()[0]
                times[name].append((time.perf_counter() - start) * 1e3)
                assert len(vis) == side * side  # equal tokens
    print(f"{args.depth} layers per tower, {side * side} tokens each, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; tower ms, median (min-max) of {args.repeats}:")
    for name, ms in times.items():
        print(f"  {name}: {statistics.median(ms):.0f} ({min(ms):.0f}-{max(ms):.0f})")


if __name__ == "__main__":
    main()
