"""A model-free retriever for tests: a text is the L2-normalised count of each word of a fixed vocabulary."""
import torch


class WordRetriever:
    """Embeds a text as its counts of ``vocab``'s words, normalised; counts how often passages are embedded
    (``passage_calls``, on the instance and summed on the class)."""

    name = "words"
    calls_total = 0

    def __init__(self, vocab=("apples", "pears", "brass", "key", "mat", "river", "lantern", "chapter", "nothing"),
                 device: str = "cpu") -> None:
        self.vocab = tuple(vocab)
        self.passage_calls = 0

    def _embed(self, texts):
        rows = torch.tensor([[t.lower().split().count(w) for w in self.vocab] for t in texts], dtype=torch.float32)
        return rows / rows.norm(dim=1, keepdim=True).clamp_min(1e-9)

    def queries(self, texts):
        return self._embed(texts)

    def passages(self, texts):
        self.passage_calls += 1
        WordRetriever.calls_total += 1
        return self._embed(texts)
