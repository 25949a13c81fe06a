"""benchmarks/compare_runs.py: two runs of the same questions paired row by row."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import load_benchmark

compare_runs = load_benchmark("compare_runs")


def _rows(readings: dict[str, float], method: str = "coc") -> list[dict]:
    return [{"record_id": q, "method": method, "budget": "10x", "kind": "front" if q < "q3" else "name",
             "reading": r, "reading_find": r, "coverage": r, "page_hit_strict": float(r >= 0.5), "tokens": 100}
            for q, r in readings.items()]


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_pairs_rows_counts_the_unchanged_and_gives_the_paired_difference(tmp_path, capsys):
    full = [dict(r, budget="full") for r in _rows({"q1": 0.5}, "full")]
    before = _write(tmp_path / "a.jsonl", _rows({"q1": 0.0, "q2": 0.25, "q3": 1.0, "q4": 0.5}) + full)
    after = _write(tmp_path / "b.jsonl", _rows({"q1": 1.0, "q2": 0.75, "q3": 1.0, "q4": 0.5, "q5": 0.0}) + full)
    boxless = _rows({"q6": 0.5})[0] | {"page_hit_strict": None}  # an answer without a box: no strict hit
    for path in (before, after):
        path.write_text(path.read_text() + json.dumps(boxless) + "\n")
    out = tmp_path / "cmp.md"
    compare_runs.main([str(before), str(after), "--labels", "off", "on", "--out", str(out)])
    rows = compare_runs.compare(compare_runs.load(before), compare_runs.load(after))
    assert [(r["method"], r["budget"], r["n"], r["same"]) for r in rows] == [("coc", "10x", 5, 3),
                                                                             ("full", "full", 1, 1)]
    r = rows[0]  # q5 is in one run only: not paired
    assert (r["n"], r["same"], r["a"], r["b"], r["diff"]) == (5, 3, 0.45, 0.75, 0.3)
    assert (r["strict_a"], r["strict_b"]) == (0.5, 1.0) and 0.0 <= r["lo"] < r["diff"] < r["hi"] <= r["hi"] <= 0.75
    kinds = compare_runs.compare(compare_runs.load(before), compare_runs.load(after), ["coc"], by_kind=True)
    assert [(k["kind"], k["n"], k["same"], k["diff"]) for k in kinds] == [("front", 2, 0, 0.75), ("name", 3, 3, 0.0)]
    text = out.read_text()
    assert "| coc | 10x | 5 | 3 | 0.450 | 0.750 | +0.300 [" in text and "reading: off" in text
    assert text in capsys.readouterr().out


def test_a_missing_records_file_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit):
        compare_runs.main([str(tmp_path / "none.jsonl"), str(tmp_path / "none.jsonl")])
    assert "none.jsonl: no such records file" in capsys.readouterr().err


def test_the_find_reading_is_compared_when_asked(tmp_path):
    before = _write(tmp_path / "a.jsonl", _rows({"q1": 0.5, "q2": 1.0}))
    after = _write(tmp_path / "b.jsonl", [dict(r, reading_find=1.0) for r in _rows({"q1": 0.5, "q2": 1.0})])
    a, b = compare_runs.load(before), compare_runs.load(after)
    region, find = compare_runs.compare(a, b)[0], compare_runs.compare(a, b, column="reading_find")[0]
    assert (region["diff"], region["same"]) == (0.0, 1) and (find["a"], find["b"], find["diff"]) == (0.75, 1.0, 0.25)
    out = tmp_path / "cmp.md"
    compare_runs.main([str(before), str(after), "--reading", "find", "--out", str(out)])
    assert "reading = the find reading" in out.read_text() and "| coc | 10x | 2 | 1 | 0.750 | 1.000 | +0.250 [" in \
        out.read_text()
