"""95 % bootstrap intervals beside the summaries' means: their width, determinism, pairing, and the report columns."""
import csv
import math
import random

import numpy as np
import pytest

from arr_coc.eval.intervals import bootstrap_mean, bootstrap_ratio
from arr_coc.eval.report import summarize, write_reports
from arr_coc.eval.store import RowStore


def bernoulli(p: float, n: int, seed: int = 1) -> list[float]:
    rng = random.Random(seed)
    return [float(rng.random() < p) for _ in range(n)]


def test_interval_contains_the_mean_and_is_deterministic():
    values = [0.0, 0.2, 0.9, 1.0, 0.5, 0.75, 0.1, 0.6]
    lo, hi = bootstrap_mean(values)
    assert lo < sum(values) / len(values) < hi
    assert bootstrap_mean(values) == (lo, hi)  # the same seed: the same interval, to the last bit
    assert bootstrap_mean(values, seed=1) != (lo, hi)  # negative control: the seed is what fixes it


def test_constant_scores_have_an_interval_of_zero_width():
    assert bootstrap_mean([0.75] * 40) == (0.75, 0.75)
    assert bootstrap_mean([1.0, 1.0]) == (1.0, 1.0)


def test_bernoulli_interval_matches_the_normal_approximation():
    for p, n in ((0.3, 200), (0.8, 400)):
        values = bernoulli(p, n)
        mean = sum(values) / n
        half = 1.96 * math.sqrt(mean * (1 - mean) / n)  # the Wald interval, close to the bootstrap's at this n
        lo, hi = bootstrap_mean(values)
        assert lo == pytest.approx(mean - half, abs=0.01) and hi == pytest.approx(mean + half, abs=0.01), (p, n)
        assert (hi - lo) == pytest.approx(2 * half, rel=0.1)
    # the width falls as 1 / sqrt(n): four times the questions, half the width
    w40 = np.subtract(*bootstrap_mean(bernoulli(0.5, 40))[::-1])
    w160 = np.subtract(*bootstrap_mean(bernoulli(0.5, 160))[::-1])
    assert w160 == pytest.approx(w40 / 2, rel=0.2)


def test_missing_scores_are_left_out_and_one_question_gives_no_interval():
    assert bootstrap_mean([0.5, None, float("nan"), 0.5]) == (0.5, 0.5)
    assert all(math.isnan(x) for x in bootstrap_mean([0.7]) + bootstrap_mean([]))


def test_paired_ratio_resamples_both_scores_of_a_question_together():
    full = [0.2, 0.9, 0.5, 1.0, 0.4, 0.7, 0.3, 0.8] * 5
    assert bootstrap_ratio([0.9 * f for f in full], full) == pytest.approx((0.9, 0.9))  # paired: exactly 90 %
    arr = [f * (0.8 if i % 2 else 1.0) for i, f in enumerate(full)]
    lo, hi = bootstrap_ratio(arr, full)
    assert lo < sum(arr) / sum(full) < hi
    # negative control: resampling the two methods' questions independently gives a far wider interval
    rng = np.random.default_rng(0)
    a, f = np.array(arr), np.array(full)
    unpaired = [a[rng.integers(0, 40, 40)].mean() / f[rng.integers(0, 40, 40)].mean() for _ in range(2000)]
    assert np.subtract(*np.percentile(unpaired, [97.5, 2.5])) > 3 * (hi - lo)
    with pytest.raises(ValueError, match="paired scores needed: 2 numerators against 3 denominators"):
        bootstrap_ratio([0.1, 0.2], [0.1, 0.2, 0.3])


def rows_of(values: dict[str, list[float]]) -> list[dict]:
    return [{"record_id": f"q{i}", "dataset": "d", "method": method, "budget": budget, "tokens": 10,
             "full_tokens": 100, "kind": "", "coverage": v, "hit": float(v > 0.5), "iou": None, "secondary": v,
             "peripheral": v, "seen": None, "reading": v}
            for (method, budget), vs in values.items() for i, v in enumerate(vs)]


def test_summary_csv_and_md_carry_the_intervals(tmp_path):
    reading = bernoulli(0.6, 40)
    RowStore(tmp_path).append(rows_of({("full", "full"): [1.0] * 40, ("topk", "10%"): reading}))
    csv_path, md_path, _ = write_reports(tmp_path / "records.jsonl", made_by="test")
    table = list(csv.DictReader(csv_path.open()))
    header = list(table[0])
    assert header[header.index("reading"):header.index("reading") + 3] == ["reading", "reading_lo", "reading_hi"]
    assert {"coverage_lo", "coverage_hi"} <= set(header) and "hit_lo" not in header  # scores only
    topk = next(r for r in table if r["method"] == "topk")
    lo, hi = bootstrap_mean(reading)
    assert (float(topk["reading_lo"]), float(topk["reading_hi"])) == (lo, hi) and lo < float(topk["reading"]) < hi
    assert next(r for r in table if r["method"] == "full")["reading_lo"] == "1.0"
    md = md_path.read_text()
    assert f"{sum(reading) / 40:.3f} [{lo:.3f}, {hi:.3f}]" in md and "1.000 [1.000, 1.000]" in md
    assert summarize(rows_of({("topk", "10%"): reading}), ("reading",))[0]["reading_hi"] == hi
