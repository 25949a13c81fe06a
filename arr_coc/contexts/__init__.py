"""Contexts: one token budget over any input's pages (a PDF, several images, a long text rendered as pages, or
one image: a context of one page).

``allocate(arr, context, question, budget)`` gives every page a gestalt by one rule
(:meth:`arr_coc.budget.Budget.split`), decides each page's share of the saccades by one ranking over the cells
of all pages and places each share with the page's sampler (:mod:`.allocate`; :func:`allocate_images`: a batch of one-page
contexts, one image each, seen and scored in one pass); :func:`see_context` reads
pages once for several questions (:mod:`.seen`); :func:`open_context` sizes and checks a PDF, a text file or
images before anything is drawn and :func:`load_context` turns them into pages (:mod:`.inputs`);
:func:`text_tokens` counts the text a context replaces (:mod:`.tokens`).
"""
from arr_coc.contexts.allocate import (
    allocate,
    allocate_images,
    check_context,
    plan_budget,
    rank_parts,
)
from arr_coc.contexts.inputs import MAX_PAGES, OpenContext, load_context, open_context
from arr_coc.contexts.ranking import RankParts, placing_map, rank_cells, ranking_score
from arr_coc.contexts.result import ContextAllocation, PageAllocation
from arr_coc.contexts.seen import ContextScene, see_context
from arr_coc.contexts.tokens import DEFAULT_TOKENIZER, text_tokens, tokenizer_name

__all__ = ["ContextAllocation", "PageAllocation", "ContextScene", "allocate", "allocate_images", "check_context",
           "plan_budget", "see_context", "rank_cells", "rank_parts", "RankParts", "ranking_score", "placing_map",
           "MAX_PAGES", "OpenContext", "load_context", "open_context", "DEFAULT_TOKENIZER",
           "text_tokens", "tokenizer_name"]
