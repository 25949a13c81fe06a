"""Question -> passage retrieval: embeddings of a question and of a context's lines, compared by cosine.

A :class:`Retriever` embeds questions (:meth:`Retriever.queries`) and passages (:meth:`Retriever.passages`,
e.g. every line of a context's pages, computed once per context) as L2-normalised rows, so a question's score
for a line is their dot product. :func:`load_retriever` gives one by name (:data:`RETRIEVERS`).
"""
from __future__ import annotations

from typing import Callable, Protocol, Sequence

from torch import Tensor

from arr_coc.engine.query import HashingQueryEncoder, MiniLMQueryEncoder


class Retriever(Protocol):
    """Embeds questions and passages into one space (rows L2-normalised)."""

    name: str

    def queries(self, texts: Sequence[str]) -> Tensor:
        """[N, D] the questions' embeddings."""
        ...

    def passages(self, texts: Sequence[str]) -> Tensor:
        """[N, D] the passages' embeddings."""
        ...


class MiniLMRetriever:
    """all-MiniLM-L6-v2 (a symmetric similarity model): questions and passages embedded alike."""

    name = "minilm"

    def __init__(self, device: str = "cpu") -> None:
        self.encoder = MiniLMQueryEncoder(device=device)

    def queries(self, texts: Sequence[str]) -> Tensor:
        return self.encoder.encode(list(texts))

    def passages(self, texts: Sequence[str]) -> Tensor:
        return self.encoder.encode(list(texts))


class HashingRetriever:
    """Bag-of-words hashing (:class:`~arr_coc.engine.query.HashingQueryEncoder`): no model, for tests and model-free
    runs; lines sharing the question's words score above the rest.

    >>> r = HashingRetriever()
    >>> float(r.queries(["the total"])[0] @ r.passages(["total due", "date"]).T[:, 0]) > 0
    True
    """

    name = "hashing"

    def __init__(self, device: str = "cpu") -> None:
        self.encoder = HashingQueryEncoder()

    def queries(self, texts: Sequence[str]) -> Tensor:
        return self.encoder.encode(list(texts))

    def passages(self, texts: Sequence[str]) -> Tensor:
        return self.encoder.encode(list(texts))


RETRIEVERS: dict[str, Callable[..., Retriever]] = {"minilm": MiniLMRetriever, "hashing": HashingRetriever}
DEFAULT_RETRIEVER = "minilm"


def load_retriever(name: str = DEFAULT_RETRIEVER, device: str = "cpu") -> Retriever:
    """The retriever called ``name`` (:data:`RETRIEVERS`), loading its model on first use."""
    if name not in RETRIEVERS:
        raise ValueError(f"unknown retriever {name!r}; choose one of {', '.join(RETRIEVERS)}")
    return RETRIEVERS[name](device=device)
