"""Vision-tower and LLM-prefill wall time of Qwen2.5-VL-3B: full resolution vs gestalt + saccades.

The real-size Qwen2.5-VL-3B-Instruct architecture (its public config.json, written out below) with
random weights: timing needs the shapes, not trained values. One page of ``--size`` px (the bundled
receipt resized; 1344 px = 48 x 48 cells of 28 px = 2304 visual tokens), batch 1, a fixed ~30-token
chat prompt around the image. Three methods, interleaved in every repeat (same process, same load):

* full resolution -- ``adapter.encode_native``: every cell through the tower, 2304 tokens to the LLM;
* gestalt + saccades, ``sparse`` -- the tower encodes only the 16 x 16 gestalt and the K chosen cells;
* gestalt + saccades, ``slice`` -- the tower encodes the gestalt and the *full* grid, then keeps the
  K chosen tokens: its tower time is the full tower's plus the gestalt, only the prefill shrinks.

Vision = the adapter's encode call (patchify, gestalt resize, one tower call); prefill = one forward
of ``adapter.language_model`` over the assembled prompt, no KV cache. Medians of ``--repeats``
under ``torch.inference_mode()`` at torch's default thread count, beside the FLOP estimate of
:func:`arr_coc.vlm.base.flops_estimate`. Writes a markdown table and a PNG under ``--out``.

    python benchmarks/bench_vlm.py [--size 1344] [--budget 273] [--gestalt 16] [--repeats 3]
                                   [--dtype auto|float32|bfloat16] [--tiny]
"""
from __future__ import annotations

import argparse
import platform
import resource
import statistics
import time
from pathlib import Path
from typing import Any, Sequence

import torch
from tqdm import tqdm

from arr_coc.vlm.ask import prefill_flops as _flops
from arr_coc.vlm.base import assemble
from arr_coc.vlm.qwen import Qwen25VLAdapter

ROOT = Path(__file__).resolve().parents[1]

# Qwen/Qwen2.5-VL-3B-Instruct config.json (transformers 5 layout: rope settings under rope_parameters,
# tie_word_embeddings on the top-level config).
QWEN25_VL_3B_TEXT = dict(
    vocab_size=151936, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
    num_key_value_heads=2, hidden_act="silu", max_position_embeddings=128000, rms_norm_eps=1e-6,
    use_sliding_window=False, sliding_window=32768, max_window_layers=70, attention_dropout=0.0,
    rope_parameters=dict(rope_type="default", rope_theta=1000000.0, mrope_section=[16, 24, 24]),
    bos_token_id=151643, eos_token_id=151645)
QWEN25_VL_3B_VISION = dict(
    depth=32, hidden_act="silu", hidden_size=1280, intermediate_size=3420, num_heads=16, in_channels=3,
    out_hidden_size=2048, patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=112,
    fullatt_block_indexes=[7, 15, 23, 31], tokens_per_second=2)
QWEN25_VL_3B_IDS = dict(image_token_id=151655, video_token_id=151656, vision_start_token_id=151652,
                        vision_end_token_id=151653)

METHODS = ("full resolution", "gestalt + saccades (sparse)", "gestalt + saccades (slice)")
COLUMNS = ("method", "visual tokens", "vision (ms)", "prefill (ms)", "total (ms)", "speed-up", "est. TFLOP")
QUESTION_TOKENS = 20


def qwen25_vl_3b_config(*, tiny: bool = False, layers: int | None = None, vocab: int | None = None) -> Any:
    """The Qwen2.5-VL-3B-Instruct config; ``tiny``: arr_coc's 2-layer, 32-wide config of the same family.

    ``layers`` and ``vocab`` shrink the full config (depth of both towers, vocabulary) for the
    one-layer copy whose non-persistent buffers seed the big model built on the meta device.
    """
    import transformers as tf

    if tiny:
        from arr_coc.vlm.tiny import tiny_config

        return tiny_config("qwen2_5_vl", layers=layers or 2)
    text, vision = dict(QWEN25_VL_3B_TEXT), dict(QWEN25_VL_3B_VISION)
    if layers is not None:
        text["num_hidden_layers"], vision["depth"] = layers, layers
    if vocab is not None:
        text.update(vocab_size=vocab, bos_token_id=None, eos_token_id=None)
    return tf.Qwen2_5_VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=True, **QWEN25_VL_3B_IDS)


def fill_random_(model: torch.nn.Module, *, std: float = 0.02, seed: int = 0, pool: int = 1_000_003) -> None:
    """Cheap random weights: matrices from one N(0, std) pool, norms 1, biases 0.

    Every matrix is the pool repeated from a random offset (its length is prime, so rows do not
    line up); drawing 3.75 G fresh normals takes ~40 s on two cores, this takes seconds.
    """
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(2 * pool, generator=g) * std
    cache: dict[torch.dtype, torch.Tensor] = {}  # the pool in each parameter dtype
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim < 2 and name.endswith("weight"):  # RMSNorm scales
                p.fill_(1.0)
                continue
            if p.ndim < 2:  # biases
                p.zero_()
                continue
            if p.dtype not in cache:
                cache[p.dtype] = values.to(p.dtype)
            src, off = cache[p.dtype], int(torch.randint(pool, (1,), generator=g))
            flat = p.view(-1)
            reps = flat.numel() // pool  # one strided copy: whole pool-length rows, then the rest
            flat[:reps * pool].view(reps, pool).copy_(src[off:off + pool].expand(reps, pool))
            flat[reps * pool:].copy_(src[off:off + flat.numel() - reps * pool])


def build_model(config: Any, dtype: torch.dtype, *, small_config: Any, seed: int = 0) -> Any:
    """A ``Qwen2_5_VLForConditionalGeneration`` with random weights, built without transformers' init.

    The module tree is made on the meta device (no memory, no init), then given empty CPU storage
    and filled by :func:`fill_random_`. Non-persistent buffers (the rotary ``inv_freq`` tables) are
    computed in constructors, which the meta device skips: they are copied from ``small_config``'s
    model, built normally (one layer, same rotary settings), and must cover every buffer.
    """
    from transformers import Qwen2_5_VLForConditionalGeneration

    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device("meta"):
            model = Qwen2_5_VLForConditionalGeneration(config)
    finally:
        torch.set_default_dtype(prev)
    model = model.to_empty(device="cpu")
    if config.tie_word_embeddings:
        model.tie_weights()  # to_empty gives the tied head its own storage
    small = dict(Qwen2_5_VLForConditionalGeneration(small_config).named_buffers())
    with torch.no_grad():
        for name, buf in model.named_buffers():
            if name not in small or small[name].shape != buf.shape:
                raise RuntimeError(f"no reference value for buffer {name}")
            buf.copy_(small[name])
    fill_random_(model, seed=seed)
    return model.eval()


def probe_dtypes(m: int = 1024, k: int = 2048, n: int = 5504, repeats: int = 3) -> dict[torch.dtype, float]:
    """Median ms of an LLM-shaped matmul ([m, k] @ [k, n]) in float32 and bfloat16 on this CPU."""
    out = {}
    for dt in (torch.float32, torch.bfloat16):
        a, b = torch.randn(m, k).to(dt), torch.randn(k, n).to(dt)
        a @ b
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            a @ b
            times.append((time.perf_counter() - t) * 1e3)
        out[dt] = statistics.median(times)
    return out


def choose_dtype(choice: str) -> tuple[torch.dtype, str]:
    """``auto``: bfloat16 if the probe matmul runs faster in it, else float32; the reason as text."""
    probe = probe_dtypes()
    f32, bf16 = probe[torch.float32], probe[torch.bfloat16]
    measured = f"a 1024x2048 @ 2048x5504 matmul took {f32:.1f} ms in float32, {bf16:.1f} ms in bfloat16"
    if choice == "auto":
        dtype = torch.bfloat16 if bf16 < f32 else torch.float32
        why = f"{'bfloat16' if dtype == torch.bfloat16 else 'float32'} (auto: {measured})"
    else:
        dtype = getattr(torch, choice)
        why = f"{choice} (chosen by --dtype; {measured})"
    return dtype, why


def page(size: int) -> torch.Tensor:
    """The bundled receipt resized to ``size`` x ``size`` px: [3, S, S] in [0, 1]."""
    from arr_coc.canvas import load_image
    from arr_coc.imageops import resize

    return resize(load_image(ROOT / "examples" / "receipt.jpg"), (size, size))


def prompt_ids(config: Any, seed: int = 0) -> tuple[list[int], list[int]]:
    """A fixed chat-like prompt around the image: (header, vision_start) and (vision_end, question, tail).

    The text ids are arbitrary (no tokenizer): 3 header ids, a 20-id question and a 5-id tail,
    below the special-token range.
    """
    g = torch.Generator().manual_seed(seed)
    top = min(config.text_config.vocab_size, QWEN25_VL_3B_TEXT["bos_token_id"])
    ids = torch.randint(10, top, (3 + QUESTION_TOKENS + 5,), generator=g).tolist()
    pre = ids[:3] + [config.vision_start_token_id]
    suf = [config.vision_end_token_id] + ids[3:]
    return pre, suf


def saccade_cells(grid: tuple[int, int], budget: int, seed: int = 0) -> torch.Tensor:
    """K cells [K, 2] from arr_coc's stratified sampler on a seeded random relevance map."""
    from arr_coc.samplers import stratified_cells

    g = torch.Generator().manual_seed(seed)
    relevance = torch.rand(1, *grid, generator=g)
    return stratified_cells(relevance, budget, grid=(4, 4) if budget >= 16 else (1, 1)).positions[0]


def make_encoders(adapter: Any, image: torch.Tensor, cells: torch.Tensor,
                  gestalt: tuple[int, int]) -> dict[str, Any]:
    """Per method, a call that encodes ``image`` into its visual tokens."""
    return {
        METHODS[0]: lambda: adapter.encode_native([image]),
        METHODS[1]: lambda: adapter.encode([image], [cells], mode="sparse", gestalt=[gestalt], layout="scaled"),
        METHODS[2]: lambda: adapter.encode([image], [cells], mode="slice", gestalt=[gestalt], layout="scaled"),
    }


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20  # KiB on Linux


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=1344, help="page side in px, a multiple of the 28 px cell")
    ap.add_argument("--budget", type=int, default=273, help="saccades K")
    ap.add_argument("--gestalt", type=int, default=16, help="gestalt grid side (cells)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=0,
                    help="untimed passes of every method on the full page (after one on a small page)")
    ap.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default="auto")
    ap.add_argument("--tiny", action="store_true", help="arr_coc's tiny config instead of the 3B one (smoke test)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    args = parse_args(argv)
    start = time.perf_counter()
    torch.manual_seed(args.seed)
    dtype, dtype_note = choose_dtype(args.dtype)
    print(f"dtype: {dtype_note}")

    t = time.perf_counter()
    config = qwen25_vl_3b_config(tiny=args.tiny)
    small = qwen25_vl_3b_config(tiny=args.tiny, layers=1, vocab=None if args.tiny else 64)
    model = build_model(config, dtype, small_config=small, seed=args.seed)
    adapter = Qwen25VLAdapter(model)
    build_s, build_rss = time.perf_counter() - t, peak_rss_gib()
    n_vit = sum(p.numel() for p in adapter.visual.parameters())
    n_all = sum(p.numel() for p in model.parameters())
    name = "tiny Qwen2.5-VL (2 layers, width 32)" if args.tiny else "Qwen2.5-VL-3B-Instruct architecture"
    print(f"built {name}: {n_all / 1e9:.3f} B parameters ({n_vit / 1e6:.0f} M vision) in {build_s:.1f} s, "
          f"peak RSS {build_rss:.1f} GiB")

    cell = adapter.cell
    if args.size % cell:
        raise SystemExit(f"--size must be a multiple of the {cell} px cell, got {args.size}")
    grid = (args.size // cell, args.size // cell)
    gestalt = (min(args.gestalt, grid[0]), min(args.gestalt, grid[1]))
    if args.budget > grid[0] * grid[1]:
        raise SystemExit(f"--budget {args.budget} exceeds the {grid[0] * grid[1]} cells of the page")
    pre, suf = prompt_ids(config, args.seed)
    encoders = make_encoders(adapter, page(args.size), saccade_cells(grid, args.budget, args.seed), gestalt)
    # a first untimed pass on a small page (8x8 cells) wakes up kernels and the allocator cheaply
    side = min(grid[0], 8)
    small_enc = make_encoders(adapter, page(side * cell), saccade_cells((side, side), side * side // 4, args.seed),
                              (side // 2, side // 2))
    times: dict[str, dict[str, list[float]]] = {m: {"vision": [], "prefill": []} for m in METHODS}
    seen: dict[str, tuple[int, int, tuple[int, ...]]] = {}
    finite = True
    with torch.inference_mode():
        for method in METHODS:
            vis = small_enc[method]()
            pf = assemble(adapter.embed_tokens, [pre], vis, [suf], adapter.rope_rows)
            adapter.language_model(dict(inputs_embeds=pf.inputs_embeds, attention_mask=pf.attention_mask,
                                        position_ids=pf.position_ids, visual_mask=pf.visual_mask,
                                        deepstack=pf.deepstack))
    passes = args.warmup + args.repeats
    with torch.inference_mode(), tqdm(total=2 * passes * len(METHODS), desc="bench_vlm") as bar:
        for rep in range(passes):
            order = METHODS[rep % len(METHODS):] + METHODS[:rep % len(METHODS)]  # no method always runs first
            for method in order:
                label = f"{'warm-up' if rep < args.warmup else f'repeat {rep - args.warmup + 1}'}: {method}"
                bar.set_postfix_str(f"{label} vision")
                t0 = time.perf_counter()
                vis = encoders[method]()
                t1 = time.perf_counter()
                bar.update()
                prefill = assemble(adapter.embed_tokens, [pre], vis, [suf], adapter.rope_rows)
                bar.set_postfix_str(f"{label} prefill")
                t2 = time.perf_counter()
                hidden = adapter.language_model(dict(
                    inputs_embeds=prefill.inputs_embeds, attention_mask=prefill.attention_mask,
                    position_ids=prefill.position_ids, visual_mask=prefill.visual_mask, deepstack=prefill.deepstack))
                t3 = time.perf_counter()
                bar.update()
                finite &= bool(torch.isfinite(hidden).all())
                seen[method] = (len(vis[0]), prefill.inputs_embeds.shape[1], vis[0].vision_segments)
                if rep >= args.warmup:
                    times[method]["vision"].append((t1 - t0) * 1e3)
                    times[method]["prefill"].append((t3 - t2) * 1e3)
                del vis, prefill, hidden

    rows = []
    for method in METHODS:
        tokens, prompt, segments = seen[method]
        vision, pre_ms = statistics.median(times[method]["vision"]), statistics.median(times[method]["prefill"])
        total = statistics.median([a + b for a, b in zip(times[method]["vision"], times[method]["prefill"])])
        flops = _flops(adapter, prompt, segments)
        rows.append(dict(method=method, visual_tokens=tokens, prompt_tokens=prompt, vision_segments=segments,
                         vision_ms=vision, prefill_ms=pre_ms, total_ms=total, flops=flops,
                         totals_ms=[a + b for a, b in zip(times[method]["vision"], times[method]["prefill"])]))
    full = rows[0]
    for r in rows:
        r["speedup"] = full["total_ms"] / r["total_ms"]
    run_s = time.perf_counter() - start

    text_tokens = len(pre) + len(suf)
    head = (
        f"{name} with random weights ({n_all / 1e9:.2f} B parameters, {n_vit / 1e6:.0f} M in the vision tower), "
        f"batch 1: one {args.size}x{args.size} px page = {grid[0]}x{grid[1]} cells of {cell} px; "
        f"gestalt {gestalt[0]}x{gestalt[1]} + K = {args.budget} saccades; {text_tokens} text tokens around the image. "
        f"Median of {args.repeats} interleaved repeats (method order rotated each repeat) after an untimed pass on "
        f"an 8x8-cell page{f' and {args.warmup} on the full page' if args.warmup else ''}; torch.inference_mode, "
        f"dtype {dtype_note}; torch {torch.__version__}, {torch.get_num_threads()} threads, {platform.machine()}. "
        f"Model built in {build_s:.1f} s; peak RSS {peak_rss_gib():.1f} GiB; whole run {run_s / 60:.1f} min. "
        "Vision = the adapter's encode call (one tower call); prefill = one LLM forward over the assembled "
        "prompt, no KV cache; total = median of the per-repeat sums; speed-up = full resolution's total / the "
        "method's; est. TFLOP = flops_estimate (2 per weight per token + attention, window attention counted "
        "as full) for tower + prefill."
        + ("" if finite else " WARNING: non-finite LLM outputs."))
    lines = [head, "", "| " + " | ".join(COLUMNS) + " |", "|---|" + "---:|" * (len(COLUMNS) - 1)]
    for r in rows:
        lines.append(f"| {r['method']} | {r['visual_tokens']} | {r['vision_ms']:.0f} | {r['prefill_ms']:.0f} | "
                     f"{r['total_ms']:.0f} | {r['speedup']:.2f}x | {r['flops']['total'] / 1e12:.3g} |")
    lines += ["", "Speed-up over full resolution per stage (measured), and the estimated FLOP ratio:", "",
              "| method | prompt tokens | tower patches | vision | prefill | total | est. FLOP |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['method']} | {r['prompt_tokens']} | {' + '.join(map(str, r['vision_segments']))} | "
                     f"{full['vision_ms'] / r['vision_ms']:.2f}x | {full['prefill_ms'] / r['prefill_ms']:.2f}x | "
                     f"{r['speedup']:.2f}x | {full['flops']['total'] / r['flops']['total']:.2f}x |")
    lines += ["", "Per-repeat totals (ms), in run order: " + "; ".join(
        f"{r['method']}: {', '.join(f'{x:.0f}' for x in r['totals_ms'])}" for r in rows) + "."]
    table = "\n".join(lines)
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_vlm.md").write_text(table + "\n")
    plot(rows, args.out / "bench_vlm.png", f"{name}, {args.size}x{args.size} px page, "
                                           f"gestalt {gestalt[0]}x{gestalt[1]} + K = {args.budget}, {dtype}")
    print(f"wrote {args.out / 'bench_vlm.md'} and {args.out / 'bench_vlm.png'}")
    return rows


def plot(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    """Stacked bars: measured seconds (vision + prefill) beside the estimated TFLOP (tower + LLM)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [r["method"].replace("gestalt + saccades ", "ours ") for r in rows]
    x = range(len(rows))
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    vis = [r["vision_ms"] / 1e3 for r in rows]
    pre = [r["prefill_ms"] / 1e3 for r in rows]
    a1.bar(x, vis, color="#4C72B0", label="vision tower")
    a1.bar(x, pre, bottom=vis, color="#DD8452", label="LLM prefill")
    for i, r in enumerate(rows):
        a1.text(i, vis[i] + pre[i], f"{r['speedup']:.2f}x", ha="center", va="bottom")
    a1.set_ylabel("measured wall time (s, median)")
    a1.set_title("measured (speed-up over full resolution)")
    fv = [r["flops"]["vision"] / 1e12 for r in rows]
    fl = [r["flops"]["llm"] / 1e12 for r in rows]
    a2.bar(x, fv, color="#4C72B0", label="vision tower")
    a2.bar(x, fl, bottom=fv, color="#DD8452", label="LLM prefill")
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
