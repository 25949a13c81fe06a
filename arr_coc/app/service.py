"""The microscope's engine: one request (image, question, settings) -> an allocation and its views.

What an image alone determines (canvas, question-free texture) is cached per image content, and the
slow image part of the question-coupled channels (OCR lines) sits in one :class:`ImageCache` shared
by every configuration, so a second question, K, sampler or scorer on the same image skips both.
Bad input raises ``ValueError`` with a message the page shows as it is.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from PIL import Image, UnidentifiedImageError
from torch import Tensor

from arr_coc.allocators.methods import METHODS, SamplerMethod, SquaresMethod
from arr_coc.app import panels as views
from arr_coc.config import (
    DEFAULT_SACCADES,
    MAX_NEW_TOKENS,
    MAX_QUESTION_TOKENS,
    PIPELINE_CHANNELS,
    ARRConfig,
    CanvasConfig,
    SamplerConfig,
    ScorerConfig,
    TextureConfig,
)
from arr_coc.contexts.allocate import image_placing
from arr_coc.engine.cache import ImageCache
from arr_coc.engine.canvas import load_bounded
from arr_coc.engine.extract import extract_gather
from arr_coc.engine.imageops import to_hwc_uint8
from arr_coc.engine.pipeline import ARR, Allocation, Scene
from arr_coc.engine.query import QueryEncoder, count_tokens
from arr_coc.engine.views import foveated_view, gestalt_view
from arr_coc.errors import UserError
from arr_coc.viz import tokens_per_region
from arr_coc.weights import atomic_write

MAX_UPLOAD_PIXELS = 40_000_000  # 40 MP: any camera photo or A4 scan at 600 dpi; more is a decompression bomb
# What the caches between requests may hold, in bytes: canvases and their question-free texture (a canvas of
# the largest default size is 38.5 MB: four of them), and the image part of the question-coupled channels.
SCENE_CACHE_BYTES = 160 * 2**20
CHANNEL_CACHE_BYTES = 64 * 2**20
PARTS = ("propositional", "perspectival", "participatory")
# Ablation presets of the part sliders (and the sampler for "random": relevance ignored, the baseline)
PRESETS: dict[str, dict[str, Any]] = {
    "all on": {"part_scale": (1.0, 1.0, 1.0)},
    "only participatory": {"part_scale": (0.0, 0.0, 1.0)},
    "random": {"part_scale": (1.0, 1.0, 1.0), "sampler": "random"},
}
SCORER_WEIGHTS = {"shipped": "auto", "hand-set": "none"}  # the third choice is a checkpoint file


def methods() -> tuple[str, ...]:
    """What can place the saccades here: the registry's methods (:mod:`arr_coc.allocators.methods`) that run a
    sampler of their own on the scorer's relevance, then those placing variable squares on it.

    >>> methods()[:2], "patches" in methods(), "arr" in methods()
    (('random', 'topk'), True, False)
    """
    def shown(name: str, kind: type) -> bool:
        entry = METHODS.get(name)
        return isinstance(entry, kind) and entry.source == "scorer" and getattr(entry, "sampler", "") is not None

    return (*(n for n in METHODS.names() if shown(n, SamplerMethod)),
            *(n for n in METHODS.names() if shown(n, SquaresMethod)))


def _patcher(method: str) -> str | None:
    """The patch allocator a squares method runs, None for a sampler."""
    entry = METHODS.get(method)
    return entry.patcher if isinstance(entry, SquaresMethod) else None


@dataclass(frozen=True)
class Settings:
    """One configuration of the microscope (the page's controls)."""

    saccades: int = DEFAULT_SACCADES  # saccade tokens K (a patch allocator: at most K squares)
    method: str = SamplerConfig.name  # a method of methods(): a sampler (one-cell saccades) or variable squares
    channels: tuple[str, ...] = PIPELINE_CHANNELS
    weights: str = "auto"  # scorer weights: "auto" (shipped), "none" (hand-set) or a file from `arr-coc train`
    part_scale: tuple[float, float, float] = (1.0, 1.0, 1.0)  # 1 = as trained, 0 = that part off
    cell: int = CanvasConfig.cell  # token cell in px: the VLM's (28 Qwen2/2.5-VL, 32 Qwen3-VL)

    def config(self) -> ARRConfig:
        """The ARR configuration; a squares method scores with the default sampler's ARR (only relevance counts)."""
        sampler = SamplerConfig.name if _patcher(self.method) else METHODS.get(self.method).sampler
        return ARRConfig(canvas=CanvasConfig(cell=self.cell), texture=TextureConfig(channels=tuple(self.channels)),
                         scorer=ScorerConfig(weights=self.weights, part_scale=tuple(self.part_scale)),
                         sampler=SamplerConfig(name=sampler, saccades=self.saccades))


@dataclass
class Result:
    """One answered request: the allocation, the cells it sends, and the cell texture the scorer read."""

    settings: Settings
    allocation: Allocation
    sent: Tensor  # [K, 2] (y, x) saccade cells, or [K, 3] (y, x, size) squares of a patch allocator
    cell_texture: Tensor  # [C, h, w] every channel of the image's valid cells (question-coupled ones for this question)
    layout: dict[str, slice]
    weights_source: str
    scene_cached: bool
    answer: str | None = None
    timings_ms: dict[str, float] = field(default_factory=dict)

    @property
    def tokens_sent(self) -> int:
        return self.allocation.gestalt.num_tokens + len(self.sent)

    def to_json(self) -> dict[str, Any]:
        """The ``look --json`` schema, plus what this page chose (method, part scale, scorer weights, answer)."""
        d = self.allocation.to_json(0)
        d["tokens"]["saccades"] = len(self.sent)
        d["tokens"]["sent"] = self.tokens_sent
        d["timings_ms"] = {k: round(v, 2) for k, v in self.timings_ms.items() if "/" not in k}
        d.update(method=self.settings.method, part_scale=dict(zip(PARTS, self.settings.part_scale)),
                 scorer_weights=self.weights_source, scene_cached=self.scene_cached)
        if self.sent.shape[1] == 3:
            d["boxes"] = self.sent.tolist()  # (y, x, size) squares, one token each
        if self.answer is not None:
            d["answer"] = self.answer
        return d


def read_upload(path: str | Path, max_pixels: int = MAX_UPLOAD_PIXELS) -> Tensor:
    """An uploaded file as a [3, H, W] image, refusing non-images and decompression bombs before decoding.

    Decoded as files are, no larger than the largest canvas needs (:func:`arr_coc.engine.canvas.load_bounded`).

    >>> import tempfile, os
    >>> f = tempfile.NamedTemporaryFile(suffix=".png", delete=False); _ = f.write(b"not an image"); f.close()
    >>> read_upload(f.name)
    Traceback (most recent call last):
    ...
    ValueError: the upload is not an image PIL can read (PNG, JPEG, TIFF, WebP, ...)
    >>> os.unlink(f.name)
    """
    try:
        with Image.open(path) as img:  # reads the header only: the size is known before any pixel is decoded
            w, h = img.size
    except UnidentifiedImageError:
        raise ValueError("the upload is not an image PIL can read (PNG, JPEG, TIFF, WebP, ...)") from None
    except Image.DecompressionBombError:
        raise ValueError(f"the upload declares more than {max_pixels / 1e6:.0f} megapixels "
                         f"(a decompression bomb?); send an image of at most {max_pixels / 1e6:.0f} MP") from None
    if w * h > max_pixels:
        raise ValueError(f"the upload is {w}x{h} px = {w * h / 1e6:.0f} megapixels; send an image of at most "
                         f"{max_pixels / 1e6:.0f} MP")
    return load_bounded(path, CanvasConfig.max_pixels)


def error_line(err: BaseException) -> str | None:
    """The one line the page shows for a request's error; None for a bug (its traceback belongs in the log).

    Bad input (``ValueError``, ``OSError``, :class:`~arr_coc.errors.UserError`) says what to do in its message; a
    message that is empty or runs over lines is cut to its first line or named by its type. Running out of memory
    is said as such, with what to send instead.

    >>> error_line(ValueError("page 3 is out of range\\nmore")), error_line(ValueError()), error_line(KeyError("x"))
    ('page 3 is out of range', 'ValueError (no message)', None)
    """
    if isinstance(err, MemoryError):
        return "the request needed more memory than the server has; send fewer or smaller pages or images"
    if not isinstance(err, (ValueError, OSError, UserError)):
        return None
    text = str(err).strip()
    return text.splitlines()[0] if text else f"{type(err).__name__} (no message)"


def check_question(question: str | None) -> str:
    q = (question or "").strip()
    if not q:
        raise ValueError("the question is empty; type what you want to know about the image")
    n = count_tokens(q)
    if n > MAX_QUESTION_TOKENS:
        raise ValueError(f"the question has {n} words and punctuation marks; keep it to {MAX_QUESTION_TOKENS}")
    return q


class Microscope:
    """Answers page requests; keeps one ARR per configuration and the per-image caches between requests.

    Args:
        query_encoder: shared by every configuration (MiniLM by default, loaded once).
        vlm: a loaded VLM adapter (:func:`arr_coc.vlm.load_vlm`) to answer with, or None.
        max_new_tokens: answer length limit of the VLM.
    """

    def __init__(self, query_encoder: QueryEncoder | None = None, vlm: Any = None,
                 max_new_tokens: int = MAX_NEW_TOKENS, retriever: Any = None) -> None:
        from arr_coc.engine.query import MiniLMQueryEncoder

        self.query_encoder = query_encoder or MiniLMQueryEncoder().load()
        self.retriever = retriever  # every configuration's line retriever (None: the ARR's default)
        self.vlm = vlm
        self.max_new_tokens = max_new_tokens
        self.cell = vlm.cell if vlm is not None else CanvasConfig.cell
        self.forget()  # channel_cache: OCR lines etc., shared by every ARR; scenes: canvas + question-free texture

    def forget(self) -> None:
        """Drop every cached image: the next request on any image pays for its texture and OCR again."""
        self.channel_cache, self.scenes = ImageCache(CHANNEL_CACHE_BYTES), ImageCache(SCENE_CACHE_BYTES)
        self._arrs: dict[str, ARR] = {}

    def arr(self, settings: Settings) -> ARR:
        key = json.dumps(settings.config().to_dict(), sort_keys=True, default=str)
        if key not in self._arrs:
            if len(self._arrs) >= 16:  # configurations come and go with the sliders; keep the recent ones
                self._arrs.pop(next(iter(self._arrs)))
            self._arrs[key] = ARR(settings.config(), query_encoder=self.query_encoder, cache=self.channel_cache,
                                  retriever=self.retriever).eval()
        return self._arrs[key]

    def scene(self, arr: ARR, image: Tensor, timings: dict[str, float]) -> tuple[Scene, bool]:
        """The image's canvas and question-free texture, from the cache when this image was seen before."""
        name = f"scene:{arr.image_channels}:{arr.config.canvas}"
        fresh: dict[str, float] = {}
        scene = self.scenes.get(name, image, lambda: arr.see([image], timings=fresh))
        timings.update(fresh or {"canvas": 0.0, "texture": 0.0})
        return scene, not fresh

    @torch.inference_mode()
    def run(self, image: Tensor, question: str, settings: Settings) -> Result:
        question = check_question(question)
        if settings.method not in methods():
            raise ValueError(f"unknown sampler or allocator {settings.method!r}; choose one of {', '.join(methods())}")
        if self.vlm is not None and settings.cell != self.vlm.cell:
            settings = replace(settings, cell=self.vlm.cell)
        arr = self.arr(settings)
        t: dict[str, float] = {}
        scene, cached = self.scene(arr, image, t)
        alloc = arr.allocate(scene, [question], saccades=settings.saccades, timings=t)
        alloc, placing = _placed(arr, scene, alloc, question, settings.saccades, t)
        sent = alloc.positions[0]
        patcher = _patcher(settings.method)
        if patcher:
            from arr_coc.budget import Budget
            from arr_coc.vlm.allocation import method_plan

            start = time.perf_counter()
            (h, w), cell = scene.canvas.sizes[0], scene.canvas.cell  # the registry's method on the one image
            sent = method_plan(settings.method, alloc.canvas.pixels[0, :, :h, :w],
                               placing[0, :h // cell, :w // cell], Budget.saccades(settings.saccades),
                               arr, cell).squares
            t["patches"] = (time.perf_counter() - start) * 1e3
        h, w = (s // scene.canvas.cell for s in scene.canvas.sizes[0])
        texture = alloc.cell_texture[0, :, :h, :w]  # [C, h, w]
        result = Result(settings, alloc, sent, texture, dict(arr.layout), arr.weights_source, cached, timings_ms=t)
        if self.vlm is not None:
            from arr_coc.vlm import ask

            allocator = settings.method if patcher else "arr"  # the registry's name of the method
            start = time.perf_counter()
            result.answer = ask(self.vlm, image, question, arr=arr, saccades=settings.saccades,
                                max_new_tokens=self.max_new_tokens, allocator=allocator).text
            t["answer"] = (time.perf_counter() - start) * 1e3
        return result


def _placed(arr: ARR, scene: Scene, alloc: Allocation, question: str, k: int,
            t: dict[str, float]) -> tuple[Allocation, Tensor]:
    """The allocation with its K saccades placed where ``look``, ``ask`` and the eval place one image's, and that
    map [1, Hc, Wc]: its relevance plus its own text lines' retrieval (:func:`arr_coc.contexts.allocate.image_placing`);
    unchanged for an image without text lines."""
    placing = image_placing(arr, scene, alloc.relevance.map, question)
    if placing is alloc.relevance.map:
        return alloc, placing
    start = time.perf_counter()
    canvas = scene.canvas
    query_emb = arr.query_encoder.encode([question]).to(placing)
    selection = arr.select(placing, k, valid=canvas.valid, query_emb=query_emb)
    patches = extract_gather(canvas.pixels, selection.positions, canvas.cell, in_bounds=True)
    t["selection"] = t.get("selection", 0.0) + (time.perf_counter() - start) * 1e3
    return replace(alloc, selection=selection, patches=patches), placing


@dataclass
class Rendered:
    """Every view of one :class:`Result`, ready for the page."""

    saccades: Image.Image
    relevance: Image.Image
    parts: list[tuple[Image.Image, str]]
    channels: Image.Image
    gestalt: Image.Image
    foveated: Image.Image
    tokens: Image.Image
    answer: str | None  # the VLM's answer, when the microscope has one
    summary: str  # markdown: tokens sent, context weights, scorer, cache
    timings: str  # markdown table of stage times
    json_path: Path
    png_path: Path


def render(result: Result, out_dir: Path) -> Rendered:
    """Draw the views of ``result`` and write its JSON and PNG downloads into the folder ``out_dir``."""
    a = result.allocation
    c = a.canvas.cell
    h, w = a.canvas.sizes[0]
    hc, wc = h // c, w // c
    full = a.canvas.pixels[0, :, :h, :w]  # [3, h, w] the canvas
    f = views.display_factor((h, w), c)
    small, dc = views.downscale(full, f), c // f  # [3, h/f, w/f]: views are drawn at display size, on cells of dc px
    image = to_hwc_uint8(small)
    rel = a.relevance
    sacc = views.saccade_view(image, result.sent, dc)
    heat = views.heat_view(image, rel.map[0, :hc, :wc], dc)
    scale = result.settings.part_scale
    parts = [(views.heat_view(image, rel.parts[0, i, :hc, :wc], dc),
              f"{name}: context weight {rel.weights[0, i]:.2f} x slider {scale[i]:g}") for i, name in enumerate(PARTS)]
    centres = result.sent[:, :2] + (result.sent[:, 2:] // 2 if result.sent.shape[1] == 3 else 0)
    counts = tokens_per_region(centres, (hc, wc), (min(8, hc), min(8, wc)), a.gestalt.num_tokens).numpy()
    tokens = views.tokens_view(image, counts, dc)
    # what the VLM sees, shown at display size: the same views made on the display-size canvas
    gview = gestalt_view(small, dc, a.gestalt.grid)
    if result.sent.shape[1] == 3:  # squares: the VLM sees each square shrunk to one token
        from arr_coc.allocators.patches import render_patches

        fview = render_patches(small, result.sent, dc, background=gview)
    else:
        fview = foveated_view(small, result.sent, dc, a.gestalt.grid)
    d = result.to_json()
    tok = d["tokens"]
    cw = d["context_weights"]
    summary = "\n".join([
        f"**tokens sent {tok['sent']}** = {tok['gestalt']} gestalt ({a.gestalt.grid[0]}x{a.gestalt.grid[1]}) + "
        f"{tok['saccades']} saccades &nbsp;|&nbsp; full resolution {tok['full_resolution']} "
        f"({100 * tok['sent'] / tok['full_resolution']:.0f}% of full)",
        "",
        f"image {d['image_size'][1]}x{d['image_size'][0]} px -> canvas {w}x{h} px ({w // c}x{h // c} cells of {c} px); "
        f"method **{result.settings.method}**; scorer weights: {result.weights_source}",
        "",
        "context weights " + ", ".join(f"{k} {v:.2f} (x{s:g})" for (k, v), s in zip(cw.items(), scale))
        + ("; texture from the per-image cache" if result.scene_cached else ""),
    ])
    rows = ["| stage | ms |", "| --- | ---: |"]
    rows += [f"| {k}{' (cached)' if result.scene_cached and k in ('canvas', 'texture') else ''} | {v:.1f} |"
             for k, v in d["timings_ms"].items()]
    rows.append(f"| **total** | **{sum(d['timings_ms'].values()):.1f}** |")
    json_path = out_dir / "allocation.json"
    text = json.dumps(d, indent=1)
    atomic_write(json_path, lambda f: f.write(text.encode()))  # a download is whole or absent, never truncated
    png_path = out_dir / "allocation.png"
    picture = views.side_by_side([sacc, heat, tokens], [f"{len(result.sent)} saccades (numbered by rank)", "relevance",
                                                        f"tokens per region: {tok['sent']} sent"])
    atomic_write(png_path, lambda f: picture.save(f, format="PNG", compress_level=1))  # fast: written every request
    return Rendered(sacc, heat, parts, views.channels_view(result.cell_texture, result.layout),
                    Image.fromarray(to_hwc_uint8(gview)), Image.fromarray(to_hwc_uint8(fview)), tokens,
                    result.answer, summary, "\n".join(rows), json_path, png_path)
