"""``arr-coc look INPUT "QUESTION"``: allocate one budget over an input's pages, print them, draw a PNG.

One code path for every input (:func:`arr_coc.contexts.allocate`): an image is a context of one page (printed
with its sizes, context weights and top saccades, drawn with its relevance); ``arr-coc look doc.pdf "QUESTION"
--pages 1-20 --tokens 2000`` (or a text file, or several images) prints per page its gestalt and saccades,
the text tokens and the compression ratio, and draws the pages as a strip with their saccades. ``--json``
prints :meth:`~arr_coc.contexts.ContextAllocation.to_json` for either.
"""
from __future__ import annotations

import argparse
import json
import time
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable

from arr_coc.cli import input_options, outputs, progress
from arr_coc.cli import options as opt

HELP = "allocate saccades for one image and question; print a summary, draw a PNG"


def add_parser(command: Callable[..., argparse.ArgumentParser]) -> None:
    from arr_coc.config import ARRConfig

    p = command("look", [input_options.context_question(), opt.pipeline()], help=HELP,
                description="Allocate K saccades (plus the gestalt) for one image and question, or one budget "
                            "over a context's pages (a PDF, a text file, several images).")
    opt.add_saccades(p)
    p.add_argument("--gestalt", type=int, default=None, metavar="N",
                   help="N x N gestalt tokens, on top of the K saccades, clamped to the image's cell grid "
                        "(default: the rule under --saccades)")
    opt.add_options(p, ARRConfig, opt.SEED_OPTIONS)
    p.add_argument("--out", type=Path, default=None,
                   help="PNG to write (default out/<input>_arr.png, a context's out/<input>_coc.png, in the "
                        "current folder; with --json only when given)")
    p.add_argument("--timings", action="store_true", help="print each texture channel's time")
    p.add_argument("--json", action="store_true", help="print the allocation as JSON on stdout")
    p.add_argument("--top", type=int, default=10, help="saccades listed in the summary (default %(default)s)")
    progress.add_option(p)


def summary(d: dict[str, Any], top: int = 10) -> str:
    """A one-page allocation's JSON (``to_json()``) as the lines ``look`` prints: sizes, tokens, context weights,
    the top saccades."""
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
    """``look`` over any input: one image is a context of one page (one path, one JSON schema)."""
    from arr_coc.cli.heap import map_large_buffers

    map_large_buffers()  # page after page of canvases would grow this process's heap (arr_coc/cli/heap.py)
    import torch

    from arr_coc.config import GestaltConfig, check_int
    from arr_coc.contexts import allocate, check_context
    from arr_coc.engine.pipeline import ARR

    check_int("top", args.top, 0)
    input_options.check_question(args)
    input_options.refuse_unused_context_options(args)  # a flag for another kind of input would be ignored
    budget = opt.budget(args)  # the one parse of --tokens / --saccades
    if args.gestalt is not None and budget.kind != "saccades":
        raise ValueError("--tokens T sets the gestalt by the split rule; give --saccades K with --gestalt N instead")
    config = opt.arr_config(args, gestalt=GestaltConfig(grid=None if args.gestalt is None else (args.gestalt,) * 2))
    context = args.inputs if len(args.inputs) > 1 else args.inputs[0]
    show = progress.stages(args)
    show("reading the input")
    # pages, pixels and budget refused before a model loads or a page is drawn
    opened, _, _ = check_context(config, context, budget, pages=args.pages, dpi=args.dpi, layout=input_options.text_layout(args),
                                 max_pages=args.max_pages)
    show("loading the question encoder")
    start = time.perf_counter()
    encoder = opt.query_encoder(args)
    load_ms = (time.perf_counter() - start) * 1e3
    arr = ARR(config, query_encoder=encoder, retriever=opt.retriever(args)).eval()
    arr.max_question_tokens = args.max_question_tokens
    show("allocating (texture, OCR, relevance, saccades)")
    with torch.inference_mode():
        alloc = allocate(arr, opened, args.question, budget)  # the input as checked above, opened once
    one = len(alloc.pages) == 1  # one page: its saccades on its relevance; more: a strip of pages
    out = args.out
    if out is None and not args.json:
        out = outputs.picture(args.inputs[0], "_arr" if one else "_coc")
    if out is not None:
        show("drawing the picture")
        draw(alloc, out, f"{Path(args.inputs[0]).name}: {args.question}")
    show.close()
    if args.json:
        print(json.dumps(alloc.to_json()))
        return 0
    if not one:
        print(context_summary(alloc, args.top))
        print(f"picture       {out}")
        return 0
    d = alloc.to_json()
    print(summary(d, args.top))
    print(f"scorer        {config.scorer.name}, weights: {arr.weights_source}")
    if args.timings:
        print("channel ms    " + "  ".join(f"{k} {v:.1f}" for k, v in d["channel_ms"].items()))
    print(f"model load    {load_ms:.0f} ms (query encoder, once per process)")
    print(f"picture       {out}")
    return 0


def draw(alloc: Any, out: Path, title: str) -> None:
    """The picture: one page with its relevance and saccades, or the pages as a strip with their saccades."""
    from arr_coc.viz import plot_allocation, plot_context

    if len(alloc.pages) == 1:
        p = alloc.pages[0]
        plot_allocation(p.image, p.placing, p.plan.cells, p.plan.scores, p.cell, out, gestalt_grid=p.plan.gestalt,
                        title=title)
        return
    labels = [f"p{p.index + 1}: {p.plan.gestalt[0]}x{p.plan.gestalt[1]} + {p.saccades}" for p in alloc.pages]
    plot_context(_Canvases(alloc.pages), [p.plan.cells for p in alloc.pages], labels, alloc.pages[0].cell, out,
                 title=title)


def context_summary(alloc: Any, top: int = 10) -> str:
    """A context's allocation as the lines ``look`` prints: tokens, compression, per page gestalt and saccades."""
    d = alloc.to_json()
    tok, ctx = d["tokens"], d["context"]
    lines = [f"question      {d['question']!r}",
             f"context       {d['source']}: {len(d['pages'])} pages ({ctx.get('kind')}"
             + (f", {ctx['dpi']:g} dpi" if ctx.get("dpi") else "")
             + (f", {ctx['font']} {ctx['size']} px on {ctx['width']}x{ctx['height']} px pages" if ctx.get("font") else "")
             + ")",
             f"tokens        full resolution {tok['full_resolution']}  |  sent {tok['sent']} = {tok['gestalt']} gestalt + "
             f"{tok['saccades']} saccades ({100 * tok['sent'] / tok['full_resolution']:.1f}% of full)"]
    if d["text_tokens"] is None:
        lines.append("text          no text found (images without OCR): no compression ratio")
    else:
        lines.append(f"text          {d['text_tokens']} text tokens ({d['tokenizer']})  ->  compression "
                     f"{d['compression']:.1f}x (text tokens / visual tokens sent)")
    lines.append("pages         (page: gestalt + saccades, text from)")
    ranked = sorted(d["pages"], key=lambda p: -p["saccades"])
    for p in ranked[:top]:
        g = p["gestalt_grid"]
        lines.append(f"  {p['index'] + 1:>4}: {g[0]}x{g[1]} + {p['saccades']:>4}  {p['text_from']}")
    if len(ranked) > top:
        rest = ranked[top:]
        lines.append(f"  ... {len(rest)} more pages with {sum(p['saccades'] for p in rest)} saccades (--top N lists more)")
    lines.append("stage ms      " + "  ".join(f"{k} {v:.0f}" for k, v in d["timings_ms"].items() if "/" not in k))
    return "\n".join(lines)


class _Canvases(Sequence):
    """The pages' canvases for the picture, drawn when asked and the last row's kept (a row is 10 pages):
    a long context's canvases are never all in memory at once."""

    def __init__(self, pages: Sequence[Any], keep: int = 10) -> None:
        self.pages, self.keep, self.kept = pages, keep, OrderedDict()

    def __len__(self) -> int:
        return len(self.pages)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i not in self.kept:
            self.kept[i] = self.pages[i].image
            while len(self.kept) > self.keep:
                self.kept.popitem(last=False)
        return self.kept[i]
