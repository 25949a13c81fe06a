"""Dataset loaders on tiny fixtures built here, plus the real data in ../shared/data when present."""
from __future__ import annotations

import json
import warnings
from collections import Counter
from pathlib import Path

import pytest
from PIL import Image

from arr_coc.data.coco import load_coco
from arr_coc.data.datasets import DATASETS, SPLITS, DatasetSpec, Record, default_root, load_dataset, register, split_of
from arr_coc.data.funsd import load_funsd
from arr_coc.data.jsonl import jsonl_format_help, load_jsonl
from arr_coc.data.sroie import SroieReport, load_sroie, match_sroie_value
from arr_coc.eval.metrics import ANSWER_METRICS
from arr_coc.eval.reading import READERS
from arr_coc.registry import UnknownNameError


def image(path: Path, w: int, h: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (w, h), "white").save(path)
    return path


def entity(i: int, label: str, text: str, box: list[int], links: list[list[int]]) -> dict:
    return {"id": i, "label": label, "text": text, "box": box, "words": [], "linking": links}


# ---------------------------------------------------------------------------------------------- FUNSD
@pytest.fixture
def funsd(tmp_path: Path) -> Path:
    base = tmp_path / "funsd" / "training_data"
    (base / "annotations").mkdir(parents=True)
    form1 = [
        entity(0, "question", " Date: ", [10, 10, 50, 20], [[0, 1], [7, 0]]),
        entity(1, "answer", "12/03", [60, 10, 100, 20], [[0, 1]]),
        entity(2, "question", "Names:", [10, 40, 50, 50], [[2, 3], [2, 4]]),
        entity(3, "answer", "Bob", [60, 60, 100, 70], [[2, 3]]),  # lower: read second
        entity(4, "answer", "Alice", [60, 40, 100, 50], [[2, 4]]),
        entity(5, "question", "Fax:", [10, 80, 50, 90], [[5, 6]]),
        entity(6, "answer", "  ", [60, 80, 100, 90], [[5, 6]]),  # empty answer: no record
        entity(7, "header", "FORM", [0, 0, 40, 8], [[7, 0]]),  # header -> question: not a record
        entity(8, "answer", "42", [80, 92, 150, 99], [[9, 8]]),  # runs past the 120 px wide image
        entity(9, "question", "Total:", [10, 92, 50, 99], [[9, 8]]),
    ]
    form2 = [entity(0, "question", "To:", [5, 5, 20, 15], [[0, 1]]),
             entity(1, "answer", "Ann", [25, 5, 60, 15], [[0, 1]])]
    for stem, form in (("f1", form1), ("f2", form2), ("f3", [entity(0, "other", "x", [0, 0, 5, 5], [])])):
        (base / "annotations" / f"{stem}.json").write_text(json.dumps({"form": form}))
    image(base / "images" / "f1.png", 120, 100)
    image(base / "images" / "f2.png", 80, 40)
    return tmp_path / "funsd"


def test_funsd_gives_linked_answers_in_reading_order_as_yx_boxes(funsd: Path) -> None:
    img = funsd / "training_data" / "images"
    date = (10.0, 60.0, 20.0, 100.0)
    alice, bob, total = (40.0, 60.0, 50.0, 100.0), (60.0, 60.0, 70.0, 100.0), (92.0, 80.0, 99.0, 120.0)
    assert load_funsd(funsd) == [
        Record("funsd", "f1#0", img / "f1.png", "f1", "Date:", "12/03", (date,), (alice, bob, total),
               group="template:f1", kind="number"),  # a day and month without a year: digits, not a date
        Record("funsd", "f1#2", img / "f1.png", "f1", "Names:", "Alice Bob", (alice, bob), (date, total),
               group="template:f1", kind="short text"),
        Record("funsd", "f1#9", img / "f1.png", "f1", "Total:", "42", (total,), (date, alice, bob),
               group="template:f1", kind="number"),
        Record("funsd", "f2#0", img / "f2.png", "f2", "To:", "Ann", ((5.0, 25.0, 15.0, 60.0),), (),
               group="template:f2", kind="short text"),
    ]


def test_funsd_names_the_forms_that_give_no_records(funsd: Path) -> None:
    with pytest.warns(UserWarning, match=r"FUNSD: 1 form\(s\) give no records .*'linking' lists\): f3\.json$"):
        load_funsd(funsd)
    (funsd / "training_data" / "annotations" / "f3.json").unlink()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every form gives records: nothing to say
        assert len(load_funsd(funsd)) == 4


def test_funsd_accepts_the_training_data_folder_as_root(funsd: Path) -> None:
    assert load_funsd(funsd / "training_data") == load_funsd(funsd)


def test_funsd_errors_say_what_is_missing(funsd: Path, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"FUNSD folder /x/y not found; pass --data DIR or set ARR_COC_DATA"):
        load_funsd(Path("/x/y"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"has no annotations/ subfolder"):
        load_funsd(tmp_path / "empty")
    (funsd / "training_data" / "annotations" / "f2.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"f2\.json: malformed JSON"):
        load_funsd(funsd)
    for f in (funsd / "training_data" / "annotations").glob("*.json"):
        f.unlink()
    with pytest.raises(ValueError, match=r"no records found in FUNSD folder"):
        load_funsd(funsd)


# ---------------------------------------------------------------------------------------------- SROIE
def box_line(x0: int, y0: int, x1: int, y1: int, text: str) -> str:
    return f"{x0},{y0},{x1},{y0},{x1},{y1},{x0},{y1},{text}\n"


@pytest.fixture
def sroie(tmp_path: Path) -> Path:
    root = tmp_path / "sroie"
    for d in ("box", "key"):
        (root / d).mkdir(parents=True)
    image(root / "img" / "000.jpg", 200, 300)
    image(root / "img" / "001.jpg", 200, 300)
    lines0 = [
        box_line(10, 10, 150, 20, "ACME SDN BHD"),
        box_line(10, 22, 150, 32, "NO 5, JALAN SATU,"),  # the address over two lines, OCR slip: 81IOO
        box_line(10, 34, 150, 44, "81IOO JOHOR."),
        box_line(10, 50, 150, 60, "01/02/2018 10:11:12"),
        box_line(10, 70, 150, 80, "SUBTOTAL 19.00"),  # holds 9.00 only inside a longer number
        box_line(10, 90, 150, 100, "TOTAL 9.00"),
        box_line(10, 110, 250, 120, "CASH RM9.00"),  # runs past the 200 px wide image
    ]
    (root / "box" / "000.csv").write_text("".join(lines0))
    (root / "key" / "000.json").write_text(json.dumps(
        {"company": "ACME SDN BHD", "date": "01/02/2018", "address": "NO 5, JALAN SATU, 81100 JOHOR", "total": "9.00"}))
    lines1 = box_line(5, 5, 100, 15, "CAFÉ 7, RUE").encode("latin-1")  # not UTF-8, as in some real files
    lines1 += box_line(5, 20, 100, 30, "02.03.2019 TOTAL 12.50").encode()
    (root / "box" / "001.csv").write_bytes(lines1)
    (root / "key" / "001.json").write_text(json.dumps(
        {"company": "ZEBRA TRADING", "date": "02.03.2019", "address": "", "total": "12.50"}))
    return root


def test_sroie_recovers_exact_and_fuzzy_boxes_and_reports_skips(sroie: Path) -> None:
    report = SroieReport()
    recs = {r.record_id: r for r in load_sroie(sroie, report=report)}
    assert sorted(recs) == ["000#address", "000#company", "000#date", "000#total", "001#date", "001#total"]
    assert recs["000#company"].question == "What is the company name?"
    assert recs["000#company"].boxes_px == ((10.0, 10.0, 20.0, 150.0),)
    assert recs["000#address"].answer == "NO 5, JALAN SATU, 81100 JOHOR"
    assert recs["000#address"].boxes_px == ((22.0, 10.0, 32.0, 150.0), (34.0, 10.0, 44.0, 150.0))
    assert recs["000#date"].boxes_px == ((50.0, 10.0, 60.0, 150.0),)
    assert recs["000#total"].question == "What is the total?"
    assert recs["000#total"].boxes_px == ((90.0, 10.0, 100.0, 150.0), (110.0, 10.0, 120.0, 200.0))
    assert recs["001#total"].boxes_px == recs["001#date"].boxes_px == ((20.0, 5.0, 30.0, 100.0),)
    assert recs["001#date"].others_px == ((20.0, 5.0, 30.0, 100.0),)
    assert (report.exact, report.fuzzy, report.skipped) == (5, 1, ["001#company"])
    assert report.summary() == "SROIE boxes: 5 exact, 1 fuzzy, 1 skipped"


def test_sroie_value_inside_a_longer_number_is_not_a_match() -> None:
    lines = [((0, 0, 1, 1), "SUBTOTAL 19.00"), ((1, 0, 2, 1), "9.005")]
    assert match_sroie_value("9.00", lines)[0] != "exact"


def test_sroie_errors_name_the_file(sroie: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"SROIE folder .*/nowhere not found; pass --data DIR"):
        load_sroie(sroie / "nowhere")
    (sroie / "key" / "001.json").write_text("{oops")
    with pytest.raises(ValueError, match=r"key/001\.json: malformed JSON"):
        load_sroie(sroie)
    (sroie / "key" / "001.json").unlink()
    (sroie / "box" / "000.csv").write_text("1,2,3,TOTAL\n")
    with pytest.raises(ValueError, match=r"000\.csv:1: expected x1,y1,x2,y2,x3,y3,x4,y4,transcript"):
        load_sroie(sroie)
    (sroie / "key").rename(sroie / "keys")
    with pytest.raises(FileNotFoundError, match=r"has no key/ subfolder"):
        load_sroie(sroie)


# ----------------------------------------------------------------------------------------------- COCO
@pytest.fixture
def coco(tmp_path: Path) -> Path:
    root = tmp_path / "coco128"
    (root / "labels" / "train2017").mkdir(parents=True)
    names = "names:\n  0: person\n  1: cat  # a comment\n  2: traffic light\n"
    (root / "classes.yaml").write_text("path: .\ntrain: images/train2017\n\n" + names)
    image(root / "images" / "train2017" / "a.jpg", 100, 50)
    image(root / "images" / "train2017" / "b.jpg", 60, 60)  # no label file: no objects
    (root / "labels" / "train2017" / "a.txt").write_text("0 0.5 0.5 0.2 0.4\n2 0.1 0.2 0.1 0.2\n0 0.95 0.5 0.2 0.4\n")
    (root / "labels" / "train2017" / "c.txt").write_text("1 0.5 0.5 0.2 0.2\n")  # no image: skipped
    return root


def test_coco_gives_one_record_per_category_with_pixel_boxes(coco: Path) -> None:
    img = coco / "images" / "train2017" / "a.jpg"
    person = ((15.0, 40.0, 35.0, 60.0), (15.0, 85.0, 35.0, 100.0))  # the second is clipped at x = 100
    light = ((5.0, 5.0, 15.0, 15.0),)
    assert load_coco(coco) == [
        Record("coco", "a#person", img, "a", "Where is the person?", "", person, light, kind="person"),
        Record("coco", "a#traffic light", img, "a", "Where is the traffic light?", "", light, person,
               kind="traffic light"),
    ]


def test_coco_errors_say_what_is_malformed(coco: Path) -> None:
    (coco / "labels" / "train2017" / "a.txt").write_text("0 0.5 0.5 0.2\n")
    with pytest.raises(ValueError, match=r"a\.txt:1: expected 'class cx cy w h'"):
        load_coco(coco)
    (coco / "labels" / "train2017" / "a.txt").write_text("7 0.5 0.5 0.2 0.2\n")
    with pytest.raises(ValueError, match=r"a\.txt:1: class 7 is not in classes.yaml"):
        load_coco(coco)
    (coco / "classes.yaml").unlink()
    with pytest.raises(FileNotFoundError, match=r"has no classes.yaml"):
        load_coco(coco)
    with pytest.raises(FileNotFoundError, match=r"has no images/train2017/ subfolder"):
        load_coco(coco / "labels")


@pytest.mark.parametrize("line, problem", [
    ("0 nan 0.5 0.2 0.2", "the box holds NaN or Infinity; boxes are finite (cx cy w h, normalised)"),
    ("0 0.5 0.5 Infinity 0.2", "the box holds NaN or Infinity; boxes are finite (cx cy w h, normalised)"),
    ("0 0.5 0.5 0 0.2", "the box needs w > 0 and h > 0 (cx cy w h, normalised)"),
    ("0 0.5 0.5 0.2 -0.1", "the box needs w > 0 and h > 0 (cx cy w h, normalised)"),
    ("0 1.5 0.5 0.2 0.2", "the box lies outside the 100x50 image a.jpg"),
    ("2 0.5 -0.5 0.2 0.2", "the box lies outside the 100x50 image a.jpg"),
])
def test_coco_refuses_boxes_that_are_not_finite_have_no_size_or_lie_outside(coco: Path, line: str,
                                                                           problem: str) -> None:
    label = coco / "labels" / "train2017" / "a.txt"
    label.write_text(f"0 0.5 0.5 0.2 0.4\n\n{line}\n")  # the bad box is on line 3
    with pytest.raises(ValueError) as err:
        load_coco(coco)
    assert str(err.value) == f"{label}:3: {problem}"
    label.write_text("0 0.5 0.5 0.2 0.4\n\n0 0.95 0.5 0.2 0.4\n")  # control: partly outside is clipped, kept
    assert [r.boxes_px for r in load_coco(coco)] == [((15.0, 40.0, 35.0, 60.0), (15.0, 85.0, 35.0, 100.0))]


# ---------------------------------------------------------------------------------------------- JSONL
def write_jsonl(path: Path, rows: list[dict | str]) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


@pytest.fixture
def jsonl(tmp_path: Path) -> Path:
    image(tmp_path / "scans" / "a.png", 100, 80)
    b = image(tmp_path / "elsewhere" / "b.png", 50, 50)
    return write_jsonl(tmp_path / "mine.jsonl", [
        {"image": "scans/a.png", "question": " Total? ", "answer": "9", "boxes": [[10, 20, 30, 40]], "id": "t"},
        "",
        {"image": "scans/a.png", "question": "Date?", "answer": "1/2", "boxes": [[50, 5, 120, 15], [0, 60, 10, 70]]},
        {"image": str(b), "question": "Where is the dog?", "answer": "", "boxes": [[1, 2, 3, 4]], "image_id": "dog"},
    ])


def test_jsonl_converts_xyxy_to_yx_and_resolves_relative_images(jsonl: Path) -> None:
    a, b = jsonl.parent / "scans" / "a.png", jsonl.parent / "elsewhere" / "b.png"
    total, dates = ((20.0, 10.0, 40.0, 30.0),), ((5.0, 50.0, 15.0, 100.0), (60.0, 0.0, 70.0, 10.0))  # 120 clipped
    assert load_jsonl(jsonl) == [
        Record("jsonl", "t", a, str(a), "Total?", "9", total, dates),
        Record("jsonl", "mine:3", a, str(a), "Date?", "1/2", dates, total),
        Record("jsonl", "mine:4", b, "dog", "Where is the dog?", "", ((2.0, 1.0, 4.0, 3.0),), ()),
    ]
    assert load_jsonl(jsonl.parent) == load_jsonl(jsonl) == load_dataset("jsonl", jsonl)
    assert "boxes" in jsonl_format_help() and "[x0, y0, x1, y1]" in jsonl_format_help()


GOOD = {"image": "scans/a.png", "question": "Q?", "answer": "A", "boxes": [[1, 2, 3, 4]]}


@pytest.mark.parametrize("line, message", [
    ("{bad json", r"bad\.jsonl:1: malformed JSON"),
    ('["a"]', r"bad\.jsonl:1: expected a JSON object, got list"),
    (json.dumps({k: v for k, v in GOOD.items() if k != "answer"}), r"bad\.jsonl:1: missing key\(s\) answer"),
    (json.dumps({**GOOD, "question": " "}), r"bad\.jsonl:1: 'question' is empty"),
    (json.dumps({**GOOD, "boxes": [[1, 2, 3]]}), r"bad\.jsonl:1: box 0 \[1, 2, 3\] is not 4 numbers"),
    (json.dumps({**GOOD, "boxes": [[5, 2, 5, 4]]}), r"bad\.jsonl:1: box 0 \[5, 2, 5, 4\] needs x1 > x0 and y1 > y0"),
    (json.dumps({**GOOD, "boxes": []}), r"bad\.jsonl:1: 'boxes' must be a non-empty list"),
    (json.dumps({**GOOD, "image": "missing.png"}), r"bad\.jsonl:1: image .*missing\.png not found"),
    (json.dumps({k: v for k, v in GOOD.items() if k != "answer"} | {"answers": []}),
     r"bad\.jsonl:1: 'answers' must be a non-empty list of strings or of \{\"answer\": string\}"),
    (json.dumps({**GOOD, "answers": [{"answer": 2}]}), r"bad\.jsonl:1: 'answers' must be a non-empty list"),
    (json.dumps({**GOOD, "boxes": [[200, 200, 300, 300]]}), r"bad\.jsonl:1: every box lies outside the 100x80 image"),
])
def test_jsonl_errors_name_file_line_and_problem(jsonl: Path, line: str, message: str) -> None:
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        load_jsonl(write_jsonl(jsonl.parent / "bad.jsonl", [line]))


def test_jsonl_reads_vqav2_style_answers_and_records_without_boxes(jsonl: Path) -> None:
    path = write_jsonl(jsonl.parent / "vqa.jsonl", [
        {"image": "scans/a.png", "question": "How many?", "answers": [{"answer": "2"}, {"answer": "two"},
                                                                      {"answer": "2", "answer_confidence": "yes"}]},
        {"image": "scans/a.png", "question": "Colour?", "answer": "red"},
        {"image": "scans/a.png", "question": "Which?", "answer": "b", "answers": ["a", "b"], "boxes": [[1, 2, 3, 4]]},
    ])
    r1, r2, r3 = load_jsonl(path)
    assert (r1.answer, r1.answers, r1.references, r1.metric, r1.boxes_px) == (
        "2", ("2", "two", "2"), ("2", "two", "2"), "vqa_accuracy", ())
    assert (r2.answer, r2.answers, r2.references, r2.metric, r2.boxes_px) == ("red", (), ("red",), "anls", ())
    assert (r3.answer, r3.answers, r3.boxes_px) == ("b", ("a", "b"), ((2.0, 1.0, 4.0, 3.0),))


def test_jsonl_rejects_duplicate_ids_folders_with_several_files_and_no_path(jsonl: Path) -> None:
    with pytest.raises(ValueError, match=r"dup\.jsonl:2: duplicate id 'x'"):
        load_jsonl(write_jsonl(jsonl.parent / "dup.jsonl", [{**GOOD, "id": "x"}, {**GOOD, "id": "x"}]))
    with pytest.raises(ValueError, match=r"holds 2 \.jsonl files; expected exactly one"):
        load_jsonl(jsonl.parent)
    with pytest.raises(ValueError, match=r"needs a file: pass --data FILE\.jsonl"):
        load_dataset("jsonl")
    with pytest.raises(ValueError, match=r"no records found in JSONL"):
        load_jsonl(write_jsonl(jsonl.parent / "dup.jsonl", [""]))


# -------------------------------------------------------------------------------- registry and subsets
def test_registry_holds_every_loader_and_unknown_names_list_them() -> None:
    assert DATASETS.names() == ["funsd", "sroie", "coco", "jsonl", "texlive", "texlive-paraphrase", "image-paraphrase",
                                "texlive-contexts", "contexts", "docvqa", "infovqa", "textvqa", "chartqa", "mpdocvqa", "slidevqa"]
    with pytest.raises(UnknownNameError, match=r"unknown dataset 'vqav2'; known: funsd, sroie, coco, jsonl, texlive, texlive-paraphrase"):
        load_dataset("vqav2")


@pytest.mark.parametrize("name", DATASETS.names())
def test_every_spec_names_a_known_metric_reader_and_a_prompt_with_the_question(name: str) -> None:
    spec = DATASETS.get(name)
    assert spec.name == name and spec.title and spec.metric in ANSWER_METRICS
    assert spec.reader in (None, "vlm", *READERS.names()) and spec.splits in ("hash", "official")
    assert spec.prompt.format(question="What is the total?").startswith("What is the total?\n")


def test_specs_say_how_each_dataset_is_read_split_and_scored() -> None:
    table = {n: (s.title, s.splits, s.metric, s.reader, s.folder) for n, s in ((n, DATASETS.get(n)) for n in DATASETS)}
    assert table == {
        "funsd": ("FUNSD", "hash", "anls", "tesseract", "funsd"),
        "sroie": ("SROIE", "hash", "anls", "tesseract", "sroie"),
        "coco": ("COCO128", "hash", "anls", None, "coco128"),  # boxes, no text: coverage only
        "jsonl": ("JSONL", "hash", "anls", "tesseract", None),
        "texlive": ("TeX Live manuals", "official", "anls", "tesseract", None),  # pages rendered to a cache
        "docvqa": ("DocVQA", "official", "anls", "vlm", None),
        "infovqa": ("InfoVQA", "official", "anls", "vlm", None),
        "textvqa": ("TextVQA", "official", "vqa_accuracy", "vlm", None),
        "chartqa": ("ChartQA", "official", "relaxed_accuracy", "vlm", None),
        "mpdocvqa": ("MP-DocVQA", "official", "anls", "vlm", None),  # several pages per record
        "slidevqa": ("SlideVQA", "official", "anls", "vlm", None),
        # hand-written: whole PDF windows without boxes; receipts and forms with the annotation's boxes
        "texlive-paraphrase": ("TeX Live paraphrased questions", "official", "anls", "vlm", None),
        "image-paraphrase": ("Paraphrased receipts and forms", "official", "anls", "tesseract", ""),
        # records that are whole contexts, read by the context reader (DatasetSpec.contexts)
        "texlive-contexts": ("TeX Live contexts", "official", "anls", "tesseract", None),
        "contexts": ("Your questions over your documents", "hash", "anls", "tesseract", None),
    }
    of_contexts = {n: (DATASETS.get(n).context_options, DATASETS.get(n).documents_of) for n in DATASETS
                   if DATASETS.get(n).contexts is not None}
    assert of_contexts == {"texlive-paraphrase": (("dpi", "source"), "texlive"), "contexts": (("dpi",), None),
                           "texlive-contexts": (("window", "source", "dpi", "questions", "contexts"), "texlive")}


def test_a_spec_loads_unregistered_splits_by_image_and_refuses_bad_fields(jsonl: Path) -> None:
    mine = DatasetSpec("mine", "Mine", lambda root: load_jsonl(jsonl))
    assert load_dataset(mine) == load_jsonl(jsonl) and "mine" not in DATASETS
    for split in SPLITS:  # the hash split by image: every record of an image lands in the same split
        want = [r for r in load_jsonl(jsonl) if split_of(r.image_id, "jsonl") == split]
        assert load_dataset(mine, split=split) == want
    with pytest.raises(ValueError, match=r"unknown split 'dev'; choose one of train, val, test"):
        load_dataset(mine, split="dev")
    with pytest.raises(ValueError, match=r"dataset 'x': splits must be 'hash' or 'official', got 'random'"):
        DatasetSpec("x", "X", load_jsonl, splits="random")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"dataset 'x': the prompt must hold \{question\}, got 'Answer.'"):
        DatasetSpec("x", "X", load_jsonl, prompt="Answer.")
    with pytest.raises(ValueError, match=r"dataset 'funsd' is already registered"):
        register(DatasetSpec("funsd", "FUNSD again", load_jsonl))


def test_default_root_follows_arr_coc_data(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ARR_COC_DATA", str(tmp_path))
    roots = [default_root(n) for n in ("funsd", "sroie", "coco")]
    assert roots == [tmp_path / "funsd", tmp_path / "sroie", tmp_path / "coco128"]
    monkeypatch.delenv("ARR_COC_DATA")
    assert default_root("coco") == Path(__file__).resolve().parents[3] / "shared" / "data" / "coco128"
    with pytest.raises(ValueError, match=r"'jsonl' has no default folder"):
        default_root("jsonl")


@pytest.fixture
def many(tmp_path: Path) -> Path:
    """6 images with 3 questions each."""
    rows = []
    for i in range(6):
        image(tmp_path / f"{i}.png", 20, 20)
        rows += [{"image": f"{i}.png", "question": f"q{j}", "answer": "", "boxes": [[0, 0, 5, 5]], "id": f"{i}-{j}"}
                 for j in range(3)]
    return write_jsonl(tmp_path / "many.jsonl", rows)


def test_limit_is_reproducible_spread_over_images_and_grows_by_prefix(many: Path) -> None:
    six = load_dataset("jsonl", many, limit=6, seed=3)
    assert six == load_dataset("jsonl", many, limit=6, seed=3)
    assert len({r.image_id for r in six}) == 6 and all(r.record_id.endswith("-0") for r in six)
    assert load_dataset("jsonl", many, limit=10, seed=3)[:6] == six
    assert [r.record_id for r in six] != [r.record_id for r in load_dataset("jsonl", many, limit=6, seed=4)]
    everything = load_dataset("jsonl", many)
    assert len(everything) == 18 and set(load_dataset("jsonl", many, limit=100)) == set(everything)
    with pytest.raises(ValueError, match=r"limit must be a positive number of records, got 0"):
        load_dataset("jsonl", many, limit=0)



def test_limit_balances_question_kinds_then_images_with_exact_counts(tmp_path: Path) -> None:
    """Kind "a" on all 6 images, "b" on 4, "c" on 1 (twice): turns by kind, least-used image first."""
    rows = []
    for i in range(6):
        image(tmp_path / f"{i}.png", 20, 20)
        kinds = ["a"] + (["b"] if i < 4 else []) + (["c", "c"] if i == 0 else [])
        rows += [{"image": f"{i}.png", "question": f"q{j}", "answer": "", "boxes": [[0, 0, 5, 5]],
                  "id": f"{i}-{j}", "kind": k} for j, k in enumerate(kinds)]
    path = write_jsonl(tmp_path / "kinds.jsonl", rows)
    for limit, want in ((3, {"a": 1, "b": 1, "c": 1}), (6, {"a": 2, "b": 2, "c": 2}), (8, {"a": 3, "b": 3, "c": 2}),
                        (10, {"a": 4, "b": 4, "c": 2}), (100, {"a": 6, "b": 4, "c": 2})):
        picked = load_dataset("jsonl", path, limit=limit, seed=1)
        assert Counter(r.kind for r in picked) == want, limit
        assert picked == load_dataset("jsonl", path, limit=100, seed=1)[:limit]  # a prefix of a larger limit
    six = load_dataset("jsonl", path, limit=6, seed=1)
    for kind in "ab":  # a kind reuses no image while it has records on an unused one
        ids = [r.image_id for r in six if r.kind == kind]
        assert len(set(ids)) == len(ids) == 2
    # negative control: ignoring kinds (all "") gives the image round-robin, 3 of 6 "a" at limit 6
    plain = write_jsonl(tmp_path / "plain.jsonl", [{k: v for k, v in r.items() if k != "kind"} for r in rows])
    assert [r.image_id for r in load_dataset("jsonl", plain, limit=6, seed=1)] != [r.image_id for r in six]
    assert len({r.image_id for r in load_dataset("jsonl", plain, limit=6, seed=1)}) == 6


@pytest.mark.parametrize("name, kinds", [("sroie", {"company", "date", "address", "total"}),
                                         ("funsd", {"date", "number", "short text", "long text"})])
def test_real_limit_40_is_ten_questions_of_every_kind(name: str, kinds: set) -> None:
    picked = load_dataset(name, real(name), limit=40, split="test")
    assert Counter(r.kind for r in picked) == {k: 10 for k in kinds}
    assert len({r.image_id for r in picked}) >= 25  # spread over the images too


def test_real_coco_limit_takes_one_question_per_category_before_any_second() -> None:
    picked = load_dataset("coco", real("coco"), limit=40, split="test")
    assert len(picked) == 40 and len({r.kind for r in picked}) == 40
    assert all(r.question == f"Where is the {r.kind}?" for r in picked)

# ---------------------------------------------------------------------------------------- real data
def real(name: str) -> Path:
    root = default_root(name)
    if not root.is_dir():
        pytest.skip(f"{name} data not found at {root} (set ARR_COC_DATA to the folder holding {root.name}/)")
    return root


def assert_boxes_inside_images(records: list[Record]) -> None:
    sizes: dict[Path, tuple[int, int]] = {}
    for r in records:
        if r.image not in sizes:
            with Image.open(r.image) as im:
                sizes[r.image] = im.size
        w, h = sizes[r.image]
        assert r.boxes_px, r.record_id
        for y0, x0, y1, x1 in r.boxes_px + r.others_px:
            assert 0 <= y0 < y1 <= h and 0 <= x0 < x1 <= w, (r.record_id, (y0, x0, y1, x1), (w, h))


@pytest.mark.slow
def test_real_funsd_has_over_1000_questions_from_149_forms() -> None:
    recs = load_dataset("funsd", real("funsd"))
    assert len(recs) > 1000 and len({r.record_id for r in recs}) == len(recs)
    assert len(list((default_root("funsd") / "training_data" / "annotations").glob("*.json"))) == 149
    print(f"FUNSD: {len(recs)} records from {len({r.image_id for r in recs})} forms")
    assert_boxes_inside_images(recs)


@pytest.mark.slow
def test_real_sroie_recovers_at_least_500_answer_boxes() -> None:
    report = SroieReport()
    recs = load_sroie(real("sroie"), report=report)
    print(f"SROIE: {len(recs)} records; {report.summary()}: {report.skipped}")
    assert len(recs) >= 500 and report.exact + report.fuzzy == len(recs)
    assert len(report.skipped) <= 10
    assert_boxes_inside_images(recs)


@pytest.mark.slow
def test_real_coco_has_over_200_category_questions() -> None:
    recs = load_dataset("coco", real("coco"))
    print(f"COCO128: {len(recs)} records from {len({r.image_id for r in recs})} images")
    assert len(recs) > 200 and all(r.answer == "" and r.question.startswith("Where is the ") for r in recs)
    assert_boxes_inside_images(recs)
