"""``arr-coc ask CONTEXT "QUESTION" --model M``: a frozen VLM answers from gestalt + saccades.

CONTEXT is one image (the one-image path, unchanged) or a context: a PDF, a text file set on pages, or
several images. A context's pages share one budget (:func:`arr_coc.contexts.allocate_context`: a
gestalt per page, saccades ranked over every page's cells) and are read as one multi-image prompt
(:func:`arr_coc.vlm.context.read_context`).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Callable

from arr_coc.cli import options as opt
from arr_coc.cli import progress

HELP = "answer a question with a frozen VLM fed gestalt + saccades"


def add_parser(command: Callable[..., argparse.ArgumentParser]) -> None:
    from arr_coc.vlm import LAYOUTS, MODES
    from arr_coc.vlm.answer import RELEVANCE_SOURCES, allocators

    p = command("ask", [opt.context_question(), opt.vlm(), opt.pipeline(canvas=("max_pixels",))], help=HELP,
                description="Allocate K saccades, encode gestalt + saccades with the VLM's own vision tower at "
                            "their true positions, and let the VLM answer. The token cell is the model's. A "
                            "context (a PDF, a text file, several images) gets one budget over its pages, each "
                            "page a gestalt, and is read as one multi-image prompt.")
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
    progress.add_option(p)


def run(args: argparse.Namespace) -> int:
    import torch

    from arr_coc.config import ARRConfig, CanvasConfig, DecodeConfig, ScorerConfig
    from arr_coc.engine.pipeline import ARR
    from arr_coc.vlm import ask as answer
    from arr_coc.vlm import load_vlm
    from arr_coc.vlm.answer import default_relevance, refuse_total_tokens
    from arr_coc.vlm.generation import from_decode

    if args.tokens is not None and args.no_gestalt:
        raise ValueError("--tokens T counts the gestalt's tokens too; with --no-gestalt give --saccades K")
    opt.check_question(args)
    opt.refuse_unused_context_options(args)  # a flag for another kind of input would be ignored
    if opt.is_context(args):
        return run_context(args)
    args.image = args.inputs[0]
    decode = opt.from_args(DecodeConfig, args, opt.DECODE_OPTIONS)  # checked before anything loads
    stream = streams(args, decode)
    show = progress.stages(args)
    show("loading the model")
    start = time.perf_counter()
    adapter = load_vlm(args.model, dtype=args.dtype, device=args.device)
    refuse_total_tokens(adapter, args.tokens)  # a total the adapter cannot split as asked: before any work
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
    show("allocating, encoding, answering")
    if stream:
        show.close()  # the answer streams to the terminal from here on
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
    show.close()
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


def run_context(args: argparse.Namespace) -> int:
    """A context: one budget over its pages (allocate_context), one multi-image prompt (read_context)."""
    from arr_coc.cli.heap import map_large_buffers

    map_large_buffers()  # page after page of canvases would grow this process's heap (arr_coc/cli/heap.py)
    import torch

    from arr_coc.budget import budget_tokens
    from arr_coc.config import ARRConfig, CanvasConfig, SamplerConfig, ScorerConfig
    from arr_coc.contexts import allocate_context, open_context
    from arr_coc.engine.pipeline import ARR
    from arr_coc.vlm import load_vlm
    from arr_coc.vlm.answer import refuse_total_tokens
    from arr_coc.vlm.context import read_context

    refused = [flag for flag, on in (("--mode " + args.mode, args.mode != "sparse"), ("--no-gestalt", args.no_gestalt),
                                     ("--allocator " + args.allocator, args.allocator != "arr"),
                                     ("--relevance vlm", args.relevance == "vlm")) if on]
    if refused:
        raise ValueError(f"a context (several pages) is allocated by one ranking over its pages' cells and sent "
                         f"sparse with a gestalt per page; drop {', '.join(refused)}")
    decoding = [flag for flag, on in (("--do-sample", args.do_sample), ("--temperature", args.temperature != 1.0),
                                      ("--top-p", args.top_p != 1.0), ("--num-beams", args.num_beams != 1),
                                      ("--stop", bool(args.stop)), ("--seed", args.seed is not None),
                                      ("--stream", args.stream is not None)) if on]
    if decoding:  # read_context decodes greedily, without streaming: these would go unused
        raise ValueError(f"a context's answer is decoded greedily, in one piece; drop {', '.join(decoding)} (they "
                         f"act on one image)")
    tokens = None
    if args.tokens is not None:
        if str(args.tokens).strip().endswith("%"):
            raise ValueError(f"a context takes --tokens as a count over all its pages (e.g. 1300), got {args.tokens}")
        tokens = budget_tokens(args.tokens, 2 ** 62)
    context = args.inputs if len(args.inputs) > 1 else args.inputs[0]
    layout = opt.text_layout(args)
    show = progress.stages(args)
    show("reading the pages")
    # the pages' count and pixels, checked before the model loads (allocate_context checks them again, with the budget)
    open_context(context, pages=args.pages, dpi=args.dpi, layout=layout, max_pages=args.max_pages)
    show("loading the model")
    start = time.perf_counter()
    adapter = load_vlm(args.model, dtype=args.dtype, device=args.device)
    refuse_total_tokens(adapter, args.tokens, images=None)  # a total the adapter cannot split as asked
    load_s = time.perf_counter() - start
    canvas = opt.from_args(CanvasConfig, args, opt.CANVAS_OPTIONS, cell=adapter.cell)
    config = ARRConfig(canvas=canvas, texture=opt.texture_config(args.channels, args.clip_model),
                       scorer=opt.from_args(ScorerConfig, args, opt.SCORER_OPTIONS),
                       sampler=opt.from_args(SamplerConfig, args, opt.SAMPLER_OPTIONS))
    arr = ARR(config, query_encoder=opt.query_encoder(args)).eval()
    arr.max_question_tokens = args.max_question_tokens
    # the VLM's own tokenizer counts the text a real model would read; the tiny models' is a character toy
    tokenizer = None if args.model.startswith("tiny:") else adapter.tokenizer
    show("allocating over the pages, encoding, answering")
    start = time.perf_counter()
    with torch.inference_mode():
        alloc = allocate_context(arr, context, args.question, tokens=tokens,
                                 saccades=None if tokens is not None else config.sampler.saccades, pages=args.pages,
                                 dpi=args.dpi, layout=layout, max_pages=args.max_pages, tokenizer=tokenizer)
        a = read_context(adapter, alloc.pages, args.question, text_tokens=alloc.text_tokens,
                         tokenizer=alloc.tokenizer, layout=args.layout, max_new_tokens=args.max_new_tokens)
    run_s = time.perf_counter() - start
    show.close()
    if args.json:
        print(json.dumps({"model": args.model, "family": adapter.name, "cell": adapter.cell, "source": alloc.source,
                          **a.to_json(), "allocation_ms": round(sum(alloc.timings_ms.values()), 2),
                          "load_s": round(load_s, 3)}, indent=2))
        return 0
    n = len(a.pages)
    print(f"question      {a.question!r}")
    print(f"answer        {a.text!r}")
    print(f"model         {args.model} ({adapter.name}, {adapter.cell} px cells)  layout {args.layout}")
    print(f"context       {alloc.source}: {n} page{'s' if n != 1 else ''}")
    for p in a.pages:
        print(f"  page {p.index + 1:>3}    {p.gestalt_tokens:>4} gestalt + {p.saccades:>4} saccades  "
              f"(full resolution {p.full_tokens})")
    print(f"visual tokens sent {a.visual_tokens} = {sum(p.gestalt_tokens for p in a.pages)} gestalt + "
          f"{sum(p.saccades for p in a.pages)} saccades  |  full resolution {a.full_tokens}  "
          f"({100 * a.visual_tokens / a.full_tokens:.0f}%)")
    if a.text_tokens is None:
        print("text tokens   none (no page has a text layer or words)")
    else:
        print(f"text tokens   {a.text_tokens} ({a.tokenizer})  |  compression {a.compression:.2f}x "
              f"(text tokens / visual tokens sent)")
    tf, ff = a.flops["total"], a.flops_full["total"]
    print(f"prefill FLOPs est. {tf / 1e12:.3g} T  |  full resolution {ff / 1e12:.3g} T  (full / sent = {ff / tf:.1f}x)")
    print(f"time          load {load_s:.1f} s  |  allocate + encode + answer {run_s:.1f} s")
    return 0
