"""Your own questions over your own documents (``arr-coc eval contexts --data FILE.jsonl``): the loader, its one-line
errors naming the line, and the evaluation end to end on a generated 3-page PDF."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from arr_coc.cli import main
from arr_coc.data.context_jsonl import load_contexts
from arr_coc.data.contexts import ContextQuestion
from arr_coc.documents.pdf import read_pdf
from arr_coc.eval.store import RowStore

FAST = ["--query-encoder", "hashing", "--channels", "mvp"]
PAGES = (("User manual", "version 4.2 of the tool"), ("Layout", "The default margin is 25 mm wide"),
         ("Credits", "Written by Ada Lovelace in London"))


def manual_pdf(path: Path) -> Path:
    """A 3-page PDF with a text layer: page i a heading and one line (PAGES)."""
    import matplotlib
    from matplotlib.backends.backend_pdf import PdfPages
    from matplotlib.figure import Figure

    with matplotlib.rc_context({"pdf.fonttype": 42}), PdfPages(path) as pdf:
        for head, line in PAGES:
            fig = Figure(figsize=(4.8, 3.6))
            fig.text(0.06, 0.85, head, fontsize=14)
            fig.text(0.06, 0.5, line, fontsize=10)
            pdf.savefig(fig)
    return path


QUESTIONS = [
    {"document": "manual.pdf", "question": "Which release is described?", "answers": ["4.2"], "answer_page": 1,
     "kind": "front"},
    {"document": "manual.pdf", "question": "How wide is the space around the text?", "answers": ["25 mm"],
     "answer_page": 2, "id": "margin", "kind": "value"},
    {"document": "manual.pdf", "pages": "2-3", "question": "Who is the author?", "answers": ["Ada Lovelace"],
     "answer_page": 3},  # its boxes: where the text layer says the author's name is (the fixture)
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("questions")
    manual_pdf(d / "manual.pdf")
    page = read_pdf(d / "manual.pdf", dpi=100, render=False).pages[2]
    boxes = [[b[1], b[0], b[3], b[2]] for b in words_box(page, "Ada", "Lovelace")]  # [x0, y0, x1, y1]
    (d / "q.jsonl").write_text("\n".join(json.dumps(q) for q in [*QUESTIONS[:2], {**QUESTIONS[2], "boxes": boxes}])
                               + "\n\n")
    return d


def words_box(page, *texts: str) -> tuple:
    return tuple(next(w.box for w in page.words if w.text == t) for t in texts)


def test_a_good_file_gives_the_contexts_and_questions_built_by_hand(folder: Path) -> None:
    items, made, sub = load_contexts(folder / "q.jsonl")
    items = list(items)
    text = read_pdf(folder / "manual.pdf", dpi=100, render=False).pages
    assert [(i.dataset, i.context_id, i.group) for i in items] == [("contexts", "manual.pdf", "manual.pdf"),
                                                                   ("contexts", "manual.pdf#2-3", "manual.pdf")]
    assert items[0].questions == [
        ContextQuestion("q:1", "Which release is described?", ("4.2",), (0,), (), "front",
                        found=(words_box(text[0], "4.2"),)),
        ContextQuestion("margin", "How wide is the space around the text?", ("25 mm",), (1,), (), "value",
                        found=(words_box(text[1], "25", "mm"),))]
    # boxes given as [x0, y0, x1, y1] become (y0, x0, y1, x1); page 3 is the window's second page
    assert items[1].questions == [ContextQuestion("q:3", "Who is the author?", ("Ada Lovelace",), (1,),
                                                  tuple(tuple(map(float, b)) for b in words_box(text[2], "Ada",
                                                                                                 "Lovelace")), "")]
    assert made == {"data": str(folder / "q.jsonl"), "split": None, "limit": None, "dpi": 100.0} and sub == ""
    ctx = items[1].load()
    assert [p.index for p in ctx.pages] == [1, 2] and ctx.pages[0].image is not None
    assert [len(list(load_contexts(folder / "q.jsonl", limit=n)[0])) for n in (1, 2, 3)] == [1, 1, 2]


GOOD = QUESTIONS[0]


@pytest.mark.parametrize("line, message", [
    ({k: v for k, v in GOOD.items() if k != "answer_page"}, "missing field 'answer_page'"),
    ({k: v for k, v in GOOD.items() if k != "answers"}, "missing field 'answers'"),
    ({**GOOD, "answers": []}, "'answers' must be a non-empty list of non-empty strings, got []"),
    ({**GOOD, "pages": "2-3", "answer_page": 1}, "'answer_page' 1 lies outside the pages 2-3"),
    ({**GOOD, "answer_page": 4}, "'answer_page' 4 lies outside the pages 1-3"),
    ({**GOOD, "answer_page": 0}, "'answer_page' must be a page number, 1-based, got 0"),
    ({**GOOD, "answers": ["Babbage"]}, "no answer (Babbage) on the text layer of page 1; give its 'boxes'"),
    ({**GOOD, "boxes": [[5, 5, 1, 9]]}, "'boxes' must be a list of [x0, y0, x1, y1] with x1 > x0 and y1 > y0, "
                                        "got [[5, 5, 1, 9]]"),
    ({**GOOD, "pages": "1-9"}, "cannot read {d}/manual.pdf: page 9 is out of range: {d}/manual.pdf has 3 pages "
                               "(numbered 1-3)"),
    ({**GOOD, "document": "gone.pdf"}, "document {d}/gone.pdf not found"),
    ({**GOOD, "document": "junk.pdf"}, "cannot read {d}/junk.pdf: {d}/junk.pdf is not a PDF (no %PDF- header); "
                                       "pass a PDF, or an image to load_image"),
    ({**GOOD, "id": "bad:1"}, "id 'bad:1' is used twice"),  # the first line's default id: FILE STEM:LINE
])
def test_each_bad_line_is_one_error_naming_its_line(folder: Path, line: dict, message: str) -> None:
    (folder / "junk.pdf").write_bytes(b"not a pdf")
    path = folder / "bad.jsonl"
    path.write_text(json.dumps(GOOD) + "\n" + json.dumps(line) + "\n")
    with pytest.raises(ValueError) as err:
        load_contexts(path)
    assert str(err.value) == f"{path}:2: {message.format(d=folder)}"


def test_malformed_json_and_an_empty_file_are_one_line(folder: Path) -> None:
    path = folder / "broken.jsonl"
    path.write_text(json.dumps(GOOD) + "\n{nope\n")
    with pytest.raises(ValueError, match=rf"^{path}:2: malformed JSON \(Expecting property name"):
        load_contexts(path)
    path.write_text("\n")
    with pytest.raises(ValueError, match=rf"^no question in {path}; write one JSON object a line"):
        load_contexts(path)
    with pytest.raises(ValueError, match=r"^contexts reads your questions: pass --data FILE\.jsonl"):
        load_contexts(None)


def test_eval_contexts_data_reads_every_question_of_the_file(folder: Path, tmp_path: Path, capsys) -> None:
    assert main(["eval", "contexts", "--data", str(folder / "q.jsonl"), "--compression", "2", "--methods", "full",
                 "coc", "equal_split", "--out", str(tmp_path), *FAST]) == 0
    rows = RowStore(tmp_path / "contexts").rows()
    assert sorted((r["record_id"], r["method"], r["budget"]) for r in rows) == sorted(
        (q, m, b) for q in ("q:1", "margin", "q:3") for m, b in (("full", "full"), ("coc", "2x"), ("equal_split", "2x")))
    full = {r["record_id"]: r for r in rows if r["method"] == "full"}
    # the whole context at full resolution: the answer's page is sent and its words all covered
    assert {q: (r["page_hit"], r["coverage"]) for q, r in full.items()} == {
        "q:1": (1.0, 1.0), "margin": (1.0, 1.0), "q:3": (1.0, 1.0)}
    assert full["q:1"]["reading"] == 1.0 and full["q:3"]["prediction"]
    assert full["q:3"]["pages"] == 2 and full["q:1"]["pages"] == 3 and full["q:3"]["answer_pages"] == [1]
    assert all(r["tokens"] <= r["budget_tokens"] for r in rows if r["method"] != "full")
    assert "summary.md" in capsys.readouterr().out


def test_context_options_a_dataset_does_not_take_are_refused(folder: Path, tmp_path: Path, capsys) -> None:
    assert main(["eval", "contexts", "--data", str(folder / "q.jsonl"), "--window", "3", "--out", str(tmp_path),
                 *FAST]) == 2
    assert capsys.readouterr().err == ("arr-coc: error: --window chooses contexts; contexts is read with --dpi of "
                                       "these, so leave it out\n")


def test_texlive_paraphrase_loads_as_contexts_over_its_windows(folder: Path, tmp_path: Path, monkeypatch) -> None:
    import arr_coc.documents.corpus as corpus
    from arr_coc.data.paraphrase import load_texlive_paraphrase, paraphrase_context_set

    (tmp_path / "latex" / "toy").mkdir(parents=True)
    (tmp_path / "latex" / "toy" / "manual.pdf").write_bytes((folder / "manual.pdf").read_bytes())
    monkeypatch.setattr(corpus, "DOC_ROOT", tmp_path)
    lines = [{"id": "val-001", "split": "val", "document": "latex/toy/manual.pdf", "pages": "2-3", "answer_page": 3,
              "question": "Who is the author?", "answers": ["Ada Lovelace"], "kind": "front"},
             {"id": "val-002", "split": "val", "document": "latex/toy/manual.pdf", "pages": "2-3", "answer_page": 2,
              "question": "Which unit measures the space around the text?", "answers": ["furlong"], "kind": "value"},
             {"id": "test-001", "split": "test", "document": "latex/toy/manual.pdf", "pages": "1-3", "answer_page": 1,
              "question": "Which release?", "answers": ["4.2"], "kind": "front"}]
    path = tmp_path / "paraphrase.jsonl"
    path.write_text("".join(json.dumps(q) + "\n" for q in lines))
    items, made, sub = paraphrase_context_set(path, split="val")
    items = list(items)
    text = read_pdf(folder / "manual.pdf", dpi=100, render=False).pages
    assert [(i.dataset, i.context_id, i.group) for i in items] == [
        ("texlive-paraphrase", "latex/toy/manual.pdf#2-3", "latex/toy/manual")]  # family_of
    # found on the text layer where printed; an answer not printed there is kept without boxes (the find reading)
    assert items[0].questions == [
        ContextQuestion("val-001", "Who is the author?", ("Ada Lovelace",), (1,), (), "front",
                        found=(words_box(text[2], "Ada", "Lovelace"),)),
        ContextQuestion("val-002", "Which unit measures the space around the text?", ("furlong",), (0,), (), "value")]
    assert made == {"split": "val", "limit": None, "dpi": 100.0, "data": str(path)} and sub == ""
    # the VLM's records of the same questions name the same context
    assert [r.image_id for r in load_texlive_paraphrase(path, split="val")] == ["latex/toy/manual.pdf#2-3"] * 2
    assert [q.record_id for i in paraphrase_context_set(path, limit=3)[0] for q in i.questions] == [
        "val-001", "val-002", "test-001"]


def test_eval_contexts_of_page_images_is_answered_by_the_vlm_and_a_pdf_is_refused_there(folder: Path, tmp_path: Path,
                                                                                         capsys) -> None:
    from PIL import Image

    pages = read_pdf(folder / "manual.pdf", dpi=60).pages
    for i, page in enumerate(pages):
        Image.fromarray((page.image.permute(1, 2, 0).numpy() * 255).astype("uint8")).save(tmp_path / f"p{i + 1}.png")
    (tmp_path / "img.jsonl").write_text(
        json.dumps({"document": ["p1.png", "p2.png", "p3.png"], "question": "Who is the author?",
                    "answers": ["Ada Lovelace"], "answer_page": 3, "id": "author"}) + "\n"
        + json.dumps({"document": ["p1.png", "p2.png", "p3.png"], "question": "Which release?", "answers": ["4.2"],
                      "answer_page": 1}) + "\n")
    vlm = ["--reader", "vlm", "--model", "tiny:qwen2_5_vl", "--query-encoder", "hashing", "--max-new-tokens", "2",
           "--tokens", "24", "--out", str(tmp_path / "o")]
    assert main(["eval", "contexts", "--data", str(tmp_path / "img.jsonl"), *vlm]) == 0
    rows = RowStore(next((tmp_path / "o" / "contexts").iterdir())).rows()
    assert sorted((r["record_id"], r["method"], r["budget"], r["pages"], r["tokens"]) for r in rows) == [
        ("author", "coc", "24", 3, 24), ("img:2", "coc", "24", 3, 24)]
    assert main(["eval", "contexts", "--data", str(folder / "q.jsonl"), *vlm]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"arr-coc: error: {folder / 'q.jsonl'}:1: the VLM reads contexts of page images ('document': a list of "
        f"images); read manual.pdf with an OCR reader (--reader tesseract or rapidocr)")


EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "questions.jsonl"


@pytest.mark.skipif(not Path("/usr/share/doc/texlive-doc/latex/booktabs/booktabs.pdf").is_file(),
                    reason="the example's manual comes with the texlive-doc Debian package")
def test_the_docs_example_file_is_one_context_of_four_questions_found_on_their_pages() -> None:
    items = list(load_contexts(EXAMPLE)[0])
    assert [(i.context_id, len(i.questions)) for i in items] == [
        ("/usr/share/doc/texlive-doc/latex/booktabs/booktabs.pdf#1-12", 4)]
    assert [(q.record_id, q.pages, q.kind, len(q.found) > 0) for q in items[0].questions] == [
        ("author", (0,), "front", True), ("first-release", (0,), "front", True), ("gnat-price", (1,), "table", True),
        ("closing-line", (3,), "name", True)]
