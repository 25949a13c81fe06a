"""The input flags of ``look`` and ``ask``: one image or a context (a PDF, a text file, several images), the
question, and the refusal of a context flag the input would not use."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from arr_coc.cli.options import group_parent
from arr_coc.config import MAX_QUESTION_TOKENS


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

    parent, g = group_parent("input")
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
