"""Memory by bytes: the largest legal image of each PNG colour type in `look`, strip reduction, byte-bounded caches.

Peak memory is read in a subprocess: a small Python process starts the command and reads its children's
peak RSS (``RUSAGE_CHILDREN``), so the test process's own memory never counts.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import ROOT
from PIL import Image

from arr_coc.engine import imageio
from arr_coc.engine.cache import ImageCache, nbytes
from arr_coc.engine.imageio import MAX_IMAGE_PIXELS, decode_pil
from benchmarks.large_png import write_png

SIDE = math.isqrt(MAX_IMAGE_PIXELS)  # 13377: the largest legal square
LIMIT_MB = 2048
PEAK = ("import resource, subprocess, sys\n"
        "code = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
        "print(json.dumps([resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, code.returncode, "
        "code.stdout, code.stderr]))")


def peak_mb(cmd: list[str]) -> tuple[float, int, str, str]:
    """(peak RSS in MB, exit code, stdout, stderr) of ``cmd``, measured in a process of its own."""
    out = subprocess.run([sys.executable, "-c", "import json\n" + PEAK, *cmd], capture_output=True, text=True,
                         cwd=ROOT, check=True, timeout=600)
    return tuple(json.loads(out.stdout))  # type: ignore[return-value]


@pytest.mark.parametrize("mode", ["P;trns", "RGBA", "I;16"])
def test_the_largest_legal_png_of_each_wide_colour_type_stays_under_2_gb_in_look(mode, tmp_path):
    """The palette with transparency (reported: 2.2 GB), the widest (RGBA), 16-bit grey; files of a few MB."""
    path = tmp_path / "page.png"
    write_png(path, mode, SIDE, SIDE)
    assert path.stat().st_size < 4_000_000
    mb, code, out, err = peak_mb([sys.executable, "-m", "arr_coc.cli", "look", str(path), "What is the total?",
                                  "--channels", "mvp", "--query-encoder", "hashing", "--json"])
    assert code == 0, err
    assert json.loads(out)["image_size"] == [SIDE, SIDE]
    assert mb < LIMIT_MB  # measured: 745 MB (P with transparency), 1224 MB (RGBA); before: 1837 MB, 1660 MB


def _page(mode: str, size: tuple[int, int] = (61, 47)) -> Image.Image:
    rng = np.random.default_rng(0)
    rgba = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 4), dtype=np.uint8))
    if mode == "P;trns":
        img = rgba.convert("RGB").quantize(16)
        img.info["transparency"] = bytes(range(0, 256, 16))
        return img
    if mode in ("I;16", "I"):
        return Image.fromarray(rng.integers(0, 65536, size[::-1], dtype=np.uint16)).convert(mode)
    if mode == "F":
        return Image.fromarray(rng.random(size[::-1], dtype=np.float32))
    return rgba.convert("RGB").convert(mode) if mode in ("1", "CMYK", "P") else rgba.convert(mode)


@pytest.mark.parametrize("mode", ["1", "L", "LA", "La", "P", "P;trns", "PA", "I;16", "I", "F", "RGB", "RGBA", "CMYK"])
def test_reducing_a_strip_at_a_time_equals_converting_and_reducing_the_whole_image(mode, monkeypatch):
    img = _page(mode)
    whole = img.convert("LA").convert("RGBA") if mode == "La" else img
    whole = whole.convert(imageio.reading_mode(img)).reduce(3)  # the reference: convert everything, then reduce
    monkeypatch.setattr(imageio, "STRIP_PIXELS", 1)  # one box row (3 pixel rows) a strip: 16 strips
    strips = decode_pil(img, (15, 20))
    assert tuple(strips.shape) == (3, 16, 21)  # ceil(47 / 3) x ceil(61 / 3): the reduction by 3, not more
    assert torch.equal(strips, decode_pil(whole))
    assert not torch.equal(strips, decode_pil(img.resize(whole.size)))  # negative control: another reduction differs


def test_a_transparent_palette_reads_as_white_paper_after_the_strip_reduction():
    img = Image.new("P", (60, 60), 0)
    img.putpalette([10, 20, 30, 200, 100, 50])
    img.paste(1, (0, 0, 30, 60))
    img.info["transparency"] = bytes([0, 255])  # colour 0 transparent, colour 1 opaque
    x = decode_pil(img, (20, 20))  # reduced by 3
    assert tuple(x.shape) == (3, 20, 20)
    assert torch.equal(x[:, 0, 0], torch.tensor([200, 100, 50]) / 255.0)
    assert torch.equal(x[:, 0, -1], torch.ones(3))


def test_the_image_cache_is_bounded_in_bytes_and_evicts_the_least_recently_used():
    value = 4000  # bytes of torch.zeros(1000)
    cache = ImageCache(max_bytes=3 * value + 10)
    images = [torch.full((3, 4, 4), i / 10) for i in range(5)]
    calls: list[int] = []
    for i in range(3):
        cache.get("m", images[i], lambda i=i: calls.append(i) or torch.zeros(1000))
    cache.get("m", images[0], lambda: calls.append(99) or torch.zeros(1000))  # a hit: 0 is now the most recent
    for i in (3, 4):
        cache.get("m", images[i], lambda i=i: calls.append(i) or torch.zeros(1000))
    assert (len(cache), cache.nbytes, calls) == (3, 3 * value, [0, 1, 2, 3, 4])  # 1 and 2 went, 0 stayed
    cache.get("m", images[0], lambda: calls.append(0) or torch.zeros(1000))
    cache.get("m", images[1], lambda: calls.append(1) or torch.zeros(1000))
    assert calls == [0, 1, 2, 3, 4, 1] and cache.nbytes == 3 * value
    big = cache.get("m", images[2], lambda: torch.zeros(4000))  # larger than the whole budget: returned, not kept
    assert big.numel() == 4000 and (len(cache), cache.nbytes) == (3, 3 * value)


def test_nbytes_counts_every_storage_once():
    x = torch.zeros(2, 1000)
    assert nbytes(x) == 8000
    parts = x.unbind(0)
    assert nbytes(parts) == sys.getsizeof(parts) + 8000  # two views of one storage: the storage once
    arr = np.zeros(500, dtype=np.float64)
    d = {"a": arr, "b": arr[:10]}
    assert nbytes(d) == sys.getsizeof(d) + sys.getsizeof("a") + sys.getsizeof("b") + 4000
    with pytest.raises(ValueError, match="max_bytes must be a non-negative integer, got -1"):
        ImageCache(max_bytes=-1)


def test_the_server_stays_under_its_ceiling_after_distinct_large_uploads():
    """A few uploads of the benchmark (one of 39.7 MP); its scene cache stays within its byte budget."""
    from arr_coc.app.service import SCENE_CACHE_BYTES

    out = subprocess.run([sys.executable, "benchmarks/bench_server_memory.py", "--uploads", "4", "--large", "1",
                          "--channels", "mvp", "--query-encoder", "hashing"], capture_output=True, text=True,
                         cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr
    rows = [line.split("|") for line in out.stdout.splitlines() if line.startswith("| page_")]
    assert len(rows) == 4
    assert float(rows[-1][3].split()[0]) <= SCENE_CACHE_BYTES / 2**20  # 4 canvases of 1792 px kept, not 6
    assert "ceiling 2048 MB: within" in out.stdout
