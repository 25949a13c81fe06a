"""`arr-coc --help` names every input kind and where each command writes; the defaults it states are the code's."""
import pytest

from arr_coc.cli import main
from arr_coc.cli.outputs import OUT


def help_text(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as e:
        main([*argv, "--help"])
    assert e.value.code == 0
    return capsys.readouterr().out


def test_top_level_help_names_every_input_kind_and_every_command_s_files(capsys):
    text = help_text(capsys)
    inputs = text[text.index("inputs (look and ask"):text.index("outputs (")]
    for kind in ("IMAGE ", "IMAGE IMAGE ...", "DOC.pdf", "NOTES.txt", "a tensor", "the examples"):
        assert f"\n  {kind}" in inputs, kind
    assert ".txt .md .rst .tex .text" in inputs  # the suffixes a context reads as text
    assert "form.jpg, photo.jpg, receipt.jpg" in inputs and "examples.path('receipt.jpg')" in inputs
    outputs = text[text.index("outputs ("):text.index("samplers:")]
    for command in ("look", "ask", "eval", "train", "serve"):
        assert f"\n  {command} " in outputs, command
    assert "default out/<input>_arr.png" in outputs and "default out/eval/<dataset>/" in outputs
    assert "default out/train/" in outputs


def test_each_command_s_help_states_the_default_folder_the_code_uses(capsys):
    assert OUT.as_posix() == "out"
    assert "default out/<input>_arr.png, a context's out/<input>_coc.png" in " ".join(help_text(capsys, "look").split())
    assert "(default out/eval)" in help_text(capsys, "eval")
    assert "(default out/train)" in " ".join(help_text(capsys, "train").split())
    assert "--progress" in help_text(capsys, "ask")


def test_look_without_out_draws_into_out_under_the_current_folder(receipt, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["look", str(receipt), "What is the total?", "--saccades", "8", "--query-encoder", "hashing"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "picture       out/receipt_arr.png"
    assert (tmp_path / "out" / "receipt_arr.png").stat().st_size > 0
    assert not (tmp_path / "receipt_arr.png").exists()  # the old default, the current folder itself
    (tmp_path / "out" / "receipt_arr.png").unlink()
    assert main(["look", str(receipt), "What is the total?", "--saccades", "8", "--query-encoder", "hashing",
                 "--json"]) == 0
    assert list((tmp_path / "out").iterdir()) == []  # with --json, a picture only where --out asks
