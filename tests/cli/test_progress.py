"""The stage line of look and ask: stderr only, off where stderr is no terminal unless asked, wiped before results."""
import argparse
import io
import json

from arr_coc.cli import main, progress
from arr_coc.cli.progress import CLEAR, Stages


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def clock(*times: float):
    it = iter(times)
    return lambda: next(it)


def test_a_log_gets_one_line_per_finished_stage_with_its_duration():
    out = io.StringIO()
    show = Stages(out, clock=clock(0.0, 0.0, 2.5, 2.5, 3.25))
    show("loading the model")
    show("answering")
    show.close()
    assert out.getvalue() == "arr-coc: loading the model: 2.5 s\narr-coc: answering: 0.8 s\n"


def test_a_terminal_line_waits_for_the_delay_then_is_wiped():
    out = Terminal()
    show = Stages(out, live=True, delay=1.0, tick=3600, clock=clock(0.0, 0.0, 0.5, 4.0))
    show("allocating")  # the thread's first tick is an hour away: draw() is called by hand
    show.draw()  # 0.5 s in: a fast command prints nothing
    assert out.getvalue() == ""
    show.draw()  # 4 s in
    assert out.getvalue() == f"{CLEAR}arr-coc: allocating ... 4 s"
    show.close()
    assert out.getvalue().endswith(f"4 s{CLEAR}")


def test_on_by_default_only_where_stderr_is_a_terminal():
    on = progress.stages(argparse.Namespace(progress=None), Terminal())
    off = progress.stages(argparse.Namespace(progress=None), io.StringIO())
    asked = progress.stages(argparse.Namespace(progress=True), io.StringIO())
    refused = progress.stages(argparse.Namespace(progress=False), Terminal())
    progress.stop()
    assert (on.enabled, on.live, off.enabled, asked.enabled, asked.live, refused.enabled) == (
        True, True, False, True, False, False)
    out = io.StringIO()
    Stages(out, enabled=False)("anything")
    assert out.getvalue() == ""


def test_look_json_with_progress_keeps_stdout_json_and_names_the_stages_on_stderr(receipt, capsys):
    assert main(["look", str(receipt), "What is the total?", "--saccades", "16", "--json", "--query-encoder",
                 "hashing", "--progress"]) == 0
    captured = capsys.readouterr()
    assert len(json.loads(captured.out)["positions"]) == 16
    stages = [line.rsplit(":", 1)[0] for line in captured.err.splitlines()]
    assert stages == ["arr-coc: reading the input", "arr-coc: loading the question encoder",
                      "arr-coc: allocating (texture, OCR, relevance, saccades)"]
    assert main(["look", str(receipt), "What is the total?", "--saccades", "16", "--json", "--query-encoder",
                 "hashing"]) == 0
    assert capsys.readouterr().err == ""  # pytest's stderr is no terminal: off unless asked
