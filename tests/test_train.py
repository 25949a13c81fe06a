"""Training the scorer: features cache, proxy objective, held-out metrics, checkpoints, DDP, export."""
import argparse
import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from arr_coc.train import features as feats
from arr_coc.cli import main
from arr_coc.config import ARRConfig, SamplerConfig, ScorerConfig, TextureConfig
from arr_coc.data.datasets import load_dataset, split_of
from arr_coc.train.features import build_examples, cell_target
from arr_coc.pipeline import ARR
from arr_coc.query import HashingQueryEncoder
from arr_coc.texture import MVP_CHANNELS
from arr_coc.train.loop import TrainConfig, batch_indices, load_checkpoint, train

CONFIG = ARRConfig(texture=TextureConfig(channels=MVP_CHANNELS), scorer=ScorerConfig(weights="none"))


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """Pages of busy texture where the answer is a smooth bright patch: the hand-set priors (edges,
    saliency) look everywhere but there, so there is something to learn."""
    root = tmp_path_factory.mktemp("synthetic")
    rng = np.random.default_rng(0)
    lines = []
    for i in range(24):
        img = (rng.random((168, 224, 3)) * 255).astype(np.uint8)  # 6 x 8 cells of 28 px of noise
        y, x = int(rng.integers(0, 4)) * 28, int(rng.integers(0, 6)) * 28
        img[y:y + 56, x:x + 56] = 235
        Image.fromarray(img).save(root / f"p{i}.png")
        lines.append(json.dumps({"image": f"p{i}.png", "question": "Where is the bright patch?", "answer": "",
                                 "boxes": [[x, y, x + 56, y + 56]], "id": f"p{i}", "image_id": f"p{i}"}))
    (root / "pages.jsonl").write_text("\n".join(lines))
    return root / "pages.jsonl"


@pytest.fixture(scope="module")
def examples(dataset, tmp_path_factory):
    arr = ARR(CONFIG, query_encoder=HashingQueryEncoder())
    return build_examples(arr, load_dataset("jsonl", dataset), tmp_path_factory.mktemp("features"), progress=False)


def cfg(tmp_path, **kw):
    base = dict(datasets=("jsonl",), budget="25%", steps=40, batch_size=4, lr=0.05, eval_every=10,
                out=str(tmp_path / "run"), features=str(tmp_path / "features"), progress=False)
    return TrainConfig(**{**base, **kw})


def test_cell_target_is_the_exact_covered_share():
    t = cell_target([(14, 0, 28, 42)], (2, 2), 28)  # lower half of row 0, 1.5 cells wide
    assert t.tolist() == [[0.5, 0.25], [0.0, 0.0]]


def test_features_are_computed_once_per_image_and_keyed_by_channels(dataset, tmp_path, monkeypatch):
    arr = ARR(CONFIG, query_encoder=HashingQueryEncoder())
    records = load_dataset("jsonl", dataset)[:3]
    first = build_examples(arr, records, tmp_path, progress=False)
    assert [e.record_id for e in first] == ["p0", "p1", "p2"]
    assert first[0].cells.shape[1:] == first[0].target.shape == (6, 8) and first[0].target.sum() == 4
    monkeypatch.setattr(feats, "image_features", lambda *a: pytest.fail("recomputed a cached image"))
    again = build_examples(arr, records, tmp_path, progress=False)
    assert all(torch.equal(a.cells, b.cells) for a, b in zip(first, again))
    other = ARR(replace(CONFIG, texture=TextureConfig(channels=("rgb", "edges"))), query_encoder=HashingQueryEncoder())
    assert feats.cache_key(other) != feats.cache_key(arr)  # another channel set never reads these files


def test_batches_cover_every_example_each_epoch_and_depend_only_on_the_step():
    seen = [i for s in range(6) for i in batch_indices(s, 12, 4, seed=3)]
    assert sorted(seen) == sorted(list(range(12)) * 2)
    assert batch_indices(4, 12, 4, seed=3) == batch_indices(4, 12, 4, seed=3) != batch_indices(4, 12, 4, seed=4)


def test_split_is_by_image_and_stable():
    ids = [f"img{i}" for i in range(400)]
    splits = [split_of(i, "funsd") for i in ids]
    assert splits == [split_of(i, "funsd") for i in ids]
    share = {s: splits.count(s) / 400 for s in ("train", "val", "test")}
    assert 0.5 < share["train"] < 0.7 and 0.08 < share["val"] < 0.22 and 0.18 < share["test"] < 0.32


def test_training_beats_the_hand_set_scorer_on_held_out_pages(examples, tmp_path):
    run = train(cfg(tmp_path), CONFIG, examples=examples)
    m = run.metrics
    assert m["examples"]["train"] > 0 and m["examples"]["test"] > 0
    first = sum(h["loss"] for h in run.history[:5]) / 5
    last = sum(h["loss"] for h in run.history[-5:]) / 5
    assert last < 0.8 * first
    assert m["learned"]["test"]["iou"] >= 2 * m["initial"]["test"]["iou"]  # the seeds' success criterion
    assert m["learned"]["test"]["iou"] > m["random"]["test"]["iou"]
    out = Path(tmp_path / "run")
    assert {p.name for p in out.iterdir()} >= {"scorer.pt", "metrics.json", "loss.png", "checkpoint.pt", "config.json"}
    assert [h["step"] for h in run.history if "val" in h] == [10, 20, 30, 40]


@pytest.mark.parametrize("estimator", ["gumbel", "straight_through"])
def test_other_estimators_train_too(examples, tmp_path, estimator):
    run = train(cfg(tmp_path, steps=3, estimator=estimator, eval_every=3), CONFIG, examples=examples)
    assert all(np.isfinite(h["loss"]) for h in run.history) and len(run.history) == 3


def test_resume_gives_the_losses_of_an_uninterrupted_run(examples, tmp_path):
    whole = train(cfg(tmp_path / "a", steps=8, eval_every=4, estimator="gumbel"), CONFIG, examples=examples)
    train(cfg(tmp_path / "b", steps=4, eval_every=4, estimator="gumbel"), CONFIG, examples=examples)
    resumed = train(cfg(tmp_path / "b", steps=8, eval_every=4, estimator="gumbel", resume=True), CONFIG,
                    examples=examples)
    assert [h["loss"] for h in resumed.history] == [h["loss"] for h in whole.history]
    assert len(resumed.history) == 8


def test_bad_checkpoints_are_clear_errors(examples, tmp_path):
    c = cfg(tmp_path, steps=2, eval_every=2)
    train(c, CONFIG, examples=examples)
    ckpt = Path(c.out) / "checkpoint.pt"
    minilm = "MiniLMQueryEncoder"  # train()'s default encoder
    assert load_checkpoint(ckpt, c, CONFIG, minilm)["step"] == 2
    with pytest.raises(ValueError, match=r"different configuration \(lr\)"):
        load_checkpoint(ckpt, replace(c, lr=0.5), CONFIG, minilm)
    with pytest.raises(ValueError, match="different configuration .*arr_config"):
        load_checkpoint(ckpt, c, replace(CONFIG, seed=5), minilm)
    with pytest.raises(ValueError, match="query encoder MiniLMQueryEncoder -> HashingQueryEncoder"):
        train(replace(c, resume=True, steps=4), CONFIG, examples=examples, query_encoder=HashingQueryEncoder())
    ckpt.write_bytes(ckpt.read_bytes()[:100])
    with pytest.raises(ValueError, match="cannot be read as an arr-coc training checkpoint.*delete it"):
        train(replace(c, resume=True, steps=4), CONFIG, examples=examples)
    torch.save({"format": "arr-coc-train/1", "step": argparse.Namespace(step=1)}, ckpt)  # an object, not a value
    with pytest.raises(ValueError, match="cannot be read as an arr-coc training checkpoint"):  # weights_only refuses it
        load_checkpoint(ckpt, c, CONFIG, minilm)
    torch.save({"hello": 1}, ckpt)
    with pytest.raises(ValueError, match="not an arr-coc training checkpoint"):
        load_checkpoint(ckpt, c, CONFIG, minilm)


def test_exported_weights_load_into_arr_and_refuse_other_channels(examples, tmp_path):
    c = cfg(tmp_path, steps=5, eval_every=5)
    train(c, CONFIG, examples=examples, query_encoder=HashingQueryEncoder())  # the examples' encoder
    path = Path(c.out) / "scorer.pt"
    with pytest.raises(ValueError, match="trained on questions embedded by HashingQueryEncoder, this ARR uses "
                                         "MiniLMQueryEncoder"):
        ARR(replace(CONFIG, scorer=ScorerConfig(weights=str(path))))
    trained = ARR(replace(CONFIG, scorer=ScorerConfig(weights=str(path))), query_encoder=HashingQueryEncoder())
    assert trained.weights_source == str(path)
    saved = torch.load(path, weights_only=True)
    for k, v in saved["scorer"].items():
        assert torch.equal(trained.scorer.state_dict()[k], v)
    hand = ARR(CONFIG, query_encoder=HashingQueryEncoder())
    assert any(not torch.equal(hand.scorer.state_dict()[k], v) for k, v in saved["scorer"].items())
    with pytest.raises(ValueError, match="holds a 'contextual' scorer for channels"):
        ARR(ARRConfig(texture=TextureConfig(channels=("rgb", "edges")), scorer=ScorerConfig(weights=str(path))),
            query_encoder=HashingQueryEncoder())
    with pytest.raises(ValueError, match="none.pt: no such file; expected scorer weights"):
        ARR(replace(CONFIG, scorer=ScorerConfig(weights=str(tmp_path / "none.pt"))), query_encoder=HashingQueryEncoder())


def test_cli_train_reports_held_out_iou_and_exports(dataset, tmp_path, capsys):
    argv = ["train", "--datasets", "jsonl", "--data", str(dataset), "--channels", "mvp", "--query-encoder",
            "hashing", "--steps", "6", "--eval-every", "3", "--batch-size", "4", "--budget", "25%",
            "--out", str(tmp_path / "run"), "--features", str(tmp_path / "f"), "--no-progress",
            "--export", str(tmp_path / "w.pt")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "test  IoU    initial" in out and "learned" in out and "random" in out
    assert (tmp_path / "w.pt").exists()
    assert main(argv[:-2] + ["--batch-size", "3", "--resume"]) == 2  # changed setting: refused, clearly
    assert "different configuration (batch_size)" in capsys.readouterr().err


@pytest.mark.slow
def test_torchrun_with_two_processes_takes_the_steps_of_one(dataset, tmp_path):
    assert shutil.which("torchrun", path=str(Path(sys.executable).parent)), "torchrun (part of torch) is missing"
    common = ["--datasets", "jsonl", "--data", str(dataset), "--channels", "mvp", "--query-encoder", "hashing",
              "--steps", "4", "--eval-every", "2", "--batch-size", "4", "--budget", "25%", "--estimator", "gumbel",
              "--features", str(tmp_path / "f"), "--no-progress"]
    assert main(["train", *common, "--out", str(tmp_path / "one")]) == 0
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [str(Path(sys.executable).parent / "torchrun"), "--nproc_per_node", "2", "--master_port", "29517",
           "-m", "arr_coc.cli", "train", *common, "--out", str(tmp_path / "two")]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    one = torch.load(tmp_path / "one" / "scorer.pt", weights_only=True)
    two = torch.load(tmp_path / "two" / "scorer.pt", weights_only=True)
    assert two["metrics"]["processes"] == 2
    for k, v in one["scorer"].items():
        torch.testing.assert_close(two["scorer"][k], v, atol=1e-5, rtol=1e-5)
    init = ARR(CONFIG, query_encoder=HashingQueryEncoder()).scorer.state_dict()
    moved = [k for k, v in one["scorer"].items() if not torch.equal(v, init[k])]
    assert moved  # the comparison is between trained weights, not two untouched initialisations


def test_answer_cross_entropy_through_a_frozen_tiny_vlm_decreases(dataset, tmp_path):
    rows = [json.loads(line) for line in dataset.read_text().splitlines()]
    answered = tmp_path / "answered.jsonl"
    answered.write_text("\n".join(json.dumps({**r, "image": str(dataset.parent / r["image"]), "answer": "patch"})
                                  for r in rows))
    arr = ARR(CONFIG, query_encoder=HashingQueryEncoder())
    examples = build_examples(arr, load_dataset("jsonl", answered), tmp_path / "f", progress=False)
    run = train(cfg(tmp_path, objective="vlm", vlm="tiny:qwen2_5_vl", steps=16, eval_every=8, lr=0.1,
                    coverage_weight=0.0), CONFIG, examples=examples, query_encoder=HashingQueryEncoder())
    ce = [h["answer_ce"] for h in run.history]
    assert all(np.isfinite(ce)) and sum(ce[-4:]) / 4 < sum(ce[:4]) / 4
    with pytest.raises(ValueError, match="objective 'vlm' needs --vlm"):
        train(cfg(tmp_path, objective="vlm"), CONFIG, examples=examples)


@pytest.mark.parametrize("sampler", ["log_polar", "adaptive_stratified"])
def test_learnable_sampler_parameters_train_and_ship_with_the_scorer(examples, tmp_path, sampler):
    config = replace(CONFIG, sampler=SamplerConfig(name=sampler))
    c = cfg(tmp_path, steps=4, eval_every=4, lr=0.05)
    train(c, config, examples=examples)
    saved = torch.load(Path(c.out) / "scorer.pt", weights_only=True)
    init = ARR(config, query_encoder=HashingQueryEncoder()).sampler.state_dict()
    assert saved["sampler"].keys() == init.keys()
    assert any(not torch.equal(saved["sampler"][k], v) for k, v in init.items())  # the sampler learned too
    loaded = ARR(replace(config, scorer=ScorerConfig(weights=str(Path(c.out) / "scorer.pt"))),
                 query_encoder=HashingQueryEncoder())
    assert all(torch.equal(loaded.sampler.state_dict()[k], v) for k, v in saved["sampler"].items())


def test_arr_loads_the_shipped_weights_only_where_they_fit():
    from arr_coc.weights import PACKAGED

    shipped = PACKAGED / "contextual.pt"
    assert shipped.exists(), "the trained default scorer ships inside the package"
    arr = ARR(ARRConfig(), query_encoder=HashingQueryEncoder())  # default channels, weights="auto"
    assert arr.weights_source == "trained, shipped: arr_coc/weights/contextual.pt"
    saved = torch.load(shipped, weights_only=True)
    assert saved["metrics"]["learned"]["test"]["iou"] > saved["metrics"]["initial"]["test"]["iou"]
    assert all(torch.equal(arr.scorer.state_dict()[k], v) for k, v in saved["scorer"].items())
    mvp = ARR(ARRConfig(texture=TextureConfig(channels=MVP_CHANNELS)), query_encoder=HashingQueryEncoder())
    assert mvp.weights_source == "hand-set"  # trained on other channels: not applicable, not forced
    assert ARR(ARRConfig(scorer=ScorerConfig(weights="none")), query_encoder=HashingQueryEncoder()).weights_source \
        == "hand-set"


@pytest.mark.parametrize("learner", ["pruner", "selector"])
def test_patch_selector_and_token_pruner_train_export_and_reload(examples, tmp_path, learner):
    from arr_coc.allocators.pruning import load_learned
    from arr_coc.train.loop import Learner, hard_metrics

    run = train(cfg(tmp_path, learner=learner, steps=60), CONFIG, examples=examples)
    m = run.metrics
    # the bright patch is 4 of 48 cells: 12 cells (25%) at random cover it ~25%; learned, nearly all
    assert m["learned"]["test"]["coverage"] > 0.8 > m["random"]["test"]["coverage"]
    assert m["learned"]["test"]["coverage"] > m["initial"]["test"]["coverage"] + 0.3
    saved = Path(tmp_path / "run" / f"{learner}.pt")
    assert not (tmp_path / "run" / "scorer.pt").exists()
    arr = ARR(CONFIG, query_encoder=HashingQueryEncoder())
    net, meta = load_learned(learner, saved, channels=arr.channels, query_dim=arr.query_encoder.dim, cell=28)
    assert meta["metrics"]["learned"] == m["learned"] and meta["channels"] == list(arr.channels)
    test = [e for e in examples if split_of(e.image_id, e.dataset) == "test"]
    assert hard_metrics(Learner(learner, net), test, "25%") == m["learned"]["test"]  # the file is the model


def test_unknown_learner_is_a_clear_error(examples, tmp_path):
    with pytest.raises(ValueError, match="unknown learner 'oracle'; choose one of scorer, selector, pruner"):
        train(cfg(tmp_path, learner="oracle"), CONFIG, examples=examples)
