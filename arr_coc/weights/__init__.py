"""Trained weights as one concern: the files, the registry of shipped weights, their loaders, the leakage check.

- :mod:`~arr_coc.weights.files`: how every arr-coc file is written (atomically) and read (format tags, ``weights_only``).
- :mod:`~arr_coc.weights.folders`: weights as the Hub keeps them, ``model.safetensors`` + ``config.json``.
- :mod:`~arr_coc.weights.checks`: a file's fields and tensors checked against the module it is loaded into.
- :mod:`~arr_coc.weights.convert`: ``python -m arr_coc.weights.convert``, older ``.pt`` weights into folders.
- :mod:`~arr_coc.weights.catalog`: the shipped weights by name (``registry.json``), what each was trained on.
- :mod:`~arr_coc.weights.loaders`: scorer (+ sampler) weights into an ARR, the selector and the pruner.
- :mod:`~arr_coc.weights.leakage`: weights are never scored on images they learned from (by dataset and by pixels).
"""
from __future__ import annotations

from arr_coc.weights.catalog import (
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
from arr_coc.weights.checks import SIZE_BOUNDS, check_fields, check_names, check_sizes, check_state
from arr_coc.weights.files import (
                                   LEARNED_FORMAT,
                                   LEARNED_KINDS,
                                   SCORER_FORMAT,
                                   atomic_append,
                                   atomic_save,
                                   atomic_write,
                                   disk_full,
                                   file_sha256,
                                   load_file,
                                   weights_digest,
)
from arr_coc.weights.folders import CONFIG, MODEL, is_folder_weights, pretrained_path, read_weights, save_folder
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
from arr_coc.weights.loaders import (
                                   encoder_name,
                                   load_learned,
                                   load_learned_methods,
                                   load_scorer_weights,
                                   pretrained_config,
                                   scorer_file,
)

__all__ = ["CONFIG", "LEARNED_FORMAT", "LEARNED_KINDS", "MODEL", "PACKAGED", "SCORER_FORMAT", "SCORER_FREE",
           "SHIPPED", "SIZE_BOUNDS", "Entry", "atomic_append", "atomic_save", "atomic_write", "check_fields", "check_names",
           "check_sizes", "check_state",
           "describe", "disk_full", "encoder_name", "entries", "entry", "entry_of", "file_sha256", "image_digests",
           "is_folder_weights", "is_name", "load_file", "load_learned", "load_learned_methods", "load_scorer_weights",
           "pixel_digest", "pretrained_config", "pretrained_path", "publish", "read_weights", "refuse_leakage",
           "refuse_seen_images", "resolve", "save_folder", "scorer_file", "trained_images", "trained_on",
           "weights_digest", "weights_in_play"]
