"""``bench_context_speed.py --documents``: one row a window and the medians over them, from the runs it was given."""
from __future__ import annotations

import argparse

import pytest
from conftest import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("bench_context_speed")


def fake_run(see: float, questions: list[float]) -> dict:
    """One child process's report, as ``child`` returns it (stages at zero)."""
    return {"see_ms": see, "see_cpu": 2 * see, "see": {}, "tokens": 1000, "pages": 20, "n": len(questions),
            "digest": "x", "cells": [], "questions": [{"ms": ms, "cpu": ms} for ms in questions]}


def test_windows_table_rows_medians_and_counts(bench, monkeypatch, tmp_path):
    runs = {"a.pdf": fake_run(3000.0, [2500.0, 400.0, 600.0]), "b.pdf": fake_run(5200.0, [1500.0, 2100.0]),
            "c.pdf": fake_run(4000.0, [1900.0, 100.0])}
    calls = []

    def run_side(root, document, limit, threads, query_batch=None, layer=None):
        calls.append((document, limit))
        return runs[document]

    monkeypatch.setattr(bench, "run_side", run_side)
    out = tmp_path / "speed.md"
    args = argparse.Namespace(documents=list(runs), repeats=1, limit=3, threads=None, query_batch=None, out=out)
    bench.windows(args)
    text = out.read_text()
    assert calls == [("a.pdf", 3), ("b.pdf", 3), ("c.pdf", 3)]
    assert "| `a.pdf` | 3 | 1000 | 3000 | 2500 | 500 | 600 |" in text  # later: median of 400 and 600, max 600
    assert "| `b.pdf` | 2 | 1000 | 5200 | 1500 | 2100 | 2100 |" in text
    # medians over the windows: sees 3000 / 5200 / 4000, first questions 2500 / 1500 / 1900, later 400 600 2100 100
    assert "| **median over the 3 windows** | | | **4000** | **1900** | **500** | 2100 |" in text
    assert "Sees over 5 s: 1 of 3 windows; first questions over 2 s: 1 of 3; later questions over 2 s: 1 of 4." in text
    assert "--documents a.pdf b.pdf c.pdf --repeats 1 --limit 3" in text


def test_documents_refuses_before_and_layers(bench, monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["bench_context_speed.py", "--documents", "a.pdf", "--layers"])
    with pytest.raises(SystemExit):
        bench.main()
    assert "--documents times this code alone" in capsys.readouterr().err
