"""The ``arr-coc`` command line: ``arr-coc look IMAGE "QUESTION"`` and friends, one module per command.

``look``, ``ask``, ``eval``, ``train`` and ``serve`` each live in their own module (an ``add_parser``
and a ``run``); their options come from the config dataclasses through :mod:`arr_coc.cli.options`.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any, Sequence

from arr_coc import __version__
from arr_coc import examples as bundled
from arr_coc.cli import ask, look, options, progress, serve, train
from arr_coc.cli import eval as evaluate
from arr_coc.cli.options import SAMPLER_OPTIONS, add_options, from_args, texture_config
from arr_coc.errors import UserError
from arr_coc.threads import fit_threads

__all__ = ["COMMANDS", "SAMPLER_OPTIONS", "USER_ERRORS", "add_options", "from_args", "main", "texture_config"]

COMMANDS = {"look": look, "eval": evaluate, "ask": ask, "train": train, "serve": serve}

# What a user fixes by changing the command or its files: the project's own UserError types (unknown
# names, missing extras), and the ValueError / OSError the library raises for a bad value or an
# unreadable file. Anything else (TypeError, KeyError, RuntimeError, ...) is a bug: it keeps its traceback.
USER_ERRORS = (UserError, ValueError, OSError)


# `arr-coc --help`: what a user can bring and where the files go (the commands' own --help say the same per flag)
GUIDE = """\
inputs (look and ask; the question follows them):
  IMAGE            one image file (JPEG, PNG, WebP, TIFF, ... any Pillow reads): gestalt + K saccades
  IMAGE IMAGE ...  several images: one context, one budget over them, each image a page
  DOC.pdf          a PDF's pages (--pages 1-20, --dpi 100); its text layer is matched to the question
  NOTES.txt        a text file (.txt .md .rst .tex .text) set on pages (--font-size, --page-width, ...)
  a tensor         from Python only: ARR()(tensor [3,H,W] or a list, questions); arr_coc.vlm.ask(vlm, tensor, q)
  the examples     {examples}, bundled with the package; their paths from any folder:
                   python -c "from arr_coc import examples; print(examples.path('receipt.jpg'))"

outputs (stdout carries the result; progress lines, warnings and errors go to stderr):
  look   a summary, or --json; a picture at --out FILE, default out/<input>_arr.png (a context's
         out/<input>_coc.png) under the current folder, none with --json unless --out is given
  ask    the answer and its costs, or --json; writes no file
  eval   rows and reports under --out DIR, default out/eval/<dataset>/
  train  checkpoint, weights and reports under --out DIR, default out/train/ (features cached in out/features/)
  serve  nothing on disk but its temporary downloads

"""


def _parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    epilog = options.registered()
    p = argparse.ArgumentParser(prog="arr-coc", formatter_class=fmt, epilog=GUIDE.format(examples=", ".join(bundled.names())) + epilog,
                                description="Query-aware visual token allocation: a gestalt of the whole image "
                                            "plus K full-resolution saccades where the question needs them.")
    p.add_argument("--version", action="version", version=f"arr-coc {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    def command(name: str, parents: list[argparse.ArgumentParser], **kw: Any) -> argparse.ArgumentParser:
        parser = sub.add_parser(name, parents=parents, formatter_class=fmt, epilog=epilog, **kw)
        options.add_renamed(parser, name)
        return parser

    for module in COMMANDS.values():
        module.add_parser(command)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    fit_threads()  # the command owns this process: an OpenMP limit below torch's threads would corrupt bf16 matmul
    try:
        try:
            return COMMANDS[args.command].run(args)
        finally:
            progress.stop()  # a stage line on stderr is wiped before any message or traceback
    except USER_ERRORS as err:
        print(f"arr-coc: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # eval keeps every finished record's rows, train its last checkpoint: the same command resumes
        kept = {"eval": "the rows of finished records are kept: rerun the same command to go on",
                "train": "the last checkpoint is kept: rerun with --resume to go on"}
        print(f"arr-coc: interrupted; {kept.get(args.command, 'nothing to resume')}", file=sys.stderr)
        return 130
