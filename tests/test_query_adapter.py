"""benchmarks/query_adapter.py: the answer line's rank, and a map fitted to put it first."""
import torch
from conftest import load_benchmark


def load():
    return load_benchmark("query_adapter")


def toy() -> tuple[dict[str, torch.Tensor], list[dict]]:
    """Two windows of 4 lines in 3-d; each question's vector points at a wrong line, the answer line off axis."""
    lines = torch.nn.functional.normalize(torch.tensor([[1.0, 0, 0], [0, 1, 0], [0, 0, 1], [0.6, 0.8, 0]]), dim=1)
    vectors = {"a": lines, "b": lines.flip(0)}
    q = torch.nn.functional.normalize(torch.tensor([1.0, 0.1, 0.0]), dim=0)
    return vectors, [{"id": "1", "q": q, "wid": "a", "held": [2]}, {"id": "2", "q": q, "wid": "b", "held": [1]}]


def test_ranks_count_ties_against_the_answer():
    qa = load()
    vectors = {"w": torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])}
    q = torch.tensor([1.0, 0.0])
    assert qa.ranks(vectors, [{"q": q, "wid": "w", "held": [1]}], None) == [2]  # tied with line 0: counts against
    assert qa.ranks(vectors, [{"q": q, "wid": "w", "held": [2]}], None) == [3]
    assert qa.ranks(vectors, [{"q": q, "wid": "w", "held": [0, 2]}], None) == [2]  # the best answer line counts


def test_a_fitted_map_puts_the_answer_first_and_a_heavy_penalty_keeps_the_identity():
    qa = load()
    vectors, items = toy()
    assert qa.ranks(vectors, items, None) == [4, 4]
    W = qa.fit(vectors, items, lam=1e-4, tau=0.05, steps=1500, rank=0)
    assert qa.ranks(vectors, items, W) == [1, 1]
    low = qa.fit(vectors, items, lam=1e-4, tau=0.05, steps=1500, rank=2)
    assert qa.ranks(vectors, items, low) == [1, 1]
    # control: the penalty on W - I dominates, the map stays the identity and the ranks stay
    stiff = qa.fit(vectors, items, lam=1e6, tau=0.1, steps=50, rank=0)
    assert torch.allclose(stiff, torch.eye(3), atol=1e-3)
    assert qa.ranks(vectors, items, stiff) == [4, 4]
    assert qa.recall([1, 5, 300]).split(" | ")[:3] == ["33.3", "66.7", "66.7"]
