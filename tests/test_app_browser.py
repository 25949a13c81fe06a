"""`arr-coc serve` driven by a real browser (headless Chromium from Debian's packages, via Selenium).

One server, one browser, one user session: a good request, three bad ones (not an image, an empty
question, a budget the image cannot hold) that each show their error in the page, and a good request
after them that still works.
"""
from __future__ import annotations

import io
import urllib.request

import numpy as np
import pytest
from PIL import Image, ImageDraw

from arr_coc.app.browser import Page, chromium, server
from arr_coc.app.views import DIM, font

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


def fetch(url: str) -> np.ndarray:
    with urllib.request.urlopen(url, timeout=30) as r:
        return np.asarray(Image.open(io.BytesIO(r.read())).convert("RGB")).astype(float)


def test_the_page_answers_shows_errors_and_keeps_serving(page_file, tmp_path):
    not_an_image = tmp_path / "scan.png"
    not_an_image.write_bytes(b"%PDF-1.4 this is not a picture")
    with server("--query-encoder", "hashing", "--threads", "1") as url, chromium() as driver:
        page = Page(driver, url)
        page.upload(page_file)
        page.fill("question", "What is the total due?")
        page.fill("budget", 64)
        assert page.run().startswith("Done")
        # 64 saccades come with an 8x8 gestalt: 128 tokens of the page's 192
        assert "tokens sent 128 = 64 gestalt (8x8) + 64 saccades" in page.text("summary")
        assert "full resolution 192" in page.text("summary")

        shown, original = fetch(page.image_src("saccades")), np.asarray(Image.open(page_file)).astype(float)
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
        page.fill("budget", 500)
        assert "budget K=500 exceeds the 192 valid cells" in page.run()

        page.fill("budget", 32)
        status = page.run()
        assert status.startswith("Done"), status
        assert "tokens sent 48 = 16 gestalt (4x4) + 32 saccades" in page.text("summary")
