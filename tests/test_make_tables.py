"""`make tables`: the README's console examples are what the command prints now; the blocks it rewrites."""
import importlib.util
import re
import sys

import pytest
from conftest import ROOT

from arr_coc.cli import main


def load_make_tables():
    spec = importlib.util.spec_from_file_location("make_tables", ROOT / "benchmarks" / "make_tables.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("make_tables", module)
    spec.loader.exec_module(module)
    return module


def numbers(line: str) -> list[float]:
    return [float(x) for x in re.findall(r"[-+]?\d+\.\d+|[-+]?\d+", line)]


@pytest.mark.slow
def test_readme_and_usage_look_blocks_are_what_look_prints_now(monkeypatch, capsys, tmp_path):
    tables = load_make_tables()
    monkeypatch.chdir(ROOT)
    argv = [*tables.LOOK]
    argv[argv.index("--out") + 1] = str(tmp_path / "receipt_arr.png")  # the picture is not what is compared
    assert main(argv) == 0
    fresh = {tables.console_key(line): line for line in capsys.readouterr().out.splitlines()}
    for doc in tables.LOOK_DOCS:
        text = (ROOT / doc).read_text()
        start, end = tables.look_block(text)
        block = text.splitlines()[start:end]
        compared = [line for line in block if tables.console_key(line).split()[0] in (*tables.DETERMINISTIC, "rank")]
        assert len(compared) >= 7, (doc, block)  # question, image, tokens, context, top, two ranks at least
        for line in compared:
            now = fresh[tables.console_key(line)]
            if tables.console_key(line) == "scorer":
                assert line == now, doc
                continue
            # the same words, the same numbers (scores and weights to the last printed digit, +-1 for CPU rounding)
            assert re.sub(r"[-+\d.]+", "#", line) == re.sub(r"[-+\d.]+", "#", now), (doc, line, now)
            assert numbers(line) == pytest.approx(numbers(now), abs=0.011), (doc, line, now)


def test_blocks_are_rewritten_between_their_markers_only():
    tables = load_make_tables()
    text = "intro\n<!-- make tables: goals -->\nold table\n<!-- /make tables -->\nprose stays\n"
    assert tables.replace_block(text, "goals", "| new |") == (
        "intro\n<!-- make tables: goals -->\n| new |\n<!-- /make tables -->\nprose stays\n")
    with pytest.raises(ValueError, match=r"no '<!-- make tables: kinds -->'"):
        tables.replace_block(text, "kinds", "x")
    for doc, names in (("README.md", ("headline", "goals")), ("docs/allocators.md", ("allocators",)),
                       ("docs/evaluation.md", ("headline", "goals-per-kind", "kinds"))):
        for name in names:  # every block make_tables writes is there to be rewritten
            assert f"<!-- make tables: {name} -->" in (ROOT / doc).read_text(), (doc, name)


def test_console_refresh_keeps_the_readme_ellipsis_and_replaces_by_key():
    tables = load_make_tables()
    doc = ("```console\n$ arr-coc look examples/receipt.jpg \"What is the total?\"\ncontext       a 0.05\n"
           "    1: ( 38,  13) -> ( 1064,   364)  +9.458\n    ...\n```\n")
    fresh = ["context       a 0.21", "    1: ( 38,  13) -> ( 1064,   364)  +7.904", "    2: ( 1, 1) -> (28, 28)  +1.0"]
    assert tables.refresh_console(doc, fresh) == doc.replace("0.05", "0.21").replace("+9.458", "+7.904")
