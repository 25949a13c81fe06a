"""The registry of allocation methods: every method's Plan at a token count, what it declares, how readers render it."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from arr_coc.allocators.methods import (
    METHODS,
    MethodInputs,
    build_samplers,
    cell_mask,
    make_plan,
    methods_for,
    square_sizes,
)
from arr_coc.allocators.patches import render_patches
from arr_coc.allocators.patching import PATCHERS, edge_density
from arr_coc.budget import Budget
from arr_coc.engine.canvas import make_canvas
from arr_coc.engine.plan import Plan
from arr_coc.engine.samplers import SAMPLERS, select, topk_cells
from arr_coc.engine.views import downsampled_view, foveated_view, gestalt_view
from arr_coc.eval.reading import render, rendered_tokens

CELL = 28


@pytest.fixture(scope="module")
def inputs() -> MethodInputs:
    torch.manual_seed(0)
    canvas = make_canvas(torch.rand(1, 3, 20 * CELL, 14 * CELL), cell=CELL, min_pixels=1, max_pixels=10**8)
    assert canvas.grid == (20, 14)
    relevance = torch.rand(canvas.valid.shape)
    maps = {"selector": torch.rand(canvas.valid.shape), "pruner": torch.rand(canvas.valid.shape)}
    return MethodInputs(canvas, relevance, torch.rand(1, 384), sampler=SAMPLERS.get("stratified")(), sampler_seed=5,
                        samplers=build_samplers(METHODS.names()), maps=maps, vlm_relevance=-relevance, seed=3)


def test_every_method_plans_exactly_the_tokens_it_is_given(inputs):
    total = 100
    (grid,), k = Budget.parse(total).split([inputs.grid])
    assert (grid, k) == ((6, 6), 64)
    for name in (n for n in METHODS.names() if "image" in METHODS.get(n).scopes):
        plan = make_plan(name, inputs, total)
        assert isinstance(plan, Plan) and plan.method == name and plan.grid == (20, 14), name
        if plan.kind == "full":
            assert plan.tokens == 280 and not METHODS.get(name).per_tokens
        elif plan.kind == "native":
            assert plan.native == total and name in ("uniform_image", "native_budget")
        elif plan.kind == "cells":
            assert plan.gestalt == (6, 6) and plan.tokens == total and plan.saccades == k, name
        else:  # squares: at most K, one token each
            assert plan.gestalt == (6, 6) and 36 < plan.tokens <= total, name


def test_each_method_is_the_sampler_or_map_it_declares(inputs):
    (grid,), k = Budget.parse(100).split([inputs.grid])
    valid = inputs.canvas.valid
    topk = make_plan("topk", inputs, 100)
    assert torch.equal(topk.cells, topk_cells(inputs.relevance, k, valid).positions[0])
    # the ARR's sampler with its own seed, the named samplers with the record's
    arr = select(inputs.sampler, inputs.relevance, k, valid=valid, query_emb=inputs.query_emb, seed=5)
    assert torch.equal(make_plan("arr", inputs, 100).cells, arr.positions[0])
    random = make_plan("random", inputs, 100).cells
    assert torch.equal(random, select(SAMPLERS.get("random")(), inputs.relevance, k, valid=valid, seed=3).positions[0])
    assert not torch.equal(random, select(SAMPLERS.get("random")(), inputs.relevance, k, valid=valid, seed=4).positions[0])
    # vlm: the ARR's sampler on the first look passed in; slice: arr's cells, encoded otherwise
    vlm = make_plan("vlm", inputs, 100)
    look = select(inputs.sampler, inputs.vlm_relevance, k, valid=valid, query_emb=inputs.query_emb, seed=5)
    assert torch.equal(vlm.cells, look.positions[0]) and not torch.equal(vlm.cells, arr.positions[0])
    sliced = make_plan("slice", inputs, 100)
    assert torch.equal(sliced.cells, arr.positions[0]) and (sliced.encoding, vlm.encoding) == ("slice", "sparse")
    for name in ("selector", "pruner"):
        assert torch.equal(make_plan(name, inputs, 100).cells, topk_cells(inputs.maps[name], k, valid).positions[0])
    squares = PATCHERS.get("quadtree")(inputs.relevance, k, valid=valid)
    assert torch.equal(make_plan("quadtree", inputs, 100).squares, squares.boxes[0][: int(squares.counts[0])])
    assert not torch.equal(make_plan("patches", inputs, 100).squares, make_plan("patches_edges", inputs, 100).squares)
    # topk_edges: the top K of the image's own edge density, whatever the question's relevance
    edges = make_plan("topk_edges", inputs, 100)
    density = edge_density(inputs.canvas.pixels, CELL)
    assert torch.equal(edges.cells, topk_cells(density, k, valid).positions[0])
    assert torch.equal(make_plan("topk_edges", replace(inputs, relevance=-inputs.relevance), 100).cells, edges.cells)
    assert not torch.equal(edges.cells, topk.cells)


def test_methods_declare_what_they_need_and_refuse_what_is_missing(inputs):
    from dataclasses import replace

    assert [n for n in METHODS.names() if METHODS.get(n).source == "vlm"] == ["vlm"]
    assert set(methods_for("vlm")) - set(methods_for("ocr")) == {"vlm", "slice", "native_budget"}
    with pytest.raises(ValueError, match="method 'vlm' reads the vlm relevance, which was not passed in"):
        make_plan("vlm", replace(inputs, vlm_relevance=None), 100)
    assert make_plan("pruner", replace(inputs, maps={}), 100) is None  # no weights: nothing to send
    assert make_plan("arr", replace(inputs, sampler=None), 100) is None
    assert make_plan("quadtree", inputs, 10) is None and make_plan("topk", inputs, 10).saccades == 6  # below its tiling
    assert build_samplers(["topk", "arr", "vlm", "full", "random"]).keys() == {"topk", "random"}


def test_the_ocr_reader_renders_each_plan_kind_as_its_view(inputs):
    pixels = inputs.canvas.pixels[0]
    full, native = make_plan("full", inputs, 100), make_plan("uniform_image", inputs, 100)
    cells, squares = make_plan("topk", inputs, 100), make_plan("patches", inputs, 100)
    assert torch.equal(render(full, pixels, CELL), pixels)
    view, used = downsampled_view(pixels, 100, CELL)
    assert torch.equal(render(native, pixels, CELL), view) and rendered_tokens(native) == used == 96 < native.tokens
    assert torch.equal(render(cells, pixels, CELL), foveated_view(pixels, cells.cells, CELL, (6, 6)))
    expect = render_patches(pixels, squares.squares, CELL, gestalt_view(pixels, CELL, (6, 6)))
    assert torch.equal(render(squares, pixels, CELL), expect)
    assert rendered_tokens(cells) == cells.tokens == 100
    # masks: the saccades; the squares' 1x1 cells only
    assert int(cell_mask(cells).sum()) == 64 and cell_mask(full).all()
    tree = make_plan("quadtree", inputs, 100)  # leaves tile the page: most of it seen through larger squares
    sizes = square_sizes(tree)
    assert torch.equal(cell_mask(tree), sizes == 1) and bool((sizes > 0).all()) and int((sizes == 1).sum()) < 280


def test_the_whole_context_methods_are_registry_entries_with_a_plan_per_page():
    from arr_coc.allocators.methods import page_plans, resolve
    from arr_coc.allocators.pages import PagesInputs
    from arr_coc.budget import Budget

    grids = [(4, 5), (3, 3), (6, 2)]  # 20 + 9 + 12 = 41 cells
    scores = [torch.arange(h * w, dtype=torch.float32).view(h, w) * (i + 1) for i, (h, w) in enumerate(grids)]
    allocated = [Plan("coc", "cells", g, gestalt=(1, 1), cells=torch.tensor([[0, 0]])) for g in grids]
    inputs = PagesInputs(grids, scores, allocated, order=[2, 0, 1])
    assert resolve("uniform", "context") is METHODS.get("uniform_image")  # the context tables' name
    with pytest.raises(ValueError, match="method 'topk' does not send a whole context; choose one of full, coc"):
        resolve("topk", "context")
    with pytest.raises(ValueError, match="method 'coc' sends a whole context"):
        make_plan("coc", None, 10)
    full = page_plans("full", inputs, 41)
    assert [(p.kind, p.grid) for p in full.values()] == [("full", g) for g in grids]
    # coc sends the context allocation's own plans, as made (the same objects)
    assert all(page_plans("coc", inputs, 20)[i] is allocated[i] for i in range(3))
    with pytest.raises(ValueError, match="method 'coc' sends the context allocation's plans, which were not passed"):
        page_plans("coc", PagesInputs(grids), 20)
    # equal split: the budget's gestalts (1x1 here: 3 x 2 x 2 > 20 // 2), K = 17 split 6 / 6 / 5, each page's best
    split = page_plans("equal_split", inputs, 20)
    assert Budget.parse(20).split(grids) == ([(1, 1)] * 3, 17)
    assert [len(p.cells) for p in split.values()] == [6, 6, 5]
    assert split[0].cells.tolist()[:2] == [[3, 4], [3, 3]] and sum(p.tokens for p in split.values()) == 20
    # uniform: every page downscaled to its share; first / bm25 pages: whole pages in their order while they fit
    assert [p.native for p in page_plans("uniform", inputs, 20).values()] == [7, 7, 6]
    assert {i: (p.kind, p.native) for i, p in page_plans("first_pages", inputs, 25).items()} == {
        0: ("full", None), 1: ("native", 5)}
    assert {i: (p.kind, p.native) for i, p in page_plans("bm25_pages", inputs, 30).items()} == {
        2: ("full", None), 0: ("native", 18)}
    with pytest.raises(ValueError, match="method 'bm25_pages' needs the pages' BM25 order"):
        page_plans("bm25_pages", PagesInputs(grids), 30)
