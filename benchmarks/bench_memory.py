"""Peak memory of `arr-coc look` (default channels, MiniLM, the picture drawn) up to the largest image it reads.

Each image runs in its own process; its peak resident set (RSS high-water mark) comes from ``os.wait4``
for that process. Linux counts in it the memory of the process that started it, so this script stays small
(no torch; every test image is drawn in a process of its own) and reports that floor beside the table. The largest legal image is a square of ``arr_coc.engine.imageio.MAX_IMAGE_PIXELS``
pixels (13377 x 13377); one more row is refused from the header. Writes the table to
``benchmarks/results/memory.md`` and prints it.

    python benchmarks/bench_memory.py            # about 15 minutes on 2 busy CPU cores
    python benchmarks/bench_memory.py --quick    # the receipt and a 13000 x 13000 PNG only
"""
from __future__ import annotations

import argparse
import math
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from large_png import write_png  # beside this script
from PIL import Image, ImageDraw

ROOT = Path(__file__).resolve().parents[1]
# asked of a child process: importing arr_coc here would load torch into this (measuring) process
MAX_IMAGE_PIXELS = int(subprocess.run([sys.executable, "-c", "from arr_coc.engine.imageio import MAX_IMAGE_PIXELS as m; print(m)"],
                                      capture_output=True, text=True, check=True).stdout)

LIMIT_MB = 2048  # what `look` may take on any image it accepts
# every PNG colour type (benchmarks/large_png.py), as PIL opens it
KINDS = {"RGB": "RGB", "RGBA": "RGBA (4 bytes/px)", "I;16": "16-bit grey", "P;trns": "palette with transparency",
         "P": "palette", "LA": "grey + alpha", "L": "8-bit grey", "1": "1-bit"}
SIDE = math.isqrt(MAX_IMAGE_PIXELS)  # 13377: the largest legal square


def page(mode: str, size: tuple[int, int]) -> Image.Image:
    """A page of the given mode and size: white paper with dark bars where text would be."""
    img = Image.new("RGB", size, (245, 245, 240))
    draw = ImageDraw.Draw(img)
    w, h = size
    for i in range(12):
        y = int(h * (0.1 + 0.07 * i))
        draw.rectangle((int(w * 0.1), y, int(w * (0.5 + 0.03 * i)), y + max(1, h // 150)), fill=(20, 20, 30))
    if mode == "I;16":
        return img.convert("L").point(lambda v: v * 257, "I").convert("I;16")
    return img.convert(mode)


def cases(folder: Path, quick: bool) -> list[tuple[str, Path]]:
    out = [("bundled receipt 992x1484 JPEG", ROOT / "examples" / "receipt.jpg")]
    specs = [(f"13000x13000 RGB PNG (the reported 7.3 GB case)", "RGB", (13000, 13000), "png")]
    if not quick:
        specs += [(f"{SIDE}x{SIDE} {KINDS[mode]} PNG (largest legal)", mode, (SIDE, SIDE), "png") for mode in KINDS]
        specs += [(f"{SIDE}x{SIDE} RGB JPEG (largest legal, decoded at 1/4)", "RGB", (SIDE, SIDE), "jpg"),
                  ("13377x67 RGB PNG (thin, aspect 199.7)", "RGB", (13377, 67), "png"),
                  (f"{SIDE}x{SIDE + 1} RGB PNG (one row over: refused)", "RGB", (SIDE, SIDE + 1), "png")]
    for name, mode, size, ext in specs:
        path = folder / f"{mode.replace(';', '_')}_{size[0]}x{size[1]}.{ext}"
        if ext == "png":  # written a row at a time: every PNG colour type, in seconds
            write_png(path, mode, *size)
        else:
            subprocess.run([sys.executable, __file__, "--make", str(path), mode, str(size[0]), str(size[1])], check=True)
        out.append((name, path))
    return out


def peak(image: Path, out_png: Path) -> tuple[float, float, int, str]:
    """(peak RSS MB, seconds, exit code, last stderr line) of one `arr-coc look` process."""
    return peak_of([sys.executable, "-m", "arr_coc.cli", "look", str(image), "What is the total?", "--out",
                    str(out_png)])


def peak_of(cmd: list[str]) -> tuple[float, float, int, str]:
    start = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        last = (err.read().decode(errors="replace").strip().splitlines() or [""])[-1]
    return usage.ru_maxrss / 1024, time.perf_counter() - start, proc.returncode, last


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="the receipt and the 13000 x 13000 PNG only")
    p.add_argument("--make", nargs=4, metavar=("PATH", "MODE", "W", "H"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.make:  # draw one test image (in its own process, so its memory never counts)
        path, mode, w, h = args.make
        page(mode, (int(w), int(h))).save(path, **({"quality": 85} if path.endswith(".jpg") else {"compress_level": 1}))
        return
    floor, _, _, _ = peak_of([sys.executable, "-c", "pass"])
    rows = ["| image | file | peak RSS | time | result |", "|---|---:|---:|---:|---|"]
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for name, path in cases(Path(tmp), args.quick):
            mb, seconds, code, last = peak(path, Path(tmp) / "out.png")
            worst = max(worst, mb)
            result = "ok" if code == 0 else f"exit {code}: {last[:90]}"
            rows.append(f"| {name} | {path.stat().st_size / 1e6:.1f} MB | {mb:.0f} MB | {seconds:.0f} s | {result} |")
            print(rows[-1], flush=True)
    write_report(rows, worst, floor, "memory.md", "bench_memory.py")

def write_report(rows: list[str], worst: float, floor: float, name: str, script: str) -> None:
    """Writes the table, its verdict against ``LIMIT_MB`` and the command that made it to results/NAME."""
    table = "\n".join(rows)
    verdict = (f"worst peak {worst:.0f} MB, limit {LIMIT_MB} MB: {'within' if worst < LIMIT_MB else 'OVER'} "
               f"(floor: `python -c pass` started from this script reads {floor:.0f} MB)")
    out = ROOT / "benchmarks" / "results" / name
    out.parent.mkdir(parents=True, exist_ok=True)
    made_by = f"made by: `python benchmarks/{script}{'' if len(sys.argv) < 2 else ' ' + shlex.join(sys.argv[1:])}`"
    out.write_text(f"{made_by}\n\n{table}\n\n{verdict}\n")
    print(f"\n{table}\n\n{verdict}\nwritten {out}")


if __name__ == "__main__":
    main()
