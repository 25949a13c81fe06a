"""bench_vlm's results: per (batch, method) medians and ranges, the markdown tables, the paragraph that says what
was run, and the plot."""
from __future__ import annotations

import argparse
import platform
import resource
import statistics
import sys
from pathlib import Path
from typing import Any, Sequence

import torch

from arr_coc.vlm.cost import prefill_flops

METHODS = ("full resolution", "native_budget", "sparse, arr allocation", "sparse, vlm relevance")
ROW_COLUMNS = ("method", "batch", "visual tokens per page", "allocation (ms)", "vision (ms)", "prefill (ms)",
               "time to first token (ms) min / median / max", "pages/s (median)", "allocation share",
               "speed-up (range over repeats)", "est. FLOP ratio")
AGREE = 0.10  # native_budget and arr do the same tower + LLM work: their times must agree within this


def result_stem(device: torch.device) -> str:
    """The results' file name: ``bench_vlm`` on the CPU, ``bench_vlm_cuda`` on a GPU (the CPU table stays)."""
    return "bench_vlm" if device.type == "cpu" else f"bench_vlm_{device.type}"


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20  # KiB on Linux


def summarise(adapter: Any, keys: Sequence[tuple[int, str]], times: dict, details: dict, seen: dict
              ) -> list[dict[str, Any]]:
    """One row per (batch, method): stage medians, time to first token per repeat, throughput, share, FLOPs."""
    rows = []
    for batch, method in keys:
        tokens, prompt, segments, look = seen[(batch, method)]
        st = times[(batch, method)]
        ttft = [a + v + p for a, v, p in zip(st["allocation"], st["vision"], st["prefill"])]
        rows.append(dict(method=method, batch=batch, visual_tokens=tokens, prompt_tokens=prompt,
                         vision_segments=segments, allocation_ms=statistics.median(st["allocation"]),
                         vision_ms=statistics.median(st["vision"]), prefill_ms=statistics.median(st["prefill"]),
                         total_ms=statistics.median(ttft), totals_ms=ttft,
                         pages_per_s=statistics.median([1e3 * batch / x for x in ttft]),
                         share=statistics.median([a / x for a, x in zip(st["allocation"], ttft)]),
                         work_ms=statistics.median([v + p for v, p in zip(st["vision"], st["prefill"])]),
                         flops=prefill_flops(adapter, prompt, segments, *(look or (0, 0))),
                         detail={k: statistics.median(v) for k, v in details[(batch, method)].items()}))
    for r in rows:
        full = next(f for f in rows if f["batch"] == r["batch"] and f["method"] == METHODS[0])
        r["speedup"] = full["total_ms"] / r["total_ms"]
        r["speedups"] = sorted(full["total_ms"] / x for x in r["totals_ms"])  # each repeat against full's median
        r["flop_ratio"] = full["flops"]["total"] / r["flops"]["total"]
    return rows


def row_line(r: dict[str, Any]) -> str:
    return (f"| {r['method']} | {r['batch']} | {r['visual_tokens']} | {r['allocation_ms']:.0f} | {r['vision_ms']:.0f} | "
            f"{r['prefill_ms']:.0f} | {min(r['totals_ms']):.0f} / {r['total_ms']:.0f} / {max(r['totals_ms']):.0f} | "
            f"{r['pages_per_s']:.2f} | {100 * r['share']:.1f}% | {r['speedups'][0]:.2f}x–{r['speedups'][-1]:.2f}x "
            f"(median {r['speedup']:.2f}x) | {r['flop_ratio']:.2f}x |")


def same_work(rows: Sequence[dict[str, Any]], batch: int) -> tuple[float, str]:
    """native_budget against arr at one batch: the ratio of their vision + prefill medians, and the sentence."""
    by = {r["method"]: r for r in rows if r["batch"] == batch}
    native, arr_row = by[METHODS[1]], by[METHODS[2]]
    agree = arr_row["work_ms"] / native["work_ms"]
    processor = native["detail"].get("processor", 0.0)
    same = native["visual_tokens"] == arr_row["visual_tokens"]
    verdict = ("NOT the same work: the processor could not fit the page in gestalt + K tokens as a square grid "
               "(choose --saccades so that gestalt + K is a square)" if not same else
               f"agree within {100 * AGREE:.0f} %" if abs(agree - 1) <= AGREE else
               f"DISAGREE by more than {100 * AGREE:.0f} %")
    return agree, (
        f"batch {batch}: `native_budget` and `arr` send {native['visual_tokens']} and {arr_row['visual_tokens']} "
        f"tokens per page through one tower call and prompts of {native['prompt_tokens']} and "
        f"{arr_row['prompt_tokens']} tokens through one prefill: vision + prefill medians "
        f"{native['work_ms']:.0f} and {arr_row['work_ms']:.0f} ms (ratio {agree:.2f}: {verdict}); of "
        f"`native_budget`'s vision, the model's processor (PIL resize, normalise, patchify on the CPU; timed apart, "
        f"median) is {processor:.0f} ms, work the `arr` row does not have (its cells are cut from the canvas by "
        f"tensor indexing), so `arr` / (`native_budget` less the processor) = "
        f"{arr_row['work_ms'] / max(native['work_ms'] - processor, 1e-9):.2f}.")


def describe(args: argparse.Namespace, info: dict[str, Any]) -> str:
    """The paragraph above the table: what was run, on what, and how each column is measured."""
    g, grid = info["gestalt"], info["grid"]
    return (
        f"{info['name']} with random weights ({info['n_all'] / 1e9:.2f} B parameters, {info['n_vit'] / 1e6:.0f} M in "
        f"the vision tower); batches of {', '.join(map(str, sorted(set(args.batch))))} distinct {args.size}x{args.size} "
        f"px pages (the bundled receipt resized, page b shifted by 7b px) = {grid[0]}x{grid[1]} cells of "
        f"{info['cell']} px; gestalt {g[0]}x{g[1]} + K = {args.saccades} saccades; {info['text_tokens']} text tokens "
        f"around each page. `native_budget`: the model's own processor downscales each page to at most "
        f"{g[0] * g[1] + args.saccades} tokens (the equal-tokens baseline). `arr` allocation: ARR with channels "
        f"{info['channels']} and the {args.query_encoder} query encoder on the model's device ({args.device}; the OCR "
        f"through {args.ocr_backend} on the CPU), all pages of a batch in one ARR pass, its image cache emptied before "
        f"every repeat (OCR runs each time). `vlm` relevance: the first look reads decoder layers "
        f"{list(args.layers) if args.layers else 'of the middle half'} and stops after the last of them; its "
        f"allocation is the question's extra forward, the attention read, the cell map and the sampler. "
        f"{args.repeats} interleaved repeats (every batch and method once per repeat, the order rotated each repeat) "
        f"after an untimed pass on an 8x8-cell page{f' and {args.warmup} of everything' if args.warmup else ''}; "
        f"torch.inference_mode, dtype {info['dtype_note']}; torch {torch.__version__}, {torch.get_num_threads()} "
        f"threads, {platform.machine()}. Model built in {info['build_s']:.1f} s; peak RSS {peak_rss_gib():.1f} GiB; "
        f"whole run {info['run_s'] / 60:.1f} min. Vision = tower calls; prefill = LLM forwards a single pass makes "
        "too (the first token's logits); time to first token = allocation + vision + prefill of the batch, "
        "min / median / max over repeats; pages/s = batch / time to first token (median over repeats); allocation "
        "share = allocation / time to first token (median); speed-up = full resolution's median at the same batch / "
        "each repeat's (range) and / the median; est. FLOP = the ratio of flops_estimate for tower + prefill + the "
        "VLM work of the allocation, per page (the `arr` allocation's OCR and texture are not counted)."
        + ("" if info["finite"] else " WARNING: non-finite LLM outputs or a wrong batch of logits."))


def write_report(args: argparse.Namespace, argv: Sequence[str] | None, rows: list[dict[str, Any]], device: Any,
                 info: dict[str, Any]) -> None:
    """Print and write ``<stem>.md`` (made-by line, paragraph, tables, checks) and ``<stem>.png``."""
    lines = [describe(args, info), "", "| " + " | ".join(ROW_COLUMNS) + " |",
             "|---|" + "---:|" * (len(ROW_COLUMNS) - 1)]
    lines += [row_line(r) for r in rows]
    lines += ["", "Tower and prompt per page (page 0 of the batch), speed-up over full resolution per stage (medians):",
              "", "| method | batch | prompt tokens | tower patches | vision | prefill | time to first token |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        full = next(f for f in rows if f["batch"] == r["batch"] and f["method"] == METHODS[0])
        lines.append(f"| {r['method']} | {r['batch']} | {r['prompt_tokens']} | "
                     f"{' + '.join(map(str, r['vision_segments']))} | {full['vision_ms'] / r['vision_ms']:.2f}x | "
                     f"{full['prefill_ms'] / r['prefill_ms']:.2f}x | {r['speedup']:.2f}x |")
    lines += ["", "Allocation stages (median ms): " + "; ".join(
        f"batch {r['batch']}, {r['method']}: " + ", ".join(f"{k} {v:.0f}" for k, v in r["detail"].items())
        for r in rows if r["method"] in METHODS[2:]) + "."]
    batches = sorted({r["batch"] for r in rows})
    lines += ["", "Same work, same time? " + " ".join(same_work(rows, b)[1] for b in batches)]
    by = {(r["batch"], r["method"]): r for r in rows}
    lines += ["", "Goals: allocation share of the sparse path (goal <= 10 %): " + "; ".join(
        f"batch {b}: `arr` {100 * by[(b, METHODS[2])]['share']:.1f}%, `vlm` {100 * by[(b, METHODS[3])]['share']:.1f}%"
        for b in batches) + ". Throughput at the largest batch against batch 1 (pages/s): " + "; ".join(
        f"{m} {by[(batches[-1], m)]['pages_per_s'] / by[(batches[0], m)]['pages_per_s']:.2f}x" for m in METHODS) + "."]
    lines += ["", "Per-repeat times to first token (ms), in run order: " + "; ".join(
        f"batch {r['batch']}, {r['method']}: {', '.join(f'{x:.0f}' for x in r['totals_ms'])}" for r in rows) + "."]
    table = "\n".join(lines)
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    command = " ".join(["python benchmarks/bench_vlm.py", *(sys.argv[1:] if argv is None else argv)])
    md, png = (args.out / (result_stem(device) + ext) for ext in (".md", ".png"))
    md.write_text(f"made by: `{command}`\n\n{table}\n")
    plot(rows, png, f"{info['name']}, {args.size}x{args.size} px pages, gestalt {info['gestalt'][0]}x"
                    f"{info['gestalt'][1]} + K = {args.saccades}, {info['dtype']}, {device.type}")
    print(f"wrote {md} and {png}")


def plot(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    """Per batch, stacked bars of the median time to first token (allocation, vision, prefill) per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batches = sorted({r["batch"] for r in rows})
    fig, axes = plt.subplots(1, len(batches), figsize=(5 * len(batches), 4), squeeze=False)
    for ax, b in zip(axes[0], batches):
        rs = [r for r in rows if r["batch"] == b]
        x = range(len(rs))
        alloc = [r["allocation_ms"] / 1e3 for r in rs]
        vis = [r["vision_ms"] / 1e3 for r in rs]
        pre = [r["prefill_ms"] / 1e3 for r in rs]
        ax.bar(x, alloc, color="#55A868", label="allocation")
        ax.bar(x, vis, bottom=alloc, color="#4C72B0", label="vision tower")
        ax.bar(x, pre, bottom=[a + v for a, v in zip(alloc, vis)], color="#DD8452", label="LLM prefill")
        for i, r in enumerate(rs):
            ax.text(i, alloc[i] + vis[i] + pre[i], f"{r['speedup']:.2f}x\n{r['pages_per_s']:.2f}/s", ha="center",
                    va="bottom", fontsize=7)
        ax.set_xticks(list(x), [r["method"].replace("sparse, ", "") for r in rs], fontsize=8)
        ax.set_ylabel("time to first token (s, median)")
        ax.set_title(f"batch {b}")
        ax.legend(fontsize=7)
        ax.margins(y=0.2)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
