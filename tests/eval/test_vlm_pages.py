"""The VLM reader over multi-page records (MP-DocVQA / SlideVQA layouts): one budget, one multi-image prompt."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from PIL import Image

from arr_coc.config import ARRConfig, CanvasConfig, TextureConfig
from arr_coc.data.datasets import load_dataset
from arr_coc.engine.pipeline import ARR
from arr_coc.engine.query import HashingQueryEncoder
from arr_coc.engine.texture import MVP_CHANNELS
from arr_coc.eval.evaluate import evaluate
from arr_coc.eval.settings import EvalSettings
from arr_coc.eval.store import RowStore
from arr_coc.vlm import load_vlm


@pytest.fixture(scope="module")
def adapter():
    return load_vlm("tiny:qwen2_5_vl")


@pytest.fixture(scope="module")
def arr(adapter):
    return ARR(ARRConfig(canvas=CanvasConfig(cell=adapter.cell), texture=TextureConfig(channels=MVP_CHANNELS)),
               query_encoder=HashingQueryEncoder()).eval()


def mpdocvqa(root: Path) -> Path:
    """Two questions over a 3-page and a 2-page document, MP-DocVQA's layout."""
    for i, page in enumerate(["a_p0", "a_p1", "a_p2", "b_p0", "b_p1"]):
        (root / "images").mkdir(parents=True, exist_ok=True)
        g = torch.Generator().manual_seed(i)
        Image.fromarray((torch.rand(140, 112, 3, generator=g) * 255).byte().numpy()).save(root / "images" / f"{page}.jpg")
    data = [{"questionId": 1, "question": "Total?", "doc_id": "a", "page_ids": ["a_p0", "a_p1", "a_p2"],
             "answers": ["42"], "answer_page_idx": 1},
            {"questionId": 2, "question": "Date?", "doc_id": "b", "page_ids": ["b_p0", "b_p1"], "answers": ["May"],
             "answer_page_idx": 0}]
    (root / "qas").mkdir()
    (root / "qas" / "val.json").write_text(json.dumps({"data": data}))
    return root


def test_a_multi_page_record_is_answered_over_all_its_pages_at_the_exact_budget(adapter, arr, tmp_path):
    records = load_dataset("mpdocvqa", mpdocvqa(tmp_path / "mp"), split="val")
    settings = EvalSettings(reader="vlm", methods=("coc",), budgets=("24", "40"), max_new_tokens=2)
    rows = RowStore(evaluate(records, arr, tmp_path / "out", settings, progress=False, adapter=adapter).parent).rows()
    got = sorted((r["record_id"], r["budget"], r["tokens"], r["pages"]) for r in rows)
    assert got == [("1", "24", 24, 3), ("1", "40", 40, 3), ("2", "24", 24, 2), ("2", "40", 40, 2)]
    for r in rows:
        assert r["full_tokens"] == r["pages"] * 20 and 0 <= r["score"] <= 1 and r["method"] == "coc"
        assert r["answer_page_hit"] == bool(set(r["saccade_pages"]) & set(r["answer_pages"]))
        assert r["text_tokens"] is None and r["flops"] > 0  # images without words: nothing to compare with
    # a rerun answers nothing twice
    again = RowStore(evaluate(records, arr, tmp_path / "out", settings, progress=False, adapter=adapter).parent).rows()
    assert len(again) == 4


def test_multi_page_records_take_method_coc_at_any_budget_that_fits(adapter, arr, tmp_path):
    records = load_dataset("mpdocvqa", mpdocvqa(tmp_path / "mp"), split="val")
    with pytest.raises(ValueError, match=r"methods \['full'\] do not send a whole context to the vlm reader; "
                                         r"choose from coc"):
        evaluate(records, arr, tmp_path / "a", EvalSettings(reader="vlm", methods=("full", "coc")), progress=False,
                 adapter=adapter)
    assert EvalSettings(reader="vlm").resolve("context").methods == ("coc",)  # the default over contexts
    # a share of the pages' full resolution, as over one image: 50% of 3 x 20 and of 2 x 20 cells
    settings = EvalSettings(reader="vlm", methods=("coc",), budgets=("50%",), max_new_tokens=2)
    rows = RowStore(evaluate(records, arr, tmp_path / "b", settings, progress=False, adapter=adapter).parent).rows()
    assert sorted((r["record_id"], r["budget"], r["tokens"]) for r in rows) == [("1", "50%", 30), ("2", "50%", 20)]
    with pytest.raises(ValueError, match="budget 10x is a compression of the context's text, and this context has no "
                                         "text"):  # images without words
        evaluate(records, arr, tmp_path / "c", EvalSettings(reader="vlm", budgets=("10x",), max_new_tokens=2),
                 progress=False, adapter=adapter)
