"""DocVQA (single page) and InfographicVQA: official JSON + images, or their parquet exports; metric ANLS."""
from __future__ import annotations

from pathlib import Path

from arr_coc.data.datasets import DatasetSpec, Record, register
from arr_coc.data.vqa import ImageFinder, Located, as_answers, benchmark_record, json_items, question_id, read_benchmark


def _docvqa_json(spec: DatasetSpec, path: Path, finder: ImageFinder) -> list[Located]:
    """``{"data": [{"questionId", "question", "image" (DocVQA) or "image_local_name" (InfoVQA), "answers"}]}``."""
    records = []
    for n, d in enumerate(json_items(path)):
        where = f"{path}: item {n}"
        image = d.get("image") or d.get("image_local_name")
        if not isinstance(image, str):
            raise ValueError(f"{where}: no 'image' (DocVQA) or 'image_local_name' (InfoVQA) file name")
        rid = question_id(d.get("questionId"), str(n), where)
        img = finder.find(image, (path.parent, path.parent.parent), where)
        records.append((where, benchmark_record(spec, rid, img, Path(image).stem, d.get("question"),
                                                as_answers(d.get("answers"), where), where)))
    return records


def load_docvqa(root: Path | None = None, *, split: str | None = None) -> list[Record]:
    """DocVQA (single page): official JSON + document images, or its parquet export; metric ANLS."""
    # val_v1.0.json, val_v1.0_withQT.json; not InfoVQA's infographicsVQA_val_v1.0.json
    return read_benchmark(DOCVQA, root, split, r"(?!.*infographic).*v1\.0.*\.json",
                          lambda f, finder: _docvqa_json(DOCVQA, f, finder))


def load_infovqa(root: Path | None = None, *, split: str | None = None) -> list[Record]:
    """InfographicVQA: official JSON + infographics, or its parquet export; metric ANLS."""
    return read_benchmark(INFOVQA, root, split, r"infographic.*\.json",
                          lambda f, finder: _docvqa_json(INFOVQA, f, finder))


# document images without answer boxes: the VLM reads them
DOCVQA = register(DatasetSpec("docvqa", "DocVQA", load_docvqa, splits="official", metric="anls", reader="vlm"))
INFOVQA = register(DatasetSpec("infovqa", "InfoVQA", load_infovqa, splits="official", metric="anls", reader="vlm"))
