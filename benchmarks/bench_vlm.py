"""End-to-end time of Qwen2.5-VL-3B on one page: full resolution vs gestalt + saccades, allocation included.

The real-size Qwen2.5-VL-3B-Instruct architecture (its public config.json, in ``qwen_3b.py``) with
random weights: timing needs the shapes, not trained values. One page of ``--size`` px (the bundled
receipt resized; 1344 px = 48 x 48 cells of 28 px = 2304 visual tokens), batch 1, a fixed ~30-token
chat prompt around the image. Four methods, interleaved in every repeat (same process, same load),
each timed as allocation + vision + prefill, each run through the public stages of
:mod:`arr_coc.vlm.stages` (``allocate``, ``encode``, ``prefill``, ``decode`` of one token):

* full resolution -- a ``full`` plan: every cell through the tower, 2304 tokens to the LLM;
* ``native_budget`` -- the model's own processor downscales the page to at most gestalt + K tokens
  (529 = 23 x 23 cells): the equal-tokens baseline, the same tower and LLM work as the ``arr`` row
  without an allocation, so the two must take the same vision + prefill time (the table checks 10 %);
* sparse, ``arr`` allocation -- ARR as ``arr-coc ask`` runs it (default channels: OCR, texture,
  learned saliency; MiniLM) actually run on the page, then the tower encodes the gestalt and the K
  cells ARR chose, and the LLM prefills prefix, gestalt, saccades, question;
* sparse, ``vlm`` relevance -- the tower encodes the gestalt; the LLM prefills prefix + gestalt and
  reads the question over it (the first look, :mod:`arr_coc.vlm.first_look`); ARR's sampler picks K cells
  on that attention map; the tower encodes them and the LLM continues its cache with saccades +
  question. Its allocation is only the extra work: making the canvas, the question's forward, the
  attention read, the map and the sampler.

Min / median / max of ``--repeats`` (default 5) under ``torch.inference_mode()`` at torch's default
thread count, speed-ups as the range over repeats, beside the FLOP estimate of
:func:`arr_coc.vlm.cost.flops_estimate`. Writes a markdown table and a PNG under ``--out``.

    python benchmarks/bench_vlm.py [--size 1344] [--saccades 273] [--repeats 5] [--depth N]
                                   [--dtype auto|float32|bfloat16] [--tiny] [--channels ...] [--device cuda]

``--device cuda``: the VLM on the GPU (ARR stays on the CPU), every timed stage synchronised with it; the
table and plot are then ``bench_vlm_cuda.md`` / ``.png``.
"""
from __future__ import annotations

import argparse
import platform
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import torch

# the model, its weights and inputs sit beside this script (running it puts the folder on sys.path)
from qwen_3b import ROOT, build_model, choose_dtype, device_note, page, prompt_ids, qwen25_vl_3b_config  # noqa: E402
from tqdm import tqdm

from arr_coc.config import resolve_device
from arr_coc.engine.plan import Plan
from arr_coc.vlm import VLMAdapter, allocate, decode, encode, prefill
from arr_coc.vlm.cost import prefill_flops
from arr_coc.vlm.generation import stage_ms, timed
from arr_coc.vlm.qwen import Qwen25VLAdapter

METHODS = ("full resolution", "native_budget", "sparse, arr allocation", "sparse, vlm relevance")
COLUMNS = ("method", "visual tokens", "allocation (ms)", "vision (ms)", "prefill (ms)", "total (ms) min / median / max",
           "allocation share", "speed-up (range over repeats)", "est. FLOP ratio")

def arr_allocator(cell: int, size: int, channels: Sequence[str] | None, query_encoder: str) -> Any:
    """ARR as ``arr-coc ask`` builds it: the default channels (OCR included) unless ``channels`` is given."""
    from arr_coc.config import ARRConfig, CanvasConfig, TextureConfig
    from arr_coc.engine.pipeline import ARR
    from arr_coc.engine.query import HashingQueryEncoder, MiniLMQueryEncoder

    encoder = HashingQueryEncoder() if query_encoder == "hashing" else MiniLMQueryEncoder().load()
    config = ARRConfig(canvas=CanvasConfig(cell=cell, max_pixels=max(size * size, CanvasConfig.max_pixels)),
                       texture=TextureConfig(channels=tuple(channels) if channels else None))
    return ARR(config, query_encoder=encoder).eval()


def make_runs(adapter: VLMAdapter, arr: Any, image: torch.Tensor, question: str, pre: list[int], suf: list[int],
              saccades: int, layers: Sequence[int] | None) -> dict[str, Any]:
    """Per method, a call that answers ``image`` up to the prefill -> (stage ms, detail ms, visual tokens, prompt
    length, first logits, first-look work or None), through the public stages of :mod:`arr_coc.vlm.stages`.

    Stages (:func:`arr_coc.vlm.generation.stage_ms`): ``allocation`` (choosing the saccades), ``vision``
    (tower calls), ``prefill`` (LLM forwards that a single pass makes too, the first token's logits
    included). ``detail`` holds the allocation's own stages.
    """
    from arr_coc.engine.cache import ImageCache

    grid = (image.shape[1] // adapter.cell, image.shape[2] // adapter.cell)

    def answer_prefill(t: dict[str, float], visual: list, prompts: list, first_look: Any = None) -> tuple:
        prompt = prefill(adapter, visual, prompts, first_look=first_look)
        _, logits = decode(adapter, prompt, max_new_tokens=1, timings=t)
        # one token: generate runs the prompt's last token and its logits, which a single pass's prefill does
        t["prefill"] = t.get("prefill", 0.0) + t.pop("decode", 0.0)
        return prompt, logits

    def full() -> tuple:
        t: dict[str, float] = {}
        with timed(t, "vision", adapter.device):
            vis = encode(adapter, [Plan("full", "full", grid)], [image])
        prompt, logits = answer_prefill(t, vis, [(pre, suf)])
        return stage_ms(t), {}, vis[0], prompt.prefill.inputs_embeds.shape[1], logits, None

    def sparse(relevance: str) -> Any:
        def run() -> tuple:
            arr.cache = ImageCache()  # the OCR and every other image-only channel run again, as on a new page
            t: dict[str, float] = {}
            planned = allocate(adapter, [image], [question], saccades=saccades, arr=arr, relevance=relevance,
                               first_look_layers=layers, prompts=[(pre, suf)], timings=t)
            with timed(t, "vision", adapter.device):
                vis = encode(adapter, planned.plans, planned.images, encoded=planned.gestalt_tokens)
            prompt, logits = answer_prefill(t, vis, planned.prompts, planned.first_look)
            detail = {k.split("/", 1)[1]: v for k, v in t.items() if k.startswith("allocation/")}
            cached = 0 if planned.first_look is None else planned.first_look.attention_mask.shape[1]
            look = prompt.first_look_work(0, vis[0]) if planned.first_look is not None else None
            return stage_ms(t), detail, vis[0], cached + prompt.prefill.inputs_embeds.shape[1], logits, look
        return run

    def native() -> tuple:  # the model's own downscale at the sparse paths' token count: nothing to allocate
        t: dict[str, float] = {}
        tokens = arr.config.gestalt.grid_for(saccades, grid)
        with timed(t, "vision", adapter.device):
            vis = encode(adapter, [Plan("native_budget", "native", grid, native=tokens[0] * tokens[1] + saccades)],
                         [image])
        prompt, logits = answer_prefill(t, vis, [(pre, suf)])
        return stage_ms(t), {}, vis[0], prompt.prefill.inputs_embeds.shape[1], logits, None

    return {METHODS[0]: full, METHODS[1]: native, METHODS[2]: sparse("arr"), METHODS[3]: sparse("vlm")}


def result_stem(device: torch.device) -> str:
    """The results' file name: ``bench_vlm`` on the CPU, ``bench_vlm_cuda`` on a GPU (the CPU table stays)."""
    return "bench_vlm" if device.type == "cpu" else f"bench_vlm_{device.type}"


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20  # KiB on Linux


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=1344, help="page side in px, a multiple of the 28 px cell")
    ap.add_argument("--saccades", type=int, default=273, help="saccades K (the gestalt follows arr-coc's rule)")
    ap.add_argument("--repeats", type=int, default=5, help="interleaved repeats (min / median / max over them)")
    ap.add_argument("--warmup", type=int, default=0,
                    help="untimed passes of every method on the full page (after one on a small page)")
    ap.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default="auto")
    ap.add_argument("--tiny", action="store_true", help="arr_coc's tiny config instead of the 3B one (smoke test)")
    ap.add_argument("--depth", type=int, default=None, metavar="N",
                    help="the 3B widths with N layers in each tower: the real shapes, minutes faster (harness checks)")
    ap.add_argument("--channels", nargs="+", default=None, metavar="NAME",
                    help="ARR's texture channels for the arr allocation (default: arr-coc's, OCR included)")
    ap.add_argument("--query-encoder", choices=("minilm", "hashing"), default="minilm")
    ap.add_argument("--question", default="What is the total?", help="the question ARR allocates for")
    ap.add_argument("--layers", type=int, nargs="+", default=None,
                    help="decoder layers the first look reads (default: the middle half)")
    ap.add_argument("--flops-only", action="store_true",
                    help="no timing: the model is built on the meta device (no memory) and only the FLOP table "
                         "(allocation included) and ARR's allocation time on the page are reported")
    ap.add_argument("--device", default="cpu", help="where the VLM runs (cpu, cuda, cuda:1); ARR stays on the CPU")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    return ap.parse_args(argv)


def flop_table(args: argparse.Namespace) -> list[dict[str, Any]]:
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


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    args = parse_args(argv)
    if args.flops_only:
        return flop_table(args)
    start = time.perf_counter()
    torch.manual_seed(args.seed)
    try:
        device = resolve_device(args.device)
    except ValueError as err:
        raise SystemExit(f"--device: {err}") from None
    dtype, dtype_note = choose_dtype(args.dtype, device)
    print(f"dtype: {dtype_note}")

    t = time.perf_counter()
    config = qwen25_vl_3b_config(tiny=args.tiny, layers=args.depth)
    small = qwen25_vl_3b_config(tiny=args.tiny, layers=1, vocab=None if args.tiny else 64)
    model = build_model(config, dtype, small_config=small, seed=args.seed).to(device)
    adapter = Qwen25VLAdapter(model)
    build_s, build_rss = time.perf_counter() - t, peak_rss_gib()
    n_vit = sum(p.numel() for p in adapter.visual.parameters())
    n_all = sum(p.numel() for p in model.parameters())
    name = ("tiny Qwen2.5-VL (2 layers, width 32)" if args.tiny else "Qwen2.5-VL-3B-Instruct architecture"
            + (f" cut to {args.depth} layers per tower" if args.depth else ""))
    print(f"built {name}: {n_all / 1e9:.3f} B parameters ({n_vit / 1e6:.0f} M vision) in {build_s:.1f} s, "
          f"peak RSS {build_rss:.1f} GiB")

    cell = adapter.cell
    if args.size % cell:
        raise SystemExit(f"--size must be a multiple of the {cell} px cell, got {args.size}")
    grid = (args.size // cell, args.size // cell)
    if args.saccades > grid[0] * grid[1]:
        raise SystemExit(f"--saccades {args.saccades} exceeds the {grid[0] * grid[1]} cells of the page")
    arr = arr_allocator(cell, args.size, args.channels, args.query_encoder)
    gestalt = arr.config.gestalt.grid_for(args.saccades, grid)
    pre, suf = prompt_ids(config, args.seed)
    runs = make_runs(adapter, arr, page(args.size), args.question, pre, suf, args.saccades, args.layers)
    # a first untimed pass on a small page (8x8 cells) loads the channels' models and wakes up kernels cheaply
    side = min(grid[0], 8)
    warm = make_runs(adapter, arr, page(side * cell), args.question, pre, suf, side * side // 4, args.layers)
    times: dict[str, dict[str, list[float]]] = {m: {} for m in METHODS}
    details: dict[str, dict[str, list[float]]] = {m: {} for m in METHODS}
    seen: dict[str, tuple] = {}
    finite = True
    with torch.inference_mode():
        for method in METHODS:
            warm[method]()
    passes = args.warmup + args.repeats
    with torch.inference_mode(), tqdm(total=passes * len(METHODS), desc="bench_vlm") as bar:
        for rep in range(passes):
            order = METHODS[rep % len(METHODS):] + METHODS[:rep % len(METHODS)]  # no method always runs first
            for method in order:
                bar.set_postfix_str(f"{'warm-up' if rep < args.warmup else f'repeat {rep - args.warmup + 1}'}: "
                                    f"{method}")
                stages, detail, vis, prompt, logits, look = runs[method]()
                bar.update()
                finite &= bool(torch.isfinite(logits).all())
                seen[method] = (len(vis), prompt, vis.vision_segments, look)
                if rep >= args.warmup:
                    for k in ("allocation", "vision", "prefill"):
                        times[method].setdefault(k, []).append(stages.get(k, 0.0))
                    for k, v in detail.items():
                        details[method].setdefault(k, []).append(v)
                del logits

    rows = []
    for method in METHODS:
        tokens, prompt, segments, look = seen[method]
        st = times[method]
        totals = [a + v + p for a, v, p in zip(st["allocation"], st["vision"], st["prefill"])]
        work = [v + p for v, p in zip(st["vision"], st["prefill"])]  # the tower + LLM part alone
        rows.append(dict(method=method, visual_tokens=tokens, prompt_tokens=prompt, vision_segments=segments,
                         allocation_ms=statistics.median(st["allocation"]), vision_ms=statistics.median(st["vision"]),
                         prefill_ms=statistics.median(st["prefill"]), total_ms=statistics.median(totals),
                         share=statistics.median([a / tt for a, tt in zip(st["allocation"], totals)]),
                         flops=prefill_flops(adapter, prompt, segments, *(look or (0, 0))), totals_ms=totals,
                         work_ms=statistics.median(work), detail={k: statistics.median(v)
                                                                  for k, v in details[method].items()}))
    full = rows[0]
    for r in rows:
        r["speedup"] = full["total_ms"] / r["total_ms"]
        r["speedups"] = sorted(full["total_ms"] / x for x in r["totals_ms"])  # each repeat against full's median
    native, arr_row, vlm = rows[1:]
    # the same tower + LLM work (one tower call of 2116 patches, one prefill of the same prompt length):
    # native_budget and arr must agree; the arr row's gap to it is what ARR's allocation leaves behind
    agree = arr_row["work_ms"] / native["work_ms"]
    overhead = arr_row["total_ms"] / native["total_ms"] - 1
    run_s = time.perf_counter() - start
    lines = [describe(args, name, n_all, n_vit, grid, cell, gestalt, pre, suf, arr, dtype_note + device_note(device),
                      build_s, run_s, finite), "",
             "| " + " | ".join(COLUMNS) + " |", "|---|" + "---:|" * (len(COLUMNS) - 1)]
    for r in rows:
        lines.append(f"| {r['method']} | {r['visual_tokens']} | {r['allocation_ms']:.0f} | {r['vision_ms']:.0f} | "
                     f"{r['prefill_ms']:.0f} | {min(r['totals_ms']):.0f} / {r['total_ms']:.0f} / "
                     f"{max(r['totals_ms']):.0f} | {100 * r['share']:.1f}% | {r['speedups'][0]:.2f}x–"
                     f"{r['speedups'][-1]:.2f}x (median {r['speedup']:.2f}x) | "
                     f"{full['flops']['total'] / r['flops']['total']:.2f}x |")
    lines += ["", "Speed-up over full resolution per stage (medians), and the estimated FLOP ratio:", "",
              "| method | prompt tokens | tower patches | vision | prefill | total | est. FLOP |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['method']} | {r['prompt_tokens']} | {' + '.join(map(str, r['vision_segments']))} | "
                     f"{full['vision_ms'] / r['vision_ms']:.2f}x | {full['prefill_ms'] / r['prefill_ms']:.2f}x | "
                     f"{r['speedup']:.2f}x | {full['flops']['total'] / r['flops']['total']:.2f}x |")
    lines += ["", "Allocation stages (median ms): " + "; ".join(
        f"{r['method']}: " + ", ".join(f"{k} {v:.0f}" for k, v in r["detail"].items()) for r in rows[2:]) + "."]
    verdict = ("agree within 10 %" if abs(agree - 1) <= 0.10 else
               "DISAGREE by more than 10 %: the tower + LLM work is the same, so the difference is the machine "
               "(another process, or the arr row's OCR and texture threads still running into its tower call); "
               "rerun on a quiet machine before reading the arr row's speed-up")
    lines += ["", f"Same work, same time? `native_budget` and `arr` send the same {native['visual_tokens']} "
                  f"tokens through one tower call and one prefill of {arr_row['prompt_tokens']} tokens: their "
                  f"vision + prefill medians are {native['work_ms']:.0f} and {arr_row['work_ms']:.0f} ms "
                  f"(ratio {agree:.2f}: {verdict}). The `vlm` row's LLM work is split in two passes (prefix + "
                  f"gestalt, then saccades + question on that cache) plus the first look, so it is not the same "
                  f"work: vision + prefill {vlm['work_ms']:.0f} ms.",
              f"ARR's overhead over `native_budget` at equal tokens: {100 * overhead:+.1f}% end to end "
              f"(allocation {arr_row['allocation_ms']:.0f} ms, median)."]
    lines += ["", f"Goals: `vlm` allocation = {100 * vlm['share']:.1f}% of its sparse path (goal <= 10%); end to end, "
                  f"allocation included, `vlm` is {vlm['speedups'][0]:.2f}x–{vlm['speedups'][-1]:.2f}x and `arr` "
                  f"{arr_row['speedups'][0]:.2f}x–{arr_row['speedups'][-1]:.2f}x faster than full resolution "
                  f"(goal >= 5x); the FLOP estimate says {full['flops']['total'] / vlm['flops']['total']:.2f}x and "
                  f"{full['flops']['total'] / arr_row['flops']['total']:.2f}x."]
    lines += ["", "Per-repeat totals (ms), in run order: " + "; ".join(
        f"{r['method']}: {', '.join(f'{x:.0f}' for x in r['totals_ms'])}" for r in rows) + "."]
    table = "\n".join(lines)
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    command = " ".join(["python benchmarks/bench_vlm.py", *(sys.argv[1:] if argv is None else argv)])
    md, png = (args.out / (result_stem(device) + ext) for ext in (".md", ".png"))
    md.write_text(f"made by: `{command}`\n\n{table}\n")
    plot(rows, png, f"{name}, {args.size}x{args.size} px page, gestalt {gestalt[0]}x{gestalt[1]} + K = "
                    f"{args.saccades}, {dtype}, {device.type}")
    print(f"wrote {md} and {png}")
    return rows


def describe(args: argparse.Namespace, name: str, n_all: int, n_vit: int, grid: tuple, cell: int, gestalt: tuple,
             pre: list, suf: list, arr: Any, dtype_note: str, build_s: float, run_s: float, finite: bool) -> str:
    """The paragraph above the table: what was run, on what, and how each column is measured."""
    return (
        f"{name} with random weights ({n_all / 1e9:.2f} B parameters, {n_vit / 1e6:.0f} M in the vision tower), "
        f"batch 1: one {args.size}x{args.size} px page (the bundled receipt, resized) = {grid[0]}x{grid[1]} cells of "
        f"{cell} px; gestalt {gestalt[0]}x{gestalt[1]} + K = {args.saccades} saccades; {len(pre) + len(suf)} text "
        f"tokens around the image. `native_budget`: the model's own processor downscales the page to at most "
        f"{gestalt[0] * gestalt[1] + args.saccades} tokens (the equal-tokens baseline; nothing to allocate). `arr` "
        f"allocation: ARR with channels {list(arr.channels)} and the {args.query_encoder} query encoder, its image "
        f"cache emptied before every repeat (OCR runs each time), on the CPU. `vlm` relevance: the first look reads "
        f"decoder layers {list(args.layers) if args.layers else 'of the middle half'}; its allocation is the "
        f"question's extra forward, the attention read from it, the cell map and the sampler. {args.repeats} "
        f"interleaved repeats (every method once per repeat, the order rotated each repeat) after an untimed pass on "
        f"an 8x8-cell page{f' and {args.warmup} on the full page' if args.warmup else ''}; torch.inference_mode, "
        f"dtype {dtype_note}; torch {torch.__version__}, {torch.get_num_threads()} threads, {platform.machine()}. "
        f"Model built in {build_s:.1f} s; peak RSS {peak_rss_gib():.1f} GiB; whole run {run_s / 60:.1f} min. "
        "Vision = tower calls; prefill = LLM forwards a single pass makes too (the first token's logits, no further "
        "decoding); total = allocation + vision + prefill per repeat, min / median / max; speed-up = full "
        "resolution's median total / each repeat's total (range) and / the median; est. FLOP = the ratio of "
        "flops_estimate (2 per weight per token + attention; the tower's window attention counted per window) for "
        "tower + prefill + the VLM work of the allocation (the `arr` allocation's OCR and texture are not counted)."
        + ("" if finite else " WARNING: non-finite LLM outputs."))


def plot(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    """Stacked bars: measured seconds (vision + prefill) beside the estimated TFLOP (tower + LLM)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [r["method"] for r in rows]
    x = range(len(rows))
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    alloc = [r["allocation_ms"] / 1e3 for r in rows]
    vis = [r["vision_ms"] / 1e3 for r in rows]
    pre = [r["prefill_ms"] / 1e3 for r in rows]
    a1.bar(x, alloc, color="#55A868", label="allocation")
    a1.bar(x, vis, bottom=alloc, color="#4C72B0", label="vision tower")
    a1.bar(x, pre, bottom=[a + v for a, v in zip(alloc, vis)], color="#DD8452", label="LLM prefill")
    for i, r in enumerate(rows):
        a1.text(i, alloc[i] + vis[i] + pre[i], f"{r['speedup']:.2f}x", ha="center", va="bottom")
    a1.set_ylabel("measured wall time (s, median)")
    a1.set_title("measured (speed-up over full resolution)")
    fa = [r["flops"]["allocation"] / 1e12 for r in rows]
    fv = [r["flops"]["vision"] / 1e12 for r in rows]
    fl = [r["flops"]["llm"] / 1e12 for r in rows]
    a2.bar(x, fa, color="#55A868", label="allocation (VLM work)")
    a2.bar(x, fv, bottom=fa, color="#4C72B0", label="vision tower")
    a2.bar(x, fl, bottom=[a + v for a, v in zip(fa, fv)], color="#DD8452", label="LLM prefill")
    a2.set_ylabel("estimated TFLOP")
    a2.set_title("estimated (flops_estimate)")
    for ax in (a1, a2):
        ax.set_xticks(list(x), labels, fontsize=8)
        ax.legend(fontsize=8)
        ax.margins(y=0.12)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
