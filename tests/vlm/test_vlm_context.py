"""A context read by the VLM: pages' plans in one multi-image prompt, what each page sent, the compression ratio."""
import pytest
import torch

from arr_coc.engine.plan import Plan
from arr_coc.vlm import decode, encode, load_vlm, prefill
from arr_coc.vlm.context import PageInput, read_context
from arr_coc.vlm.processing import all_cells
from arr_coc.vlm.stages import prefill_context


@pytest.fixture(scope="module")
def qwen():
    return load_vlm("tiny:qwen2_5_vl")


def page(adapter, index, hc, wc, cells, gestalt=(2, 2)):
    g = torch.Generator().manual_seed(index)
    img = torch.rand(3, hc * adapter.cell, wc * adapter.cell, generator=g)
    return PageInput(index, img, Plan("arr", "cells", (hc, wc), gestalt=gestalt, cells=torch.tensor(cells).view(-1, 2)))


def test_read_context_reports_each_page_and_the_compression(qwen):
    pages = [page(qwen, 0, 4, 5, [[0, 0], [3, 4]]), page(qwen, 6, 3, 3, []), page(qwen, 13, 5, 2, [[4, 1]])]
    a = read_context(qwen, pages, "Which page?", text_tokens=100, tokenizer="chars", max_new_tokens=3)
    assert [(p.index, p.gestalt_tokens, p.saccades, p.full_tokens) for p in a.pages] == [
        (0, 4, 2, 20), (6, 4, 0, 9), (13, 4, 1, 10)]
    assert (a.visual_tokens, a.full_tokens, a.compression) == (15, 39, 100 / 15)
    assert 0 < a.flops["total"] < a.flops_full["total"] and len(a.tokens) <= 3
    js = a.to_json()
    assert js["tokens"]["compression"] == round(100 / 15, 3) and js["pages"][1] == {
        "page": 7, "gestalt": 4, "saccades": 0, "full_resolution": 9}
    # the same answer from the stages by hand
    vis = encode(qwen, [p.plan for p in pages], [p.image for p in pages])
    tokens, _ = decode(qwen, prefill_context(qwen, [vis], [qwen.prompt_segments("Which page?", 3)]),
                       max_new_tokens=3)
    assert a.tokens == tokens[0, :len(a.tokens)].tolist()


def test_a_one_page_context_answers_as_the_one_image_path(qwen):
    one = page(qwen, 2, 4, 4, [[1, 1], [2, 3]])
    a = read_context(qwen, [one], "Total?", max_new_tokens=4)
    vis = encode(qwen, [one.plan], [one.image])
    tokens, _ = decode(qwen, prefill(qwen, vis, [qwen.prompt_ids("Total?")]), max_new_tokens=4)
    assert a.tokens == tokens[0, :len(a.tokens)].tolist() and a.compression is None
    full = PageInput(2, one.image, Plan("every cell", "cells", (4, 4), cells=all_cells(4, 4)))
    assert [(p.gestalt_tokens, p.saccades) for p in read_context(qwen, [full], "Total?", max_new_tokens=1).pages] \
        == [(0, 16)]


def test_read_context_refuses_no_pages(qwen):
    with pytest.raises(ValueError, match="a context needs at least one page"):
        read_context(qwen, [], "Q?")
