"""The README's examples run as written and its claims hold; docs/architecture.md matches the package."""
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

RUNS = "<!-- runs as a test -->"  # marks a docs/*.md python block that runs as written (README's all do)


def python_blocks(text: str, marked_only: bool) -> list[str]:
    """The ```python blocks of ``text``, in order: all of them, or those right under a ``RUNS`` line."""
    found = re.findall(r"(" + re.escape(RUNS) + r"\n)?```python\n(.*?)```", text, re.S)
    return [block for mark, block in found if mark or not marked_only]


def run_snippets(blocks: list[str], check: str, folder: Path) -> subprocess.CompletedProcess:
    """The blocks as one script, then ``check``, run by a fresh interpreter in ``folder`` (outside the checkout:
    a path relative to the checkout's root does not resolve there), with the package importable and every
    model hub offline."""
    script = folder / "snippets.py"
    script.write_text("\n".join(blocks) + "\n" + check)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return subprocess.run([sys.executable, str(script)], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=900)


# What each file's snippets compute, printed as JSON after they ran; a file with runnable blocks needs an entry.
CHECKS = {
    "README.md": ("import json; print(json.dumps([list(out.positions.shape), list(out.patches.shape), "
                  "list(out.gestalt.tokens.shape), list(out.relevance.weights.shape), "
                  "[a.visual_tokens for a in answers], answers[0].flops['total'] < answers[0].flops_full['total'], "
                  "type(answer).__name__, answer.visual_tokens, answer.text == answers[0].text]))",
                  [[2, 273, 2], [2, 273, 3, 28, 28], [2, 256, 14], [2, 3], [128, 128], True, "Answer", 128, True]),
    "docs/usage.md": ("import json; print(json.dumps([list(out.positions.shape), list(out.scores.shape), "
                      "sorted(k for k in out.timings_ms if '/' not in k)]))",
                      [[2, 273, 2], [2, 273], ["canvas", "coupling", "extraction", "gestalt", "query", "scoring",
                                                "selection", "texture"]]),
    "docs/vlm.md": ("import json; print(json.dumps([[a.visual_tokens for a in answers], answers[0].gestalt_tokens]))",
                    [[128, 128], 64]),
}


def documents_with_snippets() -> list[str]:
    docs = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md") if RUNS in p.read_text())
    return ["README.md", *docs]


def test_every_file_with_runnable_snippets_is_checked():
    assert documents_with_snippets() == sorted(CHECKS, key=lambda f: (f != "README.md", f))


def test_block_finder_takes_marked_blocks_only_where_asked():
    text = f"```python\na = 1\n```\n{RUNS}\n```python\nb = 2\n```\n```bash\nc\n```\n"
    assert python_blocks(text, marked_only=False) == ["a = 1\n", "b = 2\n"]
    assert python_blocks(text, marked_only=True) == ["b = 2\n"]


def test_a_snippet_that_needs_the_checkout_fails_outside_it(tmp_path: Path):
    """The negative control: the harness really runs elsewhere, where the checkout's relative paths are gone."""
    assert (ROOT / "examples" / "receipt.jpg").exists()
    done = run_snippets(['open("examples/receipt.jpg", "rb").read()'], "", tmp_path)
    assert done.returncode == 1 and "FileNotFoundError" in done.stderr.splitlines()[-1]
    done = run_snippets(['from arr_coc import examples\nprint(examples.path("receipt.jpg").stat().st_size)'], "",
                        tmp_path)
    assert done.returncode == 0 and int(done.stdout) == (ROOT / "examples" / "receipt.jpg").stat().st_size


@pytest.mark.slow
@pytest.mark.parametrize("document", documents_with_snippets())
def test_snippets_run_outside_the_checkout(document: str, tmp_path: Path):
    """README.md's python blocks, and docs' blocks marked runnable, run as written from an empty folder."""
    blocks = python_blocks((ROOT / document).read_text(), marked_only=document != "README.md")
    check, expected = CHECKS[document]
    done = run_snippets(blocks, check, tmp_path)
    assert done.returncode == 0, f"{document}'s snippets failed outside the checkout:\n{done.stderr[-3000:]}"
    assert json.loads(done.stdout.splitlines()[-1]) == expected


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
    pyproject = ROOT / "pyproject.toml"
    layers = arch.read_layers(pyproject)
    assert layers[0] == ["cli"] and "errors" in layers[-1] and ["engine"] in layers
    names = {name for layer in layers for name in layer}
    text = (ROOT / "docs" / "architecture.md").read_text()
    for name in names:
        assert f"`{name}`" in text, f"layer {name} not described in docs/architecture.md"
    for _, modules, _ in arch.REQUEST_PATH:
        assert set(modules.split()) <= names, f"the request path names {modules}, which is no layer"
    assert arch.independent(pyproject) == set()  # no "|" siblings left: channels went into the engine
    arch.draw(layers, set(), tmp_path / "a.png", {("cli", "engine")})
    assert (tmp_path / "a.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="no import-linter contract"):
        (tmp_path / "p.toml").write_text("[tool.importlinter]\n")
        arch.read_layers(tmp_path / "p.toml")


def test_the_import_graph_in_the_docs_is_the_code_s_and_points_down_the_layers():
    """docs/architecture.md's mermaid block is the reduced import graph of the package as it is, every package is
    in a layer, and every arrow points down; an invented arrow up is caught (the negative control)."""
    arch = load_make_architecture()
    pyproject = ROOT / "pyproject.toml"
    layers, edges = arch.read_layers(pyproject), arch.import_graph()
    packages = {p.stem for p in (ROOT / "arr_coc").iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}
    assert {n for edge in edges for n in edge} | {"lmms"} == packages - {"__init__"}  # nothing imports lmms
    assert {n for layer in layers for n in layer} == packages - {"__init__"}
    assert arch.upward(edges, layers, pyproject) == []
    assert arch.upward(edges | {("errors", "cli"), ("engine", "nowhere")}, layers, pyproject) == [
        ("engine", "nowhere"), ("errors", "cli")]
    reduced = arch.reduce(edges)
    assert reduced <= edges and ("cli", "engine") in edges - reduced  # implied by cli -> app -> ... -> engine
    block = re.search(r"```mermaid\n(.*?)```", (ROOT / "docs" / "architecture.md").read_text(), re.S).group(1)
    drawn = set(re.findall(r"^ +(\w+) --> (\w+)$", block, re.M))
    assert drawn == reduced, f"redraw with python docs/make_architecture.py --mermaid: {sorted(drawn ^ reduced)}"


def test_reduction_keeps_only_the_arrows_no_longer_path_implies():
    arch = load_make_architecture()
    assert arch.reduce({("a", "b"), ("b", "c"), ("a", "c"), ("c", "d"), ("a", "d")}) == {("a", "b"), ("b", "c"),
                                                                                          ("c", "d")}
    assert arch.reduce({("a", "b"), ("a", "c")}) == {("a", "b"), ("a", "c")}
