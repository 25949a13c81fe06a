"""``arr-coc ask`` over a context: several images or a text file as one multi-image prompt, one budget over pages."""
import json
import re

import pytest
import torch
from PIL import Image

from arr_coc.cli import main
from arr_coc.contexts import load_context, text_tokens

FAST = ["--model", "tiny:qwen2_5_vl", "--query-encoder", "hashing", "--channels", "mvp", "--max-new-tokens", "2",
        "--json"]


def ask_json(capsys, *argv):
    assert main(["ask", *argv, *FAST]) == 0
    return json.loads(capsys.readouterr().out)


def test_several_images_share_one_exact_budget_and_report_each_page(tmp_path, capsys):
    paths = []
    for i, (h, w) in enumerate([(224, 168), (112, 280), (168, 168)]):
        g = torch.Generator().manual_seed(i)
        paths.append(tmp_path / f"p{i}.png")
        Image.fromarray((torch.rand(h, w, 3, generator=g) * 255).byte().numpy()).save(paths[-1])
    out = ask_json(capsys, *map(str, paths), "Which page is red?", "--tokens", "60")
    pages = out["pages"]
    assert [p["page"] for p in pages] == [1, 2, 3] and [p["full_resolution"] for p in pages] == [48, 40, 36]
    assert sum(p["gestalt"] + p["saccades"] for p in pages) == out["tokens"]["visual"] == 60
    assert out["tokens"]["gestalt"] == sum(p["gestalt"] for p in pages) and len({p["gestalt"] for p in pages}) == 1
    assert out["tokens"]["text"] is None and out["tokens"]["compression"] is None  # images without words
    assert isinstance(out["answer"], str) and out["flops"]["total"] < out["flops_full"]["total"]


def test_a_text_file_reports_its_text_tokens_and_the_compression(tmp_path, capsys):
    doc = tmp_path / "notes.txt"
    doc.write_text("The invoice total is 42 euros, due on the first of March.\n" * 40)
    out = ask_json(capsys, str(doc), "What is the total?", "--saccades", "50")
    expected = text_tokens("\n\n".join(p.text for p in load_context(doc).pages))
    assert out["tokens"]["text"] == expected and out["tokens"]["saccades"] == 50
    assert out["tokens"]["compression"] == round(expected / out["tokens"]["visual"], 3)


def test_one_image_keeps_the_one_image_path(receipt, capsys):
    out = ask_json(capsys, str(receipt), "What is the total?", "--saccades", "16")
    assert {k: out["tokens"][k] for k in ("sent", "gestalt", "saccades", "full_resolution")} == {
        "sent": 32, "gestalt": 16, "saccades": 16, "full_resolution": 53 * 35}
    assert out["tokens"]["text"] is None and out["tokens"]["compression"] is None
    (one,) = out["pages"]
    assert (one["page"], one["kind"], one["grid"], one["gestalt_grid"]) == (1, "cells", [53, 35], [4, 4])
    assert len(one["positions"]) == 16 and len({tuple(p) for p in one["positions"]}) == 16
    assert all(0 <= y < 53 and 0 <= x < 35 for y, x in one["positions"])


def test_a_pdf_carries_every_page_s_saccade_positions_and_draws_them(tmp_path, capsys):
    from conftest import key_pdf

    pdf = key_pdf(tmp_path / "three.pdf", 3)
    png = tmp_path / "out" / "saccades.png"
    out = ask_json(capsys, str(pdf), "Where is the key?", "--tokens", "120", "--out", str(png))
    pages = out["pages"]
    assert [p["page"] for p in pages] == [1, 2, 3] and out["tokens"]["sent"] == 120
    assert [len(p["positions"]) for p in pages] == [p["saccades"] for p in pages]
    assert sum(p["saccades"] for p in pages) == out["tokens"]["saccades"] == 120 - out["tokens"]["gestalt"]
    assert out["source"] == str(pdf) and out["tokens"]["text"] > 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_context_takes_a_share_of_full_resolution(tmp_path, capsys):
    paths = []
    for i in range(2):
        paths.append(tmp_path / f"p{i}.png")
        Image.fromarray((torch.rand(168, 224, 3, generator=torch.Generator().manual_seed(i)) * 255).byte().numpy()
                        ).save(paths[-1])
    out = ask_json(capsys, *map(str, paths), "Q?", "--tokens", "25%")
    assert out["tokens"]["full_resolution"] == 2 * 6 * 8 and out["tokens"]["sent"] == round(0.25 * 96)


def test_decoding_options_act_on_a_context(tmp_path, capsys):
    doc = tmp_path / "notes.txt"
    doc.write_text("The invoice total is 42 euros.\n" * 20)

    def answer(*flags):
        assert main(["ask", str(doc), "Total?", *FAST[:-3], "--json", "--max-new-tokens", "6", *flags]) == 0
        return json.loads(capsys.readouterr().out)["answer"]

    one, again, other = (answer("--do-sample", "--seed", s) for s in ("1", "1", "2"))
    assert one == again and one != other  # sampling acts, reproducibly from its seed
    greedy = answer()
    assert main(["ask", str(doc), "Total?", *FAST[:-3], "--max-new-tokens", "6", "--stream"]) == 0
    out = capsys.readouterr().out
    assert f"answer        {greedy}\n" in out and "context       " in out  # streamed as text, not quoted


@pytest.mark.parametrize("flags, message", [
    (["--mode", "slice"], "a context .* sent sparse with a gestalt per page; drop --mode slice \\(mode=\\)"),
    (["--relevance", "vlm"], "a context .* sent sparse with a gestalt per page; drop --relevance vlm \\(relevance=\\)"),
])
def test_context_refusals_are_one_line(receipt, capsys, flags, message):
    assert main(["ask", str(receipt), str(receipt), "Q?", *FAST, *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and re.search(message, err)
