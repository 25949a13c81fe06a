"""Question-answer records (FUNSD, SROIE, COCO, JSONL with answer boxes; DocVQA, InfoVQA, TextVQA, ChartQA
without) and box geometry.

Training and evaluation both read records; neither imports the other, so the records live here, below both.
"""
from arr_coc.data import datasets, vqa  # noqa: F401  (registers the loaders)
