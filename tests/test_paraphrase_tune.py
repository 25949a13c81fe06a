"""benchmarks/paraphrase_tune.py's ceiling: the answer's lines found by their boxes, ranked, and moved to a rank."""

import torch
from conftest import load_benchmark


def load():
    return load_benchmark("paraphrase_tune")


def test_the_answer_lines_are_those_whose_boxes_touch_an_occurrence_and_rank_by_the_best():
    tune = load()
    lines = [("intro", (0.0, 0.0, 20.0, 300.0)), ("300pt wide", (30.0, 0.0, 50.0, 300.0)),
             ("end", (60.0, 0.0, 80.0, 300.0))]
    win = {"lines": [[("other page", (0.0, 0.0, 20.0, 300.0))], lines]}
    q = {"at": 1, "options": [[(32.0, 10.0, 48.0, 60.0)], []]}  # one occurrence, on the second line
    assert tune.answer_lines(win, q) == [1]
    assert tune.answer_lines(win, {"at": 1, "options": [[(20.0, 0.0, 30.0, 300.0)]]}) == []  # between: touches none
    scores = [torch.tensor([0.9]), torch.tensor([0.2, 0.5, 0.7])]
    assert tune.answer_rank(scores, 1, [1]) == 3  # below 0.9 and 0.7
    assert tune.answer_rank(scores, 1, []) is None
    assert tune.answer_rank([torch.tensor([0.5]), torch.tensor([0.2, 0.5, 0.5])], 1, [1, 2]) == 2  # a tie counts against
    for rank in (1, 2, 3, 4):  # moved to each rank, every other line keeps its order
        moved = tune.oracle(scores, 1, [1], rank)
        assert tune.answer_rank(moved, 1, [1]) == rank
        assert torch.equal(moved[0], scores[0]) and torch.equal(moved[1][[0, 2]], scores[1][[0, 2]])
    assert torch.equal(scores[1], torch.tensor([0.2, 0.5, 0.7]))  # the retriever's scores are not written over
    assert tune.oracle(scores, 1, [1], 0) is scores  # rank 0: the retriever's own order


def test_the_ceiling_is_plotted_against_the_rank(tmp_path):
    from argparse import Namespace

    from PIL import Image

    tune = load()
    args = Namespace(compression=[10.0, 20.0], dataset="texlive-paraphrase", split="val", out=tmp_path)
    grid = [{"weight": 8.0, "oracle": r} for r in (0, 1, 10)] + [{"weight": 4.0, "oracle": 1}]  # the last: not row 1's
    cov = {i: {10.0: [v, v], 20.0: [v / 2, v / 2]} for i, v in enumerate((0.5, 1.0, 0.75, 0.25))}
    cov["ranks"] = [3, None]
    tune.plot_oracle(args, grid, cov)
    with Image.open(tmp_path / "oracle.png") as png:
        assert png.format == "PNG" and png.size == (704, 440)  # 6.4 x 4.0 in at 110 dpi
