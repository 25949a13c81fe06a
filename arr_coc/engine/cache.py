"""Per-image cache for what expensive channel models compute from pixels alone.

Query-coupled channels (text lines read by OCR, object activation maps, CLIP patch features) split
into a slow image part and a cheap question part; the slow part is cached here, keyed by the channel
and the image's content, so several questions about one image pay for it once. The cache is bounded in bytes, not entries (one
entry can be a few KB of OCR lines or a 38 MB canvas): the least recently used entries go first.
"""
from __future__ import annotations

import dataclasses
import hashlib
import sys
from collections import OrderedDict
from typing import Any, Callable, Iterator, Sequence, TypeVar

import numpy as np
import torch
from torch import Tensor

from arr_coc.engine.imageops import to_uint8

T = TypeVar("T")

# What one cache holds by default: 256 MiB, e.g. the OCR lines of thousands of pages, or six canvases of the
# largest default size (1792 x 1792 px float32, 38.5 MB each) with their texture.
CACHE_BYTES = 256 * 2**20


def nbytes(value: Any) -> int:
    """Bytes a cached value holds: tensor and array storages (each counted once), plus the objects around them.

    A tensor counts its whole storage (a view keeps its base alive); containers, dataclasses and plain
    objects are walked; other values count ``sys.getsizeof``.

    >>> nbytes(torch.zeros(1000)), nbytes(torch.zeros(1000)[:10]) == nbytes(torch.zeros(1000))
    (4000, True)
    """
    seen: set[Any] = set()

    def once(key: Any, size: int) -> int:
        if key in seen:
            return 0
        seen.add(key)
        return size

    def walk(v: Any) -> int:
        if id(v) in seen:
            return 0
        seen.add(id(v))
        if isinstance(v, Tensor):
            storage = v.untyped_storage()
            return once(("tensor", storage.data_ptr() or id(storage)), 0 if v.is_meta else storage.nbytes())
        if isinstance(v, np.ndarray):
            while isinstance(v.base, np.ndarray):
                v = v.base
            return once(("array", id(v)), v.nbytes)
        size = sys.getsizeof(v)
        if isinstance(v, dict):
            return size + sum(walk(k) + walk(x) for k, x in v.items())
        if isinstance(v, (list, tuple, set, frozenset)):
            return size + sum(walk(x) for x in v)
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return size + sum(walk(getattr(v, f.name)) for f in dataclasses.fields(v))
        if hasattr(v, "__dict__") and not isinstance(v, type):
            return size + walk(vars(v))
        return size

    return walk(value)


def image_key(image: Tensor) -> str:
    """A content digest of one image [3, H, W] (shape + 8-bit pixel values): equal images, equal keys.

    >>> image_key(torch.zeros(3, 4, 4)) == image_key(torch.zeros(3, 4, 4)), image_key(torch.zeros(3, 4, 4)) == image_key(torch.ones(3, 4, 4))
    (True, False)
    """
    digest = hashlib.blake2b(digest_size=16)
    for block in _uint8_blocks(image):
        digest.update(block)
    return f"{tuple(image.shape)}:{digest.hexdigest()}"


# values converted at once by image_key: 16 MB of float32, so a large page never has a full-size float copy
KEY_BLOCK = 1 << 22


def _uint8_blocks(image: Tensor, block: int = KEY_BLOCK) -> Iterator[bytes]:
    """:func:`~arr_coc.engine.imageops.to_uint8`'s bytes (clamped to [0, 1], x 255, rounded half to even) in
    order, ``block`` values at a time, by numpy on one thread for a float32 image: torch's thread pool stalls when
    the CPU is busy (a 3 x 1176 x 840 page: 91 against 5 ms measured on 2 busy cores), every question-coupled
    channel keys every page, and an 8000 px page's full-size temporaries would cost gigabytes.

    >>> x = torch.tensor([[-0.5, 0.5 / 255, 1.5 / 255, 0.5, 1.2]])
    >>> b"".join(_uint8_blocks(x, block=2)) == bytes(to_uint8(x).flatten().tolist()) == bytes([0, 0, 2, 128, 255])
    True
    """
    if image.dtype != torch.float32:
        yield to_uint8(image).contiguous().numpy().tobytes()
        return
    flat = image.detach().cpu().contiguous().reshape(-1).numpy()  # a view of a contiguous CPU image
    for start in range(0, flat.size, block):
        a = np.clip(flat[start: start + block], 0, 1)
        a *= np.float32(255)
        yield np.rint(a, out=a).astype(np.uint8).tobytes()


class ImageCache:
    """A least-recently-used map (channel name, image content) -> value, bounded in bytes (:func:`nbytes`).

    Adding an entry evicts the least recently used ones until the total is within ``max_bytes``; a value
    larger than the whole budget is returned but not kept.

    Example:
        >>> cache, calls = ImageCache(), []
        >>> img = torch.rand(3, 8, 8)
        >>> _ = cache.get("ocr", img, lambda: calls.append(1) or "lines")
        >>> cache.get("ocr", img.clone(), lambda: calls.append(1) or "lines"), len(calls)
        ('lines', 1)
    """

    def __init__(self, max_bytes: int = CACHE_BYTES) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise ValueError(f"max_bytes must be a non-negative integer, got {max_bytes!r}")
        self.max_bytes = max_bytes
        self.nbytes = 0  # bytes of the values held, always <= max_bytes
        self._items: OrderedDict[tuple[str, str], tuple[Any, int]] = OrderedDict()
        self.hits = self.misses = 0

    def get(self, name: str, image: Tensor, compute: Callable[[], T]) -> T:
        key = (name, image_key(image))
        if key in self._items:
            self.hits += 1
            self._items.move_to_end(key)
            return self._items[key][0]
        self.misses += 1
        value = compute()
        size = nbytes(value)
        if size <= self.max_bytes:
            while self.nbytes + size > self.max_bytes:
                _, (_, dropped) = self._items.popitem(last=False)
                self.nbytes -= dropped
            self._items[key] = (value, size)
            self.nbytes += size
        return value

    def __len__(self) -> int:
        return len(self._items)


def cached_per_image(cache: ImageCache, name: str, images: Tensor, compute: Callable[[Tensor], Sequence[T]]) -> list[T]:
    """Per-image cached results of a batched model: ``compute(images)`` runs at most once, on the first miss.

    Args:
        cache: the per-image cache; entries are keyed by ``name`` and each image's content.
        name: cache entry name.
        images: ``[B, 3, H, W]``.
        compute: batched model, ``[B, 3, H, W] -> B`` per-image results.

    Example:
        >>> cache, runs = ImageCache(), []
        >>> images = torch.rand(2, 3, 4, 4)
        >>> _ = cached_per_image(cache, "m", images, lambda x: runs.append(1) or list(x.mean((1, 2, 3))))
        >>> _ = cached_per_image(cache, "m", images, lambda x: runs.append(1) or list(x.mean((1, 2, 3))))
        >>> len(runs), cache.misses, cache.hits
        (1, 2, 2)
    """
    batch: Sequence[T] | None = None

    def one(i: int) -> T:
        nonlocal batch
        if batch is None:  # one batched run serves every image of the call that misses
            batch = compute(images)
        return batch[i]

    return [cache.get(name, images[i], lambda i=i: one(i)) for i in range(images.shape[0])]
