"""The RapidOCR engine reads a dense page within a bounded memory: one recognition line at a time."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("rapidocr")

from arr_coc.ocr import rapidocr_engine  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# The child renders a US Letter page at 150 dpi (1275 x 1650 px) of 48 lines of 12 words in 19 px DejaVu Sans,
# as benchmarks/bench_server_memory.py's `img` pages are, and reports its peak RSS (VmHWM) around one OCR call.
CHILD = textwrap.dedent("""
    import json, random
    from pathlib import Path
    import matplotlib
    import numpy as np
    from PIL import Image, ImageDraw, ImageFont
    from arr_coc.ocr import rapidocr_engine

    def hwm():
        line = [s for s in Path("/proc/self/status").read_text().splitlines() if s.startswith("VmHWM:")][0]
        return int(line.split()[1]) / 1024

    words = "harbour lantern copper meadow violet engine quiet marble falcon river orchard silver total".split()
    rng = random.Random(0)
    page = Image.new("RGB", (1275, 1650), "white")
    draw = ImageDraw.Draw(page)
    font = ImageFont.truetype(str(Path(matplotlib.get_data_path()) / "fonts/ttf/DejaVuSans.ttf"), 19)
    for j in range(48):
        draw.text((128, 130 + j * 30), " ".join(rng.choice(words) for _ in range(12)), fill="black", font=font)
    engine = rapidocr_engine(text_score=0.0)
    engine(np.zeros((64, 64, 3), np.uint8))  # both models loaded before the measured call
    before = hwm()
    out = engine(np.ascontiguousarray(np.asarray(page)[..., ::-1]))
    print(json.dumps({"lines": len(out.txts or ()), "before": before, "after": hwm()}))
""")


def test_the_engine_recognises_one_line_at_a_time_without_a_cpu_arena():
    cfg = rapidocr_engine().cfg
    assert (cfg.Rec.rec_batch_num, cfg.EngineConfig.onnxruntime.enable_cpu_mem_arena) == (1, False)
    assert (cfg.Det.limit_type, cfg.Det.limit_side_len, cfg.Global.use_cls) == ("max", 960, False)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmHWM from /proc")
def test_one_dense_letter_page_raises_the_peak_by_well_under_the_batched_reading():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=600, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["lines"] >= 45  # the page was read: its 48 lines (a few may merge or split)
    # measured: +400 MB one line at a time, +834 MB with RapidOCR's default batch of 6 lines (REC_BATCH_NUM = 6)
    assert got["after"] - got["before"] < 620, got
