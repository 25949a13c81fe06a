"""Corpus: weights and checkpoints with the right format tag and the wrong content, each one exact line.

The files come from the generator in ``weights_corpus.py``; every case is loaded through the
library, the CLI (``look``) and the microscope, and must end in the same one line naming the file.
"""
from __future__ import annotations

import pytest
from corpus_checks import outcome, run_cli
from PIL import Image
from weights_corpus import LEARNED_CASES, MVP, SCORER_CASES, build

from arr_coc import weights as W
from arr_coc.app.service import Microscope, Settings, read_upload
from arr_coc.config import ScorerConfig
from arr_coc.engine.pipeline import ARR
from arr_coc.engine.query import HashingQueryEncoder
from arr_coc.engine.texture import MVP_CHANNELS


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    path = tmp_path_factory.mktemp("page") / "page.png"
    Image.new("RGB", (112, 84), "white").save(path)
    return path


@pytest.fixture(scope="module")
def scope():
    return Microscope(query_encoder=HashingQueryEncoder())


def test_the_corpus_is_every_class_of_broken_file():
    assert len(SCORER_CASES) == 26 and len(LEARNED_CASES) == 7


@pytest.mark.parametrize("name", sorted(SCORER_CASES))
def test_broken_scorer_weights_are_one_exact_line_in_the_library_cli_and_app(name, tmp_path, page, scope):
    make, message = SCORER_CASES[name]
    path = build(tmp_path / name, make)
    expected = message.format(p=path)
    config = MVP.__class__(texture=MVP.texture, scorer=ScorerConfig(weights=str(path)))
    assert outcome(lambda: ARR(config, query_encoder=HashingQueryEncoder())) == ("error", expected)
    code, _, err = run_cli(["look", str(page), "Where?", "--channels", "mvp", "--query-encoder", "hashing",
                            "--saccades", "4", "--scorer-weights", str(path), "--out", str(tmp_path / "x.png")])
    assert (code, err.strip().splitlines()[-1]) == (2, f"arr-coc: error: {expected}")
    assert not (tmp_path / "x.png").exists()
    settings = Settings(saccades=4, channels=MVP_CHANNELS, weights=str(path))
    assert outcome(lambda: scope.run(read_upload(page), "Where?", settings)) == ("error", expected)


@pytest.mark.parametrize("name", sorted(LEARNED_CASES))
def test_broken_selector_and_pruner_weights_are_one_exact_line(name, tmp_path):
    kind, make, message = LEARNED_CASES[name]
    path = build(tmp_path / name, make)
    assert outcome(lambda: W.load_learned(kind, path)) == ("error", message.format(p=path))
