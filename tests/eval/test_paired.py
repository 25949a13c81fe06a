"""Paired tables: a method's readings as a share of full resolution's on the same questions, with paired intervals."""
from __future__ import annotations

import math

import pytest

from arr_coc.eval.intervals import bootstrap_mean, bootstrap_ratio
from arr_coc.eval.paired import kind_table, loss_table, paired_kinds, paired_summary, paired_table, where_lost


def row(q: str, method: str, budget: str, reading, find, hit=1.0, strict=0.0, coverage=0.5, tokens=100,
        compression=10.0) -> dict:
    return {"dataset": "d", "record_id": q, "kind": "front" if q == "a" else "name", "method": method,
            "budget": budget, "tokens": tokens, "compression": compression, "reading": reading, "reading_find": find,
            "page_hit": hit, "page_hit_strict": strict, "coverage": coverage}


FULL = {"a": (1.0, 1.0), "b": (0.5, 0.8), "c": (0.0, 0.6), "d": (1.0, None)}
COC = {"a": (0.5, 1.0), "b": (0.5, 0.4), "c": (0.25, 0.0), "d": (1.0, 0.2)}


def rows() -> list[dict]:
    out = [row(q, "full", "full", *FULL[q], tokens=1000, compression=1.0) for q in FULL]
    out += [row(q, "coc", "10x", *COC[q], strict=float(q == "a")) for q in COC]
    out += [row(q, "uniform", "20x", 0.0, 0.0, hit=0.0, coverage=0.0, tokens=50, compression=20.0) for q in "ab"]
    return out


def test_shares_pair_each_question_with_its_full_row_and_leave_out_a_missing_reading():
    coc, uniform = paired_summary(rows())
    assert (coc["method"], coc["budget"], coc["n"]) == ("coc", "10x", 4)
    assert coc["reading"] == pytest.approx(2.25 / 4) and coc["reading_full"] == pytest.approx(2.5 / 4)
    assert coc["reading_share"] == pytest.approx(2.25 / 2.5)
    # find: question d has no full find reading, so it is left out of both means (3 pairs)
    assert coc["reading_find_pairs"] == 3 and coc["reading_find"] == pytest.approx(1.4 / 3)
    assert coc["reading_find_full"] == pytest.approx(2.4 / 3) and coc["reading_find_share"] == pytest.approx(1.4 / 2.4)
    assert (coc["reading_find_share_lo"], coc["reading_find_share_hi"]) == bootstrap_ratio([1.0, 0.4, 0.0],
                                                                                           [1.0, 0.8, 0.6])
    assert (coc["reading_lo"], coc["reading_hi"]) == bootstrap_mean([0.5, 0.5, 0.25, 1.0])
    assert coc["page_hit_strict"] == 0.25 and coc["coverage"] == 0.5 and coc["page_hit"] == 1.0
    # control: unpaired means would give another share (the full mean over all four questions differs)
    assert uniform["reading_share"] == 0.0 and uniform["reading_full"] == pytest.approx(0.75)
    assert (uniform["budget"], uniform["page_hit"], uniform["tokens"]) == ("20x", 0.0, 50)


def test_a_method_without_full_rows_has_no_share():
    s, = paired_summary([row("a", "coc", "10x", 0.5, 0.5)])
    assert s["n"] == 1 and math.isnan(s["reading_share"]) and math.isnan(s["reading"])


def test_tables_list_every_budget_and_kind():
    every = paired_kinds(rows())
    assert [(s["kind"], s["method"], s["n"]) for s in every] == [
        ("all", "coc", 4), ("all", "uniform", 2), ("front", "coc", 1), ("front", "uniform", 1), ("name", "coc", 3),
        ("name", "uniform", 1)]
    table = paired_table([s for s in every if s["kind"] == "all"]).splitlines()
    assert table[2].startswith("| 10x | coc | 4 | 100 | 10.0x | 0.562 [") and "| 90% [" in table[2]
    assert table[2].endswith("| 100% | 25% | 50% |")
    assert table[3] == "| 20x | uniform | 2 | 50 | 20.0x | 0.000 [0.000, 0.000] | 0% [0%, 0%] | 0.000 [0.000, 0.000] " \
                       "| 0% [0%, 0%] | 0% | 0% | 0% |"
    kinds = kind_table([s for s in every if s["kind"] != "all"]).splitlines()
    assert kinds[0] == "| kind (n) | full: region / find | method | 10x | 20x |"
    assert kinds[2] == "| front (1) | 1.000 / 1.000 | coc | 50% / 100% |  |"
    assert kinds[5] == "| name (1) | 0.500 / 0.800 | uniform |  | 0% / 0% |"


def test_where_lost_splits_the_shortfall_by_coverage_and_adds_up_to_the_share():
    cover = {"a": 1.0, "b": 0.25, "c": 0.0, "d": None}
    rs = [r if r["method"] != "coc" else {**r, "coverage": cover[r["record_id"]]} for r in rows()]
    lost = {(s["reading"], s["covered"]): (s["n"], s["lost"]) for s in where_lost(rs)}
    # region: full reads 2.5 in all; a loses 0.5 (whole), b 0 (part), c gains 0.25 (none), d 0 (no box)
    assert lost[("reading", "whole")] == (1, pytest.approx(20.0)) and lost[("reading", "part")] == (1, 0.0)
    assert lost[("reading", "none")] == (1, pytest.approx(-10.0)) and lost[("reading", "no box")] == (1, 0.0)
    # find: d has no full find reading and is left out; full reads 2.4 over a, b, c
    assert ("reading_find", "no box") not in lost and lost[("reading_find", "none")] == (1, pytest.approx(25.0))
    for col in ("reading", "reading_find"):  # the parts add up to the paired share's shortfall
        share = paired_summary(rs)[0][f"{col}_share"]
        assert sum(v for (c, _), (_, v) in lost.items() if c == col) == pytest.approx(100 * (1 - share))
    # control: other coverages move the loss between the parts, not its total
    moved = {(s["reading"], s["covered"]): s["lost"] for s in where_lost([{**r, "coverage": 0.0} for r in rs])}
    assert set(moved) == {("reading", "none"), ("reading_find", "none")} and moved[("reading", "none")] == \
        pytest.approx(10.0)
    assert loss_table(where_lost(rs)).splitlines()[2] == "| 10x | whole | 1 | 20.0 | 0.0 |"
