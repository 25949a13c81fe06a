"""The pages' BM25 order for the ``bm25_pages`` method (text retrieval over a context's pages).

The whole-context methods themselves (``coc``, ``equal_split``, ``uniform``, ``first_pages``, ``bm25_pages``,
``full``) are entries of the one method registry (:mod:`arr_coc.allocators.pages`,
:func:`arr_coc.allocators.methods.page_plans`); this module ranks the pages by their text for the one that
needs it (bm25s, English stop words: what a user would pick instead).
"""
from __future__ import annotations

from typing import Sequence

from arr_coc.allocators.methods import methods_for
from arr_coc.errors import MissingDependencyError

CONTEXT_METHODS = methods_for("ocr", scope="context")  # table order
NEEDS_BM25 = "bm25_pages"
_BM25_INSTALL = "pip install 'arr-coc[bench]' (bm25s), or leave out --methods bm25_pages"


def require_bm25(what: str = "method bm25_pages") -> None:
    """Raise :class:`MissingDependencyError` in one line when bm25s is not installed."""
    try:
        import bm25s  # noqa: F401
    except ImportError as err:
        raise MissingDependencyError(f"{what} needs bm25s: {_BM25_INSTALL}") from err


class BM25Pages:
    """The pages of one context ranked by BM25 (bm25s, English stop words) for a question.

    Example:
        >>> BM25Pages(["apples and pears", "the brass key is under the mat", "pears"]).rank("Where is the key?")[0]
        1
    """

    def __init__(self, texts: Sequence[str]) -> None:
        require_bm25()
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
