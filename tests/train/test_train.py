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
from tolerances import TRAIN_GRAD, TRAIN_LOSS, assert_close_reduction, assert_far

from arr_coc.cli import main
from arr_coc.config import ARRConfig, SamplerConfig, ScorerConfig, TextureConfig
from arr_coc.data.datasets import load_dataset, split_of
from arr_coc.engine.pipeline import ARR
from arr_coc.engine.query import HashingQueryEncoder
from arr_coc.engine.texture import MVP_CHANNELS
from arr_coc.train import TrainConfig, batch_indices, load_checkpoint, train
from arr_coc.train import features as feats
from arr_coc.train.features import build_examples, cell_target
from arr_coc.weights import LEARNED_FORMAT, MODEL, SCORER_FORMAT, read_weights

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


@pytest.fixture(scope="module")
def answered(dataset, tmp_path_factory):
    """The same pages as VQAv2-style JSONL: several answers each, no boxes (the answer objective needs none)."""
    rows = [json.loads(line) for line in dataset.read_text().splitlines()]
    path = tmp_path_factory.mktemp("vqa") / "vqa.jsonl"
    path.write_text("\n".join(json.dumps({"image": str(dataset.parent / r["image"]), "question": r["question"],
                                          "answers": [{"answer": "patch"}, {"answer": "square"}, {"answer": "patch"}],
                                          "image_id": r["image_id"]}) for r in rows))
    return path


@pytest.fixture(scope="module")
def answered_examples(answered, tmp_path_factory):
    arr = ARR(CONFIG, query_encoder=HashingQueryEncoder())
    return build_examples(arr, load_dataset("jsonl", answered), tmp_path_factory.mktemp("features"), progress=False)


def weights(folder):
    """A scorer weights folder's contents (tensors and settings)."""
    return read_weights(folder, (SCORER_FORMAT, LEARNED_FORMAT), "weights")


def cfg(tmp_path, **kw):
    base = dict(datasets=("jsonl",), tokens="25%", steps=40, batch_size=4, lr=0.05, eval_every=10,
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
    assert {p.name for p in out.iterdir()} >= {"scorer", "metrics.json", "loss.png", "checkpoint.pt", "config.json"}
    assert sorted(p.name for p in (out / "scorer").iterdir()) == ["config.json", "model.safetensors"]
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
    # negative control: a run that ignored the checkpoint would repeat ``whole`` exactly (same seed, same
    # batches); a checkpoint moved off that path (its weights shifted, its losses marked) must be continued
    ckpt_path = tmp_path / "c" / "run" / "checkpoint.pt"
    train(cfg(tmp_path / "c", steps=4, eval_every=4, estimator="gumbel"), CONFIG, examples=examples)
    ckpt = torch.load(ckpt_path, weights_only=True)
    noise = torch.Generator().manual_seed(1)  # not a constant shift, which softmax and top-K would ignore
    ckpt["objective"] = {k: v + 0.5 * torch.randn(v.shape, generator=noise) if v.is_floating_point() else v
                         for k, v in ckpt["objective"].items()}
    ckpt["history"] = [{**h, "loss": -1.0} for h in ckpt["history"]]
    torch.save(ckpt, ckpt_path)
    moved = train(cfg(tmp_path / "c", steps=8, eval_every=4, estimator="gumbel", resume=True), CONFIG,
                  examples=examples)
    assert [h["loss"] for h in moved.history[:4]] == [-1.0] * 4  # the checkpoint's own history, kept
    losses = [(a["loss"], b["loss"]) for a, b in zip(moved.history[4:], whole.history[4:])]
    assert len(losses) == 4 and all(abs(a - b) > 1e-4 for a, b in losses), losses


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
    with pytest.raises(ValueError, match="cannot be read as an arr-coc training checkpoint.*rerun with --fresh"):
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
    path = Path(c.out) / "scorer"
    with pytest.raises(ValueError, match="trained on questions embedded by HashingQueryEncoder, this ARR uses "
                                         "MiniLMQueryEncoder"):
        ARR(replace(CONFIG, scorer=ScorerConfig(weights=str(path))))
    trained = ARR(replace(CONFIG, scorer=ScorerConfig(weights=str(path))), query_encoder=HashingQueryEncoder())
    assert trained.weights_source == str(path)
    saved = weights(path)
    for k, v in saved["scorer"].items():
        assert torch.equal(trained.scorer.state_dict()[k], v)
    hand = ARR(CONFIG, query_encoder=HashingQueryEncoder())
    assert any(not torch.equal(hand.scorer.state_dict()[k], v) for k, v in saved["scorer"].items())
    with pytest.raises(ValueError, match="holds a 'contextual' scorer for channels"):
        ARR(ARRConfig(texture=TextureConfig(channels=("rgb", "edges")), scorer=ScorerConfig(weights=str(path))),
            query_encoder=HashingQueryEncoder())
    with pytest.raises(ValueError, match="none.pt: no such file; expected scorer weights"):
        ARR(replace(CONFIG, scorer=ScorerConfig(weights=str(tmp_path / "none.pt"))), query_encoder=HashingQueryEncoder())


def test_cli_train_reports_held_out_iou_and_exports(dataset, tmp_path, capsys, monkeypatch):
    from arr_coc.weights import catalog as registry
    from arr_coc.weights import entries

    argv = ["train", "--datasets", "jsonl", "--data", str(dataset), "--channels", "mvp", "--query-encoder",
            "hashing", "--steps", "6", "--eval-every", "3", "--batch-size", "4", "--tokens", "25%",
            "--out", str(tmp_path / "run"), "--features", str(tmp_path / "f"), "--no-progress",
            "--export", str(tmp_path / "w")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "test  IoU    initial" in out and "learned" in out and "random" in out
    assert (tmp_path / "w" / MODEL).read_bytes() == (tmp_path / "run" / "scorer" / MODEL).read_bytes()
    # a name publishes into the registry (here a stand-in folder): the finished run resumes and exports
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    monkeypatch.setattr(registry, "PACKAGED", shipped)
    assert main(argv[:-2] + ["--resume", "--export", "mine"]) == 0
    assert "shipped as 'mine': --scorer-weights mine loads it" in capsys.readouterr().out
    assert (shipped / "mine" / MODEL).read_bytes() == (tmp_path / "run" / "scorer" / MODEL).read_bytes()
    entry = entries()["mine"]
    assert entry.trained_on["datasets"] == ["jsonl"] and entry.settings["train"]["steps"] == 6
    mine = ARR(replace(CONFIG, scorer=ScorerConfig(weights="mine")), query_encoder=HashingQueryEncoder())
    assert mine.weights_source == "trained, shipped: arr_coc/weights/mine"
    first = weights(tmp_path / "w")  # resumed at its last step: the same weights
    assert all(torch.equal(mine.scorer.state_dict()[k], v) for k, v in first["scorer"].items())
    assert main(argv[:-2] + ["--batch-size", "3", "--resume"]) == 2  # changed setting: refused, clearly
    assert "different configuration (batch_size)" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["proxy", "vlm"])
def test_torchrun_with_two_processes_takes_the_steps_of_one(dataset, answered, tmp_path, objective):
    assert shutil.which("torchrun", path=str(Path(sys.executable).parent)), "torchrun (part of torch) is missing"
    data = dataset if objective == "proxy" else answered
    common = ["--datasets", "jsonl", "--data", str(data), "--channels", "mvp", "--query-encoder", "hashing",
              "--steps", "4", "--eval-every", "2", "--batch-size", "4", "--tokens", "25%", "--estimator", "gumbel",
              "--features", str(tmp_path / "f"), "--no-progress"]
    if objective == "vlm":  # the answer objective, each rank's two examples as two accumulated micro-batches
        common += ["--objective", "vlm", "--vlm", "tiny:qwen2_5_vl", "--accumulate", "2", "--lr", "0.1"]
    assert main(["train", *common, "--out", str(tmp_path / "one")]) == 0
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [str(Path(sys.executable).parent / "torchrun"), "--nproc_per_node", "2", "--master_port", "29517",
           "-m", "arr_coc.cli", "train", *common, "--out", str(tmp_path / "two")]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    one, two = weights(tmp_path / "one" / "scorer"), weights(tmp_path / "two" / "scorer")
    assert two["metrics"]["processes"] == 2
    for k, v in one["scorer"].items():  # 4 steps; two ranks' gradients summed in another order
        assert_close_reduction(two["scorer"][k], v, reduction_len=4 * TRAIN_GRAD["reduction_len"])
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
        train(cfg(tmp_path / "no_vlm", objective="vlm"), CONFIG, examples=examples)


@pytest.mark.parametrize("sampler", ["log_polar", "adaptive_stratified"])
def test_learnable_sampler_parameters_train_and_ship_with_the_scorer(examples, tmp_path, sampler):
    config = replace(CONFIG, sampler=SamplerConfig(name=sampler))
    c = cfg(tmp_path, steps=4, eval_every=4, lr=0.05)
    train(c, config, examples=examples, query_encoder=HashingQueryEncoder())  # the examples' questions are hashed
    saved = weights(Path(c.out) / "scorer")
    assert saved["query_encoder"] == "HashingQueryEncoder"
    init = ARR(config, query_encoder=HashingQueryEncoder()).sampler.state_dict()
    assert saved["sampler"].keys() == init.keys()
    assert any(not torch.equal(saved["sampler"][k], v) for k, v in init.items())  # the sampler learned too
    loaded = ARR(replace(config, scorer=ScorerConfig(weights=str(Path(c.out) / "scorer"))),
                 query_encoder=HashingQueryEncoder())
    assert all(torch.equal(loaded.sampler.state_dict()[k], v) for k, v in saved["sampler"].items())


def test_arr_loads_the_shipped_weights_only_where_they_fit():
    from arr_coc.weights import PACKAGED

    shipped = PACKAGED / "contextual"
    assert (shipped / MODEL).exists(), "the trained default scorer ships inside the package"
    arr = ARR(ARRConfig())  # default channels and query encoder (MiniLM, loaded lazily), weights="auto"
    assert arr.weights_source == "trained, shipped: arr_coc/weights/contextual"
    # trained on MiniLM questions: under another query encoder they do not apply, so they are not forced
    assert ARR(ARRConfig(), query_encoder=HashingQueryEncoder()).weights_source == "hand-set"
    saved = weights(shipped)
    assert saved["metrics"]["learned"]["test"]["iou"] > saved["metrics"]["initial"]["test"]["iou"]
    assert all(torch.equal(arr.scorer.state_dict()[k], v) for k, v in saved["scorer"].items())
    mvp = ARR(ARRConfig(texture=TextureConfig(channels=MVP_CHANNELS)), query_encoder=HashingQueryEncoder())
    assert mvp.weights_source == "hand-set"  # trained on other channels: not applicable, not forced
    assert ARR(ARRConfig(scorer=ScorerConfig(weights="none")), query_encoder=HashingQueryEncoder()).weights_source \
        == "hand-set"


@pytest.mark.parametrize("learner", ["pruner", "selector"])
def test_patch_selector_and_token_pruner_train_export_and_reload(examples, tmp_path, learner):
    from arr_coc.train import Learner, hard_metrics
    from arr_coc.weights import load_learned

    run = train(cfg(tmp_path, learner=learner, steps=60), CONFIG, examples=examples)
    m = run.metrics
    # the bright patch is 4 of 48 cells: 12 cells (25%) at random cover it ~25%; learned, nearly all
    assert m["learned"]["test"]["coverage"] > 0.8 > m["random"]["test"]["coverage"]
    assert m["learned"]["test"]["coverage"] > m["initial"]["test"]["coverage"] + 0.3
    saved = Path(tmp_path / "run" / learner)
    assert not (tmp_path / "run" / "scorer").exists()
    arr = ARR(CONFIG, query_encoder=HashingQueryEncoder())
    net, meta = load_learned(learner, saved, channels=arr.channels, query_dim=arr.query_encoder.dim, cell=28)
    assert meta["metrics"]["learned"] == m["learned"] and meta["channels"] == list(arr.channels)
    test = [e for e in examples if split_of(e.split_group, e.dataset) == "test"]
    assert hard_metrics(Learner(learner, net), test, "25%") == m["learned"]["test"]  # the file is the model


def test_unknown_learner_is_a_clear_error(examples, tmp_path):
    with pytest.raises(ValueError, match="unknown learner 'oracle'; choose one of scorer, selector, pruner"):
        train(cfg(tmp_path, learner="oracle"), CONFIG, examples=examples)


# ----------------------------------------------------------------------------- the answer objective at scale


def vlm_cfg(tmp_path, **kw):
    return cfg(tmp_path, **{**dict(objective="vlm", vlm="tiny:qwen2_5_vl", steps=2, eval_every=2, lr=0.1,
                                   estimator="gumbel"), **kw})


def trained(run_dir):
    return weights(Path(run_dir) / "scorer")["scorer"]


def test_vqa_jsonl_without_boxes_trains_the_answer_objective_and_refuses_the_proxy(answered, answered_examples,
                                                                                   tmp_path, capsys):
    assert all(e.answer == "patch" and float(e.target.sum()) == 0 for e in answered_examples)
    run = train(vlm_cfg(tmp_path), CONFIG, examples=answered_examples, query_encoder=HashingQueryEncoder())
    assert all(np.isfinite(h["answer_ce"]) for h in run.history)
    with pytest.raises(ValueError, match="objective 'proxy' needs answer boxes, and no training example has any"):
        train(cfg(tmp_path / "proxy"), CONFIG, examples=answered_examples)
    argv = ["train", "--datasets", "jsonl", "--data", str(answered), "--channels", "mvp", "--query-encoder",
            "hashing", "--features", str(tmp_path / "f"), "--out", str(tmp_path / "p"), "--no-progress"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "arr-coc: error: objective 'proxy' needs answer boxes, but 24 jsonl records have none" in err
    assert "--objective vlm --vlm PATH_OR_ID" in err


def batch_gradient(examples, accumulate, **kw):
    """The scorer's gradient and the loss of one training batch taken in ``accumulate`` micro-batches."""
    from arr_coc.train import Learner, Objective
    from arr_coc.train.loop import _frozen_vlm
    from arr_coc.train.loop import accumulate as take

    c = vlm_cfg(Path("unused"), accumulate=accumulate, **kw)
    arr = ARR(CONFIG, query_encoder=HashingQueryEncoder())
    objective = Objective(Learner.build("scorer", arr, examples[0].cells.shape[0]), arr.sampler, c,
                          _frozen_vlm(c, CONFIG), CONFIG.canvas)
    loss, parts = take(objective, examples[:c.batch_size], c, step=3, world=1)
    return float(loss), parts, {k: p.grad.clone() for k, p in objective.named_parameters() if p.grad is not None}


def test_accumulated_micro_batches_take_the_gradient_of_one_batch(answered_examples, tmp_path):
    loss, parts, grad = batch_gradient(answered_examples, 1)
    assert grad and max(float(g.abs().max()) for g in grad.values()) > 1e-3
    for n in (2, 4):
        loss_n, parts_n, grad_n = batch_gradient(answered_examples, n)
        assert_close_reduction(loss_n, loss, **TRAIN_LOSS)
        assert_close_reduction(parts_n["answer_ce"], parts["answer_ce"], **TRAIN_LOSS)
        atol = max(assert_close_reduction(grad_n[k], g, **TRAIN_GRAD) for k, g in grad.items())
    # negative control: half the batch is another gradient
    _, _, half = batch_gradient(answered_examples, 1, batch_size=2)
    assert_far(torch.cat([half[k].flatten() for k in grad]), torch.cat([g.flatten() for g in grad.values()]),
               atol=atol)
    with pytest.raises(ValueError, match="--accumulate 3 must split each process's 4 examples"):
        train(vlm_cfg(tmp_path, accumulate=3), CONFIG, examples=answered_examples)
    run = train(vlm_cfg(tmp_path, accumulate=2), CONFIG, examples=answered_examples, query_encoder=HashingQueryEncoder())
    assert len(run.history) == 2 and all(np.isfinite(h["loss"]) for h in run.history)


def saved_for_backward(run):
    """``run()``'s result and the bytes autograd saved for backward, seen through torch's public pack hook.

    Non-reentrant checkpointing stores a checkpointed layer's activations through its own inner hook
    (recomputed in backward), so they never reach this outer one: fewer bytes prove checkpointing ran.
    """
    saved = [0]

    def pack(t):
        saved[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = run()
    return out, saved[0]


def test_checkpointing_bfloat16_and_candidates_in_the_training_loop(answered_examples, tmp_path):
    plain, plain_bytes = saved_for_backward(lambda: train(vlm_cfg(tmp_path / "a"), CONFIG, examples=answered_examples,
                                                          query_encoder=HashingQueryEncoder()))
    ck, ck_bytes = saved_for_backward(lambda: train(vlm_cfg(tmp_path / "ck", gradient_checkpointing=True), CONFIG,
                                                    examples=answered_examples, query_encoder=HashingQueryEncoder()))
    assert 0 < ck_bytes < 0.5 * plain_bytes, (ck_bytes, plain_bytes)  # the decoder layers' activations were not kept
    steps = len(plain.history)
    assert_close_reduction(torch.tensor([h["loss"] for h in ck.history]),
                           torch.tensor([h["loss"] for h in plain.history]), **TRAIN_LOSS)
    for k, v in trained(tmp_path / "a" / "run").items():
        assert_close_reduction(trained(tmp_path / "ck" / "run")[k], v, reduction_len=steps * TRAIN_GRAD["reduction_len"])
    bf16 = train(vlm_cfg(tmp_path / "bf", dtype="bfloat16", gradient_checkpointing=True), CONFIG,
                 examples=answered_examples, query_encoder=HashingQueryEncoder())
    ce, ce16 = plain.history[0]["answer_ce"], bf16.history[0]["answer_ce"]
    assert ce16 != ce  # bfloat16 rounds, and stays near the float32 loss
    assert_close_reduction(ce16, ce, dtype=torch.bfloat16, **TRAIN_LOSS)
    cand = train(vlm_cfg(tmp_path / "c", relaxation="candidates"), CONFIG, examples=answered_examples,
                 query_encoder=HashingQueryEncoder())
    assert all(np.isfinite(h["answer_ce"]) for h in cand.history)
    assert abs(cand.history[0]["answer_ce"] - ce) > 1e-3  # another input reached the VLM: 2K cells, not all
    init = ARR(CONFIG, query_encoder=HashingQueryEncoder()).scorer.state_dict()
    assert any(not torch.equal(v, init[k]) for k, v in trained(tmp_path / "c" / "run").items())
    for bad, message in [(dict(relaxation="all"), "unknown relaxation 'all'; choose one of weighted, candidates"),
                         (dict(dtype="float16"), "unknown dtype 'float16'; choose one of float32, bfloat16"),
                         (dict(candidates=0), "candidates must be >= 1")]:
        with pytest.raises(ValueError, match=message):
            train(vlm_cfg(tmp_path / "bad", **bad), CONFIG, examples=answered_examples)


def test_cli_trains_on_the_docvqa_train_split(dataset, tmp_path, capsys):
    root = tmp_path / "docvqa"
    (root / "spdocvqa_images").mkdir(parents=True)
    items = []
    for i in range(12):
        shutil.copy(dataset.parent / f"p{i}.png", root / "spdocvqa_images" / f"p{i}.png")
        items.append({"questionId": i, "question": "Where is the bright patch?", "image": f"documents/p{i}.png",
                      "answers": ["patch", "the patch"]})
    (root / "spdocvqa_qas").mkdir()
    (root / "spdocvqa_qas" / "train_v1.0_withQT.json").write_text(json.dumps({"data": items}))
    (root / "spdocvqa_qas" / "val_v1.0_withQT.json").write_text(json.dumps({"data": items[:1]}))
    argv = ["train", "--objective", "vlm", "--vlm", "tiny:qwen2_5_vl", "--datasets", "docvqa", "--data", str(root),
            "--split", "train", "--channels", "mvp", "--query-encoder", "hashing", "--steps", "2", "--eval-every", "2",
            "--batch-size", "2", "--gradient-checkpointing", "--relaxation", "candidates", "--features",
            str(tmp_path / "f"), "--out", str(tmp_path / "run"), "--no-progress"]
    assert main(argv) == 0
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert sum(metrics["examples"].values()) == 12  # the train file's 12 questions, not the val file's one
    saved = json.loads((tmp_path / "run" / "config.json").read_text())["train"]
    assert saved["datasets"] == ["docvqa"] and saved["gradient_checkpointing"] and saved["relaxation"] == "candidates"
    capsys.readouterr()
    proxy = ["train", "--datasets", "docvqa", "--data", str(root), "--split", "train", "--channels", "mvp",
             "--query-encoder", "hashing", "--steps", "2", "--batch-size", "2", "--features", str(tmp_path / "f"),
             "--out", str(tmp_path / "p"), "--no-progress"]  # without the VLM's options, which proxy refuses
    assert main(proxy) == 2
    assert "objective 'proxy' needs answer boxes, but 12 docvqa records have none" in capsys.readouterr().err
