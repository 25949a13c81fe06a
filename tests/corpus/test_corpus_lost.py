"""Corpus: nothing lost, nothing ignored -- occupied folders, shared runs, unused options, unhonoured budgets,
full disks and oversized weights configs each end in one exact line (or act), and the user's files stay as they were."""
from __future__ import annotations

import errno
import json
import multiprocessing
import time
from pathlib import Path

import pytest
import torch
from corpus_checks import outcome, run_cli, write_bar_pages
from PIL import Image, ImageDraw

from arr_coc.allocators.pruning import TokenPruner
from arr_coc.config import ARRConfig, CanvasConfig, GestaltConfig, ScorerConfig, TextureConfig
from arr_coc.engine.pipeline import ARR
from arr_coc.engine.query import HashingQueryEncoder
from arr_coc.engine.texture import MVP_CHANNELS
from arr_coc.weights import files

MVP = ARRConfig(texture=TextureConfig(channels=MVP_CHANNELS), scorer=ScorerConfig(weights="none"))


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> Path:
    """Six 112 x 84 px pages, two questions each, as JSONL."""
    return write_bar_pages(tmp_path_factory.mktemp("lost"), image_ids=True)


def train_argv(pages: Path, out: Path, *extra: str) -> list[str]:
    return ["train", "--datasets", "jsonl", "--data", str(pages), "--channels", "mvp", "--query-encoder", "hashing",
            "--steps", "2", "--eval-every", "2", "--batch-size", "2", "--tokens", "25%", "--out", str(out),
            "--features", str(out.parent / "features"), "--no-progress", *extra]


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def user_folder(folder: Path) -> dict[str, bytes]:
    """A folder of the user's own files named like weights files."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"mine": true}\n')
    (folder / "model.safetensors").write_bytes(b"my own model")
    (folder / "notes.txt").write_text("keep me")
    return snapshot(folder)


# ----------------------------------------------------------------------------- train --export and --out


def test_export_into_a_folder_of_the_users_files_is_refused_before_training(pages, tmp_path):
    target = tmp_path / "mine"
    before = user_folder(target)
    out = tmp_path / "run"
    code, _, err = run_cli(train_argv(pages, out, "--export", str(target)))
    assert (code, err.strip()) == (2, f"arr-coc: error: --export {target} already holds model.safetensors and "
                                      "config.json; rerun with --fresh to replace them, or export into another folder")
    assert snapshot(target) == before and not out.exists()  # refused before any work
    (target / "config.json").unlink()
    code, _, err = run_cli(train_argv(pages, out, "--export", str(target)))
    assert (code, err.strip()) == (2, f"arr-coc: error: --export {target} already holds model.safetensors; rerun "
                                      "with --fresh to replace it, or export into another folder")
    (tmp_path / "file").write_text("x")
    code, _, err = run_cli(train_argv(pages, out, "--export", str(tmp_path / "file")))
    assert (code, err.strip()) == (2, f"arr-coc: error: --export {tmp_path / 'file'} is a file; export into a folder "
                                      "(it gets model.safetensors and config.json)")


@pytest.mark.parametrize("name, message", [
    ("auto", "--export auto: the name is reserved (it means the default / no weights); choose another"),
    ("selector", "--export selector: the name is for selector weights, and this run trains the scorer; choose "
                 "another name"),
])
def test_export_to_a_name_the_weights_cannot_take_is_refused_before_training(pages, tmp_path, name, message):
    out = tmp_path / "run"
    code, _, err = run_cli(train_argv(pages, out, "--export", name))
    assert (code, err.strip()) == (2, f"arr-coc: error: {message}")
    assert not out.exists()


def test_export_with_fresh_replaces_only_the_weights_files(pages, tmp_path):
    target = tmp_path / "mine"
    before = user_folder(target)
    code, out, err = run_cli(train_argv(pages, tmp_path / "run", "--export", str(target), "--fresh"))
    assert code == 0, err
    after = snapshot(target)
    assert after["notes.txt"] == before["notes.txt"]  # what the export does not write is kept
    assert after["model.safetensors"] != before["model.safetensors"]
    assert after["model.safetensors"] == (tmp_path / "run" / "scorer" / "model.safetensors").read_bytes()
    assert json.loads(after["config.json"])["format"] == "arr-coc-scorer/2"


def test_train_into_a_folder_holding_files_it_would_overwrite_is_refused(pages, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text('{"mine": true}\n')
    (out / "metrics.json").write_text("[1, 2]\n")
    before = snapshot(out)
    code, _, err = run_cli(train_argv(pages, out))
    assert (code, err.strip()) == (2, f"arr-coc: error: {out} already holds config.json, metrics.json, which this run "
                                      "would overwrite; rerun with --fresh to replace them, or pass another --out")
    assert snapshot(out) == {**before, ".train.lock": snapshot(out)[".train.lock"]}
    code, _, err = run_cli(train_argv(pages, out, "--fresh"))
    assert code == 0, err
    assert json.loads((out / "config.json").read_text())["train"]["out"] == str(out)


def _hold(out: str, ready, release) -> None:
    """Another run's process: holds the folder's lock until told to let go."""
    from arr_coc.train.checkpoint import run_lock

    with run_lock(Path(out)):
        ready.set()
        release.wait(60)


def test_a_second_run_into_a_folder_in_use_is_refused_at_once_naming_the_first(pages, tmp_path):
    out = tmp_path / "run"
    assert run_cli(train_argv(pages, out))[0] == 0
    first = snapshot(out)
    ctx = multiprocessing.get_context("spawn")
    ready, release = ctx.Event(), ctx.Event()
    other = ctx.Process(target=_hold, args=(str(out), ready, release))
    other.start()
    try:
        assert ready.wait(60)
        for extra in ((), ("--fresh",), ("--resume", "--steps", "4")):  # even --fresh does not touch a running run
            start = time.perf_counter()
            code, _, err = run_cli(train_argv(pages, out, *extra))
            assert (code, err.strip()) == (2, f"arr-coc: error: {out} is in use by another training run (process "
                                              f"{other.pid}); wait for it to finish or pass another --out")
            assert time.perf_counter() - start < 5  # at once, not after the run's work
        lost = {k: v for k, v in snapshot(out).items() if k != ".train.lock"}
        assert lost == {k: v for k, v in first.items() if k != ".train.lock"}  # the first run's files intact
    finally:
        release.set()
        other.join(60)
    code, _, err = run_cli(train_argv(pages, out, "--resume", "--steps", "4"))  # released: the folder is free again
    assert code == 0, err


# ----------------------------------------------------------------------------- every train option acts or is refused


@pytest.mark.parametrize("extra, message", [
    (["--learner", "selector", "--scorer-weights", "{w}"], "--scorer-weights {w}: training starts from the hand-set "
     "scorer and writes new weights, so these would be ignored; drop --scorer-weights (it is for look, ask and eval)"),
    (["--learner", "pruner", "--scorer-weights", "{nan}"], "--scorer-weights {nan}: training starts from the hand-set "
     "scorer and writes new weights, so these would be ignored; drop --scorer-weights (it is for look, ask and eval)"),
    (["--scorer-weights", "auto"], "--scorer-weights auto: training starts from the hand-set scorer and writes new "
     "weights, so these would be ignored; drop --scorer-weights (it is for look, ask and eval)"),
    (["--learner", "selector", "--scorer", "mvp", "--where-prior", "1"], "--scorer mvp, --where-prior 1.0 act only "
     "with --learner scorer (a selector learns its own map, without the scorer and sampler); drop them or pass "
     "--learner scorer"),
    (["--learner", "pruner", "--sampler", "stratified"], "--sampler stratified acts only with --learner scorer (a "
     "pruner learns its own map, without the scorer and sampler); drop it or pass --learner scorer"),
    (["--vlm", "tiny:llava"], "--vlm tiny:llava acts only with --objective vlm (objective 'proxy' runs no VLM); drop "
     "it or pass --objective vlm"),
    (["--device", "cuda", "--dtype", "bfloat16", "--gradient-checkpointing"], "--device cuda, --dtype bfloat16, "
     "--gradient-checkpointing act only with --objective vlm (objective 'proxy' runs no VLM); drop them or pass "
     "--objective vlm"),
    (["--objective", "vlm", "--vlm", "tiny:llava", "--candidates", "3"], "--candidates 3 acts only with --relaxation "
     "candidates (relaxation 'weighted' encodes every cell); drop it or pass --relaxation candidates"),
])
def test_a_train_option_the_run_would_not_use_is_one_line(pages, tmp_path, extra, message):
    w = ARR(MVP, query_encoder=HashingQueryEncoder()).save_pretrained(tmp_path / "w")
    nan = ARR(MVP, query_encoder=HashingQueryEncoder())
    with torch.no_grad():
        next(nan.scorer.parameters()).fill_(float("nan"))
    nan = nan.save_pretrained(tmp_path / "nan")
    out = tmp_path / "run"
    code, _, err = run_cli(train_argv(pages, out, *[e.format(w=w, nan=nan) for e in extra]))
    assert (code, err.strip()) == (2, "arr-coc: error: " + message.format(w=w, nan=nan))
    assert not out.exists()  # refused before any work


def test_the_options_that_act_still_run(pages, tmp_path):
    code, _, err = run_cli(train_argv(pages, tmp_path / "a", "--learner", "selector", "--scorer-weights", "none"))
    assert code == 0, err  # none is what training does: accepted
    code, _, err = run_cli(train_argv(pages, tmp_path / "b", "--sampler", "stratified", "--where-prior", "1"))
    assert code == 0, err
    saved = json.loads((tmp_path / "b" / "config.json").read_text())["arr"]
    assert (saved["sampler"]["name"], saved["scorer"]["where_prior"]) == ("stratified", 1.0)


# ----------------------------------------------------------------------------- ask: a budget the adapter cannot honour


@pytest.fixture(scope="module")
def page_files(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("ask")
    img = Image.new("RGB", (900, 700), "white")
    ImageDraw.Draw(img).rectangle((100, 100, 600, 150), fill="black")
    img.save(folder / "p.png")
    img.save(folder / "three.pdf", save_all=True, append_images=[img, img])
    return {"image": folder / "p.png", "pdf": folder / "three.pdf"}


def ask_argv(path: Path, model: str, *extra: str) -> list[str]:
    return ["ask", str(path), "Where?", "--model", model, "--channels", "mvp", "--query-encoder", "hashing",
            "--scorer-weights", "none", "--max-new-tokens", "1", *extra]


def test_llava_refuses_a_total_it_cannot_split_and_sends_the_k_it_names(page_files):
    code, _, err = run_cli(ask_argv(page_files["image"], "tiny:llava", "--tokens", "600"))
    assert (code, err.strip()) == (2, "arr-coc: error: --tokens 600: llava sends its own fixed 16-token gestalt per "
                                      "image (its tower's whole-image view) beside K saccades, so T cannot be split "
                                      "as asked; give --saccades K instead (16 + K tokens per image; --saccades 584 "
                                      "sends 600)")
    code, _, err = run_cli(ask_argv(page_files["pdf"], "tiny:llava", "--tokens", "600"))
    assert (code, err.strip()) == (2, "arr-coc: error: --tokens 600: llava sends its own fixed 16-token gestalt per "
                                      "image (its tower's whole-image view) beside K saccades, so T cannot be split "
                                      "as asked; give --saccades K instead (16 + K tokens per image)")
    code, out, err = run_cli(ask_argv(page_files["image"], "tiny:llava", "--saccades", "584", "--json"))
    assert code == 0, err
    assert json.loads(out)["tokens"]["sent"] == 600  # the K the message names sends T
    code, out, err = run_cli(ask_argv(page_files["image"], "tiny:qwen2_5_vl", "--tokens", "600", "--json"))
    assert code == 0, err
    assert json.loads(out)["tokens"]["sent"] == 600  # negative control: Qwen's gestalt is chosen, T is honoured


def test_the_library_refuses_a_gestalt_grid_llava_would_not_send(page_files):
    from arr_coc.vlm import ask, load_vlm

    adapter = load_vlm("tiny:llava")
    config = ARRConfig(canvas=CanvasConfig(cell=adapter.cell), texture=MVP.texture, scorer=MVP.scorer,
                       gestalt=GestaltConfig(grid=(16, 16)))
    arr = ARR(config, query_encoder=HashingQueryEncoder())
    kind, message = outcome(lambda: ask(adapter, str(page_files["image"]), "Where?", arr=arr, saccades=8))
    assert (kind, message) == ("error", "llava sends its own fixed 16-token gestalt (its tower's whole-image view), "
                                        "not the gestalt grid (16, 16) asked for; leave GestaltConfig.grid unset (and "
                                        "give K saccades rather than a total of tokens)")


# ----------------------------------------------------------------------------- eval on a full disk


def eval_argv(pages: Path, out: Path, *tokens: str) -> list[str]:
    return ["eval", "jsonl", "--data", str(pages), "--channels", "mvp", "--query-encoder", "hashing",
            "--scorer-weights", "none", "--reader", "none", "--methods", "topk", "random", "--tokens", *tokens,
            "--out", str(out)]


def failing(name: str, real):
    """An opener that fails with ENOSPC for files named ``name`` (after writing half of what it is given)."""
    class Half:
        def __init__(self, f):
            self.f = f

        def write(self, data):
            self.f.write(data[: len(data) // 2])
            self.f.flush()
            raise OSError(errno.ENOSPC, "No space left on device")

        def __getattr__(self, attr):
            return getattr(self.f, attr)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    def opener(path: Path):
        f = real(path)
        return Half(f) if name in path.name else f
    return opener


def error_line(code: int, err: str) -> str:
    """The one error line of a refused command (eval's progress bars come before it on stderr)."""
    assert code == 2 and "Traceback" not in err and err.count("arr-coc: error: ") == 1, err
    return err.strip().splitlines()[-1]


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*") if p.name.endswith(".tmp") or p.name.startswith(".summary."))


@pytest.mark.parametrize("victim", ["summary.csv", "summary.md", "summary.png"])
def test_eval_reports_on_a_full_disk_are_one_line_and_the_earlier_ones_stay(pages, tmp_path, monkeypatch, victim):
    out = tmp_path / "eval"
    assert run_cli(eval_argv(pages, out, "25%"))[0] == 0
    before = snapshot(out / "jsonl")
    monkeypatch.setattr(files, "open_temp", failing(victim, files.open_temp))
    line = error_line(*run_cli(eval_argv(pages, out, "25%"))[::2])
    assert line.startswith(f"arr-coc: error: {out / 'jsonl' / victim}: no space left on device while writing it (")
    assert line.endswith("free there); nothing was written: free some space or write elsewhere")
    after = snapshot(out / "jsonl")
    assert after[victim] == before[victim] and after["summary.csv"]  # the earlier report, whole: never 0 bytes
    assert leftovers(out) == []


def test_eval_rows_on_a_full_disk_are_cut_back_and_the_rerun_completes(pages, tmp_path, monkeypatch):
    out = tmp_path / "eval"
    assert run_cli(eval_argv(pages, out, "25%"))[0] == 0
    rows = (out / "jsonl" / "records.jsonl").read_bytes()
    monkeypatch.setattr(files, "open_append", failing("records.jsonl", files.open_append))
    line = error_line(*run_cli(eval_argv(pages, out, "25%", "50%"))[::2])
    assert line.startswith(f"arr-coc: error: {out / 'jsonl' / 'records.jsonl'}: no space left on device while "
                           "writing it (")
    assert (out / "jsonl" / "records.jsonl").read_bytes() == rows  # no half row, no row lost
    monkeypatch.undo()
    assert run_cli(eval_argv(pages, out, "25%", "50%"))[0] == 0
    lines = (out / "jsonl" / "records.jsonl").read_text().splitlines()
    assert len(lines) == len(set(lines)) == 12 * 2 * 2


def test_eval_settings_on_a_full_disk_are_one_line_and_leave_no_temporary(pages, tmp_path, monkeypatch):
    out = tmp_path / "eval"
    monkeypatch.setattr(files, "open_temp", failing("settings.json", files.open_temp))
    line = error_line(*run_cli(eval_argv(pages, out, "25%"))[::2])
    assert line.startswith(f"arr-coc: error: {out / 'jsonl' / 'settings.json'}: no space left on device while "
                           "writing it (")
    assert leftovers(out) == [] and not (out / "jsonl" / "settings.json").exists()


# ----------------------------------------------------------------------------- weights configs bounded before allocation


def _scorer_folder(tmp_path: Path, edit) -> Path:
    folder = ARR(MVP, query_encoder=HashingQueryEncoder()).save_pretrained(tmp_path / "w")
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("field, value, bound", [
    (("scorer", "query_dim"), 10 ** 12, 8192),
    (("scorer", "hidden"), 2 ** 40, 8192),
    (("gestalt", "grid"), [16, 10 ** 9], 16384),
    (("canvas", "cell"), 10 ** 6, 1024),
    (("sampler", "kwargs", "n_bins"), 10 ** 10, 65536),
    (("sampler", "saccades"), 0, 2 ** 24),
])
def test_from_pretrained_refuses_an_oversized_config_before_building_anything(tmp_path, field, value, bound):
    def edit(config):
        d = config["arr_config"]
        for key in field[:-1]:
            d = d[key]
        d[field[-1]] = value

    folder = _scorer_folder(tmp_path, edit)
    shown = value[1] if isinstance(value, list) else value
    start = time.perf_counter()
    kind, message = outcome(lambda: ARR.from_pretrained(folder))
    assert (kind, message) == ("error", f"{folder}: arr_config.{'.'.join(field)} = {shown} is outside 1..{bound}, the "
                                        "bound of that size; the file is damaged or was not made by arr-coc")
    assert time.perf_counter() - start < 5


def test_a_sane_config_still_loads_and_a_named_channel_flood_is_refused(tmp_path):
    folder = _scorer_folder(tmp_path, lambda c: None)
    arr = ARR.from_pretrained(folder)  # negative control: the same file, sizes in bounds
    assert isinstance(arr.query_encoder, HashingQueryEncoder) and arr.query_encoder.dim == 384
    flood = _scorer_folder(tmp_path / "f", lambda c: c.__setitem__("channels", ["rgb"] * 1000))
    kind, message = outcome(lambda: ARR(ARRConfig(texture=MVP.texture, scorer=ScorerConfig(weights=str(flood))),
                                        query_encoder=HashingQueryEncoder()))
    assert (kind, message) == ("error", f"{flood}: field 'channels' names 1000 channels, above the bound 256")


def test_learned_weights_configs_are_bounded_before_their_layers(tmp_path):
    from arr_coc import weights as W

    module = TokenPruner(16, query_dim=8)
    saved = {"format": W.LEARNED_FORMAT, "kind": "pruner", "config": {**module.config, "hidden": 10 ** 11},
             "channels": ["rgb"], "state": module.state_dict()}
    path = W.save_folder(saved, tmp_path / "pruner")
    assert outcome(lambda: W.load_learned("pruner", path)) == (
        "error", f"{path}: config.hidden = {10 ** 11} is outside 1..8192, the bound of that size; the file is damaged "
                 "or was not made by arr-coc")


# ----------------------------------------------------------------------------- every eval / look / ask option acts or is refused


@pytest.mark.parametrize("extra, message", [
    (["--margin", "5"], "--margin acts only with an OCR reader, --reader tesseract or rapidocr (not none); drop it"),
    (["--model", "tiny:llava", "--batch-size", "2"], "--model --batch-size act only with --reader vlm (this run reads "
     "with none); drop them"),
    (["--size-prior", "1.5"], "--size-prior acts only with a variable-size patch method (patches, patches_edges, "
     "quadtree) in --methods; drop it"),
    (["--pruner-weights", "{w}"], "--pruner-weights acts only with the method pruner in --methods; drop it"),
    (["--clip-model", "{w}"], "--clip-model sets the weights of the 'clip' channel, which --channels does not "
     "include; add clip to --channels or drop --clip-model"),
])
def test_an_eval_option_the_run_would_not_use_is_one_line(pages, tmp_path, extra, message):
    argv = eval_argv(pages, tmp_path / "eval", "25%") + [e.format(w=tmp_path) for e in extra]
    code, _, err = run_cli(argv)
    assert (code, err.strip()) == (2, "arr-coc: error: " + message)
    assert not (tmp_path / "eval").exists()  # refused before any work


def test_an_eval_option_that_acts_is_still_taken(pages, tmp_path):
    code, _, err = run_cli(eval_argv(pages, tmp_path / "eval", "25%")[:-4] + ["patches", "--tokens", "25%",
                                                                              "--size-prior", "1.5", "--out",
                                                                              str(tmp_path / "eval")])
    assert code == 0, err
    settings = json.loads((tmp_path / "eval" / "jsonl" / "settings.json").read_text())
    assert settings["patch_options"] == {"size_prior": 1.5}


@pytest.mark.parametrize("input_, extra, message", [
    ("image", ["--dpi", "300"], "--dpi acts only on a PDF, and the input is one image; drop it"),
    ("image", ["--font-size", "20", "--max-pages", "3"], "--max-pages acts only on a context, --font-size acts only on "
     "a text file, and the input is one image; drop them"),
    ("pdf", ["--page-width", "800"], "--page-width acts only on a text file, and the input is a PDF; drop it"),
])
@pytest.mark.parametrize("command", ["look", "ask"])
def test_a_context_flag_for_another_kind_of_input_is_one_line(page_files, tmp_path, command, input_, extra, message):
    argv = [command, str(page_files[input_]), "Where?", "--channels", "mvp", "--query-encoder", "hashing", *extra]
    argv += ["--model", "tiny:llava"] if command == "ask" else ["--out", str(tmp_path / "x.png")]
    code, _, err = run_cli(argv)
    assert (code, err.strip()) == (2, "arr-coc: error: " + message)


def test_ask_seed_without_sampling_is_one_line(page_files):
    code, _, err = run_cli(ask_argv(page_files["image"], "tiny:qwen2_5_vl", "--seed", "3"))
    assert (code, err.strip()) == (2, "arr-coc: error: seed seeds sampling's draws, and greedy decoding draws none; "
                                      "add do_sample (--do-sample) or drop the seed")
    code, _, err = run_cli(ask_argv(page_files["image"], "tiny:qwen2_5_vl", "--seed", "3", "--do-sample"))
    assert code == 0, err
    # a context decodes as an image does: the same refusal, and sampling acts
    code, _, err = run_cli(ask_argv(page_files["pdf"], "tiny:qwen2_5_vl", "--seed", "3"))
    assert (code, err.strip()) == (2, "arr-coc: error: seed seeds sampling's draws, and greedy decoding draws none; "
                                      "add do_sample (--do-sample) or drop the seed")
    code, _, err = run_cli(ask_argv(page_files["pdf"], "tiny:qwen2_5_vl", "--seed", "3", "--do-sample"))
    assert code == 0, err


def test_a_context_flag_for_its_own_kind_of_input_acts(page_files, tmp_path):
    code, out, err = run_cli(["look", str(page_files["pdf"]), "Where?", "--channels", "mvp", "--query-encoder",
                              "hashing", "--scorer-weights", "none", "--pages", "1-2", "--dpi", "30", "--saccades", "8",
                              "--json"])
    assert code == 0, err
    assert len(json.loads(out)["pages"]) == 2
