"""The microscope in a real browser: start ``arr-coc serve`` on a free port, drive it with headless Chromium.

Chromium and its driver come from Debian's packages (``chromium``, ``chromium-driver``; ``make setup``
installs them); the driver path is given explicitly, so Selenium never looks for a browser to download.
Used by the browser test and by ``benchmarks/screenshot_app.py``.
"""
from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
INSTALL = "apt-get install chromium chromium-driver (or run `make setup`)"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def server(*args: str, timeout_s: float = 120.0, command: Sequence[str] = (sys.executable, "-m", "arr_coc.cli"),
           cwd: str | Path | None = None, env: dict[str, str] | None = None) -> Iterator[str]:
    """``arr-coc serve --port P *args`` in a child process; yields its URL once the page answers.

    ``command`` runs ``arr-coc`` (default: this interpreter's package; the wheel test passes an installed
    ``arr-coc`` script), in ``cwd`` with ``env`` (default: this process's).
    """
    port = free_port()
    proc = subprocess.Popen([*command, "serve", "--port", str(port), *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"arr-coc serve exited with {proc.returncode}:\n{proc.stdout.read()}")
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"arr-coc serve did not answer on {url} within {timeout_s:.0f} s") from None
                time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def chromium(width: int = 1500, height: int = 1300) -> Iterator[Any]:
    """A headless Chromium WebDriver from the system packages; quits on exit."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    for path in (CHROMIUM, CHROMEDRIVER):
        if not Path(path).exists():
            raise FileNotFoundError(f"{path} not found: {INSTALL}")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                f"--window-size={width},{height}"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


class Page:
    """The microscope's page as a user drives it (element ids from :mod:`arr_coc.app.ui`)."""

    def __init__(self, driver: Any, url: str, timeout_s: float = 120.0) -> None:
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import WebDriverWait

        self.driver, self.by, self.timeout_s = driver, By, timeout_s
        self.wait = lambda cond, t=timeout_s: WebDriverWait(driver, t, poll_frequency=0.2).until(cond)
        driver.get(url)
        self.wait(lambda d: d.find_elements(By.CSS_SELECTOR, "#image-file input[type=file]"))

    def text(self, elem_id: str) -> str:
        return self.driver.find_element(self.by.ID, elem_id).text

    def upload(self, path: str | Path, field_id: str = "image-file") -> None:
        """Choose ``path`` in a file field (the image's, or ``context-files``), clearing what is there, and wait
        until it has reached the server."""
        field = self.driver.find_element(self.by.ID, field_id)
        if not field.find_elements(self.by.CSS_SELECTOR, "input[type=file]"):
            field.find_element(self.by.CSS_SELECTOR, "button[aria-label=Clear]").click()
        self.wait(lambda d: field.find_elements(self.by.CSS_SELECTOR, "input[type=file]"))
        field.find_element(self.by.CSS_SELECTOR, "input[type=file]").send_keys(str(path))
        self.wait(lambda d: field.find_elements(self.by.CSS_SELECTOR, f"td.filename[aria-label='{Path(path).name}']"))

    def fill(self, elem_id: str, value: Any) -> None:
        box = self.driver.find_element(self.by.CSS_SELECTOR, f"#{elem_id} textarea, #{elem_id} input")
        box.clear()
        box.send_keys(str(value))

    def run(self, button: str = "run") -> str:
        """Press Run (or ``button``); wait for the status line of this request ("Done ..." or "Error ...")."""
        before = self.text("status")
        self.driver.find_element(self.by.ID, button).click()
        self.wait(lambda d: self.text("status") != before and self.text("status").startswith(("Done", "Error")))
        return self.text("status")
