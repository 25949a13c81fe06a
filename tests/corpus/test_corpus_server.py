"""Hostile input to the microscope's server: each request its own answer in one line, and the server's folders gone
when it is stopped.

The context tab is driven through :func:`arr_coc.app.ui.context_answer`, what its button calls (the status line
first, then the views); ``arr-coc serve`` itself runs as a subprocess for the signals.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import gradio as gr
import numpy as np
import pytest
from conftest import key_pdf
from PIL import Image

from arr_coc.app import context_tab as app_context
from arr_coc.app.browser import free_port
from arr_coc.app.context_tab import ContextView
from arr_coc.app.service import Microscope
from arr_coc.app.ui import answered, context_answer
from arr_coc.engine.query import HashingQueryEncoder

ROOT = Path(__file__).resolve().parents[2]
QUESTION = "Where is the brass key?"


def pdf_of(path: Path, objects: list[bytes], trailer: bytes = b"") -> Path:
    """A PDF of the given objects (1 the catalog), with a correct cross-reference table."""
    out, offsets = b"%PDF-1.4\n", []
    for i, o in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % i + o + b"\nendobj\n"
    xref = len(out)
    n = len(objects) + 1
    out += b"xref\n0 %d\n0000000000 65535 f \n" % n + b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R %s>>\nstartxref\n%d\n%%%%EOF\n" % (n, trailer, xref)
    path.write_bytes(out)
    return path


def encrypted_pdf(path: Path) -> Path:
    """One page under the standard security handler, with a user password that is not empty."""
    return pdf_of(path, [b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
                         b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 100 100] >>",
                         b"<< /Filter /Standard /V 1 /R 2 /O <" + b"ab" * 32 + b"> /U <" + b"cd" * 32 + b"> /P -4 >>"],
                  b"/Encrypt 4 0 R /ID [<" + b"01" * 16 + b"> <" + b"01" * 16 + b">] ")


def empty_pdf(path: Path) -> Path:
    """A well-formed PDF whose page tree holds no pages."""
    return pdf_of(path, [b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [] /Count 0 >>"])


def wide_pdf(path: Path, width_in: float = 200, height_in: float = 11) -> Path:
    """One blank page ``width_in`` x ``height_in`` inches."""
    box = b"[0 0 %d %d]" % (round(width_in * 72), round(height_in * 72))
    return pdf_of(path, [b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
                         b"<< /Type /Page /Parent 2 0 R /MediaBox " + box + b" >>"])


@pytest.fixture(scope="module")
def scope() -> Microscope:
    return Microscope(query_encoder=HashingQueryEncoder())


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("server")
    return {"encrypted": encrypted_pdf(d / "locked.pdf"), "empty": empty_pdf(d / "empty.pdf"),
            "wide": wide_pdf(d / "banner.pdf"), "keys": key_pdf(d / "keys.pdf", 40)}


def status(outputs: list) -> str:
    line = outputs[0]
    assert isinstance(line, str) and line.strip() and "\n" not in line, outputs[:1]
    return line


def test_an_encrypted_pdf_and_one_of_no_pages_each_get_their_own_message_whatever_came_before(scope, files):
    enc = f"**Error** (request {{}}): {files['encrypted']} is encrypted; decrypt it first (e.g. qpdf --decrypt " \
          "--password=PW in.pdf out.pdf)"
    empty = f"**Error** (request {{}}): {files['empty']} has no pages; pass a PDF with at least one page"
    order = ["empty", "encrypted", "empty", "encrypted", "encrypted", "empty"]
    got = [status(context_answer(scope, n, [str(files[k])], QUESTION, 60, "")) for n, k in enumerate(order, 1)]
    assert got == [(enc if k == "encrypted" else empty).format(n) for n, k in enumerate(order, 1)]


def test_a_page_200_inches_wide_is_refused_in_one_line_before_it_is_rendered(scope, files):
    out = context_answer(scope, 7, [str(files["wide"])], QUESTION, 60, None)
    # PDFium renders ceil(side x dpi / 72) px: 14400 pt x 150 / 72 = 30000.000000000004 -> 30001
    assert status(out) == ("**Error** (request 7): page 1 is 30001x1651 px at 150 dpi = 49.5 megapixels; the "
                           "microscope takes pages of at most 8 MP: leave it out or choose a lower \"PDF dpi\"")
    assert out[1:] == [gr.skip()] * 5  # the views of the last good request stay


def test_too_many_pixels_in_all_are_refused_naming_how_many_pages_fit(scope, files, monkeypatch):
    # pages of 2.4 x 1.6 in: 361 x 240 px each at 150 dpi (PDFium rounds 360.0000064 up); 3 x 360 x 240 px holds 2
    monkeypatch.setattr(app_context, "MAX_CONTEXT_PIXELS", 3 * 360 * 240)
    out = context_answer(scope, 3, [str(files["keys"])], QUESTION, 20, "1-4")
    assert status(out) == ("**Error** (request 3): these 4 pages are 0.347 megapixels at 150 dpi; the microscope "
                           "takes 0.259 MP per request (here the first 2): choose fewer in \"PDF pages\" or a lower \"PDF "
                           "dpi\"")
    assert status(context_answer(scope, 4, [str(files["keys"])], QUESTION, 20, "1-2")).startswith("Done: request 4 ")


def test_too_many_pages_are_refused_before_any_is_rendered(scope, files, monkeypatch):
    monkeypatch.setattr(app_context, "MAX_APP_PAGES", 5)
    out = context_answer(scope, 2, [str(files["keys"])], QUESTION, 60, "3-8")
    assert status(out) == ("**Error** (request 2): keys.pdf has 6 pages in 3-8; the microscope takes at most 5 "
                           "(give PDF pages, e.g. 1-5)")


@pytest.mark.parametrize("dpi", [0, -5, float("nan"), 1201, "150"])
def test_a_dpi_outside_the_renderable_range_is_refused_in_one_line(scope, files, dpi):
    out = context_answer(scope, 6, [str(files["keys"])], QUESTION, 20, "1", dpi)
    assert status(out) == f"**Error** (request 6): the PDF dpi must be a number in (0, 1200], got {dpi}"


@pytest.mark.parametrize("error, line", [
    (ValueError(""), "ValueError (no message)"),
    (ValueError("first line\nsecond line"), "first line"),
    (MemoryError(), "the request needed more memory than the server has; send fewer or smaller pages or images"),
    (KeyError("pages"), "internal error (KeyError); the server log has the traceback"),
])
def test_every_error_is_one_non_empty_line_and_a_bug_keeps_its_traceback_in_the_log(error, line, capsys):
    def work() -> list:
        raise error

    out = answered(5, 2, work)
    assert status(out) == f"**Error** (request 5): {line}" and len(out) == 3
    logged = capsys.readouterr().err
    assert ("Traceback" in logged and "KeyError: 'pages'" in logged) == isinstance(error, KeyError)


def test_requests_share_no_state_a_request_answers_as_it_would_alone(scope, files, tmp_path):
    other = key_pdf(tmp_path / "other.pdf", 2)
    alone = context_answer(Microscope(query_encoder=HashingQueryEncoder()), 1, [str(files["keys"])], QUESTION, 40,
                           "37-39")
    # the same request after another context and after a refused one, on the same server
    context_answer(scope, 1, [str(other)], QUESTION, 30, "")
    context_answer(scope, 2, [str(files["encrypted"])], QUESTION, 60, "")
    after = context_answer(scope, 3, [str(files["keys"])], QUESTION, 40, "37-39")
    view_a, view_b = alone[-1], after[-1]
    assert isinstance(view_b, ContextView) and view_b.numbers == (37, 38, 39)
    assert view_a.summary == view_b.summary and "sent **40** visual tokens" in view_b.summary
    assert np.array_equal(view_a.strip, view_b.strip) and view_a.opened == view_b.opened
    assert after[3] == view_b.first == 38  # page 38 holds the brass key: opened first
    assert np.array_equal(after[4], view_b.page(38))
    # the negative control: a different question over the same pages is a different answer
    differs = context_answer(scope, 4, [str(files["keys"])], "Where is there nothing to see?", 40, "37-39")[-1]
    assert differs.summary != view_b.summary or not np.array_equal(differs.strip, view_b.strip)


def test_what_a_context_request_leaves_is_pictures_not_pages(scope, files):
    view = context_answer(scope, 1, [str(files["keys"])], QUESTION, 40, "37-39")[-1]
    assert set(vars(view)) == {"summary", "strip", "numbers", "opened", "first"}
    assert all(isinstance(b, bytes) and b.startswith(b"\x89PNG") for b in view.opened)
    assert view.page(38).shape[0] == app_context.PAGE_HEIGHT and view.nbytes < 2 * 2**20
    with pytest.raises(ValueError, match=r"^page 9 is not in this context; open one of 37-39$"):
        view.page(9)


def test_images_over_the_pixel_bound_are_refused_after_at_most_one_more_image(scope, tmp_path, monkeypatch):
    paths = []
    for i in range(4):
        paths.append(str(tmp_path / f"p{i}.png"))
        Image.new("RGB", (300, 200), "white").save(paths[-1])
    monkeypatch.setattr(app_context, "MAX_CONTEXT_PIXELS", 2 * 300 * 200)
    out = context_answer(scope, 9, paths, QUESTION, 40, "")
    assert status(out) == ("**Error** (request 9): these 3 images are 0.18 megapixels as read; the microscope takes "
                           "0.12 MP per request (here the first 2): send fewer or smaller images")


def _upload(url: str, name: str, data: bytes) -> str:
    """POST one file to Gradio's upload route; the path it was stored at."""
    boundary = uuid.uuid4().hex
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"files\"; filename=\"{name}\"\r\n"
            f"Content-Type: application/octet-stream\r\n\r\n").encode() + data + f"\r\n--{boundary}--\r\n".encode()
    req = urllib.request.Request(url + "gradio_api/upload", data=body,
                                 headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        import json

        return json.loads(r.read())[0]


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stopped_server_removes_its_upload_and_download_folders(stop, tmp_path):
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)}
    env.pop("GRADIO_TEMP_DIR", None)
    proc = subprocess.Popen([sys.executable, "-m", "arr_coc.cli", "serve", "--port", str(port), "--query-encoder",
                             "hashing"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = ""
        while "files in " not in line:
            line = proc.stdout.readline()
            assert line or proc.poll() is None, "arr-coc serve ended before it served"
        work = Path(line.split("files in ", 1)[1].rstrip(")\n"))
        url = f"http://127.0.0.1:{port}/"
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(url, timeout=2).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "arr-coc serve did not answer"
                time.sleep(0.3)
        assert work.parent == tmp_path and {p.name for p in work.iterdir()} == {"uploads", "downloads"}
        stored = Path(_upload(url, "page.png", b"not really a png"))
        assert stored.is_file() and (work / "uploads") in stored.parents
        proc.send_signal(stop)
        assert proc.wait(timeout=60) == 0
        assert not work.exists() and list(tmp_path.iterdir()) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
