"""Peak memory of `arr-coc look` over contexts: long PDFs, large pages, large images, small budgets, long texts.

Each case runs ``arr-coc look INPUT... "Where is section 7?" [options] --out ...`` (default channels: the MVP
texture, RapidOCR text channels, learned saliency; MiniLM questions; the picture drawn) in a process of its own
and reads that process's peak resident set from ``os.wait4`` (as ``bench_memory.py`` does for one image).
Writes the table to ``benchmarks/results/memory_contexts.md`` and prints it.

    python benchmarks/bench_memory_contexts.py           # about 40 minutes on 2 busy CPU cores
    python benchmarks/bench_memory_contexts.py --quick   # the refusals and the 20-page PDF only
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_memory import peak_of, write_report  # beside this script
from hostile_pdf import A4, raw_pdf, text_pdf

QUESTION = "Where is section 7?"


def cases(folder: Path, quick: bool) -> list[tuple[str, list[str]]]:
    """(name, the inputs then ``--`` then the options) of every case; inputs written into ``folder``."""
    twenty = text_pdf(folder / "a4_20.pdf", 20)
    out = [("20 A4 pages, 150 dpi, --tokens 1300", [str(twenty), "--", "--tokens", "1300"]),
           ("20 A4 pages, --tokens 2 (too small: refused)", [str(twenty), "--", "--tokens", "2"]),
           ("1 A4 page at 1200 dpi (refused)", [str(twenty), "--", "--pages", "1", "--dpi", "1200"]),
           ("a page 200 in wide (refused)", [str(raw_pdf(folder / "wide.pdf", [("0 0 14400 792", "")])), "--"]),
           ("5000 A4 pages, --max-pages 5000 (refused)",
            [str(raw_pdf(folder / "many.pdf", [(A4, "")] * 5000)), "--", "--max-pages", "5000", "--tokens", "20000"])]
    text = folder / "long.txt"
    text.write_text("lorem ipsum dolor sit amet consectetur adipiscing\n" * 20_000)
    out.append(("1 MB text file (442 pages: refused)", [str(text), "--", "--tokens", "2000"]))
    if quick:
        return out
    images = []
    for i in range(3):  # drawn in a process of its own, so its memory never counts
        images.append(folder / f"big{i}.png")
        subprocess.run([sys.executable, str(Path(__file__).parent / "bench_memory.py"), "--make", str(images[-1]),
                        "RGB", "8000", "8000"], check=True)
    out.append(("three 8000x8000 PNG images, --tokens 1300", [*map(str, images), "--", "--tokens", "1300"]))
    out.append(("64 A4 pages, 150 dpi, --tokens 2000", [str(text_pdf(folder / "a4_64.pdf", 64)), "--", "--tokens", "2000"]))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="the refusals and the 20-page PDF only")
    args = p.parse_args()
    floor, _, _, _ = peak_of([sys.executable, "-c", "pass"])
    rows = ["| context | peak RSS | time | result |", "|---|---:|---:|---|"]
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for name, argv in cases(Path(tmp), args.quick):
            inputs, rest = argv[:argv.index("--")], argv[argv.index("--") + 1:]
            cmd = [sys.executable, "-m", "arr_coc.cli", "look", *inputs, QUESTION, *rest, "--out", f"{tmp}/out.png"]
            mb, seconds, code, last = peak_of(cmd)
            worst = max(worst, mb)
            result = "ok" if code == 0 else f"exit {code}: `{last.replace(tmp, '...')[:110]}`"
            rows.append(f"| {name} | {mb:.0f} MB | {seconds:.0f} s | {result} |")
            print(rows[-1], flush=True)
    write_report(rows, worst, floor, "memory_contexts.md", "bench_memory_contexts.py")

if __name__ == "__main__":
    main()
