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
               "(sides 16, 12, 8, 6, 4, 2, 1, clamped to the image's cell grid; over n pages n gestalts, a side below 8 "
               "sent as 1x1) and the rest as saccades, the split eval and train use (529 -> 16x16 + 273)")
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


def group_parent(title: str) -> tuple[argparse.ArgumentParser, argparse._ArgumentGroup]:
    parent = argparse.ArgumentParser(add_help=False)
    return parent, parent.add_argument_group(title)


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


def retriever_option(g: argparse._ActionsContainer) -> None:
    g.add_argument("--retriever", default=None, metavar="NAME",
                   help="the model ranking text lines for the question: bge-small (packaged, the default), minilm, "
                        "hashing (model-free; the default with --query-encoder hashing), or hf:PATH_OR_ID, any "
                        "sentence-transformers model folder or hub id (a hub id downloads), with its own prompts")


def pipeline(canvas: Sequence[str] = ("cell", "max_pixels")) -> argparse.ArgumentParser:
    """How relevance is computed: canvas, texture channels, question encoder, scorer."""
    parent, g = group_parent("pipeline")
    add_options(g, CanvasConfig, {k: v for k, v in CANVAS_OPTIONS.items() if k in canvas})
    add_options(g, TextureConfig, TEXTURE_OPTIONS)
    g.add_argument("--clip-model", default=None, metavar="PATH_OR_ID",
                   help="CLIP/SigLIP weights for the 'clip' channel (a local folder or a hub id)")
    query_encoder_option(g)
    retriever_option(g)
    add_options(g, ScorerConfig, SCORER_OPTIONS)
    return parent


def vlm(required: bool = True) -> argparse.ArgumentParser:
    parent, g = group_parent("VLM")
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

    parent, g = group_parent("data")
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


def retriever(args: argparse.Namespace, device: str | None = None) -> Any:
    """The line retriever ``--retriever`` names, or None (the ARR's default); an ``hf:`` model on ``device``
    (the command's ``--device``; default the CPU), loaded now, a packaged one on the CPU (loaded on first use)."""
    from arr_coc.engine.retrieval import HF_PREFIX, load_retriever

    name = getattr(args, "retriever", None)
    if name is None:
        return None
    if not name.startswith(HF_PREFIX):
        return load_retriever(name)
    return load_retriever(name, device=device or "cpu").load()  # a model that cannot load: refused before any work


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
