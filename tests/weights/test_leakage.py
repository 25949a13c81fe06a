"""Leakage by content: weights refuse images whose pixels they trained on, whatever the loader or weights path."""
import json
import shutil
from pathlib import Path

import pytest
import torch
from PIL import Image

from arr_coc import weights as W
from arr_coc.config import ARRConfig, ScorerConfig
from arr_coc.data.datasets import load_dataset
from arr_coc.engine.pipeline import ARR
from arr_coc.weights import catalog as registry


def page(path: Path, seed: int) -> Path:
    """A small image of its own (seeded noise), saved as ``path``."""
    g = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (24, 32, 3), generator=g, dtype=torch.uint8).numpy()
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path)
    return path


def jsonl(folder: Path, images: list[Path]) -> Path:
    """A JSONL dataset asking one question of each image."""
    lines = [json.dumps({"image": str(p), "question": "What is the total?", "answer": "9", "boxes": [[1, 1, 9, 9]]})
             for p in images]
    path = folder / "mine.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def trained(tmp_path: Path) -> tuple[Path, list[Path]]:
    """Scorer weights that record two training images (as `arr-coc train` does), and those images."""
    seen = [page(tmp_path / "train" / f"{i}.png", i) for i in range(2)]
    saved = W.read_weights(W.PACKAGED / "contextual", W.SCORER_FORMAT, "scorer weights")
    saved["trained_images"] = W.image_digests((p, f"sroie train image {p.stem}") for p in seen)
    return W.save_folder(saved, tmp_path / "scorer"), seen


def test_the_pixel_hash_follows_the_pixels_not_the_file(tmp_path: Path) -> None:
    a = page(tmp_path / "a.png", 0)
    Image.open(a).save(tmp_path / "b.tiff")  # lossless re-encoding, another format and name
    shutil.copyfile(a, tmp_path / "c.png")
    assert W.pixel_digest(a) == W.pixel_digest(tmp_path / "b.tiff") == W.pixel_digest(tmp_path / "c.png")
    assert W.pixel_digest(a) != W.pixel_digest(page(tmp_path / "d.png", 1))  # other pixels, other hash
    Image.open(a).save(tmp_path / "e.jpg", quality=95)  # lossy: other pixels, not caught (the module doc says so)
    assert W.pixel_digest(tmp_path / "e.jpg") != W.pixel_digest(a)


def test_weights_named_by_path_refuse_a_jsonl_of_their_training_images(trained, tmp_path: Path) -> None:
    weights, seen = trained
    copy = tmp_path / "elsewhere" / "renamed.png"
    copy.parent.mkdir()
    Image.open(seen[1]).save(copy)  # the same pixels under another name: the JSONL loader, not the dataset's
    records = load_dataset("jsonl", jsonl(tmp_path, [page(tmp_path / "new.png", 7), copy]))
    arr = ARR(ARRConfig(scorer=ScorerConfig(weights=str(weights))))
    with pytest.raises(ValueError) as err:
        W.refuse_leakage("jsonl", "test", arr, ("arr",), images=[r.image for r in records])
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"{copy} has the pixels of sroie train image 1, which the "
                                                      f"weights {weights} learned from or were chosen on")
    W.refuse_leakage("jsonl", "test", arr, ("full", "uniform_image"), images=[r.image for r in records])  # no scorer


def test_weights_named_by_registry_name_refuse_their_training_images(trained, tmp_path: Path, monkeypatch) -> None:
    weights, seen = trained
    shelf = tmp_path / "shelf"
    shelf.mkdir()
    monkeypatch.setattr(registry, "PACKAGED", shelf)
    W.publish(weights, "contextual", root=shelf)  # shipped under the default's name: ``auto`` loads it
    arr = ARR(ARRConfig())
    assert arr.weights_source == registry.SHIPPED + "contextual"
    with pytest.raises(ValueError, match=rf"^{seen[0]} has the pixels of sroie train image 0, which the weights "
                                         rf"{shelf / 'contextual'} learned from"):
        W.refuse_leakage("jsonl", None, arr, ("arr",), images=seen)
    assert W.entries(shelf)["contextual"].trained_on["hashed_images"] == 2


def test_unseen_images_pass_and_weights_without_hashes_check_nothing(trained, tmp_path: Path) -> None:
    weights, seen = trained
    unseen = [page(tmp_path / "test" / f"{i}.png", 100 + i) for i in range(3)]
    arr = ARR(ARRConfig(scorer=ScorerConfig(weights=str(weights))))
    W.refuse_leakage("jsonl", "test", arr, ("arr",), images=unseen)  # negative control: nothing raised
    hand_set = ARR(ARRConfig(scorer=ScorerConfig(weights="none")))
    W.refuse_leakage("jsonl", "test", hand_set, ("arr",), images=seen)  # no trained weights in play
    assert W.weights_in_play(hand_set, ("arr",)) == [] and W.weights_in_play(arr, ("arr",)) == [weights]


@pytest.mark.slow
def test_the_shipped_scorer_refuses_a_renamed_copy_of_a_form_it_trained_on(tmp_path: Path) -> None:
    from arr_coc.data.datasets import default_root

    root = default_root("funsd") / "training_data" / "images"
    if not root.is_dir():
        pytest.skip(f"FUNSD not found at {root} (set ARR_COC_DATA to the folder holding funsd/)")
    seen = W.trained_images(W.entry("contextual").path)
    assert len(seen) == W.entry("contextual").trained_on["hashed_images"] > 300
    trained_form = next(p for p in sorted(root.glob("*.png")) if W.pixel_digest(p) in seen)
    copy = tmp_path / "scan.tiff"
    Image.open(trained_form).save(copy)  # another name and format, the same pixels
    records = load_dataset("jsonl", jsonl(tmp_path, [copy]))
    with pytest.raises(ValueError, match=rf"^{copy} has the pixels of funsd (train|val) image {trained_form.stem}, "
                                         rf"which the weights .*contextual learned from"):
        W.refuse_leakage("jsonl", None, ARR(ARRConfig()), ("arr",), images=[r.image for r in records])
    W.refuse_leakage("jsonl", None, ARR(ARRConfig()), ("arr",), images=[page(tmp_path / "new.png", 3)])
