"""TextVQA: official JSON (10 answers per question) + images, or its parquet export; metric VQA accuracy."""
from __future__ import annotations

from pathlib import Path

from arr_coc.data.datasets import DatasetSpec, Record, register
from arr_coc.data.vqa import ImageFinder, Located, as_answers, benchmark_record, json_items, question_id, read_benchmark


def _textvqa_json(path: Path, finder: ImageFinder) -> list[Located]:
    """``{"data": [{"question_id", "question", "image_id", "answers"}]}``, images ``<image_id>.jpg``."""
    records = []
    for n, d in enumerate(json_items(path)):
        where = f"{path}: item {n}"
        if "image_id" not in d:
            raise ValueError(f"{where}: no 'image_id'")
        image_id = str(d["image_id"])
        bases = [path.parent / "train_images", path.parent / "test_images", path.parent]
        img = finder.find(f"{image_id}.jpg", bases, where)
        rid = question_id(d.get("question_id"), str(n), where)
        records.append((where, benchmark_record(TEXTVQA, rid, img, image_id, d.get("question"),
                                                as_answers(d.get("answers"), where), where)))
    return records


def load_textvqa(root: Path | None = None, *, split: str | None = None) -> list[Record]:
    """TextVQA: official JSON (10 answers per question) + images, or its parquet export; metric VQA accuracy."""
    # TextVQA_0.5.1_val.json; not the OCR files (TextVQA_Rosetta_OCR_v0.2_val.json)
    return read_benchmark(TEXTVQA, root, split, r"textvqa_[\d.]+_\w+\.json", _textvqa_json)


TEXTVQA = register(DatasetSpec("textvqa", "TextVQA", load_textvqa, splits="official", metric="vqa_accuracy",
                               reader="vlm"))
