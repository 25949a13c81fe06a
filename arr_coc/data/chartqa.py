"""ChartQA: official JSON (human + augmented) + PNGs, or its parquet export; metric relaxed accuracy."""
from __future__ import annotations

from pathlib import Path

from arr_coc.data.datasets import DatasetSpec, Record, register
from arr_coc.data.vqa import ImageFinder, Located, as_answers, benchmark_record, json_items, read_benchmark


def _chartqa_json(path: Path, finder: ImageFinder) -> list[Located]:
    """``[{"imgname", "query", "label"}]``, images in ``png/`` beside the JSON."""
    part = path.stem.rsplit("_", 1)[-1]  # human | augmented: their ids may repeat across the two files
    records = []
    for n, d in enumerate(json_items(path)):
        where = f"{path}: item {n}"
        if not isinstance(d.get("imgname"), str):
            raise ValueError(f"{where}: no 'imgname'")
        png = path.parent / "png" / d["imgname"]
        if not png.is_file():
            raise FileNotFoundError(f"{where}: image {png} not found (ChartQA keeps them in png/ beside the JSON)")
        records.append((where, benchmark_record(CHARTQA, f"{part}:{n}", png, Path(d["imgname"]).stem,
                                                d.get("query"), as_answers(d.get("label"), where), where)))
    return records


def load_chartqa(root: Path | None = None, *, split: str | None = None) -> list[Record]:
    """ChartQA: official JSON (human + augmented) + PNGs, or its parquet export; metric relaxed accuracy."""
    # test/test_human.json, test/test_augmented.json
    return read_benchmark(CHARTQA, root, split, r".*_(human|augmented)\.json", _chartqa_json)


CHARTQA = register(DatasetSpec("chartqa", "ChartQA", load_chartqa, splits="official", metric="relaxed_accuracy",
                               reader="vlm"))
