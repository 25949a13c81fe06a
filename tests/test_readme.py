"""The README's Python example runs as written and its comments tell the truth."""
import re

import pytest
from conftest import ROOT


@pytest.mark.slow
def test_readme_python_example_runs(monkeypatch):
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    monkeypatch.chdir(ROOT)
    scope: dict = {}
    exec(compile(block, "README.md", "exec"), scope)
    out = scope["out"]
    assert tuple(out.positions.shape) == (2, 273, 2) and tuple(out.patches.shape) == (2, 273, 3, 28, 28)
    assert tuple(out.gestalt.tokens.shape) == (2, 256, 14) and tuple(out.relevance.weights.shape) == (2, 3)


def test_readme_vlm_example_runs(monkeypatch):
    text = (ROOT / "README.md").read_text()
    block = next(b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "load_vlm" in b)
    monkeypatch.chdir(ROOT)
    scope: dict = {}
    exec(compile(block, "README.md", "exec"), scope)
    answers = scope["answers"]
    assert [a.visual_tokens for a in answers] == [64 + 64, 64 + 64]
    assert answers[0].flops["total"] < answers[0].flops_full["total"]


def test_readme_lists_every_module():
    text = (ROOT / "README.md").read_text()
    for path in sorted((ROOT / "arr_coc").rglob("*.py")):
        if path.name != "__init__.py":
            assert path.name in text, f"{path.name} missing from the README's file tree"
