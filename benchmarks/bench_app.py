"""The microscope's latency: a first question on an image vs further questions on the same image.

Each request is what the page does on Run: allocate (texture and OCR from the per-image cache after the
first question) and draw every view plus the JSON and PNG downloads. Medians over the bundled examples'
follow-up questions; the first question is the cold cost (texture, learned saliency, OCR). Run:
    python benchmarks/bench_app.py [--threads 1] [--repeats 5]
"""
from __future__ import annotations

import argparse
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from arr_coc.app.service import Microscope, Settings, read_upload, render

ROOT = Path(__file__).resolve().parents[1]
QUESTIONS = {  # the first question is the cold one; the rest hit the per-image cache
    "receipt.jpg": ["What is the total?", "What is the date?", "Where is the VAT number?", "What did the eggs cost?",
                    "What is the shop's address?", "Which card paid?"],
    "form.jpg": ["What is the date of the request?", "Who requested it?", "What is the project code?",
                 "How much was requested?", "Who approved it?", "What is the telephone number?"],
    "photo.jpg": ["Where is the cat?", "What colour are the cat's eyes?", "Is there a window?", "Where are the ears?",
                  "What is behind the cat?", "Is the cat asleep?"],
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "bench_app.md")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    scope = Microscope()
    scope.run(read_upload(ROOT / "examples" / "receipt.jpg"), "warm up the models", Settings())  # loads ONNX, fonts
    scope.forget()  # cold caches again: the first question on each image pays for its texture and OCR
    rows, warm_all = [], []
    out = Path(tempfile.mkdtemp(prefix="bench-app-"))  # each request overwrites the last one's downloads
    for name, questions in QUESTIONS.items():
        image = read_upload(ROOT / "examples" / name)
        times = []
        for q in questions:
            start = time.perf_counter()
            result = scope.run(image, q, Settings())
            alloc_s = time.perf_counter() - start
            render(result, out)
            times.append((time.perf_counter() - start, alloc_s))
        warm = [t for t, _ in times[1:]]
        warm_all += warm
        rows.append(f"| {name} | {image.shape[2]}x{image.shape[1]} | {times[0][0]:.2f} | "
                    f"{statistics.median(warm):.3f} | {statistics.median(a for _, a in times[1:]):.3f} | "
                    f"{times[0][0] / statistics.median(warm):.0f}x |")
    load = os.getloadavg()[0]
    table = "\n".join([
        f"made by: `python benchmarks/bench_app.py{'' if len(sys.argv) < 2 else ' ' + shlex.join(sys.argv[1:])}`",
        "",
        f"torch threads {torch.get_num_threads()}, {os.cpu_count()} CPU cores, load average {load:.1f} at the end; "
        f"default settings (273 saccades, default channels, shipped scorer)",
        "",
        "| image | px | first question s | next questions median s | of which allocation s | first / next |",
        "|---|---:|---:|---:|---:|---:|",
        *rows,
        f"| all | | | **{statistics.median(warm_all):.3f}** | | |",
    ])
    shutil.rmtree(out)
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tag = f"threads {torch.get_num_threads()}"
    previous = args.out.read_text().split("\n\n## ") if args.out.exists() else []
    kept = [s for s in previous[1:] if not s.startswith(tag)]
    args.out.write_text("# bench_app: the microscope's request latency\n\n## " +
                        "\n\n## ".join([*kept, f"{tag}\n\n{table}\n"]))
    print(f"written {args.out}")


if __name__ == "__main__":
    main()
