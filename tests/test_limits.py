"""Limits checked at the boundary: the OpenMP thread limit, the question's length, the canvas's size, options."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ASK = ["ask", str(ROOT / "examples" / "receipt.jpg"), "What is the total?", "--model", "tiny:qwen2_5_vl",
       "--dtype", "bfloat16", "--json", "--query-encoder", "hashing", "--channels", "mvp", "--max-new-tokens", "4"]
MATMUL = """
import torch
torch.manual_seed(0)
a, b = torch.randn(64, 512), torch.randn(512, 256)
ref = a.bfloat16().float() @ b.bfloat16().float()
out = (a.bfloat16() @ b.bfloat16()).float()
print(int(((out - ref).abs() > 1).any(0).sum()))
"""


def _python(code_or_args: list[str], limit: str | None, threads: int = 2) -> subprocess.CompletedProcess:
    """A fresh interpreter with torch at ``threads`` threads, with or without ``OMP_THREAD_LIMIT``."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_THREAD_LIMIT"}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS=str(threads))  # torch's own count, as on a 2-core machine
    if limit is not None:
        env["OMP_THREAD_LIMIT"] = limit
    return subprocess.run([sys.executable, *code_or_args], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=600)


def test_bfloat16_matmul_is_wrong_under_the_limit_without_the_fix():
    """The negative control: what the fix guards against happens here (torch at 2 threads, OpenMP at 1)."""
    assert _python(["-c", MATMUL], None).stdout.split() == ["0"]
    wrong = int(_python(["-c", MATMUL], "1").stdout.split()[-1])
    assert wrong >= 64  # measured: 128 of the 256 columns
    assert _python(["-c", "import torch; torch.set_num_threads(1)\n" + MATMUL], "1").stdout.split() == ["0"]


def test_cli_bfloat16_ask_under_the_limit_answers_as_without_it():
    free = _python(["-m", "arr_coc.cli", *ASK], None)
    limited = _python(["-m", "arr_coc.cli", *ASK], "1")
    assert free.returncode == 0 and limited.returncode == 0, limited.stderr
    a, b = json.loads(free.stdout), json.loads(limited.stdout)
    assert (b["answer"], b["tokens"]) == (a["answer"], a["tokens"])
    said = [line for line in limited.stderr.splitlines() if "OMP_THREAD_LIMIT" in line]
    assert said == ["arr-coc: OMP_THREAD_LIMIT=1 is below torch's 2 threads; using 1 thread so half-precision "
                    "matmul computes correctly"]
    assert "OMP_THREAD_LIMIT" not in free.stderr


LIBRARY = """
import torch
from arr_coc.vlm import ask, load_vlm
adapter = load_vlm("tiny:qwen2_5_vl", dtype="bfloat16")
try:
    ask(adapter, ["examples/receipt.jpg"], ["What is the total?"], relevance="vlm", max_new_tokens=1)
except Exception as err:
    print(type(err).__name__, err)
print("threads", torch.get_num_threads())
"""


def test_library_refuses_half_precision_on_cpu_under_the_limit_without_touching_threads():
    out = _python(["-c", LIBRARY], "1").stdout.splitlines()
    assert out == ["ThreadLimitError ask with a bfloat16 model on the CPU: OMP_THREAD_LIMIT=1 is below torch's 2 "
                   "threads, so its half-precision matmul computes only part of its output; unset "
                   "OMP_THREAD_LIMIT or torch.set_num_threads(1)",
                   "threads 2"]  # the library did not change the process's thread pool


def test_check_threads_passes_float32_other_devices_and_a_fitted_process(monkeypatch):
    import torch

    from arr_coc.errors import ThreadLimitError
    from arr_coc.threads import check_threads, unsafe_threads

    monkeypatch.setenv("OMP_THREAD_LIMIT", str(torch.get_num_threads()))
    assert unsafe_threads() is None
    check_threads(torch.bfloat16, "cpu", "x")  # the limit is not below torch's count: fine
    monkeypatch.setenv("OMP_THREAD_LIMIT", "0")  # not a limit OpenMP takes: ignored
    assert unsafe_threads() is None
    if torch.get_num_threads() > 1:
        monkeypatch.setenv("OMP_THREAD_LIMIT", "1")
        check_threads(torch.float32, "cpu", "x")
        check_threads(torch.bfloat16, "meta", "x")
        with pytest.raises(ThreadLimitError, match=r"^x on the CPU: OMP_THREAD_LIMIT=1 .* torch.set_num_threads\(1\)$"):
            check_threads(torch.float16, "cpu", "x")


def test_benchmarks_leave_omp_thread_limit_to_tesseracts_own_process():
    for script in sorted((ROOT / "benchmarks").glob("*.py")):
        assert "OMP_THREAD_LIMIT" not in script.read_text(), script.name
    assert '"OMP_THREAD_LIMIT": str(self.threads)}  # this child only' in (ROOT / "arr_coc/eval/reading.py").read_text()
