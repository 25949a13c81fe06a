"""Shared fixtures: the bundled example and checks several test files use."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "receipt.jpg"


def load_benchmark(name: str) -> ModuleType:
    """``benchmarks/NAME.py`` as a module, its folder on the path while it loads (a script imports the ones beside it)."""
    folder = str(ROOT / "benchmarks")
    sys.path.insert(0, folder)
    try:
        spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(folder)
    return module


@pytest.fixture
def receipt() -> Path:
    return EXAMPLE


def check_batch_equals_singles(adapter, batch, singles, run_llm):
    """generate() over a left-padded batch equals each prompt alone; negative control: unmasked padding."""
    from dataclasses import replace

    from tolerances import VLM_LOGITS, assert_close_reduction, assert_far

    from arr_coc.vlm import generate

    assert batch.attention_mask.sum(1).tolist() != [batch.attention_mask.shape[1]] * len(singles)  # really padded
    tokens, logits = generate(adapter, batch, max_new_tokens=4)
    for b, one in enumerate(singles):
        t1, l1 = generate(adapter, one, max_new_tokens=4)
        assert t1.tolist() == tokens[b:b + 1].tolist()
        atol = assert_close_reduction(l1, logits[b:b + 1], **VLM_LOGITS)
    unmasked = replace(batch, attention_mask=torch.ones_like(batch.attention_mask))
    short = int(batch.attention_mask.sum(1).argmin())
    assert_far(run_llm(adapter, unmasked)[short, -1], run_llm(adapter, batch)[short, -1], atol=atol)


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


STORY_WORDS = ("harbour lantern copper meadow violet engine quiet marble falcon river orchard silver candle thunder "
               "garden bridge velvet compass winter saddle amber willow pepper cobalt").split()


def story_pdf(path: Path, pages: int, lines: int = 9, seed: int = 0) -> Path:
    """A PDF of ``pages`` small pages (4.8 x 3.6 in) with a text layer: per page a numbered section heading set
    larger than the body, then ``lines`` body lines of 7 seeded random words (so phrases and answers are unique)."""
    import random

    import matplotlib
    from matplotlib.backends.backend_pdf import PdfPages
    from matplotlib.figure import Figure

    rng = random.Random(seed)
    with matplotlib.rc_context({"pdf.fonttype": 42}), PdfPages(path) as pdf:
        for i in range(pages):
            fig = Figure(figsize=(4.8, 3.6))
            fig.text(0.06, 0.9, f"{i + 1}.{i + 2} {rng.choice(STORY_WORDS).title()} {rng.choice(STORY_WORDS)}",
                     fontsize=12)
            for j in range(lines):
                fig.text(0.06, 0.8 - j * 0.065, " ".join(rng.choice(STORY_WORDS) for _ in range(7)), fontsize=9)
            pdf.savefig(fig)
    return path
