import pytest
import torch
from tolerances import assert_close_reduction

from arr_coc.engine.query import HashingQueryEncoder, MiniLMQueryEncoder, QueryEncoder, check_queries
from arr_coc.registry import Registry


def test_hashing_encoder_is_deterministic_normalised_and_word_sensitive():
    enc = HashingQueryEncoder()
    a, b, c = enc.encode(["What is the total?", "what is the TOTAL", "Where is the dog?"])
    assert torch.equal(a, b)
    torch.testing.assert_close(a.norm(), torch.tensor(1.0))
    assert not torch.equal(a, c)
    assert isinstance(enc, QueryEncoder)


def test_one_question_is_broadcast_to_the_batch():
    assert check_queries("Date?", 3) == ["Date?"] * 3


@pytest.mark.parametrize("queries, match", [
    ("", "question 0 is empty"),
    (["ok", "   "], "question 1 is empty"),
    (["a", "b", "c"], "got 3 questions for 2 images"),
    (["a", 3], "question 1 is int, expected str"),
])
def test_bad_questions_raise(queries, match):
    with pytest.raises((ValueError, TypeError), match=match):
        check_queries(queries, 2)


def test_registry_rejects_duplicates_and_lists_known_names():
    r = Registry("thing")
    r.register("a")(1)
    with pytest.raises(ValueError, match="thing 'a' is already registered"):
        r.register("a")(2)
    with pytest.raises(KeyError, match="unknown thing 'b'; known: a"):
        r.get("b")
    assert "a" in r and len(r) == 1 and list(r) == ["a"]


@pytest.mark.slow
def test_minilm_embeds_offline_caches_and_ranks_paraphrases_closer():
    enc = MiniLMQueryEncoder()
    e = enc.encode(["What is the total amount?", "How much is the total?", "Where is the cat?"])
    assert e.shape == (3, 384)
    assert_close_reduction(e.norm(dim=1), torch.ones(3), reduction_len=e.shape[1], depth=3)  # norm, divide, norm
    assert e[0] @ e[1] > e[0] @ e[2] + 0.2
    model = enc._model
    again = enc.encode(["Where is the cat?"])
    assert enc._model is model and torch.equal(again[0], e[2])  # served from the cache
    enc.max_cached = 2
    enc.encode(["What is the total amount?", "a new question"])  # the cat question is least recent
    assert list(enc._cache) == ["What is the total amount?", "a new question"]


@pytest.mark.slow
def test_minilm_loads_without_network_and_leaves_the_environment_alone(monkeypatch):
    import os
    import socket

    def no_network(*args, **kwargs):
        raise OSError("network access attempted")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    before = dict(os.environ)
    e = MiniLMQueryEncoder().encode(["What is the total?"])
    assert e.shape == (1, 384)
    assert dict(os.environ) == before  # a later hub download in this process is not disabled


def test_checked_questions_pass_later_stages_as_they_are_and_only_under_a_rule_they_meet(monkeypatch):
    from arr_coc.engine import query

    q = query.check_queries(["What is the total?", "Who sold it?"], 2)
    calls = []
    monkeypatch.setattr(query, "count_tokens", lambda text, tokenizer=None: calls.append(text) or 4)
    assert query.check_queries(q, 2) is q and query.check_queries(q, 2, 200) is q and calls == []  # no re-check
    # a stricter limit, another batch or a tokenizer it was not counted with: checked again
    assert query.check_queries(q, 2, 64) is not q and len(calls) == 2
    with pytest.raises(ValueError, match="got 2 questions for 3 images"):
        query.check_queries(q, 3)
    assert query.check_queries(q, 2, tokenizer=object()) is not q and len(calls) == 4


LINES = ["Total", "The quick brown fox jumps over the lazy dog near the river bank at dawn", "Date: 9/3/92",
         "pdfrender sets the rendering mode of the text that follows", "v1.6", "See also section 2"]


@pytest.mark.slow
def test_minilm_batch_size_runs_fewer_texts_at_once_the_same_vectors_within_float_noise():
    default, small = MiniLMQueryEncoder(), MiniLMQueryEncoder(batch_size=2)
    small._model = default.load()._model  # one model
    runs = []
    real = default._model.forward
    default._model.forward = lambda features, **kw: runs.append(tuple(features["input_ids"].shape)) or real(features, **kw)
    try:
        a = default.encode(LINES)
        assert len(runs) == 1  # the default: one padded batch
        b = small.encode(LINES)
    finally:
        del default._model.forward
    padded = [n * t for n, t in runs]  # [texts, tokens] per run: the tokens run, padding included
    assert [r[0] for r in runs[1:]] == [2, 2, 2] and sum(padded[1:]) < padded[0]  # runs of similar lengths pad less
    assert_close_reduction(b, a, reduction_len=384, depth=12)  # the same vectors up to float rounding
    assert not torch.equal(a[0], b[1])  # control: the comparison tells lines apart
    one = MiniLMQueryEncoder(batch_size=len(LINES))
    one._model = default._model
    assert torch.equal(one.encode(LINES), a)  # a batch that holds them all: the default's bits


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "16"])
def test_minilm_batch_size_must_be_a_positive_integer(bad):
    with pytest.raises(ValueError, match=f"batch_size must be a positive integer .*got {bad!r}"):
        MiniLMQueryEncoder(batch_size=bad)
