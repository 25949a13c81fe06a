"""Weights as the Hub keeps them: folders of model.safetensors + config.json, the conversion of the shipped .pt
files (outputs identical), from_pretrained / save_pretrained, older .pt files with a deprecation line."""
import json
import shutil
import warnings
from importlib import resources
from pathlib import Path

import pytest
import torch

from arr_coc import weights as W
from arr_coc.allocators.pruning import PatchSelector, TokenPruner
from arr_coc.config import ARRConfig, SamplerConfig, ScorerConfig
from arr_coc.engine.pipeline import ARR
from arr_coc.engine.query import HashingQueryEncoder
from arr_coc.weights.convert import check_same, convert_file, convert_registry, main

LEGACY = Path(__file__).parent / "legacy"  # the shipped .pt files as they were before the conversion
SCORERS = ("contextual", "log_polar", "adaptive_stratified")


@pytest.fixture(scope="module")
def image():
    g = torch.Generator().manual_seed(0)
    return torch.rand(3, 224, 280, generator=g)


def allocate(weights, sampler, image, encoder):
    arr = ARR(ARRConfig(scorer=ScorerConfig(weights=str(weights)), sampler=SamplerConfig(name=sampler, saccades=40)),
              query_encoder=encoder).eval()
    with torch.inference_mode():
        a = arr([image], ["Where is the total?"])
    return a.positions, a.scores, a.relevance.map


@pytest.mark.parametrize("name", SCORERS)
def test_converted_scorers_allocate_exactly_as_the_pt_files_did(name, image, tmp_path):
    # the MiniLM-trained files, scored with a hashing encoder of the same width: the check is the numbers, not the model
    encoder = HashingQueryEncoder()
    legacy = LEGACY / f"{name}.pt"
    with pytest.warns(FutureWarning, match=r"\.pt file are deprecated; convert them once with `python -m arr_coc"):
        old = allocate_with(legacy, name, image, encoder)
    folder = convert_file(legacy, tmp_path / name)
    new = allocate_with(folder, name, image, encoder)
    assert all(torch.equal(a, b) for a, b in zip(old, new))
    saved = W.read_weights(folder, W.SCORER_FORMAT, "scorer weights")
    saved["scorer"]["context.2.bias"][0] += 1e-3  # negative control: one number changed, another allocation
    W.save_folder(saved, tmp_path / "perturbed")
    changed = allocate_with(tmp_path / "perturbed", name, image, encoder)
    assert not torch.equal(old[2], changed[2])


def allocate_with(weights, name, image, encoder):
    sampler = name if name != "contextual" else "topk"
    saved = W.read_weights(weights, W.SCORER_FORMAT, "scorer weights")
    saved["query_encoder"] = "HashingQueryEncoder"  # let the hashing encoder in; the tensors are the file's
    folder = Path(str(weights) + ".hashing")
    W.save_folder(saved, folder)
    out = allocate(folder, sampler, image, encoder)
    shutil.rmtree(folder)
    return out


@pytest.mark.parametrize("kind", ["selector", "pruner"])
def test_converted_allocators_score_exactly_as_the_pt_files_did(kind, tmp_path):
    with pytest.warns(FutureWarning, match="deprecated"):
        old, _ = W.load_learned(kind, LEGACY / f"{kind}.pt")
    new, meta = W.load_learned(kind, convert_file(LEGACY / f"{kind}.pt", tmp_path / kind))
    g = torch.Generator().manual_seed(1)
    score = "importance" if kind == "selector" else "score"
    args = (torch.rand(2, 3, 56, 84, generator=g),) if kind == "selector" else (
        torch.randn(2, 6, 16, generator=g), torch.randn(2, 384, generator=g))
    with torch.no_grad():
        assert torch.equal(getattr(old, score)(*args), getattr(new, score)(*args))
        next(iter(new.parameters())).view(-1)[0] += 1e-2  # negative control
        assert not torch.equal(getattr(old, score)(*args), getattr(new, score)(*args))
    assert meta["kind"] == kind and meta["channels"] == W.entry(kind).settings["channels"]


def test_the_shipped_folders_are_the_conversions_of_the_shipped_pt_files(tmp_path):
    converted = [e for e in W.entries().values() if e.converted_from]
    for entry in converted:  # weights retrained since are not conversions: they hold no converted_from
        legacy = LEGACY / entry.converted_from["file"]
        assert W.file_sha256(legacy) == entry.converted_from["sha256"]
        check_same(legacy, entry.path)  # every tensor bit for bit, every setting
    assert {e.name for e in converted} <= {p.stem for p in LEGACY.glob("*.pt")}
    saved = W.read_weights(W.PACKAGED / "pruner", W.LEARNED_FORMAT, "pruner weights")
    saved["state"]["mlp.2.bias"] += 1e-6  # negative control
    W.save_folder(saved, tmp_path / "pruner")
    with pytest.raises(ValueError, match="its state tensors differ from .*pruner.pt's; the conversion is not kept"):
        check_same(LEGACY / "pruner.pt", tmp_path / "pruner")


def test_the_conversion_command_converts_a_registry_in_place_and_checks_it(tmp_path, capsys):
    for name in ("contextual", "pruner"):
        shutil.copyfile(LEGACY / f"{name}.pt", tmp_path / f"{name}.pt")
    table = {n: {**json.loads((W.PACKAGED / "registry.json").read_text())[n], "file": f"{n}.pt",
                 "converted_from": None} for n in ("contextual", "pruner")}
    (tmp_path / "registry.json").write_text(json.dumps(table))
    assert main(["--registry", str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "contextual: contextual.pt -> contextual/ (model.safetensors + config.json)",
        "pruner: pruner.pt -> pruner/ (model.safetensors + config.json)"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["contextual", "pruner", "registry.json"]
    for name, entry in W.entries(tmp_path).items():  # each folder is its .pt, bit for bit, and names it
        legacy = LEGACY / f"{name}.pt"
        assert entry.converted_from == {"file": f"{name}.pt", "sha256": W.file_sha256(legacy)}
        check_same(legacy, tmp_path / entry.file)
    assert convert_registry(tmp_path) == []  # a second run has nothing to do
    assert main([str(tmp_path / "nope.pt")]) == 2
    assert capsys.readouterr().err.strip() == (f"convert: error: {tmp_path / 'nope.pt'}: no such file; expected "
                                               "weights made by `arr-coc train`")


@pytest.mark.slow
def test_from_pretrained_a_shipped_name_is_the_arr_it_was_trained_in():
    arr = ARR.from_pretrained("log_polar")  # MiniLM, as recorded in its config
    assert arr.config.sampler.name == "log_polar" and arr.weights_source == "trained, shipped: arr_coc/weights/log_polar"
    saved = W.read_weights(W.PACKAGED / "log_polar", W.SCORER_FORMAT, "scorer weights")
    assert torch.equal(arr.sampler.bin_centres, saved["sampler"]["bin_centres"])


def test_save_pretrained_and_from_pretrained_round_trip_the_arr(tmp_path, image):
    arr = ARR(ARRConfig(scorer=ScorerConfig(weights="none"), sampler=SamplerConfig(name="log_polar", saccades=40)),
              query_encoder=HashingQueryEncoder())
    with torch.no_grad():
        arr.sampler.bin_centres.mul_(0.9)  # not the initialisation: the round trip carries trained numbers
    folder = arr.save_pretrained(tmp_path / "mine")
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]
    config = json.loads((folder / "config.json").read_text())
    assert config["format"] == W.SCORER_FORMAT and config["query_encoder"] == "HashingQueryEncoder"
    back = ARR.from_pretrained(folder)  # the hashing encoder rebuilt from the config
    assert isinstance(back.query_encoder, HashingQueryEncoder) and back.weights_source == str(folder)
    a, b = arr.state_dict(), back.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    with torch.inference_mode():
        assert torch.equal(arr([image], "Where?").positions, back([image], "Where?").positions)
    with pytest.raises(ValueError, match=r"nowhere/at/all: no such weights folder \(nor a Hub id"):
        ARR.from_pretrained("./nowhere/at/all")


def test_selector_and_pruner_save_and_load_pretrained(tmp_path):
    selector = PatchSelector(cell=28, seed=5)
    pruner = TokenPruner(16, query_dim=8, seed=2)
    selector.save_pretrained(tmp_path / "sel", channels=["rgb"])
    pruner.save_pretrained(tmp_path / "pru", channels=["rgb"])
    for module, folder in ((selector, "sel"), (pruner, "pru")):
        back = type(module).from_pretrained(tmp_path / folder)
        a, b = module.state_dict(), back.state_dict()
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert PatchSelector.from_pretrained().config == W.entry("selector").settings["config"]  # the shipped one


def test_a_lone_safetensors_file_carries_its_config(tmp_path):
    lone = tmp_path / "upload.safetensors"
    shutil.copyfile(W.PACKAGED / "contextual" / W.MODEL, lone)
    arr = ARR(ARRConfig(scorer=ScorerConfig(weights=str(lone))))
    shipped = ARR(ARRConfig())
    assert all(torch.equal(a, b) for a, b in zip(arr.scorer.state_dict().values(), shipped.scorer.state_dict().values()))


def test_the_shipped_weights_are_found_by_name_as_package_data():
    root = resources.files("arr_coc.weights")
    for name in ("contextual", "log_polar", "adaptive_stratified", "selector", "pruner"):
        assert (root / name / "model.safetensors").is_file() and (root / name / "config.json").is_file()
    assert W.PACKAGED == Path(str(root))


def test_older_pt_weights_load_with_one_deprecation_line(tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ARR(ARRConfig(scorer=ScorerConfig(weights=str(LEGACY / "contextual.pt"))))
    lines = [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]
    assert lines == [f"{LEGACY / 'contextual.pt'}: weights in a .pt file are deprecated; convert them once with "
                     f"`python -m arr_coc.weights.convert {LEGACY / 'contextual.pt'}` (a folder of "
                     "model.safetensors + config.json)"]
