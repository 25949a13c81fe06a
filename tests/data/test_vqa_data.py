"""DocVQA, InfoVQA, TextVQA and ChartQA loaders on hand-made fixtures in each official format and in parquet."""
from __future__ import annotations

import io
import json
import warnings
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
    assert DATASETS.names()[-6:] == ["docvqa", "infovqa", "textvqa", "chartqa", "mpdocvqa", "slidevqa"]


# --------------------------------------------------------------------------- strict and loud loading
def docvqa_val(root: Path, items: list[dict]) -> Path:
    """A DocVQA val file of ``items`` over one image, pgaa0001.png."""
    image(root / "spdocvqa_images" / "pgaa0001.png")
    return write(root / "spdocvqa_qas" / "val_v1.0.json",
                 {"data": [{"question": "Q?", "image": "documents/pgaa0001.png", **d} for d in items]})


def test_a_clean_benchmark_loads_without_a_warning_and_unchanged(docvqa: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the load
        recs = load_docvqa(docvqa, split="val")
    assert [(r.record_id, r.answer, r.answers) for r in recs] == [
        ("7", "12/03/1998", ("12/03/1998", "12-03-1998")), ("8", "Dr. Ann", ("Dr. Ann",)), ("9", "9.00", ("9.00",))]


def test_answers_of_any_json_scalar_become_their_json_text(tmp_path: Path) -> None:
    root = tmp_path / "docvqa"
    docvqa_val(root, [{"questionId": 1, "answers": [3, 2.5, True, False, "3", None]},
                      {"questionId": 2, "answers": 7}, {"questionId": 3, "answers": "seven"}])
    recs = load_docvqa(root, split="val")
    assert [r.answers for r in recs] == [("3", "2.5", "true", "false", "3"), ("7",), ("seven",)]
    assert recs[0].answer == "3"  # the most frequent reference: the int 3 and the text "3" are one answer
    split = tmp_path / "ChartQA" / "test"
    image(split / "png" / "c.png")
    write(split / "test_human.json", [{"imgname": "c.png", "query": "Peak?", "label": 62},
                                      {"imgname": "c.png", "query": "Share?", "label": 0.125},
                                      {"imgname": "c.png", "query": "Rising?", "label": True}])
    assert [r.answers for r in load_chartqa(split / "test_human.json")] == [("62",), ("0.125",), ("true",)]


@pytest.mark.parametrize("answers, kind", [
    ({"text": "x"}, "a JSON object"), ([{"answer": "x"}], "a JSON object"), ([["x"]], "a JSON list"),
    (float("nan"), "NaN or Infinity"), ([float("inf")], "NaN or Infinity")])
def test_answers_that_are_not_text_or_numbers_are_refused_by_row(tmp_path: Path, answers, kind: str) -> None:
    path = docvqa_val(tmp_path, [{"questionId": 1, "answers": ["ok"]}, {"questionId": 2, "answers": answers}])
    with pytest.raises(ValueError) as err:
        load_docvqa(path)
    assert str(err.value) == f"{path}: item 1: an answer is {kind}; answers are text, numbers or true / false"


def test_a_question_id_that_is_not_text_or_an_integer_is_refused_by_row(tmp_path: Path) -> None:
    path = docvqa_val(tmp_path, [{"questionId": {"id": 1}, "answers": ["a"]}])
    with pytest.raises(ValueError) as err:
        load_docvqa(path)
    assert str(err.value) == f"{path}: item 0: the question id is a JSON object; expected text or an integer"


def test_a_repeated_question_id_is_refused_naming_both_rows(tmp_path: Path) -> None:
    path = docvqa_val(tmp_path, [{"questionId": 7, "answers": ["a"]}, {"questionId": 8, "answers": ["b"]},
                                 {"questionId": 7, "answers": ["c"]}])
    with pytest.raises(ValueError) as err:
        load_docvqa(path)
    assert str(err.value) == f"DocVQA: question id '7' repeats: {path}: item 0 and {path}: item 2"


def test_questions_without_answers_are_named_in_one_warning(tmp_path: Path) -> None:
    path = docvqa_val(tmp_path, [{"questionId": 1, "answers": ["a"]}, {"questionId": 2},
                                 {"questionId": 3, "answers": []}, {"questionId": 4, "answers": [None]}])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        recs = load_docvqa(path)
    assert [r.record_id for r in recs] == ["1"]
    assert [str(w.message) for w in caught] == [
        f"DocVQA: 3 question(s) have no answer and are left out: {path}: item 1 (id '2'); "
        f"{path}: item 2 (id '3'); {path}: item 3 (id '4')"]
    unanswered = [{"questionId": i} for i in range(1, 8)]
    many = docvqa_val(tmp_path / "many", [{"questionId": 0, "answers": ["a"]}, *unanswered])
    with pytest.warns(UserWarning) as caught:
        load_docvqa(many)
    assert len(caught) == 1 and str(caught[0].message) == (
        f"DocVQA: 7 question(s) have no answer and are left out: "
        + "; ".join(f"{many}: item {i} (id '{i}')" for i in range(1, 6)) + "; and 2 more")


def test_parquet_answers_ids_and_images_are_checked_by_row(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("ARR_COC_CACHE", str(tmp_path / "cache"))
    red = png_bytes("red")
    folder = tmp_path / "ChartQA"
    folder.mkdir()
    shard = folder / "test-00000-of-00001.parquet"
    pq.write_table(pa.table({"query": ["Peak?", "Low?"], "label": [62, 4],
                             "image": [{"bytes": red, "path": None}] * 2}), shard)
    assert [r.answers for r in load_chartqa(folder, split="test")] == [("62",), ("4",)]
    for n, (bad, problem) in enumerate([(b"not an image", "not a format PIL recognises (PNG, JPEG, TIFF, ...)"),
                                        (red[: len(red) // 2], "OSError: ")]):
        shard = folder / f"test-0000{n}-of-00001.parquet"
        pq.write_table(pa.table({"query": ["Peak?", "Low?"], "label": ["62", "4"],
                                 "image": [{"bytes": red, "path": None}, {"bytes": bad, "path": "x.png"}]}), shard)
        with pytest.raises(ValueError) as err:
            load_chartqa(shard)
        assert str(err.value).startswith(f"{shard}: row 1: the image cannot be read ({problem}")
        assert "cache" not in str(err.value)
        shard.unlink()
    assert len(list((tmp_path / "cache" / "images").iterdir())) == 1  # only the good image was cached
    pq.write_table(pa.table({"questionId": ["q1"], "question": ["Q?"], "answers": [["a"]],
                             "image": [{"bytes": red, "path": None}]}), folder / "val-00000-of-00002.parquet")
    pq.write_table(pa.table({"questionId": ["q1"], "question": ["Q?"], "answers": [["b"]],
                             "image": [{"bytes": red, "path": None}]}), folder / "val-00001-of-00002.parquet")
    with pytest.raises(ValueError) as err:
        load_docvqa(folder, split="val")
    assert str(err.value) == (f"DocVQA: question id 'q1' repeats: {folder / 'val-00000-of-00002.parquet'}: row 0 "
                              f"and {folder / 'val-00001-of-00002.parquet'}: row 0")
