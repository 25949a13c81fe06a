"""The image cache's key: a digest of the image's 8-bit pixels, whichever way they are computed."""
from __future__ import annotations

import hashlib

import torch

from arr_coc.engine.cache import image_key
from arr_coc.engine.imageops import to_uint8


def torch_key(image: torch.Tensor) -> str:
    """The key from torch's own 8-bit conversion."""
    return f"{tuple(image.shape)}:{hashlib.blake2b(to_uint8(image).contiguous().numpy().tobytes(), digest_size=16).hexdigest()}"


def test_image_key_is_the_digest_of_the_8_bit_pixels():
    g = torch.Generator().manual_seed(0)
    page = torch.rand(3, 120, 90, generator=g)
    halves = (torch.arange(0, 3 * 40 * 40).float() % 513 / 2 / 255).reshape(3, 40, 40)  # x 255 lands on .5: ties to even
    wild = torch.randn(3, 30, 30, generator=g) * 2  # below 0 and above 1
    big = torch.rand(3, 1500, 1000, generator=g)  # 4.5 M values: converted in two blocks (KEY_BLOCK = 4 M)
    for image in (page, page[:, 10:70, 5:50], halves, wild, page.double(), big):
        assert image_key(image) == torch_key(image)
    with torch.inference_mode():
        assert image_key(page.clone()) == torch_key(page)
    step = page.clone()
    step[0, 0, 0] = (to_uint8(page[0, 0, 0]).float() + 1) / 255  # control: one pixel one 8-bit step away
    assert image_key(step) != image_key(page)
