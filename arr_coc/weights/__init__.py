"""Trained weights as one concern: the files, the registry of shipped weights, their loaders, the leakage check.

- :mod:`~arr_coc.weights.files`: how every arr-coc file is written and read (format tags, ``weights_only``).
- :mod:`~arr_coc.weights.registry`: the shipped weights by name (``registry.json``), what each was trained on.
- :mod:`~arr_coc.weights.loaders`: scorer (+ sampler) weights into an ARR, the selector and the pruner.
- :mod:`~arr_coc.weights.leakage`: weights are never scored on images they learned from (by dataset and by pixels).
"""
from __future__ import annotations

from arr_coc.weights.files import (
                                   LEARNED_FORMAT,
                                   LEARNED_KINDS,
                                   SCORER_FORMAT,
                                   atomic_save,
                                   file_sha256,
                                   load_file,
                                   weights_digest,
)
from arr_coc.weights.leakage import (
                                   SCORER_FREE,
                                   image_digests,
                                   pixel_digest,
                                   refuse_leakage,
                                   refuse_seen_images,
                                   trained_images,
                                   trained_on,
                                   weights_in_play,
)
from arr_coc.weights.loaders import encoder_name, load_learned, load_learned_methods, load_scorer_weights
from arr_coc.weights.registry import (
                                   PACKAGED,
                                   SHIPPED,
                                   Entry,
                                   describe,
                                   entries,
                                   entry,
                                   entry_of,
                                   is_name,
                                   publish,
                                   resolve,
)

__all__ = ["LEARNED_FORMAT", "LEARNED_KINDS", "PACKAGED", "SCORER_FORMAT", "SCORER_FREE", "SHIPPED", "Entry",
           "atomic_save", "describe", "encoder_name", "entries", "entry", "entry_of", "file_sha256", "image_digests",
           "is_name", "load_file", "load_learned", "load_learned_methods", "load_scorer_weights", "pixel_digest",
           "publish", "refuse_leakage", "refuse_seen_images", "resolve", "trained_images", "trained_on",
           "weights_digest", "weights_in_play"]
