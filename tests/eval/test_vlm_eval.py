"""The VLM as reader: every method answered by a tiny random Qwen2.5-VL on fixtures in each benchmark's format,
native_budget's token cap, batching, resuming, the leakage guard and 2 torchrun processes against 1."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image, ImageDraw
from tolerances import VLM_EMBEDS, assert_close_reduction, assert_far

from arr_coc.cli import main
from arr_coc.config import ARRConfig, CanvasConfig, TextureConfig
from arr_coc.data.datasets import load_dataset
from arr_coc.engine.pipeline import ARR
from arr_coc.engine.query import HashingQueryEncoder
from arr_coc.eval.evaluate import evaluate, shard
from arr_coc.eval.settings import EvalSettings
from arr_coc.eval.store import RowStore
from arr_coc.vlm import load_vlm
from arr_coc.weights import refuse_leakage


def read_rows(path: Path) -> list[dict]:
    """The rows of an evaluation folder's records.jsonl."""
    return RowStore(path.parent).rows()


CHANNELS = ("rgb", "edges")  # cheap texture: these tests are about the reader, not the channels


def page(path: Path, text: str, size: tuple[int, int] = (168, 112)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    im = Image.new("RGB", size, "white")
    ImageDraw.Draw(im).text((8, 8 + 10 * (len(text) % 5)), text, fill="black")
    im.save(path)
    return path


def write(path: Path, obj) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))
    return path


def make_dataset(name: str, root: Path, answers: dict[int, list[str]] | None = None) -> Path:
    """Two questions about two images in ``name``'s official layout; ``answers`` overrides the references."""
    ans = answers or {0: ["9.00"], 1: ["ACME"]}
    if name in ("docvqa", "infovqa"):
        key = "image" if name == "docvqa" else "image_local_name"
        for i in (0, 1):
            page(root / "images" / f"p{i}.png", f"TOTAL {i}.00", (168 + 28 * i, 112))
        items = [{"questionId": i, "question": f"What is field {i}?",
                  key: f"documents/p{i}.png" if name == "docvqa" else f"p{i}.png", "answers": ans[i]} for i in (0, 1)]
        file = "val_v1.0.json" if name == "docvqa" else "infographicsVQA_val_v1.0.json"
        write(root / "qas" / file, {"data": items})
    elif name == "textvqa":
        for i in (0, 1):
            page(root / "train_images" / f"im{i}.jpg", f"NOKIA {i}")
        items = [{"question_id": 10 + i, "question": f"what brand {i}?", "image_id": f"im{i}",
                  "answers": (ans[i] * 10)[:10] if len(ans[i]) < 10 else ans[i]} for i in (0, 1)]
        write(root / "TextVQA_0.5.1_val.json", {"data": items})
    else:
        for i in (0, 1):
            page(root / "test" / "png" / f"c{i}.png", f"{40 + i}%")
        write(root / "test" / "test_human.json",
              [{"imgname": f"c{i}.png", "query": f"What is bar {i}?", "label": ans[i][0]} for i in (0, 1)])
    return root


def which(row: dict) -> int:
    """0 or 1: the fixture's question a row answers (ids 0/1, 10/11 or human:0/human:1)."""
    return int(row["record_id"][-1])


SPLIT = {"docvqa": "val", "infovqa": "val", "textvqa": "val", "chartqa": "test"}


@pytest.fixture(scope="module")
def adapter():
    return load_vlm("tiny:qwen2_5_vl")


@pytest.fixture(scope="module")
def arr(adapter):
    return ARR(ARRConfig(canvas=CanvasConfig(cell=adapter.cell), texture=TextureConfig(channels=CHANNELS)),
               query_encoder=HashingQueryEncoder()).eval()


COMMON = ["--reader", "vlm", "--model", "tiny:qwen2_5_vl", "--channels", *CHANNELS, "--query-encoder", "hashing",
          "--max-new-tokens", "3", "--batch-size", "4"]


def cli(name: str, data: Path, out: Path, *extra: str) -> list[dict]:
    """``arr-coc eval NAME --reader vlm --model tiny:qwen2_5_vl`` (full, native_budget, arr at 8 tokens) -> its rows."""
    argv = ["eval", name, "--data", str(data), "--split", SPLIT[name], "--out", str(out), *COMMON,
            "--methods", "full", "native_budget", "arr", "--tokens", "8", *extra]
    assert main(argv) == 0
    return read_rows(out / name / "tiny_qwen2_5_vl" / "records.jsonl")


def run(records, arr, adapter, out: Path, **kw) -> list[dict]:
    settings = EvalSettings(reader="vlm", **{"methods": ("full", "native_budget", "arr"), "budgets": ("8",),
                                  "max_new_tokens": 3, "batch_size": 4, **kw})
    return read_rows(evaluate(records, arr, out, settings, progress=False, adapter=adapter))


# --------------------------------------------------------------------------------- native_budget
@pytest.mark.parametrize("size", [(500, 350), (168, 112), (60, 500), (1100, 45)])
def test_native_budget_sends_at_most_the_budget(adapter, size):
    photo = Image.new("RGB", size, "white")
    full = len(adapter.encode_processed([photo], 10**6)[0])
    sent = {budget: len(adapter.encode_processed([photo], budget)[0]) for budget in (4, 9, 16, 50, full, full + 100)}
    assert all(n <= budget for budget, n in sent.items()), sent
    assert sent[full] == sent[full + 100] == full
    assert sent[16] > sent[4] >= 1 and sent[16] >= 16 * 0.5  # the cap binds, without wasting most of it


def test_native_budget_refuses_a_budget_the_processor_cannot_meet(adapter):
    with pytest.raises(ValueError, match=r"cannot fit a 40x5000 image in 4 tokens"):
        adapter.encode_processed([Image.new("RGB", (40, 5000))], 4)


def test_processed_view_equals_the_native_encoding_when_nothing_is_resized(adapter):
    g = torch.Generator().manual_seed(0)
    pixels = torch.randint(0, 256, (3, 4 * 28, 6 * 28), generator=g, dtype=torch.uint8)
    photo = Image.fromarray(pixels.permute(1, 2, 0).numpy())
    mine = adapter.encode_processed([photo], 10**4)[0]
    native = adapter.encode_native([pixels.float() / 255])[0]
    assert len(mine) == len(native) == 24 and torch.equal(mine.positions, native.positions)
    atol = assert_close_reduction(mine.embeds, native.embeds, **VLM_EMBEDS)
    flipped = adapter.encode_processed([photo.transpose(Image.FLIP_LEFT_RIGHT)], 10**4)[0]  # negative control
    assert_far(flipped.embeds, native.embeds, atol=atol)


# ----------------------------------------------------------------------------------- end to end
@pytest.mark.parametrize("name", ["docvqa", "infovqa", "textvqa", "chartqa"])
def test_every_format_is_answered_and_scored_by_its_own_metric(name, tmp_path, capsys):
    rows = cli(name, make_dataset(name, tmp_path / "a"), tmp_path / "out1")
    table = capsys.readouterr().out
    metric = {"docvqa": "anls", "infovqa": "anls", "textvqa": "vqa_accuracy", "chartqa": "relaxed_accuracy"}[name]
    assert f"| budget | method | tokens (share of full) | n | {metric} | alloc ms |" in table
    assert "| 8 | native_budget |" in table and "| full | full |" in table
    assert len(rows) == 2 * 3 and {(r["method"], r["budget"]) for r in rows} == {
        ("full", "full"), ("native_budget", "8"), ("arr", "8")}
    for r in rows:
        assert r["tokens"] <= 8 if r["budget"] == "8" else r["tokens"] == r["full_tokens"]
        assert r["flops"] == r["flops_vision"] + r["flops_llm"] + r["flops_decode"] + r["flops_alloc"] > 0
        assert r["vision_ms"] > 0 and r["prefill_ms"] > 0 and r["decode_ms"] > 0
        assert r["alloc_ms"] > 0 if r["method"] == "arr" else r["alloc_ms"] == 0
    assert all(r["tokens"] == 8 for r in rows if r["method"] == "arr")  # 2x2 gestalt + 4 saccades, exactly
    # the model's own answers become the references: the metric must score them as hand-computed
    said = {which(r): r["prediction"] for r in rows if r["method"] == "full"}
    if name == "textvqa":  # 3 of 10 annotators agree with the model on image 0: (3 * 2/3 + 7 * 1) / 10
        refs = {0: [said[0]] * 3 + ["zebra"] * 7, 1: ["zebra"] * 10}
        expected = {0: 0.9, 1: 0.0}
    else:
        refs = {0: [said[0]], 1: ["zebra crossing" if said[1] != "zebra crossing" else "x"]}
        expected = {0: 1.0, 1: 0.0}
    again = cli(name, make_dataset(name, tmp_path / "b", refs), tmp_path / "out2", "--methods", "full")
    assert {which(r): r["prediction"] for r in again} == said  # deterministic
    assert {which(r): r["score"] for r in again} == pytest.approx(expected)
    assert {r["metric"] for r in again} == {"docvqa": {"anls"}, "infovqa": {"anls"}, "textvqa": {"vqa_accuracy"},
                                            "chartqa": {"relaxed_accuracy"}}[name]


def test_every_method_sends_what_its_budget_allows(tmp_path, adapter, arr):
    records = load_dataset("docvqa", make_dataset("docvqa", tmp_path / "d"), split="val")[:1]
    methods = ("full", "native_budget", "arr", "vlm", "slice", "topk", "random", "patches", "quadtree")
    rows = {(r["method"], r["budget"]): r for r in run(records, arr, adapter, tmp_path / "o", methods=methods,
                                                         budgets=("16", "50%"))}
    full = rows[("full", "full")]["full_tokens"]
    assert full == 24  # 168 x 112 px = 6 x 4 cells
    for (m, b), r in rows.items():
        cap = full if b == "full" else int(b) if b.isdigit() else round(int(b[:-1]) / 100 * full)
        assert r["tokens"] <= cap, (m, b)
        if m in ("arr", "vlm", "slice", "topk", "random"):
            assert r["tokens"] == cap and r["gestalt_tokens"] == 4  # gestalt + saccades = budget, exactly
        assert (r["flops_alloc"] > 0) == (m == "vlm")  # only the first look is the model's own work
    # slice runs the tower over the whole image, sparse over gestalt + saccades only
    assert rows[("slice", "16")]["flops_vision"] > rows[("arr", "16")]["flops_vision"]
    assert rows[("slice", "16")]["flops_llm"] == rows[("arr", "16")]["flops_llm"]


def test_a_model_without_its_own_processor_is_refused_the_native_methods(tmp_path):
    llava = load_vlm("tiny:llava")  # declares no processor capability
    records = load_dataset("docvqa", make_dataset("docvqa", tmp_path / "d"), split="val")[:1]
    arr = ARR(ARRConfig(canvas=CanvasConfig(cell=llava.cell), texture=TextureConfig(channels=CHANNELS)),
              query_encoder=HashingQueryEncoder()).eval()
    with pytest.raises(ValueError, match=f"{llava.name} has no image processor of its own to resize with; "
                                         "leave out full and native_budget"):
        run(records, arr, llava, tmp_path / "o", methods=("arr", "native_budget"))
    assert {r["method"] for r in run(records, arr, llava, tmp_path / "o", methods=("arr",))} == {"arr"}


def test_batched_answers_equal_one_at_a_time(tmp_path, adapter, arr):
    records = load_dataset("textvqa", make_dataset("textvqa", tmp_path / "t"), split="val")
    batched = run(records, arr, adapter, tmp_path / "b4", batch_size=4)
    single = run(records, arr, adapter, tmp_path / "b1", batch_size=1)
    assert [r["batch"] for r in batched] == [4, 4, 4, 4, 2, 2] and {r["batch"] for r in single} == {1}
    key = lambda r: (r["record_id"], r["method"], r["budget"])
    assert sorted((key(r), r["prediction"], r["tokens"]) for r in batched) == \
        sorted((key(r), r["prediction"], r["tokens"]) for r in single)


def test_a_rerun_skips_what_is_done_and_a_dead_rank_loses_nothing(tmp_path, adapter, arr):
    records = load_dataset("chartqa", make_dataset("chartqa", tmp_path / "c"), split="test")
    out = tmp_path / "out"
    first = run(records, arr, adapter, out)
    assert len(first) == 6 and [p.name for p in out.glob("records*")] == ["records.jsonl"]
    # a rank died: the folder holds three finished rows (one marked), a duplicate of one and a cut line
    kept = dict(first[0], prediction="ANSWERED BEFORE")
    rest = [r for r in first if (r["record_id"], r["method"]) != (kept["record_id"], kept["method"])]
    (out / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [kept, *rest[:2], rest[0]]) + '{"reco')
    again = run(records, arr, adapter, out)
    key = lambda r: (r["record_id"], r["method"], r["budget"])
    assert len(again) == len({key(r) for r in again}) == 6
    expected = {key(r): r["prediction"] for r in first} | {key(kept): "ANSWERED BEFORE"}  # not answered twice
    assert {key(r): r["prediction"] for r in again} == expected  # the rest answered again, the same


def test_shards_split_images_not_questions_and_cover_every_record(tmp_path):
    records = load_dataset("docvqa", make_dataset("docvqa", tmp_path / "d", {0: ["a"], 1: ["b"]}), split="val")
    parts = [shard(records, r, 2) for r in range(2)]
    assert [len(p) for p in parts] == [1, 1] and parts[0][0].image_id != parts[1][0].image_id
    assert sorted(r.record_id for p in parts for r in p) == sorted(r.record_id for r in records)


# --------------------------------------------------------------------------------------- leakage
def test_shipped_weights_are_never_scored_on_their_training_images():
    shipped = ARR(ARRConfig())  # default channels and query encoder (MiniLM, loaded lazily): the shipped scorer
    assert shipped.weights_source.startswith("trained, shipped")
    for split in (None, "train", "val"):
        with pytest.raises(ValueError, match=r"shipped scorer weights .* trained on the train images of funsd, "
                                             r"sroie, coco .* add --split test"):
            refuse_leakage("funsd", split, shipped, ("full", "stratified"))
    refuse_leakage("funsd", "test", shipped, ("full", "stratified"))  # held-out images: allowed
    refuse_leakage("docvqa", None, shipped, ("arr",))  # never trained on
    refuse_leakage("sroie", None, shipped, ("full", "native_budget"))  # the scorer plays no part
    hand_set = ARR(ARRConfig(texture=TextureConfig(channels=CHANNELS)), query_encoder=HashingQueryEncoder())
    refuse_leakage("sroie", None, hand_set, ("stratified",))
    with pytest.raises(ValueError, match=r"shipped pruner weights"):
        refuse_leakage("coco", "val", hand_set, ("pruner",))
    refuse_leakage("coco", "val", hand_set, ("pruner",), {"pruner": "my.pt"})


# ------------------------------------------------------------------------------------------- CLI
def test_cli_errors_say_what_to_do(tmp_path, capsys):
    data = make_dataset("docvqa", tmp_path / "d")
    assert main(["eval", "docvqa", "--data", str(data), "--split", "val", "--reader", "vlm"]) == 2
    assert "--reader vlm needs --model PATH_OR_ID" in capsys.readouterr().err
    assert main(["eval", "docvqa", "--data", str(data), "--split", "val", "--reader", "none",
                 "--channels", *CHANNELS, "--query-encoder", "hashing"]) == 2
    assert "docvqa records have no answer boxes" in capsys.readouterr().err
    assert main(["eval", "funsd", "--data", str(tmp_path / "nowhere"), "--reader", "none"]) == 2
    cli("docvqa", data, tmp_path / "o")
    assert main(["eval", "docvqa", "--data", str(data), "--split", "val", "--out", str(tmp_path / "o"), *COMMON,
                 "--methods", "full", "--prompt", "Q: {question}"]) == 2
    assert "holds rows made with other settings (prompt: " in capsys.readouterr().err
    assert main(["eval", "docvqa", "--data", str(data), "--split", "val", "--out", str(tmp_path / "o"), *COMMON,
                 "--methods", "full", "--prompt", "Q: {question}", "--fresh"]) == 0  # replaced


def test_cli_refuses_the_shipped_scorer_on_its_training_data(tmp_path, capsys):
    funsd = tmp_path / "funsd" / "training_data"
    page(funsd / "images" / "f1.png", "Date: 12/03")
    write(funsd / "annotations" / "f1.json", {"form": [
        {"id": 0, "label": "question", "text": "Date:", "box": [2, 2, 40, 12], "words": [], "linking": [[0, 1]]},
        {"id": 1, "label": "answer", "text": "12/03", "box": [50, 2, 90, 12], "words": [], "linking": [[0, 1]]}]})
    # the default channels and query encoder: the shipped scorer, trained on FUNSD's train images (refused
    # before any question is encoded)
    argv = ["eval", "funsd", "--data", str(tmp_path / "funsd"), "--tokens", "8", "--out", str(tmp_path / "o")]
    assert main(argv + ["--reader", "vlm", "--model", "tiny:qwen2_5_vl", "--methods", "arr"]) == 2
    assert "were trained on the train images of funsd, sroie, coco" in capsys.readouterr().err
    assert main(argv + ["--reader", "none", "--methods", "topk", "--split", "val"]) == 2
    assert "on funsd --split val would count images they learned from: add --split test" in capsys.readouterr().err
    hashed = ["--query-encoder", "hashing"]  # another encoder: the shipped weights do not apply, hand-set is allowed
    assert main(argv + hashed + ["--reader", "none", "--methods", "topk", "--channels", *CHANNELS]) == 0


@pytest.mark.slow
def test_torchrun_with_two_processes_answers_what_one_process_answers(tmp_path):
    if shutil.which("torchrun", path=str(Path(sys.executable).parent)) is None:
        pytest.fail("torchrun is not installed beside this Python (it comes with torch)")
    data = make_dataset("textvqa", tmp_path / "t")
    one = cli("textvqa", data, tmp_path / "one", "--methods", "full", "native_budget", "arr", "vlm")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [str(Path(sys.executable).parent / "torchrun"), "--nproc_per_node", "2", "--master_port", "29533",
           "-m", "arr_coc.cli", "eval", "textvqa", "--data", str(data), "--split", "val", "--out", str(tmp_path / "two"),
           *COMMON, "--methods", "full", "native_budget", "arr", "vlm", "--tokens", "8"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr[-3000:]
    out = tmp_path / "two" / "textvqa" / "tiny_qwen2_5_vl"
    two = read_rows(out / "records.jsonl")
    assert [p.name for p in out.glob("records*")] == ["records.jsonl"]  # both ranks wrote into one store
    assert done.stdout.count("| budget | method |") == 1  # one table, from rank 0
    key = lambda r: (r["record_id"], r["method"], r["budget"])
    assert len(two) == len(one) == 8 and len({key(r) for r in two}) == 8
    assert sorted((key(r), r["prediction"], r["tokens"], r["score"]) for r in two) == \
        sorted((key(r), r["prediction"], r["tokens"], r["score"]) for r in one)
