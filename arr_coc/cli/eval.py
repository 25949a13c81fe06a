"""``arr-coc eval DATASET``: every method at equal total tokens, read by OCR or answered by a VLM."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable

from arr_coc.cli import options as opt

HELP = "answers or OCR reading of the answer at equal total tokens, per method"


def add_parser(command: Callable[..., argparse.ArgumentParser]) -> None:
    from arr_coc.config import SamplerConfig
    from arr_coc.data.contexts import CONTEXT_DPI, CONTEXT_SOURCES, TEXLIVE_CONTEXTS
    from arr_coc.eval import vlm_reader
    from arr_coc.eval.context_methods import CONTEXT_METHODS
    from arr_coc.eval.context_run import CONTEXT_MARGIN_PX, DEFAULT_BUDGETS
    from arr_coc.eval.run import DEFAULT_METHODS, DEFAULT_TOKENS, MARGIN_PX, METHODS

    p = command("eval", [opt.data(), opt.pipeline(), opt.vlm(required=False)], help=HELP,
                description="Evaluate allocation methods on a dataset at equal total tokens (each method "
                            "spends the same number of visual tokens; for gestalt + saccades that total is split "
                            "between them); rows go to OUT/DATASET/records.jsonl as they come (a rerun skips "
                            "what is done), then summary.csv, summary.md and summary.png. With --reader vlm the "
                            "model answers every method (rows in OUT/DATASET/MODEL/); multi-process: "
                            "torchrun --nproc_per_node N -m arr_coc.cli eval ... --reader vlm")
    p.add_argument("--methods", nargs="+", default=None,
                   help="OCR readers: any of " + ", ".join(METHODS) + ", default " + " ".join(DEFAULT_METHODS)
                        + "; --reader vlm: any of "
                        + ", ".join(vlm_reader.VLM_METHODS) + ", default " + " ".join(vlm_reader.DEFAULT_METHODS)
                        + "; contexts: any of " + ", ".join(CONTEXT_METHODS) + ", default all (bm25_pages where "
                        "bm25s is installed)")
    p.add_argument("--tokens", nargs="+", default=None, metavar="T",
                   help=opt.TOKENS_HELP + f"; several, one row per method and T; default {' '.join(DEFAULT_TOKENS)} "
                        f"(--reader vlm: {' '.join(vlm_reader.DEFAULT_TOKENS)})".replace("%", "%%"))
    opt.add_options(p, SamplerConfig, opt.SAMPLER_NAME_OPTIONS)  # what the method arr sends
    p.add_argument("--seed", type=int, default=0, help="subset choice and random baseline")
    p.add_argument("--reader", default="tesseract", choices=("tesseract", "rapidocr", "vlm", "none"),
                   help="tesseract / rapidocr: OCR reads the answer region of what the VLM would see; vlm: the "
                        "model (--model) answers the question; none: allocation metrics only (default %(default)s)")
    p.add_argument("--reading", default="region", choices=("region", "find"),
                   help="OCR readers: region reads the answer box + --margin of the view (is a known region "
                        "legible?); find reads the whole view, not told where the answer is, and scores the "
                        "best-matching words of all it read (can the answer be found?) (default %(default)s)")
    p.add_argument("--batch-size", type=int, default=vlm_reader.VLMEvalSettings.batch_size,
                   help="--reader vlm: answers generated together (default %(default)s)")
    opt.max_new_tokens_option(p, vlm_reader.VLMEvalSettings.max_new_tokens)
    p.add_argument("--prompt", default=vlm_reader.PROMPT, type=_prompt,
                   help="--reader vlm: the text sent with the image, {question} replaced (default: %(default)r)")
    p.add_argument("--margin", type=int, default=None,
                   help=f"px around the answer box when reading (default {MARGIN_PX}; contexts {CONTEXT_MARGIN_PX:g})")
    p.add_argument("--out", type=Path, default=Path("out/eval"), help="output folder (default %(default)s)")
    p.add_argument("--fresh", action="store_true",
                   help="OUT/DATASET holds rows made with other settings (channels, scorer weights, query "
                        "encoder, reader, ...): replace them (without it such a run is refused)")
    p.add_argument("--size-prior", type=float, default=None, metavar="ALPHA",
                   help="variable-size patches score a square by relevance mass / side**ALPHA "
                        "(default: arr_coc.allocators.patching.SIZE_PRIOR, chosen on validation images)")
    p.add_argument("--selector-weights", default="auto", metavar="PATH",
                   help="weights of the 'selector' method (default: the packaged ones)")
    p.add_argument("--pruner-weights", default="auto", metavar="PATH",
                   help="weights of the 'pruner' method (default: the packaged ones)")
    c = p.add_argument_group(
        "contexts", f"questions over whole contexts with an OCR reader (docs/coc.md): {TEXLIVE_CONTEXTS} (the LaTeX "
                    "manuals' long contexts, split by document family; --data: your own folder of PDFs), and "
                    "mpdocvqa / slidevqa (their pages); rows in OUT/DATASET[/SOURCE]/")
    c.add_argument("--compression", type=float, nargs="+", default=None, metavar="C",
                   help="T = the context's text tokens / C visual tokens for every method (default "
                        f"{' '.join(b[:-1] for b in DEFAULT_BUDGETS)} unless --tokens gives counts)")
    c.add_argument("--pages", type=int, default=None, metavar="N",
                   help=f"{TEXLIVE_CONTEXTS}: the first N pages of every document with at least N (default 20)")
    c.add_argument("--source", choices=CONTEXT_SOURCES, default=None,
                   help=f"{TEXLIVE_CONTEXTS}: the PDF as rendered (pdf, default) or its text layer re-set on pages (text)")
    c.add_argument("--dpi", type=float, default=None, help=f"{TEXLIVE_CONTEXTS}: render resolution (default {CONTEXT_DPI:g})")
    c.add_argument("--questions", type=int, default=None, metavar="Q",
                   help=f"{TEXLIVE_CONTEXTS}: questions per context (default 8)")
    c.add_argument("--contexts", type=int, default=None, metavar="N",
                   help=f"{TEXLIVE_CONTEXTS}: the first N documents by name (default: every one of the split)")
    c.add_argument("--text-weight", type=float, default=None, help="method coc's ranking weight (default the library's)")
    c.add_argument("--page-weight", type=float, default=None, help="method coc's ranking weight (default the library's)")


def _prompt(template: str) -> str:
    """``--prompt`` checked while the command line is parsed: only {question}, literal braces doubled."""
    from arr_coc.vlm.processing import check_prompt

    try:
        return check_prompt(template)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def run(args: argparse.Namespace) -> int:
    from arr_coc.allocators.methods import LEARNED_METHODS
    from arr_coc.data.contexts import TEXLIVE_CONTEXTS
    from arr_coc.data.datasets import load_dataset
    from arr_coc.eval.run import DEFAULT_METHODS, DEFAULT_TOKENS, MARGIN_PX, EvalSettings
    from arr_coc.eval.run import evaluate as run_eval
    from arr_coc.eval.store import requested
    from arr_coc.weights import load_learned_methods, refuse_leakage

    if args.reader == "vlm" and not args.model:
        raise ValueError("--reader vlm needs --model PATH_OR_ID (a Qwen2/2.5/3-VL checkpoint, or tiny:qwen2_5_vl)")
    texlive = args.dataset == TEXLIVE_CONTEXTS
    if texlive and args.reader == "vlm":
        raise ValueError(f"{TEXLIVE_CONTEXTS} is read by an OCR reader (--reader tesseract or rapidocr); the VLM "
                         f"reads mpdocvqa and slidevqa contexts")
    records = [] if texlive else load_dataset(args.dataset, args.data, limit=args.limit, seed=args.seed,
                                              split=args.split)
    if args.reader != "vlm" and (texlive or any(r.pages for r in records)):
        return _evaluate_contexts(args, records)
    _refuse_context_options(args, "read by the VLM here (--reader vlm)" if args.reader == "vlm"
                            else "a dataset of single images")
    config, arr = _arr(args)
    learned = {"selector": args.selector_weights, "pruner": args.pruner_weights}
    if args.reader == "vlm":
        return _evaluate_vlm(args, records, config, arr, learned)
    if not all(r.boxes_px for r in records):
        raise ValueError(f"{args.dataset} records have no answer boxes, which the OCR readers and the coverage "
                         f"metrics need; let the model answer: --reader vlm --model PATH_OR_ID")
    methods = list(args.methods or DEFAULT_METHODS)
    if args.methods is None:  # the default list: leave out trained allocators whose weights do not fit
        for m in LEARNED_METHODS:
            try:
                load_learned_methods(arr, EvalSettings(methods=(m,), reader=None, learned=learned))
            except ValueError as err:
                print(f"arr-coc: leaving out method {m}: {err}", file=sys.stderr)
                methods.remove(m)
    _refuse_unused(args, methods, "ocr")
    # before any work, with the reason: by dataset name, and by the pixels of every image to be scored
    refuse_leakage(args.dataset, args.split, arr, methods, learned, images=sorted({r.image for r in records}))
    settings = EvalSettings(methods=methods, tokens=args.tokens or DEFAULT_TOKENS, seed=args.seed,
                            margin_px=MARGIN_PX if args.margin is None else args.margin,
                            reader=None if args.reader == "none" else args.reader,
                            reading=args.reading,
                            learned=learned,
                            patch_options=None if args.size_prior is None else {"size_prior": args.size_prior},
                            fresh=args.fresh)
    jsonl = run_eval(records, arr, args.out / args.dataset, settings)
    csv_path, md_path, png_path = write_summary(jsonl, keys=requested(records, settings.methods, settings.tokens),
                                                made_by=opt.command_line(args))
    print(md_path.read_text())
    print(f"rows {jsonl}\ntable {md_path}  csv {csv_path}  plot {png_path}")
    return 0


def write_summary(jsonl: Path, **kw: Any) -> tuple[Path, Path, Path]:
    """:func:`arr_coc.eval.report.write_reports` whole or not at all: the reports are made in a temporary folder
    beside the rows, then each is written into place by :func:`arr_coc.weights.atomic_write`. A full disk is one
    line and leaves no temporary file, no empty report, and the earlier reports as they were."""
    import shutil
    import tempfile

    from arr_coc.errors import DiskFullError
    from arr_coc.eval.report import write_reports
    from arr_coc.weights import atomic_write, disk_full

    folder = jsonl.parent
    stage = None
    try:
        stage = Path(tempfile.mkdtemp(prefix=".summary.", dir=folder))
        made = write_reports(jsonl, stage, **kw)
        return tuple(atomic_write(folder / p.name, lambda f, data=p.read_bytes(): f.write(data)) for p in made)
    except DiskFullError:  # already one line, naming the report
        raise
    except OSError as err:  # no space for the temporary folder or a report in it
        full = disk_full(folder / "summary.csv", err)
        if full is not None:
            raise full from None
        raise
    finally:
        if stage is not None:
            shutil.rmtree(stage, ignore_errors=True)


def _arr(args: argparse.Namespace) -> tuple[Any, Any]:
    """The ARR the command line describes (canvas, channels, scorer, sampler, question encoder) and its config."""
    from arr_coc.config import ARRConfig, CanvasConfig, SamplerConfig, ScorerConfig
    from arr_coc.engine.pipeline import ARR

    config = ARRConfig(canvas=opt.from_args(CanvasConfig, args, opt.CANVAS_OPTIONS),
                       texture=opt.texture_config(args.channels, args.clip_model),
                       scorer=opt.from_args(ScorerConfig, args, opt.SCORER_OPTIONS),
                       sampler=opt.from_args(SamplerConfig, args, opt.SAMPLER_NAME_OPTIONS), seed=args.seed)
    return config, ARR(config, query_encoder=opt.query_encoder(args, load=False)).eval()


def _refuse_unused(args: argparse.Namespace, methods: Any, run: str) -> None:
    """Refuse, before any work, an option this run would not use (``run``: ``ocr``, ``vlm`` or ``context``).

    The model's options act only with ``--reader vlm``; ``--reading`` and ``--margin`` only with an OCR reader
    (``--reading`` not over contexts, which read by finding); ``--size-prior`` only with a variable-size patch
    method, ``--selector-weights`` / ``--pruner-weights`` only with that method (neither over contexts).
    """
    from arr_coc.allocators.methods import METHODS, SquaresMethod
    from arr_coc.eval import vlm_reader

    defaults = {"model": None, "dtype": None, "device": None, "batch_size": vlm_reader.VLMEvalSettings.batch_size,
                "max_new_tokens": vlm_reader.VLMEvalSettings.max_new_tokens, "prompt": vlm_reader.PROMPT,
                "reading": "region", "margin": None, "size_prior": None, "selector_weights": "auto",
                "pruner_weights": "auto"}

    def given(*names: str) -> list[str]:
        return [f"--{n.replace('_', '-')}" for n in names if getattr(args, n) != defaults[n]]

    def refuse(flags: list[str], why: str) -> None:
        if flags:
            raise ValueError(f"{' '.join(flags)} act{'s' if len(flags) == 1 else ''} only {why}; drop "
                             f"{'it' if len(flags) == 1 else 'them'}")

    if run != "vlm":
        refuse(given("model", "dtype", "device", "batch_size", "max_new_tokens", "prompt"),
               f"with --reader vlm (this run reads with {args.reader})")
    if args.reader in ("vlm", "none"):
        refuse(given("reading", "margin"), f"with an OCR reader, --reader tesseract or rapidocr (not {args.reader})")
    elif run == "context":
        refuse(given("reading"), "for single images (a context's answer is found on its pages, not read in a box)")
    patches = [m for m in methods if m in METHODS.names() and isinstance(METHODS.get(m), SquaresMethod)]
    if not patches or run == "context":
        refuse(given("size_prior"), "with a variable-size patch method (" + ", ".join(
            m for m in METHODS.names() if isinstance(METHODS.get(m), SquaresMethod)) + ") in --methods")
    for m in ("selector", "pruner"):
        if m not in methods or run == "context":
            refuse(given(f"{m}_weights"), f"with the method {m} in --methods")


CONTEXT_OPTIONS = ("compression", "pages", "source", "dpi", "questions", "contexts", "text_weight", "page_weight")


def _refuse_context_options(args: argparse.Namespace, what: str, options: tuple[str, ...] = CONTEXT_OPTIONS) -> None:
    given = [f"--{o.replace('_', '-')}" for o in options if getattr(args, o, None) is not None]
    if given:
        raise ValueError(f"{' '.join(given)} choose{'s' if len(given) == 1 else ''} contexts; {args.dataset} is "
                         f"{what}, so leave {'it' if len(given) == 1 else 'them'} out")


def _evaluate_contexts(args: argparse.Namespace, records: list) -> int:
    """``eval`` over contexts with an OCR reader: texlive-contexts, or multi-page records (MP-DocVQA, SlideVQA)."""
    import itertools

    from arr_coc.data.contexts import CONTEXT_DPI, TEXLIVE_CONTEXTS, record_contexts, texlive_contexts
    from arr_coc.eval.context_methods import CONTEXT_METHODS, NEEDS_BM25
    from arr_coc.eval.context_run import CONTEXT_MARGIN_PX, DEFAULT_BUDGETS, ContextEvalSettings, evaluate_contexts
    from arr_coc.weights import refuse_leakage

    texlive = args.dataset == TEXLIVE_CONTEXTS
    budgets = [f"{c:g}x" for c in args.compression or ()] + list(args.tokens or ())
    methods = list(args.methods or CONTEXT_METHODS)
    if args.methods is None:  # the default list leaves out BM25 where bm25s is not installed, and says so
        try:
            ContextEvalSettings(methods=[NEEDS_BM25], budgets=["10x"])
        except ImportError as err:
            print(f"arr-coc: leaving out method {NEEDS_BM25}: {err}", file=sys.stderr)
            methods.remove(NEEDS_BM25)
    _refuse_unused(args, methods, "context")
    if texlive:
        if args.limit is not None:
            raise ValueError(f"--limit counts records; {TEXLIVE_CONTEXTS} takes --contexts N (documents) and "
                             f"--questions Q (per document)")
        source, pages = args.source or "pdf", 20 if args.pages is None else args.pages
        made = {"split": args.split, "source": source, "pages": pages, "dpi": CONTEXT_DPI if args.dpi is None else args.dpi,
                "questions": 8 if args.questions is None else args.questions, "seed": args.seed,
                "data": None if args.data is None else str(args.data)}
        items = texlive_contexts(args.split, pages=pages, source=source, dpi=made["dpi"], questions=made["questions"],
                                 n_docs=args.contexts, seed=args.seed, root=args.data)
        out = args.out / args.dataset / source
    else:
        _refuse_context_options(args, "made of its own pages", ("pages", "source", "dpi", "questions", "contexts"))
        items = record_contexts(records)
        made = {"split": args.split, "limit": args.limit, "seed": args.seed}
        out = args.out / args.dataset
    settings = ContextEvalSettings(methods=methods, budgets=budgets or DEFAULT_BUDGETS,
                                   reader=None if args.reader == "none" else args.reader,
                                   margin_px=CONTEXT_MARGIN_PX if args.margin is None else args.margin,
                                   text_weight=args.text_weight, page_weight=args.page_weight, contexts=made,
                                   fresh=args.fresh)
    _, arr = _arr(args)
    # the same documents as the single-page texlive set: its split rule and trained-on check apply
    refuse_leakage("texlive" if texlive else args.dataset, args.split, arr, ["coc"], {},
                   images=sorted({str(p) for r in records for p in r.pages}))
    keys: set = set()  # the rows this run asks for: the tables hold exactly those

    def asked(found):
        for item in found:
            keys.update(*(settings.keys(q) for q in item.questions))
            yield item

    items = iter(items)
    first = next(items, None)  # before any work: a run without a question says so
    if first is None:
        raise ValueError(f"no context of {args.dataset} has a question with these options"
                         + (f" (documents with at least {pages} pages" + (f" of the {args.split} split" if args.split
                                                                           else "") + ")" if texlive else ""))
    jsonl = evaluate_contexts(asked(itertools.chain([first], items)), arr, out, settings)
    csv_path, md_path, png_path = write_summary(jsonl, keys=keys, made_by=opt.command_line(args), reader="context")
    print(md_path.read_text())
    print(f"rows {jsonl}\ntable {md_path}  csv {csv_path}  plot {png_path}")
    return 0


def _evaluate_vlm(args: argparse.Namespace, records: list, config: Any, arr: Any, learned: dict) -> int:
    """``eval --reader vlm``: the model answers every method x T (one process, or this rank's share)."""
    import os
    import re
    from dataclasses import replace

    from arr_coc.engine.pipeline import ARR
    from arr_coc.eval.vlm_reader import (
        DEFAULT_METHODS,
        DEFAULT_TOKENS,
        VLMEvalSettings,
        evaluate_vlm,
        rank_device,
    )
    from arr_coc.vlm import load_vlm
    from arr_coc.weights import refuse_leakage

    methods = tuple(args.methods or DEFAULT_METHODS)
    _refuse_unused(args, methods, "vlm")
    settings = VLMEvalSettings(methods=methods, tokens=tuple(args.tokens or DEFAULT_TOKENS),
                               batch_size=args.batch_size, max_new_tokens=args.max_new_tokens, prompt=args.prompt,
                               seed=args.seed, model=args.model, learned=learned, fresh=args.fresh,
                               patch_options=None if args.size_prior is None else {"size_prior": args.size_prior})
    refuse_leakage(args.dataset, args.split, arr, methods, learned,  # before the model loads
                   images=sorted({r.image for r in records}))
    device = rank_device(args.device)
    adapter = load_vlm(args.model, dtype=args.dtype, device=device)
    if adapter.cell != config.canvas.cell:  # the canvas is built on the model's token cell
        arr = ARR(replace(config, canvas=replace(config.canvas, cell=adapter.cell)), query_encoder=arr.query_encoder)
    arr = arr.eval().to(device) if device else arr.eval()
    out = args.out / args.dataset / re.sub(r"[^A-Za-z0-9._-]+", "_", args.model.strip("/"))
    jsonl = evaluate_vlm(records, arr, adapter, out, settings)
    if int(os.environ.get("RANK", "0")):  # rank 0 reports
        return 0
    csv_path, md_path, png_path = write_summary(jsonl, made_by=opt.command_line(args), reader="vlm")
    print(md_path.read_text())
    print(f"rows {jsonl}\ntable {md_path}  csv {csv_path}  plot {png_path}")
    return 0
