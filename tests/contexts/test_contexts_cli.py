"""``arr-coc look`` over a context: a text file, several images; totals, compression, the strip, the page limit."""
from __future__ import annotations

import json
import sys

import pytest
import torch
from PIL import Image

from arr_coc.cli import main

FAST = ["--query-encoder", "hashing", "--channels", "mvp"]
SMALL = ["--font-size", "14", "--page-width", "280", "--page-height", "224"]


@pytest.fixture
def story(tmp_path):
    lines = ["lorem ipsum dolor sit amet consectetur adipiscing elit"] * 30
    lines[21] = "the zanzibar harbour opens at dawn"
    p = tmp_path / "story.txt"
    p.write_text("\n".join(lines))
    return p


def test_look_over_a_text_file_reports_pages_tokens_and_compression(story, tmp_path, capsys):
    png = tmp_path / "strip.png"
    assert main(["look", str(story), "When does the zanzibar harbour open?", "--tokens", "40", "--json",
                 "--out", str(png), *SMALL, *FAST]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["tokens"]["sent"] == 40 == sum(p["gestalt_tokens"] + p["saccades"] for p in d["pages"])
    assert len(d["pages"]) > 2 and d["context"]["size"] == 14 and d["context"]["width"] == 280
    assert d["compression"] == pytest.approx(d["text_tokens"] / 40, abs=1e-3)
    assert Image.open(png).size[0] > Image.open(png).size[1]  # pages side by side


def test_look_summary_names_the_tokenizer_and_the_ratio(story, tmp_path, capsys):
    assert main(["look", str(story), "When does the zanzibar harbour open?", "--tokens", "40",
                 "--out", str(tmp_path / "s.png"), *SMALL, *FAST]) == 0
    out = capsys.readouterr().out
    assert "sent 40 = " in out and "compression" in out and "all-MiniLM-L6-v2 WordPiece" in out


def test_look_over_several_images(tmp_path, capsys):
    paths = []
    for i in range(3):
        p = tmp_path / f"p{i}.png"
        Image.fromarray((torch.rand(112, 84, 3) * 255).byte().numpy()).save(p)
        paths.append(str(p))
    assert main(["look", *paths, "Where?", "--saccades", "10", "--json", *FAST]) == 0
    d = json.loads(capsys.readouterr().out)
    assert [p["index"] for p in d["pages"]] == [0, 1, 2] and d["tokens"]["saccades"] == 10
    assert d["tokens"]["gestalt"] == 3 * 1 and d["text_tokens"] is None  # 3 pages x 2x2 > 10: 1x1 each


def test_look_over_a_text_file_takes_a_share_or_a_compression(story, capsys):
    """--tokens 25% and 10x over a context: T from the pages' full resolution, or from the counted text."""
    def look(tokens: str) -> dict:
        assert main(["look", str(story), "When does the zanzibar harbour open?", "--tokens", tokens, "--json",
                     *SMALL, *FAST]) == 0
        return json.loads(capsys.readouterr().out)

    share, tenth = look("25%"), look("10x")
    full = share["tokens"]["full_resolution"]
    assert full == 80 * len(share["pages"]) and share["tokens"]["sent"] == round(full / 4) and share["budget"] == "25%"
    assert tenth["tokens"]["sent"] == max(2 * len(tenth["pages"]), round(tenth["text_tokens"] / 10))
    assert tenth["budget"] == "10x" and tenth["tokens"]["sent"] != share["tokens"]["sent"]  # control


def test_look_gives_an_image_a_compression_budget_one_clear_line(tmp_path, capsys):
    p = tmp_path / "blank.png"
    Image.new("RGB", (112, 112), "white").save(p)
    assert main(["look", str(p), "Where?", "--tokens", "10x", *FAST]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("arr-coc: error: budget 10x is a compression of the context's text, and this context has no text "
                   "(no text layer, nothing read by OCR); give a token count or a share instead")


def test_look_prints_one_schema_for_an_image_and_a_context(story, tmp_path, capsys):
    image = tmp_path / "p.png"
    Image.fromarray((torch.rand(112, 140, 3, generator=torch.Generator().manual_seed(0)) * 255).byte().numpy()).save(image)
    assert main(["look", str(image), "Where?", "--saccades", "8", "--json", *FAST]) == 0
    one = json.loads(capsys.readouterr().out)
    assert main(["look", str(story), "Where?", "--tokens", "40", "--json", *SMALL, *FAST]) == 0
    many = json.loads(capsys.readouterr().out)
    assert set(many) <= set(one)  # every field of a context's JSON, for an image too
    assert set(one) - set(many) == {"image_size", "canvas", "cell", "grid", "gestalt_grid", "context_weights",
                                    "positions", "scores"}  # and its page's fields at the top level, as before
    page = one["pages"][0]
    assert one["positions"] == page["positions"] and one["scores"] == page["sampler_scores"]
    assert one["tokens"]["sent"] == 8 + 4 and one["budget"] == "K=8" and one["gestalt_grid"] == [2, 2]


def test_look_refuses_too_many_pages_in_one_line(tmp_path, capsys):
    paths = []
    for i in range(3):
        p = tmp_path / f"p{i}.png"
        Image.new("RGB", (56, 56), "white").save(p)
        paths.append(str(p))
    assert main(["look", *paths, "Where?", "--max-pages", "2", *FAST]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("arr-coc: error: the list of images has 3 pages; a context holds at most 2") and "\n" not in err


def test_the_cli_maps_large_buffers_on_their_own_where_glibc_runs_it():
    import platform

    from arr_coc.cli.heap import map_large_buffers

    glibc = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"
    assert map_large_buffers() is glibc
