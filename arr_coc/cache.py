"""Per-image cache for what expensive channel models compute from pixels alone.

Query-coupled channels (text lines read by OCR, object activation maps, CLIP patch features) split
into a slow image part and a cheap question part; the slow part is cached here, keyed by the channel
and the image's content, so several questions about one image pay for it once.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Any, Callable, Sequence, TypeVar

import torch  # noqa: F401  (the doctests use it)
from torch import Tensor

from arr_coc.imageops import to_uint8

T = TypeVar("T")


def image_key(image: Tensor) -> str:
    """A content digest of one image [3, H, W] (shape + 8-bit pixel values): equal images, equal keys.

    >>> image_key(torch.zeros(3, 4, 4)) == image_key(torch.zeros(3, 4, 4)), image_key(torch.zeros(3, 4, 4)) == image_key(torch.ones(3, 4, 4))
    (True, False)
    """
    q = to_uint8(image).contiguous()
    return f"{tuple(image.shape)}:{hashlib.blake2b(q.numpy().tobytes(), digest_size=16).hexdigest()}"


class ImageCache:
    """A bounded least-recently-used map (channel name, image content) -> value.

    Example:
        >>> cache, calls = ImageCache(), []
        >>> img = torch.rand(3, 8, 8)
        >>> _ = cache.get("ocr", img, lambda: calls.append(1) or "lines")
        >>> cache.get("ocr", img.clone(), lambda: calls.append(1) or "lines"), len(calls)
        ('lines', 1)
    """

    def __init__(self, max_items: int = 256) -> None:
        self.max_items = max_items
        self._items: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self.hits = self.misses = 0

    def get(self, name: str, image: Tensor, compute: Callable[[], T]) -> T:
        key = (name, image_key(image))
        if key in self._items:
            self.hits += 1
            self._items.move_to_end(key)
            return self._items[key]
        self.misses += 1
        value = compute()
        self._items[key] = value
        if len(self._items) > self.max_items:
            self._items.popitem(last=False)
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
