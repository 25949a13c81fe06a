"""The microscope's memory under many distinct large uploads: resident set after each request and its peak.

Drives the server's own request path (``read_upload`` -> ``Microscope.run`` -> ``render``, what one click of
"analyse" does) in a process of its own, with distinct uploads: pages of 1800 x 1800 px and up (each a new
image to the caches) and 39.7-megapixel photos-sized pages, the largest the microscope takes. The process's
peak RSS comes from ``os.wait4``; the resident set after each request from ``/proc/self/status``.

    python benchmarks/bench_server_memory.py                       # 18 pages + 3 of 39.7 MP, default channels
    python benchmarks/bench_server_memory.py --uploads 3 --large 1 --channels mvp --query-encoder hashing
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from large_png import write_png  # beside this script

ROOT = Path(__file__).resolve().parents[1]

CEILING_MB = 2048  # what the server may hold after any number of distinct uploads
LARGE = (7280, 5456)  # 39.7 megapixels, under the microscope's 40 MP cap


def rss_mb() -> float:
    """This process's resident set now, in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def held(cache: object) -> float:
    """MB a cache holds (0 for a cache bounded by item count, which does not count bytes)."""
    return getattr(cache, "nbytes", 0) / 2**20


def serve(paths: list[str], channels: str, query_encoder: str) -> None:
    """The child: one Microscope, one request per upload, one JSON line per request."""
    from arr_coc.app.service import Microscope, Settings, read_upload, render
    from arr_coc.config import MVP_CHANNELS, PIPELINE_CHANNELS
    from arr_coc.query import HashingQueryEncoder

    scope = Microscope(query_encoder=HashingQueryEncoder() if query_encoder == "hashing" else None)
    settings = Settings(channels=MVP_CHANNELS if channels == "mvp" else PIPELINE_CHANNELS)
    print(json.dumps({"upload": "started", "rss_mb": rss_mb()}), flush=True)
    with tempfile.TemporaryDirectory() as out:
        for path in paths:
            render(scope.run(read_upload(path), "What is the total?", settings), Path(out))
            print(json.dumps({"upload": Path(path).name, "rss_mb": rss_mb(), "scenes_mb": held(scope.scenes),
                              "channels_mb": held(scope.channel_cache)}), flush=True)


def measure(paths: list[Path], channels: str, query_encoder: str) -> tuple[list[dict], float]:
    """(a row per request, the server process's peak RSS in MB)."""
    cmd = [sys.executable, __file__, "--child", channels, query_encoder, *map(str, paths)]
    with tempfile.TemporaryFile(mode="w+") as err:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True)
        out = proc.stdout.read()
        _, status, usage = os.wait4(proc.pid, 0)  # the child's own peak, which only wait4 reports
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode:
            err.seek(0)
            raise SystemExit(f"the server process failed:\n{err.read()[-2000:]}")
    peak = usage.ru_maxrss / 1024
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")], peak


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--uploads", type=int, default=18, help="distinct pages of 1800 px and up (default 18)")
    p.add_argument("--large", type=int, default=3, help="distinct 39.7-megapixel pages (default 3)")
    p.add_argument("--channels", choices=("default", "mvp"), default="default")
    p.add_argument("--query-encoder", choices=("minilm", "hashing"), default="minilm")
    p.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return serve(args.child[2:], args.child[0], args.child[1])
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for i in range(args.large):  # distinct: one more column each
            paths.append(Path(tmp) / f"large_{i}.png")
            write_png(paths[-1], "RGB", LARGE[0] - i, LARGE[1])
        for i in range(args.uploads):
            paths.append(Path(tmp) / f"page_{i}.png")
            write_png(paths[-1], "RGB", 1800 + 7 * i, 1800)
        rows, peak = measure(paths, args.channels, args.query_encoder)
    table = ["| after | RSS | scene cache | channel cache |", "|---|---:|---:|---:|"]
    table += [f"| {r['upload']} | {r['rss_mb']:.0f} MB | {r.get('scenes_mb', 0):.0f} MB | {r.get('channels_mb', 0):.0f} MB |"
              for r in rows]
    verdict = (f"peak RSS {peak:.0f} MB over {len(paths)} distinct uploads, ceiling {CEILING_MB} MB: "
               f"{'within' if peak < CEILING_MB else 'OVER'}")
    made_by = f"python benchmarks/bench_server_memory.py{' ' + shlex.join(sys.argv[1:]) if sys.argv[1:] else ''}"
    print(f"{made_by}\n\n" + "\n".join(table) + f"\n\n{verdict}")


if __name__ == "__main__":
    main()
