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


def goal_rows(full: list[float], at6: list[float], at11: list[float], kind: str = "date") -> list[dict]:
    return [{"record_id": f"q{i}", "kind": kind, "method": m, "budget": b, "reading": v}
            for m, b, vs in (("full", "full", full), ("arr", "6%", at6), ("arr", "11%", at11))
            for i, v in enumerate(vs)]


def test_goal_verdicts_are_read_from_the_paired_interval_of_the_share():
    tables = load_make_tables()
    from arr_coc.eval.intervals import bootstrap_mean, bootstrap_ratio

    full = [0.6, 0.8, 1.0, 0.9] * 30  # 120 questions
    at6 = [0.93 * f for f in full]  # 93 % of full on every question: paired, the interval is exactly 93 %
    at11 = [f * (0.85 if i % 3 else 1.0) for i, f in enumerate(full)]  # ~90 %: below 95 % all the way
    cells = tables.goal_cells(goal_rows(full, at6, at11))
    lo, hi = bootstrap_ratio(at11, full)
    assert hi < 0.95
    assert cells == ["120", f"{sum(full) / 120:.3f} [{bootstrap_mean(full)[0]:.2f}, {bootstrap_mean(full)[1]:.2f}]",
                     f"{sum(at6) / 120:.3f} [{bootstrap_mean(at6)[0]:.2f}, {bootstrap_mean(at6)[1]:.2f}]",
                     "93.0 % [93.0, 93.0] met", cells[4],
                     f"{100 * sum(at11) / sum(full):.1f} % [{100 * lo:.1f}, {100 * hi:.1f}] missed"]
    # the same share of full on 8 noisy questions: the interval straddles the goal, so no verdict
    few = [1.0, 0.2, 0.9, 0.4, 1.0, 0.3, 0.8, 0.6]
    noisy = [1.0, 0.1, 0.8, 0.5, 1.0, 0.2, 0.9, 0.6]
    cells = tables.goal_cells(goal_rows(few, noisy, noisy))
    assert cells[3].endswith("undecided at n=8") and cells[5].endswith("undecided at n=8"), cells
    assert tables.verdict(0.9, 0.99, 0.9, 5) == "met" and tables.verdict(0.8, 0.8999, 0.9, 5) == "missed"


def test_goal_cells_of_a_kind_pair_only_that_kinds_questions():
    tables = load_make_tables()
    rows = goal_rows([1.0] * 4, [0.5] * 4, [1.0] * 4, kind="date") + [
        {**r, "record_id": "t" + r["record_id"]} for r in goal_rows([0.5] * 6, [0.5] * 6, [0.5] * 6, kind="total")]
    assert tables.goal_cells(rows, "date")[:4] == ["4", "1.000 [1.00, 1.00]", "0.500 [0.50, 0.50]",
                                                   "50.0 % [50.0, 50.0] missed"]
    assert tables.goal_cells(rows, "total")[3] == "100.0 % [100.0, 100.0] met"
    from arr_coc.eval.intervals import bootstrap_ratio

    lo, hi = bootstrap_ratio([0.5] * 10, [1.0] * 4 + [0.5] * 6)  # all: 5 / 7 of full; its questions paired
    assert tables.goal_cells(rows)[:1] + tables.goal_cells(rows)[3:4] == [
        "10", f"71.4 % [{100 * lo:.1f}, {100 * hi:.1f}] " + ("undecided at n=10" if lo < 0.9 <= hi else "missed")]


def test_headline_intervals_cell_and_the_subprocesses_import_this_checkout():
    tables = load_make_tables()
    rows = [{"method": "arr", "budget": b, "kind": "all", "reading_lo": lo, "reading_hi": lo + 0.1}
            for b, lo in (("5%", 0.6), ("10%", 0.65), ("25%", 0.7), ("50%", 0.7))]
    assert tables.spans(rows, "arr", "reading") == "0.60–0.70 / 0.65–0.75 / 0.70–0.80 / 0.70–0.80"
    assert tables.spans(rows, "uniform_image", "reading") == "—"
    assert tables.checkout_env()["PYTHONPATH"].split(":")[0] == str(ROOT)


def test_the_readme_coc_table_is_the_committed_paraphrase_tables_and_its_goal_verdicts(tmp_path):
    tables = load_make_tables()
    block = tables.coc_block(None)
    readme = (ROOT / "README.md").read_text()
    assert f"<!-- make tables: coc -->\n{block}\n<!-- /make tables -->" in readme
    csv_text = (tables.PARAPHRASE / "tables.csv").read_text()
    assert "coc" in csv_text and "retrieval_pages" in csv_text
    # the verdict follows the share: a copy of the rows with coc's 20x share at 0.91 reads "met" there
    spec_rows = [line.split(",") for line in csv_text.splitlines()]
    head = spec_rows[0]
    for row in spec_rows[1:]:
        if row[head.index("method")] == "coc" and row[head.index("budget")] == "20x":
            row[head.index("reading_share")] = "0.91"
    (tmp_path / "tables.csv").write_text("\n".join(",".join(r) for r in spec_rows) + "\n")
    spec = importlib.util.spec_from_file_location("paraphrase_tables", ROOT / "benchmarks" / "paraphrase_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert "20x >= 90 % met (91 %)" in module.readme_block(tmp_path, "cmd")
    with pytest.raises(LookupError, match="is not made yet"):
        module.readme_block(tmp_path / "nowhere", "cmd")


def test_a_skipped_steps_blocks_are_left_as_they_are(monkeypatch, tmp_path):
    tables = load_make_tables()
    docs = ("README.md", "docs/evaluation.md", "docs/allocators.md")
    for doc in docs:
        (tmp_path / doc).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / doc).write_text((ROOT / doc).read_text())
    monkeypatch.setattr(tables, "ROOT", tmp_path)
    monkeypatch.setattr(tables, "RESULTS", tmp_path / "results")  # no rows at all
    # control: rewritten from no rows, the goals block would say so
    assert "not run yet" in tables.goal_table(120, per_kind=False)
    tables.main(["--skip", *tables.STEPS])
    for doc in docs:
        assert (tmp_path / doc).read_text() == (ROOT / doc).read_text(), doc
