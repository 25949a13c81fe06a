"""The package's layout rule: a module's file name says which one it is, so no name repeats across folders."""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def repeated_names(paths: list[Path]) -> dict[str, list[str]]:
    """File names (``__init__.py`` aside) that more than one of ``paths`` carries, each with its paths."""
    seen: dict[str, list[str]] = defaultdict(list)
    for path in paths:
        if path.name != "__init__.py":
            seen[path.name].append(path.as_posix())
    return {name: sorted(where) for name, where in seen.items() if len(where) > 1}


def test_repeated_names_finds_a_name_in_two_folders_only():
    paths = [Path("a/texture.py"), Path("b/texture.py"), Path("a/__init__.py"), Path("b/__init__.py"), Path("c.py")]
    assert repeated_names(paths) == {"texture.py": ["a/texture.py", "b/texture.py"]}


def test_no_module_name_repeats_across_the_package_tests_and_benchmarks():
    paths = [p.relative_to(ROOT) for folder in ("arr_coc", "tests", "benchmarks") for p in (ROOT / folder).rglob("*.py")]
    assert len(paths) > 100  # the walk found the package, not an empty folder
    assert repeated_names(paths) == {}
