"""The staged VLM path: ask is allocate, encode, prefill and decode in a row, and each stage is usable alone."""
import pytest
import torch
from tolerances import VLM_ATTENTION, VLM_EMBEDS, assert_close_reduction, assert_far

from arr_coc import contexts
from arr_coc.budget import Budget
from arr_coc.config import ARRConfig, CanvasConfig, TextureConfig
from arr_coc.engine.pipeline import ARR
from arr_coc.engine.plan import Plan
from arr_coc.engine.query import HashingQueryEncoder
from arr_coc.engine.samplers import SAMPLERS, select
from arr_coc.engine.texture import MVP_CHANNELS
from arr_coc.vlm import allocate, ask, decode, encode, load_vlm, prefill
from arr_coc.vlm.allocation import read_first_look
from arr_coc.vlm.processing import all_cells


@pytest.fixture(scope="module")
def qwen():
    return load_vlm("tiny:qwen2_5_vl")


def fast_arr(cell):
    return ARR(ARRConfig(canvas=CanvasConfig(cell=cell), texture=TextureConfig(channels=MVP_CHANNELS)),
               query_encoder=HashingQueryEncoder()).eval()


def small_image(adapter, hc=6, wc=8, seed=0):
    return torch.rand(3, hc * adapter.cell, wc * adapter.cell, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("relevance", ["arr", "vlm"])
def test_ask_is_the_four_stages_in_a_row(qwen, relevance):
    arr, qs = fast_arr(qwen.cell), ["Total?", "Date?"]
    imgs = [small_image(qwen, seed=1), small_image(qwen, 5, 4, seed=2)]
    answers = ask(qwen, imgs, qs, arr=arr, saccades=6, relevance=relevance, max_new_tokens=4)
    planned = allocate(qwen, imgs, qs, saccades=6, arr=arr, relevance=relevance)
    assert [p.kind for p in planned.plans] == ["cells", "cells"] and [p.saccades for p in planned.plans] == [6, 6]
    assert [p.grid for p in planned.plans] == [(6, 8), (5, 4)] and (planned.first_look is not None) == (relevance == "vlm")
    visual = encode(qwen, planned.plans, planned.images, encoded=planned.gestalt_tokens)
    tokens, _ = decode(qwen, prefill(qwen, visual, planned.prompts, first_look=planned.first_look), max_new_tokens=4)
    for b, a in enumerate(answers):
        assert a.tokens == tokens[b, :len(a.tokens)].tolist()
        assert a.plan.cells.tolist() == planned.plans[b].cells.tolist()
        assert (a.gestalt_tokens, a.saccades) == (planned.plans[b].gestalt_tokens, 6)


def test_the_first_look_and_the_registrys_vlm_method_choose_what_allocate_chose(qwen):
    arr, img, q = fast_arr(qwen.cell), small_image(qwen, seed=3), "What is the total?"
    planned = allocate(qwen, img, q, saccades=7, arr=arr, relevance="vlm")
    seen = read_first_look(qwen, [img], [(2, 2)], [q])
    rel, valid = seen.cell_maps([(6, 8)])[0][None], torch.ones(1, 6, 8, dtype=torch.bool)
    assert_close_reduction(seen.attention[0], planned.first_look.attention[0], **VLM_ATTENTION)
    chosen = planned.plans[0].cells.tolist()
    assert select(arr.sampler, rel, 7, valid=valid, seed=arr.config.seed).positions[0].tolist() == chosen
    assert planned.plans[0].method == "vlm" and planned.plans[0].gestalt == (2, 2)  # the registry's first-look method
    # negative control: another sampler on the same map spreads the saccades elsewhere
    uniform = select(SAMPLERS.get("uniform")(), rel, 7, valid=valid, seed=arr.config.seed).positions[0].tolist()
    assert uniform != chosen
    # a sampler's name is that sampler on the first look (the registry's method of that name), with the ARR's seed
    other = allocate(qwen, img, q, saccades=7, arr=arr, relevance="vlm", allocator="uniform")
    assert other.plans[0].cells.tolist() == uniform and other.plans[0].method == "uniform"
    with pytest.raises(ValueError, match="sampler 'uniform' runs on the first look \\(relevance 'vlm'\\); with "
                                         "relevance 'arr' ARR samples with its own"):
        allocate(qwen, img, q, saccades=7, arr=arr, relevance="arr", allocator="uniform")


def test_the_images_arr_plans_are_the_context_allocations_of_one_page_each(qwen):
    """One allocation path: each image's plan is what contexts.allocate gives it as a one-page context, the batch
    scored in one ARR pass; a total budget is split by the context rule on its page."""
    arr = fast_arr(qwen.cell)
    imgs, qs = [small_image(qwen, seed=4), small_image(qwen, 5, 4, seed=5)], ["Total?", "Date?"]
    for budget in (dict(saccades=6), dict(budget=Budget.parse("40"))):
        planned = allocate(qwen, imgs, qs, arr=arr, **budget)
        spec = budget.get("budget", Budget.saccades(6))
        for b, (img, q) in enumerate(zip(imgs, qs)):
            alone = contexts.allocate(arr, img, q, spec).pages[0]
            assert planned.plans[b].cells.tolist() == alone.plan.cells.tolist()
            assert planned.plans[b].gestalt == alone.plan.gestalt and planned.plans[b].tokens == alone.plan.tokens
    # 40 tokens on 6x8 cells: a 4x4 gestalt + 24; the 5x4-cell image holds 20 cells: a 2x2 gestalt + 16
    assert [p.tokens for p in planned.plans] == [40, 20] and [p.gestalt for p in planned.plans] == [(4, 4), (2, 2)]
    # negative control: another image of the same size, asked the same, places other saccades
    swapped = contexts.allocate(arr, small_image(qwen, seed=6), qs[0], Budget.parse("40")).pages[0].plan.cells.tolist()
    assert swapped != planned.plans[0].cells.tolist()


def test_encode_batches_plans_of_every_kind_and_keeps_their_order(qwen):
    imgs = [small_image(qwen, 4, 5, seed=s) for s in range(4)]
    cells, squares = torch.tensor([[3, 4], [0, 0]]), torch.tensor([[0, 0, 2], [3, 4, 1]])
    plans = [Plan("a", "squares", (4, 5), gestalt=(2, 2), squares=squares),
             Plan("b", "cells", (4, 5), gestalt=(2, 2), cells=cells),
             Plan("c", "full", (4, 5)),
             Plan("d", "cells", (4, 5), cells=cells, encoding="slice")]
    out = encode(qwen, plans, imgs, layout="temporal")
    refs = [qwen.encode_patches([imgs[0]], [squares], gestalt=[(2, 2)], layout="temporal")[0],
            qwen.encode([imgs[1]], [cells], gestalt=[(2, 2)], layout="temporal")[0],
            qwen.encode_native([imgs[2]])[0],
            qwen.encode([imgs[3]], [cells], mode="slice", layout="temporal")[0]]
    assert [len(v) for v in out] == [6, 6, 20, 2]
    for v, r in zip(out, refs):
        atol = assert_close_reduction(v.embeds, r.embeds, **VLM_EMBEDS)
        assert v.positions.tolist() == r.positions.tolist()
    # negative control: the plans' images swapped give other tokens
    assert_far(encode(qwen, plans[1:2], imgs[:1])[0].embeds, out[1].embeds, atol=atol)


def test_encode_refuses_what_its_plans_lack_in_one_line(qwen):
    img = small_image(qwen, 3, 4)
    weighted = Plan("w", "full", (3, 4), cells=torch.tensor([[0, 0]]), encoding="weighted")
    with pytest.raises(ValueError, match="a weighted plan needs weights= \\(a \\[Hc, Wc\\] map per image\\)"):
        encode(qwen, [weighted], [img])
    unit = encode(qwen, [weighted], [img], weights=[torch.ones(3, 4)])[0]
    assert_close_reduction(unit.embeds, qwen.encode([img], [all_cells(3, 4)], mode="slice")[0].embeds, **VLM_EMBEDS)
    with pytest.raises(ValueError, match="need one plan, image .* per image, got 1 plans and 2 images"):
        encode(qwen, [weighted], [img, img])
    with pytest.raises(ValueError, match="unknown plan encoding 'dense'"):
        Plan("x", "cells", (3, 4), cells=torch.tensor([[0, 0]]), encoding="dense")
