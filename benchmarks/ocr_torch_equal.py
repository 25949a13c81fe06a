"""The torch OCR (``rapidocr_engine(backend="torch")``) against ONNX Runtime's (the default) on real pages.

    python benchmarks/ocr_torch_equal.py --out benchmarks/results/ocr_torch.md             # on the CPU
    python benchmarks/ocr_torch_equal.py --device cuda --out /tmp/ocr_torch_cuda.md        # on a GPU
    python benchmarks/ocr_torch_equal.py --device cuda --no-tf32                           # full fp32 convolutions
    python benchmarks/ocr_torch_equal.py --threads 1                                       # torch on one CPU thread

Images: the bundled examples (3) and 20 real pages: the middle page of each of the first 10 documents
(by name) of the LaTeX-manual corpus's test split (``arr_coc.documents.corpus``) rendered at 100 dpi, and the
first 5 images (by name) of FUNSD's and of SROIE's test splits (``../shared/data``). Both engines have the
text channels' options (detection at 960 px, every line kept). Each image is read by ONNX Runtime
(``PairedLinesOCR``) and by the torch engine one image a call, then all images in one ``TorchOCR.read``
call (the detector batched over the pages of one size, the recogniser over the groups of one width).
Compared per image: the texts (all equal, in order), the largest difference of a box corner (px) and of a
score. On CUDA, torch's own default lets cuDNN compute float32 convolutions in TF32 (10-bit mantissa);
``--no-tf32`` turns that off for this run (``torch.backends.cudnn.allow_tf32``; the library never sets it).
``--threads N`` sets torch's CPU threads for this run (``torch.set_num_threads``); ONNX Runtime keeps RapidOCR's
settings. Times: each engine's median over the images of one call per image (after one warm-up call), and the
one batched call's total.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from emit import emit  # the benchmark beside this one (a script's folder is on its path)
from PIL import Image

from arr_coc.ocr import DET_LIMIT_SIDE_LEN, rapidocr_engine

ROOT = Path(__file__).resolve().parents[1]
DPI = 100
TEXLIVE_PAGES = 10
PER_DATASET = 5


def bgr(rgb: np.ndarray) -> np.ndarray:
    """[H, W, 3] uint8 RGB as the text channels hand it to RapidOCR: BGR, contiguous."""
    return np.ascontiguousarray(rgb[..., ::-1])


def images() -> list[tuple[str, str, np.ndarray]]:
    """(source, name, BGR image) of every image compared."""
    from arr_coc.data.datasets import load_dataset
    from arr_coc.documents.corpus import documents
    from arr_coc.documents.pdf import open_pdf, render_page

    out = [("examples", p.name, bgr(np.asarray(Image.open(p).convert("RGB"))))
           for p in sorted((ROOT / "arr_coc" / "examples").glob("*.jpg"))]
    for doc in sorted(documents(split="test"), key=lambda d: d.name)[:TEXLIVE_PAGES]:
        pdf = open_pdf(doc.path)
        try:
            page = pdf[doc.n_pages // 2]
            out.append((f"texlive {DPI} dpi", f"{doc.name} p{doc.n_pages // 2 + 1}",
                        bgr(render_page(page, DPI).permute(1, 2, 0).numpy())))
            page.close()
        finally:
            pdf.close()
    for name in ("funsd", "sroie"):
        paths = sorted({r.image for r in load_dataset(name, split="test")})[:PER_DATASET]
        out += [(name, Path(p).name, bgr(np.asarray(Image.open(p).convert("RGB")))) for p in paths]
    return out


def compare(a, b) -> tuple[int, bool, float, float]:
    """(lines, texts equal, largest box corner difference px, largest score difference) of two results."""
    lines = len(a.txts or ())
    if (a.boxes is None) != (b.boxes is None):
        return lines, False, float("inf"), float("inf")
    if a.boxes is None:
        return lines, a.txts == b.txts, 0.0, 0.0
    if a.txts != b.txts or np.shape(a.boxes) != np.shape(b.boxes):
        return lines, False, float("inf"), float("inf")
    box = float(np.abs(np.asarray(a.boxes, np.float64) - np.asarray(b.boxes, np.float64)).max())
    score = float(np.abs(np.asarray(a.scores) - np.asarray(b.scores)).max())
    return lines, True, box, score


def run(device: str, tf32: bool, threads: int | None = None) -> list[str]:
    import torch

    if threads:  # this script's process only, as --no-tf32
        torch.set_num_threads(threads)
    if not tf32:  # this script's process only: the library leaves torch's settings to its caller
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False

    ort = rapidocr_engine(DET_LIMIT_SIDE_LEN, 0.0)
    torch_ocr = rapidocr_engine(DET_LIMIT_SIDE_LEN, 0.0, backend="torch", device=device)
    items = images()
    ort(items[0][2]), torch_ocr(items[0][2])  # warm-up: first-call allocations, kernel selection

    def timed(engine, img):
        if torch_ocr.device.type == "cuda":
            torch.cuda.synchronize(torch_ocr.device)
        t0 = time.perf_counter()
        out = engine(img)
        if torch_ocr.device.type == "cuda":
            torch.cuda.synchronize(torch_ocr.device)
        return out, time.perf_counter() - t0

    rows: dict[str, dict] = {}
    singles, seconds = [], {"ort": [], "torch": []}
    for source, name, img in items:
        a, t_ort = timed(ort, img)
        b, t_torch = timed(torch_ocr, img)
        seconds["ort"].append(t_ort)
        seconds["torch"].append(t_torch)
        singles.append(a)
        lines, equal, box, score = compare(a, b)
        row = rows.setdefault(source, {"images": 0, "lines": 0, "equal": 0, "box": 0.0, "score": 0.0,
                                       "ort": [], "torch": []})
        row["images"] += 1
        row["lines"] += lines
        row["equal"] += equal
        row["box"], row["score"] = max(row["box"], box), max(row["score"], score)
        row["ort"].append(t_ort)
        row["torch"].append(t_torch)
        print(f"{source} {name}: {lines} lines, {'texts equal' if equal else 'TEXTS DIFFER'}, box {box:g} px, "
              f"score {score:.2g}; ORT {t_ort:.2f} s, torch {t_torch:.2f} s", file=sys.stderr, flush=True)
    batch = [img for _, _, img in items]
    t0 = time.perf_counter()
    together = torch_ocr.read(batch)
    if torch_ocr.device.type == "cuda":
        torch.cuda.synchronize(torch_ocr.device)
    t_batch = time.perf_counter() - t0
    batched = [compare(a, b) for a, b in zip(singles, together)]

    device_name = torch.cuda.get_device_name(torch_ocr.device) if torch_ocr.device.type == "cuda" else "CPU"
    n, lines = len(items), sum(r["lines"] for r in rows.values())
    flags = f"--device {device}" + ("" if tf32 else " --no-tf32") + (f" --threads {threads}" if threads else "")
    precision = (f"; cuDNN TF32 {'allowed' if torch.backends.cudnn.allow_tf32 else 'off'}"
                 if torch_ocr.device.type == "cuda" else "")
    out = [f"`python benchmarks/ocr_torch_equal.py {flags}` (torch {torch.__version__}, torch engine "
           f"on {device_name}{precision}, {torch.get_num_threads()} torch CPU threads; ONNX Runtime on the CPU); "
           f"{n} images, {lines} detected lines", "",
           "| images | n | lines | texts identical | largest box difference | largest score difference "
           "| median s, ONNX Runtime | median s, torch |",
           "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for source, r in rows.items():
        out.append(f"| {source} | {r['images']} | {r['lines']} | {r['equal']} of {r['images']} "
                   f"({100 * r['equal'] / r['images']:.0f} %) | {r['box']:g} px | {r['score']:.2g} "
                   f"| {statistics.median(r['ort']):.2f} | {statistics.median(r['torch']):.2f} |")
    out.append(f"| all | {n} | {lines} | {sum(r['equal'] for r in rows.values())} of {n} "
               f"| {max(r['box'] for r in rows.values()):g} px | {max(r['score'] for r in rows.values()):.2g} "
               f"| {statistics.median(seconds['ort']):.2f} | {statistics.median(seconds['torch']):.2f} |")
    out += ["", f"- all {n} images in one `TorchOCR.read` call: texts identical to ONNX Runtime's on "
            f"{sum(e for _, e, _, _ in batched)} of {n}, largest box difference "
            f"{max(b for _, _, b, _ in batched):g} px, largest score difference "
            f"{max(s for _, _, _, s in batched):.2g}; {t_batch:.1f} s in all "
            f"(one call per image: ONNX Runtime {sum(seconds['ort']):.1f} s, torch {sum(seconds['torch']):.1f} s)"]
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", help="the torch engine's device (cpu, cuda, cuda:1, ...)")
    ap.add_argument("--no-tf32", action="store_true", help="float32 convolutions and matmuls without TF32 on CUDA")
    ap.add_argument("--threads", type=int, help="torch's CPU threads for this run (default: torch's own)")
    ap.add_argument("--out", type=Path, help="write the table here (markdown) as well as to stdout")
    args = ap.parse_args(argv)
    lines = ["# The torch OCR against ONNX Runtime", "", *run(args.device, not args.no_tf32, args.threads)]
    text = "\n".join(lines) + "\n"
    emit(text, args.out)


if __name__ == "__main__":
    main()
