"""The command line's options, made in one place from the config dataclasses (and the defaults table).

A config field becomes a flag through the maps below (field name -> option strings): its type hint
gives the type, its default the default, ``metadata["help"]`` the help text. The same maps make the
defaults table of docs/glossary.md (:func:`defaults_table`), so the docs, ``--help`` and the code
cannot disagree (``python -c "from arr_coc.cli.options import defaults_table as t; print(t())"`` prints it).
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import MISSING, fields
from pathlib import Path
from types import UnionType
from typing import Any, Sequence, Union, get_args, get_origin, get_type_hints

from arr_coc.config import (
    MAX_NEW_TOKENS,
    MAX_QUESTION_TOKENS,
    ARRConfig,
    CanvasConfig,
    DecodeConfig,
    GestaltConfig,
    SamplerConfig,
    ScorerConfig,
    TextureConfig,
)

Options = dict[str, "str | tuple[str, ...]"]

# Options that come from a config dataclass: field name -> option strings (the first names the dest).
CANVAS_OPTIONS: Options = {"cell": "--cell", "max_pixels": "--max-pixels"}
TEXTURE_OPTIONS: Options = {"channels": "--channels"}
SCORER_OPTIONS: Options = {"name": "--scorer", "weights": "--scorer-weights", "where_prior": "--where-prior"}
# `look` and `ask` spend K saccades on top of the gestalt (or split --tokens T as eval does)
SAMPLER_OPTIONS: Options = {"name": "--sampler", "saccades": "--saccades"}
# `eval` and `train` take total tokens: only the sampler's name (the method arr sends; a learnable
# sampler takes its trained parameters from --scorer-weights when that run trained it)
SAMPLER_NAME_OPTIONS: Options = {"name": "--sampler"}
SEED_OPTIONS: Options = {"seed": "--seed"}
# `ask` decodes with transformers' generate: the common GenerationConfig settings
DECODE_OPTIONS: Options = {"do_sample": "--do-sample", "temperature": "--temperature", "top_p": "--top-p",
                           "num_beams": "--num-beams", "stop": "--stop", "seed": "--seed"}

TOKENS_HELP = ("T total visual tokens (gestalt + saccades), as tokens (529), a share of full resolution (25%%) or "
               "a compression of the context's text tokens (10x): the largest square gestalt of at most T/2 tokens "
               "(sides 16, 12, 8, 6, 4, 2, 1, clamped to the image's cell grid; over n pages n gestalts) and the "
               "rest as saccades, the split eval and train use (529 -> 16x16 + 273)")
MAX_NEW_TOKENS_HELP = "answer length limit in new tokens (default %(default)s)"
QUERY_ENCODERS = ("minilm", "hashing")

# Flags renamed by the one vocabulary (saccades K, tokens T): old spelling -> what to write instead
RENAMED = {
    "look": {"--budget": "--saccades K (or --tokens T for a total)"},
    "ask": {"--budget": "--saccades K (or --tokens T for a total)"},
    "eval": {"--budgets": "--tokens", "--pages": "--window N (the first N pages of every document)"},
    "train": {"--budget": "--tokens"},
}


def _dest(option: str) -> str:
    return option.lstrip("-").replace("-", "_")


def _flags(option: str | tuple[str, ...]) -> tuple[str, ...]:
    return (option,) if isinstance(option, str) else option


def _option_type(hint: Any) -> tuple[type, bool]:
    """(scalar type, takes several values) of a field's type hint: ``int | None`` -> (int, False),
    ``tuple[str, ...]`` -> (str, True)."""
    args = [a for a in get_args(hint) if a is not type(None)]
    if get_origin(hint) in (Union, UnionType):
        return _option_type(args[0])
    if get_origin(hint) is tuple:
        return args[0], True
    return hint, False


def _default(f: Any) -> Any:
    return f.default if f.default is not MISSING else f.default_factory()


def add_options(parser: argparse._ActionsContainer, cls: type, options: Options,
                defaults: dict[str, Any] | None = None) -> None:
    """Add one option per field of the dataclass ``cls`` named in ``options``: its type hint sets the
    type (a bool with default True becomes ``--no-<name>``), the field's default (or ``defaults``) the
    default, and ``metadata["help"]`` the help text."""
    hints = get_type_hints(cls)
    for f in fields(cls):
        if f.name not in options:
            continue
        flags = _flags(options[f.name])
        default = (defaults or {}).get(f.name, _default(f))
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


def from_args(cls: type, args: argparse.Namespace, options: Options, **extra: Any) -> Any:
    """``cls`` built from the options :func:`add_options` declared (those this command has) and ``extra``."""
    given = {}
    for name, flags in options.items():
        dest = _dest(_flags(flags)[0])
        if hasattr(args, dest):
            value = getattr(args, dest)
            given[name] = tuple(value) if isinstance(value, list) else value
    return cls(**{**given, **extra})


class Renamed(argparse.Action):
    """A hidden old spelling of a flag: using it exits with one line that names the new one."""

    def __init__(self, option_strings: Sequence[str], dest: str, new: str = "", **kw: Any) -> None:
        super().__init__(option_strings, dest, nargs="*", help=argparse.SUPPRESS, **kw)
        self.new = new

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        print(f"arr-coc: error: {option_string} was renamed; use {self.new}", file=sys.stderr)
        raise SystemExit(2)


def add_renamed(parser: argparse.ArgumentParser, command: str) -> None:
    """The old spellings of ``command``'s renamed flags, hidden, each refusing with its new name."""
    for old, new in RENAMED.get(command, {}).items():
        parser.add_argument(old, action=Renamed, new=new, dest=f"renamed_{_dest(old)}")


def registered() -> str:
    """The registered names, for the help's epilog."""
    from arr_coc.engine.channel_registry import CHANNELS
    from arr_coc.engine.relevance import SCORERS
    from arr_coc.engine.samplers import SAMPLERS
    from arr_coc.vlm import ADAPTERS, LAYOUTS, MODES

    return (f"samplers: {', '.join(SAMPLERS.names())}\n"
            f"texture channels: {', '.join(CHANNELS.names())}\n"
            f"scorers: {', '.join(SCORERS.names())}\n"
            f"VLM adapters (config model_type): {', '.join(ADAPTERS.names())}; "
            f"modes: {', '.join(MODES)}; layouts: {', '.join(LAYOUTS)}")


def _parent(title: str) -> tuple[argparse.ArgumentParser, argparse._ArgumentGroup]:
    parent = argparse.ArgumentParser(add_help=False)
    return parent, parent.add_argument_group(title)


def _question(g: argparse._ArgumentGroup) -> None:
    g.add_argument("question", help='the question, e.g. "What is the total?"')
    g.add_argument("--max-question-tokens", type=int, default=MAX_QUESTION_TOKENS, metavar="N",
                   help="the longest question taken, in tokens (the VLM's where one reads it, else words and "
                        "punctuation marks): the VLM prefills it over the whole image (default %(default)s)")


def context_question() -> argparse.ArgumentParser:
    """One image, several images, a PDF or a text file, and the question (``look``, ``serve``'s contexts)."""
    from arr_coc.contexts import MAX_PAGES
    from arr_coc.documents.pdf import DEFAULT_DPI
    from arr_coc.documents.text_pages import TextLayout

    parent, g = _parent("input")
    g.add_argument("inputs", nargs="+", metavar="INPUT",
                   help="an image; or a context: a PDF, a text file (.txt/.md/.rst/.tex), or several images (pages)")
    _question(g)
    c, layout = parent.add_argument_group("context (a PDF, a text file, several images)"), TextLayout()
    c.add_argument("--pages", default=None, metavar="RANGE", help="a PDF's pages, 1-based, e.g. 1-20 or 3,7 (default all)")
    c.add_argument("--dpi", type=float, default=DEFAULT_DPI, help="a PDF's render resolution (default %(default)g)")
    c.add_argument("--max-pages", type=int, default=MAX_PAGES, metavar="N",
                   help="the most pages a context may have (default %(default)s)")
    c.add_argument("--font", default=layout.font, help="a text file's font family (default %(default)s)")
    c.add_argument("--font-size", type=int, default=layout.size, help="a text file's font size, px (default %(default)s)")
    c.add_argument("--page-width", type=int, default=layout.width, help="a text file's page width, px (default %(default)s)")
    c.add_argument("--page-height", type=int, default=layout.height,
                   help="a text file's page height, px (default %(default)s)")
    return parent


def is_context(args: argparse.Namespace) -> bool:
    """Whether the inputs are a context (several inputs, a PDF or a text file) rather than one image."""
    from arr_coc.contexts.inputs import TEXT_SUFFIXES, is_pdf

    one = args.inputs[0]
    return len(args.inputs) > 1 or is_pdf(Path(one)) or Path(one).suffix.lower() in TEXT_SUFFIXES


def refuse_unused_context_options(args: argparse.Namespace) -> None:
    """Refuse the context flags the inputs would not use: each acts on one kind of input only.

    ``--pages`` and ``--dpi`` act on a PDF, the text layout flags on a text file, ``--max-pages`` on any context;
    one image takes none of them. Compared with their defaults, so a flag given its default value passes.
    """
    from arr_coc.contexts import MAX_PAGES
    from arr_coc.contexts.inputs import TEXT_SUFFIXES, is_pdf
    from arr_coc.documents.pdf import DEFAULT_DPI
    from arr_coc.documents.text_pages import TextLayout

    layout, pdf, text, context = TextLayout(), "a PDF", "a text file", "a context"
    flags = {"pages": ("--pages", None, pdf), "dpi": ("--dpi", DEFAULT_DPI, pdf),
             "max_pages": ("--max-pages", MAX_PAGES, context), "font": ("--font", layout.font, text),
             "font_size": ("--font-size", layout.size, text), "page_width": ("--page-width", layout.width, text),
             "page_height": ("--page-height", layout.height, text)}
    one = Path(args.inputs[0])
    if not is_context(args):
        kind, acting = "one image", ()
    elif len(args.inputs) == 1 and is_pdf(one):
        kind, acting = pdf, ("pages", "dpi", "max_pages")
    elif len(args.inputs) == 1 and one.suffix.lower() in TEXT_SUFFIXES:
        kind, acting = text, ("max_pages", "font", "font_size", "page_width", "page_height")
    else:
        kind, acting = "several images", ("max_pages",)
    unused = [f"{flag} acts only on {on}" for name, (flag, default, on) in flags.items()
              if name not in acting and getattr(args, name) != default]
    if unused:
        raise ValueError(f"{', '.join(unused)}, and the input is {kind}; drop {'it' if len(unused) == 1 else 'them'}")


def text_layout(args: argparse.Namespace) -> Any:
    """The TextLayout the context flags ask for."""
    from arr_coc.documents.text_pages import TextLayout

    return TextLayout(font=args.font, size=args.font_size, width=args.page_width, height=args.page_height)


def check_question(args: argparse.Namespace) -> None:
    """The question and its length limit, checked before anything loads (the library checks the same way)."""
    from arr_coc.config import check_int
    from arr_coc.engine.query import check_queries

    check_queries([args.question], 1, check_int("--max-question-tokens", args.max_question_tokens))


def add_saccades(parser: argparse.ArgumentParser) -> None:
    """The sampler and K saccades, or T total tokens split as eval splits them (``look``, ``ask``).

    Added to the command's own parser, not through a parent: argparse would list a parent's
    mutually exclusive options outside their group.
    """
    g = parser.add_argument_group("saccades (the gestalt's tokens come on top of K; --tokens T counts both)")
    add_options(g, SamplerConfig, {"name": SAMPLER_OPTIONS["name"]})
    one = g.add_mutually_exclusive_group()
    add_options(one, SamplerConfig, {"saccades": SAMPLER_OPTIONS["saccades"]})
    one.add_argument("--tokens", default=None, metavar="T", help=TOKENS_HELP)


def query_encoder_option(g: argparse._ActionsContainer) -> None:
    g.add_argument("--query-encoder", choices=QUERY_ENCODERS, default="minilm",
                   help="minilm: packaged all-MiniLM-L6-v2; hashing: model-free bag of words (default %(default)s)")


def pipeline(canvas: Sequence[str] = ("cell", "max_pixels")) -> argparse.ArgumentParser:
    """How relevance is computed: canvas, texture channels, question encoder, scorer."""
    parent, g = _parent("pipeline")
    add_options(g, CanvasConfig, {k: v for k, v in CANVAS_OPTIONS.items() if k in canvas})
    add_options(g, TextureConfig, TEXTURE_OPTIONS)
    g.add_argument("--clip-model", default=None, metavar="PATH_OR_ID",
                   help="CLIP/SigLIP weights for the 'clip' channel (a local folder or a hub id)")
    query_encoder_option(g)
    add_options(g, ScorerConfig, SCORER_OPTIONS)
    return parent


def vlm(required: bool = True) -> argparse.ArgumentParser:
    parent, g = _parent("VLM")
    g.add_argument("--model", required=required, metavar="PATH_OR_ID",
                   help="checkpoint folder or hub id loaded with from_pretrained (Qwen2/2.5/3-VL), "
                        "or tiny:<family> for a random-weight model that only exercises the plumbing"
                        + ("" if required else "; needed by --reader vlm"))
    g.add_argument("--dtype", default=None, help="model dtype, e.g. bfloat16 (default: the checkpoint's)")
    g.add_argument("--device", default=None, help="e.g. cuda (default: cpu)")
    return parent


def decoding(parser: argparse.ArgumentParser) -> None:
    """How the VLM writes its answer (:class:`arr_coc.config.DecodeConfig`), and whether it streams."""
    g = parser.add_argument_group("decoding (transformers' generate; default: greedy)")
    add_options(g, DecodeConfig, DECODE_OPTIONS)
    g.add_argument("--stream", action=argparse.BooleanOptionalAction, default=None,
                   help="print the answer as it is generated (default: when printing text to a terminal; "
                        "not with --json or --num-beams above 1)")


def max_new_tokens_option(g: argparse._ActionsContainer, default: int = MAX_NEW_TOKENS) -> None:
    g.add_argument("--max-new-tokens", type=int, default=default, help=MAX_NEW_TOKENS_HELP)


def data() -> argparse.ArgumentParser:
    from arr_coc.data.datasets import DATASETS

    parent, g = _parent("data")
    g.add_argument("dataset", help=f"dataset: {', '.join(DATASETS.names())} (texlive-contexts, texlive-paraphrase "
                                   f"and contexts: questions over whole contexts, see the contexts options)")
    g.add_argument("--data", type=Path, default=None,
                   help="dataset folder (jsonl: the .jsonl file); default: $ARR_COC_DATA/<name>, or "
                        "../shared/data/<name> beside a source checkout")
    g.add_argument("--limit", type=int, default=None, help="evaluate N records (a seeded subset spread over images)")
    g.add_argument("--split", choices=("train", "val", "test"), default=None,
                   help="only the images of this split (by image id, as `arr-coc train` splits them; DocVQA, "
                        "InfoVQA, TextVQA and ChartQA: their official split's files); use test to report a "
                        "trained scorer (required when the shipped weights were trained on the dataset)")
    return parent


def texture_config(channels: Sequence[str] | None, clip_model: str | None = None) -> TextureConfig:
    """TextureConfig from CLI names ('mvp': the 13-channel MVP; 'default': the pipeline's default set) and
    the CLIP weights."""
    from arr_coc.config import MVP_CHANNELS, PIPELINE_CHANNELS

    names = None
    if channels:
        groups = {"mvp": MVP_CHANNELS, "default": PIPELINE_CHANNELS}
        names = tuple(n for c in channels for n in groups.get(c, (c,)))
    if clip_model and "clip" not in (names or PIPELINE_CHANNELS):  # the weights of a channel not computed
        raise ValueError("--clip-model sets the weights of the 'clip' channel, which --channels does not include; "
                         "add clip to --channels or drop --clip-model")
    return TextureConfig(channels=names, options={"clip": {"model": clip_model}} if clip_model else {})


def query_encoder(args: argparse.Namespace, load: bool = True) -> Any:
    """The question encoder ``--query-encoder`` names (MiniLM loaded now when ``load``)."""
    from arr_coc.engine.query import HashingQueryEncoder, MiniLMQueryEncoder

    if args.query_encoder == "hashing":
        return HashingQueryEncoder()
    return MiniLMQueryEncoder().load() if load else MiniLMQueryEncoder()


def budget(args: argparse.Namespace) -> Any:
    """The request's :class:`~arr_coc.budget.Budget`, parsed once here: ``--tokens`` ("529", "25%", "10x") or
    ``--saccades K`` (default: the sampler's K)."""
    from arr_coc.budget import Budget

    if args.tokens is not None:
        return Budget.parse(args.tokens)
    return Budget.saccades(getattr(args, "saccades", SamplerConfig().saccades))


def arr_config(args: argparse.Namespace, **parts: Any) -> ARRConfig:
    """The ARRConfig the command's options ask for (canvas, channels, scorer, sampler, seed), ``parts`` replacing
    any of them (e.g. ``gestalt=GestaltConfig(...)``)."""
    sampler = SAMPLER_OPTIONS if hasattr(args, "saccades") else SAMPLER_NAME_OPTIONS
    made = dict(canvas=from_args(CanvasConfig, args, CANVAS_OPTIONS),
                texture=texture_config(getattr(args, "channels", None), getattr(args, "clip_model", None)),
                scorer=from_args(ScorerConfig, args, SCORER_OPTIONS), sampler=from_args(SamplerConfig, args, sampler))
    if hasattr(args, "seed"):
        made["seed"] = args.seed
    return ARRConfig(**{**made, **parts})


def sent(args: argparse.Namespace, image: Any, canvas: CanvasConfig) -> tuple[SamplerConfig, GestaltConfig]:
    """The sampler (with K) and gestalt that ``--saccades K`` / ``--tokens T`` / ``--gestalt N`` ask for on ``image``
    (one image's split of :func:`budget`, by :meth:`~arr_coc.budget.Budget.split`; kept for ``ask``'s one-image
    path until it allocates with :func:`arr_coc.contexts.allocate`)."""
    gestalt = getattr(args, "gestalt", None)
    if args.tokens is None:
        return (from_args(SamplerConfig, args, SAMPLER_OPTIONS),
                GestaltConfig(grid=None if gestalt is None else (gestalt, gestalt)))
    if gestalt is not None:
        raise ValueError("--tokens T sets the gestalt by the split rule; give --saccades K with --gestalt N instead")
    from arr_coc.engine.canvas import make_canvas

    c = make_canvas(image, cell=canvas.cell, min_pixels=canvas.min_pixels, max_pixels=canvas.max_pixels)
    (grid,), k = budget(args).split([tuple(s // c.cell for s in c.sizes[0])])
    return from_args(SamplerConfig, args, SAMPLER_OPTIONS, saccades=k), GestaltConfig(grid=grid)


# The settings the defaults table lists: (dataclass, the flags of its fields, fields without a flag to list too)
def _table_sources() -> list[tuple[type, Options]]:
    from arr_coc.train.loop import TrainConfig

    return [
        (CanvasConfig, {**CANVAS_OPTIONS, "min_pixels": ""}),
        (TextureConfig, {**TEXTURE_OPTIONS, "options": "--clip-model"}),
        (GestaltConfig, {"grid": "--gestalt"}),
        (ScorerConfig, {**SCORER_OPTIONS, "query_dim": "", "hidden": "", "part_scale": ""}),
        (SamplerConfig, {**SAMPLER_OPTIONS, "kwargs": ""}),
        (ARRConfig, SEED_OPTIONS),
        (DecodeConfig, DECODE_OPTIONS),
        (TrainConfig, {f.name: "--" + f.name.replace("_", "-") for f in fields(TrainConfig)}),
    ]


def _cell(value: Any) -> str:
    if value is None or value == ():
        return "none"
    if isinstance(value, tuple):
        return " ".join(map(str, value))
    return str(value)


def defaults_table() -> str:
    """The markdown table of every setting: config field, command-line flag, default, meaning."""
    rows = ["| setting | flag | default | meaning |", "|---|---|---|---|"]
    for cls, options in _table_sources():
        for f in fields(cls):
            if f.name not in options or "help" not in f.metadata:
                continue
            flag = _flags(options[f.name])[0]
            kind, _ = _option_type(get_type_hints(cls)[f.name])
            if kind is bool and _default(f):
                flag = "--no-" + flag[2:]
            text = f.metadata["help"].replace("|", "\\|")
            rows.append(f"| `{cls.__name__}.{f.name}` | {f'`{flag}`' if flag else ''} | `{_cell(_default(f))}` | "
                        f"{text} |")
    rows.append(f"| `config.MAX_NEW_TOKENS` | `--max-new-tokens` | `{MAX_NEW_TOKENS}` | "
                f"answer length limit of ask, eval --reader vlm and serve |")
    return "\n".join(rows)


def command_line(args: argparse.Namespace) -> str:
    """The command as typed (what a report says made it)."""
    import shlex

    return "arr-coc " + shlex.join(args.argv)
