"""Batching variable token counts: items grouped by length under a token cap, and padded with a mask.

An allocator that sends each image its own token count (the quadtree sends at most K) leaves items of unequal
lengths; these group them under a token cap and pad them with a mask, dropping none.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor


def bucket_by_tokens(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Group item indices of similar token counts so each padded batch holds <= max_tokens tokens.

    Items are sorted by length (stable) and cut greedily: an item joins the current bucket while
    (bucket size + 1) * its length (the longest so far) <= max_tokens. Every index appears exactly once.
    An item longer than max_tokens on its own gets a bucket of its own: no smaller batch exists, and
    dropping it silently would lose data (truncate or raise max_tokens upstream if that does not fit).

    Example:
        >>> bucket_by_tokens([5, 1, 4, 2, 9], 8)
        [[1, 3], [2], [0], [4]]
    """
    if max_tokens < 1 or any(n < 0 for n in lengths):
        raise ValueError(f"need max_tokens >= 1 and lengths >= 0, got {max_tokens} and {list(lengths)}")
    buckets: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        if buckets and (len(buckets[-1]) + 1) * lengths[i] <= max_tokens:
            buckets[-1].append(i)
        else:
            buckets.append([i])
    return buckets


def pad_tokens(tokens: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
    """Stack `[N_i, D]` token lists into `[B, Nmax, D]` (zeros after each) and a `[B, Nmax]` mask, True on real tokens.

    Example:
        >>> x, m = pad_tokens([torch.ones(2, 3), torch.ones(1, 3)])
        >>> tuple(x.shape), m.tolist()
        ((2, 2, 3), [[True, True], [True, False]])
    """
    if not tokens or any(t.ndim != 2 or t.shape[1] != tokens[0].shape[1] for t in tokens):
        raise ValueError(f"need a non-empty list of [N_i, D] tensors, one D, got {[tuple(t.shape) for t in tokens]}")
    lengths = torch.tensor([len(t) for t in tokens], device=tokens[0].device)
    padded = torch.nn.utils.rnn.pad_sequence(list(tokens), batch_first=True)
    return padded, torch.arange(padded.shape[1], device=lengths.device)[None] < lengths[:, None]
