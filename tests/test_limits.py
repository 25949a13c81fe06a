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
    """The negative control: what the fix guards against happens (torch at 2 threads, OpenMP at 1) wherever torch
    takes oneDNN's bfloat16 matmul, and nowhere else."""
    assert _python(["-c", MATMUL], None).stdout.split() == ["0"]
    wrong = int(_python(["-c", MATMUL], "1").stdout.split()[-1])
    # measured: 128 of the 256 columns where the CPU has oneDNN's bfloat16 kernels (AVX-512); a CPU without them
    # (AVX2 alone: this project's AMD EPYC machines) and forced portable kernels (`make test-kernels`: ATen's default
    # capability, oneDNN at SSE4.1, MKL's reproducible path) take another bfloat16 matmul that the limit does not
    # break, so there the control reads 0
    onednn = _python(["-c", "import torch; print(torch.ops.mkldnn._is_mkldnn_bf16_supported())"], None).stdout.split()
    forced = [v for v in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_CBWR") if os.environ.get(v)]
    assert onednn in (["True"], ["False"]), onednn
    if onednn == ["False"]:
        assert wrong == 0, wrong
    elif not forced:
        assert wrong >= 64, wrong
    else:  # oneDNN's kernels there, but some forced elsewhere: either matmul may be the one torch takes
        assert wrong == 0 or wrong >= 64, (wrong, forced)
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


# ------------------------------------------------------------------ bounds on what drives size
LONG = "What is the total? " * 6000  # 114,000 characters: the first look's attention would take tens of GB
TOO_LONG = ("question 0 has 30000 tokens, above the limit of 128 (a question, not a document); shorten it, or "
            "raise the limit with --max-question-tokens (ARR.max_question_tokens)")


def _one_line_error(capsys, argv) -> str:
    from arr_coc.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("arr-coc: error: ")
    return err[len("arr-coc: error: "):].rstrip("\n")


@pytest.mark.parametrize("command", [
    ["look"],
    ["ask", "--model", "tiny:qwen2_5_vl", "--relevance", "vlm"],
    ["ask", "--model", "tiny:qwen2_5_vl", "--relevance", "arr"],
])
def test_an_overlong_question_is_refused_in_one_line_before_work(command, receipt, capsys):
    argv = [command[0], str(receipt), LONG, *command[1:], "--query-encoder", "hashing", "--channels", "mvp"]
    assert _one_line_error(capsys, argv) == TOO_LONG
    assert _one_line_error(capsys, [*argv, "--max-question-tokens", "0"]) == ("--max-question-tokens must be an "
                                                                              "integer >= 1, got 0")


def test_the_question_limit_is_one_constant_and_can_be_raised(receipt, capsys):
    import torch

    from arr_coc.app import service
    from arr_coc.cli import main
    from arr_coc.config import MAX_QUESTION_TOKENS, ARRConfig, SamplerConfig, TextureConfig
    from arr_coc.engine.pipeline import ARR
    from arr_coc.engine.query import HashingQueryEncoder

    assert service.MAX_QUESTION_TOKENS is MAX_QUESTION_TOKENS == 128  # the app and the library agree
    with pytest.raises(ValueError, match="^the question has 129 words and punctuation marks; keep it to 128$"):
        service.check_question("x " * 129)
    service.check_question("x " * 128)
    arr = ARR(ARRConfig(texture=TextureConfig(channels=("rgb", "edges")),
                        sampler=SamplerConfig(saccades=4)), query_encoder=HashingQueryEncoder()).eval()
    image = torch.rand(1, 3, 112, 112)
    with pytest.raises(ValueError) as err:
        arr(image, LONG)
    assert str(err.value) == TOO_LONG
    arr(image, "x " * 128)  # at the limit: taken
    arr.max_question_tokens = 30000  # raised on this ARR only
    assert arr(image, LONG).positions.shape == (1, 4, 2)
    question = " ".join(["x"] * 130)
    argv = ["look", str(receipt), question, "--query-encoder", "hashing", "--channels", "rgb", "--json"]
    assert _one_line_error(capsys, argv).startswith("question 0 has 130 tokens, above the limit of 128")
    assert main([*argv, "--max-question-tokens", "130"]) == 0  # the option raises it
    assert json.loads(capsys.readouterr().out)["question"] == question


@pytest.mark.parametrize("relevance", ["vlm", "arr"])
def test_the_vlm_path_counts_the_question_in_its_own_tokens(relevance):
    """60 long words pass the word count (60) but are 1499 tokens of the tiny model's character tokenizer."""
    from arr_coc.config import MVP_CHANNELS, ARRConfig, TextureConfig
    from arr_coc.engine.pipeline import ARR
    from arr_coc.engine.query import HashingQueryEncoder, count_tokens
    from arr_coc.vlm import ask, load_vlm

    adapter = load_vlm("tiny:qwen2_5_vl")
    arr = ARR(ARRConfig(texture=TextureConfig(channels=MVP_CHANNELS)), query_encoder=HashingQueryEncoder()).eval()
    question = " ".join(["Pneumonoultramicroscopic"] * 60)
    assert count_tokens(question) == 60 and count_tokens(question, adapter.tokenizer) == 1499
    with pytest.raises(ValueError) as err:
        ask(adapter, ["examples/receipt.jpg"], [question], arr=arr, relevance=relevance, max_new_tokens=1)
    assert str(err.value) == ("question 0 has 1499 tokens, above the limit of 128 (a question, not a document); "
                              "shorten it, or raise the limit with --max-question-tokens (ARR.max_question_tokens)")
    arr.max_question_tokens = 1499  # raised on the ARR the VLM path allocates with
    assert ask(adapter, ["examples/receipt.jpg"], [question], arr=arr, relevance=relevance, max_new_tokens=1)[0].text


LOOK = """
import sys, torch
import arr_coc.vlm.first_look as look
from arr_coc.vlm import allocation, load_vlm, stages
if sys.argv[1] == "unbounded":
    look.LOOK_TOKENS = 10**9
adapter = load_vlm("tiny:qwen2_5_vl")
before, after = adapter.prompt_ids("Q")
def peak_kb():
    return int(next(x for x in open("/proc/self/status") if x.startswith("VmHWM")).split()[1])
with torch.inference_mode():
    open("/proc/self/clear_refs", "w").write("5")  # the peak from here on: loading the model does not count
    base = peak_kb()
    seen = allocation.read_first_look(adapter, [torch.rand(3, 112, 112)], [(4, 4)], prompts=[(before, after[:1] * 4000 + after)])
print(tuple(seen.attention[0].shape), (peak_kb() - base) // 1024)
"""


def test_the_first_look_reads_attention_from_a_bounded_number_of_question_tokens():
    """A 4015-token question: the read is [layers, heads, 64, G], and the look's peak far below the unbounded read's."""
    from arr_coc.vlm.first_look import LOOK_TOKENS

    bounded, unbounded = (_python(["-c", LOOK, which], None).stdout.split(")") for which in ("bounded", "unbounded"))
    assert bounded[0] == f"(2, 2, {LOOK_TOKENS}, 16" and unbounded[0] == "(2, 2, 4015, 16"
    # measured: 101 MB bounded (the question's prefill), 581 MB with every question token read
    assert int(bounded[1]) < 0.5 * int(unbounded[1])


def test_max_pixels_above_the_largest_canvas_is_refused_with_the_limit(receipt, capsys):
    from arr_coc.config import MAX_CANVAS_PIXELS, CanvasConfig

    assert CanvasConfig(max_pixels=MAX_CANVAS_PIXELS).max_tokens == 16384  # the largest legal canvas
    message = ("max_pixels 200000000 is above the largest canvas, 12845056 px (16384 tokens of 28 px, the Qwen-VL "
               "processors' maximum); give --max-pixels 12845056 or less")
    assert _one_line_error(capsys, ["look", str(receipt), "Total?", "--max-pixels", "200000000"]) == message
    with pytest.raises(ValueError, match=r"^max_pixels 12845057 is above the largest canvas"):
        CanvasConfig(max_pixels=MAX_CANVAS_PIXELS + 1)


# ------------------------------------------------------------------ options checked before work starts
@pytest.mark.parametrize("prompt, message", [
    ("{question} {foo}", "the prompt may hold only {question}, got {foo} in '{question} {foo}'; write a literal "
                         "brace as {{ or }}"),
    ('Answer as JSON {"answer": ...}: {question}', "the prompt may hold only {question}, got {\"answer\": ...} in "
                                                   "'Answer as JSON {\"answer\": ...}: {question}'; write a literal "
                                                   "brace as {{ or }}"),
    ("{question!r}", "the prompt may hold only {question}, got {question!r} in '{question!r}'; write a literal brace "
                     "as {{ or }}"),
    ("{question} }", "the prompt '{question} }' is not a template (Single '}' encountered in format string); write "
                     "a literal brace as {{ or }}"),
    ("Answer briefly.", "the prompt must hold {question}, got 'Answer briefly.'"),
])
def test_eval_prompt_templates_are_checked_while_parsing(prompt, message, capsys):
    from arr_coc.cli import main
    from arr_coc.eval.settings import EvalSettings

    with pytest.raises(SystemExit) as done:  # argparse: before any dataset or model loads
        main(["eval", "funsd", "--reader", "vlm", "--model", "tiny:qwen2_5_vl", "--prompt", prompt])
    assert done.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"arr-coc eval: error: argument --prompt: {message}"
    with pytest.raises(ValueError) as err:  # the library says the same
        EvalSettings(reader="vlm", prompt=prompt)
    assert str(err.value) == message


def test_a_prompt_with_doubled_braces_and_the_default_pass():
    from arr_coc.eval.settings import PROMPT, EvalSettings
    from arr_coc.vlm.processing import check_prompt

    template = 'Reply as {{"answer": ...}}: {question}'
    assert EvalSettings(reader="vlm", prompt=template).prompt.format(question="Q") == 'Reply as {"answer": ...}: Q'
    assert check_prompt(PROMPT) == PROMPT


def test_method_vlm_without_a_first_look_is_refused_in_eval_as_in_ask(tmp_path):
    from dataclasses import replace

    from arr_coc.config import ARRConfig, CanvasConfig
    from arr_coc.engine.pipeline import ARR
    from arr_coc.engine.query import HashingQueryEncoder
    from arr_coc.eval.evaluate import evaluate
    from arr_coc.eval.settings import EvalSettings
    from arr_coc.vlm import ask, load_vlm

    llava = load_vlm("tiny:llava")
    arr = ARR(replace(ARRConfig(), canvas=CanvasConfig(cell=llava.cell)), query_encoder=HashingQueryEncoder())
    with pytest.raises(ValueError) as in_eval:
        evaluate([], arr, tmp_path, EvalSettings(reader="vlm", methods=("vlm",), model="tiny:llava"), progress=False, adapter=llava)
    with pytest.raises(ValueError) as in_ask:
        ask(llava, ["examples/receipt.jpg"], ["Total?"], arr=arr, relevance="vlm")
    tail = ("needs an adapter that encodes the gestalt alone and reuses it (the Qwen-VL families); llava does not: "
            "use qwen2_vl, qwen2_5_vl, qwen3_vl")
    assert str(in_eval.value) == "method 'vlm' (the VLM's first look) " + tail
    assert str(in_ask.value) == "relevance 'vlm' " + tail
    assert not any(tmp_path.iterdir())  # nothing was written


def test_serve_resolves_its_host_before_starting(capsys):
    from arr_coc.cli.serve import bind_host

    assert (bind_host("::1", 7860), bind_host("[::1]", 7860), bind_host("127.0.0.1", 7860)) == ("[::1]", "[::1]",
                                                                                                 "127.0.0.1")
    message = _one_line_error(capsys, ["serve", "--host", "bogus.invalid", "--port", "7861"])
    assert message.startswith("--host 'bogus.invalid' cannot be resolved (")
    assert message.endswith("); give a name or address of this machine, e.g. 127.0.0.1, ::1 or 0.0.0.0")
    assert "port" not in message


@pytest.mark.parametrize("saccades", [2.5, 0, -3, float("nan"), float("inf"), None, True, "4"])
def test_the_app_refuses_saccades_that_are_not_a_whole_number(saccades):
    from arr_coc.app.ui import MAX_SACCADES, _settings

    with pytest.raises(ValueError, match=rf"^the saccades K must be a whole number of tokens from 1 to {MAX_SACCADES}"):
        _settings(saccades, "topk", ["rgb"], "hand-set", None, 1.0, 1.0, 1.0, cell=28)


def test_the_app_takes_whole_saccades_and_its_field_does_not_round():
    from arr_coc.app import ui

    assert ui._settings(3.0, "topk", ["rgb"], "hand-set", None, 1.0, 1.0, 1.0, cell=28).saccades == 3
    assert "precision=None" in Path(ui.__file__).read_text()  # precision=0 would round 2.5 to 2 before the check
    import gradio as gr

    assert gr.Number(precision=None).preprocess(2.5) == 2.5 and gr.Number(precision=0).preprocess(2.5) == 2


STAGES = """
import sys, tempfile
import torch
from arr_coc.eval.evaluate import evaluate
from arr_coc.vlm import allocation, load_vlm, stages
adapter = load_vlm("tiny:qwen2_5_vl", dtype=sys.argv[1])
calls = {
    "read_first_look": lambda: allocation.read_first_look(adapter, [torch.rand(3, 56, 56)], [(2, 2)], ["What is the total?"]),
    "encode": lambda: stages.encode(adapter, [], []),
    "prefill": lambda: stages.prefill(adapter, [], []),
    "decode": lambda: stages.decode(adapter, None),
    "evaluate_vlm": lambda: evaluate([], None, tempfile.mkdtemp(), adapter=adapter),
}
for name, call in calls.items():
    try:
        call()
        print(name, "ok")
    except Exception as err:
        print(name, type(err).__name__, err)
print("threads", torch.get_num_threads())
"""


def test_the_vlm_stages_and_eval_refuse_a_half_precision_model_under_the_limit_in_one_line():
    limited = _python(["-c", STAGES, "bfloat16"], "1").stdout.splitlines()
    fix = ("on the CPU: OMP_THREAD_LIMIT=1 is below torch's 2 threads, so its half-precision matmul computes only "
           "part of its output; unset OMP_THREAD_LIMIT or torch.set_num_threads(1)")
    assert limited == [f"read_first_look ThreadLimitError the first look with a bfloat16 model {fix}",
                       f"encode ThreadLimitError encode with a bfloat16 model {fix}",
                       f"prefill ThreadLimitError prefill with a bfloat16 model {fix}",
                       f"decode ThreadLimitError decode with a bfloat16 model {fix}",
                       f"evaluate_vlm ThreadLimitError eval with the VLM reader with a bfloat16 model {fix}",
                       "threads 2"]  # refused, and the process's thread pool left as it was
    # the controls: the same calls without the limit, and a float32 model under it, get past the check
    for free in (_python(["-c", STAGES, "bfloat16"], None).stdout, _python(["-c", STAGES, "float32"], "1").stdout):
        assert free.splitlines()[:2] == ["read_first_look ok", "encode ok"] and "ThreadLimitError" not in free
