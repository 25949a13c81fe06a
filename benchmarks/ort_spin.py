"""Does torch work right after an onnxruntime run slow down? bench_vlm's ``arr`` row runs its tower after ARR's
ONNX models (OCR, learned saliency).

Three cases, interleaved ``--repeats`` times: a torch matmul (LLM-shaped, bfloat16: [1024, 2048] @ [2048, 5504]) timed
right after (a) nothing, (b) a run of the learned_saliency ONNX model in a session with onnxruntime's default
thread pool (its idle threads spin), (c) the same model in a session with ``session.intra_op.allow_spinning = 0``.
Prints the median and range of each case's matmul time.

    python benchmarks/ort_spin.py [--repeats 7]
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch


def session(spinning: bool):
    import onnxruntime as ort

    from arr_coc.engine.channels.learned_saliency import INPUT_SIZE, model_path

    options = ort.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()  # as the learned_saliency channel builds its session
    if not spinning:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    s = ort.InferenceSession(str(model_path()), options, providers=["CPUExecutionProvider"])
    feed = {s.get_inputs()[0].name: np.random.default_rng(0).random((1, 3, INPUT_SIZE, INPUT_SIZE), np.float32)}
    return lambda: s.run(None, feed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    a, b = torch.randn(1024, 2048).bfloat16(), torch.randn(2048, 5504).bfloat16()
    cases = {"no onnxruntime run before": lambda: None, "after a run, default (spinning) threads": session(True),
             "after a run, allow_spinning = 0": session(False)}
    times: dict[str, list[float]] = {name: [] for name in cases}
    with torch.inference_mode():
        a @ b
        for run in cases.values():
            run()
        for _ in range(args.repeats):
            for name, run in cases.items():
                run()
                start = time.perf_counter()
                a @ b
                times[name].append((time.perf_counter() - start) * 1e3)
                time.sleep(0.5)  # let any spinning threads from this case stop before the next
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; matmul ms, median (min-max) of {args.repeats}:")
    for name, ms in times.items():
        print(f"  {name}: {statistics.median(ms):.0f} ({min(ms):.0f}-{max(ms):.0f})")


if __name__ == "__main__":
    main()
