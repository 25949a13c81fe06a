"""Corpus: memory, dtypes and thread limits -- every PNG colour type and PIL mode at many sizes decoded under a
byte bound, image tensors of every dtype and layout, ARRs in every dtype, half precision under an OpenMP limit."""
from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch
from conftest import ROOT
from corpus_checks import outcome
from PIL import Image
from test_corpus_images import MODES, uniform
from tolerances import ARR_MAP, assert_close_reduction, coarser

from arr_coc.config import MVP_CHANNELS, ARRConfig, TextureConfig
from arr_coc.engine.canvas import load_bounded, make_canvas
from arr_coc.engine.imageio import decode_pil
from arr_coc.engine.pipeline import ARR
from arr_coc.engine.query import HashingQueryEncoder
from benchmarks.large_png import MODES as PNG_MODES
from benchmarks.large_png import write_png

BOUND = 112 * 112  # the canvas area decoded for: small, so every size is reduced by a large factor
PNG_SIZES = ((56, 56), (3000, 2000), (2000, 3001), (9001, 67), (67, 9001))  # (W, H)


def _check_bounded(x: torch.Tensor, size_hw: tuple[int, int], fit: tuple[int, int]) -> None:
    """The exact integer reduction that still covers ``fit``, and so at most 4 canvases of float32 bytes."""
    factor = max(1, min(size_hw[0] // fit[0], size_hw[1] // fit[1]))
    assert tuple(x.shape) == (3, -(-size_hw[0] // factor), -(-size_hw[1] // factor))
    assert x.shape[1] >= fit[0] and x.shape[2] >= fit[1]  # never below the canvas
    assert x.nbytes <= 3 * 4 * (2 * fit[0] + 1) * (2 * fit[1] + 1) or factor == 1
    assert x.dtype == torch.float32 and float(x.min()) >= 0 and float(x.max()) <= 1


@pytest.mark.parametrize("size", PNG_SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("mode", list(PNG_MODES))
def test_every_png_colour_type_at_every_size_is_decoded_under_a_byte_bound(mode, size, tmp_path):
    path = tmp_path / "page.png"
    write_png(path, mode, *size)
    kind, x = outcome(lambda: load_bounded(path, BOUND))
    assert kind == "ok", x
    h, w = size[1], size[0]
    beta = math.sqrt(h * w / BOUND)
    _check_bounded(x, (h, w), (math.ceil(h / beta), math.ceil(w / beta)) if beta > 1 else (h, w))
    kind, canvas = outcome(lambda: make_canvas(path, max_pixels=BOUND, min_pixels=28 * 28))
    assert kind == "ok" or "aspect ratio" in canvas, canvas  # 9001 x 67 is past the 200:1 aspect cap
    if kind == "ok":
        assert canvas.image_sizes == [(h, w)] and canvas.sizes[0][0] * canvas.sizes[0][1] <= BOUND


@pytest.mark.parametrize("mode", MODES)
def test_every_pil_mode_in_memory_is_decoded_under_a_byte_bound(mode):
    img = uniform(mode).resize((2700, 1800), Image.Resampling.NEAREST)
    kind, x = outcome(lambda: decode_pil(img, (100, 150)))
    assert kind == "ok", x
    _check_bounded(x, (1800, 2700), (100, 150))  # reduced by 18
    assert float((x - x[:, :1, :1]).abs().max()) < 1e-6  # uniform stays uniform


Q = "What is the total?"


@pytest.fixture(scope="module")
def arr() -> ARR:
    return ARR(ARRConfig(texture=TextureConfig(channels=MVP_CHANNELS)), query_encoder=HashingQueryEncoder()).eval()


def _dtypes() -> list[torch.dtype]:
    """Every dtype a float tensor can be moved to (float8, complex32, unsigned 16-64 included)."""
    out = []
    for d in sorted({d for d in vars(torch).values() if isinstance(d, torch.dtype)}, key=str):
        try:
            torch.zeros(1).to(d)
        except (RuntimeError, NotImplementedError, TypeError):  # bit-packed and quantized dtypes need other makers
            continue
        out.append(d)
    return out


LAYOUTS = {
    "contiguous": lambda x: x,
    "non-contiguous": lambda x: x.transpose(1, 2).contiguous().transpose(1, 2),
    "channels-last batch": lambda x: x[None].contiguous(memory_format=torch.channels_last),
    "sparse": lambda x: x.to_sparse(),
    "meta": lambda x: x.to("meta"),
    "quantized": lambda x: torch.quantize_per_tensor(x.float(), 1 / 255, 0, torch.quint8),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("dtype", _dtypes(), ids=str)
def test_image_tensors_of_every_dtype_and_layout_allocate_as_float32_or_refuse_in_one_line(dtype, layout, arr):
    image = torch.rand(3, 112, 140, generator=torch.Generator().manual_seed(1))
    if dtype in (torch.uint8, torch.bool) or not (dtype.is_floating_point or dtype.is_complex):
        image = (image * 255).round() if dtype != torch.bool else image > 0.5
    try:
        x = LAYOUTS[layout](image.to(dtype))
    except (RuntimeError, NotImplementedError):
        pytest.skip(f"torch cannot make a {layout} {dtype} tensor")
    kind, out = outcome(lambda: arr(x, Q, saccades=8))
    if kind == "error":  # refused for what it is, never for anything else
        assert out.startswith(("tensor image of dtype", "tensor image has layout", "tensor image is on the meta")), out
        return
    dense = image.to(dtype)
    ref = dense.to(torch.float32) / (255.0 if dtype == torch.uint8 else 1.0)
    assert torch.equal(out.positions, arr(ref[None] if ref.ndim == 3 else ref, Q, saccades=8).positions)
    assert dtype.is_floating_point or dtype in (torch.uint8, torch.bool)  # only these are taken


@pytest.mark.parametrize("dtype", [d for d in _dtypes() if d.is_floating_point or d.is_complex], ids=str)
def test_an_arr_moved_to_every_dtype_allocates_as_float32_or_refuses_in_one_line(dtype, arr):
    image = torch.rand(3, 112, 140, generator=torch.Generator().manual_seed(2))
    moved = ARR(ARRConfig(texture=TextureConfig(channels=MVP_CHANNELS)), query_encoder=HashingQueryEncoder()).eval()
    kind, out = outcome(lambda: moved.to(dtype)(image, Q, saccades=8))
    ref = arr(image, Q, saccades=8)
    if kind == "ok":
        assert dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64), dtype
        assert_close_reduction(out.relevance.map.float(), ref.relevance.map, dtype=coarser(dtype, torch.float32),
                               **ARR_MAP)
    else:
        assert out.startswith(f"an ARR in {str(dtype).removeprefix('torch.')} cannot score; move it to a real "
                              "floating dtype: arr.float()"), out


THREADS = """
import sys, tempfile
import torch
from arr_coc.config import MVP_CHANNELS, ARRConfig, TextureConfig
from arr_coc.eval.evaluate import evaluate
from arr_coc.engine.pipeline import ARR
from arr_coc.engine.query import HashingQueryEncoder
from arr_coc.vlm import allocation, ask, load_vlm, stages
for dtype in ("bfloat16", "float16", "float32"):
    adapter = load_vlm("tiny:qwen2_5_vl", dtype=dtype)
    arr = ARR(ARRConfig(texture=TextureConfig(channels=MVP_CHANNELS)), query_encoder=HashingQueryEncoder()).eval()
    image = torch.rand(3, 112, 140)
    cases = {
        "ARR.forward": lambda: arr.to(getattr(torch, dtype))(image, "Q?", saccades=4),
        "ARR.allocate": lambda: (lambda scene: arr.to(getattr(torch, dtype)).allocate(scene, "Q?", saccades=4))(
            arr.float().see(image)),  # the scene made in float32, then allocated in the dtype
        "ask": lambda: ask(adapter, [image], ["Q?"], arr=arr.float(), max_new_tokens=1),
        "read_first_look": lambda: allocation.read_first_look(adapter, [image], [(2, 2)], ["Q?"]),
        "encode": lambda: stages.encode(adapter, [], []),
        "prefill": lambda: stages.prefill(adapter, [], []),
        "decode": lambda: stages.decode(adapter, None),
        "evaluate_vlm": lambda: evaluate([], None, tempfile.mkdtemp(), adapter=adapter),
    }
    for name, call in cases.items():
        try:
            call()
            print(dtype, name, "ran")
        except Exception as err:
            print(dtype, name, type(err).__name__, str(err).count("\\n"), "OMP_THREAD_LIMIT=1" in str(err))
"""


def test_every_half_precision_entry_point_under_an_openmp_limit_refuses_in_one_line():
    env = {k: v for k, v in os.environ.items() if k != "OMP_THREAD_LIMIT"}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="2", OMP_THREAD_LIMIT="1")
    out = subprocess.run([sys.executable, "-c", THREADS], capture_output=True, text=True, env=env, cwd=ROOT,
                         timeout=600)
    rows = [line.split() for line in out.stdout.splitlines()]
    assert len(rows) == 24, out.stderr
    for row in rows:
        dtype, name = row[:2]
        if dtype == "float32":  # the control: past the check (stages given no work may end in their own errors)
            assert "ThreadLimitError" not in row, row
        else:
            assert row[2:] == ["ThreadLimitError", "0", "True"], row
