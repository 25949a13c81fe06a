"""Generator of the broken-weights corpus: files with the right format tag (or close to it) and the wrong content.

Each case writes one file or folder from a valid one and names the exact one-line message loading it
must give (``{p}``: the path the message names). Scorer cases load into an MVP-channel ARR with the
hashing query encoder (``arr-coc look --channels mvp --query-encoder hashing``); learned cases into a
pruner or selector; checkpoint cases through ``load_checkpoint`` and ``resume_from``.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable

import torch

from arr_coc import weights as W
from arr_coc.allocators.pruning import PatchSelector, TokenPruner
from arr_coc.config import ARRConfig, ScorerConfig, TextureConfig
from arr_coc.engine.pipeline import ARR
from arr_coc.engine.query import HashingQueryEncoder
from arr_coc.engine.texture import MVP_CHANNELS

MVP = ARRConfig(texture=TextureConfig(channels=MVP_CHANNELS), scorer=ScorerConfig(weights="none"))
SCORER = "scorer weights (made by `arr-coc train`)"
SCORER_TAG = f"{SCORER} ('{W.SCORER_FORMAT}')"
PRUNER = "pruner weights (train one with `arr-coc train --learner pruner`)"


def scorer_arr(seed: int = 3) -> ARR:
    return ARR(ARRConfig(texture=MVP.texture, scorer=MVP.scorer, seed=seed), query_encoder=HashingQueryEncoder())


def _scorer(root: Path, edit: Callable[[dict], Any] | None = None, pt: bool = False) -> Path:
    """A valid scorer folder (or .pt file) of an MVP ARR, changed by ``edit``."""
    saved = W.scorer_file(scorer_arr())
    if edit is not None:
        edit(saved)
    if pt:
        torch.save(saved, root / "scorer.pt")
        return root / "scorer.pt"
    return W.save_folder(saved, root / "scorer")


def _learned(root: Path, kind: str, edit: Callable[[dict], Any] | None = None) -> Path:
    module = TokenPruner(16, query_dim=8) if kind == "pruner" else PatchSelector(cell=28)
    saved = {"format": W.LEARNED_FORMAT, "kind": kind, "config": dict(module.config), "channels": ["rgb"],
             "state": module.state_dict()}
    if edit is not None:
        edit(saved)
    return W.save_folder(saved, root / kind)


def _write(name: str, data: bytes) -> Callable[[Path], Path]:
    def make(root: Path) -> Path:
        (root / name).write_bytes(data)
        return root / name
    return make


def _folder_file(name: str, data: bytes) -> Callable[[Path], Path]:
    def make(root: Path) -> Path:
        folder = _scorer(root)
        (folder / name).write_bytes(data)
        return folder
    return make


def _without(name: str) -> Callable[[Path], Path]:
    def make(root: Path) -> Path:
        folder = _scorer(root)
        (folder / name).unlink()
        return folder
    return make


def _config(edit: Callable[[dict], Any]) -> Callable[[Path], Path]:
    def make(root: Path) -> Path:
        folder = _scorer(root)
        config = json.loads((folder / W.CONFIG).read_text())
        edit(config)
        (folder / W.CONFIG).write_text(json.dumps(config))
        return folder
    return make


def _set(key: str, value: Any) -> Callable[[dict], None]:
    return lambda d: d.__setitem__(key, value)


def _pop(key: str) -> Callable[[dict], None]:
    return lambda d: d.pop(key)


def _tensor(part: str, key: str, value: Any) -> Callable[[dict], None]:
    return lambda d: d[part].__setitem__(key, value)


# name -> (what it loads into, builder, exact message)
SCORER_CASES: dict[str, tuple[Callable[[Path], Path], str]] = {
    "text_file_as_pt": (_write("w.pt", b"just some text\n"),
                        f"{{p}} is not a file torch.save wrote (it begins b'just'); expected {SCORER}"),
    "text_file_as_safetensors": (_write("w.safetensors", b"just some text\n"),
                                 f"{{p}} is not a safetensors file (its header does not read: SafetensorError); "
                                 f"expected {SCORER}"),
    "text_as_model_in_folder": (_folder_file(W.MODEL, b"just some text\n"),
                                f"{{p}}/{W.MODEL} is not a safetensors file (its header does not read: "
                                f"SafetensorError); expected {SCORER}"),
    "config_not_json": (_folder_file(W.CONFIG, b"{channels: rgb"),
                        f"{{p}}/{W.CONFIG} is not JSON (Expecting property name enclosed in double quotes: line 1 "
                        f"column 2 (char 1)); expected the config of {SCORER}"),
    "config_not_text": (_folder_file(W.CONFIG, b"\xff\xfe\x00binary"),
                        f"{{p}}/{W.CONFIG} is not text (invalid start byte at byte 0); expected a JSON config"),
    "config_a_list": (_folder_file(W.CONFIG, b"[1, 2]"),
                      f"{{p}}/{W.CONFIG} holds a JSON list, not an object; expected the config of {SCORER}"),
    "config_missing": (_without(W.CONFIG), f"{{p}}/{W.CONFIG}: no such file; {{p}}/{W.MODEL} needs it beside it "
                                           f"({SCORER})"),
    "model_missing": (_without(W.MODEL), f"{{p}}/{W.MODEL}: no such file; expected {SCORER}"),
    "empty_folder": (lambda root: (root / "empty").mkdir() or root / "empty",
                     f"{{p}}: holds neither {W.MODEL} nor {W.CONFIG}; expected {SCORER}"),
    "no_format_tag": (_config(_pop("format")), f"{{p}}/{W.CONFIG} has no format tag; expected {SCORER} "
                                               f"('{W.SCORER_FORMAT}')"),
    "allocator_tag": (_config(_set("format", W.LEARNED_FORMAT)),
                      f"{{p}}/{W.CONFIG} holds '{W.LEARNED_FORMAT}', not {SCORER_TAG}"),
    "no_scorer_name": (_config(_pop("scorer_name")), "{p}: lacks the field 'scorer_name'"),
    "channels_a_string": (_config(_set("channels", "rgb")), "{p}: field 'channels' is a str, expected a list"),
    "channels_numbers": (_config(_set("channels", [1, 2])),
                         "{p}: field 'channels' must be a list of names, got [1, 2]"),
    "scorer_name_a_number": (_config(_set("scorer_name", 7)), "{p}: field 'scorer_name' is a int, expected a str"),
    "tensors_in_config": (_config(_set("scorer", {})),
                          f"{{p}}/{W.CONFIG} has a field 'scorer', which belongs in {W.MODEL} as tensors"),
    "missing_tensor": (lambda r: _scorer(r, lambda d: d["scorer"].pop("prop")),
                       "{p}: scorer lacks prop (it was made for another model)"),
    "unexpected_tensor": (lambda r: _scorer(r, _tensor("scorer", "extra.weight", torch.zeros(2))),
                          "{p}: scorer has unexpected extra.weight (it was made for another model)"),
    "wrong_shape": (lambda r: _scorer(r, _tensor("scorer", "prop", torch.zeros(5))),
                    "{p}: scorer.prop has shape [5], the model's is [3]"),
    "wrong_dtype": (lambda r: _scorer(r, lambda d: d["scorer"].__setitem__("prop", d["scorer"]["prop"].double())),
                    "{p}: scorer.prop is torch.float64, the model's is torch.float32"),
    "nan_weights": (lambda r: _scorer(r, _tensor("scorer", "prop", torch.tensor([0.0, float("nan"), 1.0]))),
                    "{p}: scorer.prop holds NaN or infinite values"),
    "stray_tensor_group": (lambda r: (_scorer(r), _stray(r))[1],
                           f"{{p}}/{W.MODEL} holds tensors outside scorer, sampler: other.x"),
    "sampler_without_name": (lambda r: _scorer(r, lambda d: (d["sampler"].__setitem__("w", torch.zeros(1)),
                                                              d["arr_config"].pop("sampler"))),
                             "{p}: holds sampler parameters, and its arr_config names no sampler they belong to"),
    "pt_scorer_a_list": (lambda r: _scorer(r, _set("scorer", [1, 2]), pt=True),
                         "{p}: field 'scorer' is a list, expected a dict"),
    "pt_tensor_a_string": (lambda r: _scorer(r, _tensor("scorer", "prop", "abc"), pt=True),
                           "{p}: scorer.prop is a str, not a tensor"),
    "pt_other_format": (lambda r: torch.save({"format": "arr-coc-train/1"}, r / "c.pt") or r / "c.pt",
                        f"{{p}} holds 'arr-coc-train/1', not {SCORER_TAG}"),
}


def _stray(root: Path) -> Path:
    """The scorer folder with one more tensor group than a scorer has (written past save_folder's groups)."""
    from safetensors.torch import load_file, save_file

    folder = root / "scorer"
    tensors = load_file(folder / W.MODEL)
    save_file({**tensors, "other.x": torch.zeros(1)}, folder / W.MODEL)
    return folder


LEARNED_CASES: dict[str, tuple[str, Callable[[Path], Path], str]] = {
    "pruner_unknown_config": ("pruner", lambda r: _learned(r, "pruner", lambda d: d["config"].update(depth=3)),
                              "{p}: config has 'depth', which a pruner does not take (it takes dim, query_dim, "
                              "hidden, keep_order, seed)"),
    "pruner_config_text": ("pruner", lambda r: _learned(r, "pruner", lambda d: d["config"].update(dim="16")),
                           "{p}: config dim='16' must be whole numbers"),
    "selector_as_pruner": ("pruner", lambda r: _learned(r, "selector"),
                           f"{{p}} holds selector weights, not pruner weights; train one with `arr-coc train "
                           f"--learner pruner`"),
    "pruner_wrong_shape": ("pruner", lambda r: _learned(r, "pruner", lambda d: d["config"].update(hidden=9)),
                           "{p}: state.mlp.0.weight has shape [8, 24], the model's is [9, 24]"),
    "pruner_no_state": ("pruner", lambda r: _learned(r, "pruner", lambda d: d["state"].clear()),
                        "{p}: state lacks mlp.0.weight, mlp.0.bias, mlp.2.weight and 1 more (it was made for "
                        "another model)"),
    "selector_bad_stem": ("selector", lambda r: _learned(r, "selector", lambda d: d["config"].update(stem=5)),
                          "{p}: config {{'cell': 28, 'width': 16, 'stem': 5}} builds no selector: stem=5 must divide "
                          "cell=28 so the output is one value per cell"),
    "pruner_channels_text": ("pruner", lambda r: _learned(r, "pruner", _set("channels", "rgb")),
                             "{p}: field 'channels' is a str, expected a list"),
}


def build(root: Path, make: Callable[[Path], Path]) -> Path:
    """Write one case into a fresh ``root`` and return the path to load."""
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    return make(root)
