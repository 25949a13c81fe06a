"""The hand-written question sets: every question keeps its rules, against the real pages and annotations."""
from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from arr_coc.data import image_paraphrase, paraphrase, paraphrase_stats
from arr_coc.data.datasets import DATASETS, default_root, load_dataset, split_of
from arr_coc.data.paraphrase_rules import content_words, found_on_page, quoted_phrase
from arr_coc.data.sroie import normalise, read_sroie_lines
from arr_coc.documents import corpus
from arr_coc.documents.pdf import read_pdf


@pytest.fixture(scope="module")
def texlive() -> tuple[list[paraphrase.WindowQuestion], dict[tuple[str, int], str], dict[str, corpus.Document]]:
    """The questions (fails, never skips, without the manuals), their answer pages' text layers, their documents."""
    qs = paraphrase.texlive_paraphrase()
    pages: dict[str, set[int]] = defaultdict(set)
    for q in qs:
        pages[q.document].add(q.answer_page)
    text = {}
    for document, wanted in pages.items():
        ctx = read_pdf(corpus.DOC_ROOT / document, pages=[p - 1 for p in sorted(wanted)], render=False)
        text.update({(document, page.index + 1): page.text for page in ctx.pages})
    docs = {d.name: d for d in corpus.documents(paths=sorted({q.path for q in qs}))}
    return qs, text, docs


def test_every_answer_is_printed_on_its_answer_page_inside_the_window(texlive) -> None:
    qs, text, docs = texlive
    for q in qs:
        n = docs[q.document].n_pages
        assert 1 <= q.pages[0] <= q.answer_page <= q.pages[1] <= n, q.id
        # the window is the rule's, never chosen by hand: the whole short manual, or a seeded draw over a long one
        assert q.pages == paraphrase.window_for(q.document, n, q.answer_page, q.question), q.id
        assert q.pages[1] - q.pages[0] + 1 == min(paraphrase.WINDOW, n), q.id
        for answer in q.answers:
            assert found_on_page(answer, text[q.document, q.answer_page]), (q.id, answer)
    # controls: case counts, and a span the page does not print is not found
    assert not found_on_page("barbara beeton", text["latex/amscls/amsmidx.pdf", 1])
    assert not found_on_page("Barbara Beeton", text["latex/amscls/amsmidx.pdf", 2])


def test_questions_share_no_content_word_with_answers_and_quote_no_page_phrase(texlive) -> None:
    qs, text, _ = texlive
    for q in qs:
        for answer in q.answers:
            assert not content_words(answer) & content_words(q.question), (q.id, answer)
        assert quoted_phrase(q.question, text[q.document, q.answer_page]) is None, q.id
    # controls: a question made of the page's own words, or holding its answer, is caught
    q = next(q for q in qs if q.id == "val-001")
    assert q.answers == ("Barbara Beeton",) and q.question == "Who wrote the package for several indexes in AMS books?"
    assert quoted_phrase("Which package is based on multind.sty?", text[q.document, 1]) == "package is based"
    assert content_words("Is Beeton the author?") & content_words(q.answers[0]) == {"beeton"}


def test_splits_are_the_corpus_splits_disjoint_by_document_and_balanced(texlive) -> None:
    qs, _, docs = texlive
    for q in qs:
        assert docs[q.document].split == q.split == corpus.split_of(corpus.family_of(q.document)), q.id
    by_split = {s: [q for q in qs if q.split == s] for s in ("train", "val", "test")}
    assert {q.split for q in qs} == {"train", "val", "test"}
    for a, b in (("train", "val"), ("train", "test"), ("val", "test")):
        assert not {q.document for q in by_split[a]} & {q.document for q in by_split[b]}, (a, b)
    assert len({q.id for q in qs}) == len(qs)
    for split, group in by_split.items():
        per_doc = Counter(q.document for q in group)
        assert len(group) >= (250 if split == "train" else 150) and len(per_doc) >= 25, split
        assert max(per_doc.values()) <= 0.1 * len(group), split  # no manual is more than a tenth of a split
        assert {q.kind for q in group} == set(paraphrase.KINDS), split


def test_answers_sit_anywhere_in_their_windows_not_on_the_first_pages(texlive) -> None:
    """Sending a window's first pages must not read the set by construction."""
    qs, _, docs = texlive
    for split in ("val", "test"):
        group = [q for q in qs if q.split == split]
        at = [q.answer_page - q.pages[0] + 1 for q in group]  # the answer's page within its window
        deep, first, full = sum(a >= 6 for a in at), sum(q.answer_page == 1 for q in group), \
            sum(docs[q.document].n_pages >= paraphrase.WINDOW for q in group)
        assert deep >= 0.45 * len(group), (split, deep, len(group))  # answer on window pages 6-20
        assert first <= 0.25 * len(group), (split, first, len(group))  # answer on the manual's first page
        assert full >= 0.6 * len(group), (split, full, len(group))  # full 20-page windows (manuals of >= 20 pages)
        assert set(at) == set(range(1, paraphrase.WINDOW + 1)), split  # every window page holds some answer
        # the stats command prints these same counts
        p = paraphrase_stats.placement(group)
        assert (p["6-20"], p["page 1"], p["full windows"], p["questions"]) == (deep, first, full, len(group))
        assert p["1-5"] + p["6-10"] + p["11-15"] + p["16-20"] == len(group) and p["1-5"] == len(group) - deep
    # control: the draw places the windows; another seed moves many of those over long manuals
    long_qs = [q for q in qs if docs[q.document].n_pages > paraphrase.WINDOW and q.answer_page > 1]
    moved = sum(paraphrase.window_for(q.document, docs[q.document].n_pages, q.answer_page, q.question, seed=1)
                != q.pages for q in long_qs)
    assert moved > len(long_qs) // 2, (moved, len(long_qs))


def test_window_for_keeps_the_answer_inside_a_full_window_and_refuses_a_page_outside() -> None:
    assert paraphrase.window_for("a.pdf", 12, 9, "q") == (1, 12)  # a short manual is its own window
    assert paraphrase.window_for("a.pdf", 300, 1, "q") == (1, 20) and paraphrase.window_for("a.pdf", 300, 300, "q") \
        == (281, 300)  # at the ends the draw has one choice
    starts = {paraphrase.window_for("a.pdf", 300, 150, f"question {i}")[0] for i in range(400)}
    assert starts == set(range(131, 151))  # every window that holds page 150, and no other
    assert paraphrase.window_for("a.pdf", 300, 150, "q") == paraphrase.window_for("a.pdf", 300, 150, "q")
    with pytest.raises(ValueError, match=r"^answer page 13 lies outside the document's 12 pages$"):
        paraphrase.window_for("a.pdf", 12, 13, "q")


def test_the_registered_loader_gives_records_with_the_window_and_answer_page() -> None:
    records = load_dataset("texlive-paraphrase", split="val")
    r = records[0]
    assert (r.record_id, r.image, r.image_id, r.answer, r.answers, r.kind, r.group, r.answer_pages) == (
        "val-001", corpus.DOC_ROOT / "latex/amscls/amsmidx.pdf", "latex/amscls/amsmidx.pdf#1-3", "Barbara Beeton",
        ("Barbara Beeton",), "front", "latex/amscls/amsmidx", (0,))
    assert len(records) == len(paraphrase.texlive_paraphrase("val")) and {x.dataset for x in records} == {r.dataset}
    assert {"texlive-paraphrase", "image-paraphrase"} <= set(DATASETS.names())


def _line(**change: object) -> str:
    row = {"id": "a", "split": "val", "document": "latex/amscls/amsmidx.pdf", "pages": "1-3", "answer_page": 1,
           "question": "Who wrote it?", "answers": ["Barbara Beeton"], "kind": "front"}
    return json.dumps({**row, **change})


@pytest.mark.parametrize("lines, message", [
    (["{oops"], "malformed JSON"),
    ([_line(answer_page=5)], "'answer_page' 5 lies outside the window 1-3"),
    ([_line(pages="3-1")], "'pages' must be a 1-based range FIRST-LAST, got '3-1'"),
    ([_line(kind="colour")], "'kind' must be one of front, name, value, fact, table, listing, got 'colour'"),
    ([_line(answers=[])], "'answers' must be a non-empty list of non-empty strings, got []"),
    ([_line(split="dev")], "'split' must be one of train, val, test, got 'dev'"),
    ([_line(), _line()], "id 'a' is used twice"),
])
def test_the_loader_refuses_bad_lines_naming_the_line(tmp_path: Path, lines: list[str], message: str) -> None:
    path = tmp_path / "q.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError) as e:
        paraphrase.texlive_paraphrase(path=path)
    assert str(e.value).startswith(f"{path}:{len(lines)}: {message}")
    path.write_text(_line() + "\n")  # control: the good line loads
    assert [q.id for q in paraphrase.texlive_paraphrase(path=path)] == ["a"]


def test_image_lines_are_checked_too(tmp_path: Path) -> None:
    row = json.loads(image_paraphrase.IMAGE_FILE.read_text().splitlines()[0])
    path = tmp_path / "i.jsonl"
    path.write_text(json.dumps({**row, "boxes": [[1, 2, 3]]}) + "\n")
    with pytest.raises(ValueError, match=rf"^{path}:1: 'boxes' must be a non-empty list of \[y0, x0, y1, x1\]"):
        image_paraphrase.image_paraphrase_rows(path)
    path.write_text(json.dumps(row) + "\n")
    assert [r["id"] for r in image_paraphrase.image_paraphrase_rows(path)] == [row["id"]]


@pytest.fixture(scope="module")
def data() -> Path:
    folder = default_root("image-paraphrase")
    if not (folder / "sroie").is_dir() or not (folder / "funsd").is_dir():
        pytest.skip(f"the SROIE and FUNSD data are not in {folder} (set ARR_COC_DATA)")
    return folder


@pytest.mark.filterwarnings("ignore:FUNSD")
def test_image_questions_are_the_annotations_asked_in_other_words_on_the_group_split(data: Path) -> None:
    rows = image_paraphrase.image_paraphrase_rows()
    originals = {s: {r.record_id: r for r in load_dataset(s, data / s)} for s in image_paraphrase.SOURCES}
    for row in rows:
        original = originals[row["source"]][row["source_id"]]
        assert row["answers"] == [original.answer] and row["image"] == original.image_id, row["id"]
        assert [tuple(b) for b in row["boxes"]] == list(original.boxes_px), row["id"]
        assert row["group"] == original.group and row["split"] == split_of(original.group, row["source"]), row["id"]
        assert not content_words(row["question"]) & content_words(row["answers"][0]), row["id"]
        if row["source"] == "sroie":  # the value, spaces and punctuation aside, in the receipt's OCR lines
            lines = read_sroie_lines(data / "sroie" / "box" / f"{row['image']}.csv")
            assert normalise(row["answers"][0]) in normalise("".join(t for _, t in lines)), row["id"]
        else:  # every word of the answer is a word of the form
            form = json.loads((image_paraphrase.image_file(data, "funsd", row["image"]).parent.parent / "annotations"
                               / f"{row['image']}.json").read_text())
            words = {w["text"] for e in form["form"] for w in e["words"]}
            assert set(row["answers"][0].split()) <= words, row["id"]
    counts = Counter((r["split"], r["source"]) for r in rows)
    assert counts["val", "sroie"] + counts["val", "funsd"] >= 100 and counts["test", "sroie"] + counts["test", "funsd"] >= 100
    assert min(counts.values()) >= 40  # both sources in both splits
    records = load_dataset("image-paraphrase", data, split="test")
    assert len(records) == sum(r["split"] == "test" for r in rows) and all(r.image.is_file() for r in records)
