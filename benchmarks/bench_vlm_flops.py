"""bench_vlm's ``--flops-only`` table: FLOP estimates of the methods on the model built on the meta device (no
memory, no timing of the VLM), and ARR's measured allocation time on the page."""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
from qwen_3b import page, prompt_ids, qwen25_vl_3b_config
from tqdm import tqdm

from arr_coc.vlm.cost import prefill_flops
from arr_coc.vlm.qwen import Qwen25VLAdapter

METHODS = ("full resolution", "native_budget", "sparse, arr allocation", "sparse, vlm relevance")


def flop_table(args: argparse.Namespace, arr_allocator: Any) -> list[dict[str, Any]]:
    """FLOP estimates of the three methods on the real-size model built on the meta device, and ARR's
    allocation time on the page (measured, ``--repeats`` times, image cache emptied each time)."""
    from transformers import Qwen2_5_VLForConditionalGeneration

    from arr_coc.engine.cache import ImageCache

    config = qwen25_vl_3b_config(tiny=args.tiny, layers=args.depth)
    with torch.device("meta"):
        adapter = Qwen25VLAdapter(Qwen2_5_VLForConditionalGeneration(config))
    cell = adapter.cell
    grid = (args.size // cell, args.size // cell)
    arr = arr_allocator(cell, args.size, args.channels, args.query_encoder)
    gestalt = arr.config.gestalt.grid_for(args.saccades, grid)
    pre, suf = prompt_ids(config, args.seed)
    mm, g, k = adapter.merge ** 2, gestalt[0] * gestalt[1], args.saccades
    sparse = len(pre) + g + k + len(suf)
    rows = [dict(method=METHODS[0], flops=prefill_flops(adapter, len(pre) + grid[0] * grid[1] + len(suf),
                                                       (grid[0] * grid[1] * mm,))),
            dict(method=METHODS[2], flops=prefill_flops(adapter, sparse, (g * mm, k * mm))),
            dict(method=METHODS[3], flops=prefill_flops(adapter, sparse, (g * mm, k * mm), len(suf), len(pre) + g))]
    image, times = page(args.size), []
    with torch.inference_mode():
        arr(page(8 * cell), args.question, saccades=16)  # loads the channels' models
        for _ in tqdm(range(args.repeats), desc="arr allocation"):
            arr.cache = ImageCache()
            t = time.perf_counter()
            alloc = arr(image, args.question, saccades=k)
            times.append((time.perf_counter() - t) * 1e3)
    full = rows[0]["flops"]["total"]
    lines = [f"FLOP estimate (flops_estimate: 2 per weight per token + attention, the tower's window attention "
             f"counted per window), {'tiny' if args.tiny else 'Qwen2.5-VL-3B-Instruct'} architecture, one "
             f"{args.size}x{args.size} px page = {grid[0]}x{grid[1]} cells, gestalt {gestalt[0]}x{gestalt[1]} + K = "
             f"{k}, {len(pre) + len(suf)} text tokens; allocation = the VLM work of choosing the saccades (the "
             "first look's question tokens once more; ARR's own models are not counted):", "",
             "| method | prompt tokens | tower patches | vision TFLOP | LLM TFLOP | allocation TFLOP | total TFLOP | "
             "full / method | allocation share |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r, (prompt, segs) in zip(rows, [(len(pre) + grid[0] * grid[1] + len(suf), (grid[0] * grid[1] * mm,)),
                                        (sparse, (g * mm, k * mm)), (sparse, (g * mm, k * mm))]):
        f = r["flops"]
        lines.append(f"| {r['method']} | {prompt} | {' + '.join(map(str, segs))} | {f['vision'] / 1e12:.3f} | "
                     f"{f['llm'] / 1e12:.3f} | {f['allocation'] / 1e12:.4f} | {f['total'] / 1e12:.3f} | "
                     f"{full / f['total']:.2f}x | {100 * f['allocation'] / f['total']:.2f}% |")
    lines += ["", f"ARR's allocation on this page, measured (channels {list(arr.channels)}, {args.query_encoder} query "
                  f"encoder, image cache emptied each time; torch {torch.__version__}, {torch.get_num_threads()} "
                  f"threads): median {statistics.median(times):.0f} ms of {args.repeats} "
                  f"({', '.join(f'{x:.0f}' for x in times)}); stages of the last run: "
                  + ", ".join(f"{n} {v:.0f}" for n, v in alloc.timings_ms.items()) + " ms."]
    table = "\n".join(lines)
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_vlm_flops.md").write_text(table + "\n")
    print(f"wrote {args.out / 'bench_vlm_flops.md'}")
    return rows

