"""Questions over contexts in ``arr-coc eval``: exact tokens per row, the full reading, page hit, the CLI, bad options.

Small contexts: a 3-page PDF with a text layer (``story_pdf``: a numbered heading and seeded random body lines
per page) and 3 pages of ``key_pdf`` (only one holds the brass key).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from conftest import key_pdf, story_pdf
from PIL import Image, ImageDraw

from arr_coc.app.panels import font
from arr_coc.cli import main
from arr_coc.config import MVP_CHANNELS, ARRConfig, TextureConfig
from arr_coc.contexts import see_context, text_tokens
from arr_coc.contexts.ranking import BM25_WEIGHT, RETRIEVAL_WEIGHT
from arr_coc.data.contexts import ContextItem, ContextQuestion, texlive_contexts
from arr_coc.documents.pdf import read_pdf
from arr_coc.engine.pipeline import ARR
from arr_coc.engine.query import HashingQueryEncoder
from arr_coc.engine.views import downsampled_grid
from arr_coc.eval import run
from arr_coc.eval.context_methods import CONTEXT_METHODS
from arr_coc.eval.evaluate import evaluate
from arr_coc.eval.reading import contains_score, make_reader, read_region
from arr_coc.eval.settings import EvalSettings
from arr_coc.eval.store import RowStore

FAST = ["--query-encoder", "hashing", "--channels", "mvp"]


@pytest.fixture(scope="module")
def arr() -> ARR:
    return ARR(ARRConfig(texture=TextureConfig(channels=MVP_CHANNELS)), query_encoder=HashingQueryEncoder()).eval()


@pytest.fixture(scope="module")
def docs(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("contexts")
    story_pdf(folder / "story.pdf", 3)
    return folder


@pytest.fixture(scope="module")
def seen(arr, docs):
    return see_context(arr, read_pdf(docs / "story.pdf", dpi=100))


def cells(seen, i: int) -> tuple[int, int]:
    img, cell = seen.image(i), seen.scenes[0].canvas.cell
    return img.shape[-2] // cell, img.shape[-1] // cell


def test_every_row_sends_exactly_its_budget_and_counts_the_context_text(arr, docs, seen, tmp_path):
    settings = EvalSettings(budgets=("2x", "4x", "120"), reader=None)
    items = list(texlive_contexts(root=docs, pages=3, questions=2))
    assert len(items) == 1 and len(items[0].questions) == 2
    rows = RowStore(evaluate(items, arr, tmp_path, settings, progress=False).parent).rows()
    assert len(rows) == 2 * (1 + 3 * 6)  # per question: full once, 6 methods x 3 budgets
    text = text_tokens("\n\n".join(p.text for p in read_pdf(docs / "story.pdf", dpi=100).pages))
    grids = [cells(seen, i) for i in range(3)]
    full = sum(h * w for h, w in grids)
    for r in rows:
        assert (r["text_tokens"], r["full_tokens"], r["pages"]) == (text, full, 3)
        want = {"full": full, "2x": round(text / 2), "4x": round(text / 4), "120": 120}[r["budget"]]
        assert r["budget_tokens"] == want and r["compression"] == pytest.approx(text / r["tokens"])
        if r["method"] in ("full", "coc", "equal_split"):  # cells and whole pages: exact
            assert r["tokens"] == want, r
        elif r["method"] == "uniform":  # every page downscaled to its share: what its grid holds
            per = [want // 3 + (i < want % 3) for i in range(3)]
            assert r["tokens"] == sum(math.prod(downsampled_grid(*g, n)) for g, n in zip(grids, per)) <= want
        else:  # whole pages while they fit: none does at these budgets, the first page is downscaled
            first = 0 if r["method"] == "first_pages" else None
            assert r["tokens"] <= want and (first is None or r["tokens"] == math.prod(downsampled_grid(*grids[0], want)))
    assert {r["method"] for r in rows} == set(CONTEXT_METHODS)


def test_the_full_row_reads_what_the_full_page_reads(arr, docs, seen, tmp_path):
    item = next(texlive_contexts(root=docs, pages=3, questions=1))
    q = item.questions[0]
    rows = RowStore(evaluate([item], arr, tmp_path, EvalSettings(methods=("full", "uniform"),
                                                                                 budgets=("4x",)),
                                      progress=False).parent).rows()
    full = next(r for r in rows if r["method"] == "full")
    a = q.pages[0]
    page, canvas = read_pdf(docs / "story.pdf", dpi=100).pages[a], seen.image(a)
    sy, sx = canvas.shape[-2] / page.size[0], canvas.shape[-1] / page.size[1]
    boxes = [(b[0] * sy, b[1] * sx, b[2] * sy, b[3] * sx) for b in q.boxes]
    read = read_region(make_reader("tesseract"), canvas, boxes, 4.0)
    assert full["prediction"] == read and full["reading"] == contains_score(read, list(q.answers))
    assert full["reading"] > 0.9 and full["coverage"] == 1.0 and full["page_hit"] == 1.0
    uniform = next(r for r in rows if r["method"] == "uniform")  # control: the page at ~1/10 of its tokens
    assert uniform["reading"] < full["reading"] and uniform["coverage"] == 0.0


def key_item(path: Path, order: list[int], answer_at: int) -> ContextItem:
    name = f"pages {order}, answer at {answer_at}"
    q = ContextQuestion(name, "Where is the brass key?", ("under the mat",), (answer_at,))
    return ContextItem("keys", name, lambda: read_pdf(path, pages=order, dpi=100), [q])


def test_page_hit_follows_the_answer_page_and_drops_when_pages_are_swapped(arr, tmp_path):
    pdf = key_pdf(tmp_path / "keys.pdf", 40)  # only page index 37 holds the brass key
    settings = EvalSettings(methods=("coc", "first_pages"), budgets=("12",), reader=None)
    items = [key_item(pdf, [35, 36, 37], 2), key_item(pdf, [37, 36, 35], 2), key_item(pdf, [37, 36, 35], 0)]
    rows = RowStore(evaluate(items, arr, tmp_path / "rows", settings, progress=False).parent).rows()
    hit = {(r["record_id"], r["method"]): r["page_hit"] for r in rows}
    assert len(rows) == 6 and all(r["tokens"] == 12 for r in rows if r["method"] == "coc")
    assert hit[("pages [35, 36, 37], answer at 2", "coc")] == 1.0  # the key's page gets saccades
    assert hit[("pages [37, 36, 35], answer at 2", "coc")] == 0.0  # swapped: page 3 no longer holds the key
    assert hit[("pages [37, 36, 35], answer at 0", "coc")] == 1.0  # the saccades went with the key
    # first pages at 12 tokens: page 1 downscaled, nothing at full resolution anywhere
    assert [hit[(i.context_id, "first_pages")] for i in items] == [0.0, 0.0, 0.0]


def test_eval_over_a_tiny_pdf_context_end_to_end_and_resumes(docs, tmp_path, capsys, monkeypatch):
    argv = ["eval", "texlive-contexts", "--data", str(docs), "--window", "3", "--questions", "2", "--compression", "2",
            "--out", str(tmp_path), *FAST]
    assert main(argv) == 0
    out = capsys.readouterr().out
    folder = tmp_path / "texlive-contexts" / "pdf"
    rows = [json.loads(x) for x in (folder / "records.jsonl").read_text().splitlines()]
    assert len(rows) == 2 * 7 and {r["method"] for r in rows} == set(CONTEXT_METHODS)
    md = (folder / "summary.md").read_text()
    assert md.startswith("made by: arr-coc eval texlive-contexts --data") and "| 2x | coc |" in md
    assert "| full | full |" in md and "| page hit |" in md and md in out
    assert json.loads((folder / "settings.json").read_text())["contexts"]["source"] == "pdf"
    assert (folder / "summary.png").stat().st_size > 0
    assert main(argv) == 0  # everything is done: nothing is seen or written again
    assert (folder / "records.jsonl").read_text().count("\n") == 14
    line_scores = json.loads((folder / "settings.json").read_text())["line_scores"]
    assert line_scores == {"bm25_weight": BM25_WEIGHT, "retrieval_weight": RETRIEVAL_WEIGHT, "chunk_stride": 3,
                           "refine_chunks": 128} and (BM25_WEIGHT, RETRIEVAL_WEIGHT) == (0.0, 8.0)
    assert json.loads((folder / "settings.json").read_text())["line_values"] == {
        "typed_floor": 1.5, "shape_boost": 0.12, "token_rest": 0.0}
    monkeypatch.setattr(run, "BM25_WEIGHT", 0.05)  # rows of another line scoring never mix with these
    assert main(argv) == 2
    assert "holds rows made with other settings (line_scores: " in capsys.readouterr().err
    monkeypatch.setattr(run, "BM25_WEIGHT", BM25_WEIGHT)
    monkeypatch.setattr(run, "TYPED_FLOOR", 1.0)  # nor rows under another floor on the typed lines
    assert main(argv) == 2
    assert "holds rows made with other settings (line_values: " in capsys.readouterr().err


def page_image(path: Path, text: str) -> Path:
    img = Image.new("RGB", (336, 224), "white")
    ImageDraw.Draw(img).text((20, 90), text, fill="black", font=font(24))
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path)
    return path


def test_eval_reads_mpdocvqa_pages_with_an_ocr_reader(tmp_path, capsys):
    for page, text in (("d_p0", "Shipping notes"), ("d_p1", "Total due 4821")):
        page_image(tmp_path / "images" / f"{page}.png", text)
    data = [{"questionId": 1, "question": "What is the total due?", "doc_id": "d", "page_ids": ["d_p0.png", "d_p1.png"],
             "answers": ["4821"], "answer_page_idx": 1}]
    (tmp_path / "qas").mkdir()
    (tmp_path / "qas" / "val.json").write_text(json.dumps({"data": data}))
    assert main(["eval", "mpdocvqa", "--data", str(tmp_path), "--split", "val", "--tokens", "40",
                 "--methods", "full", "coc", "first_pages", "--out", str(tmp_path / "out"), *FAST]) == 0
    rows = {r["method"]: r for r in RowStore(tmp_path / "out" / "mpdocvqa").rows()}
    assert rows["full"]["reading"] == 1.0 and rows["full"]["prediction"] == "4821"  # found, not told where
    assert rows["coc"]["tokens"] == 40 and rows["coc"]["answer_pages"] == [1] and rows["coc"]["text_tokens"] > 0
    assert rows["first_pages"]["page_hit"] == 0.0 and math.isnan(rows["coc"]["coverage"] or math.nan)


@pytest.mark.parametrize("extra, message", [
    (["--compression", "0"], "compression '0x' must be a positive ratio, e.g. 10x"),
    (["--window", "0"], "--window must be a whole number of pages, at least 1"),
    (["--window", "5"], "no context of texlive-contexts has a question with these options (documents with at least 5"),
    (["--limit", "3"], "--limit counts records; texlive-contexts takes --contexts N (documents)"),
    (["--contexts", "0"], "--contexts must be a whole number of documents, at least 1, got 0"),
    (["--text-weight", "nan"], "--text-weight must be a finite weight >= 0, got nan"),
    (["--dpi", "0"], "dpi must be in (0, "),
    (["--methods", "coc", "nope"], "unknown methods ['nope']; known: full, coc, equal_split, uniform, first_pages"),
    (["--methods", "coc", "topk"], "unknown methods ['topk']; known: full, coc, equal_split, uniform, first_pages"),
    (["--tokens", "4"], "4 tokens cannot give 3 pages a 1x1 gestalt each and as many saccades; use at least 6"),
    (["--reader", "vlm", "--model", "tiny:qwen2_5_vl"], "texlive-contexts is read by an OCR reader"),
])
def test_bad_context_options_fail_in_one_line(docs, tmp_path, capsys, extra, message):
    assert main(["eval", "texlive-contexts", "--data", str(docs), "--window", "3", "--questions", "1",
                 "--out", str(tmp_path), *FAST, *extra[:1], *extra[1:]]) == 2
    err = capsys.readouterr().err.split("\r")[-1]  # a budget too small for a context fails in it, after the progress bar
    last = err.splitlines()[-1]
    assert last.startswith("arr-coc: error: ") and message in last and err.endswith(last + "\n"), err


def test_images_and_contexts_go_through_one_loop_into_one_row_schema(arr, docs, tmp_path):
    from arr_coc.data.datasets import Record

    image = page_image(tmp_path / "a.png", "Total 9")
    records = [Record("toy", "r1", image, "a", "Total?", "9", ((80.0, 15.0, 120.0, 110.0),))]
    image_rows = RowStore(evaluate(records, arr, tmp_path / "i", EvalSettings(methods=("full", "topk"),
                                                                              budgets=("25%",), reader=None),
                                   progress=False).parent).rows()
    items = list(texlive_contexts(root=docs, pages=3, questions=1))
    context_rows = RowStore(evaluate(items, arr, tmp_path / "c", EvalSettings(methods=("full", "coc"),
                                                                              budgets=("60",), reader=None),
                                     progress=False).parent).rows()
    lead = ["dataset", "record_id", "image_id", "kind", "question", "answer", "method", "budget", "tokens",
            "full_tokens", "reader"]
    assert len(image_rows) == 2 and len(context_rows) == 2
    for r in image_rows + context_rows:
        assert list(r)[:len(lead)] == lead and r["reader"] is None
    assert [r["tokens"] for r in context_rows] == [context_rows[0]["full_tokens"], 60]
    with pytest.raises(ValueError, match=r"methods \['coc'\] do not send one image"):
        evaluate(records, arr, tmp_path / "x", EvalSettings(methods=("coc",), reader=None), progress=False)


def test_context_options_on_a_dataset_of_single_images_are_refused(tmp_path, capsys):
    page_image(tmp_path / "a.png", "Total 9")
    (tmp_path / "toy.jsonl").write_text(json.dumps({"image": "a.png", "question": "Total?", "answer": "9",
                                                    "boxes": [[80, 85, 150, 120]]}))
    assert main(["eval", "jsonl", "--data", str(tmp_path / "toy.jsonl"), "--source", "text", "--window", "3",
                 "--out", str(tmp_path / "o"), *FAST]) == 2
    assert capsys.readouterr().err == ("arr-coc: error: --window --source choose contexts; jsonl is a dataset of single "
                                       "images, so leave them out\n")
