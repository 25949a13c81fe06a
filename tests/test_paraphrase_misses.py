"""benchmarks/paraphrase_misses.py: which rows count as coc's strict misses, and how a line's saccade cells count."""
import json

from conftest import load_benchmark


def load():
    return load_benchmark("paraphrase_misses")


def test_misses_are_coc_rows_at_the_budget_with_no_strict_hit(tmp_path):
    rows = [{"record_id": "a", "method": "coc", "budget": "20x", "page_hit_strict": 0.0},
            {"record_id": "b", "method": "coc", "budget": "20x", "page_hit_strict": 1.0},
            {"record_id": "c", "method": "coc", "budget": "10x", "page_hit_strict": 0.0},
            {"record_id": "d", "method": "full", "budget": "full", "page_hit_strict": 0.0},
            {"record_id": "e", "method": "coc", "budget": "20x", "page_hit_strict": 0.0}]
    path = tmp_path / "records.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert [r["record_id"] for r in load().misses(path, "20x")] == ["a", "e"]
    assert [r["record_id"] for r in load().misses(path, "10x")] == ["c"]


def test_a_line_counts_the_saccade_cells_its_box_touches():
    line_cells = load().line_cells
    box = (30.0, 0.0, 40.0, 60.0)  # y0, x0, y1, x1 px: cell row 1, cell columns 0-2 of 28 px cells
    assert line_cells(box, 28, {(1, 0), (1, 2), (5, 5)}) == 2
    assert line_cells(box, 28, {(0, 0), (2, 1)}) == 0  # the rows above and below: a control
