"""Pages read by the VLM: one prefill for any number of pages per prompt, ask over any context, one Answer type."""
import pytest
import torch
from conftest import key_pdf

from arr_coc.config import ARRConfig, CanvasConfig, TextureConfig
from arr_coc.contexts import allocate
from arr_coc.engine.pipeline import ARR
from arr_coc.engine.plan import Plan
from arr_coc.engine.query import HashingQueryEncoder
from arr_coc.engine.texture import MVP_CHANNELS
from arr_coc.vlm import Prompt, ask, decode, encode, load_vlm, prefill
from arr_coc.vlm.context import PageInput, read_context
from arr_coc.vlm.processing import all_cells, assemble, assemble_context

PREFILL_FIELDS = ("inputs_embeds", "attention_mask", "position_ids", "next_position", "visual_mask", "token_ids")


@pytest.fixture(scope="module")
def qwen():
    return load_vlm("tiny:qwen2_5_vl")


@pytest.fixture(scope="module")
def pdf(tmp_path_factory):
    return key_pdf(tmp_path_factory.mktemp("ask") / "three.pdf", 3)


def fast_arr(cell):
    return ARR(ARRConfig(canvas=CanvasConfig(cell=cell), texture=TextureConfig(channels=MVP_CHANNELS)),
               query_encoder=HashingQueryEncoder()).eval()


def page(adapter, index, hc, wc, cells, gestalt=(2, 2)):
    g = torch.Generator().manual_seed(index)
    img = torch.rand(3, hc * adapter.cell, wc * adapter.cell, generator=g)
    return PageInput(index, img, Plan("arr", "cells", (hc, wc), gestalt=gestalt, cells=torch.tensor(cells).view(-1, 2)))


def same_prefill(a, b):
    return all(torch.equal(getattr(a, n), getattr(b, n)) for n in PREFILL_FIELDS) and \
        len(a.deepstack) == len(b.deepstack) and all(torch.equal(x, y) for x, y in zip(a.deepstack, b.deepstack))


def test_read_context_reports_each_page_and_the_compression(qwen):
    pages = [page(qwen, 0, 4, 5, [[0, 0], [3, 4]]), page(qwen, 6, 3, 3, []), page(qwen, 13, 5, 2, [[4, 1]])]
    a = read_context(qwen, pages, "Which page?", text_tokens=100, tokenizer="chars", max_new_tokens=3)
    assert [(p.index, p.gestalt_tokens, p.saccades, p.full_tokens) for p in a.pages] == [
        (0, 4, 2, 20), (6, 4, 0, 9), (13, 4, 1, 10)]
    assert (a.visual_tokens, a.full_tokens, a.compression) == (15, 39, 100 / 15)
    assert 0 < a.flops["total"] < a.flops_full["total"] and len(a.tokens) <= 3
    js = a.to_json()
    assert js["tokens"]["compression"] == round(100 / 15, 3) and js["pages"][1] == {
        "page": 7, "gestalt": 4, "saccades": 0, "full_resolution": 9, "kind": "cells", "encoding": "sparse",
        "grid": [3, 3], "gestalt_grid": [2, 2], "positions": []}
    assert js["pages"][0]["positions"] == [[0, 0], [3, 4]] and js["tokens"]["sent"] == js["tokens"]["visual"] == 15
    # the same answer from the stages by hand: one prefill of the three pages
    vis = encode(qwen, [p.plan for p in pages], [p.image for p in pages])
    tokens, _ = decode(qwen, prefill(qwen, [vis], [qwen.prompt_segments("Which page?", 3)]), max_new_tokens=3)
    assert a.tokens == tokens[0, :len(a.tokens)].tolist()


def test_a_one_page_context_answers_as_the_one_image_path(qwen):
    one = page(qwen, 2, 4, 4, [[1, 1], [2, 3]])
    a = read_context(qwen, [one], "Total?", max_new_tokens=4)
    vis = encode(qwen, [one.plan], [one.image])
    tokens, _ = decode(qwen, prefill(qwen, vis, [qwen.prompt_ids("Total?")]), max_new_tokens=4)
    assert a.tokens == tokens[0, :len(a.tokens)].tolist() and a.compression is None
    assert a.cells.tolist() == [[1, 1], [2, 3]] and a.squares is None and a.plan is one.plan
    full = PageInput(2, one.image, Plan("every cell", "cells", (4, 4), cells=all_cells(4, 4)))
    assert [(p.gestalt_tokens, p.saccades) for p in read_context(qwen, [full], "Total?", max_new_tokens=1).pages] \
        == [(0, 16)]


def test_read_context_refuses_no_pages(qwen):
    with pytest.raises(ValueError, match="a context needs at least one page"):
        read_context(qwen, [], "Q?")


def test_prefill_of_one_page_is_the_old_one_image_prefill_exactly(qwen):
    one = page(qwen, 4, 5, 4, [[4, 3], [0, 1], [2, 2]])
    vis = encode(qwen, [one.plan], [one.image])
    pre, suf = qwen.prompt_ids("Total?")
    # the old one-image prefill's whole computation: assemble of the prefix, the image and the suffix
    old = assemble(qwen.embed_tokens, [pre], vis, [suf], qwen.rope_rows)
    for new in (prefill(qwen, vis, [(pre, suf)]), prefill(qwen, [vis], [[pre, suf]])):  # a page, or a list of one
        assert same_prefill(new.prefill, old) and new.prompts == [[pre, suf]] and new.first_look is None
    # negative controls: the same saccades in another order, and another question, give another prompt
    other = replace_cells(one, [[0, 1], [4, 3], [2, 2]])
    moved = prefill(qwen, encode(qwen, [other.plan], [other.image]), [(pre, suf)]).prefill
    asked = prefill(qwen, vis, [qwen.prompt_ids("Date?")]).prefill
    assert not torch.equal(moved.inputs_embeds, old.inputs_embeds) and not torch.equal(asked.token_ids, old.token_ids)


def replace_cells(p, cells):
    from dataclasses import replace

    return PageInput(p.index, p.image, replace(p.plan, cells=torch.tensor(cells)))


def test_one_prefill_batches_prompts_of_any_page_counts(qwen):
    pages = [page(qwen, i, 3 + i, 4, [[0, 0], [2, 3]]) for i in range(3)]
    vis = encode(qwen, [p.plan for p in pages], [p.image for p in pages])
    groups, questions = [vis[:1], vis[1:]], ["Date?", "Which total is larger?"]
    runs = [qwen.prompt_segments(q, len(g)) for q, g in zip(questions, groups)]
    batch = prefill(qwen, groups, runs)
    assert batch.prompts == runs
    assert same_prefill(batch.prefill, assemble_context(qwen.embed_tokens, runs, groups, qwen.rope_rows))
    tokens, _ = decode(qwen, batch, max_new_tokens=3)
    for b, (g, r) in enumerate(zip(groups, runs)):
        alone, _ = decode(qwen, prefill(qwen, [g], [r]), max_new_tokens=3)
        assert alone[0].tolist() == tokens[b].tolist()


def test_ask_on_a_pdf_is_the_context_allocation_read_as_one_prompt(qwen, pdf):
    arr, q = fast_arr(qwen.cell), "Where is the key?"
    a = ask(qwen, str(pdf), q, arr=arr, budget="120", max_new_tokens=4)
    # the read_context path by hand: the context's allocation, its pages encoded, one multi-image prompt, decoded
    alloc = allocate(arr, str(pdf), q, 120)
    vis = encode(qwen, [p.plan for p in alloc.pages], [p.image for p in alloc.pages])
    runs = qwen.prompt_segments(q, 3)
    tokens, _ = decode(qwen, Prompt(assemble_context(qwen.embed_tokens, [runs], [vis], qwen.rope_rows), [runs]),
                       max_new_tokens=4)
    assert a.tokens == tokens[0, :len(a.tokens)].tolist()
    assert [(p.index, p.gestalt_tokens, p.saccades) for p in a.pages] == [
        (p.index, p.gestalt_tokens, p.saccades) for p in alloc.pages]
    assert [p.cells.tolist() for p in a.pages] == [p.plan.cells.tolist() for p in alloc.pages]
    assert (a.visual_tokens, a.text_tokens, a.source) == (120, alloc.text_tokens, str(pdf)) and a.text_tokens > 0
    assert a.compression == alloc.text_tokens / 120 and a.full_tokens == alloc.full_tokens
    # negative control: another budget places other saccades (and sends its own total)
    b = ask(qwen, str(pdf), q, arr=arr, budget="80", max_new_tokens=1)
    assert b.visual_tokens == 80 and [p.saccades for p in b.pages] != [p.saccades for p in a.pages]


def test_ask_over_a_context_takes_a_share_and_saccades(qwen, pdf):
    arr, q = fast_arr(qwen.cell), "Where is the key?"
    share = ask(qwen, pdf, q, arr=arr, budget="25%", max_new_tokens=1, pages="1-2")
    assert [p.index for p in share.pages] == [0, 1] and share.visual_tokens == round(0.25 * share.full_tokens)
    k = ask(qwen, pdf, q, arr=arr, saccades=30, max_new_tokens=1)
    # 3 pages x 2x2 fit in 30 but a side below 8 over several pages is sent as 1x1 (budget.LEGIBLE_SIDE)
    assert k.saccades == 30 and len(k.pages) == 3 and k.gestalt_tokens == 3 * 1


def test_a_batch_of_an_image_and_a_pdf_answers_each_as_alone(qwen, pdf, receipt):
    arr, qs = fast_arr(qwen.cell), ["What is the total?", "Where is the key?"]
    both = ask(qwen, [str(receipt), str(pdf)], qs, arr=arr, saccades=24, max_new_tokens=3)
    alone = [ask(qwen, c, q, arr=arr, saccades=24, max_new_tokens=3) for c, q in zip([str(receipt), str(pdf)], qs)]
    assert [len(a.pages) for a in both] == [1, 3] and both[1].text_tokens is not None and both[0].text_tokens is None
    for x, y in zip(both, alone):
        assert (x.tokens, x.question) == (y.tokens, y.question)
        assert [p.cells.tolist() for p in x.pages] == [p.cells.tolist() for p in y.pages]
    assert both[0].saccades == 24 and both[1].saccades == 24


@pytest.mark.parametrize("kwargs, refused", [
    (dict(mode="slice"), "--mode slice (mode=)"), (dict(gestalt=False), "--no-gestalt (gestalt=False)"),
    (dict(allocator="quadtree"), "--allocator quadtree (allocator=)"), (dict(relevance="vlm"), "--relevance vlm"),
])
def test_ask_refuses_what_acts_on_one_image_for_a_context_in_one_line(qwen, pdf, kwargs, refused):
    with pytest.raises(ValueError) as err:
        ask(qwen, pdf, "Where?", arr=fast_arr(qwen.cell), max_new_tokens=1, **kwargs)
    assert str(err.value) == ("a context (several pages) is allocated by one ranking over its pages' cells and sent "
                              f"sparse with a gestalt per page; drop {refused}" + (" (relevance=)" if "vlm" in refused
                                                                                   else ""))


def test_a_batch_needs_one_question_per_context(qwen, receipt):
    with pytest.raises(ValueError, match=r"^got 2 questions for 3 contexts; pass one question, or a list of contexts"):
        ask(qwen, [receipt, receipt, receipt], ["a?", "b?"])


def test_an_image_given_a_total_is_the_image_path_at_that_split(qwen, receipt):
    from dataclasses import replace

    from arr_coc.config import GestaltConfig

    arr, q = fast_arr(qwen.cell), "What is the total?"
    total = ask(qwen, receipt, q, arr=arr, budget="192", max_new_tokens=3)
    # the image path with the split by hand: 192 tokens on 53 x 35 cells are an 8x8 gestalt + 128 saccades
    split = ARR(replace(arr.config, gestalt=GestaltConfig(grid=(8, 8))), query_encoder=HashingQueryEncoder()).eval()
    by_hand = ask(qwen, receipt, q, arr=split, saccades=128, max_new_tokens=3)
    assert (total.gestalt_tokens, total.saccades, total.visual_tokens) == (64, 128, 192)
    assert total.cells.tolist() == by_hand.cells.tolist() and total.tokens == by_hand.tokens
    assert total.plan.gestalt == by_hand.plan.gestalt == (8, 8)
    # one token more is one saccade more (the gestalt stays 8x8), the first 128 where they were
    more = ask(qwen, receipt, q, arr=arr, budget="193", max_new_tokens=1)
    assert more.saccades == 129 and more.cells[:128].tolist() == total.cells.tolist()
