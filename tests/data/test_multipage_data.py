"""Multi-page benchmark loaders (MP-DocVQA, SlideVQA) on small fixtures written in each official layout."""
import json
from pathlib import Path

import pytest
from PIL import Image

from arr_coc.data.datasets import DATASETS, load_dataset
from arr_coc.data.mpdocvqa import load_mpdocvqa
from arr_coc.data.slidevqa import load_slidevqa


def image(path: Path, colour: str = "white") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (40, 30), colour).save(path)
    return path


@pytest.fixture
def mpdocvqa(tmp_path: Path) -> Path:
    for page in ("abc_p0", "abc_p1", "abc_p2", "xyz_p0"):
        image(tmp_path / "images" / f"{page}.jpg")
    data = [{"questionId": 7, "question": "What is the total?", "doc_id": "abc", "page_ids": ["abc_p0", "abc_p1", "abc_p2"],
             "answers": ["42", 42], "answer_page_idx": 2},
            {"questionId": 8, "question": "Who signed?", "doc_id": "xyz", "page_ids": ["xyz_p0"], "answers": ["Ann"],
             "answer_page_idx": 0}]
    (tmp_path / "qas").mkdir()
    (tmp_path / "qas" / "val.json").write_text(json.dumps({"dataset_name": "MP-DocVQA", "data": data}))
    (tmp_path / "qas" / "train.json").write_text(json.dumps({"data": data[1:]}))
    return tmp_path


def test_mpdocvqa_records_hold_every_page_in_order_and_the_answer_page(mpdocvqa):
    records = load_mpdocvqa(mpdocvqa, split="val")
    assert [(r.record_id, r.image_id, r.answers, r.answer_pages) for r in records] == [
        ("7", "abc", ("42", "42"), (2,)), ("8", "xyz", ("Ann",), (0,))]
    assert [p.name for p in records[0].pages] == ["abc_p0.jpg", "abc_p1.jpg", "abc_p2.jpg"]
    assert records[0].image == records[0].pages[2] and records[0].metric == "anls" and records[0].boxes_px == ()
    assert [r.record_id for r in load_dataset("mpdocvqa", mpdocvqa, split="train")] == ["8"]
    with pytest.raises(ValueError, match="holds the splits train, val; choose one"):
        load_mpdocvqa(mpdocvqa)


@pytest.mark.parametrize("change, message", [
    ({"answer_page_idx": 3}, "'answer_page_idx' must be a page index 0..2, got 3"),
    ({"answer_page_idx": True}, "'answer_page_idx' must be a page index"),
    ({"page_ids": []}, "'page_ids' must be a non-empty list of page names"),
    ({"page_ids": ["abc_p0", "abc_p0"]}, "'page_ids' names a page twice"),
    ({"page_ids": ["abc_p0", "abc_p9"], "answer_page_idx": 0}, "image abc_p9.jpg not found"),
])
def test_mpdocvqa_refuses_bad_items_naming_them(mpdocvqa, change, message):
    path = mpdocvqa / "qas" / "val.json"
    data = json.loads(path.read_text())
    data["data"][0].update(change)
    path.write_text(json.dumps(data))
    with pytest.raises((ValueError, FileNotFoundError), match=f"val.json: item 0: .*{message}"):
        load_mpdocvqa(path)


@pytest.fixture
def slidevqa(tmp_path: Path) -> Path:
    for n in (1, 2, 3, 10):
        image(tmp_path / "images" / "test" / "deck-a" / f"slide_{n}_1024.jpg")
    image(tmp_path / "images" / "test" / "deck-b" / "slide_1_1024.jpg")
    qa = tmp_path / "annotations" / "qa"
    qa.mkdir(parents=True)
    lines = [{"qa_id": 1, "deck_name": "deck-a", "question": "How many users?", "answer": 12, "evidence_pages": [10, 2]},
             {"qa_id": 2, "deck_name": "deck-b", "question": "Title?", "answer": "Growth", "evidence_pages": []}]
    (qa / "test.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return tmp_path


def test_slidevqa_records_hold_the_deck_by_slide_number_and_the_evidence(slidevqa):
    records = load_slidevqa(slidevqa, split="test")
    assert [(r.record_id, r.image_id, r.answer, r.answer_pages) for r in records] == [
        ("1", "deck-a", "12", (3, 1)), ("2", "deck-b", "Growth", ())]
    assert [p.name for p in records[0].pages] == ["slide_1_1024.jpg", "slide_2_1024.jpg", "slide_3_1024.jpg",
                                                  "slide_10_1024.jpg"]  # by number, not by name
    assert records[0].image == records[0].pages[3] and records[1].image == records[1].pages[0]
    assert DATASETS.get("slidevqa").reader == "vlm"
    with pytest.raises(ValueError, match="no SlideVQA question file val.jsonl"):
        load_slidevqa(slidevqa, split="val")


@pytest.mark.parametrize("line, message", [
    ({"qa_id": 1, "deck_name": "deck-a", "question": "Q?", "answer": "a", "evidence_pages": [4]},
     "'evidence_pages' must list slide numbers of deck 'deck-a' \\(1-10\\), got \\[4\\]"),
    ({"qa_id": 1, "deck_name": "deck-z", "question": "Q?", "answer": "a"}, "deck folder 'deck-z' not found"),
    ({"qa_id": 1, "deck_name": "deck-a", "question": "Q?"}, "no 'answer'"),
    ({"qa_id": 1, "deck_name": "deck-a", "question": "Q?", "answer": {"x": 1}}, "an answer is a JSON object"),
    ({"qa_id": 1, "deck_name": "deck-a", "question": " ", "answer": "a"}, "question '1' is empty"),
])
def test_slidevqa_refuses_bad_lines_naming_them(slidevqa, line, message):
    path = slidevqa / "annotations" / "qa" / "test.jsonl"
    path.write_text(json.dumps(line) + "\n")
    with pytest.raises((ValueError, FileNotFoundError), match=f"test.jsonl: line 1: {message}"):
        load_slidevqa(path)


def test_slidevqa_refuses_a_repeated_question_id(slidevqa):
    path = slidevqa / "annotations" / "qa" / "test.jsonl"
    first = path.read_text().splitlines()[0]
    path.write_text(first + "\n" + first + "\n")
    with pytest.raises(ValueError, match="question id '1' repeats: .*line 1 and .*line 2"):
        load_slidevqa(path)
