"""Corpus: property-based fuzzing of the API boundary, ``ARR()(image, question, saccades=...)``.

Whatever arrives -- arrays of any dtype, shape and values (NaN, inf, out of range), tensors, PIL images,
any text (invisible, surrogates), any K (strings, floats, bools, negatives, huge) -- the call returns
exactly K distinct in-bounds saccades, or raises one line a user can act on.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from corpus_checks import outcome
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from arr_coc.config import ARRConfig, ScorerConfig, TextureConfig
from arr_coc.engine.pipeline import ARR
from arr_coc.engine.query import HashingQueryEncoder
from arr_coc.engine.texture import MVP_CHANNELS

EXAMPLES = 150  # cases per property; small images keep each call a few milliseconds


@pytest.fixture(scope="module")
def arr() -> ARR:
    config = ARRConfig(texture=TextureConfig(channels=MVP_CHANNELS), scorer=ScorerConfig(weights="none"))
    return ARR(config, query_encoder=HashingQueryEncoder()).eval()


DTYPES = (np.uint8, np.uint16, np.float32, np.float64, np.bool_, np.int32, np.int64, np.float16, np.complex64)


@st.composite
def arrays(draw) -> np.ndarray:
    h, w = draw(st.integers(0, 90)), draw(st.integers(0, 90))
    channels = draw(st.sampled_from([None, 1, 2, 3, 4, 5]))
    shape = (h, w) if channels is None else draw(st.sampled_from([(h, w, channels), (channels, h, w)]))
    dtype = draw(st.sampled_from(DTYPES))
    special = draw(st.sampled_from(["unit", "byte", "nan", "inf", "negative", "big"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    x = rng.random(shape)
    if special == "byte":
        x = x * 255
    elif special == "nan" and x.size:
        x.flat[0] = np.nan
    elif special == "inf" and x.size:
        x.flat[-1] = np.inf
    elif special == "negative":
        x = x - 0.5
    elif special == "big":
        x = x * 1e6
    with np.errstate(invalid="ignore", over="ignore"):
        return x.astype(dtype)


images = st.one_of(
    arrays(),
    arrays().map(lambda a: torch.from_numpy(a) if a.dtype != np.uint16 else torch.from_numpy(a.astype(np.int32))),
    st.tuples(st.sampled_from(["L", "RGB", "RGBA", "P", "1", "I", "F", "CMYK", "LA"]), st.integers(1, 90),
              st.integers(1, 90)).map(lambda t: Image.new(t[0], (t[1], t[2]))),
    st.sampled_from([None, 3, "no/such/file.png", b"bytes", [], [np.zeros((56, 56, 3), np.uint8)] * 2]),
)
questions = st.one_of(st.text(max_size=40), st.text(st.characters(codec=None, categories=None), max_size=8),
                      st.sampled_from(["\u200b", " \t", "What is the total?", "\udcff"]), st.none(), st.integers())
saccades_values = st.one_of(st.none(), st.integers(-3, 400), st.sampled_from(["16", 16.0, True, 2**70, float("nan")]))


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(image=images, question=questions, saccades=saccades_values)
def test_any_input_gives_exactly_k_cells_or_one_line(arr, image, question, saccades):
    kind, result = outcome(lambda: arr(image, question, saccades=saccades))
    if kind == "error":
        return
    k = arr.config.sampler.saccades if saccades is None else saccades
    pos = result.positions  # [B, K, 2] (y, x) cells
    assert pos.shape[1] == k and result.scores.shape == pos.shape[:2]
    for b, (h, w) in enumerate(result.canvas.sizes):
        cells = [tuple(c) for c in pos[b].tolist()]
        assert len(set(cells)) == k  # distinct
        assert all(0 <= y < h // result.canvas.cell and 0 <= x < w // result.canvas.cell for y, x in cells)
    assert bool(torch.isfinite(result.patches).all())


@settings(max_examples=EXAMPLES // 3, deadline=None)
@given(h=st.integers(28, 400), w=st.integers(28, 400), saccades=st.integers(1, 40))
def test_any_legal_size_and_k_is_served_exactly(arr, h, w, saccades):
    kind, result = outcome(lambda: arr(np.zeros((h, w, 3), np.uint8), "Where?", saccades=saccades))
    if kind == "error":  # only an aspect beyond the limit or a K beyond the image's cells
        assert "aspect ratio" in result or "exceeds" in result, result
        return
    assert result.positions.shape == (1, saccades, 2)
