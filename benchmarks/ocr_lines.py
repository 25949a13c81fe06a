"""RapidOCR reading two lines at a time (``arr_coc.ocr.PairedLinesOCR``) against RapidOCR's own batches of six.

    python benchmarks/ocr_lines.py --out benchmarks/results/ocr_lines.md   # identity, then the peaks
    python benchmarks/ocr_lines.py --skip peak                             # identity only
    python benchmarks/ocr_lines.py --skip peak --own-width                 # and the own-width control

Identity: FUNSD's test images (32), the images of SROIE's 40-question test subset (40) and the bundled
examples (3), each read at full resolution by RapidOCR itself (``RapidOCR(params=rapidocr_params(...))``,
``Rec.rec_batch_num`` 6) and by ``PairedLinesOCR`` with the same options (the text channels': detection at
960 px, every line kept): every box, text and score must be equal. Then, on the bundled examples (all
images with ``--logits-everywhere``), the recogniser's output (the CTC probabilities) of every group of
lines as RapidOCR's batch against the same rows two at a time (must be 0) and, the control that says why
two, each row alone (a batch of one). With ``--own-width``, the control that
the group's padding matters: each line alone at its own width (``Rec.rec_batch_num`` 1), the lines whose
text or score differ from RapidOCR's.

Peak: one dense Letter page rendered at 150 dpi (``bench_server_memory.letter_pdf``: a heading and 48
lines of words; 1275 x 1650 px) read in a process of its own each way, after the engine is built and
the page loaded; the rise of the process's peak RSS (``VmHWM``) over the call.
"""
from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from emit import emit  # the benchmark beside this one (a script's folder is on its path)
from PIL import Image

from arr_coc.ocr import DET_LIMIT_SIDE_LEN, LINES_AT_ONCE, PairedLinesOCR, line_groups, rapidocr_params

ROOT = Path(__file__).resolve().parents[1]

PARAMS = rapidocr_params(DET_LIMIT_SIDE_LEN, 0.0)  # the text channels' engine: every detected line kept


def images() -> list[tuple[str, Path]]:
    """(set, path) of every image compared: FUNSD test, SROIE's 40-question test subset, the bundled examples."""
    from arr_coc.data.datasets import load_dataset

    out = []
    for name in ("funsd", "sroie"):
        records = load_dataset(name, split="test", limit=None if name == "funsd" else 40)
        out += [(name, p) for p in sorted({r.image for r in records})]
    return out + [("examples", p) for p in sorted((ROOT / "arr_coc" / "examples").glob("*.jpg"))]


def bgr(path: Path) -> np.ndarray:
    """The image as the channels hand it to RapidOCR: [H, W, 3] uint8, BGR."""
    return np.ascontiguousarray(np.asarray(Image.open(path).convert("RGB"))[..., ::-1])


def identity(own_width: bool, logits_everywhere: bool) -> list[str]:
    from rapidocr import RapidOCR

    batched, lines = RapidOCR(params=PARAMS), PairedLinesOCR(RapidOCR(params=PARAMS))
    alone = RapidOCR(params={**PARAMS, "Rec.rec_batch_num": 1}) if own_width else None
    counts = {"images": 0, "lines": 0, "legible": 0, "differ": 0, "alone_text": 0, "alone_score": 0}
    worst, seconds = [0.0, 0.0], [0.0, 0.0]
    differ: list[str] = []
    for name, path in images():
        img = bgr(path)
        t0 = time.perf_counter()
        a = batched(img)
        t1 = time.perf_counter()
        b = lines(img)
        seconds[0] += t1 - t0
        seconds[1] += time.perf_counter() - t1
        c = alone(img) if own_width else None
        n = len(a.txts or ())
        counts["images"] += 1
        counts["lines"] += n
        counts["legible"] += sum(s >= 0.5 for s in (a.scores or ()))
        same = (a.txts == b.txts and a.scores == b.scores
                and (a.boxes is None) == (b.boxes is None) and (a.boxes is None or np.array_equal(a.boxes, b.boxes)))
        if not same:
            counts["differ"] += 1
            differ.append(f"{name} {path.name}")
        if own_width:  # lines matched by their detected box (a line read as "" is dropped from a result)
            mine = dict(zip(map(_key, a.boxes if a.boxes is not None else ()), zip(a.txts or (), a.scores or ())))
            alone_lines = dict(zip(map(_key, c.boxes if c.boxes is not None else ()), zip(c.txts or (), c.scores or ())))
            for box in mine.keys() | alone_lines.keys():
                x, y = mine.get(box, ("", None)), alone_lines.get(box, ("", None))
                counts["alone_text"] += x[0] != y[0]
                counts["alone_score"] += x[0] == y[0] and x[1] != y[1]
        if logits_everywhere or name == "examples":
            worst = [max(w, d) for w, d in zip(worst, logit_differences(lines, img))]
        print(f"{name} {path.name}: {n} lines, {'equal' if same else 'DIFFERENT'} ({time.perf_counter() - t0:.0f} s)",
              file=sys.stderr, flush=True)
    return [
        f"{counts['images']} images (FUNSD test, SROIE's 40-question test subset, the bundled examples), "
        f"{counts['lines']} recognised lines ({counts['legible']} scoring 0.5 or more)",
        "",
        f"- two lines at a time against RapidOCR's batches of six: {counts['images'] - counts['differ']} of {counts['images']} "
        f"images with every box, text and score equal" + (f"; different: {', '.join(differ)}" if differ else ""),
        f"- the recogniser's probabilities ({'every image' if logits_everywhere else 'the bundled examples'}), each "
        f"group as RapidOCR's batch against its rows {LINES_AT_ONCE} at a time: largest absolute difference {worst[0]:.3g}; against each row alone (a batch of one): {worst[1]:.3g}",
        *([f"- control, each line alone at its own width (`Rec.rec_batch_num` 1): {counts['alone_text']} of "
           f"{counts['lines']} lines read another text, {counts['alone_score']} more the same text with another "
           f"score"] if own_width else []),
        f"- time: RapidOCR {seconds[0]:.0f} s, two at a time {seconds[1]:.0f} s (shared 2-core CPU, indicative)",
    ]


def _key(quad: np.ndarray) -> tuple[float, ...]:
    return tuple(np.asarray(quad, dtype=np.float64).ravel().tolist())


def logit_differences(lines: PairedLinesOCR, img: np.ndarray) -> tuple[float, float]:
    """The largest |p_batch - p| of the recogniser's output over this image's groups: two at a time, alone."""
    from rapidocr.main import RapidOCRError

    ocr, rec = lines.ocr, lines.rec
    pre, record = ocr.preprocess_img(ocr.load_img(img))
    try:
        crops, _ = ocr.detect_and_crop(pre, record)
    except RapidOCRError:
        return 0.0, 0.0
    paired = alone = 0.0
    for group, ratio in line_groups(crops, rec.rec_batch_num, rec.rec_image_shape):
        if len(group) < 2:  # read alone by both
            continue
        batch = np.concatenate([rec.resize_norm_img(crops[i], ratio)[np.newaxis] for i in group]).astype(np.float32)
        together = rec.session(batch)
        for start in range(0, len(group), LINES_AT_ONCE):
            rows = batch[start:start + LINES_AT_ONCE]
            n = len(rows)
            rows = np.concatenate([rows] + [rows[-1:]] * (LINES_AT_ONCE - n))
            paired = max(paired, float(np.abs(together[start:start + n] - rec.session(rows)[:n]).max()))
        for row in range(len(group)):
            alone = max(alone, float(np.abs(together[row] - rec.session(batch[row:row + 1])[0]).max()))
    return paired, alone


def peak_rss_mb() -> float:
    """This process's own peak resident memory (``VmHWM``), in MB. Not ``ru_maxrss``: Linux carries the spawning
    process's peak across ``exec`` into it, so a child of a large test runner would report the runner's size."""
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("VmHWM")).split()[1]) / 1024


def child(mode: str, png: str) -> None:
    """Build the engine, load the page, read it; print the rise of the peak RSS over the call."""
    from rapidocr import RapidOCR

    engine = RapidOCR(params=PARAMS) if mode == "batched" else PairedLinesOCR(RapidOCR(params=PARAMS))
    img = bgr(Path(png))
    engine(bgr(Path(ROOT / "arr_coc" / "examples" / "photo.jpg")))  # sessions warmed on a small image
    before = peak_rss_mb()
    out = engine(img)
    after = peak_rss_mb()
    print(json.dumps({"mode": mode, "lines": len(out.txts or ()), "before_mb": before, "peak_mb": after}))


def peaks(repeats: int = 1) -> list[str]:
    """Each engine's rise of the peak RSS over one page, each run in a process of its own, ``repeats`` times in
    alternation; the row shows the median run (the peak varies by 100 MB and more from run to run: glibc's arenas and
    ONNX Runtime's threads)."""
    from bench_server_memory import letter_pdf, png_pages  # beside this script

    rows = ["| reading one dense Letter page (1275 x 1650 px) | lines | peak RSS before the call | peak RSS after | "
            "rises of the runs | rise (median run) |", "|---|---:|---:|---:|---:|---:|"]
    modes = (("batched", "RapidOCR, 6 lines a batch"), ("paired", "two lines at a time (`PairedLinesOCR`)"))
    with tempfile.TemporaryDirectory() as tmp:
        png = png_pages(letter_pdf(Path(tmp) / "letter.pdf", 1), 150, Path(tmp))[0]
        runs: dict[str, list[dict]] = {mode: [] for mode, _ in modes}
        for _ in range(repeats):
            for mode, _ in modes:
                out = subprocess.run([sys.executable, __file__, "--child", mode, str(png)], check=True,
                                     capture_output=True, text=True).stdout
                runs[mode].append(json.loads(out.strip().splitlines()[-1]))
        for mode, label in modes:
            got = sorted(runs[mode], key=lambda r: r["peak_mb"] - r["before_mb"])
            r = got[(len(got) - 1) // 2]  # the median run (the lower one of an even count)
            rises = ", ".join(f"{x['peak_mb'] - x['before_mb']:+.0f}" for x in runs[mode])
            rows.append(f"| {label} | {r['lines']} | {r['before_mb']:.0f} MB | {r['peak_mb']:.0f} MB | {rises} | "
                        f"{r['peak_mb'] - r['before_mb']:+.0f} MB |")
            print(rows[-1], file=sys.stderr, flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, help="also write the report here")
    p.add_argument("--skip", nargs="*", default=[], choices=("identity", "peak"))
    p.add_argument("--own-width", action="store_true", help="also read each line alone at its own width")
    p.add_argument("--logits-everywhere", action="store_true", help="compare the probabilities on every image")
    p.add_argument("--repeats", type=int, default=1, help="runs of each engine for the peak (the median is shown)")
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(*args.child)
    if args.repeats < 1:
        p.error(f"--repeats takes a count >= 1, got {args.repeats}")
    report = [f"python benchmarks/ocr_lines.py {shlex.join(sys.argv[1:])}".rstrip(), ""]
    if "identity" not in args.skip:
        report += identity(args.own_width, args.logits_everywhere) + [""]
    if "peak" not in args.skip:
        report += peaks(args.repeats) + [""]
    emit("\n".join(report), args.out)


if __name__ == "__main__":
    main()
