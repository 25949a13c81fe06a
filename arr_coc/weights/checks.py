"""What a weights or checkpoint file must hold to fit the model it is loaded into, checked before loading.

After the format tag come the fields (present, of the right type), the sizes a file's config asks
modules to be built with (bounded before any module is built: a damaged width must not allocate
terabytes) and the tensors (every key the model has and no other, each a dense tensor of the model's
shape and dtype, finite). Anything else is a :class:`~arr_coc.errors.WeightsError` of one line naming
the file and what is wrong.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import torch
from torch import Tensor, nn

from arr_coc.errors import WeightsError


def check_fields(path: str | Path, saved: Mapping[str, Any], fields: Mapping[str, type | tuple[type, ...]],
                 optional: Mapping[str, type | tuple[type, ...]] | None = None) -> None:
    """Each of ``fields`` present in ``saved`` with its type; each of ``optional`` of its type when present.

    >>> check_fields("w.pt", {"kind": "pruner", "channels": "rgb"}, {"kind": str, "channels": list})
    Traceback (most recent call last):
    ...
    arr_coc.errors.WeightsError: w.pt: field 'channels' is a str, expected a list
    """
    for name in fields:
        if name not in saved:
            raise WeightsError(f"{path}: lacks the field {name!r}")
    for name, types in {**fields, **(optional or {})}.items():
        types = types if isinstance(types, tuple) else (types,)
        value = saved.get(name)
        if name in saved and (not isinstance(value, types) or isinstance(value, bool) and bool not in types):
            raise WeightsError(f"{path}: field {name!r} is a {type(value).__name__}, expected a "
                               f"{' or '.join(t.__name__ for t in types)}")


def check_names(path: str | Path, name: str, values: Any) -> list[str]:
    """A list of strings (channel names), or one line saying what is not."""
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise WeightsError(f"{path}: field {name!r} must be a list of names, got {values!r:.60}")
    if len(values) > MAX_CHANNELS:
        raise WeightsError(f"{path}: field {name!r} names {len(values)} channels, above the bound {MAX_CHANNELS}")
    return values


# The largest value each size field of a weights file's config may hold, checked before any module is built.
# Every bound is far above what arr-coc builds (widths 16..384, cells 14..32, 273 bins, 16x16 gestalts) and
# far below what a machine holds: the widest, a Linear of 8192 x 8192 weights, is 256 MB in float32.
SIZE_BOUNDS = {
    "query_dim": 8192,  # question embedding width (MiniLM 384; large text encoders up to 4096)
    "hidden": 8192,  # MLP widths: the scorer's context MLP, the pruner's, the adaptive sampler's
    "dim": 8192,  # the pruner's token width (texture channels, ~16)
    "width": 1024,  # the selector's convolution channels (16)
    "cell": 1024,  # token cell in px (14..32)
    "stem": 1024,  # the selector's first stride (4), a divisor of the cell
    "n_bins": 65536,  # the log-polar sampler's bins (273)
    "max_grid": 1024,  # the adaptive sampler's largest grid side (8)
    "grid": 16384,  # gestalt rows / cols (16); a canvas holds at most 16384 cells
    "saccades": 2 ** 24,  # K saccades of a sampler config (273)
}
MAX_CHANNELS = 256  # texture channels a file may name (the default set has 16)


def check_sizes(path: str | Path, config: Any, where: str = "config") -> None:
    """Every size field (:data:`SIZE_BOUNDS`) anywhere in ``config`` (nested dicts and lists) within its bound.

    What is not a whole number is left to the module's own check; a whole number above its bound (or below 1)
    is one line naming the field and the bound.

    >>> check_sizes("w", {"scorer": {"query_dim": 384, "hidden": 64}, "gestalt": {"grid": [16, 16]}})
    >>> check_sizes("w", {"scorer": {"query_dim": 10**12}}, "arr_config")
    Traceback (most recent call last):
    ...
    arr_coc.errors.WeightsError: w: arr_config.scorer.query_dim = 1000000000000 is outside 1..8192, the bound of that size; the file is damaged or was not made by arr-coc
    """
    if isinstance(config, Mapping):
        for key, value in config.items():
            name = f"{where}.{key}"
            bound = SIZE_BOUNDS.get(key) if isinstance(key, str) else None
            if bound is not None:
                for v in value if isinstance(value, (list, tuple)) else (value,):
                    if isinstance(v, int) and not isinstance(v, bool) and not 1 <= v <= bound:
                        raise WeightsError(f"{path}: {name} = {v} is outside 1..{bound}, the bound of that size; "
                                           f"the file is damaged or was not made by arr-coc")
            check_sizes(path, value, name)
    elif isinstance(config, (list, tuple)):
        for i, value in enumerate(config):
            check_sizes(path, value, f"{where}[{i}]")


def check_state(path: str | Path, state: Any, module: nn.Module, part: str) -> None:
    """``state`` fits ``module.load_state_dict`` exactly: same keys, dense finite tensors of the same shapes and dtypes.

    Args:
        path: the file, for the message.
        state: what the file holds for ``module``.
        module: the module it is loaded into.
        part: the name of that state dict in the file (``scorer``, ``sampler``, ``state``, ``objective``).
    """
    if not isinstance(state, Mapping):
        raise WeightsError(f"{path}: {part} is a {type(state).__name__}, not a dict of tensors")
    expected = module.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [str(k) for k in state if k not in expected]
    if missing:
        raise WeightsError(f"{path}: {part} lacks {_some(missing)} (it was made for another model)")
    if unexpected:
        raise WeightsError(f"{path}: {part} has unexpected {_some(unexpected)} (it was made for another model)")
    for key, want in expected.items():  # in the model's order: the same first complaint whatever the file's order
        value = state[key]
        where = f"{path}: {part}.{key}"
        if not isinstance(value, Tensor):
            raise WeightsError(f"{where} is a {type(value).__name__}, not a tensor")
        if value.layout != torch.strided or value.is_meta:
            raise WeightsError(f"{where} is a {'meta' if value.is_meta else str(value.layout)} tensor, not a dense one")
        if value.shape != want.shape:
            raise WeightsError(f"{where} has shape {list(value.shape)}, the model's is {list(want.shape)}")
        if value.dtype != want.dtype:
            raise WeightsError(f"{where} is {value.dtype}, the model's is {want.dtype}")
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise WeightsError(f"{where} holds NaN or infinite values")


def _some(keys: list[str]) -> str:
    shown = ", ".join(keys[:3])
    return shown + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")
