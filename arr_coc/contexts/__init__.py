"""Contexts: one token budget over many pages (a PDF, several images, a long text rendered as pages).

``allocate_context(arr, context, question, tokens=T)`` gives every page a small gestalt by one
rule and places the saccades by one ranking over the cells of all pages (:mod:`.allocate`);
:func:`open_context` sizes and checks a PDF, a text file or images before anything is drawn and
:func:`load_context` turns them into pages (:mod:`.inputs`); :func:`split_context`
is the token rule (:mod:`.budget`); :func:`text_tokens` counts the text a context replaces (:mod:`.tokens`).
"""
from arr_coc.contexts.allocate import (
    ContextAllocation,
    PageAllocation,
    SeenContext,
    allocate_context,
    check_context,
    rank_parts,
    see_context,
)
from arr_coc.contexts.budget import split_context
from arr_coc.contexts.inputs import MAX_PAGES, OpenContext, load_context, open_context
from arr_coc.contexts.ranking import RankParts, rank_cells, ranking_score
from arr_coc.contexts.tokens import DEFAULT_TOKENIZER, text_tokens, tokenizer_name

__all__ = ["ContextAllocation", "PageAllocation", "SeenContext", "allocate_context", "check_context", "see_context", "rank_cells",
           "rank_parts", "RankParts", "ranking_score", "split_context", "MAX_PAGES", "OpenContext", "load_context", "open_context",
           "DEFAULT_TOKENIZER", "text_tokens", "tokenizer_name"]
