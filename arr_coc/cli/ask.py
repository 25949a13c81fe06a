"""``arr-coc ask CONTEXT "QUESTION" --model M``: a frozen VLM answers from gestalt + saccades.

CONTEXT is one image or a context: a PDF, a text file set on pages, or several images. Either goes through
:func:`arr_coc.vlm.ask`: one image is allocated alone (every ``--mode``, ``--allocator`` and
``--relevance``); a context's pages share one budget (a gestalt per page, saccades ranked over every
page's cells) and are read as one multi-image prompt. ``--json`` carries every page's saccade positions,
``--out`` draws them.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable

from arr_coc.cli import input_options, progress
from arr_coc.cli import options as opt

HELP = "answer a question with a frozen VLM fed gestalt + saccades"


def add_parser(command: Callable[..., argparse.ArgumentParser]) -> None:
    from arr_coc.vlm import LAYOUTS, MODES
    from arr_coc.vlm.allocation import RELEVANCE_SOURCES, allocators

    p = command("ask", [input_options.context_question(), opt.vlm(), opt.pipeline(canvas=("max_pixels",))], help=HELP,
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
                   help="print the answer, per page the tokens sent and the saccades' positions, full-resolution and "
                        "text tokens, FLOPs and each stage's time as JSON")
    p.add_argument("--out", type=Path, default=None, metavar="FILE.png",
                   help="draw every page with its saccades outlined into this PNG (default: no picture)")
    opt.max_new_tokens_option(p)
    opt.decoding(p)
    progress.add_option(p)


def run(args: argparse.Namespace) -> int:
    import torch

    from arr_coc.config import ARRConfig, CanvasConfig, DecodeConfig
    from arr_coc.engine.pipeline import ARR
    from arr_coc.vlm import ask, load_vlm
    from arr_coc.vlm.allocation import default_relevance
    from arr_coc.vlm.answer import refuse_total_tokens
    from arr_coc.vlm.generation import from_decode

    if args.tokens is not None and args.no_gestalt:
        raise ValueError("--tokens T counts the gestalt's tokens too; with --no-gestalt give --saccades K")
    input_options.check_question(args)
    input_options.refuse_unused_context_options(args)  # a flag for another kind of input would be ignored
    paged = input_options.is_context(args)
    context = args.inputs if len(args.inputs) > 1 else args.inputs[0]
    budget = opt.budget(args)  # the one parse of --tokens / --saccades: an image's or a context's budget
    decode = opt.from_args(DecodeConfig, args, opt.DECODE_OPTIONS)  # checked before anything loads
    stream = streams(args, decode)
    show = progress.stages(args)
    if paged:
        show("reading the pages")
        from arr_coc.cli.heap import map_large_buffers
        from arr_coc.contexts import open_context
        from arr_coc.vlm.request import refuse_for_context

        refuse_for_context(args.mode, not args.no_gestalt, args.allocator, args.relevance)  # before a model loads

        map_large_buffers()  # page after page of canvases would grow this process's heap (arr_coc/cli/heap.py)
        # the pages' count and pixels, checked before the model loads
        open_context(context, pages=args.pages, dpi=args.dpi, layout=input_options.text_layout(args), max_pages=args.max_pages)
    show("loading the model")
    start = time.perf_counter()
    adapter = load_vlm(args.model, dtype=args.dtype, device=args.device)
    refuse_total_tokens(adapter, args.tokens, images=None if paged else 1)  # a total it cannot split as asked
    # the vlm source reads the question with the VLM itself: MiniLM is then not loaded
    looks = not paged and (default_relevance(adapter) if args.relevance == "auto" else args.relevance) == "vlm"
    encoder = opt.query_encoder(args, load=not looks)
    load_s = time.perf_counter() - start
    canvas = opt.from_args(CanvasConfig, args, opt.CANVAS_OPTIONS, cell=adapter.cell)
    # every page's gestalt (one image: its one page) comes from the budget's split; ask's --seed seeds the answer's
    # sampling, not the ARR: its own seed stays the default
    config = opt.arr_config(args, canvas=canvas, seed=ARRConfig().seed)
    arr = ARR(config, query_encoder=encoder, retriever=opt.retriever(args, args.device)).eval()
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
        a = ask(adapter, context, args.question, arr=arr, budget=budget, mode=args.mode, layout=args.layout,
                gestalt=not args.no_gestalt, max_new_tokens=args.max_new_tokens, allocator=args.allocator,
                relevance=args.relevance, generation_config=from_decode(decode, args.max_new_tokens),
                streamer=streamer, seed=decode.seed, pages=args.pages, dpi=args.dpi, text_layout=input_options.text_layout(args),
                max_pages=args.max_pages,
                # the VLM's own tokenizer counts the text a real model would read; the tiny models' is a character toy
                text_tokenizer=None if args.model.startswith("tiny:") else adapter.tokenizer)
    run_s = time.perf_counter() - start
    show.close()
    if args.out is not None:
        draw(a, args.out, adapter.cell, f"{Path(args.inputs[0]).name}: {args.question}")
    if args.json:
        print(json.dumps({"model": args.model, "family": adapter.name, "cell": adapter.cell, "mode": args.mode,
                          "layout": args.layout, **a.to_json(), "load_s": round(load_s, 3)}, indent=2))
        return 0
    print(report(a, args, adapter, stream, load_s, run_s))
    return 0


def report(a: Any, args: argparse.Namespace, adapter: Any, streamed: bool, load_s: float, run_s: float) -> str:
    """The answer as ``ask`` prints it: the tokens sent (per page for several), text tokens, FLOPs, times."""
    lines = [] if streamed else [f"question      {a.question!r}", f"answer        {a.text!r}"]
    lines.append(f"model         {args.model} ({adapter.name}, {adapter.cell} px cells)  mode {args.mode}  layout "
                 f"{args.layout}  allocator {a.allocator}  relevance {a.relevance}")
    if len(a.pages) > 1 or a.text_tokens is not None:
        n = len(a.pages)
        lines.append(f"context       {a.source}: {n} page{'s' if n != 1 else ''}")
        lines += [f"  page {p.index + 1:>3}    {p.gestalt_tokens:>4} gestalt + {p.saccades:>4} saccades  "
                  f"(full resolution {p.full_tokens})" for p in a.pages]
    lines.append(f"visual tokens sent {a.visual_tokens} = {a.gestalt_tokens} gestalt + {a.saccades} saccades  |  "
                 f"full resolution {a.full_tokens}  ({100 * a.visual_tokens / a.full_tokens:.0f}%)")
    if a.text_tokens is not None:
        lines.append(f"text tokens   {a.text_tokens} ({a.tokenizer})  |  compression {a.compression:.2f}x "
                     f"(text tokens / visual tokens sent)")
    elif len(a.pages) > 1:
        lines.append("text tokens   none (no page has a text layer or words)")
    tf, ff = a.flops["total"], a.flops_full["total"]
    lines.append(f"prefill FLOPs est. {tf / 1e12:.3g} T (LLM {a.flops['llm'] / 1e12:.3g} T + vision "
                 f"{a.flops['vision'] / 1e12:.3g} T)  |  full resolution {ff / 1e12:.3g} T  (full / sent = "
                 f"{ff / tf:.1f}x)")
    st = a.stage_ms()
    lines.append(f"time          load {load_s:.1f} s  |  allocate + encode + answer {run_s:.1f} s  (allocation "
                 f"{st['allocation'] / 1e3:.2f} s, vision {st['vision'] / 1e3:.2f} s, prefill "
                 f"{st['prefill'] / 1e3:.2f} s, decode {st['decode'] / 1e3:.2f} s)")
    if args.out is not None:
        lines.append(f"picture       {args.out}")
    return "\n".join(lines)


def draw(a: Any, out: Path, cell: int, title: str) -> None:
    """Every page the answer read, its saccades outlined (cells, or a patch allocator's squares), into ``out``."""
    from arr_coc.viz import plot_context

    labels = [f"p{p.index + 1}: {p.gestalt_tokens} gestalt + {p.saccades}" for p in a.pages]
    where = [p.squares if p.squares is not None else p.cells for p in a.pages]
    plot_context(Pages(a.pages), where, labels, cell, out, title=title)


class Pages:
    """The pages' canvases for the picture, drawn when asked and the last row's kept (a row is 10 pages):
    a long context's canvases are never all in memory at once."""

    def __init__(self, pages: Any, keep: int = 10) -> None:
        self.pages, self.keep, self.kept = pages, keep, OrderedDict()

    def __len__(self) -> int:
        return len(self.pages)

    def __getitem__(self, i: int) -> Any:
        if i not in self.kept:
            self.kept[i] = self.pages[i].image.cpu()
            while len(self.kept) > self.keep:
                self.kept.popitem(last=False)
        return self.kept[i]


def streams(args: argparse.Namespace, decode: Any) -> bool:
    """Whether the answer streams: ``--stream`` / ``--no-stream``, else when text goes to a terminal; never into
    JSON, and not over beams (transformers streams one sequence, which beam search only settles at the end)."""
    if args.stream and (args.json or decode.num_beams > 1):
        raise ValueError("--stream prints one sequence as text as it grows: not with --json or --num-beams above 1")
    if args.stream is not None:
        return args.stream
    return not args.json and decode.num_beams == 1 and sys.stdout.isatty()
