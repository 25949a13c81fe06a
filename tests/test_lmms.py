"""lmms-eval runs arr-coc: the real ``lmms-eval`` command on a local DocVQA-format task, end to end on the CPU.

The fixture is made here (three rendered pages, their questions and answers, one parquet file with the
columns of DocVQA's Hugging Face export); the task YAML reuses lmms-eval's own DocVQA prompt functions and
its ANLS metric. Nothing is downloaded: the model is ``tiny:qwen2_5_vl`` and datasets runs offline.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest
import torch
from PIL import Image, ImageDraw

QUESTIONS = [("What is the total?", ["42.00"]), ("What is the date?", ["12 May 2024"]), ("Who signed?", ["Ada"])]
POST_PROMPT = "\nAnswer the question using a single word or phrase."
TASK = f"""task: docvqa_fixture
dataset_path: parquet
dataset_kwargs:
  data_files:
    validation: docvqa_val.parquet
test_split: validation
output_type: generate_until
doc_to_visual: !function lmms_eval.tasks.docvqa.utils.docvqa_doc_to_visual
doc_to_text: !function lmms_eval.tasks.docvqa.utils.docvqa_doc_to_text
doc_to_target: answers
generation_kwargs:
  max_new_tokens: 3
  temperature: 0
  do_sample: false
lmms_eval_specific_kwargs:
  default:
    pre_prompt: ""
    post_prompt: {json.dumps(POST_PROMPT)}
metric_list:
  - metric: anls
    aggregation: mean
    higher_is_better: true
"""
TOKENS = 48  # on a 448 x 448 page (16 x 16 cells of 28 px): a 4 x 4 gestalt + 32 saccades


def page(i: int) -> Image.Image:
    img = Image.new("RGB", (448, 448), "white")
    draw = ImageDraw.Draw(img)
    for row, (q, (a,)) in enumerate(QUESTIONS):
        draw.text((20 + 30 * i, 40 + 120 * row), f"{q.split()[-1].rstrip('?').upper()}: {a}", fill="black")
    return img


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from datasets import Dataset, Features, Sequence, Value
    from datasets import Image as ImageFeature

    folder = tmp_path_factory.mktemp("lmms")
    (folder / "tasks").mkdir()
    rows = {"questionId": [str(1000 + i) for i in range(3)], "question": [q for q, _ in QUESTIONS],
            "question_types": [["form"]] * 3, "image": [page(i) for i in range(3)], "docId": list(range(3)),
            "answers": [a for _, a in QUESTIONS], "data_split": ["val"] * 3}
    features = Features({"questionId": Value("string"), "question": Value("string"),
                         "question_types": Sequence(Value("string")), "image": ImageFeature(), "docId": Value("int64"),
                         "answers": Sequence(Value("string")), "data_split": Value("string")})
    Dataset.from_dict(rows, features=features).to_parquet(folder / "tasks" / "docvqa_val.parquet")
    (folder / "tasks" / "docvqa_fixture.yaml").write_text(TASK)
    return folder


def test_the_model_is_registered_through_lmms_evals_entry_point_group():
    from lmms_eval.models import get_model

    (ep,) = [ep for ep in entry_points(group="lmms_eval.models") if ep.name == "arr_coc"]
    assert ep.value == "arr_coc.lmms:manifest"
    from arr_coc.lmms import ArrCoc

    assert get_model("arr_coc") is ArrCoc
    # imported before lmms_eval (as the doctests and users do), the entry point must still resolve
    first = "import arr_coc.lmms as m; from lmms_eval.models import get_model; assert get_model('arr_coc') is m.ArrCoc"
    done = subprocess.run([sys.executable, "-c", first], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def test_lmms_eval_answers_every_sample_at_the_budget(task_dir: Path):
    from arr_coc.config import ARRConfig, CanvasConfig, GestaltConfig
    from arr_coc.engine.pipeline import ARR
    from arr_coc.vlm import ask, load_vlm

    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "HF_DATASETS_OFFLINE": "1",
           "HF_HUB_OFFLINE": "1", "HF_HOME": str(task_dir / "hf"), "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    cmd = [str(Path(sys.executable).with_name("lmms-eval")), "--model", "arr_coc",
           "--model_args", f"pretrained=tiny:qwen2_5_vl,tokens={TOKENS},relevance=vlm", "--tasks", "docvqa_fixture",
           "--include_path", str(task_dir / "tasks"), "--batch_size", "1", "--output_path", str(task_dir / "out"),
           "--log_samples"]
    done = subprocess.run(cmd, cwd=task_dir, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (results_file,) = (task_dir / "out").rglob("*_results.json")
    results = json.loads(results_file.read_text())
    assert results["n-samples"]["docvqa_fixture"]["effective"] == 3
    anls = results["results"]["docvqa_fixture"]["anls,none"]
    assert 0.0 <= anls <= 1.0
    (samples_file,) = (task_dir / "out").rglob("*_samples_docvqa_fixture.jsonl")
    samples = sorted((json.loads(line) for line in samples_file.read_text().splitlines()), key=lambda s: s["doc_id"])
    assert [s["doc_id"] for s in samples] == [0, 1, 2]
    # each answer is the one arr_coc.vlm.answer gives alone at the same split of the budget: 4 x 4 gestalt + 32 saccades
    adapter = load_vlm("tiny:qwen2_5_vl")
    arr = ARR(ARRConfig(canvas=CanvasConfig(cell=28), gestalt=GestaltConfig(grid=(4, 4))))
    other = ARR(ARRConfig(canvas=CanvasConfig(cell=28), gestalt=GestaltConfig(grid=(6, 6))))
    differs = 0
    for i, sample in enumerate(samples):
        question = QUESTIONS[i][0] + POST_PROMPT
        with torch.inference_mode():
            a = ask(adapter, [page(i)], [question], arr=arr, saccades=32, relevance="vlm", max_new_tokens=3)[0]
            b = ask(adapter, [page(i)], [question], arr=other, saccades=64, relevance="vlm", max_new_tokens=3)[0]
        assert a.visual_tokens == TOKENS and b.visual_tokens == 100
        assert sample["filtered_resps"] == a.text.split("\n\n")[0]  # lmms-eval's default stop string
        differs += b.text != a.text
    assert differs > 0  # negative control: another budget answers otherwise, so the equality above means something


def test_unsupported_requests_are_refused_in_one_line():
    from arr_coc.lmms import ArrCoc

    with pytest.raises(ValueError, match="use --batch_size 1"):
        ArrCoc(pretrained="tiny:qwen2_5_vl", batch_size=4)
    with pytest.raises(ValueError, match="unknown temperatur; known: pretrained"):
        ArrCoc(pretrained="tiny:qwen2_5_vl", temperatur=0)
    with pytest.raises(ValueError, match="tokens=T .* or saccades=K, not both"):
        ArrCoc(pretrained="tiny:qwen2_5_vl", tokens=529, saccades=273)
    model = ArrCoc(pretrained="tiny:qwen2_5_vl", relevance="vlm")
    with pytest.raises(NotImplementedError, match="log-likelihoods"):
        model.loglikelihood([])
