"""Line heads in the retrieval map: a line's value on its first cells, a fraction of it on the rest (off by default)."""
import pytest
import torch

from arr_coc.contexts.ranking import rank_cells, ranking_score, retrieval_map, text_parts

CELL = 28
SIZE = (280, 560)  # one page of 10 x 20 cells
LONG = ("a long prose line across the page", (28.0, 0.0, 50.0, 560.0))  # row 1, all 20 columns
SHORT = [(f"\\command{i}", (28.0 * r, 0.0, 28.0 * r + 20.0, 80.0)) for i, r in enumerate((3, 5, 7))]  # 3 columns


def whole_lines(lines, values, size, cell):
    """The map before heads, cell by cell: the best value of the lines touching a cell."""
    out = torch.zeros(size[0] // cell, size[1] // cell)
    for (_, (y0, x0, y1, x1)), v in zip(lines, values.tolist()):
        for r in range(out.shape[0]):
            for c in range(out.shape[1]):
                if v > 0 and r * cell < y1 and (r + 1) * cell > y0 and c * cell < x1 and (c + 1) * cell > x0:
                    out[r, c] = max(float(out[r, c]), v)
    return out


def test_the_default_paints_whole_lines_exactly_as_before():
    g = torch.Generator().manual_seed(0)
    y0, x0 = torch.rand(30, generator=g) * 250, torch.rand(30, generator=g) * 500
    boxes = torch.stack([y0, x0, y0 + 5 + torch.rand(30, generator=g) * 30, x0 + torch.rand(30, generator=g) * 300], 1)
    lines = [("w", tuple(b.tolist())) for b in boxes]
    values = torch.rand(30, generator=g) * (torch.rand(30, generator=g) > 0.3)
    want = whole_lines(lines, values, SIZE, CELL)
    assert torch.equal(retrieval_map(lines, values, SIZE, CELL), want)
    assert torch.equal(retrieval_map(lines, values, SIZE, CELL, head=0, tail=0.25), want)  # head 0: tail unused
    assert not torch.equal(retrieval_map(lines, values, SIZE, CELL, head=4, tail=0.25), want)  # the control


def test_a_head_counts_its_cells_from_the_line_s_left_edge():
    line = [("x", (28.0, 70.0, 50.0, 400.0))]  # columns 2 (70 px lies in 56-84) to 14
    row = retrieval_map(line, torch.tensor([0.75]), SIZE, CELL, head=3, tail=0.25)[1]
    assert row.tolist() == [0.0, 0.0] + [0.75] * 3 + [0.1875] * 10 + [0.0] * 5
    tailless = retrieval_map(line, torch.tensor([0.75]), SIZE, CELL, head=3, tail=0.0)[1]
    assert tailless.nonzero().flatten().tolist() == [2, 3, 4]


def chosen(head: int, tail: float) -> list[tuple[int, int]]:
    """The page's best 20 cells, the long line at value 1 and three short lines at 0.6."""
    lines = [LONG, *SHORT]
    parts = text_parts(CELL, [SIZE], [torch.zeros(10, 20)], [[]], [lines], "anything", retrieved=[
        torch.tensor([1.0, 0.6, 0.6, 0.6])], head=head, tail=tail)
    return sorted(map(tuple, rank_cells([ranking_score(p) for p in parts], 20)[0].tolist()))


def test_heads_spend_the_saccades_on_the_starts_of_many_lines():
    heads = chosen(4, 0.5)
    assert heads[:4] == [(1, c) for c in range(4)]  # the long line's head
    assert {(r, c) for r in (3, 5, 7) for c in range(3)} <= set(heads)  # every short line, whole
    assert len([c for c in heads if c[0] == 1]) == 11  # 4 head cells + the first 7 of its tail (ties: reading order)


def test_whole_lines_spend_them_on_the_one_long_line():
    """The control: the default gives the long line all 20 cells and the short lines none."""
    assert chosen(0, 1.0) == [(1, c) for c in range(20)]


@pytest.mark.parametrize("head, tail", [(-1, 0.5), (4, 1.5), (4, -0.1)])
def test_a_bad_head_or_tail_is_refused(head, tail):
    with pytest.raises(ValueError, match=f"head must be >= 0 cells and 0 <= tail, rest <= 1, got head={head}, tail={tail}, "
                                         f"rest=0.0"):
        retrieval_map([LONG], torch.tensor([1.0]), SIZE, CELL, head=head, tail=tail)
