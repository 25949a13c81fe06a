"""DocVQA, InfoVQA, TextVQA and ChartQA loaders on hand-made fixtures in each official format and in parquet."""
from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from arr_coc.data.chartqa import load_chartqa
from arr_coc.data.datasets import DATASETS, load_dataset
from arr_coc.data.docvqa import load_docvqa, load_infovqa
from arr_coc.data.textvqa import load_textvqa


def image(path: Path, w: int = 60, h: int = 40, colour: str = "white") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (w, h), colour).save(path)
    return path


def write(path: Path, obj) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))
    return path


@pytest.fixture
def docvqa(tmp_path: Path) -> Path:
    """The SP-DocVQA download: spdocvqa_qas/{train,val}_v1.0_withQT.json + spdocvqa_images/."""
    root = tmp_path / "docvqa"
    image(root / "spdocvqa_images" / "pgaa0001.png")
    image(root / "spdocvqa_images" / "pgbb0002.png")
    val = [{"questionId": 7, "question": "What is the date?", "image": "documents/pgaa0001.png",
            "docId": 1, "answers": ["12/03/1998", "12-03-1998"], "data_split": "val"},
           {"questionId": 8, "question": " To whom? ", "image": "documents/pgaa0001.png", "answers": ["Dr. Ann"]},
           {"questionId": 9, "question": "Total?", "image": "documents/pgbb0002.png", "answers": ["9.00"]}]
    write(root / "spdocvqa_qas" / "val_v1.0_withQT.json", {"dataset_name": "docvqa", "data": val})
    write(root / "spdocvqa_qas" / "train_v1.0_withQT.json",
          {"data": [{"questionId": 1, "question": "Q?", "image": "documents/pgbb0002.png", "answers": ["a"]}]})
    write(root / "spdocvqa_qas" / "test_v1.0.json",
          {"data": [{"questionId": 2, "question": "Q?", "image": "documents/pgbb0002.png"}]})
    return root


def test_docvqa_reads_the_official_split_with_every_answer(docvqa: Path) -> None:
    recs = load_docvqa(docvqa, split="val")
    img = docvqa / "spdocvqa_images" / "pgaa0001.png"
    assert [(r.record_id, r.image, r.image_id, r.question) for r in recs] == [
        ("7", img, "pgaa0001", "What is the date?"), ("8", img, "pgaa0001", "To whom?"),
        ("9", docvqa / "spdocvqa_images" / "pgbb0002.png", "pgbb0002", "Total?")]
    assert recs[0].answers == ("12/03/1998", "12-03-1998") and recs[0].answer == "12/03/1998"
    assert {r.metric for r in recs} == {"anls"} and all(r.boxes_px == () == r.others_px for r in recs)
    assert load_dataset("docvqa", docvqa, split="val") == recs  # the official split, not the hash split
    assert load_docvqa(docvqa / "spdocvqa_qas" / "val_v1.0_withQT.json") == recs
    assert [r.record_id for r in load_docvqa(docvqa, split="train")] == ["1"]


def test_docvqa_refuses_ambiguous_folders_hidden_test_answers_and_wrong_files(docvqa: Path) -> None:
    with pytest.raises(ValueError, match=r"holds the splits test, train, val; choose one with --split"):
        load_docvqa(docvqa)
    with pytest.raises(ValueError, match=r"test_v1.0.json has no answers .*scored by the DocVQA server.*val"):
        load_docvqa(docvqa, split="test")
    with pytest.raises(ValueError, match=r"train_v1.0_withQT.json is not the val split of DocVQA"):
        load_docvqa(docvqa / "spdocvqa_qas" / "train_v1.0_withQT.json", split="val")
    with pytest.raises(ValueError, match=r"has no default folder; pass --data"):
        load_docvqa(None)
    (docvqa / "spdocvqa_images" / "pgbb0002.png").unlink()
    with pytest.raises(FileNotFoundError, match=r"item 2: image documents/pgbb0002.png not found"):
        load_docvqa(docvqa, split="val")


def test_infovqa_takes_image_local_name(tmp_path: Path) -> None:
    root = tmp_path / "infovqa"
    image(root / "infographicsvqa_images" / "3.jpeg")
    write(root / "infographicsvqa_qas" / "infographicsVQA_val_v1.0_withQT.json",
          {"data": [{"questionId": 65, "question": "How many?", "image_local_name": "3.jpeg",
                     "image_url": "https://example.org/3.jpeg", "answers": ["7", "seven"]}]})
    (r,) = load_infovqa(root, split="val")
    assert (r.dataset, r.image, r.answers, r.metric) == ("infovqa", root / "infographicsvqa_images" / "3.jpeg",
                                                         ("7", "seven"), "anls")


def test_textvqa_keeps_the_ten_answers_and_their_most_common_as_answer(tmp_path: Path) -> None:
    root = tmp_path / "textvqa"
    image(root / "train_images" / "abc.jpg")
    answers = ["nokia"] * 6 + ["noika"] * 3 + ["phone"]
    write(root / "TextVQA_0.5.1_val.json", {"dataset_type": "val", "data": [
        {"question_id": 34602, "question": "what brand?", "image_id": "abc", "answers": answers,
         "ocr_tokens": ["nokia"], "set_name": "val"}]})
    write(root / "TextVQA_Rosetta_OCR_v0.2_val.json", {"data": []})  # the OCR file is not an annotation file
    (r,) = load_textvqa(root, split="val")
    assert (r.record_id, r.image, r.image_id) == ("34602", root / "train_images" / "abc.jpg", "abc")
    assert r.answers == tuple(answers) and r.answer == "nokia" and r.metric == "vqa_accuracy"


def test_chartqa_reads_human_and_augmented_parts_of_a_split(tmp_path: Path) -> None:
    split = tmp_path / "ChartQA Dataset" / "test"
    image(split / "png" / "41699051005347.png")
    write(split / "test_human.json", [{"imgname": "41699051005347.png", "query": "What is the peak?", "label": "62"}])
    write(split / "test_augmented.json", [{"imgname": "41699051005347.png", "query": "Lowest?", "label": "Yes"}])
    write(tmp_path / "ChartQA Dataset" / "val" / "val_human.json", [])
    recs = load_chartqa(tmp_path / "ChartQA Dataset", split="test")
    assert [(r.record_id, r.question, r.answers, r.metric) for r in recs] == [
        ("augmented:0", "Lowest?", ("Yes",), "relaxed_accuracy"), ("human:0", "What is the peak?", ("62",),
                                                                   "relaxed_accuracy")]
    assert recs[0].image == split / "png" / "41699051005347.png"
    (split / "png" / "41699051005347.png").unlink()
    with pytest.raises(FileNotFoundError, match=r"png/ beside the JSON"):
        load_chartqa(split / "test_human.json")


def png_bytes(colour: str) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (30, 20), colour).save(buf, format="PNG")
    return buf.getvalue()


def test_parquet_exports_are_read_offline_and_images_cached_by_content(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("ARR_COC_CACHE", str(tmp_path / "cache"))
    red, blue = png_bytes("red"), png_bytes("blue")
    folder = tmp_path / "DocVQA"
    folder.mkdir()
    pq.write_table(pa.table({
        "questionId": ["q1", "q2", "q3"], "question": ["Date?", "Name?", "Total?"],
        "answers": [["1 May"], ["Ann", "ann b"], ["9"]],
        "image": [{"bytes": red, "path": "a.png"}, {"bytes": red, "path": "a.png"}, {"bytes": blue, "path": None}]}),
        folder / "validation-00000-of-00001.parquet")
    pq.write_table(pa.table({"questionId": ["t1"], "question": ["Q?"], "answers": [None],
                             "image": [{"bytes": blue, "path": None}]}), folder / "test-00000-of-00001.parquet")
    recs = load_docvqa(folder, split="val")
    assert [(r.record_id, r.answers) for r in recs] == [("q1", ("1 May",)), ("q2", ("Ann", "ann b")), ("q3", ("9",))]
    assert recs[0].image == recs[1].image != recs[2].image and recs[0].image_id == recs[1].image_id
    assert recs[0].image.parent == tmp_path / "cache" / "images" and recs[0].image.read_bytes() == red
    assert Image.open(recs[2].image).getpixel((0, 0)) == (0, 0, 255)
    with pytest.raises(ValueError, match=r"has no answers"):
        load_docvqa(folder, split="test")
    chart = tmp_path / "chartqa" / "data"
    chart.mkdir(parents=True)
    pq.write_table(pa.table({"image": [{"bytes": red, "path": None}], "query": ["Peak?"], "label": [["62"]],
                             "human_or_machine": [0]}), chart / "test-00000-of-00001.parquet")
    (c,) = load_dataset("chartqa", tmp_path / "chartqa", split="test")
    assert (c.question, c.answers, c.metric, c.record_id) == ("Peak?", ("62",), "relaxed_accuracy",
                                                              "test-00000-of-00001:0")
    pq.write_table(pa.table({"text": ["x"]}), chart / "test-00000-of-00001.parquet")
    with pytest.raises(ValueError, match=r"expected columns question \(or query\), answers"):
        load_chartqa(chart, split="test")


def test_registry_lists_the_benchmarks() -> None:
    assert DATASETS.names()[-4:] == ["docvqa", "infovqa", "textvqa", "chartqa"]
