"""The scripts behind docs figures: the learner table is the shipped weights' own, the default's margins and
their intervals, and the allocators' report read back from committed summaries."""
import importlib.util
import json
import math
import sys

import pytest
from conftest import ROOT


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, module)
    spec.loader.exec_module(module)
    return module


def test_the_learner_table_in_the_docs_is_the_shipped_weights_own():
    table = load("learner_table").table()
    assert table in (ROOT / "docs" / "allocators.md").read_text()  # the doc carries exactly what the weights say
    pruner = json.loads((ROOT / "arr_coc" / "weights" / "pruner" / "config.json").read_text())["metrics"]
    row = next(line for line in table.splitlines() if line.startswith("| pruner"))
    assert f"| {pruner['learned']['test']['iou']:.3f} | {pruner['learned']['test']['coverage']:.3f} |" in row
    selector = json.loads((ROOT / "arr_coc" / "weights" / "selector" / "config.json").read_text())["metrics"]
    assert f"{selector['learned']['test']['iou']:.3f}" not in row  # negative control: another learner's figure


def test_the_learner_table_refuses_weights_measured_another_way(monkeypatch):
    module = load("learner_table")
    real = module.metrics
    monkeypatch.setattr(module, "metrics", lambda name: {**real(name), "tokens": "25%"} if name == "pruner"
                        else real(name))
    with pytest.raises(SystemExit, match="pruner was measured at 25% on 747 questions, not 10% on 747"):
        module.table()


def test_bootstrap_interval_of_paired_differences():
    rd = load("run_defaults")
    assert rd.interval([0.0] * 40) == (0.0, 0.0)
    assert rd.interval([0.25] * 40) == (0.25, 0.25)
    lo, hi = rd.interval([0.0, 1.0] * 20)  # mean 0.5, standard error 0.5 / sqrt(40) = 0.079
    assert 0.32 < lo < 0.40 and 0.60 < hi < 0.68
    assert rd.interval([0.0, 1.0] * 20) == (lo, hi)  # seeded: the same interval every time


def rows(dataset: str, method: str, budget: str, values: list[float], metric: str) -> list[dict]:
    return [{"dataset": dataset, "method": method, "budget": budget, "record_id": f"q{i}", metric: v}
            for i, v in enumerate(values)]


def test_the_verdict_names_a_candidate_below_beyond_its_interval_and_not_one_within():
    rd = load("run_defaults")
    n = 20
    data = {}
    for d, metric in rd.DATASETS.items():
        data[d] = []
        for b in rd.BUDGETS:
            data[d] += rows(d, "uniform_image", b, [0.5] * n, metric) if metric == "reading" else []
            data[d] += rows(d, "topk", b, [0.6] * n, metric)
            data[d] += rows(d, "worse", b, [0.1] * n, metric)  # 0.5 below top-K on every question
            data[d] += rows(d, "mixed", b, [0.6, 0.5] * (n // 2), metric)  # -0.05 on average, interval < 0
            data[d] += rows(d, "noisy", b, [1.0, 0.1] * (n // 2), metric)  # -0.05 on average, interval holds 0
    table = rd.verdict(data, ("topk", "worse", "mixed", "noisy"))
    line = {row.split(" | ")[0].strip("| "): row for row in table.splitlines()[2:]}
    assert line["topk"].endswith("| yes | none |")
    assert "-0.500 [-0.500, -0.500]" in line["worse"] and line["worse"].endswith("coco 25%, coco 50% |")
    assert line["mixed"].count("-0.050") == 12 and "| no | funsd 5%," in line["mixed"]
    assert line["noisy"].count("-0.050") == 12 and line["noisy"].endswith("| no | none |")


def test_the_allocators_report_reads_the_committed_summaries(tmp_path):
    ra = load("run_allocators")
    csv = tmp_path / "summary.csv"
    csv.write_text("dataset,kind,method,budget,n,tokens,share,coverage,seen,reading\n"  # summary.csv's columns
                   "funsd,all,full,full,40,993.6,1.0,1.0,nan,0.75\n"
                   "funsd,all,topk,10%,40,99.0,0.1,0.88,nan,\n"
                   "funsd,date,topk,10%,10,99.0,0.1,0.9,nan,0.8\n")
    got = ra.read_summary(csv)
    assert [(r["method"], r["budget"], r["n"]) for r in got] == [("full", "full", 40), ("topk", "10%", 40)]
    assert got[0]["reading"] == 0.75 and math.isnan(got[1]["reading"])  # an empty cell is nan, the kind rows left out
    report = ra.report_tables({"funsd": got})
    assert report.startswith("## funsd (test images, 40 questions)") and "| full | 0.750 |" in report
