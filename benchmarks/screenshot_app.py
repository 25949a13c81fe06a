"""Screenshot of the microscope for the docs: `arr-coc serve`, the bundled receipt, one question, headless Chromium.

Uses the browser test's setup (Debian's chromium + chromium-driver through Selenium). Run:
    python benchmarks/screenshot_app.py [--out docs/app.png]
"""
from __future__ import annotations

import argparse
from pathlib import Path

from arr_coc.app.browser import Page, chromium, server

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "app.png")
    p.add_argument("--image", type=Path, default=ROOT / "examples" / "receipt.jpg")
    p.add_argument("--question", default="What is the total?")
    args = p.parse_args()
    with server("--threads", "1") as url, chromium(width=1500, height=1250) as driver:
        page = Page(driver, url)
        page.upload(args.image)
        page.fill("question", args.question)
        status = page.run()
        if not status.startswith("Done"):
            raise SystemExit(f"the page answered: {status}")
        driver.execute_script("window.scrollTo(0, 0);")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(args.out))
    print(f"{status}\nwritten {args.out}")


if __name__ == "__main__":
    main()
