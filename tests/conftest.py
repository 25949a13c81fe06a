"""Shared fixtures: the bundled example and checks several test files use."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "receipt.jpg"


@pytest.fixture
def receipt() -> Path:
    return EXAMPLE


def check_batch_equals_singles(adapter, batch, singles, run_llm, atol):
    """generate() over a left-padded batch equals each prompt alone; negative control: unmasked padding."""
    from dataclasses import replace

    from arr_coc.vlm import generate

    assert batch.attention_mask.sum(1).tolist() != [batch.attention_mask.shape[1]] * len(singles)  # really padded
    tokens, logits = generate(adapter, batch, max_new_tokens=4)
    for b, one in enumerate(singles):
        t1, l1 = generate(adapter, one, max_new_tokens=4)
        assert t1.tolist() == tokens[b:b + 1].tolist()
        torch.testing.assert_close(l1, logits[b:b + 1], atol=atol, rtol=0)
    unmasked = replace(batch, attention_mask=torch.ones_like(batch.attention_mask))
    short = int(batch.attention_mask.sum(1).argmin())
    assert (run_llm(adapter, unmasked)[short, -1] - run_llm(adapter, batch)[short, -1]).abs().max() > 1e-2


def key_pdf(path: Path, pages: int) -> Path:
    """A PDF of ``pages`` small pages with a text layer, page i saying "chapter i" and, on page 37 only, where the key is."""
    import matplotlib
    from matplotlib.backends.backend_pdf import PdfPages
    from matplotlib.figure import Figure

    with matplotlib.rc_context({"pdf.fonttype": 42}), PdfPages(path) as pdf:
        for i in range(pages):
            fig = Figure(figsize=(2.4, 1.6))
            fig.text(0.1, 0.7, f"chapter {i} notes", fontsize=9)
            fig.text(0.1, 0.3, "the brass key is under the mat" if i == 37 else "nothing to see here", fontsize=9)
            pdf.savefig(fig)
    return path
