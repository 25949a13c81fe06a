"""``arr-coc eval DATASET``: every method at equal total tokens, read by OCR or answered by a VLM."""
from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from typing import Any, Callable

from arr_coc.cli import options as opt

HELP = "answers or OCR reading of the answer at equal total tokens, per method"


def add_parser(command: Callable[..., argparse.ArgumentParser]) -> None:
    from arr_coc.config import SamplerConfig
    from arr_coc.data.contexts import CONTEXT_DPI, CONTEXT_SOURCES, TEXLIVE_CONTEXTS
    from arr_coc.eval.reading import READERS
    from arr_coc.eval.settings import DEFAULT_BUDGETS, MARGIN_PX, EvalSettings, default_methods, known_methods

    p = command("eval", [opt.data(), opt.pipeline(), opt.vlm(required=False)], help=HELP,
                description="Evaluate allocation methods on a dataset at equal total tokens (each method "
                            "spends the same number of visual tokens; for gestalt + saccades that total is split "
                            "between them); rows go to OUT/DATASET/records.jsonl as they come (a rerun skips "
                            "what is done), then summary.csv, summary.md and summary.png. With --reader vlm the "
                            "model answers every method (rows in OUT/DATASET/MODEL/); multi-process: "
                            "torchrun --nproc_per_node N -m arr_coc.cli eval ... --reader vlm")
    p.add_argument("--methods", nargs="+", default=None,
                   help="images, OCR readers: any of " + ", ".join(known_methods("tesseract", "image")) + ", default "
                        + " ".join(default_methods("tesseract", "image")) + "; images, --reader vlm: any of "
                        + ", ".join(known_methods("vlm", "image")) + ", default " + " ".join(default_methods("vlm", "image"))
                        + "; contexts: any of " + ", ".join(known_methods("tesseract", "context")) + ", default all; "
                        "contexts, --reader vlm: "
                        + ", ".join(known_methods("vlm", "context")))
    p.add_argument("--tokens", nargs="+", default=None, metavar="T",
                   help=opt.TOKENS_HELP + "; several, one row per method and T; default "
                        f"{' '.join(DEFAULT_BUDGETS['image', 'ocr'])} (--reader vlm: "
                        f"{' '.join(DEFAULT_BUDGETS['image', 'vlm'])})".replace("%", "%%"))
    opt.add_options(p, SamplerConfig, opt.SAMPLER_NAME_OPTIONS)  # what the method arr sends
    p.add_argument("--seed", type=int, default=0, help="subset choice and random baseline")
    p.add_argument("--reader", default="tesseract", choices=(*READERS.names(), "vlm", "none"),
                   help="tesseract / rapidocr: OCR reads the answer region of what the VLM would see; vlm: the "
                        "model (--model) answers the question; none: allocation metrics only (default %(default)s)")
    p.add_argument("--reading", default="region", choices=("region", "find"),
                   help="OCR readers: region reads the answer box + --margin of the view (is a known region "
                        "legible?); find reads the whole view, not told where the answer is, and scores the "
                        "best-matching words of all it read (can the answer be found?) (default %(default)s)")
    p.add_argument("--batch-size", type=int, default=EvalSettings.batch_size,
                   help="--reader vlm: answers generated together (default %(default)s)")
    opt.max_new_tokens_option(p, EvalSettings.max_new_tokens)
    p.add_argument("--prompt", default=EvalSettings.prompt, type=_prompt,
                   help="--reader vlm: the text sent with the image, {question} replaced (default: %(default)r)")
    p.add_argument("--margin", type=int, default=None,
                   help=f"px around the answer box when reading (default {MARGIN_PX['image']}; contexts "
                        f"{MARGIN_PX['context']:g})")
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
                    "manuals' long contexts, split by document family; --data: your own folder of PDFs), "
                    "texlive-paraphrase (questions in a user's words over windows of the manuals), contexts "
                    "--data FILE.jsonl (your questions over your documents, one a line: docs/coc.md) and "
                    "mpdocvqa / slidevqa (their pages); rows in OUT/DATASET[/SOURCE]/")
    c.add_argument("--compression", type=float, nargs="+", default=None, metavar="C",
                   help="T = the context's text tokens / C visual tokens for every method (default "
                        f"{' '.join(b[:-1] for b in DEFAULT_BUDGETS['context', 'ocr'])} unless --tokens gives "
                        "counts)")
    c.add_argument("--window", type=int, default=None, metavar="N",
                   help=f"{TEXLIVE_CONTEXTS}: the first N pages of every document with at least N (default 20)")
    c.add_argument("--source", choices=CONTEXT_SOURCES, default=None,
                   help=f"{TEXLIVE_CONTEXTS}, texlive-paraphrase: the PDF as rendered (pdf, default) or its text layer "
                        "re-set on pages (text)")
    c.add_argument("--dpi", type=float, default=None, help=f"{TEXLIVE_CONTEXTS}, texlive-paraphrase, contexts: a PDF's render resolution "
                                                           f"(default {CONTEXT_DPI:g})")
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
    """One evaluation: the records (images or contexts) of ``args.dataset`` x methods x budgets, one loop."""
    from arr_coc.data.datasets import DATASETS, load_dataset
    from arr_coc.eval.evaluate import evaluate, rank_device
    from arr_coc.weights import refuse_leakage

    if args.reader == "vlm" and not args.model:
        raise ValueError("--reader vlm needs --model PATH_OR_ID (a Qwen2/2.5/3-VL checkpoint, or tiny:qwen2_5_vl)")
    spec = DATASETS.get(args.dataset)
    of_contexts = spec.contexts is not None and args.reader != "vlm"  # the spec's contexts, read by OCR
    records = [] if of_contexts else load_dataset(spec, args.data, limit=args.limit, seed=args.seed, split=args.split)
    scope = "context" if of_contexts or any(r.pages for r in records) else "image"
    run_kind = "vlm" if args.reader == "vlm" else ("context" if scope == "context" else "ocr")
    if run_kind != "context":
        _refuse_context_options(args, "read by the VLM here (--reader vlm)" if args.reader == "vlm"
                                else "a dataset of single images")
    config, arr = _arr(args)
    learned = {"selector": args.selector_weights, "pruner": args.pruner_weights}
    if run_kind == "ocr" and not all(r.boxes_px for r in records):
        raise ValueError(f"{args.dataset} records have no answer boxes, which the OCR readers and the coverage "
                         f"metrics need; let the model answer: --reader vlm --model PATH_OR_ID")
    methods = _methods(args, arr, scope, learned)
    _refuse_unused(args, methods, run_kind)
    budgets = [f"{c:g}x" for c in args.compression or ()] + list(args.tokens or ())
    out, items, made = args.out / args.dataset, records, {}
    if run_kind == "context":
        out, items, made = _contexts(args, spec, records)
    settings = _settings(args, scope, methods, budgets or None, learned if run_kind != "context" else None, made)
    # before any work, with the reason: by dataset name, and by the pixels of every image to be scored
    if run_kind == "context":  # contexts over another dataset's documents (the manuals): its split rule applies
        refuse_leakage(spec.documents_of or args.dataset, args.split, arr, ["coc"], {},
                       images=sorted({str(p) for r in records for p in r.pages}))
    else:
        refuse_leakage(args.dataset, args.split, arr, methods, learned, images=sorted({r.image for r in records}))
    adapter = None
    if run_kind == "vlm":  # the model loads after every check
        from dataclasses import replace

        from arr_coc.engine.pipeline import ARR
        from arr_coc.vlm import load_vlm

        device = rank_device(args.device)
        adapter = load_vlm(args.model, dtype=args.dtype, device=device)
        if adapter.cell != config.canvas.cell:  # the canvas is built on the model's token cell
            arr = ARR(replace(config, canvas=replace(config.canvas, cell=adapter.cell)), query_encoder=arr.query_encoder,
                      retriever=arr.retriever)
        arr = arr.eval().to(device) if device else arr.eval()
        out = out / re.sub(r"[^A-Za-z0-9._-]+", "_", args.model.strip("/"))
    keys: set = set()  # the rows this run asks for: the tables hold exactly those
    resolved = settings.resolve(scope)

    def asked(found: Any) -> Any:
        for item in found:
            keys.update(*(resolved.keys(q.record_id) for q in getattr(item, "questions", [item])))
            yield item

    jsonl = evaluate(asked(items), arr, out, settings, adapter=adapter)
    if int(os.environ.get("RANK", "0")):  # rank 0 reports
        return 0
    report = {"vlm": {"reader": "vlm"}, "context": {"keys": keys, "reader": "context"}, "ocr": {"keys": keys}}
    csv_path, md_path, png_path = write_summary(jsonl, made_by=opt.command_line(args), **report[run_kind])
    print(md_path.read_text())
    print(f"rows {jsonl}\ntable {md_path}  csv {csv_path}  plot {png_path}")
    return 0


def _methods(args: argparse.Namespace, arr: Any, scope: str, learned: dict) -> list[str]:
    """``--methods``, or the reader's default list less what cannot run here, each left out with a line saying why:
    trained allocators whose weights do not fit (images)."""
    from arr_coc.allocators.methods import LEARNED_METHODS
    from arr_coc.eval.settings import default_methods
    from arr_coc.weights import load_learned_methods

    reader = None if args.reader == "none" else args.reader
    if args.methods is not None:
        return list(args.methods)
    methods = list(default_methods(reader, scope))
    for m in [m for m in methods if m in LEARNED_METHODS]:
        try:
            load_learned_methods(arr, argparse.Namespace(methods=(m,), learned=learned))
        except ValueError as err:
            print(f"arr-coc: leaving out method {m}: {err}", file=sys.stderr)
            methods.remove(m)
    return methods


def _settings(args: argparse.Namespace, scope: str, methods: list[str], budgets: list[str] | None,
              learned: dict | None, made: dict) -> Any:
    from arr_coc.eval.settings import EvalSettings

    return EvalSettings(methods=methods, budgets=budgets, reader=None if args.reader == "none" else args.reader,
                        reading=args.reading, seed=args.seed, margin_px=args.margin, learned=learned,
                        patch_options=None if args.size_prior is None else {"size_prior": args.size_prior},
                        fresh=args.fresh, text_weight=args.text_weight, page_weight=args.page_weight, contexts=made,
                        batch_size=args.batch_size, max_new_tokens=args.max_new_tokens, prompt=args.prompt,
                        model=args.model or "", scope=scope)


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
    from arr_coc.engine.pipeline import ARR

    config = opt.arr_config(args)
    return config, ARR(config, query_encoder=opt.query_encoder(args, load=False),
                       retriever=opt.retriever(args, getattr(args, "device", None))).eval()


def _refuse_unused(args: argparse.Namespace, methods: Any, run: str) -> None:
    """Refuse, before any work, an option this run would not use (``run``: ``ocr``, ``vlm`` or ``context``).

    The model's options act only with ``--reader vlm``; ``--reading`` and ``--margin`` only with an OCR reader
    (``--reading`` not over contexts, which read by finding); ``--size-prior`` only with a variable-size patch
    method, ``--selector-weights`` / ``--pruner-weights`` only with that method (neither over contexts).
    """
    from arr_coc.allocators.methods import METHODS, SquaresMethod
    from arr_coc.eval.settings import EvalSettings

    defaults = {"model": None, "dtype": None, "device": None, "batch_size": EvalSettings.batch_size,
                "max_new_tokens": EvalSettings.max_new_tokens, "prompt": EvalSettings.prompt,
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


CONTEXT_OPTIONS = ("compression", "window", "source", "dpi", "questions", "contexts", "text_weight", "page_weight")


def _refuse_context_options(args: argparse.Namespace, what: str, options: tuple[str, ...] = CONTEXT_OPTIONS) -> None:
    given = [f"--{o.replace('_', '-')}" for o in options if getattr(args, o, None) is not None]
    if given:
        raise ValueError(f"{' '.join(given)} choose{'s' if len(given) == 1 else ''} contexts; {args.dataset} is "
                         f"{what}, so leave {'it' if len(given) == 1 else 'them'} out")


def _contexts(args: argparse.Namespace, spec: Any, records: list) -> tuple[Path, Any, dict]:
    """(output folder, contexts, how they were made) of an OCR run over contexts: a dataset whose records are
    contexts (its spec's ``contexts``), or multi-page records (MP-DocVQA, SlideVQA) grouped by their pages."""
    from arr_coc.data.contexts import record_contexts

    options = ("window", "source", "dpi", "questions", "contexts")
    _refuse_context_options(args, "made of its own pages" if spec.contexts is None else "read with "
                            + (", ".join(f"--{o}" for o in spec.context_options) or "no option") + " of these",
                            tuple(o for o in options if o not in spec.context_options))
    if spec.contexts is None:
        return args.out / args.dataset, record_contexts(records), {"split": args.split, "limit": args.limit,
                                                                     "seed": args.seed}
    items, made, folder = spec.contexts(args.data, split=args.split, limit=args.limit, seed=args.seed,
                                        **{o: getattr(args, o) for o in spec.context_options})
    return args.out / args.dataset / folder if folder else args.out / args.dataset, items, made
