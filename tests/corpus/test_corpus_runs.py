"""Corpus: interrupted, concurrent, stale and damaged runs -- nothing silently wrong, nothing lost."""
from __future__ import annotations

import json
import multiprocessing
import signal
from pathlib import Path

import pytest
import torch
from corpus_checks import assert_cli_outcome, outcome, run_cli, write_bar_pages
from PIL import Image

from arr_coc.config import ARRConfig, ScorerConfig, TextureConfig
from arr_coc.data.datasets import load_dataset
from arr_coc.engine.pipeline import ARR
from arr_coc.engine.query import HashingQueryEncoder
from arr_coc.engine.texture import MVP_CHANNELS
from arr_coc.eval.evaluate import evaluate
from arr_coc.eval.report import write_reports
from arr_coc.eval.settings import EvalSettings
from arr_coc.eval.store import RowStore, requested
from arr_coc.train import TrainConfig, load_checkpoint
from arr_coc.train.checkpoint import CHECKPOINT_FORMAT
from arr_coc.train.features import build_examples, cache_file

MVP = ARRConfig(texture=TextureConfig(channels=MVP_CHANNELS), scorer=ScorerConfig(weights="none"))
SETTINGS = EvalSettings(methods=("topk", "random"), budgets=("25%", "50%"), reader=None)


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> Path:
    """Six 112 x 84 px pages, two questions each, as JSONL (image ids left out: they default to the path)."""
    return write_bar_pages(tmp_path_factory.mktemp("runs"), image_ids=False)


def arr(config: ARRConfig = MVP) -> ARR:
    return ARR(config, query_encoder=HashingQueryEncoder()).eval()


def keys_of(path: Path) -> list[tuple]:
    return [(r["record_id"], r["method"], r["budget"]) for r in map(json.loads, path.read_text().splitlines())]


def _worker(args):
    jsonl, out = args
    evaluate(load_dataset("jsonl", jsonl), arr(), Path(out), SETTINGS, progress=False)


def test_two_concurrent_evals_into_one_folder_write_every_row_once(pages, tmp_path):
    # spawn, not fork: a fork of a process whose torch / OpenMP threads are running can deadlock in the child
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        pool.map(_worker, [(pages, tmp_path)] * 2)
    records = load_dataset("jsonl", pages)
    keys = keys_of(tmp_path / "records.jsonl")
    assert len(keys) == len(set(keys)) == len(records) * 2 * 2  # nothing twice, nothing missing


def test_a_rerun_with_other_settings_is_refused_then_replaced_with_fresh(pages, tmp_path):
    records = load_dataset("jsonl", pages)[:4]
    evaluate(records, arr(), tmp_path, SETTINGS, progress=False)
    other = arr(ARRConfig(texture=TextureConfig(channels=("rgb", "edges")), scorer=ScorerConfig(weights="none")))
    kind, message = outcome(lambda: evaluate(records, other, tmp_path, SETTINGS, progress=False))
    assert kind == "error" and "other settings (channels:" in message and "--fresh" in message
    seeded = arr(ARRConfig(texture=TextureConfig(channels=MVP_CHANNELS), scorer=ScorerConfig(weights="none"),
                           seed=7))  # other hand-set weights: the weights' hash tells them apart
    kind, message = outcome(lambda: evaluate(records, seeded, tmp_path, SETTINGS, progress=False))
    assert kind == "error" and "scorer_weights:" in message
    fresh = EvalSettings(methods=SETTINGS.methods, budgets=SETTINGS.budgets, reader=None, fresh=True)
    path = evaluate(records, other, tmp_path, fresh, progress=False)
    assert len(keys_of(path)) == 4 * 4
    assert json.loads((tmp_path / "settings.json").read_text())["channels"] == ["rgb", "edges"]


def test_the_summary_covers_exactly_the_records_methods_and_budgets_asked(pages, tmp_path):
    records = load_dataset("jsonl", pages)
    path = evaluate(records, arr(), tmp_path, SETTINGS, progress=False)  # 12 records x 2 methods x 2 budgets
    asked = EvalSettings(methods=("topk",), budgets=("25%",), reader=None)
    evaluate(records[:3], arr(), tmp_path, asked, progress=False)
    csv_path, md_path, _ = write_reports(path, keys=requested(records[:3], asked.methods, asked.budgets),
                                         made_by="arr-coc eval jsonl --methods topk")
    assert md_path.read_text().splitlines()[0] == "made by: arr-coc eval jsonl --methods topk"
    lines = csv_path.read_text().splitlines()
    assert len(lines) == 2 and ",topk,25%,3," in lines[1]


def test_ctrl_c_during_eval_is_one_line_and_the_rerun_completes(pages, tmp_path):
    argv = ["eval", "jsonl", "--data", str(pages), "--channels", "mvp", "--query-encoder", "hashing",
            "--scorer-weights", "none", "--reader", "none", "--methods", "topk", "random", "--tokens", "25%",
            "--out", str(tmp_path)]
    previous = signal.signal(signal.SIGALRM, signal.default_int_handler)  # SIGALRM raises KeyboardInterrupt
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.4)  # wherever the run is then: loading, scoring, writing
        code, _, err = run_cli(argv)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    if code == 130:
        assert err.strip().splitlines()[-1] == ("arr-coc: interrupted; the rows of finished records are kept: "
                                               "rerun the same command to go on")
    else:
        assert_cli_outcome(code, err)  # it finished first
    code, _, err = run_cli(argv)
    assert code == 0, err
    keys = keys_of(tmp_path / "jsonl" / "records.jsonl")
    assert len(keys) == len(set(keys)) == 12 * 2


def test_rows_are_strict_json_with_null_for_missing_values(pages, tmp_path):
    path = evaluate(load_dataset("jsonl", pages)[:2], arr(), tmp_path, SETTINGS, progress=False)

    def refuse(name):
        raise AssertionError(f"bare {name} in {path}")

    rows = [json.loads(line, parse_constant=refuse) for line in path.read_text().splitlines()]
    assert rows and all(r["reading"] is None and r["prediction"] is None for r in rows)


def test_a_damaged_row_names_its_file_and_line(pages, tmp_path):
    path = evaluate(load_dataset("jsonl", pages)[:2], arr(), tmp_path, SETTINGS, progress=False)
    lines = path.read_text().splitlines()
    lines[2] = lines[2][:20] + "#" + lines[2][21:]
    path.write_text("\n".join(lines) + "\n")
    kind, message = outcome(lambda: RowStore(tmp_path).rows())
    assert kind == "error" and f"{path}:3: damaged row" in message


def test_boxes_outside_an_exif_rotated_image_are_refused_and_inside_ones_kept(tmp_path):
    img = Image.new("RGB", (200, 100), "white")  # stored 200 wide, shown 100 wide (orientation 6)
    exif = Image.Exif()
    exif[0x0112] = 6
    img.save(tmp_path / "r.jpg", exif=exif)
    good = {"image": "r.jpg", "question": "Where?", "answer": "", "boxes": [[10, 150, 90, 190]]}  # shown 100 x 200
    (tmp_path / "good.jsonl").write_text(json.dumps(good) + "\n")
    assert load_dataset("jsonl", tmp_path / "good.jsonl")[0].boxes_px == ((150.0, 10.0, 190.0, 90.0),)
    bad = {**good, "boxes": [[150, 10, 190, 90]]}  # in stored coordinates: outside the shown image
    (tmp_path / "bad.jsonl").write_text(json.dumps(bad) + "\n")
    kind, message = outcome(lambda: load_dataset("jsonl", tmp_path / "bad.jsonl"))
    assert kind == "error" and "outside the 100x200 image" in message


def test_train_features_of_jsonl_records_without_image_ids(pages, tmp_path):
    records = load_dataset("jsonl", pages)
    assert records[0].image_id.endswith("p0.png") and "/" in records[0].image_id  # the default: the path
    examples = build_examples(arr(), records, tmp_path, progress=False)
    assert len(examples) == len(records)
    files = sorted(p.name for p in tmp_path.rglob("*.pt"))
    assert len(files) == 6 and all("/" not in f for f in files)
    # a cache file holding text (or anything not ours) is recomputed, not a traceback
    victim = next(tmp_path.rglob(cache_file("jsonl", records[0].image_id)))
    victim.write_text("not a tensor file")
    again = build_examples(arr(), records, tmp_path, progress=False)
    assert torch.equal(again[0].cells, examples[0].cells)


class _Payload:
    """Unpickling this would create a file: proof that a checkpoint ran code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return Path.touch, (self.marker,)


def test_a_checkpoint_holding_code_is_refused_without_running_it(tmp_path):
    marker = tmp_path / "ran"
    ckpt = tmp_path / "checkpoint.pt"
    torch.save({"format": CHECKPOINT_FORMAT, "payload": _Payload(marker)}, ckpt)
    cfg = TrainConfig(out=str(tmp_path), datasets=("jsonl",))
    kind, message = outcome(lambda: load_checkpoint(ckpt, cfg, MVP, "HashingQueryEncoder"))
    assert kind == "error" and "cannot be read as an arr-coc training checkpoint" in message
    assert not marker.exists()


# ----------------------------------------------------------------------------- train's run folder


def train_argv(pages: Path, out: Path, *extra: str) -> list[str]:
    return ["train", "--datasets", "jsonl", "--data", str(pages), "--channels", "mvp", "--query-encoder", "hashing",
            "--steps", "2", "--eval-every", "2", "--batch-size", "2", "--tokens", "25%", "--out", str(out),
            "--features", str(out.parent / "features"), "--no-progress", *extra]


def test_train_never_replaces_an_earlier_run_silently(pages, tmp_path):
    out = tmp_path / "run"
    code, _, err = run_cli(train_argv(pages, out, "--resume"))
    assert (code, err.strip()) == (2, f"arr-coc: error: --resume: {out} holds no checkpoint.pt to continue from; "
                                      "drop --resume to start a new run")
    assert not out.exists()  # refused before any work
    assert run_cli(train_argv(pages, out))[0] == 0
    kept = {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    code, _, err = run_cli(train_argv(pages, out))  # the same command again
    assert (code, err.strip()) == (2, f"arr-coc: error: {out} holds an earlier run's checkpoint.pt; rerun with "
                                      "--resume to continue it or --fresh to replace it, or pass another --out")
    assert {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()} == kept
    code, _, err = run_cli(train_argv(pages, out, "--resume", "--fresh"))
    assert (code, err.strip()) == (2, "arr-coc: error: --resume continues the run in OUT and --fresh replaces it; "
                                      "pass one of them")
    assert run_cli(train_argv(pages, out, "--resume"))[0] == 0  # finished at step 2: resumes, nothing to redo
    (out / "scorer.pt").write_bytes(b"weights of an older arr-coc")
    assert run_cli(train_argv(pages, out, "--fresh", "--seed", "1"))[0] == 0
    assert not (out / "scorer.pt").exists()
    assert json.loads((out / "config.json").read_text())["train"]["seed"] == 1


def test_train_into_a_full_disk_ends_in_one_line_and_leaves_no_temporary(pages, tmp_path, monkeypatch):
    import errno

    from arr_coc.weights import files

    def opener(path):
        if "checkpoint" in path.name:
            raise OSError(errno.ENOSPC, "No space left on device")
        return open(path, "wb")

    monkeypatch.setattr(files, "open_temp", opener)
    out = tmp_path / "run"
    code, _, err = run_cli(train_argv(pages, out))
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert err.startswith(f"arr-coc: error: {out / 'checkpoint.pt'}: no space left on device while writing it (")
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]


def test_a_checkpoint_that_does_not_fit_the_run_is_one_line(pages, tmp_path):
    out = tmp_path / "run"
    assert run_cli(train_argv(pages, out))[0] == 0
    ckpt = torch.load(out / "checkpoint.pt", weights_only=True)
    del ckpt["optimizer"]
    torch.save(ckpt, out / "checkpoint.pt")
    code, _, err = run_cli(train_argv(pages, out, "--resume", "--steps", "4"))
    assert (code, err.strip()) == (2, f"arr-coc: error: {out / 'checkpoint.pt'}: lacks the field 'optimizer'; rerun "
                                      "with --fresh to start afresh")
    ckpt["optimizer"] = {}
    name = next(iter(ckpt["objective"]))
    ckpt["objective"][name] = torch.zeros(7, 7)
    torch.save(ckpt, out / "checkpoint.pt")
    code, _, err = run_cli(train_argv(pages, out, "--resume", "--steps", "4"))
    assert code == 2 and err.strip().startswith(f"arr-coc: error: {out / 'checkpoint.pt'}: objective.{name} has shape "
                                                "[7, 7], the model's is [")
