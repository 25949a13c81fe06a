"""The ``arr-coc`` command line: ``arr-coc look IMAGE "QUESTION"`` and friends."""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import MISSING, fields
from pathlib import Path
from types import UnionType
from typing import Any, Sequence, Union, get_args, get_origin, get_type_hints

from arr_coc import __version__
from arr_coc.errors import UserError


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


# Options that come from a config dataclass: field name -> option strings (the first names the dest).
# Type, default and help text come from the field itself (its type hint and metadata["help"]).
CANVAS_OPTIONS = {"cell": "--cell", "max_pixels": "--max-pixels"}
SCORER_OPTIONS = {"name": "--scorer", "weights": "--scorer-weights"}
# `look` and `ask` spend K saccades on top of the gestalt; --budget is the older spelling of --saccades
SAMPLER_OPTIONS = {"name": "--sampler", "budget": ("--saccades", "--budget")}
# `eval` and `train` take total tokens: only the sampler's name (the method arr sends; a learnable
# sampler takes its trained parameters from --scorer-weights when that run trained it)
SAMPLER_NAME_OPTIONS = {"name": "--sampler"}


def _dest(option: str) -> str:
    return option.lstrip("-").replace("-", "_")


def _option_type(hint: Any) -> tuple[type, bool]:
    """(scalar type, takes several values) of a field's type hint: ``int | None`` -> (int, False),
    ``tuple[str, ...]`` -> (str, True)."""
    args = [a for a in get_args(hint) if a is not type(None)]
    if get_origin(hint) in (Union, UnionType):
        return _option_type(args[0])
    if get_origin(hint) is tuple:
        return args[0], True
    return hint, False


def add_options(parser: argparse._ActionsContainer, cls: type, options: dict[str, str | tuple[str, ...]],
                defaults: dict[str, Any] | None = None) -> None:
    """Add one option per field of the dataclass ``cls`` named in ``options``: its type hint sets the
    type (a bool with default True becomes ``--no-<name>``), the field's default (or ``defaults``) the
    default, and ``metadata["help"]`` the help text."""
    hints = get_type_hints(cls)
    for f in fields(cls):
        if f.name not in options:
            continue
        flags = options[f.name]
        flags = (flags,) if isinstance(flags, str) else flags
        default = (defaults or {}).get(f.name, f.default if f.default is not MISSING else f.default_factory())
        text = f.metadata["help"].replace("%", "%%")
        kind, several = _option_type(hints[f.name])
        if kind is bool:
            if default:
                parser.add_argument(*("--no-" + fl[2:] for fl in flags), dest=f.name, action="store_false", help=text)
            else:
                parser.add_argument(*flags, dest=_dest(flags[0]), action="store_true", help=text)
            continue
        parser.add_argument(*flags, dest=_dest(flags[0]), type=kind, nargs="+" if several else None,
                            default=list(default) if several and default is not None else default,
                            metavar=f.metadata.get("metavar"),
                            help=text if default is None else f"{text} (default %(default)s)")


def from_args(cls: type, args: argparse.Namespace, options: dict[str, str | tuple[str, ...]], **extra: Any):
    """``cls`` built from the options :func:`add_options` declared (those this command has) and ``extra``."""
    given = {}
    for name, flags in options.items():
        dest = _dest(flags if isinstance(flags, str) else flags[0])
        if hasattr(args, dest):
            value = getattr(args, dest)
            given[name] = tuple(value) if isinstance(value, list) else value
    return cls(**{**given, **extra})


def _parent(title: str) -> tuple[argparse.ArgumentParser, argparse._ArgumentGroup]:
    parent = argparse.ArgumentParser(add_help=False)
    return parent, parent.add_argument_group(title)


def _image_question() -> argparse.ArgumentParser:
    parent, g = _parent("input")
    g.add_argument("image", help="image file (any format PIL reads)")
    g.add_argument("question", help='the question, e.g. "What is the total?"')
    return parent


def _saccades() -> argparse.ArgumentParser:
    """The sampler and its budget in saccades K (``look``, ``ask``; ``eval`` and ``train`` take total tokens)."""
    from arr_coc.config import SamplerConfig

    parent, g = _parent("saccades (the gestalt's tokens come on top of K)")
    add_options(g, SamplerConfig, SAMPLER_OPTIONS)
    return parent


def _pipeline(canvas: Sequence[str] = ("cell", "max_pixels")) -> argparse.ArgumentParser:
    """How relevance is computed: canvas, texture channels, question encoder, scorer."""
    from arr_coc.config import CanvasConfig, ScorerConfig

    parent, g = _parent("pipeline")
    add_options(g, CanvasConfig, {k: v for k, v in CANVAS_OPTIONS.items() if k in canvas})
    g.add_argument("--channels", nargs="+", default=None, metavar="NAME",
                   help="texture channels; 'mvp' = the 13-channel MVP, 'default' = mvp + text_match key_value "
                        "learned_saliency (the default), e.g. --channels mvp objects (see the list below)")
    g.add_argument("--clip-model", default=None, metavar="PATH_OR_ID",
                   help="CLIP/SigLIP weights for the 'clip' channel (a local folder or a hub id)")
    g.add_argument("--query-encoder", choices=("minilm", "hashing"), default="minilm",
                   help="minilm: packaged all-MiniLM-L6-v2; hashing: model-free bag of words (default %(default)s)")
    add_options(g, ScorerConfig, SCORER_OPTIONS)
    return parent


def _vlm(required: bool = True) -> argparse.ArgumentParser:
    parent, g = _parent("VLM")
    g.add_argument("--model", required=required, metavar="PATH_OR_ID",
                   help="checkpoint folder or hub id loaded with from_pretrained (Qwen2/2.5/3-VL), "
                        "or tiny:<family> for a random-weight model that only exercises the plumbing"
                        + ("" if required else "; needed by --reader vlm"))
    g.add_argument("--dtype", default=None, help="model dtype, e.g. bfloat16 (default: the checkpoint's)")
    g.add_argument("--device", default=None, help="e.g. cuda (default: cpu)")
    return parent


def _data() -> argparse.ArgumentParser:
    from arr_coc.data.datasets import DATASETS

    parent, g = _parent("data")
    g.add_argument("dataset", help=f"dataset: {', '.join(DATASETS.names())}")
    g.add_argument("--data", type=Path, default=None,
                   help="dataset folder (jsonl: the .jsonl file); default: ../shared/data/<name> or $ARR_COC_DATA")
    g.add_argument("--limit", type=int, default=None, help="evaluate N records (a seeded subset spread over images)")
    g.add_argument("--split", choices=("train", "val", "test"), default=None,
                   help="only the images of this split (by image id, as `arr-coc train` splits them; DocVQA, "
                        "InfoVQA, TextVQA and ChartQA: their official split's files); use test to report a "
                        "trained scorer (required when the shipped weights were trained on the dataset)")
    return parent


def _parser() -> argparse.ArgumentParser:
    from arr_coc.config import SamplerConfig

    fmt = argparse.RawDescriptionHelpFormatter
    p = argparse.ArgumentParser(prog="arr-coc", formatter_class=fmt,
                                description="Query-aware visual token allocation: a gestalt of the whole image "
                                            "plus a fixed budget of full-resolution saccades where the question "
                                            "needs them.", epilog=_registered())
    p.add_argument("--version", action="version", version=f"arr-coc {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    def command(name: str, parents: list[argparse.ArgumentParser], **kw: Any) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=parents, formatter_class=fmt, epilog=_registered(), **kw)

    look = command("look", [_image_question(), _saccades(), _pipeline()],
                   help="allocate saccades for one image and question; print a summary, draw a PNG",
                   description="Allocate K saccades (plus the gestalt) for one image and question.")
    look.add_argument("--gestalt", type=int, default=None, metavar="N",
                      help="N x N gestalt tokens, on top of the K saccades, clamped to the image's cell grid "
                           "(default: the rule under --saccades)")
    look.add_argument("--seed", type=int, default=0, help="seed for learnable parts and random samplers")
    look.add_argument("--out", type=Path, default=None,
                      help="PNG to write (default <image>_arr.png in the current directory; "
                           "with --json only when given)")
    look.add_argument("--timings", action="store_true", help="print each texture channel's time")
    look.add_argument("--json", action="store_true", help="print the allocation as JSON on stdout")
    look.add_argument("--top", type=int, default=10, help="saccades listed in the summary (default %(default)s)")

    from arr_coc.eval.harness import DEFAULT_BUDGETS, MARGIN_PX, METHODS
    from arr_coc.eval import vlm_reader

    ev = command("eval", [_data(), _pipeline(), _vlm(required=False)],
                 help="answers or OCR reading of the answer at equal token budgets, per method",
                 description="Evaluate allocation methods on a dataset at equal total token budgets (each method "
                             "spends the same number of visual tokens; for gestalt + saccades that total is split "
                             "between them); rows go to OUT/DATASET/records.jsonl as they come (a rerun skips "
                             "what is done), then summary.csv, summary.md and summary.png. With --reader vlm the "
                             "model answers every method (rows in OUT/DATASET/MODEL/); multi-process: "
                             "torchrun --nproc_per_node N -m arr_coc.cli eval ... --reader vlm")
    ev.add_argument("--methods", nargs="+", default=None,
                    help="OCR readers, default all of " + ", ".join(METHODS) + "; --reader vlm: any of "
                         + ", ".join(vlm_reader.VLM_METHODS) + ", default " + " ".join(vlm_reader.DEFAULT_METHODS))
    ev.add_argument("--budgets", nargs="+", default=None,
                    help=("total visual tokens per image (gestalt + saccades), as tokens (529) or shares of full "
                          f"resolution (25%); default {' '.join(DEFAULT_BUDGETS)} (--reader vlm: "
                          f"{' '.join(vlm_reader.DEFAULT_BUDGETS)})").replace("%", "%%"))
    add_options(ev, SamplerConfig, SAMPLER_NAME_OPTIONS)  # what the method arr sends
    ev.add_argument("--seed", type=int, default=0, help="subset choice and random baseline")
    ev.add_argument("--reader", default="tesseract", choices=("tesseract", "rapidocr", "vlm", "none"),
                    help="tesseract / rapidocr: OCR reads the answer region of what the VLM would see; vlm: the "
                         "model (--model) answers the question; none: allocation metrics only "
                         "(default %(default)s)")
    ev.add_argument("--batch-size", type=int, default=vlm_reader.VLMEvalSettings.batch_size,
                    help="--reader vlm: answers generated together (default %(default)s)")
    ev.add_argument("--max-new-tokens", type=int, default=vlm_reader.VLMEvalSettings.max_new_tokens,
                    help="--reader vlm: answer length limit (default %(default)s)")
    ev.add_argument("--prompt", default=vlm_reader.PROMPT,
                    help="--reader vlm: the text sent with the image, {question} replaced (default: %(default)r)")
    ev.add_argument("--margin", type=int, default=MARGIN_PX, help="px around the answer box when reading")
    ev.add_argument("--out", type=Path, default=Path("out/eval"), help="output folder (default %(default)s)")
    ev.add_argument("--fresh", action="store_true",
                    help="OUT/DATASET holds rows made with other settings (channels, scorer weights, query "
                         "encoder, reader, ...): replace them (without it such a run is refused)")
    ev.add_argument("--size-prior", type=float, default=None, metavar="ALPHA",
                    help="variable-size patches score a square by relevance mass / side**ALPHA "
                         "(default: arr_coc.allocators.patching.SIZE_PRIOR, chosen on validation images)")
    ev.add_argument("--selector-weights", default="auto", metavar="PATH",
                    help="weights of the 'selector' method (default: the packaged ones)")
    ev.add_argument("--pruner-weights", default="auto", metavar="PATH",
                    help="weights of the 'pruner' method (default: the packaged ones)")

    from arr_coc.vlm import LAYOUTS, MODES
    from arr_coc.config import MAX_NEW_TOKENS
    from arr_coc.vlm.ask import RELEVANCE_SOURCES, allocators

    ask = command("ask", [_image_question(), _vlm(), _saccades(), _pipeline(canvas=("max_pixels",))],
                  help="answer a question with a frozen VLM fed gestalt + saccades",
                  description="Allocate K saccades, encode gestalt + saccades with the VLM's own vision tower at "
                              "their true positions, and let the VLM answer. The token cell is the model's.")
    ask.add_argument("--mode", choices=MODES, default="sparse",
                     help="sparse: the tower encodes only the chosen cells; slice: full grid, keep the chosen "
                          "tokens; weighted: every token, scaled by relevance (default %(default)s)")
    ask.add_argument("--layout", choices=LAYOUTS, default="scaled",
                     help="saccade positions: in the gestalt's frame, or as a second temporal slice")
    ask.add_argument("--no-gestalt", action="store_true", help="send the saccades only")
    ask.add_argument("--allocator", choices=allocators(), default="arr",
                     help="arr: one-cell saccades from the sampler; saliency / quadtree: variable-size squares "
                          "(1x1, 2x2, ... cells, each shrunk to one token) on the same relevance, at most K "
                          "tokens, --mode sparse only; a quadtree needs K >= its starting tiling "
                          "(default %(default)s)")
    ask.add_argument("--relevance", choices=("auto", *RELEVANCE_SOURCES), default="auto",
                     help="where the saccades' relevance comes from. arr: ARR's scorer on the texture channels "
                          "(the default channels run OCR on the CPU, about a second per 1344 px page, whatever --device); "
                          "vlm: the VLM's own attention to its gestalt, read while it prefills the question "
                          "(its first look, on the model's device; costs one more pass of the question's "
                          "tokens through the LLM, and the answer reuses the gestalt's prefill); auto: vlm on "
                          "CUDA, arr elsewhere (default %(default)s)")
    ask.add_argument("--json", action="store_true",
                     help="print the answer, tokens sent and full, FLOPs and each stage's time as JSON")
    ask.add_argument("--max-new-tokens", type=int, default=MAX_NEW_TOKENS,
                     help="answer length limit (default %(default)s)")

    from arr_coc.train.loop import TrainConfig

    tr = command("train", [_pipeline(canvas=())],
                 help="train the relevance scorer, patch selector or token pruner (texture and VLM frozen); "
                      "runs under torchrun too",
                 description="Train the scorer (or --learner selector|pruner) on dataset records split by image "
                             "(train / val / test), evaluate on held-out images every --eval-every steps, "
                             "checkpoint to OUT/checkpoint.pt (--resume continues exactly), write OUT/<learner>.pt, "
                             "OUT/metrics.json and OUT/loss.png. Multi-process: "
                             "torchrun --nproc_per_node N -m arr_coc.cli train ...")
    add_options(tr.add_argument_group("training"), TrainConfig,
                {f.name: "--" + f.name.replace("_", "-") for f in fields(TrainConfig)})
    tr.add_argument("--sampler", default=SamplerConfig.name,
                    help="sampler whose parameters train too, if any (default %(default)s)")
    tr.add_argument("--export", default=None, metavar="NAME_OR_PATH",
                    help="publish the trained weights: a name ships them in arr_coc/weights/ with a registry entry "
                         "(then loadable by that name), a path gets a copy")
    sv = command("serve", [],
                 help="the microscope: a web page to see and steer the allocation (Gradio)",
                 description="Serve the microscope: upload an image, ask, and see where the saccades go, what each "
                             "part of the scorer contributed, and what the VLM would see.")
    sv.add_argument("--model", default=None, metavar="PATH_OR_ID",
                    help="a VLM to answer with (as for ask; tiny:<family> for the random-weight plumbing model); "
                         "default: no answer, allocation only")
    sv.add_argument("--host", default="127.0.0.1", help="address to bind (default %(default)s: this machine only)")
    sv.add_argument("--port", type=int, default=7860, help="port (default %(default)s)")
    sv.add_argument("--query-encoder", choices=("minilm", "hashing"), default="minilm",
                    help="minilm: packaged all-MiniLM-L6-v2; hashing: model-free bag of words (default %(default)s)")
    sv.add_argument("--threads", type=int, default=None,
                    help="torch intra-op threads of the server process (default: torch's choice); 1 keeps "
                         "answers quick on a machine that is busy with other work")
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
    from arr_coc.texture import MVP_CHANNELS

    names = None
    if channels:
        groups = {"mvp": MVP_CHANNELS, "default": PIPELINE_CHANNELS}
        names = tuple(n for c in channels for n in groups.get(c, (c,)))
    return TextureConfig(channels=names, options={"clip": {"model": clip_model}} if clip_model else {})


def look(args: argparse.Namespace) -> int:
    import torch

    from arr_coc.config import ARRConfig, CanvasConfig, GestaltConfig, SamplerConfig, ScorerConfig, check_int
    from arr_coc.pipeline import ARR
    from arr_coc.query import HashingQueryEncoder, MiniLMQueryEncoder
    from arr_coc.viz import plot_allocation

    check_int("top", args.top, 0)
    config = ARRConfig(
        canvas=from_args(CanvasConfig, args, CANVAS_OPTIONS),
        texture=texture_config(args.channels, args.clip_model),
        gestalt=GestaltConfig(grid=None if args.gestalt is None else (args.gestalt, args.gestalt)),
        scorer=from_args(ScorerConfig, args, SCORER_OPTIONS),
        sampler=from_args(SamplerConfig, args, SAMPLER_OPTIONS),
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
    from arr_coc.config import ARRConfig, CanvasConfig, SamplerConfig, ScorerConfig
    from arr_coc.data.datasets import load_dataset
    from arr_coc.eval.harness import (DEFAULT_BUDGETS, LEARNED_METHODS, METHODS, EvalSettings, evaluate as run,
                                      load_learned_methods, refuse_leakage, write_reports)
    from arr_coc.eval.store import requested
    from arr_coc.pipeline import ARR
    from arr_coc.query import HashingQueryEncoder, MiniLMQueryEncoder

    if args.reader == "vlm" and not args.model:
        raise ValueError("--reader vlm needs --model PATH_OR_ID (a Qwen2/2.5/3-VL checkpoint, or tiny:qwen2_5_vl)")
    records = load_dataset(args.dataset, args.data, limit=args.limit, seed=args.seed, split=args.split)
    encoder = HashingQueryEncoder() if args.query_encoder == "hashing" else MiniLMQueryEncoder()
    config = ARRConfig(canvas=from_args(CanvasConfig, args, CANVAS_OPTIONS),
                       texture=texture_config(args.channels, args.clip_model),
                       scorer=from_args(ScorerConfig, args, SCORER_OPTIONS),
                       sampler=from_args(SamplerConfig, args, SAMPLER_NAME_OPTIONS), seed=args.seed)
    arr = ARR(config, query_encoder=encoder).eval()
    learned = {"selector": args.selector_weights, "pruner": args.pruner_weights}
    if args.reader == "vlm":
        return _evaluate_vlm(args, records, config, arr, learned)
    if not all(r.boxes_px for r in records):
        raise ValueError(f"{args.dataset} records have no answer boxes, which the OCR readers and the coverage "
                         f"metrics need; let the model answer: --reader vlm --model PATH_OR_ID")
    methods = list(args.methods or METHODS)
    if args.methods is None:  # the default list: leave out trained allocators whose weights do not fit
        for m in LEARNED_METHODS:
            try:
                load_learned_methods(arr, EvalSettings(methods=(m,), reader=None, learned=learned))
            except ValueError as err:
                print(f"arr-coc: leaving out method {m}: {err}", file=sys.stderr)
                methods.remove(m)
    refuse_leakage(args.dataset, args.split, arr, methods, learned)  # before any work, with the reason
    settings = EvalSettings(methods=methods, budgets=args.budgets or DEFAULT_BUDGETS, seed=args.seed,
                            margin_px=args.margin,
                            reader=None if args.reader == "none" else args.reader, learned=learned,
                            patch_options=None if args.size_prior is None else {"size_prior": args.size_prior},
                            fresh=args.fresh)
    jsonl = run(records, arr, args.out / args.dataset, settings)
    csv_path, md_path, png_path = write_reports(jsonl, keys=requested(records, settings.methods, settings.budgets))
    print(md_path.read_text())
    print(f"rows {jsonl}\ntable {md_path}  csv {csv_path}  plot {png_path}")
    return 0


def _evaluate_vlm(args: argparse.Namespace, records: list, config: Any, arr: Any, learned: dict) -> int:
    """``eval --reader vlm``: the model answers every method x budget (one process, or this rank's share)."""
    import os
    import re
    from dataclasses import replace

    from arr_coc.eval.harness import refuse_leakage
    from arr_coc.eval.vlm_reader import (DEFAULT_BUDGETS, DEFAULT_METHODS, VLMEvalSettings, evaluate_vlm, rank_device,
                                         write_reports)
    from arr_coc.pipeline import ARR
    from arr_coc.vlm import load_vlm

    methods = tuple(args.methods or DEFAULT_METHODS)
    settings = VLMEvalSettings(methods=methods, budgets=tuple(args.budgets or DEFAULT_BUDGETS),
                               batch_size=args.batch_size, max_new_tokens=args.max_new_tokens, prompt=args.prompt,
                               seed=args.seed, model=args.model, learned=learned,
                               patch_options=None if args.size_prior is None else {"size_prior": args.size_prior})
    refuse_leakage(args.dataset, args.split, arr, methods, learned)  # before the model loads
    device = rank_device(args.device)
    adapter = load_vlm(args.model, dtype=args.dtype, device=device)
    if adapter.cell != config.canvas.cell:  # the canvas is built on the model's token cell
        arr = ARR(replace(config, canvas=replace(config.canvas, cell=adapter.cell)), query_encoder=arr.query_encoder)
    arr = arr.eval().to(device) if device else arr.eval()
    out = args.out / args.dataset / re.sub(r"[^A-Za-z0-9._-]+", "_", args.model.strip("/"))
    jsonl = evaluate_vlm(records, arr, adapter, out, settings)
    if int(os.environ.get("RANK", "0")):  # rank 0 reports
        return 0
    csv_path, md_path, png_path = write_reports(jsonl)
    print(md_path.read_text())
    print(f"rows {jsonl}\ntable {md_path}  csv {csv_path}  plot {png_path}")
    return 0


def ask(args: argparse.Namespace) -> int:
    import torch

    from arr_coc.config import ARRConfig, CanvasConfig, SamplerConfig, ScorerConfig
    from arr_coc.pipeline import ARR
    from arr_coc.query import HashingQueryEncoder, MiniLMQueryEncoder
    from arr_coc.vlm import ask as answer, load_vlm
    from arr_coc.vlm.ask import default_relevance

    start = time.perf_counter()
    adapter = load_vlm(args.model, dtype=args.dtype, device=args.device)
    relevance = default_relevance(adapter) if args.relevance == "auto" else args.relevance
    # the vlm source reads the question with the VLM itself: MiniLM is then not loaded
    encoder = HashingQueryEncoder() if args.query_encoder == "hashing" else (
        MiniLMQueryEncoder() if relevance == "vlm" else MiniLMQueryEncoder().load())
    load_s = time.perf_counter() - start
    config = ARRConfig(canvas=from_args(CanvasConfig, args, CANVAS_OPTIONS, cell=adapter.cell),
                       texture=texture_config(args.channels, args.clip_model),
                       scorer=from_args(ScorerConfig, args, SCORER_OPTIONS),
                       sampler=from_args(SamplerConfig, args, SAMPLER_OPTIONS))
    arr = ARR(config, query_encoder=encoder).eval()
    if args.device:
        arr = arr.to(args.device)
    start = time.perf_counter()
    with torch.inference_mode():
        a = answer(adapter, [args.image], [args.question], arr=arr, mode=args.mode, layout=args.layout,
                   gestalt=not args.no_gestalt, max_new_tokens=args.max_new_tokens, allocator=args.allocator,
                   relevance=relevance)[0]
    run_s = time.perf_counter() - start
    if args.json:
        print(json.dumps({"model": args.model, "family": adapter.name, "cell": adapter.cell, "mode": args.mode,
                          "layout": args.layout, **a.to_json(), "load_s": round(load_s, 3)}, indent=2))
        return 0
    tf, ff = a.flops["total"], a.flops_full["total"]
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


def train(args: argparse.Namespace) -> int:
    from arr_coc.config import ARRConfig, SamplerConfig, ScorerConfig
    from arr_coc.query import HashingQueryEncoder, MiniLMQueryEncoder
    from arr_coc.train.checkpoint import export
    from arr_coc.train.loop import TrainConfig, train as run

    cfg = from_args(TrainConfig, args, {f.name: f.name for f in fields(TrainConfig)})
    config = ARRConfig(texture=texture_config(args.channels, args.clip_model),
                       scorer=from_args(ScorerConfig, args, SCORER_OPTIONS),
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
        print(f"exported      {export(weights, args.export)}")
    return 0


def serve(args: argparse.Namespace) -> int:
    import os

    import torch

    from arr_coc.app.service import Microscope
    from arr_coc.app.ui import serve as run
    from arr_coc.query import HashingQueryEncoder, MiniLMQueryEncoder

    from arr_coc.config import check_int

    if not 1 <= args.port <= 65535:
        raise ValueError(f"--port must be a TCP port in 1..65535, got {args.port}")
    if args.threads is not None:
        check_int("--threads", args.threads, 1)
        if args.threads > (os.cpu_count() or 1) * 8:
            raise ValueError(f"--threads {args.threads} is far above this machine's {os.cpu_count()} cores")
        torch.set_num_threads(args.threads)  # this process is the server: its thread pool is its own to size
    vlm = None
    if args.model:
        from arr_coc.vlm import load_vlm

        vlm = load_vlm(args.model)
    encoder = HashingQueryEncoder() if args.query_encoder == "hashing" else MiniLMQueryEncoder().load()
    print(f"arr-coc microscope on http://{args.host}:{args.port}/ (Ctrl+C stops it)", flush=True)
    run(Microscope(query_encoder=encoder, vlm=vlm), host=args.host, port=args.port)
    return 0


# What a user fixes by changing the command or its files: the project's own UserError types (unknown
# names, missing extras), and the ValueError / OSError the library raises for a bad value or an
# unreadable file. Anything else (TypeError, KeyError, RuntimeError, ...) is a bug: it keeps its traceback.
USER_ERRORS = (UserError, ValueError, OSError)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    run = {"look": look, "eval": evaluate, "ask": ask, "train": train, "serve": serve}[args.command]
    try:
        return run(args)
    except USER_ERRORS as err:
        print(f"arr-coc: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # eval keeps every finished record's rows, train its last checkpoint: the same command resumes
        kept = {"eval": "the rows of finished records are kept: rerun the same command to go on",
                "train": "the last checkpoint is kept: rerun with --resume to go on"}
        print(f"arr-coc: interrupted; {kept.get(args.command, 'nothing to resume')}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
