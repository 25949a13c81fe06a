"""Median time of every registered texture channel on a 1024x1024 page.

Each channel is timed alone on the bundled receipt resized to 1024x1024 px: "first question" with an
empty cache (the channel's image part runs: OCR, CNN, saliency net), and "next question" on the same
image (only the question part runs). Shared intermediates (grayscale, Sobel) are recomputed for
every channel, so each row is that channel's full price.

    python benchmarks/bench_channels.py [--repeats 5] [--clip-model PATH]
"""
from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

import arr_coc  # noqa: F401  (registers every channel)
from arr_coc.engine.cache import ImageCache
from arr_coc.engine.channel_registry import CHANNELS
from arr_coc.engine.imageio import load_image
from arr_coc.engine.imageops import resize
from arr_coc.engine.query import MiniLMQueryEncoder
from arr_coc.engine.texture import compute_texture

ROOT = Path(__file__).resolve().parents[1]
QUESTIONS = ("What is the total?", "What is the date?", "Where is the shop?")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--clip-model", default=None)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    image = load_image(ROOT / "examples" / "receipt.jpg")
    pixels = resize(image[None], (args.size, args.size))
    encoder = MiniLMQueryEncoder().load()
    encoder.encode(list(QUESTIONS))
    options = {"clip": {"model": args.clip_model}} if args.clip_model else {}
    rows = []
    names = [n for n in CHANNELS.names() if n != "clip" or args.clip_model]
    with torch.no_grad(), tqdm(total=len(names) * args.repeats, desc="bench_channels") as bar:
        for name in names:
            spec = CHANNELS.get(name)
            kw = {"query_encoder": encoder, "options": options}
            compute_texture(pixels, (name,), queries=[QUESTIONS[0]], cache=ImageCache(), **kw)  # warm-up
            cold, warm = [], []
            for r in range(args.repeats):
                cache = ImageCache()
                t = time.perf_counter()
                compute_texture(pixels, (name,), queries=[QUESTIONS[0]], cache=cache, **kw)
                cold.append((time.perf_counter() - t) * 1e3)
                t = time.perf_counter()
                compute_texture(pixels, (name,), queries=[QUESTIONS[1 + r % 2]], cache=cache, **kw)
                warm.append((time.perf_counter() - t) * 1e3)
                bar.update()
            rows.append((name, spec.width, "yes" if spec.needs_query else "no",
                         statistics.median(cold), statistics.median(warm)))
    lines = [f"made by: `python benchmarks/bench_channels.py{'' if len(sys.argv) < 2 else ' ' + shlex.join(sys.argv[1:])}`", "", f"Bundled receipt resized to {args.size}x{args.size} px, batch 1; median of {args.repeats} runs, "
             f"torch {torch.__version__}, {torch.get_num_threads()} threads.", "",
             "| channel | width | uses the question | first question (ms) | next question, same image (ms) |",
             "|---|---:|---|---:|---:|"]
    lines += [f"| {n} | {w} | {q} | {c:.1f} | {m:.1f} |" for n, w, q, c, m in rows]
    if not args.clip_model:
        lines.append("| clip | 1 | yes | needs CLIP/SigLIP weights (`--clip-model`) | |")
    table = "\n".join(lines)
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_channels.md").write_text(table + "\n")

    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 0.45 * len(rows) + 1.2), layout="constrained")
    ax = fig.subplots()
    y = range(len(rows))
    ax.barh([r - 0.2 for r in y], [r[3] for r in rows], height=0.4, label="first question")
    ax.barh([r + 0.2 for r in y], [r[4] for r in rows], height=0.4, label="next question, same image")
    ax.set_yticks(list(y), [r[0] for r in rows])
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel(f"ms on a {args.size}x{args.size} page (log scale)")
    ax.legend()
    fig.savefig(args.out / "bench_channels.png", dpi=110)
    print(f"wrote {args.out / 'bench_channels.md'} and {args.out / 'bench_channels.png'}")


if __name__ == "__main__":
    main()
