"""A context's lines embedded coarse to fine: a third of the passages when the context is seen, the rest where a
question looks.

Every line is ranked by its passage (the line with its neighbours, :func:`~arr_coc.contexts.ranking.passage_texts`).
Seeing a context embeds one passage in three (:func:`chunk_centres`: the passages of lines 1, 4, 7, ..., which
together read every line once); a question scores each line by its chunk's passage, takes the context's
:data:`REFINE_CHUNKS` best chunks and embeds their other lines' own passages, which every later question reuses. A
line in a refined chunk is then scored exactly as if every passage had been embedded: a retriever embeds each text
alone (:class:`~arr_coc.engine.retrieval.BgeSmallRetriever`), so a passage's vector is the same bits whenever it is
made; a context of at most :data:`REFINE_CHUNKS` chunks (a short document) is scored exactly, and one image's lines
always are (``refine=None``: one image is seen for its one question).
Chosen on the 199 hand-written validation questions (docs/coc.md, "Coarse to fine"): 128 chunks cover the answer
within half a point of every passage embedded (10x 0.856 against 0.859, 20x 0.767 against 0.761) for a third of the
see's retrieval work.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from numbers import Integral
from typing import Any, Sequence

import torch
from torch import Tensor

from arr_coc.contexts.ranking import PASSAGE_AROUND, passage_texts
from arr_coc.contexts.result import Line
from arr_coc.engine.retrieval import Retriever

# one passage in three embedded when a context is seen: a chunk is a centre line and the lines its passage reads
CHUNK_STRIDE = 2 * PASSAGE_AROUND + 1
# The best chunks whose every line's own passage a question embeds; 16-256 measured on validation (docs/coc.md,
# "Coarse to fine"): 64 lost a point at 10x, 128 and 192 within half a point of every passage embedded.
REFINE_CHUNKS = 128


def chunk_centres(n: int, stride: int = CHUNK_STRIDE, around: int = PASSAGE_AROUND) -> list[int]:
    """The lines whose passages (a line with ``around`` lines either side) are a page's chunks, every line in one:
    stride 1 every line, 3 one passage per three lines, a last centre added for a last line beyond the others' chunks.

    >>> chunk_centres(6, 1), chunk_centres(6, 2), chunk_centres(7), chunk_centres(6), chunk_centres(1)
    ([0, 1, 2, 3, 4, 5], [1, 3, 5], [1, 4, 6], [1, 4], [0])
    """
    if n == 0:
        return []
    picked = list(range(min(around, n - 1) if stride > 1 else 0, n, stride))
    if picked[-1] < n - 1 - around:
        picked.append(n - 1)
    return picked


def chunk_lines(centre: int, n: int, around: int = PASSAGE_AROUND) -> range:
    """The lines of a page of ``n`` lines that the chunk of line ``centre`` reads (its passage's lines)."""
    return range(max(0, centre - around), min(n, centre + around + 1))


def chunk_scores(centre_scores: Tensor, n: int, centres: Sequence[int]) -> Tensor:
    """[n] each line's score by its chunk: the best of the centres' scores whose chunk reads it.

    >>> chunk_scores(torch.tensor([0.25, 0.5, 0.375]), 7, [1, 4, 6]).tolist()
    [0.25, 0.25, 0.25, 0.5, 0.5, 0.5, 0.375]
    """
    out = torch.full((n,), -2.0)  # below any cosine
    for k, c in enumerate(centres):
        span = chunk_lines(c, n)
        out[span.start: span.stop] = torch.maximum(out[span.start: span.stop], centre_scores[k])
    return out


def best_chunks(centre_scores: Sequence[Tensor], centres: Sequence[Sequence[int]], k: int) -> list[tuple[int, int]]:
    """The context's ``k`` best chunks as (page, centre line), best first (ties: the earlier page and line).

    >>> best_chunks([torch.tensor([0.1, 0.9]), torch.tensor([0.5])], [[1, 4], [0]], 2)
    [(0, 4), (1, 0)]
    """
    ranked = sorted(((-float(s[j]), p, c) for p, (s, cs) in enumerate(zip(centre_scores, centres))
                     for j, c in enumerate(cs)))
    return [(p, c) for _, p, c in ranked[:k]]


def check_refine(refine: Any) -> None:
    """Refuse a ``refine`` that is neither None (every line) nor a whole number of chunks >= 0, in one line."""
    if refine is not None and (isinstance(refine, bool) or not isinstance(refine, Integral) or refine < 0):
        raise ValueError(f"refine must be a number of chunks >= 0 (None: every line), got {refine!r}")


@dataclass
class LineEmbeddings:
    """A context's lines' passage embeddings, filled coarse to fine (see the module).

    Attributes:
        retriever: the retriever's name (a question embedded by another retriever cannot use them).
        texts: per page each line's passage text.
        centres: per page its chunks' centre lines (:func:`chunk_centres`).
        vectors: per page [L_i, D], the rows of the lines embedded so far (zeros elsewhere).
        known: per page [L_i] bool, the lines whose own passage is embedded.
    """

    retriever: str
    texts: list[list[str]]
    centres: list[list[int]]
    vectors: list[Tensor] = field(default_factory=list)
    known: list[Tensor] = field(default_factory=list)

    @classmethod
    def see(cls, retriever: Retriever, lines: Sequence[Sequence[Line]],
            stride: int = CHUNK_STRIDE) -> "LineEmbeddings":
        """Embed the chunks' passages of a context's pages (``lines``: per page its lines), in one call."""
        texts = [passage_texts(ls) for ls in lines]
        out = cls(retriever.name, texts, [chunk_centres(len(ts), stride) for ts in texts])
        out.vectors = [torch.zeros(0) for _ in texts]
        out.known = [torch.zeros(len(ts), dtype=torch.bool) for ts in texts]
        out.embed(retriever, [(p, c) for p, cs in enumerate(out.centres) for c in cs])
        return out

    @property
    def embedded(self) -> int:
        """The passages embedded so far."""
        return int(sum(int(k.sum()) for k in self.known))

    def embed(self, retriever: Retriever, wanted: Sequence[tuple[int, int]]) -> int:
        """Embed the passages of the (page, line) pairs not embedded yet, in one call; returns how many."""
        if retriever.name != self.retriever:
            raise ValueError(f"these lines were embedded by {self.retriever!r}; a {retriever.name!r} retriever cannot "
                             f"add to them (see the context again with it)")
        todo = sorted({(p, i) for p, i in wanted if not bool(self.known[p][i])})
        if not todo:
            return 0
        rows = retriever.passages([self.texts[p][i] for p, i in todo])
        for (p, i), row in zip(todo, rows):
            if not len(self.vectors[p]):
                self.vectors[p] = torch.zeros(len(self.texts[p]), rows.shape[1], dtype=rows.dtype, device=rows.device)
            self.vectors[p][i] = row
            self.known[p][i] = True
        return len(todo)

    def scores(self, retriever: Retriever, query: Tensor, refine: int | None = REFINE_CHUNKS) -> list[Tensor]:
        """Each page's lines' cosine with ``query`` ([D], L2-normalised; the question by ``retriever``): a line in one
        of the ``refine`` best chunks by its own passage (embedded now if it was not), every other line by its
        chunk's. With ``refine`` None or at least the context's chunks, every line by its own passage."""
        check_refine(refine)
        if refine is None:
            refine = sum(map(len, self.centres))
        q = query.float()

        def cosines() -> list[Tensor]:  # every page's lines against the rows embedded so far (on the CPU)
            return [(v.float() @ q).cpu() if len(v) else torch.zeros(len(ts))
                    for v, ts in zip(self.vectors, self.texts)]

        own = cosines()
        centre = [o[cs] for o, cs in zip(own, self.centres)]
        chosen = best_chunks(centre, self.centres, refine)
        wanted = [(p, i) for p, c in chosen for i in chunk_lines(c, len(self.texts[p]))]
        if self.embed(retriever, wanted):
            own = cosines()
        out = [chunk_scores(cen, len(ts), cs) for cen, ts, cs in zip(centre, self.texts, self.centres)]
        for p, i in wanted:
            out[p][i] = own[p][i]
        return out
