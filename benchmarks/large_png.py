"""Large PNG pages of every PNG colour type, written row by row in seconds and kilobytes of memory.

A page is paper with dark bars where text would be; its rows repeat, so even the largest legal image
(13377 x 13377 px) compresses to a few hundred KB and is written without ever being held in memory.
The memory tests and ``bench_memory.py`` read them back through ``arr-coc look``.

    >>> import io
    >>> from PIL import Image
    >>> buf = io.BytesIO(); write_png(buf, "P;trns", 40, 30)
    >>> img = Image.open(buf); img.size, img.mode, "transparency" in img.info
    ((40, 30), 'P', True)
"""
from __future__ import annotations

import struct
import zlib
from typing import BinaryIO

# mode -> (PNG bit depth, colour type, paper pixel, ink pixel); "P;trns" is a palette with transparency
# (paper transparent, read as white paper). PIL opens them as modes 1, L, LA, I;16, P, P, RGB, RGBA.
MODES: dict[str, tuple[int, int, bytes, bytes]] = {
    "1": (1, 0, b"", b""),  # bits: written by _row
    "L": (8, 0, bytes([245]), bytes([20])),
    "LA": (8, 4, bytes([245, 255]), bytes([20, 200])),
    "I;16": (16, 0, struct.pack(">H", 245 * 257), struct.pack(">H", 20 * 257)),
    "P": (8, 3, bytes([0]), bytes([1])),
    "P;trns": (8, 3, bytes([0]), bytes([1])),
    "RGB": (8, 2, bytes([245, 245, 240]), bytes([20, 20, 30])),
    "RGBA": (8, 6, bytes([245, 245, 240, 255]), bytes([20, 20, 30, 230])),
}
PALETTE = bytes([245, 245, 240, 20, 20, 30])


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _row(mode: str, width: int, ink: bool) -> bytes:
    """One filtered row (filter byte 0): paper, with a dark bar over 10-60% of the width on ink rows."""
    lo, hi = (width // 10, width * 6 // 10) if ink else (0, 0)
    if mode == "1":
        bits = "".join("0" if lo <= x < hi else "1" for x in range(width)).ljust(-(-width // 8) * 8, "0")
        return b"\0" + int(bits, 2).to_bytes(len(bits) // 8, "big")
    _, _, paper, dark = MODES[mode]
    return b"\0" + paper * lo + dark * (hi - lo) + paper * (width - hi)


def write_png(out: str | BinaryIO, mode: str, width: int, height: int) -> None:
    """Write a ``width`` x ``height`` page of ``mode`` (a key of :data:`MODES`) to a path or binary file."""
    depth, colour, _, _ = MODES[mode]
    if isinstance(out, str) or hasattr(out, "__fspath__"):
        with open(out, "wb") as f:
            return write_png(f, mode, width, height)
    out.write(b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, depth, colour, 0, 0, 0)))
    if colour == 3:
        out.write(_chunk(b"PLTE", PALETTE))
        if mode == "P;trns":
            out.write(_chunk(b"tRNS", bytes([0, 255])))
    rows = {False: _row(mode, width, False), True: _row(mode, width, True)}
    band = max(1, height // 60)  # 12 bars down the page, as lines of text
    z = zlib.compressobj(1)
    data = bytearray()
    for y in range(height):
        data += z.compress(rows[(y // band) % 5 == 2])
        if len(data) > 1 << 20:
            out.write(_chunk(b"IDAT", bytes(data)))
            data.clear()
    data += z.flush()
    out.write(_chunk(b"IDAT", bytes(data)) + _chunk(b"IEND", b""))
