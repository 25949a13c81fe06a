"""The ``arr-coc`` command line: ``arr-coc look IMAGE "QUESTION"`` and friends."""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Sequence

from arr_coc import __version__


def _registered() -> str:
    from arr_coc.relevance import SCORERS
    from arr_coc.samplers import SAMPLERS
    from arr_coc.texture import CHANNELS
    from arr_coc.vlm import ADAPTERS, LAYOUTS, MODES

    return (f"samplers: {', '.join(SAMPLERS.names())}\n"
            f"texture channels: {', '.join(CHANNELS.names())}\n"
            f"scorers: {', '.join(SCORERS.names())}\n"
            f"VLM adapters (config model_type): {', '.join(ADAPTERS.names())}; "
            f"modes: {', '.join(MODES)}; layouts: {', '.join(LAYOUTS)}")


def _parser() -> argparse.ArgumentParser:
    from arr_coc.config import DEFAULT_BUDGET, CanvasConfig, SamplerConfig

    fmt = argparse.RawDescriptionHelpFormatter
    p = argparse.ArgumentParser(prog="arr-coc", formatter_class=fmt,
                                description="Query-aware visual token allocation: a gestalt of the whole image "
                                            "plus a fixed budget of full-resolution saccades where the question "
                                            "needs them.", epilog=_registered())
    p.add_argument("--version", action="version", version=f"arr-coc {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    look = sub.add_parser("look", formatter_class=fmt, epilog=_registered(),
                          help="allocate saccades for one image and question; print a summary, draw a PNG",
                          description="Allocate saccades for one image and question.")
    look.add_argument("image", help="image file (any format PIL reads)")
    look.add_argument("question", help='the question, e.g. "What is the total?"')
    look.add_argument("--budget", type=int, default=DEFAULT_BUDGET, help="saccade tokens K (default %(default)s)")
    look.add_argument("--sampler", default=SamplerConfig.name, help="sampler name (default %(default)s; see below)")
    look.add_argument("--scorer", default="contextual", help="relevance scorer (default %(default)s)")
    look.add_argument("--cell", type=int, default=CanvasConfig.cell,
                      help="token cell in px: 28 for Qwen2/2.5-VL, 32 for Qwen3-VL (default %(default)s)")
    look.add_argument("--max-pixels", type=int, default=CanvasConfig.max_pixels,
                      help="largest canvas area in px (default %(default)s)")
    look.add_argument("--gestalt", type=int, default=None, metavar="N",
                      help="N x N gestalt tokens (default 16, or 8 when --budget < 128)")
    look.add_argument("--seed", type=int, default=0, help="seed for learnable parts and random samplers")
    look.add_argument("--query-encoder", choices=("minilm", "hashing"), default="minilm",
                      help="minilm: packaged all-MiniLM-L6-v2; hashing: model-free bag of words")
    look.add_argument("--out", type=Path, default=None,
                      help="PNG to write (default <image>_arr.png next to the current directory; "
                           "with --json only when given)")
    look.add_argument("--channels", nargs="+", default=None, metavar="NAME",
                      help="texture channels; 'mvp' = the seeds' 13-channel MVP, 'default' = mvp + text_match "
                           "key_value learned_saliency (the default), e.g. --channels mvp objects (see the list below)")
    look.add_argument("--clip-model", default=None, metavar="PATH_OR_ID",
                      help="CLIP/SigLIP weights for the 'clip' channel (a local folder or a hub id)")
    look.add_argument("--timings", action="store_true", help="print each texture channel's time")
    look.add_argument("--json", action="store_true", help="print the allocation as JSON on stdout")
    look.add_argument("--top", type=int, default=10, help="saccades listed in the summary (default %(default)s)")

    from arr_coc.data.datasets import DATASETS
    from arr_coc.eval.harness import DEFAULT_BUDGETS, MARGIN_PX, METHODS

    ev = sub.add_parser("eval", formatter_class=fmt, epilog=_registered(),
                        help="coverage and OCR reading of the answer at equal token budgets, per method",
                        description="Evaluate allocation methods on a dataset at equal token budgets; rows go to "
                                    "OUT/DATASET/records.jsonl as they come (a rerun skips what is done), then "
                                    "summary.csv, summary.md and summary.png.")
    ev.add_argument("dataset", help=f"dataset: {', '.join(DATASETS.names())}")
    ev.add_argument("--data", type=Path, default=None,
                    help="dataset folder (jsonl: the .jsonl file); default: ../shared/data/<name> or $ARR_COC_DATA")
    ev.add_argument("--methods", nargs="+", default=list(METHODS), help="default: all of " + ", ".join(METHODS))
    ev.add_argument("--budgets", nargs="+", default=list(DEFAULT_BUDGETS),
                    help="token budgets, as tokens (529) or shares of full resolution (25%%); default %(default)s")
    ev.add_argument("--limit", type=int, default=None, help="evaluate N records (a seeded subset spread over images)")
    ev.add_argument("--seed", type=int, default=0, help="subset choice and random baseline")
    ev.add_argument("--split", choices=("train", "val", "test"), default=None,
                    help="only the images of this split (by image id, as `arr-coc train` splits them); "
                         "use test to report a trained scorer")
    ev.add_argument("--reader", default="tesseract", help="OCR engine: tesseract, rapidocr, or none")
    ev.add_argument("--margin", type=int, default=MARGIN_PX, help="px around the answer box when reading")
    ev.add_argument("--cell", type=int, default=CanvasConfig.cell, help="token cell in px (default %(default)s)")
    ev.add_argument("--scorer", default="contextual", help="relevance scorer (default %(default)s)")
    ev.add_argument("--channels", nargs="+", default=None, metavar="NAME",
                    help="texture channels ('mvp' = the 13-channel MVP, 'default' = mvp + text_match key_value learned_saliency)")
    ev.add_argument("--clip-model", default=None, metavar="PATH_OR_ID", help="weights for the 'clip' channel")
    ev.add_argument("--query-encoder", choices=("minilm", "hashing"), default="minilm")
    ev.add_argument("--out", type=Path, default=Path("out/eval"), help="output folder (default %(default)s)")
    ev.add_argument("--size-prior", type=float, default=None, metavar="ALPHA",
                    help="variable-size patches score a square by relevance mass / side**ALPHA "
                         "(default: arr_coc.patching.SIZE_PRIOR, chosen on validation images)")
    ev.add_argument("--selector-weights", default="auto", metavar="PATH",
                    help="weights of the 'selector' method (default: the packaged ones)")
    ev.add_argument("--pruner-weights", default="auto", metavar="PATH",
                    help="weights of the 'pruner' method (default: the packaged ones)")
    from arr_coc.vlm import LAYOUTS, MODES

    ask = sub.add_parser("ask", formatter_class=fmt, epilog=_registered(),
                         help="answer a question with a frozen VLM fed gestalt + saccades",
                         description="Allocate saccades, encode gestalt + saccades with the VLM's own vision "
                                     "tower at their true positions, and let the VLM answer.")
    ask.add_argument("image", help="image file (any format PIL reads)")
    ask.add_argument("question", help='the question, e.g. "What is the total?"')
    ask.add_argument("--model", required=True, metavar="PATH_OR_ID",
                     help="checkpoint folder or hub id loaded with from_pretrained (Qwen2/2.5/3-VL), "
                          "or tiny:<family> for a random-weight model that only exercises the plumbing")
    ask.add_argument("--budget", type=int, default=DEFAULT_BUDGET, help="saccade tokens K (default %(default)s)")
    ask.add_argument("--mode", choices=MODES, default="sparse",
                     help="sparse: the tower encodes only the chosen cells; slice: full grid, keep the chosen "
                          "tokens; weighted: every token, scaled by relevance (default %(default)s)")
    ask.add_argument("--layout", choices=LAYOUTS, default="scaled",
                     help="saccade positions: in the gestalt's frame, or as a second temporal slice")
    ask.add_argument("--no-gestalt", action="store_true", help="send the saccades only")
    ask.add_argument("--sampler", default=SamplerConfig.name, help="sampler name (default %(default)s)")
    from arr_coc.vlm.ask import allocators

    ask.add_argument("--allocator", choices=allocators(), default="arr",
                     help="arr: one-cell saccades from the sampler; saliency / quadtree: variable-size squares "
                          "(1x1, 2x2, ... cells, each shrunk to one token) on the same relevance, at most --budget "
                          "tokens, --mode sparse only; a quadtree needs --budget >= its starting tiling "
                          "(default %(default)s)")
    ask.add_argument("--channels", nargs="+", default=None, metavar="NAME", help="texture channels, as for look")
    ask.add_argument("--max-pixels", type=int, default=CanvasConfig.max_pixels,
                     help="largest canvas area in px (default %(default)s)")
    ask.add_argument("--max-new-tokens", type=int, default=64, help="answer length limit (default %(default)s)")
    ask.add_argument("--query-encoder", choices=("minilm", "hashing"), default="minilm")
    ask.add_argument("--dtype", default=None, help="model dtype, e.g. bfloat16 (default: the checkpoint's)")
    ask.add_argument("--device", default=None, help="e.g. cuda (default: cpu)")
    from dataclasses import fields

    from arr_coc.train.loop import TrainConfig

    tr = sub.add_parser("train", formatter_class=fmt, epilog=_registered(),
                        help="train the relevance scorer, patch selector or token pruner (texture and VLM frozen); "
                             "runs under torchrun too",
                        description="Train the scorer (or --learner selector|pruner) on dataset records split by "
                                    "image (train / val / test), "
                                    "evaluate on held-out images every --eval-every steps, checkpoint to "
                                    "OUT/checkpoint.pt (--resume continues exactly), write OUT/<learner>.pt, "
                                    "OUT/metrics.json and OUT/loss.png. Multi-process: "
                                    "torchrun --nproc_per_node N -m arr_coc.cli train ...")
    import inspect
    import re

    # each field's help is the comment beside it in TrainConfig: one source for code and CLI
    notes = dict(re.findall(r"^\s+(\w+): .*?#\s*(.+)$", inspect.getsource(TrainConfig), re.M))
    for f in fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        note = notes.get(f.name, "").replace("%", "%%")
        if f.type in ("bool", bool) and f.default:
            tr.add_argument("--no-" + f.name.replace("_", "-"), dest=f.name, action="store_false", help=note)
        elif f.type in ("bool", bool):
            tr.add_argument(flag, action="store_true", help=note)
        elif f.name == "datasets":
            tr.add_argument(flag, nargs="+", default=list(f.default), help="default %(default)s")
        else:
            kind = {"int": int, "float": float}.get(str(f.type), str)
            tr.add_argument(flag, type=kind if "None" not in str(f.type) else (int if "int" in str(f.type) else str),
                            default=f.default, help=f"{note} (default %(default)s)".strip())
    tr.add_argument("--channels", nargs="+", default=None, metavar="NAME", help="texture channels, as for look")
    tr.add_argument("--scorer", default="contextual", help="relevance scorer (default %(default)s)")
    tr.add_argument("--sampler", default="topk", help="sampler whose parameters train too, if any (default %(default)s)")
    tr.add_argument("--query-encoder", choices=("minilm", "hashing"), default="minilm")
    tr.add_argument("--export", type=Path, default=None, help="also copy the trained weights to this file")
    for cmd in (look, ev):
        cmd.add_argument("--scorer-weights", default="auto", metavar="auto|none|PATH",
                         help="auto: the shipped trained weights when they fit the channels; none: hand-set; "
                              "or a file from `arr-coc train` (default %(default)s)")
    return p


def _summary(alloc, i: int = 0, top: int = 10) -> str:
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
        f"top saccades  (rank: y, x cells -> y, x px  score)",
    ]
    c = d["cell"]
    for r, ((y, x), s) in enumerate(zip(d["positions"][:top], d["scores"][:top]), 1):
        lines.append(f"  {r:>3}: ({y:>3}, {x:>3}) -> ({y * c:>5}, {x * c:>5})  {s:+.3f}")
    return "\n".join(lines)


def texture_config(channels: Sequence[str] | None, clip_model: str | None = None):
    """TextureConfig from CLI names ('mvp': the 13-channel MVP; 'default': the pipeline's default set) and
    the CLIP weights."""
    from arr_coc.config import PIPELINE_CHANNELS, TextureConfig
    from arr_coc.texture import DEFAULT_CHANNELS

    names = None
    if channels:
        groups = {"mvp": DEFAULT_CHANNELS, "default": PIPELINE_CHANNELS}
        names = tuple(n for c in channels for n in groups.get(c, (c,)))
    return TextureConfig(channels=names, options={"clip": {"model": clip_model}} if clip_model else {})


def look(args: argparse.Namespace) -> int:
    import torch

    from arr_coc.config import ARRConfig, CanvasConfig, GestaltConfig, SamplerConfig, ScorerConfig
    from arr_coc.pipeline import ARR
    from arr_coc.query import HashingQueryEncoder, MiniLMQueryEncoder
    from arr_coc.viz import plot_allocation

    config = ARRConfig(
        canvas=CanvasConfig(cell=args.cell, max_pixels=args.max_pixels),
        texture=texture_config(args.channels, args.clip_model),
        gestalt=GestaltConfig(grid=None if args.gestalt is None else (args.gestalt, args.gestalt)),
        scorer=ScorerConfig(name=args.scorer, weights=args.scorer_weights),
        sampler=SamplerConfig(name=args.sampler, budget=args.budget),
        seed=args.seed,
    )
    start = time.perf_counter()
    encoder = HashingQueryEncoder() if args.query_encoder == "hashing" else MiniLMQueryEncoder().load()
    load_ms = (time.perf_counter() - start) * 1e3
    arr = ARR(config, query_encoder=encoder).eval()
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
    else:
        print(_summary(alloc, 0, args.top))
        print(f"scorer        {config.scorer.name}, weights: {arr.weights_source}")
        if args.timings:
            channel_ms = alloc.to_json(0)["channel_ms"]
            print("channel ms    " + "  ".join(f"{k} {v:.1f}" for k, v in channel_ms.items()))
        print(f"model load    {load_ms:.0f} ms (query encoder, once per process)")
        print(f"picture       {out}")
    return 0


def evaluate(args: argparse.Namespace) -> int:
    from arr_coc.config import ARRConfig, CanvasConfig, ScorerConfig
    from arr_coc.data.datasets import load_dataset
    from arr_coc.eval.harness import LEARNED_METHODS, METHODS, EvalSettings, evaluate as run, load_learned_methods, write_reports
    from arr_coc.eval.store import requested
    from arr_coc.pipeline import ARR
    from arr_coc.query import HashingQueryEncoder, MiniLMQueryEncoder

    records = load_dataset(args.dataset, args.data, limit=args.limit, seed=args.seed, split=args.split)
    encoder = HashingQueryEncoder() if args.query_encoder == "hashing" else MiniLMQueryEncoder()
    config = ARRConfig(canvas=CanvasConfig(cell=args.cell), texture=texture_config(args.channels, args.clip_model),
                       scorer=ScorerConfig(name=args.scorer, weights=args.scorer_weights), seed=args.seed)
    arr = ARR(config, query_encoder=encoder).eval()
    learned = {"selector": args.selector_weights, "pruner": args.pruner_weights}
    methods = list(args.methods)
    if methods == list(METHODS):  # the default list: leave out trained allocators whose weights do not fit
        for m in LEARNED_METHODS:
            try:
                load_learned_methods(arr, EvalSettings(methods=(m,), reader=None, learned=learned))
            except ValueError as err:
                print(f"arr-coc: leaving out method {m}: {err}", file=sys.stderr)
                methods.remove(m)
    settings = EvalSettings(methods=methods, budgets=args.budgets, seed=args.seed, margin_px=args.margin,
                            reader=None if args.reader == "none" else args.reader, learned=learned,
                            patch_options=None if args.size_prior is None else {"size_prior": args.size_prior})
    jsonl = run(records, arr, args.out / args.dataset, settings)
    csv_path, md_path, png_path = write_reports(jsonl, keys=requested(records, settings.methods, settings.budgets))
    print(md_path.read_text())
    print(f"rows {jsonl}\ntable {md_path}  csv {csv_path}  plot {png_path}")
    return 0


def ask(args: argparse.Namespace) -> int:
    import torch

    from arr_coc.config import ARRConfig, CanvasConfig, SamplerConfig
    from arr_coc.pipeline import ARR
    from arr_coc.query import HashingQueryEncoder, MiniLMQueryEncoder
    from arr_coc.vlm import ask as answer, load_vlm

    start = time.perf_counter()
    adapter = load_vlm(args.model, dtype=args.dtype, device=args.device)
    encoder = HashingQueryEncoder() if args.query_encoder == "hashing" else MiniLMQueryEncoder().load()
    load_s = time.perf_counter() - start
    config = ARRConfig(canvas=CanvasConfig(cell=adapter.cell, max_pixels=args.max_pixels),
                       texture=texture_config(args.channels), sampler=SamplerConfig(name=args.sampler, budget=args.budget))
    arr = ARR(config, query_encoder=encoder).eval()
    if args.device:
        arr = arr.to(args.device)
    start = time.perf_counter()
    with torch.inference_mode():
        a = answer(adapter, [args.image], [args.question], arr=arr, mode=args.mode, layout=args.layout,
                   gestalt=not args.no_gestalt, max_new_tokens=args.max_new_tokens, allocator=args.allocator)[0]
    run_s = time.perf_counter() - start
    tf, ff = a.flops["total"], a.flops_full["total"]
    print(f"question      {a.question!r}")
    print(f"answer        {a.text!r}")
    print(f"model         {args.model} ({adapter.name}, {adapter.cell} px cells)  mode {args.mode}  layout {args.layout}"
          f"  allocator {args.allocator}")
    print(f"visual tokens sent {a.visual_tokens} = {a.gestalt_tokens} gestalt + {a.saccades} saccades  |  "
          f"full resolution {a.full_tokens}  ({100 * a.visual_tokens / a.full_tokens:.0f}%)")
    print(f"prefill FLOPs est. {tf / 1e12:.3g} T (LLM {a.flops['llm'] / 1e12:.3g} T + vision "
          f"{a.flops['vision'] / 1e12:.3g} T)  |  full resolution {ff / 1e12:.3g} T  (full / sent = {ff / tf:.1f}x)")
    print(f"time          load {load_s:.1f} s  |  allocate + encode + answer {run_s:.1f} s")
    return 0


def train(args: argparse.Namespace) -> int:
    import shutil
    from dataclasses import fields

    from arr_coc.config import ARRConfig, SamplerConfig, ScorerConfig
    from arr_coc.query import HashingQueryEncoder, MiniLMQueryEncoder
    from arr_coc.train.loop import TrainConfig, train as run

    cfg = TrainConfig(**{f.name: getattr(args, f.name) for f in fields(TrainConfig)})
    cfg.datasets = tuple(cfg.datasets)
    config = ARRConfig(texture=texture_config(args.channels), scorer=ScorerConfig(name=args.scorer),
                       sampler=SamplerConfig(name=args.sampler), seed=cfg.seed)
    encoder = HashingQueryEncoder() if args.query_encoder == "hashing" else MiniLMQueryEncoder()
    result = run(cfg, config, query_encoder=encoder)
    if not result.metrics:  # not rank 0
        return 0
    m = result.metrics
    print(f"examples      {m['examples']}  (split by image; test images never trained on)")
    print(f"budget        {m['budget']} of full-resolution tokens; {m['processes']} process(es); "
          f"{m['train_seconds']:.0f} s")
    for split in ("val", "test"):
        print(f"{split:<5} IoU    initial {m['initial'][split]['iou']:.3f}  learned {m['learned'][split]['iou']:.3f}  "
              f"random {m['random'][split]['iou']:.3f}  |  answer coverage initial "
              f"{m['initial'][split]['coverage']:.3f}  learned {m['learned'][split]['coverage']:.3f}")
    out, weights = Path(cfg.out), Path(cfg.out) / f"{cfg.learner}.pt"
    print(f"written       {weights}  {out / 'metrics.json'}  {out / 'loss.png'}  {out / 'checkpoint.pt'}")
    if args.export:
        args.export.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(weights, args.export)
        print(f"exported      {args.export}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return {"look": look, "eval": evaluate, "ask": ask, "train": train}[args.command](args)
    except (ValueError, TypeError, KeyError, OSError, ImportError) as err:
        print(f"arr-coc: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
