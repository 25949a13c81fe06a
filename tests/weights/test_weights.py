"""The registry of shipped weights: entries match their files, names load like paths, publishing, leakage."""
import json
import shutil

import pytest
import torch

from arr_coc import weights as W
from arr_coc.config import ARRConfig, SamplerConfig, ScorerConfig
from arr_coc.engine.pipeline import ARR
from arr_coc.weights import catalog as registry

SHIPPED = ("adaptive_stratified", "contextual", "log_polar", "pruner", "selector")


def test_the_registry_lists_every_shipped_file_and_each_entry_is_what_its_file_holds():
    entries = W.entries()
    assert tuple(sorted(entries)) == SHIPPED
    assert sorted(p.parent.name for p in W.PACKAGED.glob("*/model.safetensors")) == sorted(
        e.file for e in entries.values())
    assert not list(W.PACKAGED.glob("*.pt"))  # every shipped entry is a folder
    for name, entry in entries.items():
        assert W.describe(entry.path, name) == entry, f"registry.json is stale for {name}: re-export it"
        assert entry.trained_on["datasets"] == ["funsd", "sroie", "coco"] and entry.trained_on["images"] == "train"
    assert entries["log_polar"].settings["sampler"] == "log_polar" and entries["log_polar"].kind == "scorer"
    assert entries["contextual"].settings["sampler"] == "topk"
    assert (entries["pruner"].kind, entries["pruner"].format) == ("pruner", W.LEARNED_FORMAT)


def test_a_changed_file_no_longer_matches_its_entry(tmp_path):
    copy = tmp_path / "contextual"
    saved = W.read_weights(W.PACKAGED / "contextual", W.SCORER_FORMAT, "scorer weights")
    saved["scorer"] = {k: v + 1 for k, v in saved["scorer"].items()}
    W.save_folder(saved, copy)
    changed = W.describe(copy, "contextual")
    assert changed.sha256 != W.entry("contextual").sha256
    assert changed.trained_on == W.entry("contextual").trained_on  # same run settings, other numbers


def _state(arr):
    return {**{"s." + k: v for k, v in arr.scorer.state_dict().items()},
            **{"p." + k: v for k, v in arr.sampler.state_dict().items()}}


@pytest.mark.parametrize("name", ["log_polar", "adaptive_stratified"])
def test_trained_sampler_parameters_load_by_name_exactly_as_by_path(name):
    by_name = ARR(ARRConfig(scorer=ScorerConfig(weights=name), sampler=SamplerConfig(name=name)))
    by_path = ARR(ARRConfig(scorer=ScorerConfig(weights=str(W.PACKAGED / name)), sampler=SamplerConfig(name=name)))
    initial = ARR(ARRConfig(scorer=ScorerConfig(weights="none"), sampler=SamplerConfig(name=name)))
    assert by_name.weights_source == f"trained, shipped: arr_coc/weights/{name}"
    assert by_path.weights_source == str(W.PACKAGED / name)
    a, b, c = _state(by_name), _state(by_path), _state(initial)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert any(k.startswith("p.") and not torch.equal(a[k], c[k]) for k in a), "the sampler's parameters trained"
    saved = W.read_weights(W.PACKAGED / name, W.SCORER_FORMAT, "scorer weights")
    assert all(torch.equal(a["p." + k], v) for k, v in saved["sampler"].items())


def test_an_unknown_name_lists_the_shipped_ones():
    with pytest.raises(ValueError, match="no shipped weights named 'nope'; choose one of adaptive_stratified, "
                                         "contextual, log_polar, pruner, selector or give a path"):
        ARR(ARRConfig(scorer=ScorerConfig(weights="nope")))
    with pytest.raises(ValueError, match="no shipped weights named 'nope'"):
        W.load_learned("pruner", "nope")


def test_learned_classes_resolve_to_the_allocators_they_rebuild():
    from arr_coc.allocators.pruning import PatchSelector, TokenPruner

    assert W.loaders._learned_class("selector") is PatchSelector
    assert W.loaders._learned_class("pruner") is TokenPruner
    assert tuple(W.loaders.LEARNED_CLASSES) == W.LEARNED_KINDS


def test_publish_writes_the_folder_and_its_entry_and_refuses_bad_names(tmp_path):
    src = tmp_path / "run" / "scorer"
    shutil.copytree(W.PACKAGED / "log_polar", src)
    entry = W.publish(src, "my_sampler", root=tmp_path)
    assert [(tmp_path / "my_sampler" / f).read_bytes() for f in (W.MODEL, W.CONFIG)] == [
        (src / f).read_bytes() for f in (W.MODEL, W.CONFIG)]
    table = json.loads((tmp_path / "registry.json").read_text())
    assert list(table) == ["my_sampler"] and table["my_sampler"]["sha256"] == W.entry("log_polar").sha256
    assert W.entries(tmp_path)["my_sampler"] == entry
    assert entry.settings == W.entry("log_polar").settings
    with pytest.raises(ValueError, match="weights name 'auto' is reserved"):
        W.publish(src, "auto", root=tmp_path)
    with pytest.raises(ValueError, match="the name 'pruner' is for pruner weights, and .* holds scorer weights"):
        W.publish(src, "pruner", root=tmp_path)
    with pytest.raises(ValueError, match=r"weights name 'a/b' must be letters, digits"):
        W.publish(src, "a/b", root=tmp_path)
    torch.save({"format": "arr-coc-train/1", "step": 3}, tmp_path / "checkpoint.pt")
    with pytest.raises(ValueError, match="checkpoint.pt holds 'arr-coc-train/1', not weights made by `arr-coc train`"):
        W.publish(tmp_path / "checkpoint.pt", "x", root=tmp_path)
    with pytest.raises(ValueError, match=r"registry.json is not a file torch.save wrote \(it begins b'{\\n \"'\); expected weights made by"):
        W.publish(tmp_path / "registry.json", "x", root=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt", "my_sampler", "registry.json", "run"]


def test_shipped_sampler_weights_are_refused_on_the_images_they_trained_on():
    arr = ARR(ARRConfig(scorer=ScorerConfig(weights="log_polar"), sampler=SamplerConfig(name="log_polar")))
    with pytest.raises(ValueError, match=r"shipped scorer weights \(arr_coc/weights/log_polar/\) were trained on "
                                         "the train images of funsd, sroie, coco"):
        W.refuse_leakage("sroie", "val", arr, ("arr",))
    W.refuse_leakage("sroie", "test", arr, ("arr",))  # held out
    W.refuse_leakage("docvqa", None, arr, ("arr",))  # never trained on
    own = ARR(ARRConfig(scorer=ScorerConfig(weights=str(W.PACKAGED / "log_polar")), sampler=SamplerConfig(name="log_polar")))
    W.refuse_leakage("sroie", "val", own, ("arr",))  # a path is the user's own choice, as before


def test_the_registry_is_read_from_where_it_is_published(tmp_path, monkeypatch):
    monkeypatch.setattr(registry, "PACKAGED", tmp_path)
    assert W.entries() == {}
    W.publish(W.PACKAGED / "contextual", "contextual", root=tmp_path)
    assert W.resolve("auto", "contextual") == (tmp_path / "contextual", W.entries()["contextual"])
    assert W.resolve("some/file.pt", "contextual") == (registry.Path("some/file.pt"), None)


def test_leakage_check_and_method_registry_agree_on_what_the_scorer_plays_no_part_in():
    from arr_coc.allocators.methods import METHODS
    from arr_coc.allocators.methods import SCORER_FREE as from_registry
    from arr_coc.weights import SCORER_FREE

    assert set(SCORER_FREE) == set(from_registry)
    assert "random" not in SCORER_FREE and all(not METHODS.get(m).uses_scorer for m in SCORER_FREE)
