"""Documents as pages with their words: PDF text layers, rendered text, the corpus split, the questions."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import matplotlib
import numpy as np
import pypdfium2 as pdfium
import pytest
import torch
from matplotlib.backends.backend_pdf import PdfPages
from matplotlib.figure import Figure
from PIL import Image, ImageDraw

from arr_coc.documents import corpus
from arr_coc.documents.page import Context, union
from arr_coc.documents.pdf import read_pdf
from arr_coc.documents.questions import KINDS, leaks, questions
from arr_coc.documents.text_pages import TextLayout, _extent, _font, read_text_file, render_text
from arr_coc.errors import MissingDependencyError

# Words drawn on a 4 x 3 inch page (288 x 216 pt: every dpi below gives whole pixels), at figure
# fractions (x, y of the baseline's left end) and font sizes in points.
DRAWN = [("Alpha", 0.10, 0.80, 20), ("beta", 0.55, 0.55, 14), ("Gamma", 0.30, 0.20, 10)]
FLOAT_PDF = corpus.DOC_ROOT / "latex/float/float.pdf"  # a 12-page manual of texlive-latex-recommended-doc


def _figure_pdf(path: Path, pages: int = 1) -> Path:
    """A PDF of ``pages`` pages, each holding the DRAWN words (embedded TrueType, as most writers do)."""
    with matplotlib.rc_context({"pdf.fonttype": 42}), PdfPages(path) as pdf:
        for _ in range(pages):
            fig = Figure(figsize=(4, 3))
            for text, x, y, size in DRAWN:
                fig.text(x, y, text, fontsize=size, va="baseline")
            pdf.savefig(fig)
    return path


def _encrypted_pdf(path: Path) -> Path:
    """A one-page PDF under the standard security handler whose user password is not empty."""
    objs = [b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 100 100] >>",
            b"<< /Filter /Standard /V 1 /R 2 /O <" + b"ab" * 32 + b"> /U <" + b"cd" * 32 + b"> /P -4 >>"]
    out, offsets = b"%PDF-1.4\n", []
    for i, o in enumerate(objs, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % i + o + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 5\n0000000000 65535 f \n" + b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += (b"trailer\n<< /Size 5 /Root 1 0 R /Encrypt 4 0 R /ID [<" + b"01" * 16 + b"> <" + b"01" * 16
            + b">] >>\nstartxref\n%d\n%%%%EOF\n" % xref)
    path.write_bytes(out)
    return path


def _dark(image: torch.Tensor) -> np.ndarray:
    """[H, W] bool: pixels darker than mid grey."""
    return (image.mean(0) < 0.5).numpy()


def _mask(shape: tuple[int, int], boxes, pad: float) -> np.ndarray:
    m = np.zeros(shape, bool)
    for y0, x0, y1, x1 in boxes:
        m[max(0, int(np.floor(y0 - pad))):int(np.ceil(y1 + pad)), max(0, int(np.floor(x0 - pad))):int(np.ceil(x1 + pad))] = True
    return m


@pytest.fixture(scope="module")
def figure_pdf(tmp_path_factory) -> Path:
    return _figure_pdf(tmp_path_factory.mktemp("pdf") / "drawn.pdf", pages=3)


def test_pdf_words_are_the_drawn_words_at_the_drawn_places(figure_pdf):
    page = read_pdf(figure_pdf, pages=[0], dpi=144).pages[0]
    assert page.size == (432, 576) and page.image.shape == (3, 432, 576) and page.dpi == 144.0
    assert [w.text for w in page.words] == [t for t, *_ in DRAWN]
    assert len(page.lines) == 3
    for (text, x, y, size), word in zip(DRAWN, page.words):
        y0, x0, y1, x1 = word.box
        # The baseline sits between the box's top and bottom; the box starts at the pen (within a bearing).
        assert y0 < (1 - y) * 432 <= y1 + 0.5 and abs(x0 - x * 576) < 0.15 * size * 2
        assert 0.5 * size * 2 < y1 - y0 < 1.2 * size * 2  # glyph heights at 2 px per point


def test_pdf_boxes_hold_the_ink_and_nothing_else(figure_pdf):
    page = read_pdf(figure_pdf, pages="2", dpi=150).pages[0]
    dark = _dark(page.image)
    for word in page.words:
        assert _mask(dark.shape, [word.box], 0)[dark].sum() > 20, word  # every box has ink
    outside = dark & ~_mask(dark.shape, [w.box for w in page.words], 1.5)
    assert outside.sum() == 0
    # Negative control: boxes moved by a word's height miss the ink.
    moved = [(y0 + 40, x0, y1 + 40, x1) for y0, x0, y1, x1 in (w.box for w in page.words)]
    assert (dark & ~_mask(dark.shape, moved, 1.5)).sum() > 100


def test_pdf_boxes_scale_exactly_with_dpi(figure_pdf):
    low, high = (read_pdf(figure_pdf, pages=[1], dpi=d).pages[0] for d in (72, 216))
    assert high.size == (3 * low.size[0], 3 * low.size[1])
    np.testing.assert_allclose(np.array([w.box for w in high.words]), 3 * np.array([w.box for w in low.words]), rtol=1e-9)


def test_pdf_rotated_page_boxes_follow_the_rotation(figure_pdf, tmp_path):
    doc = pdfium.PdfDocument(str(figure_pdf))
    doc[0].set_rotation(90)
    doc.save(tmp_path / "rot.pdf")
    doc.close()
    page = read_pdf(tmp_path / "rot.pdf", pages=[0], dpi=100).pages[0]
    assert page.size == (400, 300)  # landscape 4 x 3 in, turned a quarter
    dark = _dark(page.image)
    assert (dark & ~_mask(dark.shape, [w.box for w in page.words], 1.5)).sum() == 0
    assert all(_mask(dark.shape, [w.box], 0)[dark].sum() > 10 for w in page.words)
    assert all(w.box[2] - w.box[0] > w.box[3] - w.box[1] for w in page.words)  # the words now run down the page


def test_pdf_page_ranges_choose_pages_and_refuse_out_of_range(figure_pdf):
    ctx = read_pdf(figure_pdf, pages="1,3", dpi=36, render=False)
    assert [p.index for p in ctx.pages] == [0, 2] and ctx.meta["n_pages"] == 3 and ctx.meta["dpi"] == 36.0
    assert all(p.image is None and p.size == (108, 144) for p in ctx.pages)
    assert [p.index for p in read_pdf(figure_pdf, pages="2-3", dpi=36).pages] == [1, 2]
    with pytest.raises(ValueError, match=r"^page 4 is out of range: .* has 3 pages \(numbered 1-3\)$"):
        read_pdf(figure_pdf, pages="2-4")
    with pytest.raises(ValueError, match=r"page 0 is out of range"):
        read_pdf(figure_pdf, pages="0")
    with pytest.raises(ValueError, match=r"page index 3 is out of range: .* \(0-based indices 0-2\)"):
        read_pdf(figure_pdf, pages=[3])
    with pytest.raises(ValueError, match=r"bad page range 'one'; write 1-based pages"):
        read_pdf(figure_pdf, pages="one")
    with pytest.raises(ValueError, match=r"end comes before the start"):
        read_pdf(figure_pdf, pages="3-2")
    with pytest.raises(ValueError, match=r"dpi must be in \(0, 1200\], got 0"):
        read_pdf(figure_pdf, dpi=0)


def test_pdf_bad_files_fail_in_one_line(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"^no such PDF: .*missing\.pdf$"):
        read_pdf(tmp_path / "missing.pdf")
    (tmp_path / "notes.pdf").write_text("just text\n")
    with pytest.raises(ValueError, match=r"notes\.pdf is not a PDF \(no %PDF- header\)"):
        read_pdf(tmp_path / "notes.pdf")
    (tmp_path / "cut.pdf").write_bytes(b"%PDF-1.4\n1 0 obj\n<<")
    with pytest.raises(ValueError, match=r"cut\.pdf is damaged and cannot be read as a PDF"):
        read_pdf(tmp_path / "cut.pdf")
    with pytest.raises(ValueError, match=r"enc\.pdf is encrypted; decrypt it first") as e:
        read_pdf(_encrypted_pdf(tmp_path / "enc.pdf"))
    assert "\n" not in str(e.value)


def test_real_manual_reads_with_its_text_layer():
    ctx = read_pdf(FLOAT_PDF, pages="1", dpi=100)
    page = ctx.pages[0]
    assert ctx.meta["n_pages"] == 12 and page.size == (1170, 827)  # A4 at 100 dpi, rounded up
    assert page.line_text(0) == "An Improved Environment for Floats∗"
    assert "1 Introduction" in page.text.splitlines()
    dark = _dark(page.image)
    # The text layer accounts for the page's ink, except the footnote rule (a drawn line, not text).
    outside = dark & ~_mask(dark.shape, [w.box for w in page.words], 1.5)
    assert outside.sum() < 0.02 * dark.sum()
    # A hyphen at a line end PDFium takes for soft still ends its line: no word spans two lines.
    assert all(w.box[2] - w.box[0] < 40 for w in page.words[5:])


@pytest.fixture(scope="module")
def prose() -> str:
    line = "The quick brown fox jumps over the lazy dog while a wizard quietly juggles five boxing kangaroos"
    return "\n".join(f"{i}. {line}" for i in range(40)) + "\n\n    indented code_line(x)\n" + "y" * 150


def test_text_pages_word_boxes_are_exact(prose):
    layout = TextLayout(size=18, width=700, height=600, margin=30)
    ctx = render_text(prose, layout, "prose")
    assert len(ctx) > 2 and ctx.meta["n_pages"] == len(ctx)
    font, _ = _font(layout.font, layout.size)
    for page in ctx.pages:
        ink = (page.image[0].numpy() * 255).round().astype(np.uint8)
        for text, (y0, x0, y1, x1) in page.words:
            y0, x0, y1, x1 = int(y0), int(x0), int(y1), int(x1)
            up, left, _, _ = _extent(font, text)
            alone = Image.new("L", (layout.width, layout.height), 255)
            ImageDraw.Draw(alone).text((x0 - left, y0 - up), text, font=font, fill=0, anchor="ls")
            alone = np.asarray(alone)
            assert (alone[y0:y1, x0:x1] == ink[y0:y1, x0:x1]).all(), text  # the page at the box is the word
            alone = alone.copy()
            alone[y0:y1, x0:x1] = 255
            assert (alone == 255).all(), text  # and the word has no ink outside its box
            assert layout.margin <= x0 and x1 <= layout.width - layout.margin and y1 <= layout.height - layout.margin
    # Negative control: a box one pixel to the right no longer matches its word.
    page = ctx.pages[0]
    text, (y0, x0, y1, x1) = page.words[0]
    shifted = np.asarray(page.image[0, int(y0):int(y1), int(x0) + 1:int(x1) + 1])
    assert not np.array_equal(shifted, np.asarray(page.image[0, int(y0):int(y1), int(x0):int(x1)]))


def test_text_pages_keep_every_word_in_order_and_record_the_settings(prose, tmp_path):
    layout = TextLayout(size=18, width=700, height=600, margin=30)
    ctx = render_text(prose, layout, "prose")
    words = [w.text for p in ctx.pages for w in p.words]
    assert "".join(words) == "".join(prose.split())  # wrapping never drops or reorders text
    assert max(len(w) for w in words) < 150  # the 150-letter word was broken to fit the column
    recorded = {"kind": "text", "font": "DejaVu Sans", "size": 18, "width": 700, "height": 600, "margin": 30,
                "line_spacing": 1.2, "font_file": "DejaVuSans.ttf", "n_pages": len(ctx)}
    assert {k: ctx.meta[k] for k in recorded} == recorded
    boxes = [page.line_box(i) for page in ctx.pages[-1:] for i in range(len(page.lines))]
    assert all(a[2] <= b[0] for a, b in zip(boxes, boxes[1:]))  # lines never overlap
    code = next(p.words[ln.words[0]] for p in ctx.pages for ln in p.lines if p.words[ln.words[0]].text == "indented")
    assert code.box[1] >= 30 + 4 * 5  # four leading spaces indent the line
    path = tmp_path / "t.txt"
    path.write_text("Hello world\n", encoding="utf-8")
    assert [w.text for w in render_text(read_text_file(path)).pages[0].words] == ["Hello", "world"]
    path.write_bytes(b"\xff\xfe bad")
    with pytest.raises(ValueError, match=r"t\.txt is not UTF-8 text"):
        read_text_file(path)
    with pytest.raises(ValueError, match=r"font family 'No Such Font' is not installed"):
        render_text("x", TextLayout(font="No Such Font"))
    with pytest.raises(ValueError, match=r"leaves no room for 64 px text"):
        TextLayout(size=64, width=200)


def test_corpus_needs_the_texlive_doc_packages_and_lists_them(tmp_path):
    pdfs = corpus.listed_pdfs()  # fails (never skips) when `make setup` did not install them
    assert len(pdfs) >= 400 and FLOAT_PDF in pdfs
    with pytest.raises(MissingDependencyError, match=r"needs the Debian package texlive-latex-base-doc; run `make setup`"):
        corpus.listed_pdfs(info=tmp_path)


def test_corpus_split_is_by_family_deterministic_and_disjoint():
    names = [p.relative_to(corpus.DOC_ROOT).as_posix() for p in corpus.listed_pdfs()]
    families = {corpus.family_of(n) for n in names}
    split = {f: corpus.split_of(f) for f in families}
    assert split == {f: corpus.split_of(f) for f in sorted(families, reverse=True)}  # no order dependence
    by_split = {s: {f for f in families if split[f] == s} for s in corpus.SPLITS}
    assert sum(len(v) for v in by_split.values()) == len(families)  # each family on exactly one side
    for s, share in corpus.SPLITS.items():
        assert abs(len(by_split[s]) / len(families) - share) < 0.06, (s, len(by_split[s]))
    # Related files are one family: every newsletter issue, and a manual with its code listing.
    assert len({split[corpus.family_of(n)] for n in names if n.startswith("latex/base/ltnews")}) == 1
    assert corpus.family_of("latex/base/lthooks-code.pdf") == corpus.family_of("latex/base/lthooks-doc.pdf")


def test_corpus_keeps_documents_with_a_text_layer():
    picked = [corpus.DOC_ROOT / n for n in ("latex/float/float.pdf", "latex/metalogo/TeXoutline.pdf",
                                            "latex/beamer/beamerlogo.pdf", "latex/base/ltnews18.pdf")]
    docs = corpus.documents(picked)
    assert [d.name for d in docs] == ["latex/float/float.pdf"]  # the logos and a 30-word page drop out
    assert docs[0].n_pages == 12 and docs[0].family == "latex/float/float" and docs[0].split == corpus.split_of("latex/float/float")
    assert corpus.documents(picked, split="test" if docs[0].split != "test" else "val") == []
    with pytest.raises(ValueError, match=r"unknown split 'dev'; choose one of test, val, train"):
        corpus.documents(picked, split="dev")


def test_questions_on_a_real_manual_have_answers_where_the_text_is():
    ctx = read_pdf(FLOAT_PDF, dpi=100, render=False)
    qs = questions(ctx)
    kinds = {k: [q for q in qs if q.kind == k] for k in KINDS}
    assert [q.answers[0] for q in kinds["page_number"]] == [str(i) for i in range(1, 13)]
    assert all(q.boxes[0][0] > 0.85 * 1170 for q in kinds["page_number"])  # folios at the foot of the page
    titles = {q.question: q.answers[0] for q in kinds["section_title"]}
    assert titles["What is the title of section 1?"] == "Introduction"
    assert titles["What is the title of section 4.1?"] == "Basics"
    assert len(kinds["next_words"]) >= 10
    for q in qs:
        assert not leaks(q) and q.answers[0].casefold() not in q.question.casefold()
        page = ctx.pages[q.page]
        inside = [w.text for w in page.words if union([w.box, q.boxes[0]]) == q.boxes[0]]
        assert " ".join(inside) == q.answers[0], q  # the answer box holds exactly the answer's words


def test_next_words_quote_another_line_and_never_their_answer():
    layout = TextLayout(size=16, width=900, height=400, margin=20)
    safe = render_text("alpha beta gamma delta epsilon zeta\nomega psi chi phi", layout)
    (q,) = questions(safe, kinds=["next_words"])
    assert q.question == 'What comes after "gamma delta epsilon zeta"?' and q.answers == ("omega psi chi",)
    assert q.boxes[0] == union([w.box for w in safe.pages[0].words[6:9]])
    # The next line repeats the phrase's end: the answer would sit inside the question, so no question.
    leaky = render_text("alpha beta gamma delta epsilon zeta\ndelta epsilon zeta phi", layout)
    assert questions(leaky, kinds=["next_words"]) == []
    # A phrase found twice in the context is ambiguous: no question either.
    twice = render_text("alpha beta gamma delta epsilon zeta\nomega psi chi phi\nalpha beta gamma delta epsilon zeta", layout)
    assert [q.answers for q in questions(twice, kinds=["next_words"])] == []
    with pytest.raises(ValueError, match=r"unknown question kind\(s\) \['table'\]"):
        questions(Context([], "x"), kinds=["table"])


def test_page_numbers_are_lone_numbers_that_run_with_the_pages():
    layout = TextLayout(size=16, width=600, height=300, margin=20)
    folios = ["1", "2", "7", "4", "ix"]  # page 3 ends in a stray number (a code line's, say)
    pages = [replace(render_text(f"Some body text on this page\n\n\n\n{f}", layout, "doc").pages[0], index=i)
             for i, f in enumerate(folios)]
    pages.append(replace(render_text("Body text\n\n\n\n6 of them", layout, "doc").pages[0], index=5))  # not lone
    qs = questions(Context(pages, "doc"), kinds=["page_number"])
    assert [(q.page, q.answers[0]) for q in qs] == [(0, "1"), (1, "2"), (3, "4"), (4, "ix")]
    assert all(q.question == "What is the page number?" for q in qs)
    assert qs[0].boxes[0] == pages[0].words[-1].box
    # Alone, the stray page cannot be checked against others: its number is taken.
    assert [q.answers[0] for q in questions(Context(pages[2:3], "doc"), kinds=["page_number"])] == ["7"]
