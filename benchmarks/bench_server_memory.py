"""The microscope's memory: many distinct large uploads, and contexts of many pages; each case a process of its own.

Every case builds the server's page (``arr_coc.app.ui.build``: Gradio and its components loaded, as
``arr-coc serve`` has them) and drives its own request path in a process of its own:

- ``uploads``: one click of "analyse" per upload (``read_upload`` -> ``Microscope.run`` -> ``render``, through
  ``ui.answered`` as the button does), with distinct uploads: pages of 1800 x 1800 px and up (each a new image
  to the caches), after 39.7-megapixel photo-sized pages, the largest the microscope takes;
- ``PAGES@DPI``: one click of "Allocate over the context" (``ui.context_answer``) on a PDF of PAGES US Letter
  pages of dense text, at DPI;
- ``PAGES@DPIimg``: the same pages rendered at DPI and uploaded as PNG images (no text layer: OCR reads them).

The process's peak RSS comes from ``os.wait4``; the resident set after each request from ``/proc/self/status``.
With ``--server`` each case runs in a real ``arr-coc serve`` instead, driven over HTTP by ``gradio_client`` (the
uploads and outputs through Gradio as a browser sends them); its peak and resident set come from
``/proc/PID/status`` (``VmHWM``, ``VmRSS``).

    python benchmarks/bench_server_memory.py                     # the uploads, default channels, MiniLM
    python benchmarks/bench_server_memory.py --server --cases uploads 7@150 20@150 20@90 30@150 30@75 --large 0
    python benchmarks/bench_server_memory.py --cases uploads --uploads 3 --large 1 --channels mvp
    python benchmarks/bench_server_memory.py --cases 7@150 30@75  # contexts: PAGES@DPI
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from large_png import write_png  # beside this script

ROOT = Path(__file__).resolve().parents[1]

CEILING_MB = 2048  # what the server may hold at any time, for any request it takes
LARGE = (7280, 5456)  # 39.7 megapixels, under the microscope's 40 MP cap
# the context tab's largest request at its default dpi, its page limit at the dpi that fits, and both refused
CASES = ("uploads", "7@150", "20@150", "20@90", "30@150", "30@75")
WORDS = ("harbour lantern copper meadow violet engine quiet marble falcon river orchard silver candle thunder garden "
         "bridge velvet compass winter saddle amber willow pepper cobalt total invoice date").split()


def rss_mb() -> float:
    """This process's resident set now, in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def held(cache: object) -> float:
    """MB a cache holds (0 for a cache bounded by item count, which does not count bytes)."""
    return getattr(cache, "nbytes", 0) / 2**20


def letter_pdf(path: Path, pages: int) -> Path:
    """``pages`` US Letter pages (8.5 x 11 in), each a heading and 48 lines of 12 seeded words (a text layer)."""
    import matplotlib
    from matplotlib.backends.backend_pdf import PdfPages
    from matplotlib.figure import Figure

    rng = random.Random(0)
    with matplotlib.rc_context({"pdf.fonttype": 42}), PdfPages(path) as pdf:
        for i in range(pages):
            fig = Figure(figsize=(8.5, 11))
            fig.text(0.1, 0.95, f"Section {i + 1}", fontsize=16)
            for j in range(48):
                fig.text(0.1, 0.92 - j * 0.018, " ".join(rng.choice(WORDS) for _ in range(12)), fontsize=9)
            pdf.savefig(fig)
    return path


def png_pages(pdf: Path, dpi: float, folder: Path) -> list[Path]:
    """Every page of ``pdf`` rendered at ``dpi`` as a PNG in ``folder``."""
    import pypdfium2 as pdfium

    doc = pdfium.PdfDocument(str(pdf))
    out = []
    for i in range(len(doc)):
        out.append(folder / f"{pdf.stem}_{i + 1}.png")
        doc[i].render(scale=dpi / 72).to_pil().convert("RGB").save(out[-1])
    doc.close()
    return out


def serve(case: str, channels: str, query_encoder: str, paths: list[str]) -> None:
    """The child: the page built, then one request per upload or one context request; a JSON line per request."""
    from arr_coc.app import ui
    from arr_coc.app.service import Microscope, Settings, read_upload, render
    from arr_coc.config import MVP_CHANNELS, PIPELINE_CHANNELS
    from arr_coc.engine.query import HashingQueryEncoder

    scope = Microscope(query_encoder=HashingQueryEncoder() if query_encoder == "hashing" else None)
    settings = Settings(channels=MVP_CHANNELS if channels == "mvp" else PIPELINE_CHANNELS)
    with tempfile.TemporaryDirectory() as out:
        ui.build(scope, out)
        print(json.dumps({"request": "started", "rss_mb": rss_mb()}), flush=True)
        if case == "uploads":
            for n, path in enumerate(paths, 1):
                def work(path: str = path, n: int = n) -> list:
                    (Path(out) / str(n)).mkdir()
                    render(scope.run(read_upload(path), "What is the total?", settings), Path(out) / str(n))
                    return ["Done"]

                status = ui.answered(n, 0, work)[0]
                print(json.dumps({"request": Path(path).name, "status": status, "rss_mb": rss_mb(),
                                  "scenes_mb": held(scope.scenes), "channels_mb": held(scope.channel_cache)}),
                      flush=True)
            return
        pages, dpi = case.removesuffix("img").split("@")
        start = time.perf_counter()
        answer = ui.context_answer(scope, 1, paths, "What is the total?", 1024, "" if case.endswith("img") else
                                   f"1-{pages}", float(dpi))
        seconds = time.perf_counter() - start
        del answer[2:]  # the views: what stays is the session's ContextView, measured on its own
        print(json.dumps({"request": case, "status": answer[0], "rss_mb": rss_mb(), "s": seconds}), flush=True)


def measure(case: str, paths: list[Path], channels: str, query_encoder: str) -> tuple[list[dict], float]:
    """(a row per request, the server process's peak RSS in MB)."""
    cmd = [sys.executable, __file__, "--child", case, channels, query_encoder, *map(str, paths)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    with tempfile.TemporaryFile(mode="w+") as err:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
        out = proc.stdout.read()
        _, status, usage = os.wait4(proc.pid, 0)  # the child's own peak, which only wait4 reports
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode:
            err.seek(0)
            raise SystemExit(f"the server process failed:\n{err.read()[-2000:]}")
    peak = usage.ru_maxrss / 1024
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")], peak


def measure_server(case: str, paths: list[Path], channels: str, query_encoder: str) -> tuple[list[dict], float]:
    """(a row per request, peak RSS in MB) of a real ``arr-coc serve`` driven over HTTP."""
    from gradio_client import Client, handle_file

    from arr_coc.app.browser import free_port
    from arr_coc.config import DEFAULT_SACCADES, MVP_CHANNELS, PIPELINE_CHANNELS, SamplerConfig

    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    proc = subprocess.Popen([sys.executable, "-m", "arr_coc.cli", "serve", "--port", str(port), "--query-encoder",
                             query_encoder], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def vm(key: str) -> float:
        for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
        return float("nan")

    url = f"http://127.0.0.1:{port}/"
    try:
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"arr-coc serve exited with {proc.returncode}")
            try:
                urllib.request.urlopen(url, timeout=2).close()
                break
            except OSError:
                time.sleep(0.5)
        rows = [{"request": "started", "rss_mb": vm("VmRSS")}]
        client = Client(url, verbose=False)
        if case == "uploads":
            chosen = list(MVP_CHANNELS if channels == "mvp" else PIPELINE_CHANNELS)
            for path in paths:
                out = client.predict(handle_file(str(path)), "What is the total?", DEFAULT_SACCADES, SamplerConfig.name,
                                     chosen, "shipped", None, 1, 1, 1, api_name="/analyse")
                rows.append({"request": path.name, "status": "Done" if out[0].startswith("Done") else out[0],
                             "rss_mb": vm("VmRSS"), "scenes_mb": None, "channels_mb": None})
        else:
            pages, dpi = case.removesuffix("img").split("@")
            start = time.perf_counter()
            out = client.predict([handle_file(str(p)) for p in paths], "What is the total?", 1024,
                                 "" if case.endswith("img") else f"1-{pages}", float(dpi), api_name="/context")
            rows.append({"request": case, "status": out[0], "rss_mb": vm("VmRSS"), "s": time.perf_counter() - start})
        return rows, vm("VmHWM")
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def uploads_table(rows: list[dict], peak: float, n: int) -> list[str]:
    table = ["| after | RSS | scene cache | channel cache |", "|---|---:|---:|---:|"]
    def mb(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.0f} MB"

    table += [f"| {r['request']} | {r['rss_mb']:.0f} MB | {mb(r.get('scenes_mb', 0))} | {mb(r.get('channels_mb', 0))} |"
              for r in rows]
    bad = [r["status"] for r in rows if r.get("status", "Done") != "Done"]
    return table + ["", f"peak RSS {peak:.0f} MB over {n} distinct uploads, ceiling {CEILING_MB} MB: "
                        f"{'within' if peak < CEILING_MB else 'OVER'}" + (f"; errors: {bad}" if bad else "")]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", nargs="+", default=["uploads"],
                   help=f"uploads and/or contexts PAGES@DPI[img] (default: %(default)s; the documented set: {' '.join(CASES)})")
    p.add_argument("--uploads", type=int, default=18, help="distinct pages of 1800 px and up (default 18)")
    p.add_argument("--large", type=int, default=3, help="distinct 39.7-megapixel pages (default 3)")
    p.add_argument("--channels", choices=("default", "mvp"), default="default")
    p.add_argument("--query-encoder", choices=("minilm", "hashing"), default="minilm")
    p.add_argument("--server", action="store_true", help="measure a real `arr-coc serve` driven over HTTP")
    p.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = p.parse_args()
    run = measure_server if args.server else measure
    if args.child:
        return serve(args.child[0], args.child[1], args.child[2], args.child[3:])
    made_by = f"python benchmarks/bench_server_memory.py{' ' + shlex.join(sys.argv[1:]) if sys.argv[1:] else ''}"
    report = [made_by, ""]
    contexts = ["| context request | RSS at start | peak RSS | RSS after | time | result |",
                "|---|---:|---:|---:|---:|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        for case in args.cases:
            if case == "uploads":
                paths = []
                for i in range(args.large):  # distinct: one more column each
                    paths.append(Path(tmp) / f"large_{i}.png")
                    write_png(paths[-1], "RGB", LARGE[0] - i, LARGE[1])
                for i in range(args.uploads):
                    paths.append(Path(tmp) / f"page_{i}.png")
                    write_png(paths[-1], "RGB", 1800 + 7 * i, 1800)
                rows, peak = run(case, paths, args.channels, args.query_encoder)
                report += uploads_table(rows, peak, len(paths)) + [""]
                continue
            pages, dpi = case.removesuffix("img").split("@")
            pdf = letter_pdf(Path(tmp) / f"letter_{pages}.pdf", int(pages))
            inputs = png_pages(pdf, float(dpi), Path(tmp)) if case.endswith("img") else [pdf]
            rows, peak = run(case, inputs, args.channels, args.query_encoder)
            r = rows[-1]
            result = "ok" if r["status"].startswith("Done") else f"refused: `{r['status'].split(': ', 1)[1]}`"
            what = "PNG images of Letter pages" if case.endswith("img") else "Letter pages"
            contexts.append(f"| {pages} {what} at {dpi} dpi | {rows[0]['rss_mb']:.0f} MB | {peak:.0f} MB | "
                            f"{r['rss_mb']:.0f} MB | {r['s']:.0f} s | {result} |")
            print(contexts[-1], file=sys.stderr, flush=True)
    if len(contexts) > 2:
        worst = max(float(row.split("|")[3].strip().split()[0]) for row in contexts[2:])
        report += contexts + ["", f"worst peak {worst:.0f} MB, ceiling {CEILING_MB} MB: "
                                  f"{'within' if worst < CEILING_MB else 'OVER'}"]
    print("\n".join(report))


if __name__ == "__main__":
    main()
