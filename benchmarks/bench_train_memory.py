"""Memory and time of one scorer training step through a frozen real-size Qwen2.5-VL (random weights).

One step of the answer objective (:func:`arr_coc.vlm.answer_loss.answer_loss`) as ``arr-coc train
--objective vlm`` takes it: a learnable relevance map over one ``--size`` px page (1344 px = 48 x 48
cells = 2304 full-resolution tokens), z-scored and soft-top-K'd at ``--tokens`` (the
evaluation's gestalt + K split), the tokens scaled by those weights, the answer's cross-entropy,
backward to the relevance. Weights are bfloat16, the step runs under bfloat16 autocast on this
CPU. Settings: checkpointing off / on, relaxation ``weighted`` (every cell encoded) / ``candidates``
(the top 2K cells), for the Qwen2.5-VL-3B-Instruct and -7B-Instruct architectures (their public
config.json values, written out below).

Every setting runs in a fresh subprocess, so ``ru_maxrss`` (the peak resident memory) is that
setting's alone; the runtime's own memory (after imports, before the model) is subtracted.
"saved" adds up every tensor autograd keeps for the backward pass (a saved-tensor hook), the
frozen weights a matmul keeps for its input gradient included (references: no extra memory).

Each setting is measured with ``--llm-layers`` (default 2 and 4) decoder layers and an 8-block
tower (one full-attention block and seven window blocks, the real 1-in-8 mix), and extrapolated:
peak and time are fitted as ``a + b * layers`` over the measured depths and read at the real depth
(36 for 3B, 28 for 7B); the tower's 24 missing blocks add their exact weight bytes to the peak
(the tower runs without gradient, so its activations are transient) and their time scaled per
block. ``--full-depth`` also runs every 3B setting at its real depth (36 LLM layers, the whole
32-block tower): measured, not extrapolated, which checks the extrapolation (needs ~20 GiB free
without checkpointing). One repeat per setting.

    python benchmarks/bench_train_memory.py [--size 1344] [--tokens 10%] [--llm-layers 2 4]
                                            [--models 3b 7b] [--full-depth] [--out benchmarks/results]
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import torch

ROOT = Path(__file__).resolve().parents[1]
# qwen_3b sits beside this script: `python benchmarks/bench_train_memory.py` puts this folder on sys.path

from qwen_3b import QWEN25_VL_3B_TEXT, QWEN25_VL_3B_VISION, build_model, page  # noqa: E402

# Qwen/Qwen2.5-VL-7B-Instruct config.json: a wider, shallower LLM with the same vision tower
QWEN25_VL_7B_TEXT = dict(QWEN25_VL_3B_TEXT, vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                         num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4, max_window_layers=28)
ARCHS = {"3b": (QWEN25_VL_3B_TEXT, dict(QWEN25_VL_3B_VISION), True),
         "7b": (QWEN25_VL_7B_TEXT, dict(QWEN25_VL_3B_VISION, out_hidden_size=3584), False)}
TOWER_BLOCKS = 8  # measured tower depth: block 7 is its one full-attention block, as in every 8 of the real 32
QUESTION, ANSWER = "What is the total amount due on this invoice?", "1,234.56 USD"


def config(arch: str, llm_layers: int | None = None, vision_depth: int | None = None) -> Any:
    """The architecture's config, optionally shallower; ids of the character tokenizer's specials.

    The model is fed embeddings, so its special-token ids only split the prompt around the image:
    the tiny character tokenizer's ids stand in for Qwen's (no tokenizer file is downloaded).
    """
    import transformers as tf

    from arr_coc.vlm.tiny import TOKEN_IDS

    text, vision, tied = ARCHS[arch]
    text, vision = dict(text), dict(vision)
    if llm_layers is not None:
        text["num_hidden_layers"] = llm_layers
    if vision_depth is not None:
        vision["depth"] = vision_depth
        vision["fullatt_block_indexes"] = [i for i in vision["fullatt_block_indexes"] if i < vision_depth]
    ids = {k: TOKEN_IDS[k] for k in ("image_token_id", "video_token_id", "vision_start_token_id",
                                     "vision_end_token_id")}
    return tf.Qwen2_5_VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=tied, **ids)


def rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20  # KiB on Linux


def child(arch: str, layers: int, checkpointing: bool, relaxation: str, size: int, tokens: str,
          tower_blocks: int = TOWER_BLOCKS) -> dict[str, Any]:
    """One training step in this process; what it measured."""
    from arr_coc.budget import Budget
    from arr_coc.engine.soft_topk import soft_topk
    from arr_coc.vlm.answer_loss import answer_loss, top_cells
    from arr_coc.vlm.qwen import Qwen25VLAdapter
    from arr_coc.vlm.tiny import tiny_tokenizer

    base = rss_gib()
    small = config(arch, 1, 1)
    small.text_config.vocab_size = 64
    model = build_model(config(arch, layers, tower_blocks), torch.bfloat16, small_config=small)
    model.requires_grad_(False).eval()
    adapter = Qwen25VLAdapter(model, tiny_tokenizer())
    weights_gib = sum(p.numel() * p.element_size() for p in model.parameters()) / 2 ** 30
    built = rss_gib()
    image = page(size)
    grid = (size // adapter.cell, size // adapter.cell)
    (gestalt,), k = Budget.parse(tokens).split([grid])
    relevance = torch.nn.Parameter(torch.randn(grid, generator=torch.Generator().manual_seed(0)))
    saved, tower = [0], []
    adapter.visual.register_forward_pre_hook(lambda *a: tower.append(time.perf_counter()))
    adapter.visual.register_forward_hook(lambda *a: tower.append(time.perf_counter() - tower.pop()))

    def keep(t: torch.Tensor) -> torch.Tensor:
        saved[0] += t.numel() * t.element_size()
        return t

    t0 = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        z = (relevance - relevance.mean()) / relevance.std()
        weights = soft_topk(z.flatten()[None], k, 0.5).view(grid)
        cells = [top_cells(relevance, 2 * k)] if relaxation == "candidates" else None
        loss = answer_loss(adapter, [image], [QUESTION], [ANSWER], [weights], cells=cells, gestalt=[gestalt],
                           checkpointing=checkpointing)
    t1 = time.perf_counter()
    loss.backward()
    t2 = time.perf_counter()
    assert torch.isfinite(relevance.grad).all() and relevance.grad.abs().sum() > 0
    return dict(arch=arch, layers=layers, tower_blocks=tower_blocks, checkpointing=checkpointing,
                relaxation=relaxation, gestalt=list(gestalt),
                k=k, tokens=grid[0] * grid[1] if cells is None else len(cells[0]), runtime_gib=base,
                weights_gib=weights_gib, built_gib=built - base, peak_gib=rss_gib() - base,
                saved_gib=saved[0] / 2 ** 30, tower_s=sum(tower), forward_s=t1 - t0, backward_s=t2 - t1, loss=float(loss),
                tower_block_gib=sum(p.numel() * p.element_size() for p in adapter.visual.blocks[0].parameters())
                / 2 ** 30)


def fit(xs: Sequence[float], ys: Sequence[float], at: float) -> tuple[float, float]:
    """Least-squares line through (xs, ys): (its value at ``at``, its slope)."""
    n, mx, my = len(xs), sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs) if n > 1 else 0.0
    return my + slope * (at - mx), slope


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=1344, help="page side in px, a multiple of 28")
    ap.add_argument("--tokens", default="10%",
                    help="visual tokens per page (gestalt + saccades), as for arr-coc train (default %(default)s)")
    ap.add_argument("--llm-layers", type=int, nargs="+", default=[2, 4], help="measured LLM depths")
    ap.add_argument("--models", nargs="+", choices=sorted(ARCHS), default=["3b", "7b"])
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--full-depth", action="store_true",
                    help="also run every 3B setting at its real depth (36 LLM layers, 32 tower blocks), measured")
    ap.add_argument("--child", nargs=5, metavar=("ARCH", "LAYERS", "CHECKPOINTING", "RELAXATION", "TOWER"),
                    help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    args = parse_args(argv)
    if args.child:
        arch, layers, ck, relax, tower = args.child
        print(json.dumps(child(arch, int(layers), ck == "1", relax, args.size, args.tokens, int(tower))))
        return []
    from tqdm import tqdm

    settings = [(m, ck, relax) for m in args.models for relax in ("weighted", "candidates") for ck in (False, True)
                if relax == "weighted" or m == "3b"]
    runs: dict[tuple, list[dict]] = {s: [] for s in settings}
    full: dict[tuple, dict] = {}
    jobs = [(s, n, TOWER_BLOCKS) for s in settings for n in args.llm_layers]
    if args.full_depth:
        jobs += [(s, ARCHS["3b"][0]["num_hidden_layers"], QWEN25_VL_3B_VISION["depth"]) for s in settings
                 if s[0] == "3b"]
    start = time.perf_counter()
    for (m, ck, relax), layers, tower in tqdm(jobs, desc="settings"):
        cmd = [sys.executable, __file__, "--size", str(args.size), "--tokens", args.tokens,
               "--child", m, str(layers), "1" if ck else "0", relax, str(tower)]
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        if done.returncode:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
        row = json.loads(done.stdout.strip().splitlines()[-1])
        if tower == TOWER_BLOCKS:
            runs[(m, ck, relax)].append(row)
        else:
            full[(m, ck, relax)] = row
    rows = []
    for (m, ck, relax), rs in runs.items():
        depth = ARCHS[m][0]["num_hidden_layers"]
        extra_tower = (QWEN25_VL_3B_VISION["depth"] - TOWER_BLOCKS) * rs[0]["tower_block_gib"]
        xs = [r["layers"] for r in rs]
        peak, per_layer = fit(xs, [r["peak_gib"] for r in rs], depth)
        saved, saved_layer = fit(xs, [r["saved_gib"] for r in rs], depth)
        weights, _ = fit(xs, [r["weights_gib"] for r in rs], depth)
        fwd, _ = fit(xs, [r["forward_s"] for r in rs], depth)
        bwd, _ = fit(xs, [r["backward_s"] for r in rs], depth)
        tower_s = sum(r["tower_s"] for r in rs) / len(rs) * QWEN25_VL_3B_VISION["depth"] / TOWER_BLOCKS
        rows.append(dict(model=m, checkpointing=ck, relaxation=relax, tokens=rs[0]["tokens"], k=rs[0]["k"],
                         gestalt=rs[0]["gestalt"], measured=rs, per_layer_gib=per_layer, saved_layer_gib=saved_layer,
                         peak_gib=peak + extra_tower, weights_gib=weights + extra_tower, saved_gib=saved,
                         tower_s=tower_s, step_s=fwd + bwd + tower_s - sum(r["tower_s"] for r in rs) / len(rs),
                         full_depth=full.get((m, ck, relax))))
    first = rows[0]["measured"][0]
    lines = [
        f"One training step of the answer objective, batch 1, one {args.size}x{args.size} px page "
        f"({(args.size // 28) ** 2} cells of 28 px), {args.tokens} tokens = gestalt {first['gestalt'][0]}x"
        f"{first['gestalt'][1]} + K = {first['k']} saccades, random weights in bfloat16, bfloat16 autocast, "
        f"torch {torch.__version__} on this CPU ({torch.get_num_threads()} threads, shared), one repeat per "
        f"setting, each in a fresh process. Measured with {' and '.join(map(str, args.llm_layers))} LLM layers and "
        f"an {TOWER_BLOCKS}-block tower, extrapolated linearly per LLM layer to the real depth; the tower's other "
        f"{QWEN25_VL_3B_VISION['depth'] - TOWER_BLOCKS} blocks add their weights (and their share of the tower's measured time to the step time). peak = ru_maxrss minus the "
        f"runtime's own ({first['runtime_gib']:.2f} GiB); saved = what autograd keeps for the backward pass. "
        f"Whole run {(time.perf_counter() - start) / 60:.1f} min.", "",
        "| model | relaxation | tokens encoded | checkpointing | measured peak (GiB) at " +
        ", ".join(f"{n} layers" for n in args.llm_layers) + " | per LLM layer (GiB) | weights (GiB) | "
        "saved for backward (GiB) | est. peak, full depth (GiB) | est. step on this CPU (s) |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        name = {"3b": "Qwen2.5-VL-3B (36 layers)", "7b": "Qwen2.5-VL-7B (28 layers)"}[r["model"]]
        lines.append(f"| {name} | {r['relaxation']} | {r['tokens']} | {'on' if r['checkpointing'] else 'off'} | "
                     f"{', '.join('%.2f' % x['peak_gib'] for x in r['measured'])} | {r['per_layer_gib']:.3f} | "
                     f"{r['weights_gib']:.2f} | {r['saved_gib']:.2f} | {r['peak_gib']:.1f} | {r['step_s']:.0f} |")
    measured = [r for r in rows if r["full_depth"]]
    if measured:
        lines += ["", "Measured at the real depth (36 LLM layers, the whole 32-block tower), one step each, beside the "
                      "extrapolation above:", "",
                  "| model | relaxation | tokens encoded | checkpointing | peak (GiB) | est. peak (GiB) | saved for "
                  "backward (GiB) | step on this CPU (s): forward + backward |", "|---|---|---:|---|---:|---:|---:|---|"]
        for r in measured:
            f = r["full_depth"]
            lines.append(f"| Qwen2.5-VL-3B (36 layers) | {r['relaxation']} | {f['tokens']} | "
                         f"{'on' if r['checkpointing'] else 'off'} | {f['peak_gib']:.1f} | {r['peak_gib']:.1f} | "
                         f"{f['saved_gib']:.2f} | {f['forward_s'] + f['backward_s']:.0f}: {f['forward_s']:.0f} + "
                         f"{f['backward_s']:.0f} |")
    table = "\n".join(lines)
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_train_memory.md").write_text(table + "\n")
    (args.out / "bench_train_memory.json").write_text(json.dumps(rows, indent=1))
    print(f"wrote {args.out / 'bench_train_memory.md'}")
    return rows


if __name__ == "__main__":
    main()
