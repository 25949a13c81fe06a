"""`arr-coc serve` driven by a real browser (headless Chromium from Debian's packages, via Selenium).

One server, one browser, one user session: a good request, three bad ones (not an image, an empty
question, a budget the image cannot hold) that each show their error in the page, a good request
after them that still works, and two configurations compared side by side. The context tab: a
5-page range of a PDF, one question, the per-page budget summing to the total, the strip's outlines
on exactly the pages given saccades, the opened page with its saccades, another page opened.
"""
from __future__ import annotations

import io
import re
import socket
import urllib.error
import urllib.request

import numpy as np
import pytest
from conftest import key_pdf
from PIL import Image, ImageDraw

from arr_coc.app.browser import Page, chromium, server
from arr_coc.app.panels import DIM, font
from arr_coc.app.ui import COMPARE_WITH
from arr_coc.config import SamplerConfig

CELL = 28
ROWS, COLS = 12, 16  # a 448 x 336 px page: 192 token cells


@pytest.fixture(scope="module")
def page_file(tmp_path_factory):
    img = Image.new("RGB", (COLS * CELL, ROWS * CELL), (235, 235, 225))
    d = ImageDraw.Draw(img)
    d.text((20, 40), "INVOICE DATE 12 MAY 2026", fill="black", font=font(22))
    d.text((20, 250), "TOTAL DUE 48.50", fill="black", font=font(22))
    path = tmp_path_factory.mktemp("browser") / "page.png"
    img.save(path)
    return path


def show_tab(page: Page, name: str) -> None:
    """Show the tab labelled ``name`` (once the page has drawn it; a tab Gradio moved into its overflow menu is
    clicked all the same)."""
    def button(driver):
        return next((b for b in driver.find_elements(page.by.CSS_SELECTOR, "button[role=tab]")
                     if (b.get_attribute("textContent") or "").strip() == name), None)

    page.wait(button)
    page.driver.execute_script("arguments[0].click();", button(page.driver))


def table(page: Page, elem_id: str) -> list[list[str]]:
    """The body rows of the (markdown) table in element ``elem_id``, as cell texts."""
    rows = page.driver.find_elements(page.by.CSS_SELECTOR, f"#{elem_id} table tbody tr")
    return [[td.text.strip() for td in r.find_elements(page.by.TAG_NAME, "td")] for r in rows]


def value(page: Page, elem_id: str) -> str:
    """The value of the input in element ``elem_id`` (a number or text field)."""
    return page.driver.find_element(page.by.CSS_SELECTOR, f"#{elem_id} textarea, #{elem_id} input").get_attribute("value")


def image_src(page: Page, elem_id: str) -> str:
    """The src (a URL or a data: URI) of the image in element ``elem_id``."""
    return page.driver.find_element(page.by.CSS_SELECTOR, f"#{elem_id} img").get_attribute("src")


def fetch(url: str) -> np.ndarray:
    with urllib.request.urlopen(url, timeout=30) as r:
        return np.asarray(Image.open(io.BytesIO(r.read())).convert("RGB")).astype(float)


def own_address() -> str:
    """This machine's address on its default route (a UDP socket is only pointed there, nothing is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))
        except OSError:
            return "127.0.0.1"
        return s.getsockname()[0]


def upload_status(url: str, size: int) -> int:
    """HTTP status of posting a ``size``-byte file to the server's upload endpoint."""
    boundary = "arrcocboundary"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"files\"; filename=\"big.png\"\r\n"
            f"Content-Type: application/octet-stream\r\n\r\n").encode()
    body += bytes(size) + f"\r\n--{boundary}--\r\n".encode()
    req = urllib.request.Request(url + "gradio_api/upload", data=body,
                                 headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status
    except urllib.error.HTTPError as err:
        return err.code


def test_the_page_answers_shows_errors_and_keeps_serving(page_file, tmp_path):
    not_an_image = tmp_path / "scan.png"
    not_an_image.write_bytes(b"%PDF-1.4 this is not a picture")
    with server("--query-encoder", "hashing", "--threads", "1") as url, chromium() as driver:
        assert url.startswith("http://127.0.0.1:")  # local only unless --host says otherwise
        me = own_address()
        if not me.startswith("127."):  # the machine's own address does not reach a server bound to 127.0.0.1
            with pytest.raises(OSError):
                socket.create_connection((me, int(url.rsplit(":", 1)[1].strip("/"))), timeout=5).close()
        assert upload_status(url, 1000) == 200
        assert upload_status(url, 26 * 2**20) == 413  # over the 25 MB cap: refused before it reaches Python

        page = Page(driver, url)
        page.upload(page_file)
        page.fill("question", "What is the total due?")
        page.fill("saccades", 64)
        assert page.run().startswith("Done")
        # 64 saccades come with an 8x8 gestalt: 128 tokens of the page's 192
        assert "tokens sent 128 = 64 gestalt (8x8) + 64 saccades" in page.text("summary")
        assert "full resolution 192" in page.text("summary")

        shown, original = fetch(image_src(page, "saccades")), np.asarray(Image.open(page_file)).astype(float)
        assert shown.shape == original.shape  # a small page is drawn 1:1, cell for cell
        assert np.abs(shown - original).mean() > 20  # the saccade view is not the input image
        # exactly the 128 cells not sent are dimmed (read in each cell's corner, inside the outline, off the numbers)
        corner = lambda x: x.reshape(ROWS, CELL, COLS, CELL, 3)[:, 3:9, :, 3:9].transpose(0, 2, 1, 3, 4)  # noqa: E731
        light = corner(original) > 60  # paper, not ink: a ratio there is well defined
        ratio = np.where(light, corner(shown) / np.maximum(corner(original), 1), np.nan).reshape(ROWS, COLS, -1)
        ratio = np.nanmedian(ratio, -1)  # [12, 16] brightness kept per cell
        assert np.isclose(ratio, DIM, atol=0.02).sum() == ROWS * COLS - 64
        assert np.isclose(ratio, 1.0, atol=0.02).sum() == 64

        page.upload(not_an_image)
        assert "the upload is not an image" in page.run()
        page.upload(page_file)
        page.fill("question", "   ")
        assert "the question is empty" in page.run()
        page.fill("question", "Where is the invoice date?")
        page.fill("saccades", 500)
        assert "budget K=500 exceeds the 192 valid cells" in page.run()

        page.fill("saccades", 32)
        status = page.run()
        assert status.startswith("Done"), status
        assert "tokens sent 48 = 16 gestalt (4x4) + 32 saccades" in page.text("summary")

        show_tab(page, "Compare")  # A (the default sampler, as above) and B (another) side by side, with their tokens
        assert page.run("compare").startswith("Done")
        a, b = page.text("summary-a"), page.text("summary-b")
        assert COMPARE_WITH != SamplerConfig.name
        assert f"method {SamplerConfig.name}" in a and f"method {COMPARE_WITH}" in b
        assert all("tokens sent 48 = 16 gestalt (4x4) + 32 saccades" in s for s in (a, b))


def red(image: np.ndarray) -> np.ndarray:
    """Where the saccade outlines are: (220, 0, 0) drawn, antialiased by the resize around them."""
    return (image[..., 0] > 180) & (image[..., 1] < 60) & (image[..., 2] < 60)


def test_the_context_tab_shows_the_budget_per_page_the_strip_and_the_opened_page(tmp_path):
    pdf = key_pdf(tmp_path / "manual.pdf", 40)  # page 38 (index 37) alone says where the brass key is
    with server("--query-encoder", "hashing", "--threads", "1") as url, chromium() as driver:
        page = Page(driver, url, timeout_s=300)  # five pages through the default channels on a shared CPU
        show_tab(page, "Context (PDF or pages)")
        page.upload(pdf, "context-files")
        page.fill("question", "Where is the brass key?")
        page.fill("context-tokens", 45)
        page.fill("context-pages", "36-40")
        status = page.run("context-run")
        assert status.startswith("Done"), status
        summary = page.text("context-summary")
        m = re.search(r"5 pages: sent 45 visual tokens = (\d+) gestalt \+ (\d+) saccades, of (\d+) at full", summary)
        assert m, summary
        gestalt, saccades = int(m[1]), int(m[2])
        rows = table(page, "context-summary")  # page | gestalt (h x w) | saccades | text from
        assert [r[0] for r in rows] == ["36", "37", "38", "39", "40"] and {r[3] for r in rows} == {"text layer"}
        grids = [tuple(map(int, r[1].split("x"))) for r in rows]
        per_page = [int(r[2]) for r in rows]
        # 5 pages at T = 45: 2x2 fits (5 x 4 <= 22) but is below the legible 8x8 (budget.LEGIBLE_SIDE), so a 1x1
        # gestalt each and K = 40 ranked over all pages
        assert grids == [(1, 1)] * 5 and gestalt == 5 and saccades == 40 == sum(per_page)
        assert sum(h * w for h, w in grids) + sum(per_page) == 45
        assert max(per_page) == per_page[2] > 0  # the detail goes to the key's page

        strip = fetch(image_src(page, "context-strip"))  # 5 equal pages, 8 px of grey between them
        width = (strip.shape[1] - 4 * 8) / 5
        outlined = sorted({int(x // (width + 8)) for x in np.nonzero(red(strip).any(0))[0]})
        assert strip.shape[0] == 240 and outlined == [i for i, k in enumerate(per_page) if k > 0]

        assert value(page, "context-open") == "38"  # the page with the most saccades is opened
        opened = fetch(image_src(page, "context-page"))
        assert opened.shape[0] == 900 and red(opened).sum() > 0
        quiet = next(i for i, k in enumerate(per_page) if k == 0)  # a page without saccades, opened by number
        page.fill("context-open", 36 + quiet)
        page.driver.find_element(page.by.CSS_SELECTOR, "#context-open input").send_keys("\n")
        page.wait(lambda d: page.text("status") == f"Page {36 + quiet}.")
        page.wait(lambda d: image_src(page, "context-page") and not red(fetch(image_src(page, "context-page"))).any())
