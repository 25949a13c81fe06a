"""The README's examples run as written and its claims hold; docs/architecture.md matches the package."""
import importlib.util
import re
from pathlib import Path

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


def tree_paths(text: str) -> set[str]:
    """The paths named by the annotated file tree (the ``` block after "## Every file") of ``text``."""
    block = re.search(r"## Every file\n+```\n(.*?)```", text, re.S).group(1)
    stack: list[str] = []
    paths = set()
    for line in block.splitlines():
        indent = len(line) - len(line.lstrip(" "))
        if not line.strip() or indent > 12:  # a description's continuation line
            continue
        depth = indent // 2
        stack[depth:] = [line.split()[0].rstrip("/")]
        paths.add("/".join(stack))
    return paths


def test_readme_stays_short_and_points_to_the_architecture():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    assert "[docs/architecture.md](docs/architecture.md)" in text
    for command in ("make demo", "make test"):
        assert command in text


def test_tree_parser_reads_nesting():
    text = "## Every file\n\n```\npkg/\n  a.py        what a is\n                      more about a\n  sub/\n    b.py  b\nMakefile\n```\n"
    assert tree_paths(text) == {"pkg", "pkg/a.py", "pkg/sub", "pkg/sub/b.py", "Makefile"}


def test_architecture_tree_is_the_package():
    """Every module and benchmark is in the tree, under its own folder, and the tree names nothing that is gone."""
    listed = tree_paths((ROOT / "docs" / "architecture.md").read_text())
    for folder in ("arr_coc", "benchmarks"):
        actual = {p.relative_to(ROOT).as_posix() for p in (ROOT / folder).rglob("*.py") if p.name != "__init__.py"}
        named = {p for p in listed if p.startswith(folder + "/") and p.endswith(".py")}
        assert actual - named == set(), f"missing from docs/architecture.md: {sorted(actual - named)}"
        assert named - actual == set(), f"docs/architecture.md names files that do not exist: {sorted(named - actual)}"


def load_make_architecture():
    spec = importlib.util.spec_from_file_location("make_architecture", ROOT / "docs" / "make_architecture.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_architecture_picture_follows_the_layers(tmp_path: Path):
    arch = load_make_architecture()
    layers = arch.read_layers(ROOT / "pyproject.toml")
    assert layers[0] == ["cli"] and "errors" in layers[-1]
    names = {name for layer in layers for name in layer}
    text = (ROOT / "docs" / "architecture.md").read_text()
    for name in names:
        assert f"`{name}`" in text, f"layer {name} not described in docs/architecture.md"
    for _, modules, _ in arch.REQUEST_PATH:
        assert set(modules.split()) <= names, f"the request path names {modules}, which is no layer"
    assert arch.independent(ROOT / "pyproject.toml") == {"channels", "data"}
    arch.draw(layers, set(), tmp_path / "a.png")
    assert (tmp_path / "a.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="no import-linter contract"):
        (tmp_path / "p.toml").write_text("[tool.importlinter]\n")
        arch.read_layers(tmp_path / "p.toml")
