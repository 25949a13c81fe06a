"""Tests for arr_coc.engine.texture: every registered channel, the known values of the built-in ones, the pyramid."""
from __future__ import annotations

import math

import pytest
import torch
from tolerances import TEXTURE, assert_close_reduction

import arr_coc  # noqa: F401  (registers the model-based channels too)
from arr_coc.engine.channel_registry import CHANNELS, ChannelSpec, normalize_per_image
from arr_coc.engine.query import HashingQueryEncoder
from arr_coc.engine.texture import MVP_CHANNELS, Texture, channel_layout, channel_width, compute_texture, pool_to_cells
from arr_coc.registry import UnknownNameError

LUMA = torch.tensor([0.299, 0.587, 0.114]).view(1, 3, 1, 1)


def _images(b: int = 3, h: int = 24, w: int = 20, seed: int = 0) -> torch.Tensor:
    """Noise plus a bright rectangle per image, so every channel has structure to respond to."""
    g = torch.Generator().manual_seed(seed)
    x = 0.3 * torch.rand(b, 3, h, w, generator=g)
    for i in range(b):
        x[i, :, 3 + i : 9 + i, 4 + 2 * i : 12 + 2 * i] += 0.6
    return x


ENCODER = HashingQueryEncoder()
# Channels whose model the user must supply (no weights here); their own test file builds tiny ones.
# first_look is read from a VLM's attention, not computed from pixels.
NEEDS_WEIGHTS = {"clip": "tests/channels/test_channels_clip.py", "first_look": "tests/vlm/test_vlm_ask.py"}
NAMES = [n for n in CHANNELS.names() if n not in NEEDS_WEIGHTS]


def _one(pixels: torch.Tensor, name: str, prev: torch.Tensor | None = None) -> torch.Tensor:
    queries = ["What is the total?"] * pixels.shape[0] if CHANNELS.get(name).needs_query else None
    return compute_texture(pixels, (name,), prev=prev, queries=queries, query_encoder=ENCODER)


# ---------------------------------------------------------------- every registered channel


@pytest.mark.parametrize("name", NAMES)
def test_every_channel_gives_finite_float32_in_unit_range_of_its_width(name):
    pixels, prev = _images(), _images(seed=1)
    out = _one(pixels, name, prev)
    assert out.shape == (3, CHANNELS.get(name).width, 24, 20)
    assert out.dtype == torch.float32
    assert torch.isfinite(out).all()
    assert out.min() >= -1e-6 and out.max() <= 1 + 1e-6


@pytest.mark.parametrize("name", NAMES)
def test_every_channel_batched_equals_per_image_stacked(name):
    pixels, prev = _images(), _images(seed=1)
    batched = _one(pixels, name, prev)
    single = torch.cat([_one(pixels[i : i + 1], name, prev[i : i + 1]) for i in range(3)])
    assert_close_reduction(batched, single, **TEXTURE)


@pytest.mark.parametrize("name", NAMES)
def test_every_channel_has_a_one_line_doc_and_float64_stays_float64(name):
    spec = CHANNELS.get(name)
    assert spec.doc and "\n" not in spec.doc
    assert _one(_images().double(), name).dtype == torch.float64


@pytest.mark.parametrize("name", NAMES)
def test_every_channel_accepts_non_contiguous_pixels(name):
    pixels = _images(h=20, w=24).transpose(-1, -2)  # [3, 3, 24, 20] view
    assert not pixels.is_contiguous()
    assert_close_reduction(_one(pixels, name), _one(pixels.contiguous(), name), **TEXTURE)  # strided kernels


@pytest.mark.parametrize("name", [n for n in NAMES if CHANNELS.get(n).differentiable])
def test_differentiable_channels_pass_gradcheck_in_float64(name):
    pixels = _images(b=1, h=6, w=7).double().requires_grad_(True)
    prev = _images(b=1, h=6, w=7, seed=3).double()
    assert torch.autograd.gradcheck(lambda p: _one(p, name, prev), (pixels,), eps=1e-6, atol=1e-4)


@pytest.mark.parametrize("name", [n for n in NAMES if CHANNELS.get(n).differentiable])
def test_differentiable_channels_give_finite_nonzero_gradients_at_a_resized_scale(name):
    # 96 px wide: saliency goes through its 64 px resize and back, unlike in the tiny gradcheck image.
    pixels = _images(b=2, h=80, w=96).requires_grad_(True)
    out = _one(pixels, name, _images(b=2, h=80, w=96, seed=5))
    (out * torch.rand_like(out)).sum().backward()
    assert torch.isfinite(pixels.grad).all()
    assert (pixels.grad.flatten(1).abs().sum(1) > 0).all()  # every image gets gradient


@pytest.mark.parametrize("name", [n for n in NAMES if not CHANNELS.get(n).differentiable])
def test_non_differentiable_channels_carry_no_graph(name):
    out = _one(_images().requires_grad_(True), name)
    assert not out.requires_grad


def test_default_channels_are_the_13_wide_mvp():
    assert MVP_CHANNELS == (
        "rgb", "y", "x", "eccentricity", "edges", "edges_inv", "highpass", "lowpass", "motion", "saliency", "distance",
    )
    assert channel_width() == 13
    layout = channel_layout()
    assert layout["rgb"] == slice(0, 3) and layout["distance"] == slice(12, 13)
    assert [s.start for s in layout.values()] == [0, *range(3, 13)]
    assert compute_texture(_images()).shape == (3, 13, 24, 20)


def test_texture_module_equals_function_and_rejects_unknown_names_on_construction():
    module = Texture(("edges", "rgb"))
    assert module.width == 4
    assert torch.equal(module(_images()), compute_texture(_images(), ("edges", "rgb")))  # the module calls it
    with pytest.raises(UnknownNameError):
        Texture(("edges", "nope"))


# ---------------------------------------------------------------- known values


def test_flat_image_gives_zero_structure_and_no_nan():
    tex = compute_texture(torch.full((2, 3, 32, 32), 0.4))
    layout = channel_layout()
    assert torch.isfinite(tex).all()
    for name in ("edges", "highpass", "saliency", "motion"):
        assert tex[:, layout[name]].abs().max() == 0, name
    assert (tex[:, layout["edges_inv"]] == 1).all()
    assert (tex[:, layout["distance"]] == 1).all()  # no edge anywhere: everything is as far as it gets
    lowpass = tex[:, layout["lowpass"]]  # a separable Gaussian: 2 sums of normalised weights times 0.4
    assert_close_reduction(lowpass, torch.full((2, 1, 32, 32), 0.4), reduction_len=32, depth=2)


def test_flat_image_next_to_a_textured_one_stays_zero_and_the_other_spans_unit_range():
    pixels = torch.stack([torch.full((3, 16, 16), 0.7), _images(b=1, h=16, w=16)[0]])
    edges = _one(pixels, "edges")
    assert edges[0].max() == 0
    assert edges[1].min() == 0 and edges[1].max() == 1


def test_normalize_per_image_is_min_max_per_image_and_zero_when_flat():
    x = torch.tensor([[[[2.0, 4.0, 6.0]]], [[[5.0, 5.0, 5.0]]]])
    assert normalize_per_image(x).flatten().tolist() == [0.0, 0.5, 1.0, 0.0, 0.0, 0.0]


def test_vertical_step_edge_peaks_on_the_step_columns():
    pixels = torch.zeros(1, 3, 16, 16)
    pixels[..., 8:] = 1.0
    edges = _one(pixels, "edges")[0, 0]  # [H, W]
    assert (edges[:, 7:9] == 1).all()
    assert edges[:, :7].max() == 0 and edges[:, 9:].max() == 0
    torch.testing.assert_close(_one(pixels, "edges_inv")[0, 0], 1 - edges)


@pytest.mark.parametrize("h, w", [(16, 16), (300, 301)])  # 300 x 301 runs the reduced path (factor 3, ragged)
def test_distance_is_zero_on_the_edge_and_grows_away_from_it(h, w):
    pixels = torch.zeros(1, 3, h, w)
    step = w // 2
    pixels[..., step:] = 1.0
    dist = _one(pixels, "distance")[0, 0]  # [H, W]
    assert (dist[:, step - 1 : step + 1] == 0).all()
    left, right = dist[:, : step - 1].flip(-1), dist[:, step + 1 :]  # both read away from the step
    for side in (left, right):
        assert (side.diff(dim=-1) >= -1e-6).all()
        assert (side[:, -1] > side[:, 0]).all()
    assert dist.max() == pytest.approx(1.0)


def test_eccentricity_is_zero_at_the_centre_and_one_at_the_corners():
    ecc = _one(torch.rand(1, 3, 9, 15), "eccentricity")[0, 0]
    assert ecc[4, 7] == pytest.approx(0.0, abs=1e-6)
    for y, x in [(0, 0), (0, 14), (8, 0), (8, 14)]:
        assert ecc[y, x] == pytest.approx(1.0)
    assert ecc[4, 0] == pytest.approx(1 / math.sqrt(2))  # middle of the left side


def test_y_and_x_are_linear_ramps_from_zero_to_one():
    pixels = torch.rand(2, 3, 5, 9)
    y, x = _one(pixels, "y"), _one(pixels, "x")
    torch.testing.assert_close(y, torch.linspace(0, 1, 5).view(1, 1, 5, 1).expand(2, 1, 5, 9))
    torch.testing.assert_close(x, torch.linspace(0, 1, 9).view(1, 1, 1, 9).expand(2, 1, 5, 9))


def test_motion_is_zero_without_prev_and_absolute_luma_difference_with_it():
    pixels, prev = _images(), _images(seed=1)
    assert (_one(pixels, "motion") == 0).all()
    expected = ((pixels - prev) * LUMA).sum(1, keepdim=True).abs()
    # grey, difference: the terms are pixels in [0, 1], whatever the difference cancels to
    assert_close_reduction(_one(pixels, "motion", prev), expected, reduction_len=3, depth=2, scale=1.0)


def test_lowpass_is_a_blur_that_keeps_the_mean_of_the_luma():
    pixels = _images(b=1, h=32, w=32)
    low = _one(pixels, "lowpass")
    gray = (pixels * LUMA).sum(1, keepdim=True)
    assert low.std() < gray.std()
    assert low.mean() == pytest.approx(gray.mean().item(), abs=5e-3)


def test_highpass_responds_to_a_single_bright_dot():
    pixels = torch.zeros(1, 3, 15, 15)
    pixels[..., 7, 7] = 1.0
    high = _one(pixels, "highpass")[0, 0]
    assert high[7, 7] == 1 and high[0, 0] == 0


@pytest.mark.parametrize("shape", [(64, 64), (128, 96)])
def test_saliency_peaks_on_a_small_bright_square_on_a_flat_background(shape):
    h, w = shape
    pixels = torch.full((1, 3, h, w), 0.2)
    y0, x0, side = h // 2 + 8, w // 3, h // 10
    pixels[..., y0 : y0 + side, x0 : x0 + side] = 1.0
    sal = _one(pixels, "saliency")[0, 0]
    peak_y, peak_x = divmod(int(sal.argmax()), w)
    assert y0 - 2 <= peak_y < y0 + side + 2 and x0 - 2 <= peak_x < x0 + side + 2
    assert sal.max() == 1
    assert sal[:side, :side].max() < 0.2  # far corner of the flat background


# ---------------------------------------------------------------- errors


def test_unknown_channel_error_lists_the_known_names():
    with pytest.raises(UnknownNameError, match="known: rgb, y, x") as info:
        compute_texture(torch.rand(1, 3, 8, 8), ("rgb", "sparkle"))
    assert "sparkle" in str(info.value) and "distance" in str(info.value)
    with pytest.raises(KeyError):
        channel_width(("sparkle",))


@pytest.mark.parametrize(
    "pixels, error, text",
    [
        (torch.rand(3, 8, 8), ValueError, r"\(3, 8, 8\)"),
        (torch.rand(1, 1, 8, 8), ValueError, r"\(1, 1, 8, 8\)"),
        (torch.zeros(1, 3, 8, 8, dtype=torch.uint8), TypeError, "uint8"),
        ([[0.0]], TypeError, "list"),
    ],
)
def test_wrong_pixels_raise_with_the_actual_shape_or_type(pixels, error, text):
    with pytest.raises(error, match=text):
        compute_texture(pixels)


def test_prev_of_another_shape_and_bad_channel_lists_raise():
    with pytest.raises(ValueError, match=r"\(1, 3, 8, 9\)"):
        compute_texture(torch.rand(1, 3, 8, 8), prev=torch.rand(1, 3, 8, 9))
    with pytest.raises(TypeError, match="string"):
        compute_texture(torch.rand(1, 3, 8, 8), "rgb")
    with pytest.raises(ValueError, match="twice"):
        channel_layout(("rgb", "rgb"))
    with pytest.raises(ValueError, match="empty"):
        compute_texture(torch.rand(1, 3, 8, 8), ())


def test_a_channel_returning_the_wrong_width_is_reported_by_name(monkeypatch):
    bad = ChannelSpec("bad", 2, lambda inputs: inputs.gray, True, "claims 2 channels, returns 1")
    monkeypatch.setitem(CHANNELS._items, "bad", bad)
    with pytest.raises(ValueError, match=r"'bad' returned shape \(1, 1, 8, 8\), expected \(1, 2, 8, 8\)"):
        compute_texture(torch.rand(1, 3, 8, 8), ("bad",))


def test_registering_a_channel_name_twice_raises():
    spec = CHANNELS.get("rgb")
    with pytest.raises(ValueError, match="already registered"):
        CHANNELS.register("rgb")(spec)


# ---------------------------------------------------------------- memory


def test_pool_to_cells_equals_manual_cell_means():
    tex = torch.rand(2, 5, 56, 84)
    manual = tex.view(2, 5, 2, 28, 3, 28).mean(dim=(3, 5))
    assert_close_reduction(pool_to_cells(tex, 28), manual, reduction_len=28 * 28)  # two orders of one mean
    with pytest.raises(ValueError, match="multiples of cell=32"):
        pool_to_cells(tex, 32)


def test_euclidean_distance_transform_equals_scipy_exactly():
    from scipy.ndimage import distance_transform_edt

    from arr_coc.engine.pixel_channels import euclidean_distance_transform

    g = torch.Generator().manual_seed(0)
    masks = torch.rand(3, 1, 23, 31, generator=g) > 0.97
    masks[2] = False
    masks[2, 0, 11, 0] = True  # a single feature pixel at the left border
    got = euclidean_distance_transform(masks)
    for b in range(3):
        ref = distance_transform_edt(~masks[b, 0].numpy())
        # squared distances are whole numbers (exact in float32): dy² + dx² and one square root
        assert_close_reduction(got[b, 0], torch.from_numpy(ref).float(), reduction_len=2, depth=2)


def test_pooling_each_channel_as_it_comes_equals_pooling_the_whole_stack_bit_for_bit():
    pixels, prev = _images(2, 56, 84), _images(2, 56, 84, seed=1)
    names = tuple(n for n in NAMES if not CHANNELS.get(n).needs_query) + ("text_match", "key_value")
    kw = dict(prev=prev, queries=["What is the total?"] * 2, query_encoder=ENCODER)
    stacked = pool_to_cells(compute_texture(pixels, names, **kw), 28)
    cells = compute_texture(pixels, names, cell=28, **kw)
    assert cells.shape == (2, channel_width(names), 2, 3) and torch.equal(cells, stacked)
    assert not torch.equal(compute_texture(pixels.flip(-1), names, cell=28, **kw), stacked)  # control: other pixels
    with pytest.raises(ValueError, match=r"H, W = 56, 84 must be multiples of cell=32"):
        compute_texture(pixels, names, cell=32, **kw)


class _CountingEncoder(HashingQueryEncoder):
    def __init__(self) -> None:
        super().__init__()
        self.texts: list[str] = []

    def encode(self, queries):
        self.texts.extend(queries)
        return super().encode(queries)


def _page_text():
    from arr_coc.engine.channel_registry import PageText

    return PageText((), (("Total: 12.50", (4.0, 4.0, 20.0, 60.0)), ("Date 9/3/92", (30.0, 4.0, 46.0, 60.0))))


def test_prepare_texture_embeds_the_lines_once_without_a_question_and_returns_the_channels_without_prepare():
    from arr_coc.engine.cache import ImageCache
    from arr_coc.engine.texture import prepare_texture

    pixels, enc, cache = _images(1, 56, 84), _CountingEncoder(), ImageCache()
    rest = prepare_texture(pixels, ("text_match", "key_value", "first_look"), query_encoder=enc, cache=cache,
                           text=[_page_text()])
    assert rest == ("first_look",) and enc.texts == ["Total:", "12.50", "Date 9/3/92"]  # split key and value
    enc.texts.clear()
    compute_texture(pixels, ("text_match", "key_value"), queries=["What is the total?"], query_encoder=enc,
                    cache=cache, text=[_page_text()])
    assert enc.texts == ["What is the total?"]  # the lines came from the cache
    fresh = _CountingEncoder()  # control: without prepare the question's channels embed the lines themselves
    compute_texture(pixels, ("text_match",), queries=["What is the total?"], query_encoder=fresh,
                    cache=ImageCache(), text=[_page_text()])
    assert fresh.texts == ["What is the total?", "Total:", "12.50", "Date 9/3/92"]
    with pytest.raises(ValueError, match="text_match channel embeds each image's lines .* pass query_encoder="):
        prepare_texture(pixels, ("text_match",), cache=ImageCache(), text=[_page_text()])


def test_prepare_belongs_to_question_coupled_channels_only():
    from arr_coc.engine.channel_registry import register_channel

    with pytest.raises(ValueError, match="'nope': prepare is the per-image part of a question-coupled channel"):
        register_channel("nope", prepare=lambda inputs: None)
    assert "nope" not in CHANNELS.names()
