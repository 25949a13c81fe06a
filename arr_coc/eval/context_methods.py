"""The pages' orders of the text-ranked methods: BM25 (``bm25_pages``) and a retriever's (``retrieval_pages``).

The whole-context methods themselves (``coc``, ``equal_split``, ``uniform``, ``first_pages``, ``bm25_pages``,
``retrieval_pages``, ``full``) are entries of the one method registry (:mod:`arr_coc.allocators.pages`,
:func:`arr_coc.allocators.methods.page_plans`); this module ranks the pages by their text for the two that
need it: bm25s with English stop words (what a user would pick instead), and the retriever of
:mod:`arr_coc.engine.retrieval` (a page scores its best line's cosine with the question).
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from arr_coc.allocators.methods import methods_for

CONTEXT_METHODS = methods_for("ocr", scope="context")  # table order
NEEDS_BM25 = "bm25_pages"
NEEDS_RETRIEVER = "retrieval_pages"


class BM25Pages:
    """The pages of one context ranked by BM25 (bm25s, English stop words) for a question.

    Example:
        >>> BM25Pages(["apples and pears", "the brass key is under the mat", "pears"]).rank("Where is the key?")[0]
        1
    """

    def __init__(self, texts: Sequence[str]) -> None:
        import bm25s

        self.n = len(texts)
        self.retriever = bm25s.BM25()
        self.retriever.index(bm25s.tokenize(list(texts), stopwords="en", show_progress=False), show_progress=False)

    def rank(self, question: str) -> list[int]:
        """Every page position, best first."""
        import bm25s

        ids, _ = self.retriever.retrieve(bm25s.tokenize([question], stopwords="en", show_progress=False),
                                         k=self.n, show_progress=False)
        return [int(i) for i in ids[0]]


class RetrievalPages:
    """The pages of one context ranked by a retriever for a question: a page scores its best line's cosine.

    The lines (what :func:`arr_coc.contexts.see_context` read on each page, ``seen.lines``) are embedded once, here,
    so every question over the context pays only for its own embedding. A page without a line ranks after every
    page with one; ties keep reading order.

    Example:
        >>> from arr_coc.engine.query import HashingQueryEncoder
        >>> class Hashing:  # a model-free retriever for the example
        ...     enc = HashingQueryEncoder()
        ...     queries = passages = lambda self, texts: self.enc.encode(list(texts))
        >>> pages = [["apples and pears"], [], ["the brass key is under the mat", "pears"]]
        >>> RetrievalPages(Hashing(), pages).rank("the brass key")
        [2, 0, 1]
    """

    def __init__(self, retriever: Any, lines: Sequence[Sequence[str]]) -> None:
        self.retriever = retriever
        texts = [[t for t in page if t.strip()] for page in lines]
        self.page_of = torch.tensor([i for i, page in enumerate(texts) for _ in page], dtype=torch.long)  # [L]
        flat = [t for page in texts for t in page]
        self.lines = retriever.passages(flat).float().cpu() if flat else torch.zeros(0, 1)  # [L, D]
        self.n = len(texts)

    def scores(self, question: str) -> torch.Tensor:
        """[pages] each page's best line's cosine with the question (-inf without a line)."""
        best = torch.full((self.n,), float("-inf"))
        if len(self.page_of):
            q = self.retriever.queries([question]).float().cpu()[0]  # [D]
            best = best.scatter_reduce(0, self.page_of, self.lines @ q, "amax")
        return best

    def rank(self, question: str) -> list[int]:
        """Every page position, best first."""
        return torch.sort(self.scores(question), descending=True, stable=True).indices.tolist()
