"""``arr-coc look IMAGE "QUESTION"``: allocate saccades for one image and question, print them, draw a PNG."""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any, Callable

from arr_coc.cli import options as opt

HELP = "allocate saccades for one image and question; print a summary, draw a PNG"


def add_parser(command: Callable[..., argparse.ArgumentParser]) -> None:
    from arr_coc.config import ARRConfig

    p = command("look", [opt.image_question(), opt.pipeline()], help=HELP,
                description="Allocate K saccades (plus the gestalt) for one image and question.")
    opt.add_saccades(p)
    p.add_argument("--gestalt", type=int, default=None, metavar="N",
                   help="N x N gestalt tokens, on top of the K saccades, clamped to the image's cell grid "
                        "(default: the rule under --saccades)")
    opt.add_options(p, ARRConfig, opt.SEED_OPTIONS)
    p.add_argument("--out", type=Path, default=None,
                   help="PNG to write (default <image>_arr.png in the current directory; with --json only when given)")
    p.add_argument("--timings", action="store_true", help="print each texture channel's time")
    p.add_argument("--json", action="store_true", help="print the allocation as JSON on stdout")
    p.add_argument("--top", type=int, default=10, help="saccades listed in the summary (default %(default)s)")


def summary(alloc: Any, i: int = 0, top: int = 10) -> str:
    """Image ``i``'s allocation as the lines ``look`` prints: sizes, tokens, context weights, the top saccades."""
    d = alloc.to_json(i)
    tok = d["tokens"]
    lines = [
        f"question      {d['question']!r}",
        f"image         {d['image_size'][1]}x{d['image_size'][0]} px -> canvas {d['canvas'][1]}x{d['canvas'][0]} px "
        f"({d['grid'][1]}x{d['grid'][0]} cells of {d['cell']} px)",
        f"tokens        full resolution {tok['full_resolution']}  |  sent {tok['sent']} = "
        f"{tok['gestalt']} gestalt ({d['gestalt_grid'][0]}x{d['gestalt_grid'][1]}) + {tok['saccades']} saccades "
        f"({100 * tok['sent'] / tok['full_resolution']:.0f}% of full)",
        "context       " + "  ".join(f"{k} {v:.2f}" for k, v in d["context_weights"].items()),
        "stage ms      " + "  ".join(f"{k} {v:.1f}" for k, v in d["timings_ms"].items()),
        "top saccades  (rank: y, x cells -> y, x px  score)",
    ]
    c = d["cell"]
    for r, ((y, x), s) in enumerate(zip(d["positions"][:top], d["scores"][:top]), 1):
        lines.append(f"  {r:>3}: ({y:>3}, {x:>3}) -> ({y * c:>5}, {x * c:>5})  {s:+.3f}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    import torch

    from arr_coc.config import ARRConfig, CanvasConfig, ScorerConfig, check_int
    from arr_coc.pipeline import ARR
    from arr_coc.viz import plot_allocation

    check_int("top", args.top, 0)
    opt.check_question(args)
    canvas = opt.from_args(CanvasConfig, args, opt.CANVAS_OPTIONS)
    sampler, gestalt = opt.sent(args, args.image, canvas)
    config = ARRConfig(canvas=canvas, texture=opt.texture_config(args.channels, args.clip_model), gestalt=gestalt,
                       scorer=opt.from_args(ScorerConfig, args, opt.SCORER_OPTIONS), sampler=sampler, seed=args.seed)
    start = time.perf_counter()
    encoder = opt.query_encoder(args)
    load_ms = (time.perf_counter() - start) * 1e3
    arr = ARR(config, query_encoder=encoder).eval()
    arr.max_question_tokens = args.max_question_tokens
    with torch.inference_mode():
        alloc = arr([args.image], [args.question])
    out = args.out
    if out is None and not args.json:
        out = Path(Path(args.image).stem + "_arr.png")
    if out is not None:
        h, w = alloc.canvas.sizes[0]
        c = alloc.canvas.cell
        plot_allocation(alloc.canvas.pixels[0, :, :h, :w], alloc.relevance.map[0, : h // c, : w // c],
                        alloc.positions[0], alloc.scores[0], c, out, gestalt_grid=alloc.gestalt.grid,
                        title=f"{Path(args.image).name}: {args.question}")
    if args.json:
        print(json.dumps(alloc.to_json(0)))
        return 0
    print(summary(alloc, 0, args.top))
    print(f"scorer        {config.scorer.name}, weights: {arr.weights_source}")
    if args.timings:
        channel_ms = alloc.to_json(0)["channel_ms"]
        print("channel ms    " + "  ".join(f"{k} {v:.1f}" for k, v in channel_ms.items()))
    print(f"model load    {load_ms:.0f} ms (query encoder, once per process)")
    print(f"picture       {out}")
    return 0
