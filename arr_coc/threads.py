"""Thread-limit safety: torch's CPU half-precision matmul under an OpenMP limit below torch's thread count.

With ``OMP_THREAD_LIMIT`` in the environment below :func:`torch.get_num_threads` (a common scheduler and
container setting), OpenMP starts fewer threads than torch splits the work into, and torch's CPU
bfloat16 / float16 matmul silently leaves the other threads' share unwritten: a (64x512)@(512x256)
bfloat16 product under ``OMP_THREAD_LIMIT=1`` with torch at 2 threads is wrong in 128 of its 256
columns (float32 is not affected). ``torch.set_num_threads(limit)`` computes correctly.

A process that owns its thread pool (the CLI, the server) calls :func:`fit_threads`; the library, which
must not change process state, calls :func:`check_threads` and refuses in one line.
"""
from __future__ import annotations

import os
import sys
from typing import Any

import torch

from arr_coc.errors import ThreadLimitError

HALF_DTYPES = (torch.bfloat16, torch.float16)
FIX = "unset OMP_THREAD_LIMIT or torch.set_num_threads({limit})"


def omp_limit() -> int | None:
    """The OpenMP thread limit ``OMP_THREAD_LIMIT`` sets, or None when unset or not a positive integer."""
    value = os.environ.get("OMP_THREAD_LIMIT", "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


def unsafe_threads() -> int | None:
    """The OpenMP limit when it is below torch's thread count (half-precision CPU matmul then goes wrong), else None."""
    limit = omp_limit()
    return limit if limit is not None and limit < torch.get_num_threads() else None


def check_threads(dtype: Any, device: Any, what: str) -> None:
    """Refuse in one line a half-precision CPU computation that the OpenMP limit would silently corrupt.

    Args:
        dtype: the computation's dtype (only bfloat16 / float16 are affected).
        device: where it runs (only the CPU is affected).
        what: who asks, for the message (e.g. ``"ask with a bfloat16 model"``).
    """
    if dtype not in HALF_DTYPES or torch.device(device).type != "cpu":
        return
    limit = unsafe_threads()
    if limit is not None:
        raise ThreadLimitError(f"{what} on the CPU: OMP_THREAD_LIMIT={limit} is below torch's "
                           f"{torch.get_num_threads()} threads, so its half-precision matmul computes only part "
                           f"of its output; {FIX.format(limit=limit)}")


def check_model(model: Any, what: str) -> None:
    """:func:`check_threads` for a VLM adapter (its language model and vision tower) or any module.

    Args:
        model: a VLM adapter (``.lm``, ``.visual``) or an ``nn.Module``.
        what: who asks, for the message (e.g. ``"ask"`` gives ``"ask with a bfloat16 model on the CPU: ..."``).
    """
    parts = [getattr(model, name) for name in ("lm", "visual") if hasattr(model, name)] or [model]
    for part in parts:
        weight = next(part.parameters(), None) if hasattr(part, "parameters") else None
        if weight is not None:
            check_threads(weight.dtype, weight.device, f"{what} with a {str(weight.dtype).removeprefix('torch.')} model")


_fitted = False


def fit_threads(prog: str = "arr-coc") -> int | None:
    """In a process that owns its thread pool (CLI, server): lower torch's threads to the OpenMP limit.

    Says so on stderr the first time. Returns the new thread count, or None when nothing changed.
    """
    global _fitted
    limit = unsafe_threads()
    if limit is None:
        return None
    was = torch.get_num_threads()
    torch.set_num_threads(limit)  # this process is the caller's own program: its thread pool is its own to size
    if not _fitted:
        print(f"{prog}: OMP_THREAD_LIMIT={limit} is below torch's {was} threads; using {limit} thread"
              f"{'s' if limit > 1 else ''} so half-precision matmul computes correctly", file=sys.stderr)
        _fitted = True
    return limit
