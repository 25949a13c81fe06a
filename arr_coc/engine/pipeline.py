"""The pipeline: images + questions -> exactly K ordered saccades and a gestalt (an :class:`Allocation`).

    canvas -> texture -> gestalt -> query -> relevance -> sampler -> extract

Shapes: B images, K saccades, (Hc, Wc) token cells of the padded batch, ``cell`` px per cell.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import Tensor, nn

from arr_coc.config import MAX_QUESTION_TOKENS, PIPELINE_CHANNELS, ARRConfig, check_int
from arr_coc.engine.cache import ImageCache
from arr_coc.engine.canvas import Canvas, make_canvas
from arr_coc.engine.channel_registry import PageText
from arr_coc.engine.extract import extract_gather
from arr_coc.engine.gestalt import Gestalt, GestaltEncoder, PooledGestaltEncoder
from arr_coc.engine.query import HashingQueryEncoder, MiniLMQueryEncoder, QueryEncoder, check_queries
from arr_coc.engine.relevance import SCORERS, Relevance
from arr_coc.engine.retrieval import DEFAULT_RETRIEVER, Retriever, load_retriever
from arr_coc.engine.samplers import SAMPLERS, module_dtype, select
from arr_coc.engine.selection import Selection
from arr_coc.engine.texture import channel_layout, channel_width, compute_texture, prepare_texture, query_channels
from arr_coc.errors import WeightsError
from arr_coc.threads import check_threads
from arr_coc.weights import SCORER_FORMAT, load_scorer_weights, pretrained_config, save_folder, scorer_file  # noqa: F401  (the scorer files' tag, re-exported)


@dataclass
class Allocation:
    """Everything one call decided, per image: where the saccades went and what they cost."""

    canvas: Canvas
    queries: list[str]
    relevance: Relevance
    selection: Selection
    patches: Tensor  # [B, K, 3, cell, cell] full-resolution pixels of each saccade
    gestalt: Gestalt
    timings_ms: dict[str, float] = field(default_factory=dict)
    cell_texture: Tensor | None = field(default=None, repr=False)  # [B, C, Hc, Wc] the texture the scorer read

    @property
    def positions(self) -> Tensor:
        return self.selection.positions  # [B, K, 2] (y, x) cells, most relevant first

    @property
    def scores(self) -> Tensor:
        return self.selection.scores  # [B, K]

    @property
    def saccades(self) -> int:
        """K, the saccade tokens sent per image."""
        return self.positions.shape[1]

    @property
    def tokens_sent(self) -> int:
        """Gestalt + saccade tokens, the same for every image of the batch."""
        return self.gestalt.num_tokens + self.saccades

    def to_json(self, i: int = 0) -> dict[str, Any]:
        """Image ``i``'s allocation as plain JSON-able data (cells are (y, x); ``cell`` is in px)."""
        c = self.canvas
        return {
            "question": self.queries[i],
            "image_size": list(c.image_sizes[i]),
            "canvas": list(c.sizes[i]),
            "cell": c.cell,
            "grid": [c.sizes[i][0] // c.cell, c.sizes[i][1] // c.cell],
            "tokens": {
                "gestalt": self.gestalt.num_tokens,
                "saccades": self.saccades,
                "sent": self.tokens_sent,
                "full_resolution": c.full_tokens[i],
            },
            "gestalt_grid": list(self.gestalt.grid),
            "context_weights": dict(zip(("propositional", "perspectival", "participatory"),
                                        [round(w, 4) for w in self.relevance.weights[i].tolist()])),
            "positions": self.positions[i].tolist(),
            "scores": [round(s, 5) for s in self.scores[i].tolist()],
            "timings_ms": {k: round(v, 2) for k, v in self.timings_ms.items() if "/" not in k},
            "channel_ms": {k.split("/", 1)[1]: round(v, 2) for k, v in self.timings_ms.items() if "/" in k},
        }


def cell_texture(canvas: Canvas, channels: Sequence[str], prev: Tensor | None = None, *,
                 queries: Sequence[str] | None = None, query_encoder: QueryEncoder | None = None,
                 cache: ImageCache | None = None, options: dict | None = None,
                 text: Sequence[PageText | None] | None = None, timings: dict[str, float] | None = None) -> Tensor:
    """The texture of each image pooled to its token cells, zero on padding -> [B, C, Hc, Wc].

    Images are grouped by canvas size and each group is computed as one batch on its own unpadded
    pixels: per-image normalisation, saliency's spectrum and the position channels then see the
    image itself, not the padding, so a batch gives exactly what each image gives alone.
    ``queries`` (one per image), ``query_encoder``, ``cache`` and ``text`` (each image's known text, or None)
    feed query-coupled channels.
    """
    out = None
    for (h, w), idx, sel in _size_groups(canvas):  # one iteration for a batch of same-size images
        cells = compute_texture(canvas.pixels[sel, :, :h, :w], channels,
                                prev=None if prev is None else prev[sel, :, :h, :w],
                                queries=None if queries is None else [queries[i] for i in idx],
                                query_encoder=query_encoder, cache=cache, options=options,
                                text=None if text is None else [text[i] for i in idx], timings=timings,
                                cell=canvas.cell)  # [b, C, h/cell, w/cell]: each channel pooled as it comes
        if out is None:
            out = cells.new_zeros(canvas.batch_size, cells.shape[1], *canvas.grid)
        out[sel, :, : h // canvas.cell, : w // canvas.cell] = cells
    return out


def _size_groups(canvas: Canvas) -> list[tuple[tuple[int, int], list[int], Tensor]]:
    """The canvas's images grouped by size: ((h, w) px, their rows, the rows as an index tensor)."""
    groups: dict[tuple[int, int], list[int]] = {}
    for i, size in enumerate(canvas.sizes):
        groups.setdefault(size, []).append(i)
    return [(size, idx, torch.tensor(idx)) for size, idx in groups.items()]


def prepare_cell_texture(canvas: Canvas, channels: Sequence[str], *, query_encoder: QueryEncoder | None = None,
                         cache: ImageCache, options: dict | None = None,
                         text: Sequence[PageText | None] | None = None) -> tuple[str, ...]:
    """The per-image part of the question-coupled ``channels`` (:func:`~arr_coc.engine.texture.prepare_texture`),
    done into ``cache`` for each image as :func:`cell_texture` crops it (so a later :func:`cell_texture` finds it);
    returns the channels that declare no such part."""
    rest: tuple[str, ...] = tuple(channels)
    for (h, w), idx, sel in _size_groups(canvas):
        rest = prepare_texture(canvas.pixels[sel, :, :h, :w], channels, query_encoder=query_encoder, cache=cache,
                               options=options, text=None if text is None else [text[i] for i in idx])
    return rest


@dataclass
class Scene:
    """What the images alone determine: the canvas, the texture pooled to cells, and each image's text when
    it is known (a page's text layer: the text channels read it instead of running OCR)."""

    canvas: Canvas
    cell_texture: Tensor  # [B, C_image, Hc, Wc] question-free texture per token cell, zero on padding
    text: list[PageText | None] | None = None  # per image, words and lines in canvas pixels

    @property
    def extents(self) -> list[tuple[int, int]]:
        """(rows, cols) of valid cells per image."""
        return [(h // self.canvas.cell, w // self.canvas.cell) for h, w in self.canvas.sizes]


@contextmanager
def _timed(timings: dict[str, float], name: str) -> Iterator[None]:
    start = time.perf_counter()
    yield
    timings[name] = (time.perf_counter() - start) * 1e3




# The dtypes an ARR computes in (arr.float(), .double(), .half(), .bfloat16()); its inputs are cast to them.
SCORING_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


class ARR(nn.Module):
    """Query-aware allocation of K saccades plus a gestalt: ``ARR(config)(images, questions)``.

    Args:
        config: :class:`ARRConfig`; the defaults give 256 gestalt + 273 saccade tokens.
        query_encoder: a :class:`QueryEncoder`; default MiniLM (packaged weights, offline).
        gestalt_encoder: a :class:`GestaltEncoder`; default pooled texture features.
        cache: the per-image cache of slow channel parts (OCR, ...); pass one to share it between ARRs.
        retriever: embeds a context's lines and the question (:mod:`arr_coc.engine.retrieval`) for the ranking
            over a context's pages; default :func:`~arr_coc.engine.retrieval.load_retriever` (loads on first use;
            the hashing retriever when ``query_encoder`` is the hashing encoder).

    Example:
        >>> from arr_coc.engine.query import HashingQueryEncoder
        >>> arr = ARR(ARRConfig(), query_encoder=HashingQueryEncoder())
        >>> out = arr(torch.rand(3, 560, 560), "What is the total?")
        >>> out.positions.shape, out.tokens_sent, out.canvas.full_tokens
        (torch.Size([1, 273, 2]), 529, [400])
    """

    def __init__(self, config: ARRConfig | None = None, *, query_encoder: QueryEncoder | None = None,
                 gestalt_encoder: GestaltEncoder | None = None, cache: ImageCache | None = None,
                 retriever: Retriever | None = None) -> None:
        super().__init__()
        self.config = config = config or ARRConfig()
        self.channels = tuple(config.texture.channels or PIPELINE_CHANNELS)
        self.max_question_tokens = MAX_QUESTION_TOKENS  # the longest question taken (raise it on this ARR)
        self.layout = channel_layout(self.channels)
        # Question-coupled channels are computed per question (their slow image part cached per image);
        # the rest once per image, and only those feed the gestalt.
        self.query_channels = query_channels(self.channels)
        self.image_channels = tuple(c for c in self.channels if c not in self.query_channels)
        if not self.image_channels:
            raise ValueError(f"channels {self.channels} are all question-coupled; add an image channel, e.g. 'rgb'")
        self.cache = ImageCache() if cache is None else cache
        self.query_encoder = query_encoder or MiniLMQueryEncoder()
        self.gestalt_encoder = gestalt_encoder or PooledGestaltEncoder()
        # question -> line retrieval over a context's text (its model loads on first use)
        # (a model-free ARR, on hashed questions, gets hashed lines too)
        self.retriever = retriever if retriever is not None else load_retriever(
            "hashing" if isinstance(self.query_encoder, HashingQueryEncoder) else DEFAULT_RETRIEVER)
        width = channel_width(self.image_channels)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)  # learnable parts start the same for the same seed
            self.scorer = SCORERS.get(config.scorer.name)(
                self.layout, query_dim=self.query_encoder.dim, gestalt_dim=width, hidden=config.scorer.hidden)
            self.sampler = SAMPLERS.get(config.sampler.name)(**config.sampler.kwargs)
        self.weights_source = load_scorer_weights(self, config.scorer.weights)

    def check_weights(self) -> None:
        """Refuse in one line weights the ARR cannot compute with: on the meta device, of a dtype outside
        :data:`SCORING_DTYPES`, or half precision on a CPU whose OpenMP limit would corrupt it."""
        for p in self.parameters():
            if p.is_meta:
                raise ValueError("the ARR is on the meta device: its weights hold no data; build it on a real device "
                                 "(ARR(config)) or move it with arr.to_empty(device='cpu') and load weights")
            if p.dtype not in SCORING_DTYPES:  # complex, float8: torch has no kernels for the scorer's reductions
                raise TypeError(f"an ARR in {str(p.dtype).removeprefix('torch.')} cannot score; move it to a real "
                                "floating dtype: arr.float() (or .double(), .half(), .bfloat16())")
            check_threads(p.dtype, p.device, f"an ARR in {str(p.dtype).removeprefix('torch.')}")
    @classmethod
    def from_pretrained(cls, name_or_path: str | Path, *, query_encoder: QueryEncoder | None = None,
                        **kwargs: Any) -> "ARR":
        """The ARR trained weights were made for, with them loaded: ``ARR.from_pretrained("log_polar")``.

        Args:
            name_or_path: a shipped name, a folder of ``model.safetensors`` + ``config.json`` (an older
                ``.pt`` file loads too, with a deprecation warning), or a Hub id (downloaded).
            query_encoder: default the one the weights were trained with (MiniLM or hashing).
            kwargs: the other arguments of :class:`ARR` (``gestalt_encoder``, ``cache``).
        """
        config, encoder = pretrained_config(name_or_path)
        if query_encoder is None:
            if encoder not in ("MiniLMQueryEncoder", "HashingQueryEncoder"):
                raise WeightsError(f"{name_or_path} was trained on questions embedded by {encoder}; pass that "
                                   f"encoder as query_encoder=")
            query_encoder = (MiniLMQueryEncoder() if encoder == "MiniLMQueryEncoder"
                             else HashingQueryEncoder(config.scorer.query_dim))
        return cls(config, query_encoder=query_encoder, **kwargs)

    def save_pretrained(self, folder: str | Path) -> Path:
        """Write the scorer and sampler weights with what rebuilds this ARR: ``folder/model.safetensors`` +
        ``folder/config.json`` (what :meth:`from_pretrained` and ``--scorer-weights FOLDER`` read)."""
        return save_folder(scorer_file(self), folder)

    def see(self, images: Any, *, prev: Any = None, text: Sequence[PageText | None] | None = None,
            timings: dict[str, float] | None = None, texture: bool = True) -> Scene:
        """Canvas and cell texture: what the images alone determine, reusable across questions and token counts.

        ``text``: per image its known :class:`~arr_coc.engine.channel_registry.PageText` on the canvas (or None), read
        by the text channels instead of OCR (``dataclasses.replace(scene, text=...)`` sets it later).
        ``texture=False``: the canvas alone, its ``cell_texture`` of no channel ([B, 0, Hc, Wc]): a scene nothing
        scores (pages ranked on their text layer, :func:`arr_coc.contexts.allocate`).
        """
        cfg, t = self.config.canvas, {} if timings is None else timings
        with _timed(t, "canvas"):
            canvas = make_canvas(images, cell=cfg.cell, min_pixels=cfg.min_pixels, max_pixels=cfg.max_pixels)
            prev_pixels = None if prev is None else self._prev_canvas(prev, canvas)
            param = next(self.parameters(), None)
            device = canvas.pixels.device if param is None else param.device
            if canvas.pixels.device != device:  # texture that is plain tensor ops runs where the ARR was moved
                canvas = replace(canvas, pixels=canvas.pixels.to(device), valid=canvas.valid.to(device))
                prev_pixels = None if prev_pixels is None else prev_pixels.to(device)
        if text is not None and len(text) != canvas.batch_size:
            raise ValueError(f"got the text of {len(text)} images for {canvas.batch_size} images")
        if texture:
            with _timed(t, "texture"):
                cells = cell_texture(canvas, self.image_channels, prev=prev_pixels, cache=self.cache,
                                     options=self.config.texture.options, timings=t)  # [B, C_image, Hc, Wc]
        else:
            b, _, h, w = canvas.pixels.shape
            cells = canvas.pixels.new_zeros(b, 0, h // cfg.cell, w // cfg.cell)
        return Scene(canvas=canvas, cell_texture=cells, text=None if text is None else list(text))

    def gestalt(self, scene: Scene, saccades: int, grid: tuple[int, int] | None = None) -> Gestalt:
        """The gestalt sent with K saccades (16x16, or smaller for small K; clamped to the smallest image).

        ``grid`` overrides the config's rule (a total T split by :meth:`arr_coc.budget.Budget.split`).
        """
        ext = scene.extents
        if grid is None:
            grid = self.config.gestalt.grid_for(saccades, (min(e[0] for e in ext), min(e[1] for e in ext)))
        return self.gestalt_encoder(scene.cell_texture, ext, grid)

    def score(self, scene: Scene, queries: str | Sequence[str], gestalt_vector: Tensor,
              timings: dict[str, float] | None = None,
              given: dict[str, Tensor] | None = None) -> tuple[Relevance, Tensor]:
        """Relevance of every cell for each image's question -> (relevance, query embeddings [B, Dq]).

        ``given``: question-coupled channels computed elsewhere (see :meth:`cell_stack`).
        """
        relevance, query_emb, _ = self._score(scene, queries, gestalt_vector, timings, given)
        return relevance, query_emb

    def _score(self, scene: Scene, queries: str | Sequence[str], gestalt_vector: Tensor,
               timings: dict[str, float] | None = None,
               given: dict[str, Tensor] | None = None) -> tuple[Relevance, Tensor, Tensor]:
        """:meth:`score`, plus the cell texture it read [B, C, Hc, Wc]."""
        t = {} if timings is None else timings
        queries = check_queries(queries, scene.canvas.batch_size, self.max_question_tokens)
        with _timed(t, "query"):
            query_emb = self.query_encoder.encode(queries).to(scene.cell_texture)  # [B, Dq]
        cells = scene.cell_texture
        if self.query_channels:
            with _timed(t, "coupling"):
                cells = self.cell_stack(scene, queries, timings=t, given=given)  # [B, C, Hc, Wc]
        with _timed(t, "scoring"):
            scale = self.config.scorer.part_scale
            dtype = module_dtype(self.scorer)  # an ARR moved to float64 / bfloat16 scores in its own precision
            if dtype is not None:
                cells, query_emb, gestalt_vector = (x.to(dtype) for x in (cells, query_emb, gestalt_vector))
            relevance = self.scorer(cells, query_emb, gestalt_vector, scene.canvas.valid,
                                    scale=None if tuple(scale) == (1.0, 1.0, 1.0) else scale,
                                    where=self.config.scorer.where_prior)
        return relevance, query_emb, cells

    def cell_stack(self, scene: Scene, queries: Sequence[str], timings: dict[str, float] | None = None,
                   given: dict[str, Tensor] | None = None) -> Tensor:
        """Every channel of every cell, the question-coupled ones for ``queries``: [B, C, Hc, Wc] in channel order.

        What the scorer reads, and the encoded tokens the trained pruner reads. ``given`` holds
        question-coupled channels already computed per cell ([B, width, Hc, Wc] by name), such as
        ``first_look``, which a VLM reads from its own attention (``arr_coc.vlm.answer``).
        """
        if not self.query_channels:
            return scene.cell_texture
        given = dict(given or {})
        unknown = sorted(set(given) - set(self.query_channels))
        if unknown:
            raise ValueError(f"given channels {unknown} are not question-coupled channels of this ARR "
                             f"({list(self.query_channels)})")
        todo = tuple(c for c in self.query_channels if c not in given)
        computed = cell_texture(scene.canvas, todo, queries=list(queries), query_encoder=self.query_encoder,
                                cache=self.cache, options=self.config.texture.options, text=scene.text,
                                timings=timings) if todo else None
        layout = channel_layout(todo) if todo else {}
        parts = [given[c].to(scene.cell_texture) if c in given else computed[:, layout[c]]
                 for c in self.query_channels]
        return self._in_channel_order(scene.cell_texture, torch.cat(parts, 1))

    def _in_channel_order(self, image_cells: Tensor, coupled_cells: Tensor) -> Tensor:
        """Interleave image and question-coupled cell textures into the configured channel order."""
        image_layout, coupled_layout = channel_layout(self.image_channels), channel_layout(self.query_channels)
        parts = [image_cells[:, image_layout[n]] if n in image_layout else coupled_cells[:, coupled_layout[n]]
                 for n in self.channels]
        return torch.cat(parts, 1)

    def select(self, relevance: Tensor, k: int, *, valid: Tensor | None = None,
               query_emb: Tensor | None = None) -> Selection:
        """The configured sampler (with its trained parameters, if any) on a relevance map [B, Hc, Wc].

        The selection step of :meth:`forward`, seeded with the config's seed: ``arr-coc eval``'s ``arr``
        method calls it, so the method is what ``look``, ``ask`` and ``ARR()`` send.
        """
        return select(self.sampler, relevance, k, valid=valid, query_emb=query_emb, seed=self.config.seed)

    def forward(self, images: Any, queries: str | Sequence[str], *, prev: Any = None,
                saccades: int | None = None,
                coupled: Callable[[Canvas, list[str]], dict[str, Tensor]] | None = None) -> Allocation:
        """Allocate ``saccades`` (K; default: the config's) saccades per image for its question.

        ``coupled(canvas, queries)`` may supply question-coupled channels per cell that are not
        computed from pixels (``{"first_look": [B, 1, Hc, Wc]}``: a VLM's attention to its gestalt).
        """
        self.check_weights()
        t: dict[str, float] = {}
        scene = self.see(images, prev=prev, timings=t)
        return self.allocate(scene, queries, saccades=saccades, timings=t, coupled=coupled)

    def allocate(self, scene: Scene, queries: str | Sequence[str], *, saccades: int | None = None,
                 timings: dict[str, float] | None = None,
                 coupled: Callable[[Canvas, list[str]], dict[str, Tensor]] | None = None,
                 gestalt_grid: tuple[int, int] | None = None) -> Allocation:
        """Allocate on a :meth:`see` result: several questions or values of K on one image pay for its texture once.

        ``coupled``: as in :meth:`forward`; ``gestalt_grid``: as in :meth:`gestalt`.
        """
        self.check_weights()
        t = {} if timings is None else timings
        k = self.config.sampler.saccades if saccades is None else check_int("saccades", saccades)
        canvas = scene.canvas
        queries = check_queries(queries, canvas.batch_size, self.max_question_tokens)
        given = coupled(canvas, queries) if coupled is not None else None
        with _timed(t, "gestalt"):
            gestalt = self.gestalt(scene, k, gestalt_grid)
        relevance, query_emb, cells = self._score(scene, queries, gestalt.vector, timings=t, given=given)
        with _timed(t, "selection"):
            selection = self.select(relevance.map, k, valid=canvas.valid, query_emb=query_emb)
        with _timed(t, "extraction"):
            # the sampler's cells are distinct, in bounds and valid (its contract, property-tested): no host read
            patches = extract_gather(canvas.pixels, selection.positions, canvas.cell,
                                     in_bounds=True)  # [B, K, 3, cell, cell]
        return Allocation(canvas=canvas, queries=queries, relevance=relevance, selection=selection,
                          patches=patches, gestalt=gestalt, timings_ms=t, cell_texture=cells)

    def _prev_canvas(self, prev: Any, canvas: Canvas) -> Tensor:
        """The previous frame(s) on the same canvas as the current ones, for the motion channel."""
        cfg = self.config.canvas
        p = make_canvas(prev, cell=cfg.cell, min_pixels=cfg.min_pixels, max_pixels=cfg.max_pixels)
        if p.pixels.shape != canvas.pixels.shape:
            raise ValueError(f"previous frames make a canvas of {tuple(p.pixels.shape)}, but the current frames "
                             f"make {tuple(canvas.pixels.shape)}; pass frames of the same size")
        return p.pixels
