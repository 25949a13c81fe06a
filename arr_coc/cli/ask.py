"""``arr-coc ask IMAGE "QUESTION" --model M``: a frozen VLM answers from gestalt + saccades."""
from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Callable

from arr_coc.cli import options as opt

HELP = "answer a question with a frozen VLM fed gestalt + saccades"


def add_parser(command: Callable[..., argparse.ArgumentParser]) -> None:
    from arr_coc.vlm import LAYOUTS, MODES
    from arr_coc.vlm.ask import RELEVANCE_SOURCES, allocators

    p = command("ask", [opt.image_question(), opt.vlm(), opt.pipeline(canvas=("max_pixels",))], help=HELP,
                description="Allocate K saccades, encode gestalt + saccades with the VLM's own vision tower at "
                            "their true positions, and let the VLM answer. The token cell is the model's.")
    opt.add_saccades(p)
    p.add_argument("--mode", choices=MODES, default="sparse",
                   help="sparse: the tower encodes only the chosen cells; slice: full grid, keep the chosen "
                        "tokens; weighted: every token, scaled by relevance (default %(default)s)")
    p.add_argument("--layout", choices=LAYOUTS, default="scaled",
                   help="saccade positions: in the gestalt's frame, or as a second temporal slice")
    p.add_argument("--no-gestalt", action="store_true", help="send the saccades only")
    p.add_argument("--allocator", choices=allocators(), default="arr",
                   help="arr: one-cell saccades from the sampler; saliency / quadtree: variable-size squares "
                        "(1x1, 2x2, ... cells, each shrunk to one token) on the same relevance, at most K "
                        "tokens, --mode sparse only; a quadtree needs K >= its starting tiling "
                        "(default %(default)s)")
    p.add_argument("--relevance", choices=("auto", *RELEVANCE_SOURCES), default="auto",
                   help="where the saccades' relevance comes from. arr: ARR's scorer on the texture channels "
                        "(the default channels run OCR on the CPU, about a second per 1344 px page, whatever "
                        "--device); vlm: the VLM's own attention to its gestalt, read while it prefills the question "
                        "(its first look, on the model's device; costs one more pass of the question's "
                        "tokens through the LLM, and the answer reuses the gestalt's prefill); auto: vlm on "
                        "CUDA, arr elsewhere (default %(default)s)")
    p.add_argument("--json", action="store_true",
                   help="print the answer, tokens sent and full, FLOPs and each stage's time as JSON")
    opt.max_new_tokens_option(p)
    opt.decoding(p)


def run(args: argparse.Namespace) -> int:
    import torch

    from arr_coc.config import ARRConfig, CanvasConfig, DecodeConfig, ScorerConfig
    from arr_coc.pipeline import ARR
    from arr_coc.vlm import ask as answer
    from arr_coc.vlm import load_vlm
    from arr_coc.vlm.ask import default_relevance
    from arr_coc.vlm.generation import from_decode

    if args.tokens is not None and args.no_gestalt:
        raise ValueError("--tokens T counts the gestalt's tokens too; with --no-gestalt give --saccades K")
    opt.check_question(args)
    decode = opt.from_args(DecodeConfig, args, opt.DECODE_OPTIONS)  # checked before anything loads
    stream = streams(args, decode)
    start = time.perf_counter()
    adapter = load_vlm(args.model, dtype=args.dtype, device=args.device)
    relevance = default_relevance(adapter) if args.relevance == "auto" else args.relevance
    # the vlm source reads the question with the VLM itself: MiniLM is then not loaded
    encoder = opt.query_encoder(args, load=relevance != "vlm")
    load_s = time.perf_counter() - start
    canvas = opt.from_args(CanvasConfig, args, opt.CANVAS_OPTIONS, cell=adapter.cell)
    sampler, gestalt = opt.sent(args, args.image, canvas)
    config = ARRConfig(canvas=canvas, texture=opt.texture_config(args.channels, args.clip_model), gestalt=gestalt,
                       scorer=opt.from_args(ScorerConfig, args, opt.SCORER_OPTIONS), sampler=sampler)
    arr = ARR(config, query_encoder=encoder).eval()
    arr.max_question_tokens = args.max_question_tokens
    if args.device:
        arr = arr.to(args.device)
    start = time.perf_counter()
    streamer = None
    if stream:
        from transformers import TextStreamer

        streamer = TextStreamer(adapter.tokenizer, skip_prompt=True, skip_special_tokens=True)
        print(f"question      {args.question!r}")
        print("answer        ", end="", flush=True)  # the streamer writes the answer on, then ends the line
    with torch.inference_mode():
        a = answer(adapter, [args.image], [args.question], arr=arr, mode=args.mode, layout=args.layout,
                   gestalt=not args.no_gestalt, max_new_tokens=args.max_new_tokens, allocator=args.allocator,
                   relevance=relevance, generation_config=from_decode(decode, args.max_new_tokens),
                   streamer=streamer, seed=decode.seed)[0]
    run_s = time.perf_counter() - start
    if args.json:
        print(json.dumps({"model": args.model, "family": adapter.name, "cell": adapter.cell, "mode": args.mode,
                          "layout": args.layout, **a.to_json(), "load_s": round(load_s, 3)}, indent=2))
        return 0
    tf, ff = a.flops["total"], a.flops_full["total"]
    if not stream:
        print(f"question      {a.question!r}")
        print(f"answer        {a.text!r}")
    print(f"model         {args.model} ({adapter.name}, {adapter.cell} px cells)  mode {args.mode}  layout {args.layout}"
          f"  allocator {args.allocator}  relevance {a.relevance}")
    print(f"visual tokens sent {a.visual_tokens} = {a.gestalt_tokens} gestalt + {a.saccades} saccades  |  "
          f"full resolution {a.full_tokens}  ({100 * a.visual_tokens / a.full_tokens:.0f}%)")
    print(f"prefill FLOPs est. {tf / 1e12:.3g} T (LLM {a.flops['llm'] / 1e12:.3g} T + vision "
          f"{a.flops['vision'] / 1e12:.3g} T)  |  full resolution {ff / 1e12:.3g} T  (full / sent = {ff / tf:.1f}x)")
    st = a.stage_ms()
    print(f"time          load {load_s:.1f} s  |  allocate + encode + answer {run_s:.1f} s  (allocation "
          f"{st['allocation'] / 1e3:.2f} s, vision {st['vision'] / 1e3:.2f} s, prefill {st['prefill'] / 1e3:.2f} s, "
          f"decode {st['decode'] / 1e3:.2f} s)")
    return 0


def streams(args: argparse.Namespace, decode: Any) -> bool:
    """Whether the answer streams: ``--stream`` / ``--no-stream``, else when text goes to a terminal; never into
    JSON, and not over beams (transformers streams one sequence, which beam search only settles at the end)."""
    if args.stream and (args.json or decode.num_beams > 1):
        raise ValueError("--stream prints one sequence as text as it grows: not with --json or --num-beams above 1")
    if args.stream is not None:
        return args.stream
    return not args.json and decode.num_beams == 1 and sys.stdout.isatty()
