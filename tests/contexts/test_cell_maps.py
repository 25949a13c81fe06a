"""The ranking's maps painted on cells equal the maps painted on pixels then pooled, to the last bit; so do the
allocations made with them."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from conftest import story_pdf

from arr_coc import ARR, ARRConfig
from arr_coc.config import MVP_CHANNELS, TextureConfig
from arr_coc.contexts import allocate, ranking
from arr_coc.documents.pdf import read_pdf
from arr_coc.engine import imageops
from arr_coc.engine.channels import text_layer
from arr_coc.engine.imageops import box_coverage, paint_boxes, paint_cells, paint_step
from arr_coc.engine.query import HashingQueryEncoder


def pixels_then_pool(boxes, values, size, cell, reduce="mean", transform=None, shift=0.0):
    """What the ranking computed before: every pixel painted (the full [N, H, W] product), then pooled."""
    painted = full_product(boxes + shift, values, size)[: size[0] // cell * cell, : size[1] // cell * cell]
    painted = painted if transform is None else transform(painted)
    return (F.avg_pool2d if reduce == "mean" else F.max_pool2d)(painted[None, None], cell)[0, 0]


def full_product(boxes, values, size):
    """:func:`paint_boxes` as one [N, H, W] product over every box (its blocks when the product is large)."""
    if len(boxes) == 0:
        return values.new_zeros(size)
    step = paint_step(len(boxes), size)
    rows, cols = box_coverage(boxes[:, 0], boxes[:, 2], size[0], step), box_coverage(boxes[:, 1], boxes[:, 3], size[1], step)
    painted = (values[:, None, None] * rows[:, :, None] * cols[:, None, :]).amax(0)
    return painted.repeat_interleave(step, 0)[: size[0]].repeat_interleave(step, 1)[:, : size[1]]


def random_boxes(g: torch.Generator, n: int, size: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` word-like boxes (some off the edges, some empty) and their values (a third of them 0)."""
    y0, x0 = torch.rand(n, generator=g) * size[0] - 4, torch.rand(n, generator=g) * size[1] - 4
    boxes = torch.stack([y0, x0, y0 + torch.rand(n, generator=g) * 30, x0 + torch.rand(n, generator=g) * 250], 1)
    values = torch.rand(n, generator=g) * 3
    values[torch.rand(n, generator=g) < 0.3] = 0.0
    if n:
        boxes[0] = torch.tensor([9.0, 9.0, 5.0, 3.0])  # an empty box
    return boxes, values


def test_paint_cells_equals_every_pixel_painted_then_pooled_to_the_last_bit():
    g = torch.Generator().manual_seed(0)
    checked = set()
    for trial in range(60):
        cell = (14, 28, 32)[trial % 3]
        size = tuple(int(v) * cell for v in torch.randint(1, 40, (2,), generator=g))
        n = int(torch.randint(0, (4, 40, 300)[trial % 3], (1,), generator=g))
        boxes, values = random_boxes(g, n, size)
        norm = float(torch.rand(1, generator=g)) * 3 + 0.1

        def scaled(m):
            return (m / norm).float().clamp(0, 1)

        mean = paint_cells(boxes, values, size, cell, "mean", scaled)
        assert torch.equal(mean, pixels_then_pool(boxes, values, size, cell, "mean", scaled))
        assert torch.equal(paint_cells(boxes, values, size, cell, "max"), pixels_then_pool(boxes, values, size, cell, "max"))
        if n > 2 and float(values.max()) > 0:  # control: boxes half a pixel away give another map
            assert not torch.equal(mean, pixels_then_pool(boxes, values, size, cell, "mean", scaled, shift=0.5))
        checked.add(paint_step(n, size) > 1)
    assert checked == {False, True}  # painted on pixels and on blocks


def test_paint_cells_paints_negative_values_whole():
    boxes, values = torch.tensor([[0.0, 0.0, 10.0, 10.0], [20.0, 20.0, 28.0, 28.0]]), torch.tensor([-1.0, 2.0])
    for reduce in ("mean", "max"):
        assert torch.equal(paint_cells(boxes, values, (28, 56), 14, reduce), pixels_then_pool(boxes, values, (28, 56), 14, reduce))
    assert float(paint_cells(boxes, values, (28, 56), 14, "max")[0, 0]) == 0.0  # the max of -1 and the 0 around it


def test_paint_boxes_box_by_box_equals_the_full_product():
    g = torch.Generator().manual_seed(1)
    for trial in range(40):
        size = tuple(int(v) for v in torch.randint(1, 900, (2,), generator=g))
        boxes, values = random_boxes(g, int(torch.randint(0, (5, 60, 400)[trial % 3], (1,), generator=g)), size)
        assert torch.equal(paint_boxes(boxes, values, size), full_product(boxes, values, size))
    # a negative value: painted with the full product (a pixel no box covers holds 0, not -1)
    boxes, values = torch.tensor([[0.0, 0.0, 4.0, 4.0]]), torch.tensor([-1.0])
    assert paint_boxes(boxes, values, (8, 8)).tolist() == full_product(boxes, values, (8, 8)).tolist()
    assert float(paint_boxes(boxes, values, (8, 8)).sum()) == -16.0


def _reference(monkeypatch, shift: float = 0.0) -> None:
    """Put back the pixel painting: every box painted over the whole page, then pooled to cells."""
    def painter(boxes, values, size, cell, reduce="mean", transform=None):
        return pixels_then_pool(boxes, values, size, cell, reduce, transform, shift)

    monkeypatch.setattr(ranking, "paint_cells", painter)
    monkeypatch.setattr(text_layer, "paint_cells", painter)
    monkeypatch.setattr(imageops, "_local", lambda values: False)


def test_a_context_allocation_is_the_same_as_with_every_pixel_painted(tmp_path, monkeypatch):
    ctx = read_pdf(story_pdf(tmp_path / "story.pdf", 4), dpi=100)
    question = f'What comes after "{" ".join(w.text for w in ctx.pages[2].words[3:5])}"?'
    arr = ARR(ARRConfig(texture=TextureConfig(channels=(*MVP_CHANNELS, "text_match", "key_value"))),
              query_encoder=HashingQueryEncoder()).eval()

    def run():
        out = allocate(arr, ctx, question, "120", retrieval_weight=0.0)
        return [p.plan.cells.tolist() for p in out.pages], [p.relevance for p in out.pages]

    cells, ranks = run()
    assert sum(len(c) for c in cells) > 0 and len(cells[2]) > 0  # the quoted page gets saccades
    with monkeypatch.context() as m:
        _reference(m)
        old_cells, old_ranks = run()
    assert cells == old_cells  # every page's cells, in rank order
    assert all(torch.equal(a, b) for a, b in zip(ranks, old_ranks))
    with monkeypatch.context() as m:  # control: words half a pixel away rank the cells otherwise
        _reference(m, shift=0.5)
        assert not all(torch.equal(a, b) for a, b in zip(ranks, run()[1]))
