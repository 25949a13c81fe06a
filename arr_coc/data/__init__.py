"""Question-answer records and the datasets that make them, one module per family; box geometry.

Training and evaluation both read records; neither imports the other, so the records live here, below both.
:mod:`arr_coc.data.datasets` says what a dataset is and how to add one.
"""
# isort: off
# importing a family registers its specs; this order is the order ``DATASETS.names()`` lists them in
from arr_coc.data import datasets  # noqa: F401  (first: the registry)
from arr_coc.data import funsd, sroie, coco, jsonl, texlive  # noqa: F401
from arr_coc.data import paraphrase, image_paraphrase  # noqa: F401  (hand-written questions in a user's words)
from arr_coc.data import contexts, context_jsonl  # noqa: F401  (records that are whole contexts)
from arr_coc.data import docvqa, textvqa, chartqa  # noqa: F401
from arr_coc.data import mpdocvqa, slidevqa  # noqa: F401  (multi-page: several images per record)
# isort: on
