"""A context's lines embedded coarse to fine: a third of the passages when seen, the best chunks refined per question,
each refined line scored exactly as with every passage embedded."""
import pytest
import torch

from arr_coc.contexts.line_embeddings import REFINE_CHUNKS, LineEmbeddings, best_chunks, chunk_centres, chunk_lines
from arr_coc.contexts.ranking import line_scores, passage_texts
from arr_coc.engine.retrieval import HashingRetriever, load_retriever

TOPICS = ["the page margins", "a table of fonts", "the bibliography style", "hyphenation patterns",
          "colour in headings", "the index of commands", "footnote numbering", "the title page layout"]


def pages(n_pages: int = 3, per_page: int = 17) -> list[list]:
    """Lines of a made-up manual: each page a few topics, every line distinct."""
    out = []
    for p in range(n_pages):
        out.append([(f"Section {p}.{i}: {TOPICS[(p + i) % len(TOPICS)]} option {p * per_page + i}",
                     (20.0 * i, 0.0, 20.0 * i + 14, 500.0)) for i in range(per_page)])
    out.insert(1, [])  # a page without lines
    return out


class Counting:
    """A retriever that records the passages it is asked to embed."""

    def __init__(self, inner):
        self.inner, self.name, self.embedded = inner, inner.name, []

    def queries(self, texts):
        return self.inner.queries(texts)

    def passages(self, texts):
        self.embedded.extend(texts)
        return self.inner.passages(texts)


@pytest.fixture(scope="module")
def bge():
    return load_retriever("bge-small")


def full_scores(retriever, lines, query):
    """Every line's own passage embedded, in one call (what the ranking read before coarse to fine)."""
    return line_scores([retriever.passages(passage_texts(ls)) if ls else None for ls in lines], query)


def test_chunks_read_every_line_once_and_the_best_are_taken_in_order():
    for n in range(0, 40):
        covered = [i for c in chunk_centres(n) for i in chunk_lines(c, n)]
        assert sorted(set(covered)) == list(range(n))  # every line in a chunk
        assert n / 3 <= len(chunk_centres(n)) <= n / 3 + 1  # a third of the passages
    assert best_chunks([torch.tensor([0.5, 0.9]), torch.tensor([]), torch.tensor([0.7])], [[1, 4], [], [0]], 5) == [
        (0, 4), (2, 0), (0, 1)]


def test_seeing_embeds_a_third_and_a_question_its_best_chunks_only_once(bge):
    lines = pages()
    r = Counting(bge)
    emb = LineEmbeddings.see(r, lines)
    centres = [chunk_centres(len(ls)) for ls in lines]
    assert r.embedded == [passage_texts(ls)[c] for ls, cs in zip(lines, centres) for c in cs]  # the centres, once
    assert emb.embedded == sum(map(len, centres)) == 18 < 51
    r.embedded.clear()
    q = bge.queries(["How wide are the margins?"])[0]
    emb.scores(r, q, refine=2)
    assert 0 < len(r.embedded) <= 4  # two chunks: at most their four other lines
    assert emb.embedded == 18 + len(r.embedded)
    r.embedded.clear()
    emb.scores(r, q, refine=2)
    assert r.embedded == []  # the same question again: nothing new


def test_refined_lines_score_exactly_as_every_passage_embedded_and_the_rest_by_their_chunk(bge):
    lines = pages()
    q = bge.queries(["Which fonts are listed?"])[0]
    full = full_scores(bge, lines, q)
    every = LineEmbeddings.see(bge, lines).scores(bge, q, refine=REFINE_CHUNKS)  # 18 chunks <= 128: all refined
    assert all(torch.equal(a, b) for a, b in zip(every, full))  # the same bits
    emb = LineEmbeddings.see(bge, lines)
    few = emb.scores(bge, q, refine=1)
    (p, c), = best_chunks([f[cs] for f, cs in zip(full, emb.centres)], emb.centres, 1)  # the best chunk by centres
    inside = list(chunk_lines(c, len(lines[p])))
    assert torch.equal(few[p][inside], full[p][inside])  # the best chunk's lines by their own passage
    others = [(pp, i) for pp, ls in enumerate(lines) for i in range(len(ls)) if (pp, i) not in {(p, j) for j in inside}]
    moved = [(pp, i) for pp, i in others if few[pp][i] != full[pp][i]]
    assert moved  # the control: the others are scored by their chunk's centre, not their own passage
    for pp, i in others:
        centre = next(cc for cc in emb.centres[pp] if i in chunk_lines(cc, len(lines[pp])))
        assert few[pp][i] >= full[pp][centre]  # at least their chunk's centre (the best chunk reading it)
    assert few[1].shape == (0,)  # the page without lines


def test_refine_none_reads_every_line_by_its_own_passage_beyond_the_default_chunks():
    lines = pages(3, 150)  # 150 chunks: more than the default refines
    r = HashingRetriever()
    q = r.queries(["Which fonts are in the table?"])[0]
    full = full_scores(r, lines, q)
    assert sum(len(chunk_centres(len(ls))) for ls in lines) > REFINE_CHUNKS
    every = LineEmbeddings.see(r, lines).scores(r, q, refine=None)
    assert all(torch.equal(a, b) for a, b in zip(every, full))
    default = LineEmbeddings.see(r, lines).scores(r, q)  # the control: 128 chunks leave some lines to their chunk
    assert not all(torch.equal(a, b) for a, b in zip(default, full))


def test_questions_in_any_order_get_the_same_scores(bge):
    lines = pages()
    qs = [bge.queries([t])[0] for t in ("Which fonts are listed?", "How are footnotes numbered?")]
    a, b = LineEmbeddings.see(bge, lines), LineEmbeddings.see(bge, lines)
    forward = [a.scores(bge, q, refine=3) for q in qs]
    backward = [b.scores(bge, q, refine=3) for q in reversed(qs)][::-1]
    assert all(torch.equal(x, y) for f, g in zip(forward, backward) for x, y in zip(f, g))


def test_another_retriever_and_a_negative_refine_are_refused():
    lines = pages(1, 6)
    emb = LineEmbeddings.see(HashingRetriever(), lines)
    with pytest.raises(ValueError, match=r"these lines were embedded by 'hashing'; a 'bge-small' retriever cannot"):
        emb.embed(load_retriever("bge-small"), [(0, 0)])
    with pytest.raises(ValueError, match=r"refine must be a number of chunks >= 0 \(None: every line\), got -1$"):
        emb.scores(HashingRetriever(), HashingRetriever().queries(["margins"])[0], refine=-1)


def test_allocate_takes_refine_a_seen_context_as_a_fresh_one_and_refuses_a_bad_one_in_one_line():
    from arr_coc import ARR
    from arr_coc.contexts import allocate, see_context
    from arr_coc.documents.text_pages import TextLayout, render_text
    from arr_coc.engine.query import HashingQueryEncoder

    text = "\n".join(f"{TOPICS[i % len(TOPICS)]} is set by option {i} in section {i // 4}" for i in range(60))
    ctx = render_text(text, TextLayout(size=14, width=560, height=448, margin=14))
    q = "Which option sets the bibliography style?"

    def cells(context, refine, retriever=None):
        arr = ARR(query_encoder=HashingQueryEncoder(), retriever=retriever).eval()
        out = allocate(arr, context(arr) if callable(context) else context, q, 60, refine=refine)
        assert out.tokens == 60
        return [p.plan.cells.tolist() for p in out.pages]

    r = Counting(HashingRetriever())
    every = cells(lambda arr: see_context(arr, ctx), None, r)
    n_lines = sum(len(p.lines) for p in ctx.pages)
    assert len(r.embedded) == n_lines  # None: every line's own passage, the see's third and the rest at the question
    assert every == cells(ctx, None) == cells(ctx, REFINE_CHUNKS)  # seen or not; every chunk refined: the same
    coarse = cells(lambda arr: see_context(arr, ctx), 0)
    assert coarse == cells(ctx, 0)
    assert coarse != every  # the control: chunks alone place the saccades elsewhere
    for bad in (-1, 2.5, True, "all"):
        with pytest.raises(ValueError, match=r"^refine must be a number of chunks >= 0 \(None: every line\), got "):
            allocate(ARR(query_encoder=HashingQueryEncoder()), ctx, q, 60, refine=bad)
