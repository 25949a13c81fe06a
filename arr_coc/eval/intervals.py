"""95 % bootstrap intervals of the tables' means: resampled over questions, percentile, a fixed seed.

A mean over 40 questions of a 0-1 score moves by several points from one sample of questions to
the next; an interval beside it says how far. ``bootstrap_mean`` resamples the questions with
replacement (``RESAMPLES`` times, ``SEED`` fixed so a table is remade to the digit) and takes the
2.5th and 97.5th percentiles of the resampled means. ``bootstrap_ratio`` does the same for a ratio of
two means over the same questions (``arr``'s reading as a share of full resolution's), resampling
the questions as pairs, so that a hard question drawn twice counts twice in both means.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

RESAMPLES = 2000  # the percentiles' Monte Carlo error is then ~0.1 of a point on 40 questions
SEED = 0
LEVEL = 0.95


def _finite(values: Sequence[float | None]) -> np.ndarray:
    return np.array([v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))], float)


def _percentiles(stats: np.ndarray, level: float) -> tuple[float, float]:
    tail = 100 * (1 - level) / 2
    lo, hi = np.percentile(stats, [tail, 100 - tail])
    return float(lo), float(hi)


def bootstrap_mean(values: Sequence[float | None], *, resamples: int = RESAMPLES, seed: int = SEED,
                   level: float = LEVEL) -> tuple[float, float]:
    """(lo, hi): the percentile bootstrap interval of the mean of ``values`` (None and NaN left out).

    Fewer than two values give (nan, nan): one question says nothing of how the mean varies (its
    resamples all equal it). Equal values give an interval of zero width.

    >>> bootstrap_mean([0.5, 0.5, 0.5])
    (0.5, 0.5)
    >>> lo, hi = bootstrap_mean([0.0, 1.0] * 20)
    >>> round(lo, 3), round(hi, 3)
    (0.35, 0.65)
    """
    vals = _finite(values)
    if vals.size < 2:
        return float("nan"), float("nan")
    picks = np.random.default_rng(seed).integers(0, vals.size, size=(resamples, vals.size))
    return _percentiles(vals[picks].mean(axis=1), level)


def bootstrap_ratio(numerator: Sequence[float], denominator: Sequence[float], *, resamples: int = RESAMPLES,
                    seed: int = SEED, level: float = LEVEL) -> tuple[float, float]:
    """(lo, hi): the interval of ``mean(numerator) / mean(denominator)``, the two paired by question.

    ``numerator[i]`` and ``denominator[i]`` are one question's scores under two methods; a resample draws
    questions, both of a question's scores together. Pairs with a missing score are left out, and so are
    resamples whose denominator mean is 0; fewer than two pairs give (nan, nan).

    Raises:
        ValueError: the two sequences differ in length (they are not paired).

    >>> bootstrap_ratio([0.4, 0.8, 0.6], [0.8, 1.6, 1.2])
    (0.5, 0.5)
    """
    if len(numerator) != len(denominator):
        raise ValueError(f"paired scores needed: {len(numerator)} numerators against {len(denominator)} "
                         "denominators")
    pairs = np.array([(a, b) for a, b in zip(numerator, denominator)
                      if a is not None and b is not None and a == a and b == b], float).reshape(-1, 2)
    if pairs.shape[0] < 2:
        return float("nan"), float("nan")
    picks = np.random.default_rng(seed).integers(0, pairs.shape[0], size=(resamples, pairs.shape[0]))
    means = pairs[picks].mean(axis=1)  # [resamples, 2]
    kept = means[means[:, 1] != 0]
    if kept.shape[0] == 0:
        return float("nan"), float("nan")
    return _percentiles(kept[:, 0] / kept[:, 1], level)
