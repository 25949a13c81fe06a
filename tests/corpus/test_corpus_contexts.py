"""Corpus: contexts bounded before any work -- page sizes, dpi, page counts, text length and glyphs, budgets and
page trees that lie, each a one-line refusal (naming the option to change) or a correct result, in the library,
``look`` and ``ask``; the allocation of a context drawn a few pages at a time equals the one of its pages held at
once; a context's peak memory measured in a process of its own."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch
from conftest import ROOT, key_pdf
from corpus_checks import outcome, run_cli

import arr_coc.documents.pdf as pdf
from arr_coc import ARR, ARRConfig
from arr_coc.budget import Budget
from arr_coc.config import MVP_CHANNELS, TextureConfig
from arr_coc.contexts import allocate, load_context, see_context
from arr_coc.contexts.seen import chunks
from arr_coc.documents.text_pages import TextLayout, _font, _pieces, _width, layout_text, render_text
from arr_coc.engine.query import HashingQueryEncoder
from benchmarks.hostile_pdf import A4, raw_pdf

Q = "Where is the brass key?"
LOOK = ["--query-encoder", "hashing", "--channels", "mvp", "--json"]


def _arr(channels: tuple[str, ...] = MVP_CHANNELS) -> ARR:
    return ARR(ARRConfig(texture=TextureConfig(channels=channels)), query_encoder=HashingQueryEncoder()).eval()


@pytest.fixture
def nothing_drawn(monkeypatch):
    """Fails the test if any PDF page is drawn."""
    def draw(*_):
        raise AssertionError("a page was drawn before the refusal")
    monkeypatch.setattr(pdf, "render_page", draw)


def test_a_page_tree_that_names_more_pages_than_load_is_one_line(tmp_path):
    lies = raw_pdf(tmp_path / "lies.pdf", [(A4, "")] * 2, count=4)  # /Count 4 over 2 kids
    dangling = raw_pdf(tmp_path / "dangling.pdf", [(A4, ""), None, (A4, "")])  # a kid that is no object
    assert outcome(lambda: allocate(_arr(), lies, Q, 40, dpi=50)) == (
        "error", f"{lies} page 3 cannot be loaded: the PDF lists 4 pages but this one is damaged; choose other pages "
                 "with --pages / pages=, or repair the file (e.g. qpdf in.pdf out.pdf)")
    assert outcome(lambda: load_context(dangling))[1].startswith(f"{dangling} page 2 cannot be loaded: the PDF lists 3")
    kind, out = outcome(lambda: allocate(_arr(), dangling, Q, 40, dpi=50, pages="1,3"))
    assert kind == "ok" and [p.index for p in out.pages] == [0, 2] and out.tokens == 40  # the pages that load
    code, _, err = run_cli(["look", str(lies), Q, *LOOK, "--dpi", "50"])
    assert code == 2 and err.strip().splitlines()[-1] == f"arr-coc: error: {lies} page 3 cannot be loaded: " \
        "the PDF lists 4 pages but this one is damaged; choose other pages with --pages / pages=, or repair the file " \
        "(e.g. qpdf in.pdf out.pdf)"


def test_a_page_200_inches_wide_is_refused_before_drawing_naming_dpi(tmp_path, nothing_drawn):
    wide = raw_pdf(tmp_path / "wide.pdf", [("0 0 14400 792", "")])
    line = (f"{wide} page 1 is 200 x 11 in: at 150 dpi it renders 30001x1651 px, more than 25 million pixels a page; "
            "lower --dpi / dpi= to 106 or less, or leave the page out with --pages")
    assert outcome(lambda: allocate(_arr(), wide, Q, 40)) == ("error", line)
    assert outcome(lambda: pdf.read_pdf(wide)) == ("error", line)
    for cmd in (["look", str(wide), Q, *LOOK], ["ask", str(wide), Q, "--model", "tiny:llava", "--query-encoder",
                                                "hashing", "--channels", "mvp"]):
        code, _, err = run_cli(cmd)
        assert code == 2 and err.strip().splitlines()[-1] == f"arr-coc: error: {line}"


def test_at_the_dpi_the_refusal_names_the_wide_page_is_drawn(tmp_path, monkeypatch):
    wide = raw_pdf(tmp_path / "wide.pdf", [("0 0 14400 792", "")])
    monkeypatch.setattr(pdf, "MAX_PAGE_PIXELS", 30_000)  # the same rule at a size a test draws in milliseconds
    kind, message = outcome(lambda: load_context(wide, dpi=10))
    fit = float(message.split("dpi= to ")[1].split(" ")[0])
    assert kind == "error" and fit == 3.0
    page = load_context(wide, dpi=fit).pages[0]
    assert page.size == (33, 600) and 33 * 600 <= 30_000 < 44 * 800  # 3 dpi fits, 4 would not


def test_a_huge_userunit_is_ignored_as_pdfium_draws_it(tmp_path):
    plain = raw_pdf(tmp_path / "plain.pdf", [(A4, "")])
    huge = raw_pdf(tmp_path / "huge.pdf", [(A4, "/UserUnit 75000 ")])
    a, b = load_context(plain, dpi=30).pages[0], load_context(huge, dpi=30).pages[0]
    assert a.size == b.size == (351, 249) and torch.equal(a.image, b.image)  # a correct result, the box as drawn


def test_one_page_at_1200_dpi_is_refused_with_the_dpi_that_fits(tmp_path, nothing_drawn):
    a4 = raw_pdf(tmp_path / "a4.pdf", [(A4, "")])
    assert outcome(lambda: allocate(_arr(), a4, Q, dpi=1200)) == (
        "error", f"{a4} page 1 is 8.268 x 11.69 in: at 1200 dpi it renders 9922x14032 px, more than 25 million "
                 "pixels a page; lower --dpi / dpi= to 508 or less, or leave the page out with --pages")


def test_a_budget_too_small_for_the_pages_is_refused_before_drawing(tmp_path, nothing_drawn):
    twenty = raw_pdf(tmp_path / "twenty.pdf", [(A4, "")] * 20)
    line = "2 tokens cannot give 20 pages a 1x1 gestalt each and as many saccades; use at least 40 tokens or " \
           "choose fewer pages"
    assert outcome(lambda: allocate(_arr(), twenty, Q, 2)) == ("error", line)
    code, _, err = run_cli(["look", str(twenty), Q, *LOOK, "--tokens", "2"])
    assert code == 2 and err.strip().splitlines()[-1] == f"arr-coc: error: {line}"
    assert outcome(lambda: allocate(_arr(), twenty, Q, Budget.saccades(19)))[1].startswith(
        "19 saccades give 20 pages no gestalt")


def test_five_thousand_pages_under_max_pages_5000_are_refused_by_their_pixels(tmp_path, nothing_drawn):
    many = raw_pdf(tmp_path / "many.pdf", [(A4, "")] * 5000)
    line = (f"the 5000 pages of {many} at 150 dpi are 10884 million pixels drawn, more than a context's 256 million; "
            "lower --dpi / dpi= to 22 or less, or choose fewer pages with --pages / pages=")
    assert outcome(lambda: allocate(_arr(), many, Q, 20000, max_pages=5000)) == ("error", line)
    code, _, err = run_cli(["look", str(many), Q, *LOOK, "--max-pages", "5000", "--tokens", "20000"])
    assert code == 2 and err.strip().splitlines()[-1] == f"arr-coc: error: {line}"
    assert outcome(lambda: load_context(many))[1] == (  # the default page limit is met first
        f"{many} has 5000 pages; a context holds at most 64 (choose pages with --pages / pages=, or raise "
        "--max-pages / max_pages=)")


def test_a_text_page_of_50000_px_a_side_is_refused_naming_the_options(tmp_path):
    line = "a 50000 x 50000 px text page is more than 25 million pixels; choose a smaller --page-width / --page-height"
    assert outcome(lambda: TextLayout(width=50000, height=50000)) == ("error", line)
    text = tmp_path / "a.txt"
    text.write_text("the brass key")
    code, _, err = run_cli(["look", str(text), Q, *LOOK, "--page-width", "50000", "--page-height", "50000"])
    assert code == 2 and err.strip().splitlines()[-1] == f"arr-coc: error: {line}"


def test_a_long_text_is_refused_while_laid_out_not_after_drawing(tmp_path, monkeypatch):
    big = tmp_path / "big.txt"
    big.write_text("lorem ipsum dolor sit amet consectetur adipiscing\n" * 20_000)  # 1 MB, ~440 pages
    drawn = []
    monkeypatch.setattr("arr_coc.documents.text_pages.TextSetting.page", lambda *a: drawn.append(a))
    assert outcome(lambda: allocate(_arr(), big, Q, 400)) == (
        "error", f"{big} needs more than 64 pages at 16 px on 896x1120 px pages (counted while laying it out, before "
                 "drawing); a context holds at most 64: shorten the text, or raise --max-pages / max_pages=")
    assert drawn == []
    huge = tmp_path / "huge.txt"
    with open(huge, "wb") as f:  # 50 MB, sparse: refused from its size, never read
        f.truncate(50 * 2**20)
    line = f"{huge} is 50.0 MB of text; a context sets at most 4 MB on pages (about 1000 pages), and at most " \
           "--max-pages of them: split the file"
    assert outcome(lambda: load_context(huge)) == ("error", line)
    code, _, err = run_cli(["look", str(huge), Q, *LOOK])
    assert code == 2 and err.strip().splitlines()[-1] == f"arr-coc: error: {line}"


def test_a_word_without_spaces_is_broken_in_linear_time_into_the_longest_runs_that_fit():
    font, _ = _font("DejaVu Sans", 16)
    word = "".join(chr(ord("a") + (i * 7) % 26) for i in range(20_000))  # 20 KB, no space
    start = time.perf_counter()
    pieces = _pieces(font, word, 800)
    took = time.perf_counter() - start
    assert "".join(pieces) == word and len(pieces) > 100
    for a, b in zip(pieces, pieces[1:]):  # each run fits; one more character would not
        assert _width(font, a) <= 800 < _width(font, a + b[0])
    ctx = render_text(word)  # and it is set on pages: one run per row
    assert [w.text for p in ctx.pages for w in p.words] == pieces
    # a 1 MB word is laid out up to the page bound and refused there (it used to hang)
    start = time.perf_counter()
    kind, message = outcome(lambda: layout_text("x" * 2**20, max_pages=64))
    assert kind == "error" and message.startswith("<text> needs more than 64 pages")
    print(f"20 KB word broken in {took:.2f} s; 1 MB word refused in {time.perf_counter() - start:.2f} s")


def test_chinese_text_the_font_cannot_draw_is_refused_naming_the_characters(tmp_path):
    zh = tmp_path / "zh.txt"
    zh.write_text("黄铜钥匙在垫子下面 the brass key", encoding="utf-8")
    line = (f"{zh} has 9 distinct characters the font 'DejaVu Sans' cannot draw ('黄' U+9EC4, '铜' U+94DC, "
            "'钥' U+94A5, '匙' U+5319, '在' U+5728, ...): they would be drawn as empty boxes; set the text in a font "
            "that has them with --font / TextLayout(font=) (e.g. 'Noto Sans CJK JP' from the Debian package "
            "fonts-noto-cjk for Chinese and Japanese), or remove them")
    assert outcome(lambda: load_context(zh)) == ("error", line)
    code, _, err = run_cli(["look", str(zh), Q, *LOOK])
    assert code == 2 and err.strip().splitlines()[-1] == f"arr-coc: error: {line}"
    latin = "Ærøskøbing façade naïve Œuvre ß – “quoted” €5"  # the control: DejaVu Sans draws these
    assert [w.text for w in render_text(latin).pages[0].words] == latin.split()


def test_drawn_a_few_pages_at_a_time_equals_all_pages_held_at_once(tmp_path):
    doc = key_pdf(tmp_path / "key.pdf", 40)
    arr = _arr(MVP_CHANNELS + ("text_match", "key_value"))
    streamed = allocate(arr, doc, Q, 300, dpi=50)
    held = allocate(arr, see_context(arr, doc, dpi=50), Q, 300)
    alone = allocate(arr, doc, Q, 300, dpi=50, chunk=1)
    assert streamed.tokens == held.tokens == alone.tokens == 300 and streamed.pages[37].saccades > 0
    for a, b, c in zip(streamed.pages, held.pages, alone.pages):
        assert torch.equal(a.plan.cells, b.plan.cells) and torch.equal(a.relevance, b.relevance)
        # one page per batch: the same cells; scores equal up to the batch's float summation order
        assert torch.equal(a.plan.cells, c.plan.cells)
        torch.testing.assert_close(a.relevance, c.relevance, rtol=1e-5, atol=1e-5)
    assert torch.equal(streamed.pages[37].image, held.pages[37].image)  # the canvas drawn again is the one scored
    other = allocate(arr, doc, "Where is chapter 12?", 300, dpi=50)  # control: another question differs
    assert not all(torch.equal(a.plan.cells, b.plan.cells) for a, b in zip(streamed.pages, other.pages))
    assert chunks([(800, 600)] * 9) == [[0, 1, 2, 3], [4, 5, 6, 7], [8]]
    assert chunks([(800, 600)] * 3 + [(1754, 1240)] + [(800, 600)] * 4) == [[0, 1, 2], [3], [4, 5, 6, 7]]


MEASURE = """
import sys, torch
from arr_coc import ARR, ARRConfig
from arr_coc.config import MVP_CHANNELS, TextureConfig
from arr_coc.contexts import allocate
from arr_coc.engine.query import HashingQueryEncoder
arr = ARR(ARRConfig(texture=TextureConfig(channels=MVP_CHANNELS)), query_encoder=HashingQueryEncoder()).eval()
with torch.inference_mode():
    out = allocate(arr, sys.argv[1:], "Where is the total?", 600)
# VmHWM, this process's own peak: ru_maxrss would carry the test runner's peak across exec into this child
print(out.tokens, int(next(x for x in open("/proc/self/status") if x.startswith("VmHWM")).split()[1]) // 1024)
"""


def test_three_8000_px_images_stay_under_two_gigabytes(tmp_path):
    from PIL import Image, ImageDraw

    paths = []
    for i in range(3):
        img = Image.new("RGB", (8000, 8000), "white")
        ImageDraw.Draw(img).rectangle((800 * i, 1000, 800 * i + 3000, 1400), fill="black")
        paths.append(tmp_path / f"big{i}.png")
        img.save(paths[-1], compress_level=1)
        del img
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-c", MEASURE, *map(str, paths)], capture_output=True, text=True, env=env,
                         check=True)
    tokens, peak_mb = map(int, run.stdout.split())
    # was 4.3 GB (each image held in float32 at full size); measured 1.5-1.9 GB on this machine kind under
    # the library's default heap (the CLI maps large buffers on their own and peaks lower): the bound is 2 GB
    assert tokens == 600 and peak_mb < 2048, peak_mb
