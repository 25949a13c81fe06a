"""benchmarks/paraphrase_tune.py's ceiling: the answer's lines found by their boxes, ranked, and moved to a rank."""
import importlib.util
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def load():
    sys.path.insert(0, str(ROOT / "benchmarks"))  # the script imports the benchmark beside it (coc_tune)
    try:
        spec = importlib.util.spec_from_file_location("paraphrase_tune", ROOT / "benchmarks" / "paraphrase_tune.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return module


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
    for rank in (1, 2, 3, 4):  # moved to each rank, every other line keeps its order
        moved = tune.oracle(scores, 1, [1], rank)
        assert tune.answer_rank(moved, 1, [1]) == rank
        assert torch.equal(moved[0], scores[0]) and torch.equal(moved[1][[0, 2]], scores[1][[0, 2]])
    assert torch.equal(scores[1], torch.tensor([0.2, 0.5, 0.7]))  # the retriever's scores are not written over
    assert tune.oracle(scores, 1, [1], 0) is scores  # rank 0: the retriever's own order
